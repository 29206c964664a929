//! Placement: which nodes can hold a job over an interval, and exactly what each gives it.
//!
//! A node qualifies when it is schedulable, has every requested feature, is one the job may have
//! (not excluded; in its node list when it has one), has enough GPUs of the
//! requested type, and its profile keeps the job's share free for the whole interval (an
//! exclusive job needs the whole node). Among qualifying nodes: the fewest switches when a
//! topology is known; for a reservation (a start later than now), the nodes busy now first, and
//! among those the ones that free the job's share last before its start, so that it hides from
//! backfill as little as its start allows of the time the nodes could run jobs that go past it;
//! then the best fit (least left over), then name order.

use super::profile::{round_up, Timeline};
use super::view::{ClusterView, NodeView, PendingJob, Res};

/// How a qualifying node ranks for a job, lowest first: its weight (Slurm's: the lightest nodes
/// are allocated first), how long before the job's start the node could already hold its share
/// (what a reservation there hides from backfill; a node idle now hides the most, none for a
/// start now), then what it would have left over.
pub type Rank = (u32, u64, i64);

/// The node's rank for `job` starting at `t` (`now` or later), given its `req` and what it has
/// free from `t` for the job's duration.
fn rank(weight: u32, profile: &Timeline, req: &Res, free: &Res, t: u64, now: u64) -> Rank {
    let hidden = if t > now { t - profile.holds_since(req, t).max(now) } else { 0 };
    (weight, hidden, free.cpus - req.cpus)
}

/// What the job needs on `node`: its share, or the whole node when exclusive.
pub fn need(job: &PendingJob, node: &NodeView, partition_exclusive: bool) -> Res {
    if job.exclusive || partition_exclusive {
        node.capacity
    } else {
        job.per_node
    }
}

/// Whether the node could ever hold the job, were it empty.
pub fn could_hold(job: &PendingJob, node: &NodeView) -> bool {
    node.schedulable
        && (!job.feature_counts.is_empty()
            || quorum_model::features_match(&job.features, job.features_any, &node.features))
        && !job.exclude.contains(&node.name)
        && (!lists_every_node(job) || job.only.contains(&node.name))
        && node.gpu_count(job.gpu_type.as_deref()) >= job.per_node.gpus
        && node.capacity.fits(&job.per_node)
}

/// Whether the job's node list names all of its nodes; a shorter list names nodes it must
/// have, and the others are chosen as for any job (Slurm's `-N 4 -w n[1-2]`).
fn lists_every_node(job: &PendingJob) -> bool {
    !job.only.is_empty() && job.only.len() >= job.nodes as usize
}

/// Picks `k` nodes for `job` among `fitting`, as [`choose`] does. With `[a|b]` (a matching
/// OR) they all have one of the features, the first written that gives enough; with node
/// counts (`[a*2&b*4]`), see [`choose_counted`].
fn choose_for(
    topology: &Topology,
    job: &PendingJob,
    view: &ClusterView,
    fitting: Vec<(usize, Rank)>,
    k: usize,
) -> Option<Vec<usize>> {
    if !job.feature_counts.is_empty() {
        return choose_counted(topology, job, view, fitting, k);
    }
    if !(job.features_same && job.features.len() > 1) {
        return choose_listed(topology, job, view, fitting, k);
    }
    job.features.iter().find_map(|f| {
        let with: Vec<(usize, Rank)> =
            fitting.iter().copied().filter(|(i, _)| view.nodes[*i].features.contains(f)).collect();
        choose_listed(topology, job, view, with, k)
    })
}

/// Picks `k` nodes for a job with node counts per feature (`[a*2&b*4]`): the counted nodes
/// first, best fit first among those with each feature (exact where nodes have several of the
/// features, see [`quorum_model::assign_feature_counts`]), then the rest as [`choose`] picks
/// them among the others. The counted nodes are not grouped by switch.
fn choose_counted(
    topology: &Topology,
    job: &PendingJob,
    view: &ClusterView,
    mut fitting: Vec<(usize, Rank)>,
    k: usize,
) -> Option<Vec<usize>> {
    if fitting.len() < k {
        return None;
    }
    fitting.sort_by_key(|(i, left)| (*left, *i));
    let with: Vec<usize> = fitting
        .iter()
        .map(|(i, _)| *i)
        .filter(|&i| job.features.iter().any(|f| view.nodes[i].features.contains(f)))
        .collect();
    let features: Vec<&[String]> = with.iter().map(|&i| view.nodes[i].features.as_slice()).collect();
    let counted: Vec<usize> = quorum_model::assign_feature_counts(&job.features, &job.feature_counts, &features)?
        .into_iter()
        .map(|c| with[c])
        .collect();
    let others: Vec<(usize, Rank)> = fitting.into_iter().filter(|(i, _)| !counted.contains(i)).collect();
    let mut nodes = counted;
    if k > nodes.len() {
        nodes.extend(choose(topology, others, k - nodes.len())?);
    }
    Some(nodes)
}

