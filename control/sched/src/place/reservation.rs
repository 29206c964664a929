//! A job that asks for an advance reservation (`--reservation`).

use super::capacity::Book;
use super::Placer;
use crate::view::PendingJob;
use crate::{placement, Candidate};
use quorum_model::PendingReason;

impl<'a> Placer<'a, '_> {
    /// Places `c` in reservation `name`: a job of a FLEX reservation runs on any of its
    /// partition's nodes, at any time, for its whole time limit (its reservation's room where
    /// and while that holds, the rest's elsewhere); another's runs on the reservation's nodes,
    /// inside its window, until its end. It starts now if the reservation is active and has
    /// room; else it waits (`Resources`, or `Reservation` before the window) and, while
    /// reservations are left to make, gets one at its earliest start in the reservation.
    pub(super) fn in_reservation(&mut self, c: Candidate<'a>, name: &str) {
        let (job, now, partition) = (c.job, self.now, self.partitions[c.partition]);
        let Some(k) = self.capacity.reservations.find(name) else {
            return self.wait(c, PendingReason::ReservationDeleted);
        };
        let held = &self.capacity.reservations.held[k];
        if !held.reservation.allows(&job.user, &job.account) {
            return self.wait(c, PendingReason::Reservation);
        }
        let Some(&(from, until)) = held.windows.first() else {
            return self.wait(c, PendingReason::ReservationDeleted);
        };
        let flex = held.reservation.flags.flex;
        let (active, earliest_from, book) =
            if flex { (true, now, Book::Flex(k)) } else { (from <= now, from.max(now), Book::Inside(k)) };
        let capped = if flex {
            job.clone()
        } else {
            PendingJob {
                time_limit_s: Some(job.limit_s().min(until.saturating_sub(from.max(now))).max(1)),
                plan_s: Some(job.duration_s().min(until.saturating_sub(from.max(now))).max(1)),
                ..job.clone()
            }
        };
        let nodes: Vec<usize> = if flex {
            partition.nodes.clone()
        } else {
            held.nodes.iter().copied().filter(|i| partition.nodes.binary_search(i).is_ok()).collect()
        };
        let exclusive = partition.exclusive;
        let spliced = flex.then(|| self.capacity.flex_profiles(k, &partition.nodes));
        let fit = if active {
            let profiles = match &spliced {
                Some(p) => p.as_slice(),
                None => {
                    self.capacity.inside(k);
                    self.capacity.inside[k].as_deref().unwrap_or_default()
                }
            };
            let free_gpus = &self.capacity.free_gpus;
            placement::fit_now(&self.topology, &capped, self.view, &nodes, profiles, free_gpus, now, exclusive)
        } else {
            None
        };
        if let Some(fit) = fit {
            let allocation = self.take(job, fit, exclusive, book, capped.duration_s());
            self.licenses.take(job);
            return self.started(c, allocation, false);
        }
        self.wait(c, if active { PendingReason::Resources } else { PendingReason::Reservation });
        if self.reservations_left == 0 {
            return;
        }
        let profiles = match &spliced {
            Some(p) => p.as_slice(),
            None => self.capacity.inside(k),
        };
        let (view, horizon) = (self.view, self.horizon);
        let found =
            placement::earliest(&self.topology, &capped, view, &nodes, profiles, earliest_from, horizon, 1, exclusive);
        if let Some((t, on)) = found {
            self.capacity.reserve(&capped, &on, t, exclusive, book);
            let names = self.names(&on);
            self.reserved(job.id, t, names);
            self.reservations_left -= 1;
        }
    }
}
