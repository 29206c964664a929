//! Preemption within the placement stage (`place`): a candidate that cannot start now may stop running jobs
//! it is allowed to preempt ([`quorum_model::preempt::PreemptType`]) when that lets it start at
//! once, after their grace time. Per node, the fewest victims that make room, the least valuable
//! first (lowest partition tier or QOS priority, then the most recently started); the nodes that
//! need the fewest. What the victims free is reserved for the preemptor from the end of their
//! grace, so that backfill does not take it; once applied, the preemptor's claim on those nodes
//! is placed before every other job in the next cycles ([`Claimed`]).

use std::collections::BTreeSet;

use quorum_model::preempt::{PlannedPreemption, PreemptMode, PreemptType, Victim};
use quorum_model::Policy;

use crate::placement;
use crate::profile::Timeline;
use crate::view::{ClusterView, PartitionView, PendingJob, Res, RunningJob, PREEMPT_SLACK_S};

/// The most preemption searches one cycle makes: each scans its partition's nodes; a queue of
/// blocked jobs that may preempt goes on next cycle.
pub const MAX_SEARCHES_PER_CYCLE: usize = 16;

/// The running jobs one cycle may preempt, and what it has taken of them.
pub struct Preemptor<'v> {
    view: &'v ClusterView,
    kind: PreemptType,
    default_mode: PreemptMode,
    /// Running jobs (indices into `view.running`) that some pending job could preempt, each with
    /// its value (lower is preempted first).
    preemptable: Vec<usize>,
    /// Per node, the preemptable running jobs on it.
    on_node: Vec<Vec<usize>>,
    taken: BTreeSet<usize>,
    searches_left: usize,
}

/// What one job's preemption decided: the plan's record, and when the preemptor can start.
pub struct Found {
    pub planned: PlannedPreemption,
    pub nodes: Vec<usize>,
    pub start_s: u64,
    /// The nodes whose profiles changed (the victims'): the caller's indexes of them are stale.
    pub touched: Vec<usize>,
}