/// Whether `nodes` give the job's node counts per feature (true for a job without them).
fn counts_met(job: &PendingJob, view: &ClusterView, nodes: &[usize]) -> bool {
    if job.feature_counts.is_empty() {
        return true;
    }
    let features: Vec<&[String]> = nodes.iter().map(|&i| view.nodes[i].features.as_slice()).collect();
    quorum_model::assign_feature_counts(&job.features, &job.feature_counts, &features).is_some()
}

/// Picks `k` nodes for `job` among `fitting`, as [`choose`] does; a job that lists fewer nodes
/// than it asks for gets every listed one (none, when one of them does not fit) and the rest
/// chosen among the others.
fn choose_listed(
    topology: &Topology,
    job: &PendingJob,
    view: &ClusterView,
    fitting: Vec<(usize, Rank)>,
    k: usize,
) -> Option<Vec<usize>> {
    if job.only.is_empty() || lists_every_node(job) {
        return choose(topology, fitting, k);
    }
    let required: Vec<usize> = job.only.iter().map(|n| view.node_index(n)).collect::<Option<_>>()?;
    if !required.iter().all(|r| fitting.iter().any(|(i, _)| i == r)) {
        return None;
    }
    let others: Vec<(usize, Rank)> = fitting.into_iter().filter(|(i, _)| !required.contains(i)).collect();
    let mut nodes = required;
    if k > nodes.len() {
        nodes.extend(choose(topology, others, k - nodes.len())?);
    }
    Some(nodes)
}

/// Free GPU indices of the requested type on the node now.
fn free_gpus_of_type<'a>(job: &'a PendingJob, node: &'a NodeView, free: &'a [u32]) -> impl Iterator<Item = u32> + 'a {
    let all = match (job.gpu_type.as_deref(), node.uniform_gpu_type.as_deref()) {
        (None, _) => Some(true),
        (Some(w), Some(u)) => Some(w == u),
        (Some(_), None) => None,
    };
    free.iter().copied().filter(move |i| match all {
        Some(all) => all,
        None => node.gpus.iter().any(|(idx, t)| idx == i && Some(t.as_str()) == job.gpu_type.as_deref()),
    })
}

/// Single-node jobs find their node through an ordered index of free capacity now, keyed by
/// (weight, free GPUs, free CPUs, node): walking it from the job's needs upward, lightest nodes
/// first, yields the tightest fit first (fewest GPUs left, then fewest CPUs), without scanning
/// the whole partition.
#[derive(Debug, Default)]
pub struct FreeIndex {
    entries: std::collections::BTreeSet<(u32, i64, i64, usize)>,
    keys: Vec<Option<(u32, i64, i64)>>,
    /// At least the most free GPUs of any entry (what the walk goes up to).
    max_gpus: i64,
}

impl FreeIndex {
    pub fn new(view: &ClusterView, profiles: &[Timeline], now: u64) -> FreeIndex {
        let mut index = FreeIndex { entries: Default::default(), keys: vec![None; view.nodes.len()], max_gpus: 0 };
        for i in 0..view.nodes.len() {
            if view.nodes[i].schedulable {
                index.update(view, i, profiles, now);
            }
        }
        index
    }

    /// Re-reads node `i`'s free capacity now.
    pub fn update(&mut self, view: &ClusterView, i: usize, profiles: &[Timeline], now: u64) {
        if let Some((w, g, c)) = self.keys[i].take() {
            self.entries.remove(&(w, g, c, i));
        }
        let f = profiles[i].free_at(now);
        let w = view.nodes[i].weight;
        self.entries.insert((w, f.gpus, f.cpus, i));
        self.max_gpus = self.max_gpus.max(f.gpus);
        self.keys[i] = Some((w, f.gpus, f.cpus));
    }

