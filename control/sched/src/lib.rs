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
pub mod eligibility;
pub mod placement;
pub mod preemption;
pub mod priority;
pub mod profile;
pub mod reserved;
pub mod view;

pub use view::{ClusterView, Estimate, NodeView, PartitionView, PendingJob, Res};

use std::collections::BTreeMap;

use profile::Timeline;
use quorum_model::{
    Allocation, BackfillMode, BackfillOrder, JobId, Millis, NodeAllocation, PendingReason, PlannedStart, Policy,
    QueueOrder,
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

/// Builds every node's availability profile from what is free now and when running jobs end.
pub fn profiles(view: &ClusterView, now: u64) -> Vec<Timeline> {
    let mut free: Vec<Res> = view.nodes.iter().map(|n| n.capacity.minus(&n.completing)).collect();
    // Every release of every node in one list, sorted by node and time: one allocation for
    // all of them, then one per node for its steps. What ended jobs still hold while their
    // processes are killed is planned gone in a second, as a job past its limit is.
    let mut releases: Vec<(usize, u64, Res)> = (view.nodes.iter().enumerate())
        .filter(|(_, n)| n.completing != Res::default())
        .map(|(i, n)| (i, now + 1, n.completing))
        .collect();
    for r in &view.running {
        // A job predicted to end before its limit is planned to then, until it outlives the
        // prediction; a job past its limit is being killed: plan for it to be gone in a second.
        let limit = (r.end_s != u64::MAX).then(|| r.end_s.saturating_sub(r.start_s));
        let predicted = r.predicted_end_s.map(|p| p.saturating_sub(r.start_s));
        let planned = quorum_model::predict::running_s(predicted, limit, now.saturating_sub(r.start_s));
        let end = planned.map(|d| r.start_s.saturating_add(d).max(now + 1));
        for (i, res) in &r.alloc {
            free[*i] = free[*i].minus(res);
            if let Some(end) = end {
                releases.push((*i, end, *res));
            }
        }
    }
    releases.sort_unstable_by_key(|(i, t, _)| (*i, *t));
    let mut rest = releases.as_slice();
    free.into_iter()
        .enumerate()
        .map(|(i, f)| {
            let n = rest.iter().take_while(|(node, _, _)| *node == i).count();
            let (mine, after) = rest.split_at(n);
            rest = after;
            Timeline::from_sorted(now, f, n, mine.iter().map(|(_, t, r)| (*t, *r)))
        })
        .collect()
}

/// The largest free CPUs, memory and GPUs now over all nodes (each on its own), kept as counted
/// multisets so that a change costs a logarithm, not a pass over the nodes.
struct MaxFree {
    cpus: BTreeMap<i64, usize>,
    mem: BTreeMap<i64, usize>,
    gpus: BTreeMap<i64, usize>,
}

impl MaxFree {
    fn new(profiles: &[Timeline], now: u64) -> MaxFree {
        let mut m = MaxFree { cpus: BTreeMap::new(), mem: BTreeMap::new(), gpus: BTreeMap::new() };
        for p in profiles {
            m.add(p.free_at(now));
        }
        m
    }

    fn add(&mut self, f: Res) {
        *self.cpus.entry(f.cpus).or_default() += 1;
        *self.mem.entry(f.mem).or_default() += 1;
        *self.gpus.entry(f.gpus).or_default() += 1;
    }

    fn change(&mut self, before: Res, after: Res) {
        for (map, v) in [(&mut self.cpus, before.cpus), (&mut self.mem, before.mem), (&mut self.gpus, before.gpus)] {
            if let Some(n) = map.get_mut(&v) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&v);
                }
            }
        }
        self.add(after);
    }

    /// How many nodes have at least `cpus` free now (a job on `k` nodes needs `k` of them).
    fn nodes_with_cpus(&self, cpus: i64) -> usize {
        self.cpus.range(cpus..).map(|(_, n)| n).sum()
    }

    fn bound(&self) -> Res {
        let last = |m: &BTreeMap<i64, usize>| m.keys().next_back().copied().unwrap_or(0);
        Res { cpus: last(&self.cpus), mem: last(&self.mem), gpus: last(&self.gpus) }
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

/// A job that passed screening: it starts if its limits and the nodes allow.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    /// Its place in the order.
    pub position: usize,
    pub job: &'a PendingJob,
    /// Its partition's position in the view's partitions.
    pub partition: usize,
}

