//! Jobs that preempted others go first: each starts on the nodes it claimed as soon as they are
//! free, and holds them from when they will be until then.

use std::collections::BTreeMap;

use quorum_model::Allocation;

use super::capacity::Book;
use super::Placer;
use crate::{placement, Candidate};

impl<'a> Placer<'a, '_> {
    /// The candidates with a claim (the nodes a preemption planned for them), before any
    /// other: by position, the allocation of each that starts now, or `None` for one that holds
    /// its claim from the earliest time the nodes are free. A claim no longer whole (a node
    /// gone or out of the partition), or a job its limits or licenses hold back, is passed
    /// over: the job is then placed as any other.
    pub(super) fn claim(&mut self, candidates: &[Candidate<'a>]) -> BTreeMap<usize, Option<Allocation>> {
        let mut claimed = BTreeMap::new();
        for &Candidate { position, job, partition: part, .. } in candidates.iter().filter(|c| c.claims) {
            let (view, members) = (self.view, &self.members[part]);
            let Some(nodes) =
                job.claim.iter().map(|n| view.node_index(n).filter(|&i| members[i])).collect::<Option<Vec<usize>>>()
            else {
                continue;
            };
            if nodes.len() != job.nodes as usize
                || self.limits.check(view, job).is_some()
                || !self.licenses.free_for(job)
            {
                continue;
            }
            let exclusive = self.partitions[part].exclusive;
            let (profiles, free_gpus) = (&self.capacity.profiles, &self.capacity.free_gpus);
            if let Some(fit) =
                placement::fit_now(&self.topology, job, view, &nodes, profiles, free_gpus, self.now, exclusive)
            {
                let allocation = self.take(job, fit, exclusive, Book::Outside, job.duration_s());
                self.licenses.take(job);
                claimed.insert(position, Some(allocation));
            } else if let Some(t) =
                placement::earliest_on(job, view, &nodes, profiles, self.now, self.horizon, 1, exclusive)
            {
                self.capacity.reserve(job, &nodes, t, exclusive, Book::Outside);
                self.reserved(job.id, t, job.claim.clone());
                claimed.insert(position, None);
            }
        }
        claimed
    }
}