    /// The tightest node of `member` that holds `job` from now for its whole duration, among
    /// the lightest that do.
    #[allow(clippy::too_many_arguments)]
    pub fn fit_single(
        &self,
        job: &PendingJob,
        view: &ClusterView,
        member: &[bool],
        profiles: &[Timeline],
        free_gpus: &[Vec<u32>],
        now: u64,
    ) -> Option<usize> {
        let end = now.saturating_add(job.duration_s());
        let need = job.per_node;
        let max_gpus = self.max_gpus;
        let mut weight = self.entries.first().map(|e| e.0);
        while let Some(w) = weight {
            for g in need.gpus..=max_gpus {
                for &(_, _, _, i) in self.entries.range((w, g, need.cpus, 0)..=(w, g, i64::MAX, usize::MAX)) {
                    let node = &view.nodes[i];
                    if !member[i] || !could_hold(job, node) {
                        continue;
                    }
                    if profiles[i].min_free(now, end).fits(&need)
                        && (free_gpus_of_type(job, node, &free_gpus[i]).count() as i64) >= need.gpus
                    {
                        return Some(i);
                    }
                }
            }
            weight = w
                .checked_add(1)
                .and_then(|next| self.entries.range((next, i64::MIN, i64::MIN, 0)..).next())
                .map(|e| e.0);
        }
        None
    }
}

/// Switches as small integers, computed once per cycle so that grouping nodes by switch
/// compares numbers, not names.
#[derive(Debug, Default)]
pub struct Topology {
    /// Switch id of each node; `u32::MAX` for none.
    pub ids: Vec<u32>,
    pub any: bool,
}

impl Topology {
    pub fn new(view: &ClusterView) -> Topology {
        let mut names: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
        let ids = view
            .nodes
            .iter()
            .map(|n| match n.switch.as_deref() {
                Some(s) => {
                    let next = names.len() as u32;
                    *names.entry(s).or_insert(next)
                }
                None => u32::MAX,
            })
            .collect();
        Topology { ids, any: !names.is_empty() }
    }
}

/// Picks `k` nodes among `fitting` (node index, leftover CPUs): within one switch if any
/// switch has enough, else across the fewest switches; best fit inside.
fn choose(topology: &Topology, mut fitting: Vec<(usize, Rank)>, k: usize) -> Option<Vec<usize>> {
    if fitting.len() < k || k == 0 {
        return None;
    }
    if k == 1 {
        return fitting.iter().min_by_key(|(i, left)| (*left, *i)).map(|(i, _)| vec![*i]);
    }
    // Only the k best matter without a topology; with one, every fitting node may.
    if !topology.any {
        fitting.select_nth_unstable_by_key(k - 1, |(i, left)| (*left, *i));
        fitting.truncate(k);
        fitting.sort_by_key(|(i, left)| (*left, *i));
        return Some(fitting.iter().map(|(i, _)| *i).collect());
    }
    fitting.sort_by_key(|(i, left)| (*left, *i));
    let mut by_switch: std::collections::BTreeMap<u32, Vec<usize>> = std::collections::BTreeMap::new();
    for (i, _) in &fitting {
        by_switch.entry(topology.ids[*i]).or_default().push(*i);
    }
    // The tightest single switch that can hold the whole job.
    if let Some((_, nodes)) = by_switch.iter().filter(|(_, n)| n.len() >= k).min_by_key(|(s, n)| (n.len(), **s)) {
        return Some(nodes[..k].to_vec());
    }
    // Otherwise take from the fullest switches first.
    let mut switches: Vec<&Vec<usize>> = by_switch.values().collect();
    switches.sort_by_key(|n| std::cmp::Reverse(n.len()));
    Some(switches.into_iter().flatten().copied().take(k).collect())
}

/// Nodes on which the job can start now and run its whole duration.
#[allow(clippy::too_many_arguments)]
pub fn fit_now(
    topology: &Topology,
    job: &PendingJob,
    view: &ClusterView,
    candidates: &[usize],
    profiles: &[Timeline],
    free_gpus: &[Vec<u32>],
    now: u64,
    partition_exclusive: bool,
) -> Option<Vec<usize>> {
    let end = now.saturating_add(job.duration_s());
    let fitting: Vec<(usize, Rank)> = candidates
        .iter()
        .copied()
        .filter_map(|i| {
            // Cheap numbers first: most nodes of a busy cluster fail here.
            if !profiles[i].free_at(now).fits(&job.per_node) {
                return None;
            }
            let node = &view.nodes[i];
            if !could_hold(job, node) {
                return None;
            }
            let req = need(job, node, partition_exclusive);
            if !profiles[i].free_at(now).fits(&req) {
                return None;
            }
            let free = profiles[i].min_free(now, end);
            if !free.fits(&req) || (free_gpus_of_type(job, node, &free_gpus[i]).count() as i64) < job.per_node.gpus {
                return None;
            }
            Some((i, (node.weight, 0, free.cpus - req.cpus)))
        })
        .collect();
    choose_for(topology, job, view, fitting, job.nodes as usize)
}

