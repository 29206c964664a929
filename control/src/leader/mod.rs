//! Leader-only work. A supervisor watches openraft's metrics; while this replica leads it runs
//! a session of six loops (seven with mail), and it ends them (and every agent stream) the moment it stops:
//!
//! - [`versions`]: records what each voter runs, which sets the cluster's feature level;
//! - [`settings`]: makes the replicated partitions and policy match this replica's config file;
//! - [`schedule`]: after events (debounced by the kick) and at least every second, builds a view
//!   at an applied index, calls `quorum_sched::schedule`, and proposes the plan;
//! - dispatch: after every applied change, reconciles each connected agent with the state
//!   ([`hub`]);
//! - [`liveness`]: a node not heard from for `node_timeout` (counted from the later of its last
//!   heartbeat and the start of this leadership, so a failover never marks nodes down) is
//!   proposed DOWN; apply ends or requeues its jobs;
//! - [`purge`]: jobs that ended `min_job_age` ago leave the hot state for the job history (and,
//!   with `purge_job_after_s`, the history forgets the oldest);
//! - [`mail`], with a `mail_program`: mails users about their jobs' changes;
//! - [`cron`]: proposes the firings of recurring jobs as they come due;
//! - [`forecast`]: off the cycle, forecasts every pending job's start on predicted run times.
//!
//! What an agent's heartbeat or exit report turns into is decided by the plain functions of
//! [`rules`]. [`LeaderState`] is what only a leader keeps in memory, beside the replica.

pub mod cron;
mod forecast;
pub mod gpu_idle;
pub mod grants;
pub mod heard;
pub mod hub;
mod liveness;
pub mod mail;
pub mod purge;
pub mod rules;
mod schedule;
mod settings;
mod state;
mod stats;
pub mod steps;
pub mod versions;

pub use grants::Grants;
pub use state::{Expected, Forecasts, LeaderState};
pub use stats::Stats;

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::ClusterSettings;
use crate::replica::Replica;

/// Runs until `stop` turns true, starting and stopping leader sessions as leadership comes and
/// goes.
pub async fn supervise(
    replica: Arc<Replica>,
    leader: Arc<LeaderState>,
    settings: ClusterSettings,
    mut stop: watch::Receiver<bool>,
) {
    let mut metrics = replica.raft.metrics();
    let mut session: Option<Session> = None;
    loop {
        let leading = {
            let m = metrics.borrow_and_update();
            m.state == ServerState::Leader && m.current_leader == Some(replica.id)
        };
        if leading && session.is_none() {
            tracing::info!(replica = replica.id, "leading: starting scheduler and dispatcher");
            session = Some(Session::start(&replica, &leader, &settings));
        } else if !leading && session.is_some() {
            tracing::info!(replica = replica.id, "no longer leading");
            Session::end(&leader, session.take()).await;
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { break },
            _ = stop.changed() => break,
        }
    }
    Session::end(&leader, session.take()).await;
}

/// The loops of one term as leader.
struct Session {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Session {
    fn start(replica: &Arc<Replica>, leader: &Arc<LeaderState>, settings: &ClusterSettings) -> Session {
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = vec![
            tokio::spawn(versions::versions_loop(replica.clone(), stop_rx.clone())),
            tokio::spawn(settings::sync_settings(replica.clone(), settings.clone(), stop_rx.clone())),
            tokio::spawn(schedule::schedule_loop(replica.clone(), leader.clone(), stop_rx.clone())),
            tokio::spawn(dispatch_loop(replica.clone(), leader.clone(), stop_rx.clone())),
            tokio::spawn(liveness::liveness_loop(replica.clone(), leader.clone(), stop_rx.clone())),
            tokio::spawn(purge::purge_loop(replica.clone(), settings.min_job_age, stop_rx.clone())),
            tokio::spawn(purge::forget_loop(replica.clone(), settings.purge_job_after, stop_rx.clone())),
            tokio::spawn(cron::cron_loop(replica.clone(), stop_rx.clone())),
            tokio::spawn(forecast::forecast_loop(replica.clone(), leader.clone(), stop_rx.clone())),
        ];
        if let Some(program) = &leader.mail_program {
            tasks.push(tokio::spawn(mail::mail_loop(replica.clone(), program.clone(), stop_rx)));
        }
        Session { stop, tasks }
    }

    async fn end(leader: &LeaderState, session: Option<Session>) {
        if let Some(Session { stop, tasks }) = session {
            let _ = stop.send(true);
            for t in tasks {
                let _ = t.await;
            }
        }
        leader.hub.close_all();
    }
}

/// After every applied change (and at least every second), brings each connected agent in line
/// with the state.
async fn dispatch_loop(replica: Arc<Replica>, leader: Arc<LeaderState>, mut stop: watch::Receiver<bool>) {
    let mut applied = replica.shared.applied_index.subscribe();
    loop {
        {
            let a = replica.shared.read();
            leader.hub.reconcile(&a.state, None);
        }
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => return,
        }
    }
}
