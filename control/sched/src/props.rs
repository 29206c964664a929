//! Property tests over random clusters and queues, through the real scheduler and state
//! machine: nothing is ever overcommitted, backfilled jobs never push a reservation later, the
//! plan is stable when nothing changed, and on an idle cluster the first job that fits starts.

use proptest::prelude::*;

use super::tests::{node, Bench};
use super::*;
use quorum_model::preempt::{PreemptMode, PreemptType};
use quorum_model::{JobState, RankOutcome};

#[derive(Clone, Debug)]
struct JobShape {
    nodes: u32,
    cpus: u32,
    gpus: u32,
    limit: u64,
    exclusive: bool,
}

fn job_shape() -> impl Strategy<Value = JobShape> {
    (1u32..=2, 1u32..=8, 0u32..=2, 10u64..=500, proptest::bool::weighted(0.1))
        .prop_map(|(nodes, cpus, gpus, limit, exclusive)| JobShape { nodes, cpus, gpus, limit, exclusive })
}

fn cluster_shape() -> impl Strategy<Value = Vec<(u32, u32)>> {
    proptest::collection::vec((1u32..=8, 0u32..=4), 1..=6)
}

impl JobShape {
    /// Writes this shape into `spec`: one task per node.
    fn fill(&self, spec: &mut quorum_model::JobSpec) {
        spec.nodes = self.nodes;
        spec.ntasks = self.nodes;
        spec.cpus_per_task = self.cpus;
        spec.gpus_per_node = self.gpus;
        spec.time_limit_s = Some(self.limit);
        spec.exclusive = self.exclusive;
    }
}

fn submit(b: &mut Bench, j: &JobShape) -> u64 {
    b.submit_with("alice", |s| j.fill(s))
}

/// Submits what the cluster could ever hold (the rest would be refused at submit).
fn submit_all(b: &mut Bench, jobs: &[JobShape], caps: &[(u32, u32)]) -> Vec<u64> {
    jobs.iter()
        .filter(|j| caps.iter().filter(|(c, g)| *c >= j.cpus && *g >= j.gpus).count() >= j.nodes as usize)
        .map(|j| submit(b, j))
        .collect()
}

/// No node holds more than it has. CPUs shared N ways (`OverSubscribe`) count 1/N each: the
/// sum of each job's CPUs divided by its N stays within the node's CPUs.
fn assert_no_overcommit(b: &Bench) {
    for n in b.state.nodes.values() {
        assert!(n.alloc_cpus <= n.cpus, "{} has {} of {} CPUs allocated", n.name, n.alloc_cpus, n.cpus);
        assert!(
            n.cpus_fit(0, 1),
            "{} has {} of {} CPUs allocated, shared ways {:?}",
            n.name,
            n.alloc_cpus,
            n.cpus,
            n.shared_cpus
        );
        assert!(n.alloc_mem_mb <= n.mem_mb, "{} memory overcommitted", n.name);
        assert!(n.alloc_gpus.len() <= n.gpus.len(), "{} GPUs overcommitted", n.name);
    }
}

