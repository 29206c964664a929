//! Scheduler scenarios: the classic backfill worked example, eligibility reasons, placement
//! rules and fairshare; property tests for the invariants live in `tests/sched_props.rs`.

use std::collections::BTreeMap;

use super::*;
use quorum_model::{Account, AssocLimits, Gpu, JobSpec, JobState, Program, Qos, RankOutcome};
use quorum_state::testing::{cluster, partition, spec, submit};
use quorum_state::{apply, ClusterState, Command, NodeRegistration, Response};

/// A cluster driven through the real state machine and scheduler, in virtual time.
pub(crate) struct Bench {
    pub state: ClusterState,
    pub now_ms: u64,
    index: u64,
    /// The last plan's reservations, fed to the next cycle as the leader does.
    previous: BTreeMap<u64, Estimate>,
    promised: BTreeMap<u64, Millis>,
    cache: crate::view::ViewCache,
    /// What the scheduler keeps between cycles: every cycle's plan made with it is checked
    /// against the plan made without it.
    cycles: crate::CycleCache,
}

pub(crate) fn node(name: &str, cpus: u32, gpus: u32, gpu_type: &str, features: &[&str]) -> NodeRegistration {
    NodeRegistration {
        name: name.into(),
        cpus,
        mem_mb: 64 * 1024,
        gpus: (0..gpus).map(|i| Gpu { index: i, gpu_type: gpu_type.into() }).collect(),
        features: features.iter().map(|s| s.to_string()).collect(),
        version: "test".into(),
    }
}

impl Bench {
    pub fn new(nodes: Vec<NodeRegistration>, policy: Policy) -> Bench {
        let mut b = Bench {
            state: ClusterState::new(),
            now_ms: 1_000_000_000,
            index: 0,
            previous: BTreeMap::new(),
            promised: BTreeMap::new(),
            cache: Default::default(),
            cycles: Default::default(),
        };
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        let mut p = partition("batch", "x", true);
        p.node_names = names.iter().cloned().collect();
        p.nodes = quorum_model::hostlist::compress(&names);
        p.max_time_s = None;
        b.cmd(Command::SetPartitions { partitions: vec![p], now: 0 });
        b.cmd(Command::SetPolicy { policy, now: 0 });
        for n in nodes {
            b.cmd(Command::RegisterNode { node: n, now: 0 });
        }
        b
    }

    pub fn cmd(&mut self, c: Command) -> Response {
        self.index += 1;
        apply(&mut self.state, self.index, c)
    }

    pub fn at(&mut self, secs: u64) {
        self.now_ms = 1_000_000_000 + secs * 1000;
    }

    /// Submits a job of `nodes` nodes with `cpus` CPUs each and a time limit; returns its id.
    pub fn submit_with(&mut self, user: &str, f: impl FnOnce(&mut JobSpec)) -> u64 {
        let mut spec = JobSpec {
            name: "j".into(),
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 1,
            mem_per_node_mb: Some(100),
            time_limit_s: Some(100),
            program: Program::Argv(vec!["true".into()]),
            work_dir: "/tmp".into(),
            submit_dir: "/tmp".into(),
            ..Default::default()
        };
        f(&mut spec);
        let now = self.now_ms;
        match self.cmd(Command::SubmitJob {
            spec: Box::new(spec),
            user: user.into(),
            now,
            request_id: format!("r{}", self.index),
        }) {
            Response::Submitted { job_id, .. } => job_id,
            other => panic!("submit failed: {other:?}"),
        }
    }

    pub fn submit(&mut self, nodes: u32, limit_s: u64) -> u64 {
        self.submit_with("alice", |s| {
            s.nodes = nodes;
            s.ntasks = nodes;
            s.time_limit_s = Some(limit_s);
        })
    }

    /// One scheduling cycle, applied; returns the plan.
    pub fn cycle(&mut self) -> Plan {
        // The cached view, as the leader's: the scheduler's own cache keeps what it computed
        // of each of its entries while the entry is the same one.
        let mut view = ClusterView::from_state_cached(&self.state, &mut self.cache);
        assert_eq!(view, ClusterView::from_state(&self.state), "a view built from the cache equals one built afresh");
        view.previous = std::mem::take(&mut self.previous);
        view.promised = std::mem::take(&mut self.promised);
        let policy = self.state.policy.clone();
        let plan = schedule(&view, self.now_ms, &policy);
        self.previous = plan.estimates.clone();
        self.promised = promises(&view, &plan);
        assert_eq!(plan, schedule(&view, self.now_ms, &policy), "the same input gives the same plan");
        assert_eq!(
            schedule_with(&view, self.now_ms, &policy, &mut self.cycles),
            plan,
            "a cycle from what the last ones kept plans what a cycle from nothing does"
        );
        let now = self.now_ms;
        let r = self.cmd(Command::ApplyPlan {
            base_index: self.index,
            now,
            starts: plan.starts.clone(),
            reasons: plan.reasons.clone(),
            preemptions: plan.preemptions.clone(),
            resumes: plan.resumes.clone(),
            shown: Vec::new(),
        });
        match r {
            Response::PlanApplied { dropped, .. } => assert!(dropped.is_empty(), "apply dropped {dropped:?}"),
            other => panic!("{other:?}"),
        }
        plan
    }

    pub fn end(&mut self, job: u64) {
        self.end_with(job, 0);
    }

    /// Ends `job` with exit `code` on each of its nodes: COMPLETED for 0, FAILED otherwise.
    pub fn end_with(&mut self, job: u64, code: i32) {
        let j = &self.state.jobs[&job];
        let token = j.alloc_index;
        let nodes: Vec<String> = j.allocation.as_ref().unwrap().nodes.iter().map(|n| n.node.clone()).collect();
        let now = self.now_ms;
        for node in nodes {
            self.cmd(Command::JobEnded {
                job_id: job,
                token,
                node,
                outcome: RankOutcome::Exited { code, signal: 0 },
                now,
            });
        }
        let want = if code == 0 { JobState::Completed } else { JobState::Failed };
        assert_eq!(self.state.jobs[&job].state, want);
    }
}

pub(crate) fn started(plan: &Plan) -> Vec<u64> {
    plan.starts.iter().map(|s| s.job_id).collect()
}

pub(crate) fn estimate_s(plan: &Plan, job: u64) -> Option<u64> {
    plan.estimates.get(&job).map(|e| (e.start_ms - 1_000_000_000) / 1000)
}

pub(crate) fn ten_nodes() -> Vec<NodeRegistration> {
    (1..=10).map(|i| node(&format!("n{i:02}"), 1, 0, "", &[])).collect()
}

pub(crate) fn fifo(backfill: BackfillMode, reservations: u32) -> Policy {
    Policy { ordering: QueueOrder::Fifo, backfill, reservations, ..Policy::default() }
}

/// The picture in every batch system's user guide, ten one-CPU nodes, conservative backfill.
#[test]
fn worked_example_a_to_h() {
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Conservative, 10));
    b.at(0);
    let a = b.submit(4, 100);
    let bb = b.submit(3, 200);
    let c = b.submit(2, 300);
    let d = b.submit(10, 100);
    let p = b.cycle();
    assert_eq!(started(&p), vec![a, bb, c], "A, B and C start; C fits beside them");
    assert_eq!(p.reason(d).unwrap(), PendingReason::Resources);
    assert_eq!(estimate_s(&p, d), Some(300), "D is reserved for when B and C have ended");

    b.at(10);
    let e = b.submit(1, 250);
    let p = b.cycle();
    assert_eq!(started(&p), vec![e], "E fits in the hole below D's reservation");
    assert_eq!(estimate_s(&p, d), Some(300), "and does not delay D");

    b.at(100);
    b.end(a);
    let f = b.submit(4, 150);
    let g = b.submit(5, 100);
    let h = b.submit(3, 90);
    let p = b.cycle();
    assert_eq!(started(&p), vec![f], "F fits beside C where A was");
    assert_eq!(estimate_s(&p, d), Some(300));
    assert_eq!(estimate_s(&p, g), Some(400), "G is reserved after D");
    assert_eq!(estimate_s(&p, h), Some(200), "H is reserved in the hole under D, when B ends");
    assert_eq!(p.reason(g).unwrap(), PendingReason::Priority);

    b.at(200);
    b.end(bb);
    let p = b.cycle();
    assert_eq!(started(&p), vec![h], "H starts before D and ends before it");

    b.at(250);
    b.end(f);
    b.at(260);
    b.end(e);
    assert!(started(&b.cycle()).is_empty(), "D waits for all ten nodes");

    b.at(290);
    b.end(h);
    b.at(300);
    b.end(c);
    let p = b.cycle();
    assert_eq!(started(&p), vec![d], "D starts when reserved");
    assert_eq!(estimate_s(&p, g), Some(400));

    b.at(400);
    b.end(d);
    assert_eq!(started(&b.cycle()), vec![g]);
}

#[test]
fn easy_backfills_where_fcfs_waits() {
    let run = |backfill| {
        let mut b = Bench::new(ten_nodes(), fifo(backfill, 1));
        b.at(0);
        let big = b.submit(8, 100);
        b.cycle();
        let wide = b.submit(10, 100); // blocked until `big` ends
        let small = b.submit(2, 50); // fits beside `big` and ends before it
        let long = b.submit(2, 500); // fits now but would delay `wide`
        let p = b.cycle();
        (big, wide, small, long, p)
    };
    let (_, wide, small, long, p) = run(BackfillMode::Easy);
    assert_eq!(started(&p), vec![small]);
    assert_eq!(p.backfilled, 1, "`small` starts ahead of `wide`, which waits");
    assert_eq!(estimate_s(&p, wide), Some(100));
    assert_eq!(p.reason(long).unwrap(), PendingReason::Priority, "backfilling it would delay the reservation");
    let (_, wide, small, _, p) = run(BackfillMode::None);
    assert!(started(&p).is_empty(), "strict FCFS starts nothing behind a blocked job");
    assert_eq!(p.backfilled, 0);
    assert_eq!(p.reason(wide).unwrap(), PendingReason::Resources);
    assert_eq!(p.reason(small).unwrap(), PendingReason::Priority);
}

#[test]
fn eligibility_reasons_are_named() {
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Easy, 1));
    b.at(0);
    let first = b.submit(1, 100);
    let held = b.submit_with("alice", |s| s.hold = true);
    let after = b.submit_with("alice", |s| {
        s.dependencies =
            vec![quorum_model::Dependency { kind: quorum_model::DependencyKind::AfterOk, job: first, delay_min: 0 }]
    });
    let notok = b.submit_with("alice", |s| {
        s.dependencies =
            vec![quorum_model::Dependency { kind: quorum_model::DependencyKind::AfterNotOk, job: first, delay_min: 0 }]
    });
    let begin = b.now_ms + 3_600_000;
    let later = b.submit_with("alice", |s| s.begin_time = Some(begin));
    let featured = b.submit_with("alice", |s| s.constraint = vec!["ib".into()]);
    let p = b.cycle();
    assert_eq!(started(&p), vec![first]);
    assert_eq!(p.reason(held).unwrap(), PendingReason::JobHeldUser);
    assert_eq!(p.reason(after).unwrap(), PendingReason::Dependency);
    assert_eq!(p.reason(later).unwrap(), PendingReason::BeginTime);
    assert_eq!(p.reason(featured).unwrap(), PendingReason::BadConstraints);
    b.at(50);
    b.end(first);
    let p = b.cycle();
    assert_eq!(started(&p), vec![after], "afterok is satisfied once the job completed");
    assert_eq!(p.reason(notok).unwrap(), PendingReason::DependencyNeverSatisfied);
    assert_eq!(
        b.cmd(Command::ReleaseJob { job_id: held, user: "alice".into(), now: 0 }),
        Response::Released { job_id: held }
    );
    assert_eq!(started(&b.cycle()), vec![held]);
}