/// The earliest time within `[now, horizon]` at which all of `nodes` hold the job together.
#[allow(clippy::too_many_arguments)]
pub fn earliest_on(
    job: &PendingJob,
    view: &ClusterView,
    nodes: &[usize],
    profiles: &[Timeline],
    now: u64,
    horizon: u64,
    resolution: u64,
    partition_exclusive: bool,
) -> Option<u64> {
    if nodes.len() != job.nodes as usize || !nodes.iter().all(|&i| could_hold(job, &view.nodes[i])) {
        return None;
    }
    if !job.only.iter().all(|n| nodes.iter().any(|&i| view.nodes[i].name == *n)) {
        return None;
    }
    let features = nodes.iter().map(|&i| view.nodes[i].features.as_slice());
    if job.features_same && !quorum_model::share_a_feature(&job.features, features) {
        return None;
    }
    if !counts_met(job, view, nodes) {
        return None;
    }
    let dur = job.duration_s();
    let mut times: Vec<u64> = std::iter::once(now)
        .chain(nodes.iter().flat_map(|&i| profiles[i].change_times()))
        .map(|t| round_up(t, resolution))
        .filter(|t| *t >= now && *t <= horizon)
        .collect();
    times.sort_unstable();
    times.dedup();
    times.into_iter().find(|&t| {
        nodes.iter().all(|&i| {
            let req = need(job, &view.nodes[i], partition_exclusive);
            profiles[i].min_free(t, t.saturating_add(dur)).fits(&req)
        })
    })
}

/// Like [`earliest`], but keeps `previous` nodes when they can start the job no later.
#[allow(clippy::too_many_arguments)]
pub fn earliest_sticky(
    topology: &Topology,
    job: &PendingJob,
    view: &ClusterView,
    candidates: &[usize],
    profiles: &[Timeline],
    now: u64,
    horizon: u64,
    resolution: u64,
    partition_exclusive: bool,
    previous: Option<&[usize]>,
) -> Option<(u64, Vec<usize>)> {
    let best = earliest(topology, job, view, candidates, profiles, now, horizon, resolution, partition_exclusive);
    let kept = previous.and_then(|nodes| {
        earliest_on(job, view, nodes, profiles, now, horizon, resolution, partition_exclusive)
            .map(|t| (t, nodes.to_vec()))
    });
    match (best, kept) {
        (Some(b), Some(k)) if k.0 <= b.0 => Some(k),
        (b, k) => b.or(k),
    }
}

/// The earliest time within `[now, horizon]` at which enough nodes hold the job together for its
/// whole duration, and those nodes.
#[allow(clippy::too_many_arguments)]
pub fn earliest(
    topology: &Topology,
    job: &PendingJob,
    view: &ClusterView,
    candidates: &[usize],
    profiles: &[Timeline],
    now: u64,
    horizon: u64,
    resolution: u64,
    partition_exclusive: bool,
) -> Option<(u64, Vec<usize>)> {
    let dur = job.duration_s();
    let k = job.nodes as usize;
    // Each node's own earliest fit bounds when the job can start.
    let mut firsts: Vec<(u64, usize)> = candidates
        .iter()
        .copied()
        .filter(|&i| could_hold(job, &view.nodes[i]))
        .filter_map(|i| {
            let req = need(job, &view.nodes[i], partition_exclusive);
            profiles[i].earliest_fit(&req, dur, now, horizon, resolution).map(|t| (t, i))
        })
        .collect();
    if firsts.len() < k {
        return None;
    }
    firsts.sort_unstable();
    if k == 1 {
        // One node: the earliest first fit is the answer; among ties, the best ranked.
        let t = firsts[0].0;
        return firsts
            .iter()
            .take_while(|(first, _)| *first == t)
            .filter_map(|&(_, i)| fits_from(job, view, profiles, i, (now, t, dur), partition_exclusive))
            .min_by_key(|&(i, rank)| (rank, i))
            .map(|(i, _)| (t, vec![i]));
    }
    // No k nodes fit before the k-th earliest first fit. From there, try every time at which
    // any node's availability changes: a node that fits from its own earliest time may be
    // blocked again later by a reservation and free again after it.
    let lower = firsts[k - 1].0;
    let mut times: Vec<u64> = firsts
        .iter()
        .flat_map(|&(first, i)| {
            std::iter::once(first).chain(profiles[i].change_times().map(|t| round_up(t, resolution)))
        })
        .filter(|t| *t >= lower && *t <= horizon)
        .collect();
    times.sort_unstable();
    times.dedup();
    for t in times {
        let fitting: Vec<(usize, Rank)> = firsts
            .iter()
            .take_while(|(first, _)| *first <= t)
            .filter_map(|&(_, i)| fits_from(job, view, profiles, i, (now, t, dur), partition_exclusive))
            .collect();
        if let Some(nodes) = choose_for(topology, job, view, fitting, k) {
            return Some((t, nodes));
        }
    }
    None
}

