//! Stage 3, **place**: in order, each candidate that its limits allow starts now where the
//! availability profiles keep its share free for its whole time limit; one that cannot gets
//! `Resources` (the first blocked of its partition) or `Priority`, and — while reservations are
//! left (the first blocked job under EASY, the first N under conservative) — a reservation at
//! its earliest possible start, which later candidates must not delay.
//!
//! One cycle's [`Placer`] keeps what placing has decided so far; each kind of decision is a
//! function of its own:
//!
//! - [`capacity`]: what the nodes have free over time, taken by every start and reservation,
//!   and the cluster's licenses;
//! - [`claims`]: jobs that preempted others start on, or hold, the nodes they claimed, before
//!   any other candidate;
//! - [`resume`]: jobs suspended by preemption take their CPUs back, next;
//! - then each candidate in turn ([`Placer::decide`]): held back by its partition's order,
//!   its running limits or licenses; else placed in the advance reservation it asks for
//!   ([`reservation`]), as a heterogeneous job, all components or none ([`het`]), or by
//!   [`backfill`]: it starts now, or is blocked and gets room made by preemption or a
//!   reservation at its earliest start.
//!
//! With [`BackfillOrder::Shortest`], once the last reservation is made the candidates behind
//! it are tried shortest planned run time first (Tsafrir et al.'s SJBF), then in queue order.

mod backfill;
mod capacity;
mod claims;
mod het;
mod reservation;
mod resume;
mod shape;

use std::collections::BTreeMap;

use quorum_model::{Allocation, BackfillMode, BackfillOrder, JobId, Millis, PendingReason, PlannedStart, Policy};

use crate::profile::Timeline;
use crate::view::{ClusterView, Estimate, PartitionView, PendingJob};
use crate::{eligibility, placement, preemption, Candidate, Waiting};
use capacity::{Book, Capacity, Licenses};
use shape::Shape;

/// What placing the candidates decided.
#[derive(Debug, Default)]
pub struct Placed<'a> {
    /// The jobs that start now, with their allocations, in order.
    pub starts: Vec<PlannedStart>,
    /// The candidates that wait, in order, with why (limits, resources, priority).
    pub waiting: Vec<Waiting<'a>>,
    /// Reservations: when and where backfill expects blocked candidates to start.
    pub estimates: BTreeMap<JobId, Estimate>,
    /// How many of `starts` start ahead of a job of their partition that waits: backfill's.
    pub backfilled: usize,
    /// Running jobs to stop for blocked candidates ([`preemption`]).
    pub preemptions: Vec<quorum_model::preempt::PlannedPreemption>,
    /// Jobs suspended by preemption resumed now ([`resume::resume_lent`]).
    pub resumes: Vec<JobId>,
    /// Whether one of `estimates` is late ([`ClusterView::late`]).
    pub late: bool,
}

impl Placed<'_> {
    /// Records `job`'s reservation, and whether it is late.
    fn reserve(&mut self, view: &ClusterView, job: JobId, estimate: Estimate) {
        self.late |= view.late_one(job, &estimate);
        self.estimates.insert(job, estimate);
    }
}

