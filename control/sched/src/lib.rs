//! The scheduler core: `schedule(&ClusterView, now, &Policy) -> Plan`, a pure function.
//!
//! The leader builds a [`ClusterView`] from the state at one applied index, calls [`schedule`],
//! and proposes the [`Plan`] through Raft, where apply re-checks every start. [`schedule`] reads
//! as its stages, each a function from typed input to typed output, over every pending job
//! every cycle (no depth cap):
//!
//! 1. [`order`] — by multifactor priority ([`priority`]), submit order, or shortest first;
//! 2. [`screen`] — holds, dependencies, begin time, partition/QOS/association limits on the
//!    job's size and time, a request no node could hold ([`eligibility`]): an ineligible job
//!    gets its reason and goes no further;
//! 3. [`place`] — in order, a candidate within its running limits starts now on nodes whose
//!    availability profile ([`profile`]) keeps its share free for its whole time limit
//!    ([`placement`]), taking that interval from the profiles so no later job can overlap it;
//!    a candidate that cannot start gets a reservation at its earliest possible start
//!    (backfill: the first blocked job under EASY, the first N under conservative), so a
//!    lower-priority job starts now only where it delays no reservation; with
//!    `backfill_order = Shortest` the candidates left once the reservations are made are tried
//!    shortest planned run time first;
//! 4. [`Plan::assemble`] — the starts, the reservations, and every other job's reason in the
//!    order considered.

pub mod accuracy;
mod candidates;
mod cycle_cache;
pub mod eligibility;
mod place;
pub mod placement;
pub mod preemption;
pub mod priority;
pub mod profile;
pub mod reserved;
pub mod view;

pub use candidates::{Candidate, Waiting};
pub use cycle_cache::CycleCache;
pub use place::{place, Placed};
pub use profile::profiles;
pub use view::{ClusterView, Estimate, NodeView, PartitionView, PendingJob, Res};

use std::collections::BTreeMap;

use quorum_model::{
    Allocation, BackfillMode, BackfillOrder, JobId, Millis, PendingReason, PlannedStart, Policy, QueueOrder,
};

/// The most pending reasons one plan writes; see [`Plan::reasons_to_write`].
pub const MAX_REASONS_PER_PLAN: usize = 5_000;

/// What the scheduler decided in one cycle.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub starts: Vec<PlannedStart>,
    /// The reason of every pending job that does not start now, in the order considered.
    pub reasons: Vec<(JobId, PendingReason)>,
    /// Positions in `reasons` of the jobs whose reason differs from the one the view showed:
    /// all that applying the plan has to write.
    changed: Vec<usize>,
    /// Reservations: expected start and nodes of blocked jobs backfill reached.
    pub estimates: BTreeMap<JobId, Estimate>,
    /// How many of `starts` backfill made: ahead of a job of their partition that waits.
    pub backfilled: usize,
    /// Running jobs to stop so that pending ones start on their nodes after the grace.
    pub preemptions: Vec<quorum_model::preempt::PlannedPreemption>,
    /// Jobs suspended by preemption that take their CPUs back now.
    pub resumes: Vec<JobId>,
}

impl Plan {
    /// The reason given to `job`, if it does not start now.
    pub fn reason(&self, job: JobId) -> Option<PendingReason> {
        self.reasons.iter().find(|(id, _)| *id == job).map(|(_, r)| *r)
    }

    fn set_reason(&mut self, job: &PendingJob, reason: PendingReason) {
        if job.reason != reason {
            self.changed.push(self.reasons.len());
        }
        self.reasons.push((job.id, reason));
    }

    /// The reasons that applying this plan has to write: only those that changed from the
    /// view, in job order, and at most [`MAX_REASONS_PER_PLAN`] of them, the first considered
    /// first; the rest still differ from the state next cycle and go then. A Raft entry must
    /// stay small enough to replicate within a heartbeat (100,000 new jobs once made a 2.5 MB
    /// plan that timed out at every try on a loaded machine).
    pub fn reasons_to_write(&self) -> Vec<(JobId, PendingReason)> {
        let mut reasons: Vec<(JobId, PendingReason)> =
            self.changed.iter().take(MAX_REASONS_PER_PLAN).map(|&i| self.reasons[i]).collect();
        reasons.sort_unstable_by_key(|(id, _)| *id);
        reasons
    }
}

