//! The scheduler core: `schedule(&ClusterView, now, &Policy) -> Plan`, a pure function.
//!
//! The leader builds a [`ClusterView`] from the state at one applied index, calls [`schedule`],
//! and proposes the [`Plan`] through Raft, where apply re-checks every start. The pipeline, for
//! every pending job every cycle (no depth cap):
//!
//! 1. **order** — by multifactor priority ([`priority`]), submit order, or shortest first;
//! 2. **eligibility** — holds, dependencies, begin time, partition/QOS/association limits
//!    ([`eligibility`]); an ineligible job gets its reason and goes no further;
//! 3. **placement now** — nodes whose availability profile ([`profile`]) keeps the job's share
//!    free for its whole time limit ([`placement`]); a start takes its interval from the
//!    profiles, so no later job can overlap it;
//! 4. **backfill** — a job that cannot start now gets a reservation at its earliest possible
//!    start (the first blocked job under EASY, the first N under conservative), taken from the
//!    profiles; a lower-priority job therefore starts now only where it delays no reservation.

pub mod eligibility;
pub mod placement;
pub mod priority;
pub mod profile;
pub mod view;

pub use view::{ClusterView, NodeView, PendingJob, Res};

use std::collections::BTreeMap;

use profile::Timeline;
use quorum_model::{
    Allocation, BackfillMode, JobId, Millis, NodeAllocation, PendingReason, PlannedStart, Policy, QueueOrder,
};

/// Where and when backfill expects a pending job to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub start_ms: Millis,
    pub nodes: Vec<String>,
}

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
    let mut free: Vec<Res> = view.nodes.iter().map(|n| n.capacity).collect();
    // Every release of every node in one list, sorted by node and time: one allocation for
    // all of them, then one per node for its steps.
    let mut releases: Vec<(usize, u64, Res)> = Vec::new();
    for r in &view.running {
        // A job past its limit is being killed; plan for it to be gone in a second.
        let end = if r.end_s == u64::MAX { None } else { Some(r.end_s.max(now + 1)) };
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

/// The order in which pending jobs are considered.
fn order<'a>(view: &'a ClusterView, now_ms: Millis, policy: &Policy) -> Vec<&'a PendingJob> {
    let mut jobs: Vec<&PendingJob> = view.pending.iter().map(|j| &**j).collect();
    match policy.ordering {
        QueueOrder::Fifo => jobs.sort_by_key(|j| (j.submit_ms, j.id)),
        QueueOrder::ShortestFirst => jobs.sort_by_key(|j| (j.duration_s(), j.submit_ms, j.id)),
        QueueOrder::Multifactor => {
            let ctx = priority::PriorityContext::new(view, now_ms, policy);
            let mut keyed: Vec<(f64, &PendingJob)> =
                jobs.into_iter().map(|j| (ctx.factors(view, j, now_ms, policy).total, j)).collect();
            keyed
                .sort_by(|(pa, a), (pb, b)| pb.total_cmp(pa).then(a.submit_ms.cmp(&b.submit_ms)).then(a.id.cmp(&b.id)));
            jobs = keyed.into_iter().map(|(_, j)| j).collect();
        }
    }
    jobs
}