/// A partition closed to an account or QOS after its jobs were submitted keeps them waiting
/// with Slurm's reasons (`AccountNotAllowed`, `QOSNotAllowed`); reopened, they run.
#[test]
fn jobs_wait_while_their_partition_no_longer_admits_their_account_or_qos() {
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Easy, 1));
    let versions =
        BTreeMap::from([(1, quorum_state::ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "x".into() })]);
    b.cmd(Command::SetReplicaVersions { versions, now: 0 });
    b.at(0);
    let physics = b.submit_with("alice", |s| s.account = Some("physics".into()));
    let scavenger = b.submit_with("alice", |s| (s.account, s.qos) = (Some("lab".into()), Some("scavenger".into())));
    let lab = b.submit_with("alice", |s| s.account = Some("lab".into()));
    let open = b.state.partitions["batch"].clone();
    let mut closed = open.clone();
    (closed.access.allow_accounts, closed.access.deny_qos) = (vec!["lab".into()], vec!["scavenger".into()]);
    b.cmd(Command::SetPartitions { partitions: vec![closed], now: 0 });
    let p = b.cycle();
    assert_eq!(started(&p), vec![lab]);
    assert_eq!(p.reason(physics).unwrap(), PendingReason::AccountNotAllowed);
    assert_eq!(p.reason(scavenger).unwrap(), PendingReason::QOSNotAllowed);
    b.cmd(Command::SetPartitions { partitions: vec![open], now: 0 });
    assert_eq!(started(&b.cycle()), vec![physics, scavenger]);
}

/// A dependency on an array's id waits for every task of the array, as Slurm's does: `after`
/// until all have started, `afterok` until all completed (never once one failed), `afterany`
/// until all ended, `afternotok` until all ended with one failed.
#[test]
fn a_dependency_on_an_array_waits_for_every_task() {
    use quorum_model::{Dependency, DependencyKind};
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Easy, 1));
    b.at(0);
    let array = b.submit_with("alice", |s| s.array = Some(quorum_model::ArraySpec::parse("0-2").unwrap()));
    let on = |kind| move |s: &mut JobSpec| s.dependencies = vec![Dependency { kind, job: array, delay_min: 0 }];
    let ok = b.submit_with("alice", on(DependencyKind::AfterOk));
    let any = b.submit_with("alice", on(DependencyKind::AfterAny));
    let notok = b.submit_with("alice", on(DependencyKind::AfterNotOk));
    let after = b.submit_with("alice", on(DependencyKind::After));
    assert_eq!(started(&b.cycle()), vec![array, array + 1, array + 2]);
    b.at(10);
    b.end(array);
    let p = b.cycle();
    assert_eq!(started(&p), vec![after], "every task has started");
    for j in [ok, any, notok] {
        assert_eq!(p.reason(j), Some(PendingReason::Dependency), "job {j}: task 0 alone has ended");
    }
    b.end_with(array + 1, 3);
    let p = b.cycle();
    assert_eq!(p.reason(ok), Some(PendingReason::DependencyNeverSatisfied), "a task failed");
    assert_eq!(p.reason(any), Some(PendingReason::Dependency), "task 2 still runs");
    assert_eq!(p.reason(notok), Some(PendingReason::Dependency), "task 2 still runs");
    b.end(array + 2);
    assert_eq!(started(&b.cycle()), vec![any, notok]);
}

/// The forms of feature level 12, as Slurm 22.05 runs them: `aftercorr` pairs the tasks of two
/// arrays by task id (a task the other array lacks, or a job that is no array task, waits for
/// the whole array as `afterok` does); `after:ID+MINUTES` waits that long after the other job
/// started; `?` between dependencies needs one of them, and is never satisfied only when none
/// can be.
#[test]
fn aftercorr_delays_and_any_of() {
    use quorum_model::{parse_dependencies, DependencyKind};
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Easy, 1));
    b.at(0);
    let a = b.submit_with("alice", |s| s.array = Some(quorum_model::ArraySpec::parse("1,3,5").unwrap()));
    let deps = |text: String| {
        move |s: &mut JobSpec| {
            let d = parse_dependencies(&text).unwrap();
            (s.dependencies, s.dependency_any) = (d.list, d.any);
        }
    };
    let corr = b.submit_with("alice", |s: &mut JobSpec| {
        s.array = Some(quorum_model::ArraySpec::parse("1-5:2,4").unwrap());
        deps(format!("aftercorr:{a}"))(s)
    });
    let corr_plain = b.submit_with("alice", deps(format!("aftercorr:{a}")));
    let delayed = b.submit_with("alice", deps(format!("after:{a}+2")));
    let ok_delay_ignored = b.submit_with("alice", deps(format!("afterok:{a}+30")));
    assert_eq!(b.state.jobs[&corr].spec.dependencies[0].kind, DependencyKind::AfterCorr);
    assert_eq!(started(&b.cycle()), vec![a, a + 1, a + 2]);
    // corr's tasks 1, 3, 4, 5 are jobs corr .. corr+3 (task ids in order: 1, 3, 4, 5).
    b.at(10);
    b.end(a + 1);
    let p = b.cycle();
    assert_eq!(started(&p), vec![corr + 1], "task 3 of the second array follows task 3 of the first");
    for j in [corr, corr + 2, corr + 3, corr_plain, ok_delay_ignored] {
        assert_eq!(p.reason(j), Some(PendingReason::Dependency), "job {j}");
    }
    assert_eq!(p.reason(delayed), Some(PendingReason::Dependency), "two minutes after the array started");
    b.at(119);
    assert_eq!(b.cycle().reason(delayed), Some(PendingReason::Dependency));
    b.at(120);
    assert_eq!(started(&b.cycle()), vec![delayed]);
    b.end_with(a, 1);
    let p = b.cycle();
    assert_eq!(p.reason(corr), Some(PendingReason::DependencyNeverSatisfied), "its task 1 failed");
    assert_eq!(p.reason(corr_plain), Some(PendingReason::DependencyNeverSatisfied), "afterok on the whole array");
    assert_eq!(p.reason(corr + 2), Some(PendingReason::DependencyNeverSatisfied), "no task 4 there: the whole array");
    assert_eq!(p.reason(ok_delay_ignored), Some(PendingReason::DependencyNeverSatisfied));
    b.end(a + 2);
    assert_eq!(started(&b.cycle()), vec![corr + 3], "task 5 follows task 5");

    // Any of: met by one; never once none can be.
    let x = b.submit(1, 100);
    let y = b.submit(1, 100);
    let either = b.submit_with("alice", deps(format!("afterok:{x}?afterok:{y}")));
    let neither = b.submit_with("alice", deps(format!("afternotok:{x}?afternotok:{y}")));
    let both = b.submit_with("alice", deps(format!("afterok:{x},afterok:{y}")));
    assert_eq!(started(&b.cycle()), vec![x, y]);
    b.at(200);
    b.end_with(x, 2);
    let p = b.cycle();
    assert_eq!(started(&p), vec![neither], "x failed: one afternotok met");
    assert_eq!(p.reason(either), Some(PendingReason::Dependency), "y may still complete");
    assert_eq!(p.reason(both), Some(PendingReason::DependencyNeverSatisfied));
    b.end(y);
    assert_eq!(started(&b.cycle()), vec![either]);
}

#[test]
fn qos_and_association_limits() {
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Easy, 1));
    let account = |name: &str, limits| Account {
        name: name.into(),
        parent: None,
        shares: 1,
        users: ["alice".to_string(), "bob".to_string()].into(),
        limits,
        user_shares: Default::default(),
        ..Default::default()
    };
    b.cmd(Command::SeedAccounts {
        accounts: vec![account("physics", AssocLimits { max_jobs: Some(2), ..Default::default() })],
        qos: vec![
            Qos { name: "normal".into(), ..Default::default() },
            Qos { name: "short".into(), max_wall_s: Some(60), max_jobs_per_user: Some(1), ..Default::default() },
        ],
        now: 0,
    });
    b.at(0);
    let s1 = b.submit_with("bob", |s| {
        s.qos = Some("short".into());
        s.time_limit_s = Some(30)
    });
    let s2 = b.submit_with("bob", |s| {
        s.qos = Some("short".into());
        s.time_limit_s = Some(30)
    });
    let too_long = b.submit_with("bob", |s| {
        s.qos = Some("short".into());
        s.time_limit_s = Some(120)
    });
    let a1 = b.submit(1, 100);
    let a2 = b.submit(1, 100);
    let p = b.cycle();
    assert_eq!(started(&p), vec![s1, a1]);
    assert_eq!(p.reason(s2).unwrap(), PendingReason::QOSMaxJobsPerUserLimit);
    assert_eq!(p.reason(too_long).unwrap(), PendingReason::QOSMaxWallDurationPerJobLimit);
    assert_eq!(p.reason(a2).unwrap(), PendingReason::AssocMaxJobsLimit, "physics runs two jobs at most");
    // An unknown account or QOS is refused at submit.
    let r = b.cmd(Command::SubmitJob {
        spec: Box::new(JobSpec { qos: Some("gold".into()), ..(*b.state.jobs[&a1].spec).clone() }),
        user: "alice".into(),
        now: 0,
        request_id: "x".into(),
    });
    assert!(matches!(r, Response::Rejected(quorum_model::Rejection::InvalidQos { .. })), "{r:?}");
}