/// A job that does not start now, its place in the order, and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Waiting<'a> {
    pub position: usize,
    pub job: &'a PendingJob,
    pub reason: PendingReason,
}

/// What screening leaves: the candidates and the jobs that cannot start whatever else runs,
/// each list in order.
#[derive(Debug, Default)]
pub struct Screened<'a> {
    pub candidates: Vec<Candidate<'a>>,
    pub ineligible: Vec<Waiting<'a>>,
}

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
            (None, Some((partition, _))) => out.candidates.push(Candidate { position, job, partition }),
            (None, None) => unreachable!("a job without a partition has the reason PartitionNoNodes"),
        }
    }
    debug_assert_eq!(out.candidates.len() + out.ineligible.len(), ordered.len(), "screen must keep every job");
    out
}

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
    /// Jobs suspended by preemption resumed now ([`resume_lent`]).
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

/// The shape of a request as far as fitting it now goes: a shape that did not fit for some
/// duration does not fit for a longer one within the same cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Shape<'a> {
    partition: usize,
    /// Per node: CPUs, memory, GPUs.
    per_node: (i64, i64, i64),
    nodes: u32,
    gpu_type: Option<&'a str>,
    features: &'a [String],
    features_any: bool,
    features_same: bool,
    feature_counts: &'a [u32],
    exclude: &'a [String],
    only: &'a [String],
    exclusive: bool,
}

impl<'a> Shape<'a> {
    fn of(partition: usize, job: &'a PendingJob) -> Shape<'a> {
        Shape {
            partition,
            per_node: (job.per_node.cpus, job.per_node.mem, job.per_node.gpus),
            nodes: job.nodes,
            gpu_type: job.gpu_type.as_deref(),
            features: job.features.as_slice(),
            features_any: job.features_any,
            features_same: job.features_same,
            feature_counts: job.feature_counts.as_slice(),
            exclude: job.exclude.as_slice(),
            only: job.only.as_slice(),
            exclusive: job.exclusive,
        }
    }
}

/// Whose profiles a start or a reservation takes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Book {
    /// The jobs outside reservations'.
    Outside,
    /// Reservation `k`'s jobs' (its nodes, inside its windows).
    Inside(usize),
    /// A FLEX reservation `k`'s job: `Inside(k)` over its windows on its nodes, `Outside` at
    /// every other time and node.
    Flex(usize),
}

/// What the nodes have free over time while one cycle places jobs, and the two indexes that
/// spare scans over them (the largest free amounts, and single-node fits); [`Capacity::take`]
/// keeps all of them in step.
struct Capacity<'v> {
    view: &'v ClusterView,
    now: u64,
    profiles: Vec<Timeline>,
    free_gpus: Vec<Vec<u32>>,
    /// An upper bound of what any single node has free now: a job needing more cannot start
    /// now, which spares the node scan for most of a long queue once the cluster is full.
    max_free: MaxFree,
    /// Built on the first single-node job that may fit: many cycles place none.
    index: Option<placement::FreeIndex>,
    /// Advance reservations: `profiles` has their windows taken out; the profiles of the jobs
    /// of each are built from `unreserved` on the first of its jobs.
    reservations: reserved::Reservations,
    unreserved: Vec<(usize, Timeline)>,
    inside: Vec<Option<Vec<Timeline>>>,
}

