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
