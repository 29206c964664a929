//! Jobs suspended by preemption take their CPUs back.

use quorum_model::JobId;

use super::capacity::{Book, Capacity};
use crate::view::{self, ClusterView, Res};

/// Jobs suspended by preemption, after the jobs that preempted them have their nodes and
/// before any other: each whose CPUs are free now on every node of its allocation is resumed
/// and holds them for what is left of its time limit; one that must wait holds them from the
/// earliest time they are all free (later jobs must not delay it, as a reservation). The
/// earliest started first.
pub(super) fn resume_lent(view: &ClusterView, capacity: &mut Capacity) -> Vec<JobId> {
    let now = capacity.now;
    let mut lent: Vec<&view::RunningJob> =
        view.running.iter().map(|r| &**r).filter(|r| !r.lent_cpus.is_empty()).collect();
    lent.sort_by_key(|r| (r.start_s, r.id));
    let mut resumed = Vec::new();
    for r in lent {
        let cpus = |c: i64| Res { cpus: c, mem: 0, gpus: 0 };
        let until = |from: u64| from.saturating_add(r.left_s);
        // The latest of each node's earliest, until every node agrees (a few rounds at most).
        let mut at = Some(now);
        for _ in 0..8 {
            let Some(from) = at else { break };
            let later = r.lent_cpus.iter().try_fold(from, |t, &(i, c)| {
                capacity.profiles[i].earliest_fit(&cpus(c), r.left_s, from, u64::MAX, 1).map(|e| t.max(e))
            });
            if later == at {
                break;
            }
            at = later;
        }
        let Some(at) =
            at.filter(|&t| r.lent_cpus.iter().all(|&(i, c)| capacity.profiles[i].min_free(t, until(t)).cpus >= c))
        else {
            continue;
        };
        for &(i, c) in &r.lent_cpus {
            capacity.take(Book::Outside, i, at, until(at), &cpus(c));
        }
        if at == now {
            resumed.push(r.id);
        }
    }
    resumed
}