/// Places the candidates (see the module's documentation).
pub fn place<'a>(view: &'a ClusterView, candidates: &[Candidate<'a>], now_ms: Millis, policy: &Policy) -> Placed<'a> {
    place_until_late(view, candidates, now_ms, policy, false)
}

/// [`place`]; with `stop_late`, it stops as soon as a reservation is late (`Placed::late`), the
/// candidates after it undecided: [`crate::schedule`] plans that cycle again on limits.
pub(crate) fn place_until_late<'a>(
    view: &'a ClusterView,
    candidates: &[Candidate<'a>],
    now_ms: Millis,
    policy: &Policy,
    stop_late: bool,
) -> Placed<'a> {
    let mut p = Placer::new(view, now_ms, policy);
    let mut claimed = p.claim(candidates);
    p.placed.resumes = resume::resume_lent(view, &mut p.capacity);
    // The candidates in the order they are tried: the queue's; with shortest-first backfill,
    // those left once the reservations are made go shortest planned run time first.
    let mut tried: Vec<usize> = (0..candidates.len()).collect();
    let shortest_first = policy.backfill_order == BackfillOrder::Shortest && policy.reservation_count() > 0;
    let (mut next, mut reordered) = (0, false);
    while let Some(&k) = tried.get(next) {
        if stop_late && p.placed.late {
            return p.placed;
        }
        if shortest_first && !reordered && p.reservations_left == 0 {
            tried[next..].sort_by_key(|&i| (candidates[i].job.duration_s(), i));
            reordered = true;
            continue;
        }
        next += 1;
        crate::view::prefetch_ahead(&tried, next, |&k| candidates[k].job);
        let c = candidates[k];
        match claimed.remove(&c.position) {
            Some(Some(allocation)) => p.placed.starts.push(PlannedStart { job_id: c.job.id, allocation }),
            Some(None) => p.wait(c, PendingReason::Resources),
            None => p.decide(c),
        }
    }
    p.finish(reordered, candidates.len())
}

/// One cycle's placing: what the nodes and licenses have left, what the running limits have
/// counted, which partitions have a blocked job, the reservations left to make, and what is
/// decided so far.
struct Placer<'a, 'p> {
    view: &'a ClusterView,
    policy: &'p Policy,
    now: u64,
    /// The end of the backfill window: nothing is reserved later.
    horizon: u64,
    capacity: Capacity<'a>,
    limits: eligibility::Limits<'a>,
    licenses: Licenses<'a>,
    /// The view's partitions by position, and each one's nodes as a membership mask.
    partitions: Vec<&'a PartitionView>,
    members: Vec<Vec<bool>>,
    topology: placement::Topology,
    /// Partitions in which a job has been blocked this cycle.
    blocked: Vec<bool>,
    reservations_left: usize,
    /// Within a cycle free capacity only shrinks (starts and reservations take, nothing gives),
    /// so a shape that could not start for some duration cannot start for a longer one either:
    /// the shortest failed duration per shape spares the node scan.
    failed: BTreeMap<Shape<'a>, u64>,
    /// The same for heterogeneous jobs: the shapes of all their components together.
    failed_het: BTreeMap<Vec<Shape<'a>>, u64>,
    preemptor: Option<preemption::Preemptor<'a>>,
    placed: Placed<'a>,
}

impl<'a, 'p> Placer<'a, 'p> {
    fn new(view: &'a ClusterView, now_ms: Millis, policy: &'p Policy) -> Placer<'a, 'p> {
        let now = now_ms / 1000;
        let capacity = Capacity::new(view, now);
        let partitions: Vec<&PartitionView> = view.partitions.values().collect();
        let members: Vec<Vec<bool>> = partitions
            .iter()
            .map(|p| {
                let mut m = vec![false; view.nodes.len()];
                for &i in &p.nodes {
                    m[i] = true;
                }
                m
            })
            .collect();
        let mut preemptor = preemption::Preemptor::new(view, policy);
        if let Some(p) = preemptor.as_mut() {
            // A reservation's windows are out of the profiles preemption gives back to.
            let reserved: Vec<usize> = capacity.unreserved.iter().map(|(i, _)| *i).collect();
            p.spare(&reserved);
        }
        Placer {
            view,
            policy,
            now,
            horizon: now.saturating_add(policy.bf_window_s),
            capacity,
            limits: eligibility::Limits::from_running(view),
            licenses: Licenses::from_running(view),
            blocked: vec![false; partitions.len()],
            partitions,
            members,
            topology: placement::Topology::new(view),
            reservations_left: policy.reservation_count(),
            failed: BTreeMap::new(),
            failed_het: BTreeMap::new(),
            preemptor,
            placed: Placed::default(),
        }
    }

