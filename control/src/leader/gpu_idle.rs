//! The GPU idle policy (`[gpu_idle]`), like dstack's utilization policy: a running job whose
//! GPUs all stay under a utilization threshold for a while is flagged (`quorum queue`, the
//! dashboard, the job's `gpu_idle_since_ms`), and cancelled where its partition is one of
//! those the policy names. The leader judges from its agents' heartbeats, each carrying the
//! highest utilization among a job's GPUs on that node at its last check; what it knows is in
//! memory only, and a new leader starts watching afresh.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use crate::model::{Job, JobId, JobState, Millis};
use quorum_state::ClusterState;

/// What the policy says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuIdlePolicy {
    /// A job's GPUs are idle while the busiest of them is under this utilization (percent).
    pub threshold_pct: u32,
    /// How long they must stay so before the job is flagged (and cancelled where that applies).
    pub after: Duration,
    /// The partitions whose idle jobs are cancelled, not only flagged.
    pub cancel_partitions: BTreeSet<String>,
}

#[derive(Clone, Copy, Debug)]
struct Idle {
    since_ms: Millis,
    /// The last heartbeat that said so: after a gap (this replica did not lead meanwhile, or the
    /// node was silent) idleness is judged afresh, not from before it.
    seen_ms: Millis,
    cancelling: bool,
}

/// A job not reported idle for this long starts its idle time again.
const GAP_MS: Millis = 30_000;

/// The running jobs whose GPUs are idle, and since when.
#[derive(Debug, Default)]
pub struct IdleGpus {
    jobs: Mutex<Watched>,
}

#[derive(Debug, Default)]
struct Watched {
    jobs: BTreeMap<JobId, Idle>,
    /// When jobs no longer running were last forgotten: at most once a gap, not at every
    /// heartbeat of every node.
    purged_ms: Millis,
}

impl IdleGpus {
    /// Notes one node's heartbeat: each job running there with the highest utilization of its
    /// GPUs there (`None`: no GPUs, or no reading). A job busy on any node is not idle. Returns
    /// the jobs to cancel now, each once.
    pub fn note(
        &self,
        policy: &GpuIdlePolicy,
        state: &ClusterState,
        reports: &[(JobId, Option<u32>)],
        now_ms: Millis,
    ) -> Vec<JobId> {
        let mut watched = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        // Jobs that ended (or were requeued) are forgotten.
        if now_ms.saturating_sub(watched.purged_ms) >= GAP_MS {
            watched.purged_ms = now_ms;
            watched.jobs.retain(|id, _| state.jobs.get(id).is_some_and(|j| j.state == JobState::Running));
        }
        let jobs = &mut watched.jobs;
        let mut cancel = Vec::new();
        for &(id, util) in reports {
            let Some(util) = util else { continue };
            let Some(job) = state.jobs.get(&id).filter(|j| j.state == JobState::Running) else { continue };
            if util >= policy.threshold_pct {
                jobs.remove(&id);
                continue;
            }
            let idle = jobs.entry(id).or_insert(Idle { since_ms: now_ms, seen_ms: now_ms, cancelling: false });
            if now_ms.saturating_sub(idle.seen_ms) > GAP_MS {
                idle.since_ms = now_ms;
            }
            idle.seen_ms = now_ms;
            let long = now_ms.saturating_sub(idle.since_ms) >= policy.after.as_millis() as u64;
            if long && !idle.cancelling && policy.cancel_partitions.contains(&job.partition) {
                idle.cancelling = true;
                cancel.push(id);
            }
        }
        cancel
    }