#[test]
fn association_limits_count_memory_nodes_and_gpus_by_type() {
    let nodes: Vec<_> = (1..=4).map(|i| node(&format!("g{i}"), 8, 4, "h100", &[])).collect();
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 1));
    let limits = |f: &dyn Fn(&mut AssocLimits)| {
        let mut l = AssocLimits::default();
        f(&mut l);
        l
    };
    let acct = |name: &str, user: &str, l: AssocLimits| Account {
        name: name.into(),
        parent: None,
        shares: 1,
        users: [user.to_string()].into(),
        limits: l,
        user_shares: Default::default(),
        ..Default::default()
    };
    let typed: std::collections::BTreeMap<String, u32> = [("h100".to_string(), 2)].into();
    b.cmd(Command::SeedAccounts {
        accounts: vec![
            acct("gpu", "gina", limits(&|l| l.grp_gpus_by_type = typed.clone())),
            acct("mem", "mo", limits(&|l| l.grp_mem_mb = Some(1500))),
            acct("wide", "wu", limits(&|l| l.grp_nodes = Some(2))),
        ],
        qos: vec![],
        now: 0,
    });
    b.at(0);
    let g1 = b.submit_with("gina", |s| {
        s.gpus_per_node = 2;
        s.gpu_type = Some("h100".into())
    });
    let g2 = b.submit_with("gina", |s| {
        s.gpus_per_node = 1;
        s.gpu_type = Some("h100".into())
    });
    let m1 = b.submit_with("mo", |s| s.mem_per_node_mb = Some(1000));
    let m2 = b.submit_with("mo", |s| s.mem_per_node_mb = Some(1000));
    let w1 = b.submit_with("wu", |s| {
        s.nodes = 2;
        s.ntasks = 2
    });
    let w2 = b.submit_with("wu", |_| {});
    let p = b.cycle();
    assert_eq!(started(&p), vec![g1, m1, w1]);
    assert_eq!(p.reason(g2).unwrap(), PendingReason::AssocGrpGRES, "two h100s is the account's limit");
    assert_eq!(p.reason(m2).unwrap(), PendingReason::AssocGrpMemLimit);
    assert_eq!(p.reason(w2).unwrap(), PendingReason::AssocGrpNodeLimit);
}

#[test]
fn typed_gpus_exclusive_nodes_and_topology() {
    let nodes = vec![
        node("a1", 8, 4, "a100", &[]),
        node("h1", 8, 4, "h100", &["ib"]),
        node("h2", 8, 4, "h100", &["ib"]),
        node("h3", 8, 4, "h100", &["ib"]),
    ];
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 1));
    b.at(0);
    let typed = b.submit_with("alice", |s| {
        s.gpus_per_node = 2;
        s.gpu_type = Some("a100".into());
    });
    let excl = b.submit_with("alice", |s| {
        s.exclusive = true;
        s.constraint = vec!["ib".into()];
    });
    let p = b.cycle();
    let alloc = |job: u64| p.starts.iter().find(|s| s.job_id == job).unwrap().allocation.nodes.clone();
    assert_eq!(alloc(typed)[0].node, "a1");
    assert_eq!(alloc(typed)[0].gpus, vec![0, 1]);
    let e = &alloc(excl)[0];
    assert!(e.node.starts_with('h'));
    assert_eq!((e.cpus, e.gpus.len()), (8, 4), "an exclusive job holds the whole node");
}

#[test]
fn multi_node_jobs_stay_within_one_switch_when_they_can() {
    let nodes: Vec<_> = (1..=8).map(|i| node(&format!("n{i}"), 8, 0, "", &[])).collect();
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 1));
    // s1 holds n1-n4, s2 holds n5-n8.
    let switches = (1..=8).map(|i| (format!("n{i}"), if i <= 4 { "s1" } else { "s2" }.to_string())).collect();
    b.cmd(Command::SetTopology { switches, now: 0 });
    b.at(0);
    // Make n1 the best fit by CPUs, so that plain best fit would straddle the switches.
    let small = b.submit_with("alice", |s| s.cpus_per_task = 6);
    let p = b.cycle();
    assert_eq!(p.starts[0].allocation.nodes[0].node, "n1");
    let _ = small;
    let wide = b.submit_with("alice", |s| {
        s.nodes = 4;
        s.ntasks = 4;
        s.cpus_per_task = 2;
    });
    let p = b.cycle();
    let nodes: Vec<String> =
        p.starts.iter().find(|s| s.job_id == wide).unwrap().allocation.nodes.iter().map(|n| n.node.clone()).collect();
    let on_s1 = nodes.iter().filter(|n| ["n1", "n2", "n3", "n4"].contains(&n.as_str())).count();
    assert!(on_s1 == 0 || on_s1 == 4, "the 4-node job spans both switches: {nodes:?}");
}

/// Two accounts of one share each: `heavy` with its user hana, `light` with lee.
fn heavy_and_light(b: &mut Bench) {
    let acct = |name: &str, user: &str| Account {
        name: name.into(),
        parent: None,
        shares: 1,
        users: [user.to_string()].into(),
        limits: AssocLimits::default(),
        user_shares: Default::default(),
        ..Default::default()
    };
    b.cmd(Command::SeedAccounts { accounts: vec![acct("heavy", "hana"), acct("light", "lee")], qos: vec![], now: 0 });
}

#[test]
fn fairshare_ranks_the_light_account_first_and_converges() {
    let mut b = Bench::new(ten_nodes(), Policy { half_life_s: 3600, ..Policy::default() });
    heavy_and_light(&mut b);
    // hana uses all ten nodes for two hours
    b.at(0);
    let hog = b.submit_with("hana", |s| {
        s.nodes = 10;
        s.ntasks = 10;
        s.time_limit_s = Some(7200);
    });
    b.cycle();
    b.at(7200);
    b.end(hog);
    let wide = |s: &mut JobSpec| {
        s.nodes = 10;
        s.ntasks = 10;
    };
    let h = b.submit_with("hana", wide);
    let l = b.submit_with("lee", wide);
    let view = ClusterView::from_state(&b.state);
    let f = priority::breakdown(&view, b.now_ms, &b.state.policy);
    assert!(f[&l].fairshare > 0.99, "{:?}", f[&l]);
    assert!(f[&h].fairshare < 0.5, "{:?}", f[&h]);
    assert!(f[&l].total > f[&h].total);
    let p = b.cycle();
    assert_eq!(started(&p), vec![l], "the light account's job runs first although submitted later");
    // (It ends: a running job counts as it runs, and would count at its limit ten hours on.)
    b.end(l);
    // Ten half-lives later hana's usage has decayed away.
    let later = b.now_ms + 10 * 3600 * 1000;
    let shares = priority::fairshare(&ClusterView::from_state(&b.state), later, &b.state.policy);
    assert!((shares["heavy"].fairshare - shares["light"].fairshare).abs() < 0.01, "{shares:?}");
}

/// Fairshare charges running jobs as they run, as Slurm's decay does every
/// `PriorityCalcPeriod`: a user whose long job has run for an hour ranks below one who has run
/// nothing, before that job ends; and when it ends, its charge moves from the running job to the
/// account's usage without a jump.
#[test]
fn fairshare_charges_a_running_job_as_it_runs() {
    let mut b = Bench::new(ten_nodes(), Policy { half_life_s: 7 * 86_400, ..Policy::default() });
    heavy_and_light(&mut b);
    b.at(0);
    let long = b.submit_with("hana", |s| {
        s.nodes = 5;
        s.ntasks = 5;
        s.time_limit_s = Some(86_400);
    });
    let short = b.submit_with("lee", |s| s.time_limit_s = Some(60));
    let mut both = started(&b.cycle());
    both.sort_unstable();
    assert_eq!(both, vec![long, short]);
    // An hour on: hana's job still runs, and has charged her account what it has run; lee's
    // ran past its limit (its end not yet heard) and is charged its limit, no more.
    b.at(3600);
    let wide = |s: &mut JobSpec| {
        s.nodes = 10;
        s.ntasks = 10;
    };
    let h = b.submit_with("hana", wide);
    let l = b.submit_with("lee", wide);
    let view = ClusterView::from_state(&b.state);
    let shares = priority::fairshare(&view, b.now_ms, &b.state.policy);
    assert_eq!(shares["heavy"].raw_usage, 5.0 * 3600.0, "{:?}", shares["heavy"]);
    assert_eq!(shares["light"].raw_usage, 60.0, "{:?}", shares["light"]);
    let f = priority::breakdown(&view, b.now_ms, &b.state.policy);
    assert!(f[&h].fairshare < f[&l].fairshare, "hana {:?}, lee {:?}", f[&h], f[&l]);
    assert!(f[&h].total < f[&l].total, "lee's job ranks first although submitted later");
    // Its end charges what it ran: the account's usage is what the running job counted.
    b.at(7200);
    let running = priority::fairshare(&ClusterView::from_state(&b.state), b.now_ms, &b.state.policy);
    b.end(long);
    let ended = priority::fairshare(&ClusterView::from_state(&b.state), b.now_ms, &b.state.policy);
    assert_eq!(running["heavy"].raw_usage, 5.0 * 7200.0);
    assert!((ended["heavy"].raw_usage - running["heavy"].raw_usage).abs() < 1e-6, "{ended:?} {running:?}");
    assert!((ended["heavy"].fairshare - running["heavy"].fairshare).abs() < 1e-9);
}

/// The job-size factor counts what a job asks for as Slurm's TRES billing does: each GPU as
/// `gpu_billing_weight` CPUs. A job of one CPU and four GPUs is larger than one of eight CPUs
/// (by CPUs alone it was an eighth of it).
#[test]
fn job_size_counts_gpus_at_their_billing_weight() {
    let nodes = (1..=2).map(|i| node(&format!("g{i}"), 16, 4, "h100", &[])).collect();
    let mut b = Bench::new(nodes, Policy { favor_small: false, gpu_billing_weight: 10, ..Policy::default() });
    b.at(0);
    // The whole cluster's CPUs: the two below wait.
    b.submit_with("bob", |s| (s.nodes, s.ntasks, s.cpus_per_task) = (2, 2, 16));
    b.cycle();
    let gpus = b.submit_with("alice", |s| s.gpus_per_node = 4);
    let cpus = b.submit_with("alice", |s| s.cpus_per_task = 8);
    let f = priority::breakdown(&ClusterView::from_state(&b.state), b.now_ms, &b.state.policy);
    // The cluster: 32 CPUs and 8 GPUs, 112 billed; the jobs 1 + 40 and 8.
    assert!((f[&gpus].job_size - 41.0 / 112.0).abs() < 1e-9, "{:?}", f[&gpus]);
    assert!((f[&cpus].job_size - 8.0 / 112.0).abs() < 1e-9, "{:?}", f[&cpus]);
}