impl<'v> Capacity<'v> {
    fn new(view: &'v ClusterView, now: u64) -> Capacity<'v> {
        let mut profiles = profiles(view, now);
        let reservations = reserved::Reservations::new(view, now.saturating_mul(1000));
        let mut unreserved = Vec::new();
        if !reservations.is_empty() {
            unreserved = reservations.nodes().into_iter().map(|i| (i, profiles[i].clone())).collect();
            reservations.block_outside(&mut profiles);
        }
        let max_free = MaxFree::new(&profiles, now);
        let free_gpus = view.nodes.iter().map(|n| n.free_gpus.clone()).collect();
        let inside = vec![None; reservations.held.len()];
        Capacity { view, now, profiles, free_gpus, max_free, index: None, reservations, unreserved, inside }
    }

    /// The profiles the jobs of reservation `k` see (built on first use).
    fn inside(&mut self, k: usize) -> &mut Vec<Timeline> {
        let (now, nodes) = (self.now, self.view.nodes.len());
        let (reservations, unreserved) = (&self.reservations, &self.unreserved);
        self.inside[k].get_or_insert_with(|| reservations.profiles_for(k, unreserved, now, nodes))
    }

    /// Brings the single-node index in step with node `i`'s profile, changed directly after
    /// now (by preemption: what is free now, which `max_free` counts, is unchanged).
    fn refresh(&mut self, i: usize) {
        if let Some(index) = self.index.as_mut() {
            index.update(self.view, i, &self.profiles, self.now);
        }
    }

    /// Takes `req` on node `i` from `from` to `to`, from the profiles of `book`: a FLEX
    /// reservation's job takes from its reservation's over its windows on its nodes, and from
    /// the others' at every other time and node.
    fn take(&mut self, book: Book, i: usize, from: u64, to: u64, req: &Res) {
        let k = match book {
            Book::Outside => return self.take_outside(i, from, to, req),
            Book::Inside(k) => return self.inside(k)[i].take(from, to, req),
            Book::Flex(k) => k,
        };
        let held = &self.reservations.held[k];
        let windows: Vec<(u64, u64)> =
            if held.nodes.binary_search(&i).is_ok() { held.windows.clone() } else { Vec::new() };
        let mut at = from;
        for (s, e) in windows.into_iter().filter(|&(s, e)| s < to && e > from) {
            if at < s {
                self.take_outside(i, at, s, req);
            }
            self.inside(k)[i].take(s.max(from), e.min(to), req);
            at = e;
        }
        if at < to {
            self.take_outside(i, at, to, req);
        }
    }

    /// What a FLEX reservation `k`'s job sees of each of `nodes`: its reservation's profiles
    /// over its windows on its nodes, the others' everywhere else (other nodes: nothing).
    fn flex_profiles(&mut self, k: usize, nodes: &[usize]) -> Vec<Timeline> {
        let now = self.now;
        self.inside(k);
        let held = &self.reservations.held[k];
        let inside = self.inside[k].as_deref().unwrap_or_default();
        let mut out = vec![Timeline::new(now, Res::default(), Vec::new()); self.profiles.len()];
        for &i in nodes {
            out[i] = if held.nodes.binary_search(&i).is_ok() {
                Timeline::spliced(&self.profiles[i], &inside[i], &held.windows)
            } else {
                self.profiles[i].clone()
            };
        }
        out
    }

    fn take_outside(&mut self, i: usize, from: u64, to: u64, req: &Res) {
        let before = self.profiles[i].free_at(self.now);
        self.profiles[i].take(from, to, req);
        self.max_free.change(before, self.profiles[i].free_at(self.now));
        if let Some(index) = self.index.as_mut() {
            index.update(self.view, i, &self.profiles, self.now);
        }
    }

    /// The nodes where `job` can start now and hold its share for its whole time limit.
    fn fit_now(
        &mut self,
        job: &PendingJob,
        members: &[bool],
        nodes: &[usize],
        topology: &placement::Topology,
        exclusive: bool,
    ) -> Option<Vec<usize>> {
        let (view, now) = (self.view, self.now);
        if job.nodes == 1 && !job.exclusive && !exclusive {
            let profiles = &self.profiles;
            self.index
                .get_or_insert_with(|| placement::FreeIndex::new(view, profiles, now))
                .fit_single(job, view, members, &self.profiles, &self.free_gpus, now)
                .map(|i| vec![i])
        } else {
            placement::fit_now(topology, job, view, nodes, &self.profiles, &self.free_gpus, now, exclusive)
        }
    }

    /// Starts `job` now on `nodes`: takes its share of each for its time limit, and its GPUs.
    fn start<'j>(
        &mut self,
        job: &'j PendingJob,
        nodes: Vec<usize>,
        exclusive: bool,
        inside: Book,
        duration: u64,
    ) -> (Allocation, eligibility::Usage<'j>)
    where
        'v: 'j,
    {
        let view = self.view;
        let mut allocation = Allocation::default();
        let (mut cpus, mut gpus, mut mem) = (0, 0, 0);
        for i in nodes {
            let node = &view.nodes[i];
            let req = placement::need(job, node, exclusive);
            self.take(inside, i, self.now, self.now.saturating_add(duration), &req);
            let indices = if job.exclusive || exclusive {
                std::mem::take(&mut self.free_gpus[i])
            } else {
                placement::take_gpus(job, node, &mut self.free_gpus[i], req.gpus)
            };
            // Whole CPUs: the node's books count parts of them.
            let whole = req.cpus / job.cpu_parts.max(1);
            cpus += whole;
            mem += req.mem;
            gpus += indices.len() as i64;
            allocation.nodes.push(NodeAllocation {
                node: node.name.clone(),
                cpus: whole as u32,
                mem_mb: req.mem as u64,
                gpus: indices,
                het_group: 0,
            });
        }
        let ways = view.cpu_parts.max(1) / job.cpu_parts.max(1);
        allocation.cpu_ways = (ways > 1).then_some(ways as u32);
        let typed: Vec<(&str, i64)> = match job.gpu_type.as_deref() {
            Some(t) => vec![(t, gpus)],
            None => allocation
                .nodes
                .iter()
                .filter_map(|a| view.node_index(&a.node).map(|i| (&view.nodes[i], a.gpus.len() as i64)))
                .filter_map(|(n, c)| n.uniform_gpu_type.as_deref().map(|t| (t, c)))
                .collect(),
        };
        (allocation, eligibility::Usage { cpus, gpus, mem, nodes: i64::from(job.nodes), gpus_by_type: typed })
    }

    /// A job planned for less than its limit (a prediction) may still not start where its limit
    /// would run into an advance reservation it is not in: of `nodes`, those clear of every
    /// reservation until its limit would end (and the same as a membership mask), or `None`
    /// when nothing is taken out (no reservations, or the job planned to its limit).
    fn clear_to_limit(&self, job: &PendingJob, nodes: &[usize]) -> Option<(Vec<usize>, Vec<bool>)> {
        if self.reservations.is_empty() || job.duration_s() >= job.limit_s() {
            return None;
        }
        let end = self.now.saturating_add(job.limit_s());
        let clear: Vec<usize> = nodes.iter().copied().filter(|&i| self.reservations.clear(i, self.now, end)).collect();
        if clear.len() == nodes.len() {
            return None;
        }
        let mut mask = vec![false; self.view.nodes.len()];
        for &i in &clear {
            mask[i] = true;
        }
        Some((clear, mask))
    }

    /// Reserves `nodes` for `job` from `start` for its planned run time.
    fn reserve(&mut self, job: &PendingJob, nodes: &[usize], start: u64, exclusive: bool, inside: Book) {
        for &i in nodes {
            let req = placement::need(job, &self.view.nodes[i], exclusive);
            self.take(inside, i, start, start.saturating_add(job.duration_s()), &req);
        }
    }
}

/// How many of each license are free: the cluster's count less what running jobs hold, and
/// less what jobs started earlier in this cycle take.
struct Licenses<'v> {
    free: BTreeMap<&'v str, i64>,
}

