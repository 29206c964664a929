//! Leader-only work. A supervisor watches openraft's metrics; while this replica leads it runs
//! a session of five loops, and it ends them (and every agent stream) the moment it stops:
//!
//! - versions: records what each voter runs, which sets the cluster's feature level;
//! - partition sync: makes the replicated partitions match this replica's config file;
//! - scheduling: after events (debounced by the kick) and at least every second, builds a view
//!   at an applied index, calls `quorum_sched::schedule`, and proposes the plan;
//! - dispatch: after every applied change, reconciles each connected agent with the state;
//! - liveness: a node not heard from for `node_timeout` (counted from the later of its last
//!   heartbeat and the start of this leadership, so a failover never marks nodes down) is
//!   proposed DOWN; apply ends or requeues its jobs.

pub mod hub;
pub mod versions;

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::ServerState;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::ClusterSettings;
use crate::model::NodeAdminState;
use crate::replica::{now_ms, Core, WriteError};
use quorum_sched::ClusterView;
use quorum_state::{Command, Response};

/// Runs until `stop` turns true, starting and stopping leader sessions as leadership comes and
/// goes.
pub async fn supervise(core: Arc<Core>, settings: ClusterSettings, mut stop: watch::Receiver<bool>) {
    let mut metrics = core.raft.metrics();
    let mut session: Option<(watch::Sender<bool>, Vec<JoinHandle<()>>)> = None;
    loop {
        let leading = {
            let m = metrics.borrow_and_update();
            m.state == ServerState::Leader && m.current_leader == Some(core.id)
        };
        if leading && session.is_none() {
            tracing::info!(replica = core.id, "leading: starting scheduler and dispatcher");
            session = Some(start_session(core.clone(), settings.clone()));
        } else if !leading && session.is_some() {
            tracing::info!(replica = core.id, "no longer leading");
            end_session(&core, session.take()).await;
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { break },
            _ = stop.changed() => break,
        }
    }
    end_session(&core, session.take()).await;
}

async fn end_session(core: &Core, session: Option<(watch::Sender<bool>, Vec<JoinHandle<()>>)>) {
    if let Some((stop, tasks)) = session {
        let _ = stop.send(true);
        for t in tasks {
            let _ = t.await;
        }
    }
    core.hub.close_all();
}

fn start_session(core: Arc<Core>, settings: ClusterSettings) -> (watch::Sender<bool>, Vec<JoinHandle<()>>) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let tasks = vec![
        tokio::spawn(versions::versions_loop(core.clone(), stop_rx.clone())),
        tokio::spawn(sync_settings(core.clone(), settings, stop_rx.clone())),
        tokio::spawn(schedule_loop(core.clone(), stop_rx.clone())),
        tokio::spawn(dispatch_loop(core.clone(), stop_rx.clone())),
        tokio::spawn(liveness_loop(core, stop_rx)),
    ];
    (stop_tx, tasks)
}

/// The commands that make the replicated settings match this replica's configuration.
fn settings_commands(core: &Core, settings: &ClusterSettings) -> Vec<Command> {
    let applied = core.shared.read();
    let state = &applied.state;
    let now = now_ms();
    let mut commands = Vec::new();
    let current: Vec<_> = state.partitions.values().cloned().collect();
    let mut wanted = settings.partitions.clone();
    wanted.sort_by(|a, b| a.name.cmp(&b.name));
    if current != wanted {
        commands.push(Command::SetPartitions { partitions: wanted, now });
    }
    if state.policy != settings.policy {
        commands.push(Command::SetPolicy { policy: settings.policy.clone(), now });
    }
    if state.switches != settings.switches {
        commands.push(Command::SetTopology { switches: settings.switches.clone(), now });
    }
    // Accounts and QOS are seeded once; after that they change through the API.
    if state.accounts.is_empty() && state.qos.is_empty() && !(settings.accounts.is_empty() && settings.qos.is_empty()) {
        commands.push(Command::SeedAccounts { accounts: settings.accounts.clone(), qos: settings.qos.clone(), now });
    }
    commands
}