/// `PriorityWeightTRES`: each resource a job asks for adds its weight times the job's share of
/// what the job's partition holds of it (Slurm's TRES factors), its components' included; a
/// resource without a weight adds nothing, and without TRES weights the priority is as before.
#[test]
fn tres_weights_add_each_resources_share_of_the_partition() {
    let nodes = || (1..=2).map(|i| node(&format!("g{i}"), 16, 4, "h100", &[])).collect();
    let tres_weights = quorum_model::TresWeights { cpu: 1000, gpu: 4000, ..Default::default() };
    let mut b = Bench::new(nodes(), Policy { tres_weights, ..Policy::default() });
    let mut plain = Bench::new(nodes(), Policy::default());
    let mut ids = Vec::new();
    for bench in [&mut b, &mut plain] {
        bench.at(0);
        // The whole partition's CPUs: the two below wait.
        bench.submit_with("bob", |s| (s.nodes, s.ntasks, s.cpus_per_task) = (2, 2, 16));
        bench.cycle();
        let gpus = bench.submit_with("alice", |s| s.gpus_per_node = 4);
        let cpus = bench.submit_with("alice", |s| (s.cpus_per_task, s.mem_per_node_mb) = (8, Some(32 * 1024)));
        ids.push((gpus, cpus));
    }
    let (gpus, cpus) = ids[0];
    let f = priority::breakdown(&ClusterView::from_state(&b.state), b.now_ms, &b.state.policy);
    let p = priority::breakdown(&ClusterView::from_state(&plain.state), plain.now_ms, &plain.state.policy);
    // The partition: 32 CPUs, 128 GiB, 2 nodes, 8 GPUs. Memory weighs nothing here.
    let near = |a: [f64; 4], b: [f64; 4]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9);
    assert!(near(f[&gpus].tres, [1.0 / 32.0, 0.0, 0.0, 0.5]), "{:?}", f[&gpus]);
    assert!(near(f[&cpus].tres, [8.0 / 32.0, 0.0, 0.0, 0.0]), "{:?}", f[&cpus]);
    let added = |id: u64| f[&id].total - p[&id].total;
    assert!((added(gpus) - (1000.0 / 32.0 + 4000.0 * 0.5)).abs() < 1e-6, "{}", added(gpus));
    assert!((added(cpus) - 1000.0 * 8.0 / 32.0).abs() < 1e-6, "{}", added(cpus));
    assert_eq!(p[&gpus].tres, [0.0; 4], "no TRES weights, no TRES factors");
}

#[test]
fn pending_jobs_in_the_cached_view_share_one_copy_of_each_name() {
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Easy, 1));
    b.submit(10, 600);
    b.cycle();
    // The whole cluster each, behind the one running: all three stay pending.
    let ids: Vec<u64> = (0..3).map(|_| b.submit(10, 60)).collect();
    b.cycle();
    let view = ClusterView::from_state_cached(&b.state, &mut b.cache);
    let pending: Vec<_> = view.pending.iter().filter(|p| ids.contains(&p.id)).collect();
    assert_eq!(pending.len(), 3);
    assert!(pending.iter().all(|p| &*p.user == "alice"));
    let same = std::sync::Arc::ptr_eq;
    assert!(same(&pending[0].user, &pending[2].user) && same(&pending[0].partition, &pending[1].partition));
}

/// An array makes one job per task with consecutive ids, the first being the array's id; a
/// retry gets the same array; its throttle lets only that many tasks start, the others wait
/// with JobArrayTaskLimit; cancelling the array's id cancels every task still active.
#[test]
fn an_array_makes_its_tasks_throttles_them_and_cancels_them_together() {
    let mut s = cluster();
    let mut a = spec(&["true"]);
    a.array = Some(quorum_model::ArraySpec::parse("0-6:2,9%2").unwrap());
    let level = Command::SubmitJob { spec: Box::new(a.clone()), user: "alice".into(), now: 1, request_id: "x".into() };
    assert_eq!(level.level().0, 4, "arrays need level 4");
    assert_eq!(submit(&mut s, 10, a.clone(), "arr"), Response::Submitted { job_id: 1, duplicate: false });
    assert_eq!(submit(&mut s, 11, a, "arr"), Response::Submitted { job_id: 1, duplicate: true });
    let tasks: Vec<(JobId, u32)> = s.jobs.values().map(|j| (j.id, j.array.unwrap().task_id)).collect();
    assert_eq!(tasks, [(1, 0), (2, 2), (3, 4), (4, 6), (5, 9)]);
    for j in s.jobs.values() {
        let t = j.array.unwrap();
        assert_eq!((t.array_job_id, t.count, t.min, t.max, t.throttle), (1, 5, 0, 9, 2));
        assert!(j.spec.array.is_none(), "the task list is not copied into each task");
    }
    assert_eq!(s.next_job_id, 6);

    // Plenty of room for all five, but the throttle lets two run.
    let plan = schedule(&ClusterView::from_state(&s), 2000, &Policy::default());
    let started: Vec<JobId> = plan.starts.iter().map(|st| st.job_id).collect();
    assert_eq!(started, [1, 2]);
    for id in 3..=5 {
        assert_eq!(plan.reason(id), Some(PendingReason::JobArrayTaskLimit), "task {id}");
    }
    let reasons = plan.reasons_to_write();
    apply(&mut s, 12, Command::apply_plan(11, 2000, plan.starts, reasons, vec![], vec![]).unwrap());
    assert_eq!(s.jobs[&1].state, JobState::Running);
    // Nothing more starts while two run; when one ends, the next one does.
    assert!(schedule(&ClusterView::from_state(&s), 2100, &Policy::default()).starts.is_empty());
    let node = s.jobs[&1].allocation.as_ref().unwrap().nodes[0].node.clone();
    let token = s.jobs[&1].alloc_index;
    let ended =
        Command::JobEnded { job_id: 1, token, node, outcome: RankOutcome::Exited { code: 0, signal: 0 }, now: 2200 };
    apply(&mut s, 13, ended);
    let plan = schedule(&ClusterView::from_state(&s), 2300, &Policy::default());
    assert_eq!(plan.starts.iter().map(|st| st.job_id).collect::<Vec<_>>(), [3]);

    // The array's id cancels what is left of it: one running, three pending; the finished
    // task stays COMPLETED.
    let cancel = Command::CancelJob { job_id: 1, user: "alice".into(), now: 3000, whole_array: true };
    assert_eq!(apply(&mut s, 14, cancel), Response::Cancelled { job_id: 1, was_running: true });
    assert_eq!(s.jobs[&1].state, JobState::Completed);
    assert!(s.jobs[&2].cancel_requested);
    for id in 3..=5 {
        assert_eq!(s.jobs[&id].state, JobState::Cancelled, "task {id}");
    }
    let again = Command::CancelJob { job_id: 1, user: "alice".into(), now: 3001, whole_array: true };
    assert!(matches!(apply(&mut s, 15, again), Response::Cancelled { was_running: true, .. }), "task 2 still runs");
    let stranger = Command::CancelJob { job_id: 1, user: "bob".into(), now: 3002, whole_array: true };
    assert!(matches!(apply(&mut s, 16, stranger), Response::Rejected(_)));
}

/// A plan writes at most MAX_REASONS_PER_PLAN reasons; the others follow in the next cycles,
/// so that no Raft entry grows with the queue.
#[test]
fn a_plan_writes_a_bounded_number_of_reasons_and_the_rest_next_time() {
    let mut s = cluster();
    let mut held = spec(&["true"]);
    held.hold = true;
    held.array = Some(quorum_model::ArraySpec::parse("1-6000").unwrap());
    assert!(matches!(submit(&mut s, 10, held, "many"), Response::Submitted { job_id: 1, .. }));
    let reasons = |s: &ClusterState, now| {
        let plan = schedule(&ClusterView::from_state(s), now, &Policy::default());
        let reasons = plan.reasons_to_write();
        match Command::apply_plan(10, now, plan.starts, reasons, vec![], vec![]) {
            Some(Command::ApplyPlan { reasons, .. }) => reasons,
            _ => Vec::new(),
        }
    };
    let first = reasons(&s, 2000);
    assert_eq!(first.len(), MAX_REASONS_PER_PLAN);
    assert!(first.iter().all(|(_, r)| *r == PendingReason::JobHeldUser));
    let plan = Command::ApplyPlan {
        base_index: 10,
        now: 2000,
        starts: vec![],
        reasons: first,
        preemptions: vec![],
        resumes: vec![],
        shown: vec![],
    };
    apply(&mut s, 11, plan);
    let second = reasons(&s, 2100);
    assert_eq!(second.len(), 6000 - MAX_REASONS_PER_PLAN);
    apply(
        &mut s,
        12,
        Command::ApplyPlan {
            base_index: 11,
            now: 2100,
            starts: vec![],
            reasons: second,
            preemptions: vec![],
            resumes: vec![],
            shown: vec![],
        },
    );
    assert!(reasons(&s, 2200).is_empty(), "nothing left to write");
    assert!(s.jobs.values().all(|j| j.reason == PendingReason::JobHeldUser));
}

/// The stages of [`schedule`], each called on its own.
mod stages {
    use super::*;

    /// A job of `nodes` whole 4-CPU nodes for `limit_s`.
    fn whole(b: &mut Bench, nodes: u32, limit_s: u64) -> u64 {
        b.submit_with("alice", |s| {
            s.nodes = nodes;
            s.ntasks = nodes;
            s.cpus_per_task = 4;
            s.time_limit_s = Some(limit_s);
        })
    }

    fn bench_with_jobs() -> (Bench, [u64; 4]) {
        let mut b =
            Bench::new(vec![node("n1", 4, 0, "h100", &[]), node("n2", 4, 0, "h100", &[])], fifo(BackfillMode::Easy, 1));
        let wide = whole(&mut b, 2, 300);
        let held = b.submit_with("alice", |s| s.hold = true);
        let short = whole(&mut b, 1, 50);
        let odd = b.submit_with("bob", |s| s.constraint = vec!["infiniband".into()]);
        (b, [wide, held, short, odd])
    }

    #[test]
    fn order_is_a_permutation_in_the_policys_order() {
        let (b, [wide, held, short, odd]) = bench_with_jobs();
        let view = ClusterView::from_state(&b.state);
        let ids = |p: &Policy| order(&view, b.now_ms, p).iter().map(|j| j.id).collect::<Vec<_>>();
        assert_eq!(ids(&fifo(BackfillMode::Easy, 1)), [wide, held, short, odd]);
        let sjf = Policy { ordering: QueueOrder::ShortestFirst, ..fifo(BackfillMode::Easy, 1) };
        assert_eq!(ids(&sjf), [short, held, odd, wide], "shortest limit first, then submit order");
    }

    #[test]
    fn screen_sets_aside_the_jobs_that_cannot_start_whatever_runs() {
        let (b, [wide, held, short, odd]) = bench_with_jobs();
        let view = ClusterView::from_state(&b.state);
        let ordered = order(&view, b.now_ms, &fifo(BackfillMode::Easy, 1));
        let screened = screen(&view, &ordered, b.now_ms, &b.state.policy);
        let candidates: Vec<(usize, u64)> = screened.candidates.iter().map(|c| (c.position, c.job.id)).collect();
        assert_eq!(candidates, [(0, wide), (2, short)]);
        let ineligible: Vec<(usize, u64, PendingReason)> =
            screened.ineligible.iter().map(|w| (w.position, w.job.id, w.reason)).collect();
        assert_eq!(ineligible, [(1, held, PendingReason::JobHeldUser), (3, odd, PendingReason::BadConstraints)]);
    }