/// A name lookup in one of the view's small ordered maps that remembers its last hit: jobs of
/// one partition or QOS come in long runs, so most lookups are one comparison.
struct Lookup<'a, V> {
    entries: Vec<(&'a str, &'a V)>,
    last: usize,
}

impl<'a, V> Lookup<'a, V> {
    fn new(map: &'a BTreeMap<String, V>) -> Self {
        Lookup { entries: map.iter().map(|(k, v)| (k.as_str(), v)).collect(), last: 0 }
    }

    /// The entry of this name and its position in the map's order.
    fn find(&mut self, name: &str) -> Option<(usize, &'a V)> {
        match self.entries.get(self.last) {
            Some((n, v)) if *n == name => Some((self.last, *v)),
            _ => {
                let i = self.entries.binary_search_by(|(n, _)| (*n).cmp(name)).ok()?;
                self.last = i;
                Some((i, self.entries[i].1))
            }
        }
    }
}

/// Stage 1, **order**: the pending jobs in the order they are considered (a permutation of the
/// view's pending jobs).
pub fn order<'a>(view: &'a ClusterView, now_ms: Millis, policy: &Policy) -> Vec<&'a PendingJob> {
    let mut jobs: Vec<&PendingJob> = view.pending.iter().map(|j| &**j).collect();
    match policy.ordering {
        // Jobs an operator gave a priority go first, highest first.
        QueueOrder::Fifo => jobs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.submit_ms, j.id)),
        QueueOrder::ShortestFirst => {
            jobs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.duration_s(), j.submit_ms, j.id))
        }
        QueueOrder::Multifactor => {
            let ctx = priority::PriorityContext::new(view, now_ms, policy);
            let mut keyed: Vec<(f64, &PendingJob)> =
                jobs.into_iter().map(|j| (ctx.factors(view, j, now_ms, policy).total, j)).collect();
            keyed
                .sort_by(|(pa, a), (pb, b)| pb.total_cmp(pa).then(a.submit_ms.cmp(&b.submit_ms)).then(a.id.cmp(&b.id)));
            jobs = keyed.into_iter().map(|(_, j)| j).collect();
        }
    }
    debug_assert_eq!(jobs.len(), view.pending.len(), "order must consider every pending job once");
    jobs
}

/// What screening leaves: the candidates and the jobs that cannot start whatever else runs,
/// each list in order.
#[derive(Debug, Default)]
pub struct Screened<'a> {
    pub candidates: Vec<Candidate<'a>>,
    pub ineligible: Vec<Waiting<'a>>,
}