async fn sync_settings(core: Arc<Core>, settings: ClusterSettings, mut stop: watch::Receiver<bool>) {
    loop {
        let commands = settings_commands(&core, &settings);
        if commands.is_empty() {
            return;
        }
        let mut failed = false;
        for command in commands {
            if let Err(e) = core.write(command).await {
                tracing::warn!(error = %e, "syncing cluster settings");
                failed = true;
                break;
            }
        }
        if !failed {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// The least time between the starts of two scheduling cycles: under a storm of submits the
/// cycles that would each see one more job are merged, leaving the cores to the commit path.
const MIN_CYCLE_INTERVAL: Duration = Duration::from_millis(20);

/// Hands freed heap back to the system when dropped: a deposed leader's scheduling cache is an
/// entry per pending job, about 300 MB at a million. Our own heap is mimalloc's, which returns
/// freed pages by itself; RocksDB's is glibc's, which keeps them until trimmed.
struct TrimHeapOnDrop;

impl Drop for TrimHeapOnDrop {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only returns free memory to the system; it touches no live data.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

async fn schedule_loop(core: Arc<Core>, mut stop: watch::Receiver<bool>) {
    // Declared first, so dropped last: after the cache.
    let _trim = TrimHeapOnDrop;
    let mut cache = quorum_sched::view::ViewCache::default();
    let mut last_cycle: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = core.shared.sched_kick.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => return,
        }
        if let Some(wait) = last_cycle.map(|t| MIN_CYCLE_INTERVAL.saturating_sub(t.elapsed())).filter(|w| !w.is_zero())
        {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => return,
            }
        }
        if *stop.borrow() {
            return;
        }
        last_cycle = Some(Instant::now());
        let (mut view, base_index, policy) = {
            let applied = core.shared.read();
            (
                ClusterView::from_state_cached(&applied.state, &mut cache),
                applied.applied_index(),
                applied.state.policy.clone(),
            )
        };
        view.previous = core
            .estimates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(j, e)| (*j, e.nodes.clone()))
            .collect();
        let started = std::time::Instant::now();
        let plan = quorum_sched::schedule(&view, now_ms(), &policy);
        tracing::debug!(
            pending = view.pending.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "scheduling cycle"
        );
        *core.estimates.lock().unwrap_or_else(|p| p.into_inner()) = plan.estimates.clone();
        let planned = plan.starts.len();
        let reasons = plan.reasons_to_write();
        let Some(command) = Command::apply_plan(base_index, now_ms(), plan.starts, reasons) else { continue };
        match core.write(command).await {
            Ok((index, Response::PlanApplied { started, dropped })) => {
                tracing::debug!(index, planned, started = started.len(), dropped = dropped.len(), "plan applied");
                for (job, why) in dropped {
                    tracing::debug!(job, why, "planned start dropped at apply");
                }
            }
            Ok((_, other)) => tracing::warn!(?other, "unexpected answer to a plan"),
            Err(e) => {
                tracing::warn!(error = %e, "proposing a plan");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The nodes, not already DOWN, that have been silent for `node_timeout`, with how long.
fn silent_nodes(core: &Core, leading_since: Instant) -> Vec<(String, Duration)> {
    let timeout = core.liveness.node_timeout;
    let applied = core.shared.read();
    applied
        .state
        .nodes
        .values()
        .filter(|n| !matches!(n.admin, NodeAdminState::Down { .. }))
        .filter_map(|n| {
            let heard = core.hub.last_heard(&n.name).map_or(leading_since, |t| t.max(leading_since));
            let silent = heard.elapsed();
            (silent >= timeout).then(|| (n.name.clone(), silent))
        })
        .collect()
}

async fn liveness_loop(core: Arc<Core>, mut stop: watch::Receiver<bool>) {
    let leading_since = Instant::now();
    let mut told_too_new = false;
    let tick = (core.liveness.node_timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => return,
        }
        for (node, silent) in silent_nodes(&core, leading_since) {
            let reason = format!("not responding: no heartbeat for {:.1}s", silent.as_secs_f64());
            match core.write(Command::NodeDown { node: node.clone(), reason: reason.clone(), now: now_ms() }).await {
                Ok((_, Response::NodeDowned { ended, requeued })) => {
                    tracing::warn!(node, reason, ?ended, ?requeued, "node DOWN");
                }
                Ok(_) => {}
                Err(e @ WriteError::TooNew { .. }) => {
                    if !told_too_new {
                        tracing::warn!(node, error = %e, "a silent node cannot be marked DOWN yet");
                        told_too_new = true;
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(node, error = %e, "proposing a node DOWN");
                    break;
                }
            }
        }
    }
}

async fn dispatch_loop(core: Arc<Core>, mut stop: watch::Receiver<bool>) {
    let mut applied = core.shared.applied_index.subscribe();
    loop {
        {
            let a = core.shared.read();
            core.hub.reconcile(&a.state, None);
        }
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => return,
        }
    }
}
