//! What the cluster holds at once (`MaxJobCount`, `MaxArraySize`, the default per-user
//! `MaxSubmitJobs`) and which QOS a user may use (feature level 27), through apply.

use std::collections::BTreeMap;

use crate::testing::{cluster, spec};
use crate::*;
use quorum_model::*;

fn at_level(s: &mut ClusterState, level: u32) {
    let versions = BTreeMap::from([(1, ReplicaVersion { level, version: "t".into() })]);
    apply(s, 4, Command::SetReplicaVersions { versions, now: 4 });
}

fn limited(queue: QueueLimits) -> ClusterState {
    let mut s = cluster();
    at_level(&mut s, QUEUE_LIMITS_LEVEL);
    apply(&mut s, 5, Command::SetPolicy { policy: Policy { queue, ..Policy::default() }, now: 5 });
    s
}

fn submit_as(s: &mut ClusterState, user: &str, array: Option<&str>) -> Response {
    let mut sp = spec(&["true"]);
    sp.hold = true;
    sp.array = array.map(|a| ArraySpec::parse(a).unwrap());
    let index = 100 + s.next_job_id;
    apply(s, index, Command::SubmitJob { spec: Box::new(sp), user: user.into(), now: 1000, request_id: String::new() })
}

fn refusal(r: Response) -> String {
    match r {
        Response::Rejected(r) => r.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn an_array_past_max_array_size_is_refused_by_name() {
    let mut s = limited(QueueLimits { max_array_size: Some(1001), ..Default::default() });
    let said = refusal(submit_as(&mut s, "mallory", Some("0-99999")));
    assert!(
        said.contains("task id 99999 is not below this cluster's MaxArraySize=1001 (task ids 0 to 1000)"),
        "{said}"
    );
    assert!(matches!(submit_as(&mut s, "mallory", Some("0-1000")), Response::Submitted { .. }));
    assert!(refusal(submit_as(&mut s, "mallory", Some("5,1001"))).contains("task id 1001"));
    assert_eq!(s.active.len(), 1001);
}

#[test]
fn a_user_past_the_default_cap_is_refused_and_room_comes_back_as_jobs_end() {
    let mut s = limited(QueueLimits { max_submit_jobs_per_user: Some(5), ..Default::default() });
    assert!(matches!(submit_as(&mut s, "mallory", Some("0-3")), Response::Submitted { .. }));
    assert!(matches!(submit_as(&mut s, "mallory", None), Response::Submitted { .. }));
    let said = refusal(submit_as(&mut s, "mallory", None));
    assert!(said.contains("MaxSubmitJobs=5 per user of this cluster (user 'mallory' has 5 jobs"), "{said}");
    // Others are not held back by mallory's jobs.
    assert!(matches!(submit_as(&mut s, "alice", Some("0-4")), Response::Submitted { .. }));
    // A cancelled job makes room; the count survives a snapshot.
    let first = *s.active.iter().next().unwrap();
    apply(&mut s, 900, Command::CancelJob { job_id: first, user: "root".into(), now: 2000, whole_array: false });
    assert_eq!(s.active_by_user.of("mallory"), 4);
    let mut decoded = snapshot::decode(&snapshot::encode(&s).unwrap()).unwrap();
    assert_eq!(decoded.active_by_user.of("mallory"), 4);
    assert_eq!(decoded.active_by_user.of("alice"), 5);
    assert!(matches!(submit_as(&mut decoded, "mallory", None), Response::Submitted { .. }));
    assert!(refusal(submit_as(&mut decoded, "mallory", None)).contains("MaxSubmitJobs=5"));
}

#[test]
fn the_cluster_past_max_job_count_refuses_everyone() {
    let mut s = limited(QueueLimits { max_job_count: Some(6), ..Default::default() });
    assert!(matches!(submit_as(&mut s, "alice", Some("0-3")), Response::Submitted { .. }));
    let said = refusal(submit_as(&mut s, "bob", Some("0-2")));
    assert!(said.contains("it holds 4 jobs pending or running and 3 more would pass its MaxJobCount=6"), "{said}");
    assert!(matches!(submit_as(&mut s, "bob", Some("0-1")), Response::Submitted { .. }));
    assert!(refusal(submit_as(&mut s, "root", None)).contains("MaxJobCount=6"));
    assert_eq!(s.active.len(), 6, "nothing accepted is lost");
}

#[test]
fn the_default_qos_stays_when_qos_are_defined_and_accounts_say_who_uses_which() {
    let mut s = cluster();
    at_level(&mut s, QOS_ACCESS_LEVEL);
    let vip = Qos { name: "vip".into(), priority: 10, ..Default::default() };
    let account = |name: &str, users: &[&str], qos: &[&str], default: Option<&str>| Account {
        name: name.into(),
        parent: (name != "root").then(|| "root".into()),
        shares: 1,
        users: users.iter().map(|u| u.to_string()).collect(),
        qos: qos.iter().map(|q| q.to_string()).collect(),
        default_qos: default.map(str::to_string),
        ..Default::default()
    };
    apply(&mut s, 5, Command::SeedAccounts { accounts: vec![], qos: vec![vip], now: 5 });
    // The first QOS defined does not take `normal` away.
    let Response::Submitted { job_id, .. } = submit_as(&mut s, "mallory", None) else { panic!() };
    assert_eq!(s.jobs[&job_id].qos, "normal");
    // Who may name which: without accounts, the default QOS alone.
    assert!(qos_access::check(&s, "mallory", None, Some("vip")).unwrap_err().to_string().contains("allowed: normal"));
    qos_access::check(&s, "mallory", None, Some("normal")).unwrap();
    qos_access::check(&s, "mallory", None, None).unwrap();
    let accounts = vec![
        account("root", &[], &[], None),
        account("lab", &["alice"], &["normal", "vip"], Some("vip")),
        account("sub", &["bob"], &[], None),
        account("other", &["mallory"], &[], None),
    ];
    for (i, mut a) in accounts.into_iter().enumerate() {
        if a.name == "sub" {
            a.parent = Some("lab".into());
        }
        apply(&mut s, 10 + i as u64, Command::UpsertAccount { account: a, now: 10 });
    }
    qos_access::check(&s, "alice", None, Some("vip")).unwrap();
    qos_access::check(&s, "bob", None, Some("vip")).expect("a sub-account inherits its parent's list");
    let said = qos_access::check(&s, "mallory", Some("other"), Some("vip")).unwrap_err().to_string();
    assert!(said.contains("user 'mallory' may not use QOS 'vip' (allowed: normal)"), "{said}");
    // A job that names no QOS gets its account's default, inherited.
    let Response::Submitted { job_id, .. } = submit_as(&mut s, "bob", None) else { panic!() };
    assert_eq!(s.jobs[&job_id].qos, "vip");
    // Below level 27 nothing of it holds: replicas agree with older ones.
    let mut old = cluster();
    at_level(&mut old, QOS_ACCESS_LEVEL - 1);
    apply(
        &mut old,
        5,
        Command::SeedAccounts { accounts: vec![], qos: vec![Qos { name: "vip".into(), ..Default::default() }], now: 5 },
    );
    assert!(refusal(submit_as(&mut old, "mallory", None)).contains("normal"));
    qos_access::check(&old, "mallory", None, Some("vip")).unwrap();
}

#[test]
fn queue_limits_and_account_qos_lists_wait_for_level_27() {
    let policy = Policy { queue: QueueLimits { max_job_count: Some(1), ..Default::default() }, ..Policy::default() };
    assert_eq!(Command::SetPolicy { policy, now: 0 }.level().0, QUEUE_LIMITS_LEVEL);
    assert_eq!(Command::SetPolicy { policy: Policy::default(), now: 0 }.level().0, BASE_LEVEL);
    let account = Account { name: "a".into(), qos: vec!["vip".into()], ..Default::default() };
    assert_eq!(Command::UpsertAccount { account, now: 0 }.level().0, QOS_ACCESS_LEVEL);
}

/// A plan made while a job was pending and unheld, applied after a hold of it was acknowledged,
/// starts nothing of it (from level 33; before, the held job started: found by the simulator).
#[test]
fn a_plan_does_not_start_a_job_held_since_it_was_made() {
    for (level, starts) in [(HOLD_FENCE_LEVEL, false), (HOLD_FENCE_LEVEL - 1, true)] {
        let mut s = cluster();
        at_level(&mut s, level);
        let Response::Submitted { job_id, .. } = crate::testing::submit(&mut s, 10, spec(&["true"]), "r") else {
            panic!("submitted")
        };
        let base = 10;
        let start = PlannedStart {
            job_id,
            allocation: Allocation {
                nodes: vec![NodeAllocation { node: "n1".into(), cpus: 1, mem_mb: 1024, gpus: vec![], het_group: 0 }],
                cpu_ways: None,
            },
        };
        assert_eq!(
            apply(&mut s, 11, Command::HoldJob { job_id, user: "alice".into(), now: 1011 }),
            Response::Held { job_id }
        );
        let plan = Command::apply_plan(base, 1012, vec![start], vec![], vec![], vec![]).expect("a plan");
        let Response::PlanApplied { started, dropped, .. } = apply(&mut s, 12, plan) else { panic!("applied") };
        assert_eq!(started.contains(&job_id), starts, "level {level}: {dropped:?}");
        if !starts {
            assert_eq!(dropped, vec![(job_id, DropReason::Held { job: job_id })]);
            assert_eq!(s.jobs[&job_id].state, JobState::Pending);
        }
    }
}

/// A job of two nodes ended by its first rank holds its share of the other node until that
/// node's agent reports its rank gone; a node declared DOWN holds its jobs' shares likewise
/// until its agent, back, reports them (from level 34; before, both were freed at once, and a
/// new job could share a CPU or GPU with a rank still being killed: found by the simulator).
#[test]
fn an_ended_jobs_share_of_a_node_is_held_until_its_rank_there_is_gone() {
    let on = |node: &str| NodeAllocation { node: node.into(), cpus: 2, mem_mb: 1024, gpus: vec![0], het_group: 0 };
    // Made from the state just before the entry `index` applies it.
    let plan = |index: u64, job_id: JobId, nodes: Vec<NodeAllocation>| {
        let start = PlannedStart { job_id, allocation: Allocation { nodes, cpu_ways: None } };
        Command::apply_plan(index - 1, 1000 + index, vec![start], vec![], vec![], vec![]).expect("a plan")
    };
    let ended =
        |job_id, node: &str, outcome| Command::JobEnded { job_id, token: 11, node: node.into(), outcome, now: 5000 };
    let bad = RankOutcome::Exited { code: 1, signal: 0 };
    let killed = RankOutcome::Cancelled { code: 0, signal: 9 };
    for (level, holds) in [(COMPLETING_LEVEL, true), (COMPLETING_LEVEL - 1, false)] {
        let mut s = cluster();
        at_level(&mut s, level);
        let mut two = spec(&["true"]);
        (two.nodes, two.ntasks, two.cpus_per_task, two.gpus_per_node, two.mem_per_node_mb) = (2, 2, 2, 1, Some(1024));
        let Response::Submitted { job_id, .. } = crate::testing::submit(&mut s, 10, two, "a") else { panic!() };
        let Response::PlanApplied { started, .. } = apply(&mut s, 11, plan(11, job_id, vec![on("n1"), on("n2")]))
        else {
            panic!()
        };
        assert_eq!(started, vec![job_id]);
        assert_eq!(
            apply(&mut s, 12, ended(job_id, "n1", bad)),
            Response::JobFinished { job_id, state: JobState::Failed }
        );
        let n2 = &s.nodes["n2"];
        assert_eq!((s.nodes["n1"].alloc_cpus, s.nodes["n1"].alloc_gpus.len()), (0, 0), "the rank that ended freed n1");
        assert!(n2.jobs.is_empty(), "level {level}: the job no longer runs on n2 (its rank there is a stray to kill)");
        let held = (n2.alloc_cpus, n2.alloc_gpus.len(), n2.alloc_mem_mb, n2.completing.len());
        assert_eq!(held, if holds { (2, 1, 1024, 1) } else { (0, 0, 0, 0) }, "level {level}");
        assert_eq!(n2.state() == NodeState::Idle, !holds, "level {level}: {:?}", n2.state());

        // Another job for n2's GPU 0 starts only once the rank there is gone.
        let Response::Submitted { job_id: next, .. } = crate::testing::submit(&mut s, 13, spec(&["true"]), "b") else {
            panic!()
        };
        let one = NodeAllocation { node: "n2".into(), cpus: 1, mem_mb: 1024, gpus: vec![0], het_group: 0 };
        let Response::PlanApplied { started, dropped, .. } = apply(&mut s, 14, plan(14, next, vec![one.clone()]))
        else {
            panic!()
        };
        assert_eq!(started.is_empty(), holds, "level {level}: {dropped:?}");
        if holds {
            assert_eq!(dropped, vec![(next, DropReason::GpuTaken { node: "n2".into(), gpu: 0 })]);
            // The agent's report of the killed rank (ignored for the job, which ended) frees it.
            assert_eq!(apply(&mut s, 15, ended(job_id, "n2", killed)), Response::Ignored);
            let n2 = &s.nodes["n2"];
            assert_eq!((n2.alloc_cpus, n2.alloc_gpus.len(), n2.alloc_mem_mb, n2.completing.len()), (0, 0, 0, 0));
            let Response::PlanApplied { started, .. } = apply(&mut s, 16, plan(16, next, vec![one])) else { panic!() };
            assert_eq!(started, vec![next]);
        }
    }

    // A node declared DOWN: its job's share stays until its agent reports the job's end there;
    // the leader's own report of lost contact frees nothing.
    let mut s = cluster();
    at_level(&mut s, COMPLETING_LEVEL);
    let mut one = spec(&["true"]);
    (one.cpus_per_task, one.gpus_per_node, one.mem_per_node_mb) = (2, 1, Some(1024));
    let Response::Submitted { job_id, .. } = crate::testing::submit(&mut s, 10, one, "a") else { panic!() };
    apply(&mut s, 11, plan(11, job_id, vec![on("n1")]));
    let down = Command::NodeDown { node: "n1".into(), reason: "not responding".into(), now: 3000 };
    assert_eq!(apply(&mut s, 12, down), Response::NodeDowned { ended: vec![job_id], requeued: vec![] });
    assert_eq!(apply(&mut s, 13, ended(job_id, "n1", RankOutcome::LostContact)), Response::Ignored);
    assert_eq!((s.nodes["n1"].alloc_cpus, s.nodes["n1"].completing.len()), (2, 1));
    assert_eq!(apply(&mut s, 14, ended(job_id, "n1", killed)), Response::Ignored);
    assert_eq!((s.nodes["n1"].alloc_cpus, s.nodes["n1"].alloc_gpus.len(), s.nodes["n1"].completing.len()), (0, 0, 0));
}