    /// Decides candidate `c`, not one that preempted others (see [`Placer::claim`]).
    fn decide(&mut self, c: Candidate<'a>) {
        if let Some(reason) = self.held_back(c) {
            return self.wait(c, reason);
        }
        match &c.job.reservation {
            Some(name) => self.in_reservation(c, name),
            None if !c.job.het.is_empty() => self.het(c),
            None => self.backfill(c),
        }
    }

    /// Why `c` waits whatever the nodes have free: without backfill, a job behind a blocked
    /// one of its partition; a running limit its start would pass; licenses, which are the
    /// cluster's, not a node's (a job waits until enough are free and reserves none: they free
    /// up when any holder ends).
    fn held_back(&self, c: Candidate<'a>) -> Option<PendingReason> {
        if self.policy.backfill == BackfillMode::None && self.blocked[c.partition] {
            return Some(PendingReason::Priority);
        }
        if let Some(reason) = self.limits.check(self.view, c.job) {
            return Some(reason);
        }
        (!self.licenses.free_for(c.job)).then_some(PendingReason::Licenses)
    }

    fn wait(&mut self, c: Candidate<'a>, reason: PendingReason) {
        self.placed.waiting.push(Waiting { position: c.position, job: c.job, reason });
    }

    /// Starts `job` (a whole job, or one component of a heterogeneous job) now on `nodes`:
    /// takes its share from `book` for `duration` and counts it against the running limits.
    /// Its licenses are the caller's to take (a heterogeneous job's once).
    fn take(
        &mut self,
        job: &'a PendingJob,
        nodes: Vec<usize>,
        exclusive: bool,
        book: Book,
        duration: u64,
    ) -> Allocation {
        let (allocation, usage) = self.capacity.start(job, nodes, exclusive, book, duration);
        self.limits.add_job(self.view, job, &usage);
        allocation
    }

    /// Records that `job` starts now; one that starts ahead of a blocked job of its partition
    /// (`backfill`) is counted as backfilled.
    fn started(&mut self, c: Candidate<'a>, allocation: Allocation, backfill: bool) {
        self.placed.starts.push(PlannedStart { job_id: c.job.id, allocation });
        self.placed.backfilled += usize::from(backfill && self.blocked[c.partition]);
    }

    /// Marks `c`'s partition blocked and gives it its reason: an advance reservation's that
    /// keeps it from the nodes, else `Resources` for the first blocked of its partition and
    /// `Priority` for the rest.
    fn block(&mut self, c: Candidate<'a>) {
        let first_blocked = !std::mem::replace(&mut self.blocked[c.partition], true);
        let reason = self.capacity.reservations.reason(c.partition, self.now, c.job.limit_s());
        let reason = reason.unwrap_or(if first_blocked { PendingReason::Resources } else { PendingReason::Priority });
        self.wait(c, reason);
    }

    /// Records `job`'s reservation from `start_s` on `nodes`, with the start it was first
    /// promised: the one kept while it waits, else this.
    fn reserved(&mut self, job: JobId, start_s: u64, nodes: Vec<String>) {
        let start_ms = start_s * 1000;
        let promised_ms = self.view.promised.get(&job).copied().unwrap_or(start_ms);
        self.placed.reserve(self.view, job, Estimate { start_ms, nodes, promised_ms });
    }

    fn names(&self, nodes: &[usize]) -> Vec<String> {
        nodes.iter().map(|&i| self.view.nodes[i].name.clone()).collect()
    }

    /// The post-conditions: every candidate decided, no node overcommitted; the reasons in the
    /// queue's order.
    fn finish(mut self, reordered: bool, candidates: usize) -> Placed<'a> {
        if reordered {
            // The reasons are merged back into the queue's order.
            self.placed.waiting.sort_by_key(|w| w.position);
        }
        debug_assert_eq!(
            self.placed.starts.len() + self.placed.waiting.len(),
            candidates,
            "place must decide every candidate"
        );
        debug_assert!(
            self.capacity.profiles.iter().all(Timeline::never_overcommitted),
            "scheduler bug: a plan or reservation overcommits a node"
        );
        self.placed
    }
}
