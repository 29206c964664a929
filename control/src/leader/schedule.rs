//! The schedule loop: a view of the applied state at index N, `quorum_sched::schedule` over it,
//! and the plan proposed as one `ApplyPlan` entry based on N (apply re-checks every start).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::state::LeaderState;
use super::stats::Shown;
use crate::model::{JobId, Millis, ShownStart};
use crate::replica::{now_ms, Replica};
use quorum_sched::ClusterView;
use quorum_state::{Command, Response};

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

/// Runs a cycle after each kick (at most one per [`MIN_CYCLE_INTERVAL`]) and at least every
/// second, until `stop`.
pub(super) async fn schedule_loop(replica: Arc<Replica>, leader: Arc<LeaderState>, mut stop: watch::Receiver<bool>) {
    // Declared first, so dropped last: after the cache.
    let _trim = TrimHeapOnDrop;
    let mut cache = quorum_sched::view::ViewCache::default();
    // What each cycle keeps for the next: the pending jobs' priority terms and the last order.
    let mut kept = quorum_sched::CycleCache::default();
    let mut last_cycle: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = replica.shared.sched_kick.notified() => {}
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
            let applied = replica.shared.read();
            (
                ClusterView::from_state_cached(&applied.state, &mut cache),
                applied.applied_index(),
                applied.state.policy.clone(),
            )
        };
        view.previous = leader.estimates();
        view.promised = leader.promised();
        let started = std::time::Instant::now();
        let plan = quorum_sched::schedule_with(&view, now_ms(), &policy, &mut kept);
        let cycle_s = started.elapsed().as_secs_f64();
        leader.stats.cycle_seconds.observe(cycle_s);
        leader.stats.cycle_pending.observe(view.pending.len() as f64);
        leader.stats.planned_starts.inc_by(plan.starts.len() as u64);
        leader.stats.backfill_starts.inc_by(plan.backfilled as u64);
        tracing::debug!(
            pending = view.pending.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "scheduling cycle"
        );
        let planned = plan.starts.len();
        let reasons = plan.reasons_to_write();
        leader.set_promised(quorum_sched::promises(&view, &plan));
        // What each job starting was shown while it waited: before this plan's reservations
        // replace the last one's, which were in force until now.
        let shown: Vec<(JobId, ShownStart)> =
            plan.starts.iter().filter_map(|s| Some((s.job_id, leader.shown_at_start(s.job_id)?))).collect();
        leader.set_estimates(plan.estimates);
        // Before the plan is proposed: its starts are launched as soon as it applies.
        if quorum_proto::telemetry::exporting() && !leader.hub.traces.is_empty() {
            let applied = replica.shared.read();
            let planned = plan.starts.iter().map(|s| (s.job_id, applied.state.jobs.get(&s.job_id)));
            trace_starts(
                &leader,
                planned.map(|(id, job)| (id, job.map_or("", |j| j.request_id.as_str()))),
                base_index,
                cycle_s,
            );
        }
        // A replica of an older release cannot apply a preemption: none is planned until all can;
        // nor keep what a job was shown.
        let level = replica.shared.read().state.cluster_level();
        let preemptions = if level >= quorum_state::PREEMPTION_LEVEL { plan.preemptions } else { Vec::new() };
        let now = now_ms();
        let Some(command) = Command::apply_plan(base_index, now, plan.starts, reasons, preemptions, plan.resumes)
        else {
            continue;
        };
        let command = if level >= quorum_state::FORECAST_LEVEL { command.with_shown(shown.clone()) } else { command };
        match replica.write(command).await {
            Ok((index, Response::PlanApplied { started, dropped, preempted })) => {
                if !started.is_empty() {
                    quorum_raft::crash_point("plan-before-launch");
                }
                judge_shown(&replica, &leader, &started, &shown, now);
                tracing::debug!(index, planned, started = started.len(), dropped = dropped.len(), "plan applied");
                for (job, by) in preempted {
                    leader.stats.preempted.inc();
                    tracing::info!(job, by, "preempting a job to make room for another");
                }
                for (job, why) in dropped {
                    leader.stats.dropped_starts.inc();
                    let total = leader.count_dropped(&why);
                    tracing::info!(job, kind = why.kind(), total, reason = %why, "planned start dropped at apply");
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

/// Observes, for `/metrics`, how far the starts each job that `started` (at `now`) was shown
/// were from its start ([`quorum_sched::accuracy`], as the simulator judges them).
fn judge_shown(replica: &Replica, leader: &LeaderState, started: &[JobId], shown: &[(JobId, ShownStart)], now: Millis) {
    if shown.is_empty() {
        return;
    }
    let applied = replica.shared.read();
    for (job, s) in shown.iter().filter(|(job, _)| started.contains(job)) {
        let Some(submit) = applied.state.jobs.get(job).map(|j| j.submit_time) else { continue };
        let error = |shown: Millis| quorum_sched::accuracy::error_s(submit / 1000, now / 1000, shown / 1000);
        if let Some(e) = error(s.first_ms) {
            leader.stats.start_error(Shown::First, e);
        }
        if let Some(e) = error(s.last_ms) {
            leader.stats.start_error(Shown::Last, e);
        }
    }
}

/// A span in the trace of each job the cycle plans to start that has one, with the request id
/// of its submit (`base_index`: the applied index the cycle planned from). Its launches
/// continue from it.
fn trace_starts<'a>(
    leader: &LeaderState,
    planned: impl Iterator<Item = (crate::model::JobId, &'a str)>,
    base_index: u64,
    cycle_s: f64,
) {
    for (job_id, request_id) in planned {
        let Some(parent) = leader.hub.traces.of(job_id, request_id) else { continue };
        let span = tracing::info_span!("schedule", job_id, base_index, cycle_ms = cycle_s * 1000.0);
        quorum_proto::telemetry::continue_trace(&span, &parent);
        leader.hub.traces.remember(job_id, quorum_proto::telemetry::traceparent(&span));
    }
}
