//! Preemption within [`crate::place`]: a candidate that cannot start now may stop running jobs
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

    /// What becomes of `r` when preempted, and its grace time.
    fn mode_of(&self, r: &RunningJob) -> (PreemptMode, u64) {
        let partition = self.view.partitions.get(&r.partition);
        let part_mode = partition.and_then(|p| p.preempt_mode);
        let part_grace = partition.map_or(0, |p| p.grace_s);
        match self.kind {
            PreemptType::Off => (PreemptMode::Off, 0),
            PreemptType::PartitionPrio => (part_mode.unwrap_or(self.default_mode), part_grace),
            PreemptType::Qos => {
                let qos = self.view.qos.get(&r.qos);
                let mode = qos.and_then(|q| q.preempt_mode).or(part_mode).unwrap_or(self.default_mode);
                let grace = qos.map(|q| q.grace_time_s).filter(|g| *g > 0).unwrap_or(part_grace);
                (mode, grace)
            }
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
    /// victims' holds end then in `capacity` (the caller reserves the preemptor's).
    pub(crate) fn search(
        &mut self,
        job: &PendingJob,
        partition: &PartitionView,
        topology: &placement::Topology,
        capacity: &mut crate::Capacity,
        exclusive: bool,
    ) -> Option<Found> {
        let now = capacity.now;
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
        if placement::earliest(topology, job, view, &partition.nodes, &capacity.profiles, now, start, 1, exclusive)
            .is_some()
        {
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
            let mut timeline = capacity.profiles[i].clone();
            if timeline.min_free(start, start.saturating_add(dur)).fits(&req) {
                options.push((i, Vec::new()));
                continue;
            }
            let mut here: Vec<usize> = self.on_node[i].iter().copied().filter(|&r| eligible(r)).collect();
            here.sort_by_key(|&r| self.value(&view.running[r]));
            let mut chosen = Vec::new();
            for r in here {
                give(&mut timeline, &view.running[r], i, start);
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
            for (i, _) in &view.running[r].alloc {
                give(&mut capacity.profiles[*i], &view.running[r], *i, start);
                capacity.refresh(*i);
            }
        }
        nodes.sort_unstable();
        match placement::earliest_on(job, view, &nodes, &capacity.profiles, start, start, 1, exclusive) {
            Some(t) if t == start => {}
            _ => {
                for &r in &victims {
                    for (i, _) in &view.running[r].alloc {
                        take_back(&mut capacity.profiles[*i], &view.running[r], *i, start);
                        capacity.refresh(*i);
                    }
                }
                return None;
            }
        }
        self.taken.extend(victims.iter().copied());
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
        Some(Found { planned, nodes, start_s: start })
    }
}

/// What `r` holds on node `i`, free from `from` until its planned end (where the profile
/// already frees it).
fn give(timeline: &mut Timeline, r: &RunningJob, i: usize, from: u64) {
    if let Some((_, res)) = r.alloc.iter().find(|(n, _)| *n == i) {
        timeline.take(from, r.end_s, &Res::default().minus(res));
    }
}

fn take_back(timeline: &mut Timeline, r: &RunningJob, i: usize, from: u64) {
    if let Some((_, res)) = r.alloc.iter().find(|(n, _)| *n == i) {
        timeline.take(from, r.end_s, res);
    }
}

#[cfg(test)]
mod tests {
    use quorum_model::preempt::{PreemptMode, PreemptType};
    use quorum_model::{JobState, PendingReason, Policy, QueueOrder, RankOutcome};
    use quorum_state::testing::partition;
    use quorum_state::{Command, Response};

    use crate::tests::{node, Bench};
    use crate::Plan;

    /// Four nodes of 4 CPUs; partition `scav` (tier 0, requeued after a 30 s grace) and `prod`
    /// (tier 1) over all of them; FIFO, so that submit order is priority order.
    fn site(kind: PreemptType) -> Bench {
        let nodes = (1..=4).map(|i| node(&format!("n{i}"), 4, 0, "", &[])).collect();
        let policy = Policy { ordering: QueueOrder::Fifo, preempt_type: kind, ..Policy::default() };
        let mut b = Bench::new(nodes, policy);
        let mut scav = partition("scav", "n[1-4]", true);
        scav.preempt_mode = Some(PreemptMode::Requeue);
        scav.grace_time_s = 30;
        scav.max_time_s = None;
        let mut prod = partition("prod", "n[1-4]", false);
        prod.priority_tier = 1;
        prod.max_time_s = None;
        b.cmd(Command::SetPartitions { partitions: vec![scav, prod], now: 0 });
        b
    }

    fn job(b: &mut Bench, partition: &str, cpus: u32) -> u64 {
        b.submit_with("alice", |s| {
            s.partition = Some(partition.into());
            s.cpus_per_task = cpus;
            s.time_limit_s = Some(1000);
        })
    }

    fn node_of(b: &Bench, job: u64) -> String {
        b.state.jobs[&job].allocation.as_ref().unwrap().nodes[0].node.clone()
    }

    fn victims(plan: &Plan) -> Vec<(u64, Vec<u64>, Vec<String>)> {
        plan.preemptions
            .iter()
            .map(|p| (p.job_id, p.victims.iter().map(|v| v.job_id).collect(), p.nodes.clone()))
            .collect()
    }

    /// Ends `job` where its agent reports it killed (its grace over).
    fn killed(b: &mut Bench, job: u64) -> Response {
        let j = &b.state.jobs[&job];
        let (token, node) = (j.alloc_index, j.allocation.as_ref().unwrap().nodes[0].node.clone());
        let now = b.now_ms;
        b.cmd(Command::JobEnded {
            job_id: job,
            token,
            node,
            outcome: RankOutcome::Cancelled { code: 0, signal: 15 },
            now,
        })
    }

    #[test]
    fn a_higher_tier_job_preempts_exactly_the_latest_started_job_and_starts_on_its_node() {
        let mut b = site(PreemptType::PartitionPrio);
        let mut scav = Vec::new();
        for t in 0..4 {
            b.at(t * 10);
            scav.push(job(&mut b, "scav", 4));
            assert_eq!(b.cycle().starts.len(), 1);
        }
        // A waiting scavenger job, older than the production one.
        let waiting = job(&mut b, "scav", 4);
        b.at(40);
        let prod = job(&mut b, "prod", 4);
        let plan = b.cycle();
        let latest = node_of(&b, scav[3]);
        assert_eq!(victims(&plan), vec![(prod, vec![scav[3]], vec![latest.clone()])], "one victim, the latest");
        assert!(plan.starts.is_empty());
        assert_eq!(plan.estimates[&prod].start_ms, b.now_ms + (30 + 5) * 1000, "after the grace");
        let marked = b.state.jobs[&scav[3]].preempting.clone().expect("marked");
        assert_eq!((marked.by, marked.mode, marked.grace_s), (prod, PreemptMode::Requeue, 30));
        assert_eq!(b.state.jobs[&prod].claim.as_ref().unwrap().nodes, vec![latest.clone()]);
        // Next cycles preempt nothing more for it.
        b.at(41);
        assert!(b.cycle().preemptions.is_empty());
        // Its end requeues it; the production job starts on exactly that node, though the
        // scavenger job that waits was first in line.
        b.at(50);
        assert_eq!(killed(&mut b, scav[3]), Response::Requeued { job_id: scav[3] });
        let requeued = &b.state.jobs[&scav[3]];
        assert_eq!((requeued.state, requeued.requeues, requeued.preempted_by), (JobState::Pending, 1, Some(prod)));
        let plan = b.cycle();
        assert_eq!(plan.starts.iter().map(|s| s.job_id).collect::<Vec<_>>(), vec![prod]);
        assert_eq!(node_of(&b, prod), latest);
        assert!(b.state.jobs[&prod].claim.is_none());
        for queued in [waiting, scav[3]] {
            assert!(matches!(plan.reason(queued), Some(PendingReason::Resources | PendingReason::Priority)));
        }
        // Same-tier jobs never preempt each other.
        assert!(plan.preemptions.is_empty(), "{:?}", plan.preemptions);
    }

    #[test]
    fn the_fewest_victims_are_chosen_over_the_most_recent() {
        let mut b = site(PreemptType::PartitionPrio);
        // n1: one 4-CPU job, the oldest; the others: four 1-CPU jobs each, all more recent.
        b.at(0);
        let big = job(&mut b, "scav", 4);
        b.cycle();
        b.at(10);
        let small: Vec<u64> = (0..12).map(|_| job(&mut b, "scav", 1)).collect();
        b.cycle();
        assert!(small.iter().all(|j| b.state.jobs[j].state == JobState::Running));
        b.at(20);
        let prod = job(&mut b, "prod", 4);
        let plan = b.cycle();
        assert_eq!(victims(&plan), vec![(prod, vec![big], vec![node_of(&b, big)])]);
    }

    #[test]
    fn nothing_is_preempted_where_it_would_not_let_the_job_start() {
        let mut b = site(PreemptType::PartitionPrio);
        b.at(0);
        // Three nodes run production jobs (same tier: not preemptable), one a scavenger job.
        let prods: Vec<u64> = (0..3).map(|_| job(&mut b, "prod", 4)).collect();
        let scav = job(&mut b, "scav", 4);
        b.cycle();
        b.at(10);
        // Two nodes are needed; only one could be made free.
        let wide = b.submit_with("alice", |s| {
            s.partition = Some("prod".into());
            (s.nodes, s.ntasks, s.cpus_per_task, s.time_limit_s) = (2, 2, 4, Some(1000));
        });
        let plan = b.cycle();
        assert!(plan.preemptions.is_empty(), "{:?}", plan.preemptions);
        assert!(b.state.jobs[&scav].preempting.is_none() && prods.iter().all(|p| b.state.jobs[p].preempting.is_none()));
        assert_eq!(plan.reason(wide), Some(PendingReason::Resources));
        // Nor when preemption is off.
        let mut b = site(PreemptType::Off);
        b.at(0);
        (0..4).for_each(|_| {
            job(&mut b, "scav", 4);
        });
        b.cycle();
        job(&mut b, "prod", 4);
        assert!(b.cycle().preemptions.is_empty());
    }

    #[test]
    fn a_qos_preempts_the_qos_it_names_and_cancel_ends_the_victim_preempted() {
        use quorum_model::Qos;
        let mut b = site(PreemptType::Qos);
        let low = Qos { name: "low".into(), preempt_mode: Some(PreemptMode::Cancel), ..Default::default() };
        let high = Qos { name: "high".into(), priority: 10, preempt: vec!["low".into()], ..Default::default() };
        let normal = Qos { name: "normal".into(), ..Default::default() };
        b.cmd(Command::SeedAccounts { accounts: vec![], qos: vec![low, high, normal], now: 0 });
        b.at(0);
        let with = |b: &mut Bench, qos: &str| {
            b.submit_with("alice", |s| {
                (s.partition, s.qos, s.cpus_per_task) = (Some("scav".into()), Some(qos.into()), 4);
            })
        };
        let normals: Vec<u64> = (0..3).map(|_| with(&mut b, "normal")).collect();
        let lows = with(&mut b, "low");
        b.cycle();
        b.at(5);
        let urgent = with(&mut b, "high");
        let plan = b.cycle();
        assert_eq!(
            victims(&plan).iter().map(|(j, v, _)| (*j, v.clone())).collect::<Vec<_>>(),
            vec![(urgent, vec![lows])]
        );
        assert!(normals.iter().all(|j| b.state.jobs[j].preempting.is_none()));
        // The grace is the partition's when the QOS gives none; the victim ends PREEMPTED.
        assert_eq!(
            b.state.jobs[&lows].preempting.as_ref().map(|p| (p.mode, p.grace_s)),
            Some((PreemptMode::Cancel, 30))
        );
        b.at(8);
        assert_eq!(killed(&mut b, lows), Response::JobFinished { job_id: lows, state: JobState::Preempted });
        assert_eq!(b.state.jobs[&lows].preempted_by, Some(urgent));
        assert_eq!(b.cycle().starts.iter().map(|s| s.job_id).collect::<Vec<_>>(), vec![urgent]);
    }
}