fn bench(caps: &[(u32, u32)], backfill: BackfillMode) -> Bench {
    let nodes = caps.iter().enumerate().map(|(i, (c, g))| node(&format!("n{i}"), *c, *g, "h100", &[])).collect();
    Bench::new(nodes, Policy { ordering: QueueOrder::Fifo, backfill, reservations: 5, ..Policy::default() })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64), ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold(
        caps in cluster_shape(),
        first in proptest::collection::vec(job_shape(), 0..12),
        second in proptest::collection::vec(job_shape(), 1..16),
        advance in 0u64..300,
        conservative in proptest::bool::ANY,
        predicted in proptest::option::of((1u64..300, 1u64..300)),
        shortest_first in proptest::bool::ANY,
    ) {
        let mode = if conservative { BackfillMode::Conservative } else { BackfillMode::Easy };
        let mut b = bench(&caps, mode);
        if shortest_first {
            let policy = Policy { backfill_order: quorum_model::BackfillOrder::Shortest, ..b.state.policy.clone() };
            b.cmd(quorum_state::Command::SetPolicy { policy, now: 0 });
        }
        if let Some((last_s, before_s)) = predicted {
            // Backfill on predictions: alice's jobs planned for the mean of two past runs.
            let policy = Policy { predict: true, ..b.state.policy.clone() };
            b.cmd(quorum_state::Command::SetPolicy { policy, now: 0 });
            let runs = quorum_model::predict::RecentRuns { last_s, before_s: Some(before_s) };
            b.state.recent_runs.insert("alice".into(), runs);
        }
        b.at(0);
        submit_all(&mut b, &first, &caps);
        b.cycle();
        assert_no_overcommit(&b);
        // Time passes; jobs that reached their limit end.
        b.at(advance);
        let due: Vec<u64> = b.state.jobs.values()
            .filter(|j| j.state == JobState::Running && j.start_time.unwrap() + j.spec.time_limit_s.unwrap() * 1000 <= b.now_ms)
            .map(|j| j.id)
            .collect();
        for id in due {
            b.end(id);
        }
        submit_all(&mut b, &second, &caps);
        let plan = b.cycle(); // asserts: same input, same plan; apply accepts every start
        assert_no_overcommit(&b);
        // Nothing changed: a new cycle starts nothing and moves no reservation later.
        let again = b.cycle();
        prop_assert!(again.starts.is_empty(), "a second cycle started {:?}", again.starts);
        for (job, e) in &plan.estimates {
            if let Some(e2) = again.estimates.get(job) {
                prop_assert!(e2.start_ms <= e.start_ms, "job {}'s reservation moved from {} to {}", job, e.start_ms, e2.start_ms);
            }
        }
        if mode == BackfillMode::Easy {
            let first_blocked = plan.estimates.keys().next();
            if let Some(j) = first_blocked {
                prop_assert!(again.estimates.contains_key(j), "EASY keeps the first blocked job's reservation");
            }
        }
    }

    /// With preemption (the scavenger partition's jobs requeued, cancelled or suspended): nothing
    /// is overcommitted and each node's books are the sum of what its jobs hold, where a job
    /// suspended by preemption holds its memory and GPUs but not the CPUs it lent, through
    /// rounds of submits, preemptions, kills, ends and resumes.
    #[test]
    fn preemption_keeps_every_node_within_its_capacity(
        caps in cluster_shape(),
        rounds in proptest::collection::vec(proptest::collection::vec((job_shape(), proptest::bool::ANY), 1..6), 1..6),
        mode in prop_oneof![Just(PreemptMode::Requeue), Just(PreemptMode::Cancel), Just(PreemptMode::Suspend)],
    ) {
        let mut b = bench(&caps, BackfillMode::Easy);
        b.cmd(quorum_state::Command::SetPolicy {
            policy: Policy { ordering: QueueOrder::Fifo, preempt_type: PreemptType::PartitionPrio, ..Policy::default() },
            now: 0,
        });
        let all = format!("n[0-{}]", caps.len() - 1);
        let mut scav = quorum_state::testing::partition("scav", &all, true);
        (scav.preempt_mode, scav.max_time_s) = (Some(mode), None);
        let mut prod = quorum_state::testing::partition("prod", &all, false);
        (prod.priority_tier, prod.max_time_s) = (1, None);
        b.cmd(quorum_state::Command::SetPartitions { partitions: vec![scav, prod], now: 0 });
        for (round, jobs) in rounds.iter().enumerate() {
            b.at(round as u64 * 100);
            // Jobs past their limit end; victims being stopped are killed.
            let now = b.now_ms;
            let ending: Vec<(u64, bool)> = b.state.jobs.values()
                .filter(|j| j.state == JobState::Running)
                .filter_map(|j| {
                    let killed = j.preempting.is_some();
                    let due = j.start_time.unwrap() + j.limit_from_start_s().unwrap() * 1000 <= now;
                    (killed || due).then_some((j.id, killed))
                })
                .collect();
            for (id, killed) in ending {
                let j = &b.state.jobs[&id];
                let token = j.alloc_index;
                let outcome = if killed { RankOutcome::Cancelled { code: 0, signal: 9 } } else { RankOutcome::Exited { code: 0, signal: 0 } };
                for a in j.allocation.clone().unwrap().nodes {
                    b.cmd(quorum_state::Command::JobEnded { job_id: id, token, node: a.node, outcome, now });
                }
            }
            for (shape, high) in jobs {
                if caps.iter().filter(|(c, g)| *c >= shape.cpus && *g >= shape.gpus).count() >= shape.nodes as usize {
                    let j = shape.clone();
                    b.submit_with("alice", move |s| {
                        (s.nodes, s.ntasks, s.cpus_per_task, s.gpus_per_node) = (j.nodes, j.nodes, j.cpus, j.gpus);
                        (s.time_limit_s, s.exclusive) = (Some(j.limit), j.exclusive);
                        s.partition = Some(if *high { "prod" } else { "scav" }.into());
                    });
                }
            }
            b.cycle();
            b.cycle();
            assert_no_overcommit(&b);
            for n in b.state.nodes.values() {
                let held = || b.state.jobs.values().filter(|j| j.state.is_allocated()).flat_map(|j| {
                    j.allocation.iter().flat_map(|a| &a.nodes).filter(|a| a.node == n.name).map(move |a| (j, a))
                });
                let cpus: u32 = held().filter(|(j, _)| !j.lends_cpus()).map(|(_, a)| a.cpus).sum();
                let mem: u64 = held().map(|(_, a)| a.mem_mb).sum();
                let gpus: usize = held().map(|(_, a)| a.gpus.len()).sum();
                prop_assert_eq!((n.alloc_cpus, n.alloc_mem_mb, n.alloc_gpus.len()), (cpus, mem, gpus), "{}", n.name);
            }
        }
    }

    /// With partitions that share CPUs in different ways (and one that does not) over the same
    /// nodes: each node's jobs hold at most its CPUs counted 1/N for a job sharing N ways
    /// (checked here from the jobs themselves, in twelfths), and its books are what they hold.
    #[test]
    fn shared_cpus_keep_every_node_within_its_cpus(
        caps in cluster_shape(),
        rounds in proptest::collection::vec(proptest::collection::vec((job_shape(), 0usize..3, proptest::bool::ANY), 1..8), 1..5),
        force in 2u32..=4,
        yes in 2u32..=4,
    ) {
        use quorum_model::oversubscribe::OverSubscribe;
        let mut b = bench(&caps, BackfillMode::Easy);
        let all = format!("n[0-{}]", caps.len() - 1);
        let part = |name: &str, o: OverSubscribe| {
            let mut p = quorum_state::testing::partition(name, &all, name == "plain");
            (p.oversubscribe, p.max_time_s) = (o, None);
            p
        };
        let partitions = vec![part("plain", OverSubscribe::No), part("forced", OverSubscribe::Force(force)), part("asked", OverSubscribe::Yes(yes))];
        b.cmd(quorum_state::Command::SetPartitions { partitions, now: 0 });
        for (round, jobs) in rounds.iter().enumerate() {
            b.at(round as u64 * 100);
            let now = b.now_ms;
            let due: Vec<u64> = b.state.jobs.values()
                .filter(|j| j.state == JobState::Running && j.start_time.unwrap() + j.spec.time_limit_s.unwrap() * 1000 <= now)
                .map(|j| j.id)
                .collect();
            for id in due {
                b.end(id);
            }
            for (shape, p, asks) in jobs {
                if caps.iter().filter(|(c, g)| *c >= shape.cpus && *g >= shape.gpus).count() >= shape.nodes as usize {
                    let (j, asks) = (shape.clone(), *asks);
                    let name = ["plain", "forced", "asked"][*p];
                    b.submit_with("alice", move |s| {
                        (s.nodes, s.ntasks, s.cpus_per_task, s.gpus_per_node) = (j.nodes, j.nodes, j.cpus, j.gpus);
                        (s.time_limit_s, s.exclusive, s.oversubscribe) = (Some(j.limit), j.exclusive && !asks, asks);
                        s.partition = Some(name.into());
                    });
                }
            }
            b.cycle();
            assert_no_overcommit(&b);
            for n in b.state.nodes.values() {
                let held: Vec<(u32, &quorum_model::NodeAllocation)> = b.state.jobs.values()
                    .filter(|j| j.state.is_allocated())
                    .flat_map(|j| j.allocation.iter().flat_map(|a| a.nodes.iter().map(move |na| (a.ways(), na))))
                    .filter(|(_, a)| a.node == n.name)
                    .collect();
                let twelfths: u32 = held.iter().map(|(w, a)| a.cpus * (12 / w)).sum();
                prop_assert!(twelfths <= n.cpus * 12, "{} holds {} twelfths of {} CPUs", n.name, twelfths, n.cpus);
                let unshared: u32 = held.iter().filter(|(w, _)| *w == 1).map(|(_, a)| a.cpus).sum();
                let mut shared = std::collections::BTreeMap::new();
                for (w, a) in held.iter().filter(|(w, _)| *w > 1) {
                    *shared.entry(*w).or_insert(0) += a.cpus;
                }
                prop_assert_eq!((n.alloc_cpus, &n.shared_cpus), (unshared, &shared), "{}", n.name);
                prop_assert!(n.alloc_mem_mb <= n.mem_mb && n.alloc_gpus.len() <= n.gpus.len());
            }
        }
    }

    /// With an advance reservation over some nodes: no job outside it runs on them into its
    /// window, and its jobs run on its nodes inside it (apply re-checks every start as well).
    #[test]
    fn reservations_hold(
        caps in cluster_shape(),
        jobs in proptest::collection::vec((job_shape(), proptest::bool::weighted(0.3)), 1..16),
        reserved in proptest::collection::vec(proptest::bool::ANY, 6),
        (from, length) in (0u64..200, 1u64..300),
        maint in proptest::bool::ANY,
        flex in proptest::bool::ANY,
        steps in proptest::collection::vec(1u64..120, 1..5),
    ) {
        use quorum_model::reservation::{ResvEnd, ResvFlags, ResvRequest};
        let mut b = bench(&caps, BackfillMode::Easy);
        b.at(0);
        let nodes: Vec<String> = (0..caps.len()).filter(|i| reserved[*i]).map(|i| format!("n{i}")).collect();
        prop_assume!(!nodes.is_empty());
        let request = ResvRequest {
            name: "r".into(),
            start_ms: Some(b.now_ms + from * 1000),
            end: Some(ResvEnd::After(length)),
            nodes: Some(nodes.clone()),
            users: Some(vec!["alice".into()]),
            flags: Some(ResvFlags { maint, flex, ..ResvFlags::default() }),
            ..ResvRequest::default()
        };
        let now = b.now_ms;
        let made = b.cmd(quorum_state::Command::CreateReservation { request, user: "root".into(), now });
        prop_assert!(matches!(made, quorum_state::Response::Reserved { .. }), "{made:?}");
        let (window_start, window_end) = (b.now_ms + from * 1000, b.now_ms + (from + length) * 1000);
        for (j, inside) in &jobs {
            let fits = caps.iter().filter(|(c, g)| *c >= j.cpus && *g >= j.gpus).count() >= j.nodes as usize;
            let fits_inside = caps.iter().enumerate().filter(|(i, (c, g))| reserved[*i] && *c >= j.cpus && *g >= j.gpus).count() >= j.nodes as usize;
            if *inside && fits_inside {
                let j = j.clone();
                b.submit_with("alice", move |s| {
                    (s.nodes, s.ntasks, s.cpus_per_task, s.gpus_per_node) = (j.nodes, j.nodes, j.cpus, j.gpus);
                    (s.time_limit_s, s.exclusive, s.reservation) = (Some(j.limit), j.exclusive, Some("r".into()));
                });
            } else if fits {
                submit(&mut b, j);
            }
        }
        let mut t = 0;
        for step in steps {
            b.cycle();
            assert_no_overcommit(&b);
            for j in b.state.jobs.values().filter(|j| j.start_time.is_some()) {
                let start = j.start_time.unwrap();
                let end = start + j.limit_from_start_s().unwrap() * 1000;
                let on: Vec<&str> = j.allocation.iter().flat_map(|a| a.nodes.iter().map(|n| n.node.as_str())).collect();
                if j.spec.reservation.is_some() && flex {
                    // FLEX: anywhere, any time; only the others keep off its nodes.
                } else if j.spec.reservation.is_some() {
                    prop_assert!(on.iter().all(|n| nodes.iter().any(|r| r == n)), "job {} in r runs on {:?}", j.id, on);
                    prop_assert!(start >= window_start && end <= window_end, "job {} in r runs {}..{} outside {}..{}", j.id, start, end, window_start, window_end);
                } else if on.iter().any(|n| nodes.iter().any(|r| r == n)) {
                    prop_assert!(end <= window_start || start >= window_end, "job {} ({}..{}) on {:?} crosses r ({}..{})", j.id, start, end, on, window_start, window_end);
                }
            }
            // Time passes; jobs that reached their limit end.
            t += step;
            b.at(t);
            let due: Vec<u64> = b.state.jobs.values()
                .filter(|j| j.state == JobState::Running && j.start_time.unwrap() + j.limit_from_start_s().unwrap() * 1000 <= b.now_ms)
                .map(|j| j.id)
                .collect();
            for id in due {
                b.end(id);
            }
        }
    }

    #[test]
    fn first_job_that_fits_an_idle_cluster_starts(caps in cluster_shape(), jobs in proptest::collection::vec(job_shape(), 1..10)) {
        let mut b = bench(&caps, BackfillMode::Easy);
        b.at(0);
        let ids = submit_all(&mut b, &jobs, &caps);
        let plan = b.cycle();
        if let Some(first) = ids.first() {
            prop_assert!(plan.starts.iter().any(|s| s.job_id == *first), "job {} fits the idle cluster but did not start", first);
        }
    }
}

