//! Heterogeneous jobs: all their components now, or none.

use quorum_model::{Allocation, NodeAllocation};

use super::capacity::Book;
use super::shape::Shape;
use super::Placer;
use crate::view::{ClusterView, PendingJob};
use crate::{placement, Candidate};

/// Where each component of heterogeneous `job` may run, and whether its partition books whole
/// nodes: those in the job's partition among `here`, the others on their own partition's nodes
/// (none when it is gone).
fn het_places<'v>(
    job: &'v PendingJob,
    view: &'v ClusterView,
    here: &'v [usize],
    exclusive: bool,
) -> Vec<(&'v [usize], bool)> {
    job.components()
        .map(|c| match (c.partition != job.partition).then(|| view.partitions.get(&*c.partition)) {
            Some(Some(p)) => (p.nodes.as_slice(), p.exclusive),
            Some(None) => (&[][..], exclusive),
            None => (here, exclusive),
        })
        .collect()
}

impl<'a> Placer<'a, '_> {
    /// Places heterogeneous `c`: each component on its own partition's nodes, booked as that
    /// partition books them (those in the job's partition on the job's candidates), all of
    /// them now or none; blocked otherwise, with a reservation of all of them at one earliest
    /// start while reservations are left to make.
    pub(super) fn het(&mut self, c: Candidate<'a>) {
        let (view, job, part, now) = (self.view, c.job, c.partition, self.now);
        if let Some(reason) = job.het.iter().find_map(|h| self.limits.check(view, h)) {
            return self.wait(c, reason);
        }
        let partition = self.partitions[part];
        let exclusive = partition.exclusive;
        let part_of = |h: &PendingJob| match h.partition != job.partition {
            true => view.partitions.keys().position(|k| **k == *h.partition).unwrap_or(part),
            false => part,
        };
        let shapes: Vec<Shape> = job.components().map(|h| Shape::of(part_of(h), h)).collect();
        let clear = self.capacity.clear_to_limit(job, &partition.nodes);
        let may_fit = self.failed_het.get(&shapes).is_none_or(|&d| job.duration_s() < d);
        let books = (self.capacity.profiles.as_slice(), self.capacity.free_gpus.as_slice());
        let candidates = clear.as_ref().map_or(partition.nodes.as_slice(), |(c, _)| c.as_slice());
        let places = het_places(job, view, candidates, exclusive);
        let fits = match may_fit {
            true => placement::fit_het(&self.topology, job, view, &places, books, now),
            false => None,
        };
        // What failed on fewer nodes says nothing of a job that may have all of them.
        if fits.is_none() && may_fit && clear.is_none() {
            self.failed_het.insert(shapes, job.duration_s());
        }
        if let Some(per_component) = fits {
            let mut allocation = Allocation::default();
            for (k, (h, nodes)) in job.components().zip(per_component).enumerate() {
                let a = self.take(h, nodes, places[k].1, Book::Outside, job.duration_s());
                allocation.cpu_ways = a.cpu_ways;
                allocation.nodes.extend(a.nodes.into_iter().map(|n| NodeAllocation { het_group: k as u32, ..n }));
            }
            self.licenses.take(job);
            return self.started(c, allocation, true);
        }
        self.block(c);
        if self.reservations_left == 0 {
            return;
        }
        let places = het_places(job, view, &partition.nodes, exclusive);
        let window = (now, self.horizon, self.policy.bf_resolution_s);
        let found = placement::earliest_het(&self.topology, job, view, &places, &self.capacity.profiles, window);
        if let Some((t, per_component)) = found {
            let mut names = Vec::new();
            for ((h, nodes), &(_, exclusive)) in job.components().zip(&per_component).zip(&places) {
                self.capacity.reserve(h, nodes, t, exclusive, Book::Outside);
                names.extend(self.names(nodes));
            }
            self.reserved(job.id, t, names);
            self.reservations_left -= 1;
        }
    }
}