impl<'v> Preemptor<'v> {
    /// `None` when preemption is off or nothing running could be preempted.
    pub fn new(view: &'v ClusterView, policy: &Policy) -> Option<Preemptor<'v>> {
        if policy.preempt_type == PreemptType::Off {
            return None;
        }
        let mut p = Preemptor {
            view,
            kind: policy.preempt_type,
            default_mode: policy.preempt_mode,
            preemptable: Vec::new(),
            on_node: Vec::new(),
            taken: BTreeSet::new(),
            searches_left: MAX_SEARCHES_PER_CYCLE,
        };
        p.preemptable = (0..view.running.len())
            .filter(|&r| !view.running[r].preempting && !view.running[r].suspended)
            .filter(|&r| p.mode_of(&view.running[r]).0 != PreemptMode::Off)
            .collect();
        if p.preemptable.is_empty() {
            return None;
        }
        p.on_node = vec![Vec::new(); view.nodes.len()];
        for &r in &p.preemptable {
            for (i, _) in &view.running[r].alloc {
                p.on_node[*i].push(r);
            }
        }
        Some(p)
    }

    /// What becomes of `r` when preempted, and its grace time (none when it is suspended).
    fn mode_of(&self, r: &RunningJob) -> (PreemptMode, u64) {
        let partition = self.view.partitions.get(&r.partition);
        let part_mode = partition.and_then(|p| p.preempt_mode);
        let part_grace = partition.map_or(0, |p| p.grace_s);
        let (mode, grace) = match self.kind {
            PreemptType::Off => (PreemptMode::Off, 0),
            PreemptType::PartitionPrio => (part_mode.unwrap_or(self.default_mode), part_grace),
            PreemptType::Qos => {
                let qos = self.view.qos.get(&r.qos);
                let mode = qos.and_then(|q| q.preempt_mode).or(part_mode).unwrap_or(self.default_mode);
                let grace = qos.map(|q| q.grace_time_s).filter(|g| *g > 0).unwrap_or(part_grace);
                (mode, grace)
            }
        };
        (mode, if mode.stops() { grace } else { 0 })
    }

    /// Preempts nothing on `nodes` (sorted): their profiles have advance reservations taken out,
    /// which giving a victim's hold back could undo.
    pub fn spare(&mut self, nodes: &[usize]) {
        for &i in nodes {
            self.on_node[i].clear();
        }
    }

    /// Whether `job` of `partition` may preempt `r`.
    fn may_preempt(&self, job: &PendingJob, partition: &PartitionView, r: &RunningJob) -> bool {
        if r.id == job.id || r.preempting {
            return false;
        }
        match self.kind {
            PreemptType::Off => false,
            PreemptType::PartitionPrio => {
                self.view.partitions.get(&r.partition).is_some_and(|theirs| theirs.tier < partition.tier)
            }
            PreemptType::Qos => self.view.qos.get(&*job.qos).is_some_and(|q| q.preempt.contains(&r.qos)),
        }
    }

    /// Whether `r` (an index into the running jobs) is `job`'s to preempt and not yet taken.
    fn eligible(&self, job: &PendingJob, partition: &PartitionView, r: usize) -> bool {
        !self.taken.contains(&r) && self.may_preempt(job, partition, &self.view.running[r])
    }

    /// Lower is preempted first: the lowest tier (or QOS priority), then the latest started.
    fn value(&self, r: &RunningJob) -> (u64, std::cmp::Reverse<u64>, std::cmp::Reverse<u64>) {
        let rank = match self.kind {
            PreemptType::Qos => self.view.qos.get(&r.qos).map_or(0, |q| u64::from(q.priority)),
            _ => self.view.partitions.get(&r.partition).map_or(0, |p| u64::from(p.tier)),
        };
        (rank, std::cmp::Reverse(r.start_s), std::cmp::Reverse(r.id))
    }

    /// The preemption that lets `job` start at once after its victims' grace, if one does: the
    /// victims' holds end then in `profiles` (the caller reserves the preemptor's). Profiles
    /// are left as they were when there is none.
    pub fn search(
        &mut self,
        job: &PendingJob,
        partition: &PartitionView,
        topology: &placement::Topology,
        profiles: &mut [Timeline],
        now: u64,
        exclusive: bool,
    ) -> Option<Found> {
        if self.searches_left == 0 {
            return None;
        }
        let view = self.view;
        // Nothing it may preempt on its partition's nodes: no search (and none spent).
        if !partition.nodes.iter().any(|&i| self.on_node[i].iter().any(|&r| self.eligible(job, partition, r))) {
            return None;
        }
        self.searches_left -= 1;
        let eligible = |r: usize| self.eligible(job, partition, r);
        let grace = partition
            .nodes
            .iter()
            .flat_map(|&i| self.on_node[i].iter().copied())
            .filter(|&r| eligible(r))
            .map(|r| self.mode_of(&view.running[r]).1)
            .max()
            .unwrap_or(0);
        let start = now.saturating_add(grace).saturating_add(PREEMPT_SLACK_S);
        let dur = job.duration_s();
        // Starting by then without preempting: nothing to stop.
        if placement::earliest(topology, job, view, &partition.nodes, profiles, now, start, 1, exclusive).is_some() {
            return None;
        }
        // Per node: the fewest victims, least valuable first, after which it holds the job.
        let mut options: Vec<(usize, Vec<usize>)> = Vec::new();
        for &i in &partition.nodes {
            let node = &view.nodes[i];
            if !node.schedulable || !placement::could_hold(job, node) {
                continue;
            }
            let req = placement::need(job, node, exclusive);
            let mut timeline = profiles[i].clone();
            if timeline.min_free(start, start.saturating_add(dur)).fits(&req) {
                options.push((i, Vec::new()));
                continue;
            }
            let mut here: Vec<usize> = self.on_node[i].iter().copied().filter(|&r| eligible(r)).collect();
            here.sort_by_key(|&r| self.value(&view.running[r]));
            let mut chosen = Vec::new();
            for r in here {
                give(&mut timeline, &view.running[r], i, start, self.mode_of(&view.running[r]).0);
                chosen.push(r);
                if timeline.min_free(start, start.saturating_add(dur)).fits(&req) {
                    options.push((i, chosen));
                    break;
                }
            }
        }
        if options.len() < job.nodes as usize {
            return None;
        }
        // The nodes needing the fewest victims, then the least valuable ones.
        options.sort_by_key(|(i, victims)| {
            (victims.len(), victims.iter().map(|&r| self.value(&view.running[r])).max(), *i)
        });
        let mut victims: Vec<usize> = Vec::new();
        let mut nodes: Vec<usize> = Vec::new();
        for (i, v) in options.iter().take(job.nodes as usize) {
            nodes.push(*i);
            for &r in v {
                if !victims.contains(&r) {
                    victims.push(r);
                }
            }
        }
        if victims.is_empty() {
            return None;
        }
        // What the victims hold, freed from the end of their grace; then the job must fit there
        // as placement sees it (features, switches, GPU types), or nothing is taken.
        for &r in &victims {
            let mode = self.mode_of(&view.running[r]).0;
            for (i, _) in &view.running[r].alloc {
                give(&mut profiles[*i], &view.running[r], *i, start, mode);
            }
        }
        nodes.sort_unstable();
        match placement::earliest_on(job, view, &nodes, profiles, start, start, 1, exclusive) {
            Some(t) if t == start => {}
            _ => {
                for &r in &victims {
                    let mode = self.mode_of(&view.running[r]).0;
                    for (i, _) in &view.running[r].alloc {
                        take_back(&mut profiles[*i], &view.running[r], *i, start, mode);
                    }
                }
                return None;
            }
        }
        self.taken.extend(victims.iter().copied());
        let mut touched: Vec<usize> =
            victims.iter().flat_map(|&r| view.running[r].alloc.iter().map(|(i, _)| *i)).collect();
        touched.sort_unstable();
        touched.dedup();
        victims.sort_unstable_by_key(|&r| view.running[r].id);
        let planned = PlannedPreemption {
            job_id: job.id,
            nodes: nodes.iter().map(|&i| view.nodes[i].name.clone()).collect(),
            victims: victims
                .iter()
                .map(|&r| {
                    let (mode, grace_s) = self.mode_of(&view.running[r]);
                    Victim { job_id: view.running[r].id, mode, grace_s }
                })
                .collect(),
        };
        Some(Found { planned, nodes, start_s: start, touched })
    }
}

/// What `r` gives up on node `i` when preempted `mode`: all it holds, or only its CPUs when it
/// is suspended (its memory and GPUs stay taken).
fn given(r: &RunningJob, i: usize, mode: PreemptMode) -> Option<Res> {
    let (_, res) = r.alloc.iter().find(|(n, _)| *n == i)?;
    Some(if mode.stops() { *res } else { Res { cpus: res.cpus, mem: 0, gpus: 0 } })
}

/// What `r` gives up on node `i`, free from `from` until its planned end (where the profile
/// already frees it).
fn give(timeline: &mut Timeline, r: &RunningJob, i: usize, from: u64, mode: PreemptMode) {
    if let Some(res) = given(r, i, mode) {
        timeline.take(from, r.end_s, &Res::default().minus(&res));
    }
}

fn take_back(timeline: &mut Timeline, r: &RunningJob, i: usize, from: u64, mode: PreemptMode) {
    if let Some(res) = given(r, i, mode) {
        timeline.take(from, r.end_s, &res);
    }
}