/// Node `i` and its [`Rank`], when it holds `job`'s share from `t` (`now` or later) for `dur`.
fn fits_from(
    job: &PendingJob,
    view: &ClusterView,
    profiles: &[Timeline],
    i: usize,
    (now, t, dur): (u64, u64, u64),
    partition_exclusive: bool,
) -> Option<(usize, Rank)> {
    let req = need(job, &view.nodes[i], partition_exclusive);
    let free = profiles[i].min_free(t, t.saturating_add(dur));
    free.fits(&req).then(|| (i, rank(view.nodes[i].weight, &profiles[i], &req, &free, t, now)))
}

/// Where each component of a heterogeneous job starts now, on nodes no two components share:
/// component k among `places[k].0` (its partition's candidates), booked as its partition says
/// (`places[k].1`: whole nodes). `None` when any component finds none.
pub fn fit_het(
    topology: &Topology,
    job: &PendingJob,
    view: &ClusterView,
    places: &[(&[usize], bool)],
    (profiles, free_gpus): (&[Timeline], &[Vec<u32>]),
    now: u64,
) -> Option<Vec<Vec<usize>>> {
    let mut used: Vec<usize> = Vec::new();
    let mut out = Vec::new();
    // Each component carries the job's time limit (a component's spec is the job's).
    for (c, &(candidates, exclusive)) in job.components().zip(places) {
        let left: Vec<usize> = candidates.iter().copied().filter(|i| !used.contains(i)).collect();
        let nodes = fit_now(topology, c, view, &left, profiles, free_gpus, now, exclusive)?;
        used.extend(&nodes);
        out.push(nodes);
    }
    Some(out)
}

/// How many start times [`earliest_het`] tries past the earliest at which each component alone
/// could start: a heterogeneous job that finds none among them gets no reservation this cycle.
pub const HET_TRIES: usize = 64;

/// The earliest time within `[now, horizon]` (on a grid of `resolution`) at which every
/// component of a heterogeneous job holds its share together for the job's whole duration, on
/// nodes no two components share, each among its own `places` (as in [`fit_het`]), and those
/// nodes per component. Times tried: from the latest of the components' own earliest starts,
/// each time a candidate node's availability changes.
pub fn earliest_het(
    topology: &Topology,
    job: &PendingJob,
    view: &ClusterView,
    places: &[(&[usize], bool)],
    profiles: &[Timeline],
    (now, horizon, resolution): (u64, u64, u64),
) -> Option<(u64, Vec<Vec<usize>>)> {
    let dur = job.duration_s();
    let mut lower = now;
    for (c, &(candidates, exclusive)) in job.components().zip(places) {
        let (t, _) = earliest(topology, c, view, candidates, profiles, now, horizon, resolution, exclusive)?;
        lower = lower.max(t);
    }
    let mut times: Vec<u64> = std::iter::once(lower)
        .chain(places.iter().flat_map(|(candidates, _)| candidates.iter().flat_map(|&i| profiles[i].change_times())))
        .map(|t| round_up(t, resolution))
        .filter(|t| *t >= lower && *t <= horizon)
        .collect();
    times.sort_unstable();
    times.dedup();
    times.into_iter().take(HET_TRIES).find_map(|t| {
        let mut used: Vec<usize> = Vec::new();
        let mut out = Vec::new();
        for (c, &(candidates, exclusive)) in job.components().zip(places) {
            let fitting: Vec<(usize, Rank)> = candidates
                .iter()
                .copied()
                .filter(|i| !used.contains(i))
                .filter(|&i| could_hold(c, &view.nodes[i]))
                .filter_map(|i| fits_from(c, view, profiles, i, (now, t, dur), exclusive))
                .collect();
            let nodes = choose_for(topology, c, view, fitting, c.nodes as usize)?;
            used.extend(&nodes);
            out.push(nodes);
        }
        Some((t, out))
    })
}

/// Takes GPU indices for a start now: the lowest free ones of the requested type.
pub fn take_gpus(job: &PendingJob, node: &NodeView, free: &mut Vec<u32>, count: i64) -> Vec<u32> {
    let chosen: Vec<u32> = free_gpus_of_type(job, node, free).take(count.max(0) as usize).collect();
    free.retain(|i| !chosen.contains(i));
    chosen
}