/// One step of a random history for [`cycles_from_what_the_last_kept_plan_as_cycles_from_nothing`].
#[derive(Clone, Debug)]
enum Step {
    /// A job of user `user` (either of the account's) under account `account` (0..2), with a nice value and,
    /// submitted by root, an operator's priority.
    Submit { user: usize, account: usize, shape: JobShape, nice: i32, priority: Option<u32> },
    /// The `k`-th running job ends (modulo how many run).
    End { k: usize },
    /// The `k`-th pending job gets a new nice value (`scontrol update`): another view entry.
    Renice { k: usize, nice: i32 },
    /// The `k`-th pending job is cancelled.
    Cancel { k: usize },
    /// Time passes.
    Wait { secs: u64 },
    /// The queue's order or the weights change: every kept term is of another context.
    Policy { ordering: QueueOrder, age: u32, fairshare: u32, job_size: u32 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0usize..3, 0usize..2, job_shape(), prop_oneof![3 => Just(0i32), 1 => 0i32..50], proptest::option::weighted(0.15, 0u32..2000))
            .prop_map(|(user, account, shape, nice, priority)| Step::Submit { user, account, shape, nice, priority }),
        1 => (0usize..16).prop_map(|k| Step::End { k }),
        1 => (0usize..16, -3000i32..3000).prop_map(|(k, nice)| Step::Renice { k, nice }),
        1 => (0usize..16).prop_map(|k| Step::Cancel { k }),
        2 => (1u64..2000).prop_map(|secs| Step::Wait { secs }),
        1 => (prop_oneof![4 => Just(QueueOrder::Multifactor), 1 => Just(QueueOrder::Fifo), 1 => Just(QueueOrder::ShortestFirst)], 0u32..3000, 0u32..3000, 0u32..3000)
            .prop_map(|(ordering, age, fairshare, job_size)| Step::Policy { ordering, age, fairshare, job_size }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64), ..ProptestConfig::default() })]

    /// The plan of a cycle made from what the last cycles kept ([`CycleCache`]) is the plan of
    /// a cycle made from nothing, through random histories of submits, ends, renices, cancels,
    /// time and policy changes under multifactor priority with fairshare (`Bench::cycle`
    /// compares the two every cycle).
    #[test]
    fn cycles_from_what_the_last_kept_plan_as_cycles_from_nothing(
        // A small cluster, so that a queue builds up.
        caps in proptest::collection::vec((1u32..=8, 0u32..=4), 1..=3),
        steps in proptest::collection::vec(step(), 1..60),
        conservative in proptest::bool::ANY,
    ) {
        let mode = if conservative { BackfillMode::Conservative } else { BackfillMode::Easy };
        let mut b = bench(&caps, mode);
        let policy = Policy { ordering: QueueOrder::Multifactor, half_life_s: 600, max_age_s: 3600, ..b.state.policy.clone() };
        b.cmd(quorum_state::Command::SetPolicy { policy, now: 0 });
        let users = ["ann", "bo", "cy"];
        let account = |name: &str, shares: u32, users: &[&str]| quorum_model::Account {
            name: name.into(),
            shares,
            users: users.iter().map(|u| u.to_string()).collect(),
            ..Default::default()
        };
        b.cmd(quorum_state::Command::SeedAccounts {
            accounts: vec![account("a", 1, &["ann", "bo", "root"]), account("b", 3, &["bo", "cy", "root"])],
            qos: vec![],
            now: 0,
        });
        let mut t = 0;
        b.at(t);
        for s in steps {
            let in_state = |b: &Bench, state: JobState| -> Vec<u64> {
                b.state.jobs.values().filter(|j| j.state == state).map(|j| j.id).collect()
            };
            match s {
                Step::Submit { user, account, shape, nice, priority } => {
                    if caps.iter().filter(|(c, g)| *c >= shape.cpus && *g >= shape.gpus).count() < shape.nodes as usize {
                        continue;
                    }
                    // ann and bo are a's, bo and cy b's; root submits as a member of both.
                    let (user, account) = (users[account + user % 2], ["a", "b"][account]);
                    let who = if priority.is_some() { "root" } else { user };
                    b.submit_with(who, |s| {
                        shape.fill(s);
                        s.account = Some(account.into());
                        s.nice = nice;
                        s.priority = priority;
                    });
                }
                Step::End { k } => {
                    let running = in_state(&b, JobState::Running);
                    if !running.is_empty() {
                        b.end(running[k % running.len()]);
                    }
                }
                Step::Renice { k, nice } => {
                    let pending = in_state(&b, JobState::Pending);
                    if let Some(&job_id) = pending.get(k % pending.len().max(1)) {
                        let update = quorum_model::update::JobUpdate { nice: Some(nice), ..Default::default() };
                        let r = b.cmd(quorum_state::Command::UpdateJob { job_id, user: "root".into(), update, now: b.now_ms });
                        prop_assert!(!matches!(r, quorum_state::Response::Rejected(_)), "renice: {:?}", r);
                    }
                }
                Step::Cancel { k } => {
                    let pending = in_state(&b, JobState::Pending);
                    if let Some(&job_id) = pending.get(k % pending.len().max(1)) {
                        let r = b.cmd(quorum_state::Command::CancelJob { job_id, user: "root".into(), now: b.now_ms, whole_array: false });
                        prop_assert!(!matches!(r, quorum_state::Response::Rejected(_)), "cancel: {:?}", r);
                    }
                }
                Step::Wait { secs } => {
                    t += secs;
                    b.at(t);
                }
                Step::Policy { ordering, age, fairshare, job_size } => {
                    let mut policy = Policy { ordering, ..b.state.policy.clone() };
                    policy.weights.age = age;
                    policy.weights.fairshare = fairshare;
                    policy.weights.job_size = job_size;
                    let r = b.cmd(quorum_state::Command::SetPolicy { policy, now: b.now_ms });
                    prop_assert!(!matches!(r, quorum_state::Response::Rejected(_)), "policy: {:?}", r);
                }
            }
            b.cycle(); // asserts the plan from what was kept is the plan from nothing
            assert_no_overcommit(&b);
        }
    }
}