    #[test]
    fn place_starts_what_fits_and_reserves_for_the_first_blocked() {
        let mut b =
            Bench::new(vec![node("n1", 4, 0, "h100", &[]), node("n2", 4, 0, "h100", &[])], fifo(BackfillMode::Easy, 1));
        let both = whole(&mut b, 2, 300);
        let after = whole(&mut b, 2, 100);
        let third = whole(&mut b, 1, 100);
        let view = ClusterView::from_state(&b.state);
        let ordered = order(&view, b.now_ms, &view_policy(&b));
        let screened = screen(&view, &ordered, b.now_ms, &b.state.policy);
        assert_eq!(screened.candidates.len(), 3);
        let placed = place(&view, &screened.candidates, b.now_ms, &view_policy(&b));
        assert_eq!(placed.starts.iter().map(|s| s.job_id).collect::<Vec<_>>(), [both]);
        assert_eq!(placed.starts[0].allocation.nodes.len(), 2);
        let waiting: Vec<(u64, PendingReason)> = placed.waiting.iter().map(|w| (w.job.id, w.reason)).collect();
        assert_eq!(waiting, [(after, PendingReason::Resources), (third, PendingReason::Priority)]);
        let reserved = &placed.estimates[&after];
        assert_eq!(reserved.start_ms, b.now_ms + 300_000, "when the first job's time limit ends");
        assert!(!placed.estimates.contains_key(&third), "EASY reserves for the first blocked job only");
    }

    #[test]
    fn assemble_gives_reasons_in_the_order_considered_and_only_changes_to_write() {
        let (b, [wide, held, short, odd]) = bench_with_jobs();
        let view = ClusterView::from_state(&b.state);
        let policy = view_policy(&b);
        let ordered = order(&view, b.now_ms, &policy);
        let screened = screen(&view, &ordered, b.now_ms, &b.state.policy);
        let placed = place(&view, &screened.candidates, b.now_ms, &policy);
        let plan = Plan::assemble(ordered.len(), screened.ineligible, placed);
        assert_eq!(started(&plan), [wide]);
        let reasons: Vec<u64> = plan.reasons.iter().map(|(id, _)| *id).collect();
        assert_eq!(reasons, [held, short, odd], "ineligible and waiting jobs merged back into the order");
        assert_eq!(plan.reason(short), Some(PendingReason::Resources));
        assert_eq!(plan, schedule(&view, b.now_ms, &policy), "the stages are what schedule runs");
        let written: Vec<u64> = plan.reasons_to_write().iter().map(|(id, _)| *id).collect();
        assert_eq!(written, [held, short, odd], "every reason differs from the view's (none yet)");
    }

    fn view_policy(b: &Bench) -> Policy {
        b.state.policy.clone()
    }
}

#[test]
fn excluded_nodes_are_never_given_and_a_node_list_is_given_whole() {
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Easy, 1));
    b.at(0);
    let only_the_last = b.submit_with("alice", |s| s.exclude = (1..=9).map(|i| format!("n{i:02}")).collect());
    let listed = b.submit_with("alice", |s| {
        (s.nodes, s.ntasks) = (2, 2);
        s.nodelist = vec!["n03".into(), "n07".into()];
    });
    // Wants n10 too, which the first job holds: it waits although eight nodes are free.
    let taken = b.submit_with("alice", |s| s.nodelist = vec!["n10".into()]);
    let p = b.cycle();
    let nodes = |job: u64| -> Vec<String> {
        p.starts.iter().find(|s| s.job_id == job).unwrap().allocation.nodes.iter().map(|n| n.node.clone()).collect()
    };
    assert_eq!(nodes(only_the_last), ["n10"]);
    assert_eq!(nodes(listed), ["n03", "n07"]);
    assert!(!started(&p).contains(&taken), "{:?}", started(&p));
}

/// `--constraint a|b`: each node the job gets has one of the features, not necessarily the same.
#[test]
fn features_joined_by_or_take_nodes_with_any_of_them() {
    let nodes =
        vec![node("n1", 1, 0, "", &["skylake"]), node("n2", 1, 0, "", &[]), node("n3", 1, 0, "", &["icelake", "ib"])];
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 1));
    b.at(0);
    let either = b.submit_with("alice", |s| {
        (s.nodes, s.ntasks) = (2, 2);
        (s.constraint, s.constraint_any) = (vec!["skylake".into(), "icelake".into()], true);
    });
    let both = b.submit_with("alice", |s| s.constraint = vec!["skylake".into(), "icelake".into()]);
    let p = b.cycle();
    let start = p.starts.iter().find(|s| s.job_id == either).expect("started");
    let nodes: Vec<&str> = start.allocation.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(nodes, ["n1", "n3"]);
    assert_eq!(p.reason(both), Some(PendingReason::BadConstraints), "no node has both");
}

/// An operator's `--priority` puts the job ahead of those the policy orders, highest first (in
/// multifactor, a number above what the factors add up to).
#[test]
fn a_priority_set_by_an_operator_goes_first() {
    for ordering in [QueueOrder::Fifo, QueueOrder::Multifactor] {
        let mut b = Bench::new(ten_nodes(), Policy { ordering, ..fifo(BackfillMode::Easy, 1) });
        b.at(0);
        let running = b.submit(10, 100);
        assert_eq!(started(&b.cycle()), vec![running]);
        let plain = b.submit(10, 100);
        let low = b.submit_with("alice", |s| ((s.nodes, s.ntasks), s.priority) = ((10, 10), Some(1)));
        let high = b.submit_with("alice", |s| ((s.nodes, s.ntasks), s.priority) = ((10, 10), Some(1_000_000_000)));
        b.at(50);
        let p = b.cycle();
        assert_eq!(p.reason(high), Some(PendingReason::Resources), "{ordering:?}: first in line");
        for j in [plain, low] {
            assert_eq!(p.reason(j), Some(PendingReason::Priority), "{ordering:?}: job {j}");
        }
        b.end(running);
        assert_eq!(started(&b.cycle()), vec![high], "{ordering:?}");
    }
}

/// Licenses are counted over the whole cluster: a job starts only while as many as it asks for
/// are free, waits with `Licenses` otherwise (reserving nothing), and starts once a holder ends.
#[test]
fn licenses_are_counted_across_the_cluster() {
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Easy, 1));
    let licenses = [("matlab".to_string(), 2)].into();
    b.cmd(Command::SetLicenses { licenses, now: 0 });
    b.at(0);
    let lic = |n: u32| move |s: &mut JobSpec| s.licenses = [("matlab".to_string(), n)].into();
    let two = b.submit_with("alice", lic(2));
    let one = b.submit_with("alice", lic(1));
    let plain = b.submit(1, 100);
    let p = b.cycle();
    assert_eq!(started(&p), vec![two, plain]);
    assert_eq!(p.reason(one), Some(PendingReason::Licenses));
    b.at(10);
    b.end(two);
    assert_eq!(started(&b.cycle()), vec![one]);
}

#[test]
fn will_run_answers_against_running_jobs_not_the_queue() {
    let mut b = Bench::new((1..=4).map(|i| node(&format!("n{i}"), 2, 0, "", &[])).collect(), Policy::default());
    let first = b.submit(2, 300);
    b.cycle();
    assert_eq!(b.state.jobs[&first].state, JobState::Running);
    // Jobs waiting in the queue are not ahead of the one asked about (Slurm's will-run).
    let queued = b.submit_with("alice", |s| (s.nodes, s.ntasks, s.cpus_per_task) = (4, 4, 2));
    b.cycle();
    assert_eq!(b.state.jobs[&queued].state, JobState::Pending);
    let ask = |b: &Bench, nodes: u32, begin: Option<u64>| {
        let spec = JobSpec {
            nodes,
            ntasks: nodes,
            cpus_per_task: 2,
            time_limit_s: Some(60),
            partition: Some("batch".into()),
            begin_time: begin,
            ..Default::default()
        };
        let view = ClusterView::from_state(&b.state);
        let job = PendingJob::hypothetical(&view, b.state.next_job_id, &spec, "bob", b.now_ms);
        will_run(&view, job, b.now_ms, &b.state.policy)
    };
    // Two nodes are whole and free: a job wanting two whole nodes would start now, on them.
    match ask(&b, 2, None) {
        WillRun::Now(e) => {
            assert_eq!(e.start_ms, b.now_ms);
            assert_eq!(e.nodes.len(), 2);
            assert!(e.nodes.iter().all(|n| !b.state.jobs[&first].allocation.as_ref().unwrap().nodelist().contains(n)));
        }
        other => panic!("{other:?}"),
    }
    // Three need a node of the running job's: when its limit ends.
    match ask(&b, 3, None) {
        WillRun::Later(e) => assert_eq!((e.start_ms, e.nodes.len()), (b.now_ms + 300_000, 3)),
        other => panic!("{other:?}"),
    }
    // A begin time later than now is when it would start.
    match ask(&b, 1, Some(b.now_ms + 7_200_000)) {
        WillRun::Now(e) => assert_eq!(e.start_ms, b.now_ms + 7_200_000),
        other => panic!("{other:?}"),
    }
    // Nothing was submitted.
    assert_eq!(b.state.jobs.len(), 2);
}

#[test]
fn a_dependency_that_can_never_be_met_cancels_a_job_that_asked_for_it() {
    let mut b = Bench::new(ten_nodes(), Policy::default());
    let first = b.submit(1, 100);
    b.cycle();
    let after_ok = |kill: bool| {
        move |s: &mut JobSpec| {
            s.dependencies = vec![quorum_model::Dependency {
                kind: quorum_model::DependencyKind::AfterOk,
                job: first,
                delay_min: 0,
            }];
            s.kill_on_invalid_dep = kill;
        }
    };
    let (killed, kept) = (b.submit_with("alice", after_ok(true)), b.submit_with("alice", after_ok(false)));
    assert_eq!(b.cycle().reason(killed), Some(PendingReason::Dependency));
    b.end_with(first, 1);
    b.cycle();
    // Cancelled with the reason, as Slurm's `--kill-on-invalid-dep=yes`; the other one waits.
    let (k, w) = (&b.state.jobs[&killed], &b.state.jobs[&kept]);
    assert_eq!((k.state, k.reason), (JobState::Cancelled, PendingReason::DependencyNeverSatisfied));
    assert_eq!((w.state, w.reason), (JobState::Pending, PendingReason::DependencyNeverSatisfied));
}

#[test]
fn a_node_list_shorter_than_the_job_is_part_of_its_nodes() {
    let mut b = Bench::new(ten_nodes(), Policy::default());
    let versions =
        BTreeMap::from([(1, quorum_state::ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "t".into() })]);
    b.cmd(Command::SetReplicaVersions { versions, now: 0 });
    let busy = b.submit_with("alice", |s| s.nodelist = vec!["n01".into()]);
    b.cycle();
    let job = b.submit_with("alice", |s| {
        (s.nodes, s.ntasks, s.nodelist) = (3, 3, vec!["n07".into(), "n09".into()]);
    });
    let p = b.cycle();
    assert_eq!(started(&p), vec![job]);
    let nodes: Vec<String> =
        b.state.jobs[&job].allocation.as_ref().unwrap().nodes.iter().map(|n| n.node.clone()).collect();
    assert_eq!(nodes.len(), 3);
    assert!(nodes.contains(&"n07".to_string()) && nodes.contains(&"n09".to_string()), "{nodes:?}");
    assert!(!nodes.contains(&"n01".to_string()), "n01 is busy: {nodes:?}");
    // A listed node that is busy: the job waits for it, with a reservation that includes it.
    let waits = b.submit_with("alice", |s| {
        (s.nodes, s.ntasks, s.nodelist) = (2, 2, vec!["n01".into()]);
    });
    let p = b.cycle();
    assert!(started(&p).is_empty());
    let e = &p.estimates[&waits];
    assert!(e.nodes.contains(&"n01".to_string()) && e.nodes.len() == 2, "{e:?}");
    b.at(100);
    b.end(busy);
    let p = b.cycle();
    assert_eq!(started(&p), vec![waits]);
}