impl<'v> Licenses<'v> {
    fn from_running(view: &'v ClusterView) -> Licenses<'v> {
        let mut free: BTreeMap<&str, i64> = view.licenses.iter().map(|(n, c)| (n.as_str(), i64::from(*c))).collect();
        for r in &view.running {
            for (name, count) in &r.licenses {
                if let Some(f) = free.get_mut(name.as_str()) {
                    *f -= i64::from(*count);
                }
            }
        }
        Licenses { free }
    }

    /// Whether every license the job asks for has as many free (one the cluster lacks, none).
    fn free_for(&self, job: &PendingJob) -> bool {
        job.licenses.iter().all(|(name, count)| self.free.get(name.as_str()).is_some_and(|f| *f >= i64::from(*count)))
    }

    fn take(&mut self, job: &PendingJob) {
        for (name, count) in &job.licenses {
            if let Some(f) = self.free.get_mut(name.as_str()) {
                *f -= i64::from(*count);
            }
        }
    }
}

/// Stage 3, **place**: in order, each candidate that its limits allow starts now where the
/// availability profiles keep its share free for its whole time limit; one that cannot gets
/// `Resources` (the first blocked of its partition) or `Priority`, and — while reservations are
/// left (the first blocked job under EASY, the first N under conservative) — a reservation at
/// its earliest possible start, which later candidates must not delay. With
/// [`BackfillOrder::Shortest`], once the last reservation is made the candidates behind it
/// are tried shortest planned run time first (Tsafrir et al.'s SJBF), then in queue order.
pub fn place<'a>(view: &'a ClusterView, candidates: &[Candidate<'a>], now_ms: Millis, policy: &Policy) -> Placed<'a> {
    place_until_late(view, candidates, now_ms, policy, false)
}

/// [`place`]; with `stop_late`, it stops as soon as a reservation is late (`Placed::late`), the
/// candidates after it undecided: [`schedule`] plans that cycle again on limits.
fn place_until_late<'a>(
    view: &'a ClusterView,
    candidates: &[Candidate<'a>],
    now_ms: Millis,
    policy: &Policy,
    stop_late: bool,
) -> Placed<'a> {
    let now = now_ms / 1000;
    let horizon = now.saturating_add(policy.bf_window_s);
    let mut capacity = Capacity::new(view, now);
    let mut limits = eligibility::Limits::from_running(view);
    let mut licenses = Licenses::from_running(view);
    let partitions: Vec<&PartitionView> = view.partitions.values().collect();
    // Partitions in which a job has been blocked this cycle.
    let mut blocked = vec![false; partitions.len()];
    let mut reservations_left = policy.reservation_count();
    // Within a cycle free capacity only shrinks (starts and reservations take, nothing gives),
    // so a shape that could not start for some duration cannot start for a longer one either:
    // the shortest failed duration per shape spares the node scan.
    let mut failed: BTreeMap<Shape, u64> = BTreeMap::new();
    // The same for heterogeneous jobs: the shapes of all their components together.
    let mut failed_het: BTreeMap<Vec<Shape>, u64> = BTreeMap::new();
    let topology = placement::Topology::new(view);
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
    let mut placed = Placed::default();
    // The start a job was first promised: the one kept while it waits, else this.
    let promised = |id: JobId, start_ms: Millis| view.promised.get(&id).copied().unwrap_or(start_ms);
    let mut preemptor = preemption::Preemptor::new(view, policy);
    if let Some(p) = preemptor.as_mut() {
        // A reservation's windows are out of the profiles preemption gives back to.
        let reserved: Vec<usize> = capacity.unreserved.iter().map(|(i, _)| *i).collect();
        p.spare(&reserved);
    }
    // Jobs that preempted others, first: each starts on the nodes it claimed as soon as they
    // are free, and holds them from when they will be until then.
    let mut claimed: BTreeMap<usize, Option<Allocation>> = BTreeMap::new();
    for &Candidate { position, job, partition: part } in candidates.iter().filter(|c| !c.job.claim.is_empty()) {
        let partition = partitions[part];
        let Some(nodes) =
            job.claim.iter().map(|n| view.node_index(n).filter(|&i| members[part][i])).collect::<Option<Vec<usize>>>()
        else {
            continue;
        };
        if nodes.len() != job.nodes as usize || limits.check(view, job).is_some() || !licenses.free_for(job) {
            continue;
        }
        let exclusive = partition.exclusive;
        let fits =
            placement::fit_now(&topology, job, view, &nodes, &capacity.profiles, &capacity.free_gpus, now, exclusive);
        if let Some(fit) = fits {
            let (allocation, usage) = capacity.start(job, fit, exclusive, Book::Outside, job.duration_s());
            limits.add_job(view, job, &usage);
            licenses.take(job);
            claimed.insert(position, Some(allocation));
        } else if let Some(t) =
            placement::earliest_on(job, view, &nodes, &capacity.profiles, now, horizon, 1, exclusive)
        {
            capacity.reserve(job, &nodes, t, exclusive, Book::Outside);
            let promised_ms = promised(job.id, t * 1000);
            placed.reserve(view, job.id, Estimate { start_ms: t * 1000, nodes: job.claim.clone(), promised_ms });
            claimed.insert(position, None);
        }
    }
    placed.resumes = resume_lent(view, &mut capacity);
    // The candidates in the order they are tried: the queue's; with shortest-first backfill,
    // those left once the reservations are made go shortest planned run time first.
    let mut tried: Vec<usize> = (0..candidates.len()).collect();
    let shortest_first = policy.backfill_order == BackfillOrder::Shortest && policy.reservation_count() > 0;
    let (mut next, mut reordered) = (0, false);
    while let Some(&k) = tried.get(next) {
        if stop_late && placed.late {
            return placed;
        }
        if shortest_first && !reordered && reservations_left == 0 {
            tried[next..].sort_by_key(|&i| (candidates[i].job.duration_s(), i));
            reordered = true;
            continue;
        }
        next += 1;
        let Candidate { position, job, partition: part } = candidates[k];
        let wait = |reason| Waiting { position, job, reason };
        let partition = partitions[part];
        match claimed.remove(&position) {
            Some(Some(allocation)) => {
                placed.starts.push(PlannedStart { job_id: job.id, allocation });
                continue;
            }
            Some(None) => {
                placed.waiting.push(wait(PendingReason::Resources));
                continue;
            }
            None => {}
        }
        if policy.backfill == BackfillMode::None && blocked[part] {
            placed.waiting.push(wait(PendingReason::Priority));
            continue;
        }
        if let Some(reason) = limits.check(view, job) {
            placed.waiting.push(wait(reason));
            continue;
        }
        // Licenses are the cluster's, not a node's: a job waits until enough are free, and
        // reserves none (they free up when any holder ends).
        if !licenses.free_for(job) {
            placed.waiting.push(wait(PendingReason::Licenses));
            continue;
        }
        if let Some(name) = &job.reservation {
            let Some(k) = capacity.reservations.find(name) else {
                placed.waiting.push(wait(PendingReason::ReservationDeleted));
                continue;
            };
            let held = &capacity.reservations.held[k];
            if !held.reservation.allows(&job.user, &job.account) {
                placed.waiting.push(wait(PendingReason::Reservation));
                continue;
            }
            let Some(&(from, until)) = held.windows.first() else {
                placed.waiting.push(wait(PendingReason::ReservationDeleted));
                continue;
            };
            // A FLEX reservation's job runs on any of its partition's nodes, at any time, for its
            // whole time limit (its reservation's room where and while that holds, the rest's
            // elsewhere); another's runs on its nodes, inside its window, until its end.
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
            let spliced = flex.then(|| capacity.flex_profiles(k, &partition.nodes));
            let fit = if active {
                let profiles = match &spliced {
                    Some(p) => p.as_slice(),
                    None => {
                        capacity.inside(k);
                        capacity.inside[k].as_deref().unwrap_or_default()
                    }
                };
                placement::fit_now(&topology, &capped, view, &nodes, profiles, &capacity.free_gpus, now, exclusive)
            } else {
                None
            };
            if let Some(fit) = fit {
                let (allocation, usage) = capacity.start(job, fit, exclusive, book, capped.duration_s());
                limits.add_job(view, job, &usage);
                licenses.take(job);
                placed.starts.push(PlannedStart { job_id: job.id, allocation });
                continue;
            }
            placed.waiting.push(wait(if active { PendingReason::Resources } else { PendingReason::Reservation }));
            if reservations_left > 0 {
                let profiles = match &spliced {
                    Some(p) => p.as_slice(),
                    None => capacity.inside(k),
                };
                let found = placement::earliest(
                    &topology,
                    &capped,
                    view,
                    &nodes,
                    profiles,
                    earliest_from,
                    horizon,
                    1,
                    exclusive,
                );
                if let Some((t, on)) = found {
                    capacity.reserve(&capped, &on, t, exclusive, book);
                    let names = on.iter().map(|&i| view.nodes[i].name.clone()).collect();
                    let promised_ms = promised(job.id, t * 1000);
                    placed.reserve(view, job.id, Estimate { start_ms: t * 1000, nodes: names, promised_ms });
                    reservations_left -= 1;
                }
            }
            continue;
        }
        if !job.het.is_empty() {
            // A heterogeneous job: all its components now, or none (see `start_het`).
            if let Some(reason) = job.het.iter().find_map(|c| limits.check(view, c)) {
                placed.waiting.push(wait(reason));
                continue;
            }
            let exclusive = partition.exclusive;
            // Each component on its own partition's nodes, booked as that partition books them;
            // those in the job's partition on the job's candidates.
            let part_of = |c: &PendingJob| match c.partition != job.partition {
                true => view.partitions.keys().position(|k| **k == *c.partition).unwrap_or(part),
                false => part,
            };
            let shapes: Vec<Shape> = job.components().map(|c| Shape::of(part_of(c), c)).collect();
            let clear = capacity.clear_to_limit(job, &partition.nodes);
            let may_fit = failed_het.get(&shapes).is_none_or(|&d| job.duration_s() < d);
            let books = (capacity.profiles.as_slice(), capacity.free_gpus.as_slice());
            let candidates = clear.as_ref().map_or(partition.nodes.as_slice(), |(c, _)| c.as_slice());
            let places = het_places(job, view, candidates, exclusive);
            let fits = match may_fit {
                true => placement::fit_het(&topology, job, view, &places, books, now),
                false => None,
            };
            // What failed on fewer nodes says nothing of a job that may have all of them.
            if fits.is_none() && may_fit && clear.is_none() {
                failed_het.insert(shapes, job.duration_s());
            }
            if let Some(per_component) = fits {
                let mut allocation = Allocation::default();
                for (k, (c, nodes)) in job.components().zip(per_component).enumerate() {
                    let (a, usage) = capacity.start(c, nodes, places[k].1, Book::Outside, job.duration_s());
                    limits.add_job(view, c, &usage);
                    allocation.cpu_ways = a.cpu_ways;
                    allocation.nodes.extend(a.nodes.into_iter().map(|n| NodeAllocation { het_group: k as u32, ..n }));
                }
                licenses.take(job);
                placed.starts.push(PlannedStart { job_id: job.id, allocation });
                placed.backfilled += usize::from(blocked[part]);
                continue;
            }
            let first_blocked = !std::mem::replace(&mut blocked[part], true);
            let reason = capacity.reservations.reason(part, now, job.limit_s());
            placed.waiting.push(wait(reason.unwrap_or(if first_blocked {
                PendingReason::Resources
            } else {
                PendingReason::Priority
            })));
            if reservations_left == 0 {
                continue;
            }
            let places = het_places(job, view, &partition.nodes, exclusive);
            let found = placement::earliest_het(
                &topology,
                job,
                view,
                &places,
                &capacity.profiles,
                (now, horizon, policy.bf_resolution_s),
            );
            if let Some((t, per_component)) = found {
                let mut names = Vec::new();
                for ((c, nodes), &(_, exclusive)) in job.components().zip(&per_component).zip(&places) {
                    capacity.reserve(c, nodes, t, exclusive, Book::Outside);
                    names.extend(nodes.iter().map(|&i| view.nodes[i].name.clone()));
                }
                let promised_ms = promised(job.id, t * 1000);
                placed.reserve(view, job.id, Estimate { start_ms: t * 1000, nodes: names, promised_ms });
                reservations_left -= 1;
            }
            continue;
        }
        let dur = job.duration_s();
        let exclusive = partition.exclusive;
        let shape = Shape::of(part, job);
        let may_fit = capacity.max_free.bound().fits(&job.per_node)
            && (job.nodes == 1 || capacity.max_free.nodes_with_cpus(job.per_node.cpus) >= job.nodes as usize)
            && failed.get(&shape).is_none_or(|&d| dur < d);
        let clear = capacity.clear_to_limit(job, &partition.nodes);
        let fits_now = match (may_fit, &clear) {
            (false, _) => None,
            (true, None) => capacity.fit_now(job, &members[part], &partition.nodes, &topology, exclusive),
            (true, Some((nodes, mask))) => capacity.fit_now(job, mask, nodes, &topology, exclusive),
        };
        if let Some(nodes) = fits_now {
            let (allocation, usage) = capacity.start(job, nodes, exclusive, Book::Outside, job.duration_s());
            limits.add_job(view, job, &usage);
            licenses.take(job);
            placed.starts.push(PlannedStart { job_id: job.id, allocation });
            placed.backfilled += usize::from(blocked[part]);
            continue;
        }
        if may_fit && clear.is_none() {
            failed.insert(shape, dur);
        }
        let first_blocked = !std::mem::replace(&mut blocked[part], true);
        let reason = capacity.reservations.reason(part, now, job.limit_s());
        placed.waiting.push(wait(reason.unwrap_or(if first_blocked {
            PendingReason::Resources
        } else {
            PendingReason::Priority
        })));
        // Room made by preempting: held for it from the end of its victims' grace.
        if let Some(p) = preemptor.as_mut() {
            let found = p.search(job, partition, &topology, &mut capacity.profiles, now, exclusive);
            if let Some(found) = found {
                for &i in &found.touched {
                    capacity.refresh(i);
                }
                capacity.reserve(job, &found.nodes, found.start_s, exclusive, Book::Outside);
                let names = found.planned.nodes.clone();
                let (start_ms, promised_ms) = (found.start_s * 1000, promised(job.id, found.start_s * 1000));
                placed.reserve(view, job.id, Estimate { start_ms, nodes: names, promised_ms });
                placed.preemptions.push(found.planned);
                continue;
            }
        }
        if reservations_left == 0 {
            continue;
        }
        let previous: Option<Vec<usize>> =
            view.previous.get(&job.id).and_then(|e| e.nodes.iter().map(|n| view.node_index(n)).collect());
        let found = placement::earliest_sticky(
            &topology,
            job,
            view,
            &partition.nodes,
            &capacity.profiles,
            now,
            horizon,
            policy.bf_resolution_s,
            exclusive,
            previous.as_deref(),
        );
        // Planned for its prediction, it still may not start where its limit would run into an
        // advance reservation: then it is reserved where its limit fits.
        let crosses = |(t, nodes): &(u64, Vec<usize>)| {
            let end = t.saturating_add(job.limit_s());
            job.duration_s() < job.limit_s() && nodes.iter().any(|&i| !capacity.reservations.clear(i, *t, end))
        };
        let found = match found {
            Some(f) if crosses(&f) => {
                let limited = PendingJob { plan_s: None, ..job.clone() };
                let (profiles, resolution) = (&capacity.profiles, policy.bf_resolution_s);
                placement::earliest(
                    &topology,
                    &limited,
                    view,
                    &partition.nodes,
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
            capacity.reserve(job, &nodes, t, exclusive, Book::Outside);
            let names = nodes.iter().map(|&i| view.nodes[i].name.clone()).collect();
            let promised_ms = promised(job.id, t * 1000);
            placed.reserve(view, job.id, Estimate { start_ms: t * 1000, nodes: names, promised_ms });
            reservations_left -= 1;
        }
    }
    if reordered {
        // The reasons are merged back into the queue's order.
        placed.waiting.sort_by_key(|w| w.position);
    }
    debug_assert_eq!(placed.starts.len() + placed.waiting.len(), candidates.len(), "place must decide every candidate");
    debug_assert!(
        capacity.profiles.iter().all(Timeline::never_overcommitted),
        "scheduler bug: a plan or reservation overcommits a node"
    );
    placed
}

/// Jobs suspended by preemption, after the jobs that preempted them have their nodes and
/// before any other: each whose CPUs are free now on every node of its allocation is resumed
/// and holds them for what is left of its time limit; one that must wait holds them from the
/// earliest time they are all free (later jobs must not delay it, as a reservation). The
/// earliest started first.
fn resume_lent(view: &ClusterView, capacity: &mut Capacity) -> Vec<JobId> {
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

impl Plan {
    /// The plan from the stages' results: the starts and reservations of `placed`, and the
    /// reasons of `ineligible` and of `placed`'s waiting jobs merged back into the order.
    pub fn assemble(considered: usize, ineligible: Vec<Waiting>, placed: Placed) -> Plan {
        let Placed { starts, waiting, estimates, backfilled, preemptions, resumes, late: _ } = placed;
        let mut plan = Plan { starts, estimates, backfilled, preemptions, resumes, ..Plan::default() };
        plan.reasons.reserve(ineligible.len() + waiting.len());
        let (mut a, mut b) = (ineligible.into_iter().peekable(), waiting.into_iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x.position < y.position => a.next(),
                (Some(_), Some(_)) => b.next(),
                (Some(_), None) => a.next(),
                (None, _) => b.next(),
            };
            let Some(Waiting { job, reason, .. }) = next else { break };
            plan.set_reason(job, reason);
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
    debug_assert!(view.nodes.windows(2).all(|w| w[0].name < w[1].name), "view nodes must be in name order");
    let whole = |view: &ClusterView| {
        cycle(view, now_ms, policy, false).expect("a cycle that does not stop at a late reservation is planned whole")
    };
    if !view.predicts() {
        return whole(view);
    }
    if !view.late(&view.previous) {
        if let Some(plan) = cycle(view, now_ms, policy, true) {
            return plan;
        }
    }
    whole(&view.without_predictions())
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
fn cycle(view: &ClusterView, now_ms: Millis, policy: &Policy, stop_late: bool) -> Option<Plan> {
    let ordered = order(view, now_ms, policy);
    let screened = screen(view, &ordered, now_ms, policy);
    let placed = place_until_late(view, &screened.candidates, now_ms, policy, stop_late);
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
