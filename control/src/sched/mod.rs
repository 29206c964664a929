//! The scheduler core: `schedule(&ClusterView, now, &Policy) -> Plan`, a pure function.
//!
//! The leader builds a [`ClusterView`] from the state at some applied index, calls
//! [`schedule`], and proposes the [`Plan`] through Raft, where apply re-checks each start. The
//! pipeline: order the pending jobs by priority, then place each in turn on the free capacity
//! left by running jobs and by the starts already planned. Jobs that cannot start get their
//! reason: `Resources` for the first blocked job of a partition, `Priority` for those behind it.

mod placement;
mod view;

pub use placement::place;
pub use view::{ClusterView, NodeView, PendingJob};

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{JobId, Millis, PendingReason};
use crate::state::PlannedStart;

/// Scheduler settings. Grows with the multifactor priority and backfill parameters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Policy {}

/// What the scheduler decided in one cycle.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub starts: Vec<PlannedStart>,
    /// The reason of every pending job that does not start now.
    pub reasons: BTreeMap<JobId, PendingReason>,
}

/// One scheduling cycle over a view of the cluster.
pub fn schedule(view: &ClusterView, _now: Millis, _policy: &Policy) -> Plan {
    let mut nodes = view.nodes.clone();
    let mut plan = Plan::default();
    let mut blocked_partitions: BTreeSet<&str> = BTreeSet::new();
    let mut order: Vec<&PendingJob> = view.pending.iter().collect();
    order.sort_by_key(|j| (j.submit_time, j.id));
    for job in order {
        let candidates = match view.partition_nodes.get(&job.partition) {
            Some(c) if !c.is_empty() => c,
            _ => {
                plan.reasons.insert(job.id, PendingReason::PartitionNoNodes);
                continue;
            }
        };
        match place(job, candidates, &nodes) {
            Some(allocation) => {
                for a in &allocation.nodes {
                    let idx = view.node_index[&a.node];
                    nodes[idx].take(a);
                }
                plan.starts.push(PlannedStart { job_id: job.id, allocation });
            }
            None => {
                let reason = if blocked_partitions.insert(job.partition.as_str()) {
                    PendingReason::Resources
                } else {
                    PendingReason::Priority
                };
                plan.reasons.insert(job.id, reason);
            }
        }
    }
    debug_assert!(view::no_overcommit(&nodes), "scheduler bug: the plan overcommits a node");
    plan
}

#[cfg(test)]
mod tests;
