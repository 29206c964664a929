//! Every other job: it starts now where its share stays free for its whole time limit (ahead
//! of a blocked job only where it delays no reservation); else it is blocked, and gets room
//! made by preempting lower tiers, or a reservation at its earliest start while reservations
//! are left to make.

use super::capacity::Book;
use super::shape::Shape;
use super::Placer;
use crate::view::PendingJob;
use crate::{placement, Candidate};

impl<'a> Placer<'a, '_> {
    /// Places `c`, a job of no advance reservation and no components.
    pub(super) fn backfill(&mut self, c: Candidate<'a>) {
        if self.start_now(c) {
            return;
        }
        self.block(c);
        if self.make_room(c) || self.reservations_left == 0 {
            return;
        }
        self.reserve_earliest(c);
    }

    /// Starts `c` now if the nodes keep its share free for its whole time limit. The largest
    /// free amounts and the shapes that failed this cycle spare the node scan for most of a
    /// long queue; a job planned for less than its limit considers only nodes its limit would
    /// not carry into an advance reservation.
    fn start_now(&mut self, c: Candidate<'a>) -> bool {
        let (job, part) = (c.job, c.partition);
        let dur = job.duration_s();
        let partition = self.partitions[part];
        let exclusive = partition.exclusive;
        let shape = Shape::of(part, job);
        let bound = &self.capacity.max_free;
        let may_fit = bound.bound().fits(&job.per_node)
            && (job.nodes == 1 || bound.nodes_with_cpus(job.per_node.cpus) >= job.nodes as usize)
            && self.failed.get(&shape).is_none_or(|&d| dur < d);
        let clear = self.capacity.clear_to_limit(job, &partition.nodes);
        let fits_now = match (may_fit, &clear) {
            (false, _) => None,
            (true, None) => {
                self.capacity.fit_now(job, &self.members[part], &partition.nodes, &self.topology, exclusive)
            }
            (true, Some((nodes, mask))) => self.capacity.fit_now(job, mask, nodes, &self.topology, exclusive),
        };
        if let Some(nodes) = fits_now {
            let allocation = self.take(job, nodes, exclusive, Book::Outside, dur);
            self.licenses.take(job);
            self.started(c, allocation, true);
            return true;
        }
        if may_fit && clear.is_none() {
            self.failed.insert(shape, dur);
        }
        false
    }

    /// Room made for blocked `c` by preempting running jobs of lower tiers: held for it from
    /// the end of its victims' grace. Whether any was found.
    fn make_room(&mut self, c: Candidate<'a>) -> bool {
        let (job, now) = (c.job, self.now);
        let partition = self.partitions[c.partition];
        let exclusive = partition.exclusive;
        let Some(p) = self.preemptor.as_mut() else { return false };
        let Some(found) = p.search(job, partition, &self.topology, &mut self.capacity.profiles, now, exclusive) else {
            return false;
        };
        for &i in &found.touched {
            self.capacity.refresh(i);
        }
        self.capacity.reserve(job, &found.nodes, found.start_s, exclusive, Book::Outside);
        self.reserved(job.id, found.start_s, found.planned.nodes.clone());
        self.placed.preemptions.push(found.planned);
        true
    }

    /// A reservation for blocked `c` at its earliest start (on the nodes of its last one where
    /// it is no later there). Planned for its prediction, it still may not start where its
    /// limit would run into an advance reservation: then it is reserved where its limit fits.
    fn reserve_earliest(&mut self, c: Candidate<'a>) {
        let (view, job, now, horizon) = (self.view, c.job, self.now, self.horizon);
        let partition = self.partitions[c.partition];
        let (exclusive, resolution) = (partition.exclusive, self.policy.bf_resolution_s);
        let previous: Option<Vec<usize>> =
            view.previous.get(&job.id).and_then(|e| e.nodes.iter().map(|n| view.node_index(n)).collect());
        let profiles = &self.capacity.profiles;
        let found = placement::earliest_sticky(
            &self.topology,
            job,
            view,
            &partition.nodes,
            profiles,
            now,
            horizon,
            resolution,
            exclusive,
            previous.as_deref(),
        );
        let reservations = &self.capacity.reservations;
        let crosses = |(t, nodes): &(u64, Vec<usize>)| {
            let end = t.saturating_add(job.limit_s());
            job.duration_s() < job.limit_s() && nodes.iter().any(|&i| !reservations.clear(i, *t, end))
        };
        let found = match found {
            Some(f) if crosses(&f) => {
                let limited = PendingJob { plan_s: None, ..job.clone() };
                let nodes = &partition.nodes;
                placement::earliest(
                    &self.topology,
                    &limited,
                    view,
                    nodes,
                    profiles,
                    now,
                    horizon,
                    resolution,
                    exclusive,
                )
            }
            f => f,
        };
        if let Some((t, nodes)) = found {
            self.capacity.reserve(job, &nodes, t, exclusive, Book::Outside);
            let names = self.names(&nodes);
            self.reserved(job.id, t, names);
            self.reservations_left -= 1;
        }
    }
}