/// One scheduling cycle over a view of the cluster.
pub fn schedule(view: &ClusterView, now_ms: Millis, policy: &Policy) -> Plan {
    let now = now_ms / 1000;
    debug_assert!(view.nodes.windows(2).all(|w| w[0].name < w[1].name), "view nodes must be in name order");
    let horizon = now.saturating_add(policy.bf_window_s);
    let mut profiles = profiles(view, now);
    let mut free_gpus: Vec<Vec<u32>> = view.nodes.iter().map(|n| n.free_gpus.clone()).collect();
    let mut limits = eligibility::Limits::from_running(view);
    let accounts_limit_wall = eligibility::accounts_limit_wall(view);
    let mut partitions = Lookup::new(&view.partitions);
    let mut qos = Lookup::new(&view.qos);
    // Partitions in which a job has been blocked this cycle, by position in `partitions`.
    let mut blocked = vec![false; view.partitions.len()];
    let mut reservations_left = policy.reservation_count();
    let mut plan = Plan::default();
    // An upper bound of what any single node has free now: a job needing more cannot start now,
    // which spares the node scan for most of a long queue once the cluster is full.
    let mut max_free = MaxFree::new(&profiles, now);
    // Within a cycle free capacity only shrinks (starts and reservations take, nothing gives),
    // so a shape that could not start for some duration cannot start for a longer one either:
    // remember the shortest failed duration per shape and skip the node scan.
    type Shape<'a> = (usize, (i64, i64, i64), u32, Option<&'a str>, &'a [String], bool);
    let mut failed: BTreeMap<Shape, u64> = BTreeMap::new();
    // Built on the first single-node job that may fit: many cycles place none.
    let mut index: Option<placement::FreeIndex> = None;
    let topology = placement::Topology::new(view);
    let members: Vec<Vec<bool>> = view
        .partitions
        .values()
        .map(|p| {
            let mut m = vec![false; view.nodes.len()];
            for &i in &p.nodes {
                m[i] = true;
            }
            m
        })
        .collect();

    for job in order(view, now_ms, policy) {
        let found = partitions.find(&job.partition);
        let reason = eligibility::static_reason(
            job,
            view,
            found.map(|(_, p)| p),
            qos.find(&job.qos).map(|(_, q)| q),
            now_ms,
            accounts_limit_wall,
        );
        if let Some(reason) = reason {
            plan.set_reason(job, reason);
            continue;
        }
        let Some((part, partition)) = found else {
            plan.set_reason(job, PendingReason::PartitionNoNodes);
            continue;
        };
        if partition.nodes.is_empty() {
            plan.set_reason(job, PendingReason::PartitionNoNodes);
            continue;
        }
        if !partition.nodes.iter().any(|&i| placement::could_hold(job, &view.nodes[i])) {
            plan.set_reason(job, PendingReason::BadConstraints);
            continue;
        }
        if policy.backfill == BackfillMode::None && blocked[part] {
            plan.set_reason(job, PendingReason::Priority);
            continue;
        }
        if let Some(reason) = limits.check(view, job) {
            plan.set_reason(job, reason);
            continue;
        }
        let dur = job.duration_s();
        let exclusive = partition.exclusive;
        let shape: Shape = (
            part,
            (job.per_node.cpus, job.per_node.mem, job.per_node.gpus),
            job.nodes,
            job.gpu_type.as_deref(),
            job.features.as_slice(),
            job.exclusive,
        );
        let may_fit = max_free.bound().fits(&job.per_node)
            && (job.nodes == 1 || max_free.nodes_with_cpus(job.per_node.cpus) >= job.nodes as usize)
            && failed.get(&shape).is_none_or(|&d| dur < d);
        let fits_now = if !may_fit {
            None
        } else if job.nodes == 1 && !job.exclusive && !exclusive {
            index
                .get_or_insert_with(|| placement::FreeIndex::new(view, &profiles, now))
                .fit_single(job, view, &members[part], &profiles, &free_gpus, now)
                .map(|i| vec![i])
        } else {
            placement::fit_now(&topology, job, view, &partition.nodes, &profiles, &free_gpus, now, exclusive)
        };
        if let Some(nodes) = fits_now {
            let mut allocation = Allocation::default();
            let (mut cpus, mut gpus, mut mem) = (0, 0, 0);
            for i in nodes {
                let node = &view.nodes[i];
                let req = placement::need(job, node, exclusive);
                let before = profiles[i].free_at(now);
                profiles[i].take(now, now.saturating_add(dur), &req);
                max_free.change(before, profiles[i].free_at(now));
                if let Some(index) = index.as_mut() {
                    index.update(i, &profiles, now);
                }
                let indices = if job.exclusive || exclusive {
                    std::mem::take(&mut free_gpus[i])
                } else {
                    placement::take_gpus(job, node, &mut free_gpus[i], req.gpus)
                };
                cpus += req.cpus;
                mem += req.mem;
                gpus += indices.len() as i64;
                allocation.nodes.push(NodeAllocation {
                    node: node.name.clone(),
                    cpus: req.cpus as u32,
                    mem_mb: req.mem as u64,
                    gpus: indices,
                });
            }
            let typed: Vec<(&str, i64)> = match job.gpu_type.as_deref() {
                Some(t) => vec![(t, gpus)],
                None => allocation
                    .nodes
                    .iter()
                    .filter_map(|a| view.node_index(&a.node).map(|i| (&view.nodes[i], a.gpus.len() as i64)))
                    .filter_map(|(n, c)| n.uniform_gpu_type.as_deref().map(|t| (t, c)))
                    .collect(),
            };
            let usage = eligibility::Usage { cpus, gpus, mem, nodes: i64::from(job.nodes), gpus_by_type: typed };
            limits.add_job(view, job, &usage);
            plan.starts.push(PlannedStart { job_id: job.id, allocation });
            continue;
        }
        if may_fit {
            failed.insert(shape, dur);
        }
        let first_blocked = !std::mem::replace(&mut blocked[part], true);
        plan.set_reason(job, if first_blocked { PendingReason::Resources } else { PendingReason::Priority });
        if reservations_left == 0 {
            continue;
        }
        let previous: Option<Vec<usize>> =
            view.previous.get(&job.id).and_then(|names| names.iter().map(|n| view.node_index(n)).collect());
        let found = placement::earliest_sticky(
            &topology,
            job,
            view,
            &partition.nodes,
            &profiles,
            now,
            horizon,
            policy.bf_resolution_s,
            exclusive,
            previous.as_deref(),
        );
        if let Some((t, nodes)) = found {
            for &i in &nodes {
                let req = placement::need(job, &view.nodes[i], exclusive);
                let before = profiles[i].free_at(now);
                profiles[i].take(t, t.saturating_add(dur), &req);
                max_free.change(before, profiles[i].free_at(now));
                if let Some(index) = index.as_mut() {
                    index.update(i, &profiles, now);
                }
            }
            plan.estimates.insert(
                job.id,
                Estimate { start_ms: t * 1000, nodes: nodes.iter().map(|&i| view.nodes[i].name.clone()).collect() },
            );
            reservations_left -= 1;
        }
    }
    debug_assert!(
        profiles.iter().all(Timeline::never_overcommitted),
        "scheduler bug: a plan or reservation overcommits a node"
    );
    plan
}

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
