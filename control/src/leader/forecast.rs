//! Forecasts: every pending job's expected start and nodes, not only the one backfill reserves
//! for. Off the scheduling cycle, in a thread of its own, the leader places every waiting job, in
//! the order backfill serves them, behind what runs and what waits ahead of it, on run times
//! predicted from each user's recent runs ([`quorum_sched::forecast`]) while the schedule stays
//! on limits; `squeue --start`, `%S`, `scontrol show job`, the REST API and the dashboard show
//! the forecast of a job that holds no reservation, marked as one where the format has room.
//!
//! Its cost is bounded: a forecast starts at most every [`PERIOD`], and never sooner after the
//! last one than [`IDLE_FACTOR`] times what that one took, so that it takes at most a fifth of
//! a core however large the queue; a job shows the latest forecast, with when it was made.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::state::{Forecasts, LeaderState};
use crate::replica::{now_ms, Replica};

/// The least time between two forecasts.
const PERIOD: Duration = Duration::from_secs(5);
/// A forecast that took T waits at least this many times T before the next.
const IDLE_FACTOR: u32 = 4;

pub(super) async fn forecast_loop(replica: Arc<Replica>, leader: Arc<LeaderState>, mut stop: watch::Receiver<bool>) {
    let mut cache = quorum_sched::view::ViewCache::default();
    let mut wait = Duration::from_millis(500);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        // Lent to the forecast's thread, and given back with its answer.
        let mut c = std::mem::take(&mut cache);
        let (view, policy) = {
            let applied = replica.shared.read();
            let jobs = &applied.state.jobs;
            leader.retain_shown(|id| jobs.get(&id).is_some_and(|j| j.state == crate::model::JobState::Pending));
            (quorum_sched::ClusterView::from_state_predicting(&applied.state, &mut c), applied.state.policy.clone())
        };
        let reserved = leader.estimates();
        let at_ms = now_ms();
        let started = Instant::now();
        let planned = tokio::task::spawn_blocking(move || {
            let jobs = quorum_sched::forecast(&view, at_ms, &policy, &reserved);
            // The view goes with the thread: freeing a large one is not the runtime's work.
            drop(view);
            (jobs, c)
        })
        .await;
        let took = started.elapsed();
        let Ok((jobs, c)) = planned else { return };
        cache = c;
        leader.stats.forecast_seconds.observe(took.as_secs_f64());
        tracing::debug!(jobs = jobs.len(), elapsed_ms = took.as_millis() as u64, "forecast");
        if *stop.borrow() {
            return;
        }
        leader.set_forecasts(Forecasts { at_ms, jobs });
        wait = PERIOD.max(took * IDLE_FACTOR);
    }
}
