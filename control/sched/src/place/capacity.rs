//! What the nodes have free over time while one cycle places jobs ([`Capacity`]), and the
//! cluster's licenses ([`Licenses`]).

use std::collections::BTreeMap;

use quorum_model::{Allocation, NodeAllocation};

use crate::profile::{profiles, Timeline};
use crate::view::{ClusterView, PendingJob, Res};
use crate::{eligibility, placement, reserved};

/// The largest free CPUs, memory and GPUs now over all nodes (each on its own), kept as counted
/// multisets so that a change costs a logarithm, not a pass over the nodes.
pub(super) struct MaxFree {
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
    pub(super) fn nodes_with_cpus(&self, cpus: i64) -> usize {
        self.cpus.range(cpus..).map(|(_, n)| n).sum()
    }

    pub(super) fn bound(&self) -> Res {
        let last = |m: &BTreeMap<i64, usize>| m.keys().next_back().copied().unwrap_or(0);
        Res { cpus: last(&self.cpus), mem: last(&self.mem), gpus: last(&self.gpus) }
    }
}

/// Whose profiles a start or a reservation takes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Book {
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
pub(super) struct Capacity<'v> {
    view: &'v ClusterView,
    pub(super) now: u64,
    pub(super) profiles: Vec<Timeline>,
    pub(super) free_gpus: Vec<Vec<u32>>,
    /// An upper bound of what any single node has free now: a job needing more cannot start
    /// now, which spares the node scan for most of a long queue once the cluster is full.
    pub(super) max_free: MaxFree,
    /// Built on the first single-node job that may fit: many cycles place none.
    index: Option<placement::FreeIndex>,
    /// Advance reservations: `profiles` has their windows taken out; the profiles of the jobs
    /// of each are built from `unreserved` on the first of its jobs.
    pub(super) reservations: reserved::Reservations,
    pub(super) unreserved: Vec<(usize, Timeline)>,
    pub(super) inside: Vec<Option<Vec<Timeline>>>,
}

impl<'v> Capacity<'v> {
    pub(super) fn new(view: &'v ClusterView, now: u64) -> Capacity<'v> {
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
    pub(super) fn inside(&mut self, k: usize) -> &mut Vec<Timeline> {
        let (now, nodes) = (self.now, self.view.nodes.len());
        let (reservations, unreserved) = (&self.reservations, &self.unreserved);
        self.inside[k].get_or_insert_with(|| reservations.profiles_for(k, unreserved, now, nodes))
    }

    /// Brings the single-node index in step with node `i`'s profile, changed directly after
    /// now (by preemption: what is free now, which `max_free` counts, is unchanged).
    pub(super) fn refresh(&mut self, i: usize) {
        if let Some(index) = self.index.as_mut() {
            index.update(self.view, i, &self.profiles, self.now);
        }
    }

    /// Takes `req` on node `i` from `from` to `to`, from the profiles of `book`: a FLEX
    /// reservation's job takes from its reservation's over its windows on its nodes, and from
    /// the others' at every other time and node.
    pub(super) fn take(&mut self, book: Book, i: usize, from: u64, to: u64, req: &Res) {
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
    pub(super) fn flex_profiles(&mut self, k: usize, nodes: &[usize]) -> Vec<Timeline> {
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
    pub(super) fn fit_now(
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
    pub(super) fn start<'j>(
        &mut self,
        job: &'j PendingJob,
        mut nodes: Vec<usize>,
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
        // The job's nodes in the order a hostlist lists them, as Slurm's are, whichever fit
        // best: its script runs on the first, its tasks are numbered along them.
        nodes.sort_by(|&a, &b| quorum_model::hostlist::natural_cmp(&view.nodes[a].name, &view.nodes[b].name));
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
    pub(super) fn clear_to_limit(&self, job: &PendingJob, nodes: &[usize]) -> Option<(Vec<usize>, Vec<bool>)> {
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
    pub(super) fn reserve(&mut self, job: &PendingJob, nodes: &[usize], start: u64, exclusive: bool, inside: Book) {
        for &i in nodes {
            let req = placement::need(job, &self.view.nodes[i], exclusive);
            self.take(inside, i, start, start.saturating_add(job.duration_s()), &req);
        }
    }
}

/// How many of each license are free: the cluster's count less what running jobs hold, and
/// less what jobs started earlier in this cycle take.
pub(super) struct Licenses<'v> {
    free: BTreeMap<&'v str, i64>,
}

impl<'v> Licenses<'v> {
    pub(super) fn from_running(view: &'v ClusterView) -> Licenses<'v> {
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
    pub(super) fn free_for(&self, job: &PendingJob) -> bool {
        job.licenses.iter().all(|(name, count)| self.free.get(name.as_str()).is_some_and(|f| *f >= i64::from(*count)))
    }

    pub(super) fn take(&mut self, job: &PendingJob) {
        for (name, count) in &job.licenses {
            if let Some(f) = self.free.get_mut(name.as_str()) {
                *f -= i64::from(*count);
            }
        }
    }
}