/// Stage 2, **screen**: the reasons that depend on the job and the view alone — holds,
/// dependencies, begin time, partition, QOS and account limits on its size and time
/// ([`eligibility::static_reason`]), a partition without nodes, or a request no node of the
/// partition could ever hold (`BadConstraints`).
pub fn screen<'a>(view: &'a ClusterView, ordered: &[&'a PendingJob], now_ms: Millis, policy: &Policy) -> Screened<'a> {
    let cycle = eligibility::CycleLimits::new(view, now_ms, policy.half_life_s * 1000);
    let mut partitions = Lookup::new(&view.partitions);
    let mut qos = Lookup::new(&view.qos);
    let mut out = Screened::default();
    for (position, &job) in ordered.iter().enumerate() {
        view::prefetch_ahead(ordered, position, |j| j);
        let found = partitions.find(&job.partition);
        let qos = qos.find(&job.qos).map(|(_, q)| q);
        let reason =
            eligibility::static_reason(job, view, found.map(|(_, p)| p), qos, now_ms, &cycle).or_else(|| match found {
                None => Some(PendingReason::PartitionNoNodes),
                Some((_, p)) if p.holds_back.is_some() => p.holds_back,
                Some((_, p)) if p.nodes.is_empty() => Some(PendingReason::PartitionNoNodes),
                Some((_, p)) if !p.nodes.iter().any(|&i| placement::could_hold(job, &view.nodes[i])) => {
                    Some(PendingReason::BadConstraints)
                }
                Some(_) => None,
            });
        // A heterogeneous job's components in partitions of their own: each must be able to
        // run there too.
        let reason = reason.or_else(|| {
            job.het.iter().filter(|c| c.partition != job.partition).find_map(|c| {
                let p = view.partitions.get(&*c.partition);
                eligibility::static_reason(c, view, p, qos, now_ms, &cycle).or(match p {
                    None => Some(PendingReason::PartitionNoNodes),
                    Some(p) if p.holds_back.is_some() => p.holds_back,
                    Some(p) if p.nodes.is_empty() => Some(PendingReason::PartitionNoNodes),
                    Some(p) if !p.nodes.iter().any(|&i| placement::could_hold(c, &view.nodes[i])) => {
                        Some(PendingReason::BadConstraints)
                    }
                    Some(_) => None,
                })
            })
        });
        match (reason, found) {
            (Some(reason), _) => out.ineligible.push(Waiting { position, job, reason }),
            (None, Some((partition, _))) => {
                out.candidates.push(Candidate { position, job, partition, claims: !job.claim.is_empty() })
            }
            (None, None) => unreachable!("a job without a partition has the reason PartitionNoNodes"),
        }
    }
    debug_assert_eq!(out.candidates.len() + out.ineligible.len(), ordered.len(), "screen must keep every job");
    out
}

impl Plan {
    /// The plan from the stages' results: the starts and reservations of `placed`, and the
    /// reasons of `ineligible` and of `placed`'s waiting jobs merged back into the order.
    pub fn assemble(considered: usize, ineligible: Vec<Waiting>, placed: Placed) -> Plan {
        let Placed { starts, waiting, estimates, backfilled, preemptions, resumes, late: _ } = placed;
        let mut plan = Plan { starts, estimates, backfilled, preemptions, resumes, ..Plan::default() };
        plan.reasons.reserve(ineligible.len() + waiting.len());
        // The two lists merged by position; each job's record asked for a few jobs ahead of
        // both, as [`screen`] does.
        let (mut a, mut b) = (0, 0);
        loop {
            view::prefetch_ahead(&ineligible, a, |w| w.job);
            view::prefetch_ahead(&waiting, b, |w| w.job);
            let from_ineligible = match (ineligible.get(a), waiting.get(b)) {
                (Some(x), Some(y)) => x.position < y.position,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            let next = if from_ineligible { &ineligible[a] } else { &waiting[b] };
            plan.set_reason(next.job, next.reason);
            if from_ineligible {
                a += 1;
            } else {
                b += 1;
            }
        }
        debug_assert_eq!(plan.starts.len() + plan.reasons.len(), considered, "every job starts or has a reason");
        plan
    }
}

/// When and where a job not yet submitted would start (`sbatch --test-only`, Slurm's
/// will-run test).
#[derive(Clone, Debug, PartialEq)]
pub enum WillRun {
    /// At once (or at its begin time), on these nodes.
    Now(Estimate),
    /// Not before this, when running jobs have freed enough room.
    Later(Estimate),
    /// Not within the backfill window, for this reason.
    Waiting(PendingReason),
}

/// Where and when `job` would start, as Slurm's will-run test answers: against the running
/// jobs and what they free when their limits end, not behind other pending jobs; at its begin
/// time when that is later than `now_ms`. The search reaches a year ahead whatever the
/// policy's backfill window, so that a long queue of running jobs still gets an answer.
pub fn will_run(view: &ClusterView, job: PendingJob, now_ms: Millis, policy: &Policy) -> WillRun {
    let at = job.begin_ms.unwrap_or(0).max(now_ms);
    let id = job.id;
    let view = ClusterView {
        pending: vec![std::sync::Arc::new(PendingJob { begin_ms: None, ..job })],
        previous: BTreeMap::new(),
        ..view.clone()
    };
    let policy =
        Policy { backfill: BackfillMode::Easy, bf_window_s: policy.bf_window_s.max(365 * 86_400), ..policy.clone() };
    let plan = schedule(&view, at, &policy);
    let names = |a: &Allocation| a.nodes.iter().map(|n| n.node.clone()).collect();
    if let Some(s) = plan.starts.iter().find(|s| s.job_id == id) {
        return WillRun::Now(Estimate { start_ms: at, nodes: names(&s.allocation), promised_ms: at });
    }
    match plan.estimates.get(&id) {
        Some(e) => WillRun::Later(e.clone()),
        None => WillRun::Waiting(plan.reason(id).unwrap_or(PendingReason::Resources)),
    }
}

/// Where every waiting job would start: conservative backfill's placement of each behind what
/// runs and what waits ahead of it, in the order the policy serves them. That is the queue's
/// order; with shortest-first backfill, the jobs that hold reservations (`reserved`: the last
/// cycle's, in queue order, as they were reserved), then the rest shortest planned run time
/// first, as backfill tries them: by the run times the schedule plans on (limits, unless the
/// policy predicts), whatever the view's are, so that forecasts on predictions follow the
/// schedule's order (issue 29 part 8: following it was the better forecast). Where the last
/// cycle was planned on limits for a late reservation ([`schedule`]), so are the estimates.
/// What `squeue --start` would say of each were every job reached: the simulator measures the
/// estimates' accuracy with it. The plan's starts are the jobs that would start now.
pub fn estimate_all(view: &ClusterView, now_ms: Millis, policy: &Policy, reserved: &BTreeMap<JobId, Estimate>) -> Plan {
    if let Some(limits) = view.late(reserved).then(|| view.on_limits()).flatten() {
        return estimate_all(&limits, now_ms, policy, reserved);
    }
    // The same rule as `place`'s: shortest-first only where there are reservations to go first.
    let shortest = policy.backfill_order == BackfillOrder::Shortest && policy.reservation_count() > 0;
    let policy = Policy { backfill: BackfillMode::Conservative, reservations: u32::MAX, ..policy.clone() };
    let mut ordered = order(view, now_ms, &policy);
    if shortest {
        let mut keyed: Vec<((bool, u64, usize), &PendingJob)> = ordered
            .into_iter()
            .enumerate()
            .map(|(k, j)| match reserved.contains_key(&j.id) {
                true => ((false, 0, k), j),
                false => ((true, if policy.predict { j.duration_s() } else { j.limit_s() }, k), j),
            })
            .collect();
        keyed.sort_unstable_by_key(|(key, _)| *key);
        ordered = keyed.into_iter().map(|(_, j)| j).collect();
    }
    let screened = screen(view, &ordered, now_ms, &policy);
    let placed = place(view, &screened.candidates, now_ms, &policy);
    Plan::assemble(ordered.len(), screened.ineligible, placed)
}

/// Forecasts: where and when every waiting job is expected to start, as [`estimate_all`]
/// places each behind what runs and what waits ahead of it, over a view planned on predicted
/// run times ([`ClusterView::from_state_predicting`]) while the schedule itself stays on limits
/// (unless `predict` is on). Issue 29 measured on five traces that this halves the error of the
/// start shown at submit against estimates on limits, at no cost to the schedule. A job that
/// would start now is forecast to start now, on the nodes it would take; one placed nowhere
/// within the backfill window has none.
pub fn forecast(
    view: &ClusterView,
    now_ms: Millis,
    policy: &Policy,
    reserved: &BTreeMap<JobId, Estimate>,
) -> BTreeMap<JobId, Estimate> {
    let plan = estimate_all(view, now_ms, policy, reserved);
    let mut out = plan.estimates;
    for s in plan.starts {
        let nodes = s.allocation.nodes.iter().map(|n| n.node.clone()).collect();
        out.insert(s.job_id, Estimate { start_ms: now_ms, nodes, promised_ms: now_ms });
    }
    out
}

/// One scheduling cycle over a view of the cluster: [`order`], [`screen`], [`place`], and the
/// [`Plan`] assembled from them. When a reservation planned on predictions slips far past the
/// start it first promised ([`ClusterView::late`]), planning stops there and the cycle is
/// planned again on limits ([`ClusterView::on_limits`]); so are the cycles after it, at once,
/// while the last cycle's reservations are late.
pub fn schedule(view: &ClusterView, now_ms: Millis, policy: &Policy) -> Plan {
    schedule_kept(view, now_ms, policy, None)
}

/// [`schedule`], from what the last cycles kept in `cache` and keeping this one's there: the
/// same plan, at a cost closer to what changed since ([`CycleCache`]). The leader keeps one
/// cache across its cycles.
pub fn schedule_with(view: &ClusterView, now_ms: Millis, policy: &Policy, cache: &mut CycleCache) -> Plan {
    schedule_kept(view, now_ms, policy, Some(cache))
}

fn schedule_kept(view: &ClusterView, now_ms: Millis, policy: &Policy, cache: Option<&mut CycleCache>) -> Plan {
    debug_assert!(view.nodes.windows(2).all(|w| w[0].name < w[1].name), "view nodes must be in name order");
    if !view.predicts() {
        return cycle(view, now_ms, policy, false, cache)
            .expect("a cycle that does not stop at a late reservation is planned whole");
    }
    if !view.late(&view.previous) {
        if let Some(plan) = cycle(view, now_ms, policy, true, cache) {
            return plan;
        }
    }
    // Planned again on limits: another view, whose jobs the cache does not keep.
    cycle(&view.without_predictions(), now_ms, policy, false, None)
        .expect("a cycle that does not stop at a late reservation is planned whole")
}

/// The start each job still waiting after `plan` was first promised ([`ClusterView::promised`]
/// for the next cycle): those of `view` whose job neither started nor left the queue, and
/// those of the jobs `plan` reserved for the first time.
pub fn promises(view: &ClusterView, plan: &Plan) -> BTreeMap<JobId, Millis> {
    let started: std::collections::BTreeSet<JobId> = plan.starts.iter().map(|s| s.job_id).collect();
    let waiting = |id: &JobId| view.pending.binary_search_by_key(id, |j| j.id).is_ok() && !started.contains(id);
    let mut kept: BTreeMap<JobId, Millis> =
        view.promised.iter().filter(|(id, _)| waiting(id)).map(|(&id, &at)| (id, at)).collect();
    for (&id, e) in &plan.estimates {
        kept.entry(id).or_insert(e.promised_ms);
    }
    kept
}

/// [`schedule`]'s stages over `view` as it plans the jobs; with `stop_late`, `None` as soon as
/// a reservation is late ([`ClusterView::late`]), the rest not planned.
fn cycle(
    view: &ClusterView,
    now_ms: Millis,
    policy: &Policy,
    stop_late: bool,
    cache: Option<&mut CycleCache>,
) -> Option<Plan> {
    let ordered = match cache {
        Some(cache) => cache.order.order(view, now_ms, policy),
        None => order(view, now_ms, policy),
    };
    let screened = screen(view, &ordered, now_ms, policy);
    let placed = place::place_until_late(view, &screened.candidates, now_ms, policy, stop_late);
    if stop_late && placed.late {
        return None;
    }
    Some(Plan::assemble(ordered.len(), screened.ineligible, placed))
}

#[cfg(test)]
mod backfill_order_tests;
#[cfg(test)]
mod het_tests;
#[cfg(test)]
mod oversubscribe_tests;
#[cfg(test)]
mod predict_tests;
#[cfg(test)]
mod props;
#[cfg(test)]
mod room_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod user_limit_tests;