    /// Since when `job`'s GPUs have been idle, once that has lasted the policy's `after` (a job
    /// that no longer runs is not flagged, whatever is left of it here until the next purge).
    pub fn flagged_since(&self, policy: &GpuIdlePolicy, job: &Job, now_ms: Millis) -> Option<Millis> {
        if job.state != JobState::Running {
            return None;
        }
        let watched = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let since = watched.jobs.get(&job.id)?.since_ms;
        (now_ms.saturating_sub(since) >= policy.after.as_millis() as u64).then_some(since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorum_model::{Allocation, NodeAllocation, PlannedStart};
    use quorum_state::testing::{cluster, spec, submit};
    use quorum_state::{apply, Command, Response};

    fn running(s: &mut ClusterState, index: u64, partition: &str, node: &str) -> JobId {
        let mut job = spec(&["sleep", "100"]);
        (job.gpus_per_node, job.partition, job.mem_per_node_mb) = (1, Some(partition.into()), Some(100));
        let Response::Submitted { job_id, .. } = submit(s, index, job, &format!("r{index}")) else { panic!() };
        let on = NodeAllocation { node: node.into(), cpus: 1, mem_mb: 100, gpus: vec![0], het_group: 0 };
        let allocation = Allocation { nodes: vec![on], cpu_ways: None };
        let start = PlannedStart { job_id, allocation };
        let plan = Command::ApplyPlan {
            base_index: index,
            now: 2000,
            starts: vec![start],
            reasons: vec![],
            preemptions: vec![],
            resumes: vec![],
            shown: vec![],
        };
        let applied = apply(s, index + 1, plan);
        assert_eq!(s.jobs[&job_id].state, JobState::Running, "{applied:?}");
        job_id
    }

    #[test]
    fn idle_gpus_are_flagged_after_a_while_and_cancelled_only_where_the_partition_says() {
        let mut s = cluster();
        let mut other = quorum_state::testing::partition("scratch", "n[1-2]", false);
        other.node_names = ["n1".to_string(), "n2".to_string()].into();
        let gpu = s.partitions["gpu"].clone();
        apply(&mut s, 5, Command::SetPartitions { partitions: vec![gpu, other], now: 5 });
        let flagged = running(&mut s, 10, "gpu", "n1");
        let cancelled = running(&mut s, 20, "scratch", "n2");
        let policy = GpuIdlePolicy {
            threshold_pct: 5,
            after: Duration::from_secs(60),
            cancel_partitions: ["scratch".to_string()].into(),
        };
        let idle = IdleGpus::default();
        let both = |a: u32, b: u32| vec![(flagged, Some(a)), (cancelled, Some(b))];
        assert!(idle.note(&policy, &s, &both(0, 1), 1_000).is_empty());
        assert_eq!(idle.flagged_since(&policy, &s.jobs[&flagged], 30_000), None, "not for long enough yet");
        // Busy for one heartbeat: the clock starts again.
        assert!(idle.note(&policy, &s, &both(50, 1), 30_000).is_empty());
        assert!(idle.note(&policy, &s, &both(2, 4), 40_000).is_empty());
        assert!(idle.note(&policy, &s, &both(2, 4), 50_000).is_empty());
        assert_eq!(idle.note(&policy, &s, &both(2, 4), 61_000), vec![cancelled], "a minute idle in scratch");
        assert!(idle.note(&policy, &s, &both(2, 4), 62_000).is_empty(), "cancelled once");
        assert_eq!(idle.flagged_since(&policy, &s.jobs[&flagged], 99_000), None, "gpu's job idle since 40 s only");
        assert_eq!(idle.flagged_since(&policy, &s.jobs[&flagged], 100_000), Some(40_000));
        // No reading says nothing; a job that ended is forgotten.
        assert!(idle.note(&policy, &s, &[(flagged, None)], 101_000).is_empty());
        assert_eq!(idle.flagged_since(&policy, &s.jobs[&flagged], 101_000), Some(40_000));
        // Not heard idle for longer than the gap (another replica led meanwhile): afresh.
        assert!(idle.note(&policy, &s, &[(flagged, Some(0))], 200_000).is_empty());
        assert_eq!(idle.flagged_since(&policy, &s.jobs[&flagged], 200_000), None);
        assert!(idle.note(&policy, &s, &[(flagged, Some(0))], 210_000).is_empty());
        let token = s.jobs[&flagged].alloc_index;
        let outcome = quorum_model::RankOutcome::Exited { code: 0, signal: 0 };
        apply(&mut s, 30, Command::JobEnded { job_id: flagged, token, node: "n1".into(), outcome, now: 3000 });
        assert!(idle.note(&policy, &s, &[], 102_000).is_empty());
        assert_eq!(idle.flagged_since(&policy, &s.jobs[&flagged], 102_000), None);
    }
}