#[test]
fn a_matching_or_puts_every_node_on_the_same_feature() {
    let nodes = (1..=6).map(|i| node(&format!("n{i:02}"), 1, 0, "", &[if i <= 3 { "rack1" } else { "rack2" }]));
    let mut b = Bench::new(nodes.collect(), Policy::default());
    let versions =
        BTreeMap::from([(1, quorum_state::ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "t".into() })]);
    b.cmd(Command::SetReplicaVersions { versions, now: 0 });
    let busy = b.submit_with("alice", |s| s.nodelist = vec!["n01".into()]);
    b.cycle();
    let racks = |s: &mut JobSpec, nodes: u32| {
        (s.nodes, s.ntasks) = (nodes, nodes);
        (s.constraint, s.constraint_any, s.constraint_same) = (vec!["rack1".into(), "rack2".into()], true, true);
    };
    // rack1 has two free nodes, rack2 three: the job takes rack2, not two of one and one of other.
    let job = b.submit_with("alice", |s| racks(s, 3));
    assert_eq!(started(&b.cycle()), vec![job]);
    let names = |b: &Bench, j: u64| b.state.jobs[&j].allocation.as_ref().unwrap().nodelist();
    assert_eq!(names(&b, job), "n[04-06]");
    // Another waits for a whole rack: rack1 once n01 is free, its reservation all on rack1.
    let next = b.submit_with("alice", |s| racks(s, 3));
    let p = b.cycle();
    assert_eq!(p.estimates[&next].nodes, ["n01", "n02", "n03"]);
    b.at(100);
    b.end(busy);
    assert_eq!(started(&b.cycle()), vec![next]);
    assert_eq!(names(&b, next), "n[01-03]");
    // Four nodes on one rack: none has them, refused at submit.
    let mut spec: JobSpec = (*b.state.jobs[&next].spec).clone();
    racks(&mut spec, 4);
    let r = b.cmd(Command::SubmitJob {
        spec: Box::new(spec),
        user: "alice".into(),
        now: b.now_ms,
        request_id: "four".into(),
    });
    match r {
        Response::Rejected(quorum_model::Rejection::NeverFits { detail }) => {
            assert!(detail.contains("no one feature of [rack1|rack2] is on 4 nodes"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn node_counts_per_feature_take_that_many_nodes_of_each() {
    // n01-n02: rack1 and ib; n03-n05: rack2; n06-n07: nothing.
    let features = |i: u32| match i {
        1 | 2 => &["rack1", "ib"][..],
        3..=5 => &["rack2"][..],
        _ => &[][..],
    };
    let nodes = (1..=7).map(|i| node(&format!("n{i:02}"), 1, 0, "", features(i)));
    let mut b = Bench::new(nodes.collect(), Policy::default());
    let versions =
        BTreeMap::from([(1, quorum_state::ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "t".into() })]);
    b.cmd(Command::SetReplicaVersions { versions, now: 0 });
    let counted = |s: &mut JobSpec, nodes: u32, features: &[(&str, u32)]| {
        (s.nodes, s.ntasks) = (nodes, nodes);
        s.constraint = features.iter().map(|(f, _)| f.to_string()).collect();
        s.constraint_counts = features.iter().map(|(_, c)| *c).collect();
    };
    let names = |b: &Bench, j: u64| {
        let mut n: Vec<String> =
            b.state.jobs[&j].allocation.as_ref().unwrap().nodes.iter().map(|n| n.node.clone()).collect();
        n.sort();
        n
    };
    let busy = b.submit_with("alice", |s| {
        (s.nodes, s.ntasks, s.nodelist) = (2, 2, vec!["n02".into(), "n03".into()]);
    });
    // [rack2*2&ib*1] on 4 nodes: the two free rack2 nodes, the free ib node, and one with
    // no feature asked of it (the lowest free: every node is the same size).
    let job = b.submit_with("alice", |s| counted(s, 4, &[("rack2", 2), ("ib", 1)]));
    assert_eq!(started(&b.cycle()), vec![busy, job]);
    assert_eq!(names(&b, job), ["n01", "n04", "n05", "n06"]);
    // rack2*3 while every rack2 node is busy: it waits, its reservation on the three of them,
    // not on n07, which is free but lacks rack2.
    let next = b.submit_with("alice", |s| counted(s, 3, &[("rack2", 3)]));
    let p = b.cycle();
    assert!(started(&p).is_empty());
    let mut reserved = p.estimates[&next].nodes.clone();
    reserved.sort();
    assert_eq!(reserved, ["n03", "n04", "n05"]);
    b.at(200);
    b.end(busy);
    b.end(job);
    assert_eq!(started(&b.cycle()), vec![next]);
    assert_eq!(names(&b, next), ["n03", "n04", "n05"]);
    // More nodes with a feature than the partition has: refused at submit, naming it.
    let mut spec: JobSpec = (*b.state.jobs[&next].spec).clone();
    counted(&mut spec, 4, &[("rack1", 3), ("rack2", 1)]);
    let r = b.cmd(Command::SubmitJob {
        spec: Box::new(spec),
        user: "alice".into(),
        now: b.now_ms,
        request_id: "too-many".into(),
    });
    match r {
        Response::Rejected(quorum_model::Rejection::NeverFits { detail }) => {
            assert!(detail.contains("have the features [rack1*3&rack2*1]: 3 with 'rack1' asked, 2 have it"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn dependencies_on_jobs_that_left_the_hot_state_still_hold() {
    use quorum_model::parse_dependencies;
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Easy, 1));
    b.at(0);
    let ok = b.submit(1, 100);
    let failed = b.submit(1, 100);
    let array = b.submit_with("alice", |s| s.array = Some(quorum_model::ArraySpec::parse("0-2").unwrap()));
    assert_eq!(started(&b.cycle()).len(), 5);
    b.at(10);
    b.end(ok);
    b.end_with(failed, 1);
    for task in array..array + 3 {
        b.end(task);
    }
    b.at(400);
    let gone = (ok..array + 3).collect::<Vec<_>>();
    let now = b.now_ms;
    match b.cmd(Command::PurgeJobs { jobs: gone.clone(), min_age: 300_000, now }) {
        Response::Purged { jobs } => assert_eq!(jobs.len(), gone.len()),
        other => panic!("{other:?}"),
    }
    assert!(gone.iter().all(|id| !b.state.jobs.contains_key(id)));
    let deps = |text: String| {
        move |s: &mut JobSpec| {
            let d = parse_dependencies(&text).unwrap();
            (s.dependencies, s.dependency_any) = (d.list, d.any);
        }
    };
    let after_ok = b.submit_with("alice", deps(format!("afterok:{ok}")));
    let after_failed = b.submit_with("alice", deps(format!("afterok:{failed}")));
    let after_notok = b.submit_with("alice", deps(format!("afternotok:{failed}")));
    let after_array = b.submit_with("alice", deps(format!("afterok:{array}")));
    let corr = b.submit_with("alice", |s: &mut JobSpec| {
        s.array = Some(quorum_model::ArraySpec::parse("1").unwrap());
        deps(format!("aftercorr:{array}"))(s)
    });
    let p = b.cycle();
    assert_eq!(started(&p), vec![after_ok, after_notok, after_array, corr]);
    assert_eq!(p.reason(after_failed), Some(PendingReason::DependencyNeverSatisfied));
    // The tombstones a pending job needs outlive min_job_age; the others go.
    b.at(1000);
    let now = b.now_ms;
    b.cmd(Command::PurgeJobs { jobs: vec![], min_age: 300_000, now });
    assert_eq!(b.state.departed.keys().copied().collect::<Vec<_>>(), vec![failed]);
}

/// Preemption's worked examples (`preemption.rs`).
mod preemption_scenarios {
    use quorum_model::preempt::{PreemptMode, PreemptType};
    use quorum_model::{JobState, PendingReason, Policy, QueueOrder, RankOutcome};
    use quorum_state::testing::partition;
    use quorum_state::{Command, Response};

    use super::{node, Bench};
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

/// Preempt mode SUSPEND: the victim is frozen at once, keeps its memory and GPUs, lends its
/// CPUs to the preemptor, and is resumed (ahead of the jobs waiting behind it) when they are free.
mod suspend_scenarios {
    use quorum_model::preempt::{PreemptMode, PreemptType};
    use quorum_model::{JobState, Policy, QueueOrder, RankOutcome};
    use quorum_state::testing::partition;
    use quorum_state::{Command, Response};

    use super::{node, Bench};

    /// Two nodes of 4 CPUs and 1 GPU; `scav` (tier 0, suspended when preempted) and `prod`
    /// (tier 1) over both.
    fn site() -> Bench {
        let nodes = (1..=2).map(|i| node(&format!("n{i}"), 4, 1, "a100", &[])).collect();
        let policy =
            Policy { ordering: QueueOrder::Fifo, preempt_type: PreemptType::PartitionPrio, ..Policy::default() };
        let mut b = Bench::new(nodes, policy);
        let mut scav = partition("scav", "n[1-2]", true);
        (scav.preempt_mode, scav.grace_time_s, scav.max_time_s) = (Some(PreemptMode::Suspend), 30, None);
        let mut prod = partition("prod", "n[1-2]", false);
        (prod.priority_tier, prod.max_time_s) = (1, None);
        b.cmd(Command::SetPartitions { partitions: vec![scav, prod], now: 0 });
        b
    }

    fn job(b: &mut Bench, partition: &str, cpus: u32, gpus: u32, limit_s: u64) -> u64 {
        b.submit_with("alice", |s| {
            s.partition = Some(partition.into());
            (s.cpus_per_task, s.gpus_per_node, s.time_limit_s) = (cpus, gpus, Some(limit_s));
        })
    }

    fn end(b: &mut Bench, job: u64) -> Response {
        let j = &b.state.jobs[&job];
        let (token, node) = (j.alloc_index, j.allocation.as_ref().unwrap().nodes[0].node.clone());
        let now = b.now_ms;
        let outcome = RankOutcome::Exited { code: 0, signal: 0 };
        b.cmd(Command::JobEnded { job_id: job, token, node, outcome, now })
    }

    #[test]
    fn a_suspended_job_lends_its_cpus_keeps_its_gpu_and_resumes_before_the_queue() {
        let mut b = site();
        b.at(0);
        // Both nodes full of scavenger jobs, each with the node's GPU.
        let first = job(&mut b, "scav", 4, 1, 1000);
        b.at(10);
        let second = job(&mut b, "scav", 4, 1, 1000);
        b.cycle();
        b.cycle();
        let n2 = b.state.jobs[&second].allocation.as_ref().unwrap().nodes[0].node.clone();
        assert_eq!(b.state.jobs[&second].state, JobState::Running);
        // A production job needing a GPU cannot be given one: a suspended job keeps its GPU.
        b.at(20);
        let gpu = job(&mut b, "prod", 1, 1, 100);
        let plan = b.cycle();
        assert!(plan.preemptions.is_empty(), "{:?}", plan.preemptions);
        b.cmd(Command::CancelJob { job_id: gpu, user: "alice".into(), now: b.now_ms, whole_array: false });
        // One needing CPUs only suspends the latest started, at once (no grace).
        let prod = job(&mut b, "prod", 4, 0, 100);
        let plan = b.cycle();
        let planned: Vec<_> = plan.preemptions.iter().map(|p| (p.job_id, p.victims.clone())).collect();
        assert_eq!(planned.len(), 1, "{planned:?}");
        assert_eq!(
            planned[0].1.iter().map(|v| (v.job_id, v.mode, v.grace_s)).collect::<Vec<_>>(),
            vec![(second, PreemptMode::Suspend, 0)]
        );
        let victim = &b.state.jobs[&second];
        assert_eq!((victim.state, victim.preempted_by), (JobState::Suspended, Some(prod)));
        let n = &b.state.nodes[&n2];
        assert_eq!((n.alloc_cpus, n.alloc_gpus.len(), n.alloc_mem_mb), (0, 1, 100), "its GPU and memory stay taken");
        // An operator cannot resume it; the preemptor starts on its CPUs next cycle.
        let resume = Command::SuspendJob { job_id: second, user: "root".into(), resume: true, now: b.now_ms };
        assert!(matches!(b.cmd(resume), Response::Rejected(quorum_model::Rejection::SuspendedByPreemption { .. })));
        b.at(21);
        let plan = b.cycle();
        assert_eq!(plan.starts.iter().map(|s| s.job_id).collect::<Vec<_>>(), vec![prod]);
        assert_eq!(b.state.jobs[&prod].allocation.as_ref().unwrap().nodes[0].node, n2);
        assert!(plan.resumes.is_empty());
        // A scavenger job waiting for CPUs does not take them when the preemptor ends: the
        // suspended one is resumed first, its limit lengthened by its 100 s pause.
        b.at(60);
        let waiting = job(&mut b, "scav", 4, 0, 10);
        assert!(b.cycle().starts.is_empty());
        b.at(120);
        assert_eq!(end(&mut b, prod), Response::JobFinished { job_id: prod, state: JobState::Completed });
        let plan = b.cycle();
        assert_eq!(plan.resumes, vec![second]);
        assert!(plan.starts.is_empty(), "{:?}", plan.starts);
        let resumed = &b.state.jobs[&second];
        assert_eq!((resumed.state, resumed.preempting.is_none()), (JobState::Running, true));
        assert_eq!(resumed.limit_from_start_s(), Some(1000 + 100));
        assert_eq!(b.state.nodes[&n2].alloc_cpus, 4);
        // It ends as it would have; then the waiting job runs.
        b.at(200);
        assert_eq!(end(&mut b, second), Response::JobFinished { job_id: second, state: JobState::Completed });
        assert_eq!(b.cycle().starts.iter().map(|s| s.job_id).collect::<Vec<_>>(), vec![waiting]);
        assert_eq!(b.state.jobs[&first].state, JobState::Running);
    }

    #[test]
    fn a_job_cancelled_while_suspended_frees_only_what_it_held() {
        let mut b = site();
        b.at(0);
        let low = job(&mut b, "scav", 4, 1, 1000);
        let other = job(&mut b, "scav", 4, 1, 1000);
        b.cycle();
        b.at(10);
        let prod = job(&mut b, "prod", 2, 0, 100);
        b.cycle();
        let victim = [low, other].into_iter().find(|j| b.state.jobs[j].state == JobState::Suspended).expect("one");
        b.at(11);
        b.cycle();
        let node = b.state.jobs[&prod].allocation.as_ref().unwrap().nodes[0].node.clone();
        assert_eq!(b.state.nodes[&node].alloc_cpus, 2, "the preemptor's only");
        // Cancelled while frozen: its agents thaw and kill it; its end frees its GPU and memory.
        let r = b.cmd(Command::CancelJob { job_id: victim, user: "alice".into(), now: b.now_ms, whole_array: false });
        assert_eq!(r, Response::Cancelled { job_id: victim, was_running: true });
        let j = &b.state.jobs[&victim];
        let (token, on) = (j.alloc_index, j.allocation.as_ref().unwrap().nodes[0].node.clone());
        let outcome = RankOutcome::Cancelled { code: 0, signal: 9 };
        let ended = b.cmd(Command::JobEnded { job_id: victim, token, node: on, outcome, now: b.now_ms });
        assert_eq!(ended, Response::JobFinished { job_id: victim, state: JobState::Cancelled });
        let n = &b.state.nodes[&node];
        assert_eq!((n.alloc_cpus, n.alloc_gpus.len(), n.alloc_mem_mb), (2, 0, 100));
        assert!(b.cycle().resumes.is_empty());
    }
}

/// Advance reservations: a maintenance window that backfill must not cross, and a job that runs
/// only inside its reservation, stopped at its end.
mod reservation_scenarios {
    use quorum_model::reservation::{ResvEnd, ResvFlags, ResvRequest};
    use quorum_model::{JobState, PendingReason, Policy, QueueOrder};
    use quorum_state::{Command, Response};

    use super::{node, Bench};

    const T0: u64 = 1_000_000_000;

    /// Two nodes of 1 CPU, FIFO.
    fn site() -> Bench {
        let nodes = (1..=2).map(|i| node(&format!("n{i}"), 1, 0, "", &[])).collect();
        Bench::new(nodes, Policy { ordering: QueueOrder::Fifo, ..Policy::default() })
    }

    /// A reservation of `nodes` from `start` for `secs` (seconds after T0).
    fn reserve(b: &mut Bench, name: &str, nodes: &[&str], start: u64, secs: u64, flags: &str) -> Response {
        let request = ResvRequest {
            name: name.into(),
            start_ms: Some(T0 + start * 1000),
            end: Some(ResvEnd::After(secs)),
            nodes: Some(nodes.iter().map(|n| n.to_string()).collect()),
            users: Some(vec!["alice".into()]),
            flags: Some(ResvFlags::parse(flags).unwrap()),
            ..ResvRequest::default()
        };
        let now = b.now_ms;
        b.cmd(Command::CreateReservation { request, user: "root".into(), now })
    }

    fn node_of(b: &Bench, job: u64) -> String {
        b.state.jobs[&job].allocation.as_ref().unwrap().nodes[0].node.clone()
    }

    #[test]
    fn backfill_never_starts_a_job_that_would_run_into_a_maintenance_window() {
        let mut b = site();
        assert!(matches!(reserve(&mut b, "maint", &["n1"], 100, 50, "MAINT"), Response::Reserved { .. }));
        // A (200 s) would cross the window on n1: it starts on n2. B (50 s) ends before the
        // window: it starts on n1. C (101 s) would cross it from 50 on: n1 only after it.
        let a = b.submit(1, 200);
        let bb = b.submit(1, 50);
        let c = b.submit(1, 101);
        let plan = b.cycle();
        assert_eq!((node_of(&b, a), node_of(&b, bb)), ("n2".to_string(), "n1".to_string()));
        assert_eq!(plan.reason(c), Some(PendingReason::ReservedForMaintenance));
        assert_eq!(PendingReason::ReservedForMaintenance.name(), "ReqNodeNotAvail, Reserved for maintenance");
        let e = &plan.estimates[&c];
        assert_eq!((e.start_ms, e.nodes.clone()), (T0 + 150_000, vec!["n1".to_string()]), "after the window");
        // B ends at 50: C still does not start on n1, whose window comes at 100.
        b.at(50);
        b.end(bb);
        let plan = b.cycle();
        assert_eq!(b.state.jobs[&c].state, JobState::Pending, "{plan:?}");
        // After the window it starts there.
        b.at(150);
        b.cycle();
        assert_eq!(b.state.jobs[&c].state, JobState::Running);
        assert_eq!(node_of(&b, c), "n1");
    }

    /// FLEX: a reservation's job may start before its window, run past its end, and use a node
    /// outside it; jobs outside it still keep off its node over its window.
    #[test]
    fn a_flex_reservations_jobs_run_before_after_and_beside_it() {
        let mut b = site();
        assert!(matches!(reserve(&mut b, "r", &["n2"], 60, 60, "FLEX"), Response::Reserved { .. }));
        let flex = |b: &mut Bench, limit: u64| {
            b.submit_with("alice", |s| {
                s.reservation = Some("r".into());
                s.time_limit_s = Some(limit);
            })
        };
        // Before the window, two jobs of the reservation start at once, one on its node and
        // one beside it, and their limits are not cut at the window's end.
        let early = flex(&mut b, 100);
        let second = flex(&mut b, 200);
        let plan = b.cycle();
        assert_eq!(plan.starts.len(), 2, "{plan:?}");
        let on: Vec<String> = [early, second].iter().map(|j| node_of(&b, *j)).collect();
        assert!(on.contains(&"n1".to_string()) && on.contains(&"n2".to_string()), "one beside it: {on:?}");
        assert_eq!(b.state.jobs[&second].limit_from_start_s(), Some(200), "runs past the window's end (120)");
        // A job outside the reservation does not start on n2 across its window, even when free.
        b.at(10);
        let n2_job = if node_of(&b, early) == "n2" { early } else { second };
        b.end(n2_job);
        let outside = b.submit(1, 100);
        let plan = b.cycle();
        assert_eq!(b.state.jobs[&outside].state, JobState::Pending, "{plan:?}");
        assert_eq!(plan.reason(outside), Some(PendingReason::ReservedForOthers));
        // Without FLEX the same job waits for the window and stops at its end.
        let mut plain = site();
        assert!(matches!(reserve(&mut plain, "r", &["n2"], 60, 60, ""), Response::Reserved { .. }));
        let waits = flex(&mut plain, 100);
        let plan = plain.cycle();
        assert_eq!(plan.reason(waits), Some(PendingReason::Reservation));
    }

    #[test]
    fn a_job_in_a_reservation_runs_only_inside_it_and_stops_at_its_end() {
        let mut b = site();
        assert!(matches!(reserve(&mut b, "r", &["n2"], 60, 60, ""), Response::Reserved { .. }));
        let inside = b.submit_with("alice", |s| {
            s.reservation = Some("r".into());
            s.time_limit_s = Some(100);
        });
        // Jobs outside it start now on n2 only if they end by 60, when it begins.
        let long = b.submit(1, 61);
        let short = b.submit(1, 60);
        let plan = b.cycle();
        assert_eq!(plan.reason(inside), Some(PendingReason::Reservation));
        assert_eq!(plan.estimates[&inside].start_ms, T0 + 60_000);
        assert_eq!(plan.estimates[&inside].nodes, vec!["n2".to_string()]);
        assert_eq!(node_of(&b, short), "n2", "ends as the window opens");
        assert_eq!(node_of(&b, long), "n1");
        b.at(60);
        b.end(short);
        b.cycle();
        let j = &b.state.jobs[&inside];
        assert_eq!((j.state, node_of(&b, inside)), (JobState::Running, "n2".to_string()));
        // Its limit (100 s) is cut at the window's end (120).
        assert_eq!(j.limit_from_start_s(), Some(60));
        // The window ends 30 s later: so does the job (and the scheduler's view sees it).
        let request = ResvRequest { name: "r".into(), end: Some(ResvEnd::At(T0 + 150_000)), ..ResvRequest::default() };
        let now = b.now_ms;
        let r = b.cmd(Command::UpdateReservation { request, user: "root".into(), now });
        assert!(matches!(r, Response::Reserved { .. }), "{r:?}");
        assert_eq!(b.state.jobs[&inside].limit_from_start_s(), Some(90));
        b.cycle();
        // A job outside it waits for n2 until the window ends, and says why.
        let other = b.submit(1, 10);
        let plan = b.cycle();
        assert_eq!(plan.reason(other), Some(PendingReason::ReservedForOthers));
    }

    #[test]
    fn reservations_refuse_overlaps_busy_nodes_strangers_and_deleting_one_in_use() {
        let mut b = site();
        let running = b.submit(1, 1000);
        b.cycle();
        let busy = node_of(&b, running);
        let r = reserve(&mut b, "r1", &[busy.as_str()], 10, 60, "");
        assert!(format!("{r:?}").contains("is busy: job 1"), "{r:?}");
        assert!(matches!(reserve(&mut b, "r1", &[busy.as_str()], 10, 60, "IGNORE_JOBS"), Response::Reserved { .. }));
        let r = reserve(&mut b, "r2", &["n1", "n2"], 50, 60, "IGNORE_JOBS");
        assert!(format!("{r:?}").contains("overlaps reservation 'r1'"), "{r:?}");
        assert!(matches!(reserve(&mut b, "m", &["n1", "n2"], 50, 60, "MAINT,IGNORE_JOBS"), Response::Reserved { .. }));
        // A node count takes the nodes free over the window.
        let request = ResvRequest {
            name: "count".into(),
            start_ms: Some(T0 + 500_000),
            end: Some(ResvEnd::After(10)),
            node_count: Some(2),
            users: Some(vec!["bob".into()]),
            ..ResvRequest::default()
        };
        let now = b.now_ms;
        let r = b.cmd(Command::CreateReservation { request: request.clone(), user: "root".into(), now });
        assert!(format!("{r:?}").contains("only 1 of the 2 nodes"), "{r:?}");
        let r = b.cmd(Command::CreateReservation { request, user: "alice".into(), now });
        assert!(format!("{r:?}").contains("OperatorOnly"), "{r:?}");
        // Only its users (or accounts) get in; a job in it keeps it from being deleted.
        let mut spec = quorum_state::testing::spec(&["true"]);
        spec.reservation = Some("r1".into());
        let stranger =
            b.cmd(Command::SubmitJob { spec: Box::new(spec), user: "carol".into(), now, request_id: "x".into() });
        assert!(format!("{stranger:?}").contains("access denied"), "{stranger:?}");
        b.submit_with("alice", |s| s.reservation = Some("r1".into()));
        let r = b.cmd(Command::DeleteReservation { name: "r1".into(), user: "root".into(), now });
        assert!(format!("{r:?}").contains("in use by job"), "{r:?}");
        assert_eq!(b.cmd(Command::DeleteReservation { name: "m".into(), user: "root".into(), now }), Response::Ok);
    }
}

/// Slurm's node `Weight`: the lightest nodes that fit are allocated first, before the tightest
/// fit, for one node and for several; equal weights leave placement as it was. A DOWN or
/// INACTIVE partition starts nothing (`PartitionDown`, `PartitionInactive`).
#[test]
fn the_lightest_nodes_go_first_and_a_down_partition_starts_nothing() {
    use quorum_model::{PartitionState, PendingReason};
    use quorum_state::NodeUpdate;
    let nodes = vec![node("n1", 4, 0, "", &[]), node("n2", 4, 0, "", &[]), node("n3", 4, 0, "", &[])];
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 5));
    let on = |plan: &Plan| -> Vec<Vec<String>> {
        plan.starts
            .iter()
            .map(|s| {
                let mut names: Vec<String> = s.allocation.nodes.iter().map(|n| n.node.clone()).collect();
                names.sort();
                names
            })
            .collect()
    };
    let weigh = |b: &mut Bench, node: &str, weight: u32| {
        let update = NodeUpdate { weight: Some(weight), ..Default::default() };
        assert_eq!(b.cmd(Command::UpdateNodes { nodes: vec![node.into()], update, now: 1 }), Response::Ok);
    };
    // Equal weights: the first node of the tightest fit, as before.
    let one = b.submit(1, 600);
    let p = b.cycle();
    assert_eq!(on(&p), vec![vec!["n1".to_string()]]);
    b.end(one);
    weigh(&mut b, "n1", 10);
    weigh(&mut b, "n2", 5);
    let one = b.submit(1, 600);
    let p = b.cycle();
    assert_eq!(on(&p), vec![vec!["n3".to_string()]], "the lightest, not the first");
    b.end(one);
    let two = b.submit(2, 600);
    let p = b.cycle();
    assert_eq!(on(&p), vec![vec!["n2".to_string(), "n3".to_string()]], "the two lightest");
    b.end(two);
    for (state, reason) in [
        (PartitionState::Down, PendingReason::PartitionDown),
        (PartitionState::Inactive, PendingReason::PartitionInactive),
    ] {
        let set = |b: &mut Bench, state: PartitionState| {
            let previous = b.state.partitions["batch"].clone();
            let partition = quorum_model::Partition { state, ..previous.clone() };
            assert_eq!(b.cmd(Command::PutPartition { partition, previous: Some(previous), now: 2 }), Response::Ok);
        };
        // Submitted while DOWN (which takes jobs), then put in the state under test.
        set(&mut b, PartitionState::Down);
        let waiting = b.submit(1, 600);
        set(&mut b, state);
        let p = b.cycle();
        assert!(p.starts.is_empty());
        assert_eq!(p.reason(waiting), Some(reason));
        b.cmd(Command::CancelJob { job_id: waiting, user: "root".into(), now: 3, whole_array: false });
    }
}

/// What an ended job still holds on a node while its rank there is killed (`Node::completing`)
/// is not planned for anyone: neither its GPU nor, for an exclusive job, the node. Planned free
/// in a second, it is taken once the node's agent reports the rank gone.
#[test]
fn a_nodes_share_held_by_an_ended_job_is_planned_for_nobody_until_released() {
    let mut b = Bench::new(vec![node("n1", 4, 1, "h100", &[])], fifo(BackfillMode::Easy, 1));
    let versions =
        BTreeMap::from([(1, quorum_state::ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "t".into() })]);
    b.cmd(Command::SetReplicaVersions { versions, now: 0 });
    let first = b.submit_with("alice", |s| (s.gpus_per_node, s.requeue) = (1, true));
    b.cycle();
    let token = b.state.jobs[&first].alloc_index;
    // Requeued by its owner: the agent is told to kill it, and holds its GPU until it is gone.
    let requeue = Command::RequeueJob { job_id: first, user: "alice".into(), now: b.now_ms };
    assert_eq!(b.cmd(requeue), Response::Requeued { job_id: first });
    let gpu = b.submit_with("bob", |s| s.gpus_per_node = 1);
    let whole = b.submit_with("carol", |s| s.exclusive = true);
    let plan = b.cycle();
    assert!(plan.starts.is_empty(), "nothing fits beside the ended job's share: {:?}", plan.starts);
    let view = ClusterView::from_state(&b.state);
    assert_eq!(view.nodes[0].completing, Res { cpus: 1, mem: 100, gpus: 1 });
    let killed = quorum_model::RankOutcome::Cancelled { code: 0, signal: 9 };
    let now = b.now_ms;
    b.cmd(Command::JobEnded { job_id: first, token, node: "n1".into(), outcome: killed, now });
    let started: Vec<u64> = b.cycle().starts.iter().map(|s| s.job_id).collect();
    assert_eq!(started, vec![first], "the first in line takes the GPU back: {started:?} (then {gpu}, {whole})");
}

/// A cycle made from what the last ones kept (`Bench::cycle` compares it with one made from
/// nothing) follows a change of the weights: the kept priority terms are of the old ones.
#[test]
fn kept_priorities_follow_a_change_of_the_weights() {
    let weights = quorum_model::Weights { age: 0, fairshare: 0, job_size: 1000, partition: 0, qos: 0 };
    let policy = Policy { ordering: QueueOrder::Multifactor, weights, favor_small: true, ..Policy::default() };
    let mut b = Bench::new(vec![node("n0", 4, 0, "h100", &[])], policy.clone());
    b.at(0);
    let cpus = |b: &mut Bench, n: u32| b.submit_with("alice", |s| s.cpus_per_task = n);
    let hog = cpus(&mut b, 4);
    assert_eq!(started(&b.cycle()), vec![hog]);
    let (big, small) = (cpus(&mut b, 4), cpus(&mut b, 1));
    let order = |plan: &Plan| plan.reasons.iter().map(|(id, _)| *id).collect::<Vec<u64>>();
    assert_eq!(order(&b.cycle()), vec![small, big], "the small job first");
    // Once more, their reasons written: the same view entries, the kept terms in use.
    assert_eq!(order(&b.cycle()), vec![small, big]);
    b.cmd(Command::SetPolicy { policy: Policy { favor_small: false, ..policy }, now: 0 });
    assert_eq!(order(&b.cycle()), vec![big, small], "the big job first");
}

/// A job's nodes are listed as a hostlist lists them (`n2` before `n10`), whichever fit best, as
/// Slurm keeps a job's nodes in its node table's order: the script runs on the first, and `srun`
/// numbers block-distributed tasks along them as `mpirun` does from the node list.
#[test]
fn a_jobs_nodes_are_in_hostlist_order_not_best_fit_order() {
    let nodes = vec![node("n1", 4, 0, "", &[]), node("n2", 2, 0, "", &[]), node("n10", 2, 0, "", &[])];
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 1));
    let job = b.submit_with("alice", |s| {
        s.nodes = 3;
        s.ntasks = 3;
        s.cpus_per_task = 2;
    });
    let p = b.cycle();
    assert_eq!(started(&p), vec![job]);
    let names: Vec<&str> = p.starts[0].allocation.nodes.iter().map(|n| n.node.as_str()).collect();
    // Best fit takes n2 and n10 (nothing left over) before n1.
    assert_eq!(names, ["n1", "n2", "n10"]);
    let list = quorum_model::hostlist::compress(&names);
    assert_eq!(quorum_model::hostlist::expand(&list).unwrap(), names, "{list}");
}
