//! Fairshare down to users, and the limits of feature level 20 (`MaxTRESPerJob`,
//! `MaxTRESPerUser`, QOS `GrpTRES` and `GrpJobs`, `GrpTRESMins`, `MaxSubmitJobs`), through the
//! real state machine and scheduler.

use std::collections::BTreeMap;

use super::tests::{fifo, node, started, ten_nodes, Bench};
use super::*;
use quorum_model::{Account, JobSpec, PendingReason, Qos, Rejection, TresLimit, TresMins};
use quorum_state::{Command, ReplicaVersion, Response, FEATURE_LEVEL};

fn at_level_20(b: &mut Bench) {
    let versions = BTreeMap::from([(1, ReplicaVersion { level: FEATURE_LEVEL, version: "t".into() })]);
    b.cmd(Command::SetReplicaVersions { versions, now: 0 });
}

fn account(name: &str, users: &[&str], f: impl FnOnce(&mut Account)) -> Account {
    let mut a = Account {
        name: name.into(),
        shares: 1,
        users: users.iter().map(|u| u.to_string()).collect(),
        ..Default::default()
    };
    f(&mut a);
    a
}

fn qos(name: &str, f: impl FnOnce(&mut Qos)) -> Qos {
    let mut q = Qos { name: name.into(), ..Default::default() };
    f(&mut q);
    q
}

fn wide(s: &mut JobSpec) {
    (s.nodes, s.ntasks) = (10, 10);
}

fn one_node_for(limit_s: u64) -> impl FnOnce(&mut JobSpec) {
    move |s: &mut JobSpec| s.time_limit_s = Some(limit_s)
}

/// Two users of one account no longer get the same factor: the one who used the account's
/// share ranks below the one who did not, and among users with the same usage the one with
/// more shares ranks higher. Below level 20 nothing is charged by user.
#[test]
fn fairshare_goes_down_to_users_by_their_shares_and_usage() {
    let policy = Policy { half_life_s: 3600, ..Policy::default() };
    let lab = account("lab", &["hana", "lee", "kim"], |a| a.user_shares = [("kim".to_string(), 2)].into());
    let mut b = Bench::new(ten_nodes(), policy.clone());
    at_level_20(&mut b);
    b.cmd(Command::SeedAccounts { accounts: vec![lab.clone()], qos: vec![], now: 0 });
    b.at(0);
    // hana holds the whole cluster for an hour; lee and kim one node for ten minutes each.
    let hog = b.submit_with("hana", |s| {
        wide(s);
        s.time_limit_s = Some(7200)
    });
    b.cycle();
    b.at(3600);
    b.end(hog);
    let small: Vec<u64> = ["lee", "kim"].iter().map(|u| b.submit_with(u, one_node_for(600))).collect();
    assert_eq!(started(&b.cycle()), small);
    b.at(4200);
    for j in small {
        b.end(j);
    }
    let charged = &b.state.user_usage["lab"];
    assert!((charged["hana"].value - 36_000.0).abs() < 1.0, "{charged:?}");
    assert!((charged["lee"].value - charged["kim"].value).abs() < 1e-9, "{charged:?}");

    let view = ClusterView::from_state(&b.state);
    let shares = priority::fairshare(&view, b.now_ms, &policy);
    let users = &priority::user_fairshare(&view, &shares, b.now_ms, &policy)["lab"];
    let (hana, lee, kim) = (&users.users["hana"], &users.users["lee"], &users.users["kim"]);
    // Shares 1, 1 and 2 of the account's whole (the cluster's only account).
    assert_eq!((hana.norm_shares, lee.norm_shares, kim.norm_shares), (0.25, 0.25, 0.5));
    assert!(hana.fairshare < lee.fairshare && lee.fairshare < kim.fairshare, "{users:?}");
    // Someone not listed (root charging the account) counts as one more user with no usage.
    assert!(users.newcomer > hana.fairshare && users.newcomer <= 1.0);

    // The factor orders the queue: lee's whole-cluster job runs before hana's, submitted first.
    let h = b.submit_with("hana", wide);
    let l = b.submit_with("lee", wide);
    let f = priority::breakdown(&ClusterView::from_state(&b.state), b.now_ms, &policy);
    assert!(f[&l].fairshare > f[&h].fairshare, "{:?} vs {:?}", f[&l], f[&h]);
    assert_eq!(started(&b.cycle()), vec![l]);

    // Below level 20 every replica keeps the state it always kept: usage by account only,
    // and the users of an account share its factor.
    let mut old = Bench::new(ten_nodes(), policy.clone());
    old.cmd(Command::SeedAccounts { accounts: vec![lab], qos: vec![], now: 0 });
    old.at(0);
    let hog = old.submit_with("hana", wide);
    old.cycle();
    old.at(100);
    old.end(hog);
    assert!(old.state.user_usage.is_empty() && old.state.qos_usage.is_empty());
    assert!(old.state.usage["lab"].cpu_s == 0.0, "no TRES-seconds below level 20");
    let (h, l) = (old.submit_with("hana", wide), old.submit_with("lee", wide));
    let f = priority::breakdown(&ClusterView::from_state(&old.state), old.now_ms, &policy);
    assert_eq!(f[&h].fairshare, f[&l].fairshare);
}

/// What one job may ask for (QOS and account `MaxTRESPerJob`), what one user's running jobs may
/// hold (`MaxTRESPerUser`), and what a whole QOS may run (`GrpJobs`, `GrpTRES`), each with
/// Slurm's reason.
#[test]
fn per_job_per_user_and_qos_group_limits_give_their_reasons() {
    let nodes: Vec<_> = (1..=4).map(|i| node(&format!("g{i}"), 8, 4, "h100", &[])).collect();
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 1));
    at_level_20(&mut b);
    let lab = account("lab", &["alice", "bob"], |a| a.limits.max_tres_per_job.gpus = Some(2));
    let limit = |f: &dyn Fn(&mut TresLimit)| {
        let mut t = TresLimit::default();
        f(&mut t);
        t
    };
    let all = vec![
        qos("normal", |q| q.max_tres_per_job = limit(&|t| (t.cpus, t.mem_mb) = (Some(8), Some(4096)))),
        qos("small", |q| q.max_tres_per_user = limit(&|t| t.nodes = Some(2))),
        qos("team", |q| q.grp_jobs = Some(2)),
        qos("gpuq", |q| q.grp_tres = limit(&|t| t.gpus = Some(4))),
    ];
    b.cmd(Command::SeedAccounts { accounts: vec![lab], qos: all, now: 0 });
    b.at(0);
    let in_qos = |name: &'static str| move |s: &mut JobSpec| s.qos = Some(name.into());
    let cpus = b.submit_with("alice", |s| (s.nodes, s.ntasks, s.cpus_per_task) = (2, 2, 8));
    let mem = b.submit_with("alice", |s| s.mem_per_node_mb = Some(8192));
    let gpus = b.submit_with("alice", |s| s.gpus_per_node = 3);
    let fits = b.submit_with("alice", |s| s.gpus_per_node = 2);
    let small: Vec<u64> = (0..3).map(|_| b.submit_with("bob", in_qos("small"))).collect();
    let team: Vec<u64> = ["alice", "bob", "alice"].iter().map(|u| b.submit_with(u, in_qos("team"))).collect();
    let gpuq: Vec<u64> = [("alice", 2), ("bob", 2), ("alice", 1)]
        .iter()
        .map(|(u, n)| {
            b.submit_with(u, |s| {
                s.qos = Some("gpuq".into());
                s.gpus_per_node = *n
            })
        })
        .collect();
    let p = b.cycle();
    assert_eq!(p.reason(cpus), Some(PendingReason::QOSMaxCpuPerJobLimit));
    assert_eq!(p.reason(mem), Some(PendingReason::QOSMaxMemoryPerJob));
    assert_eq!(p.reason(gpus), Some(PendingReason::AssocMaxGRESPerJob), "the account allows two GPUs a job");
    assert_eq!(p.reason(small[2]), Some(PendingReason::QOSMaxNodePerUserLimit), "bob holds two nodes in it");
    assert_eq!(p.reason(team[2]), Some(PendingReason::QOSGrpJobsLimit), "two jobs of any user");
    assert_eq!(p.reason(gpuq[2]), Some(PendingReason::QOSGrpGRES), "four GPUs between alice and bob");
    let mut want = vec![fits, small[0], small[1], team[0], team[1], gpuq[0], gpuq[1]];
    want.sort();
    let mut got = started(&p);
    got.sort();
    assert_eq!(got, want);
    // When one ends, the next of that QOS may start.
    b.at(10);
    b.end(team[0]);
    b.end(small[0]);
    let p = b.cycle();
    let mut got = started(&p);
    got.sort();
    assert_eq!(got, vec![small[2], team[2]]);
}

/// A budget of CPU-minutes (`GrpTRESMins`) counts decayed charged usage and what running jobs
/// have used so far; once spent, no new job of the account starts until usage decays below it.
/// A QOS with `NoDecay` stays spent.
#[test]
fn a_budget_of_cpu_minutes_stops_new_starts_until_usage_decays() {
    let policy = Policy { half_life_s: 3600, ..fifo(BackfillMode::Easy, 1) };
    let mut b = Bench::new(ten_nodes(), policy);
    at_level_20(&mut b);
    let lab = account("lab", &["alice"], |a| a.limits.grp_tres_mins = TresMins { cpu: Some(20), gpu: None });
    let ops = account("ops", &["olga"], |_| {});
    let fixed = qos("fixed", |q| {
        q.grp_tres_mins = TresMins { cpu: Some(5), gpu: None };
        q.no_decay = true
    });
    b.cmd(Command::SeedAccounts { accounts: vec![lab, ops], qos: vec![qos("normal", |_| {}), fixed], now: 0 });
    b.at(0);
    let a = b.submit_with("alice", |s| {
        (s.nodes, s.ntasks) = (2, 2);
        s.time_limit_s = Some(3600)
    });
    let d = b.submit_with("olga", |s| {
        s.qos = Some("fixed".into());
        s.time_limit_s = Some(3600)
    });
    assert_eq!(started(&b.cycle()), vec![a, d]);
    // Ten CPU-minutes in: half the budget.
    b.at(300);
    let b1 = b.submit_with("alice", one_node_for(3600));
    assert_eq!(started(&b.cycle()), vec![b1]);
    // Twenty-five minutes used (a's 20 and b1's 5) while both still run: spent.
    b.at(600);
    let c = b.submit_with("alice", one_node_for(60));
    let e = b.submit_with("olga", |s| s.qos = Some("fixed".into()));
    let p = b.cycle();
    assert_eq!(p.reason(c), Some(PendingReason::AssocGrpCPUMinutesLimit));
    assert_eq!(p.reason(e), Some(PendingReason::QOSGrpCPUMinutesLimit), "olga's job used ten of five minutes");
    for j in [a, b1, d] {
        b.end(j);
    }
    let charged = &b.state.usage["lab"];
    assert!((charged.cpu_s - 1500.0).abs() < 1e-6, "{charged:?}");
    assert_eq!(b.cycle().reason(c), Some(PendingReason::AssocGrpCPUMinutesLimit), "ended, still charged");
    // Two half-lives later a quarter is left (6.25 minutes): c starts; the NoDecay QOS is
    // still spent.
    b.at(600 + 7200);
    let p = b.cycle();
    assert_eq!(started(&p), vec![c]);
    assert_eq!(p.reason(e), Some(PendingReason::QOSGrpCPUMinutesLimit));
}

fn submit(b: &mut Bench, user: &str, account: &str, array: Option<&str>) -> Response {
    let now = b.now_ms;
    let spec = JobSpec {
        name: "j".into(),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        account: Some(account.into()),
        array: array.map(|a| quorum_model::ArraySpec::parse(a).unwrap()),
        program: quorum_model::Program::Argv(vec!["true".into()]),
        work_dir: "/tmp".into(),
        submit_dir: "/tmp".into(),
        ..Default::default()
    };
    b.cmd(Command::SubmitJob { spec: Box::new(spec), user: user.into(), now, request_id: String::new() })
}

/// `MaxSubmitJobs` of an account holds for each of its users, in it and in its sub-accounts
/// (which inherit it); an array counts its tasks; the QOS's `MaxSubmitJobsPerUser` counts a
/// user's jobs in that QOS. A refused submit says which limit, and takes nothing.
#[test]
fn max_submit_jobs_refuses_the_submit_past_it() {
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Easy, 1));
    let lab = account("lab", &["alice", "bob"], |a| a.limits.max_submit_jobs = Some(3));
    let sub = account("lab-sub", &["alice"], |a| a.parent = Some("lab".into()));
    let big = account("big", &["carl"], |_| {});
    let normal = qos("normal", |q| q.max_submit_jobs_per_user = Some(5));
    let seed = Command::SeedAccounts { accounts: vec![lab, sub, big], qos: vec![normal], now: 0 };
    assert_eq!(seed.level().0, quorum_state::USER_SHARES_LEVEL, "older replicas would drop the limits");
    b.cmd(seed);
    // Below level 20 the limits are not enforced (older replicas would not refuse).
    assert!(matches!(submit(&mut b, "alice", "lab", Some("0-9")), Response::Submitted { .. }));
    let mut b = Bench::new(ten_nodes(), fifo(BackfillMode::Easy, 1));
    at_level_20(&mut b);
    b.cmd(Command::SeedAccounts {
        accounts: vec![
            account("lab", &["alice", "bob"], |a| a.limits.max_submit_jobs = Some(3)),
            account("lab-sub", &["alice"], |a| a.parent = Some("lab".into())),
            account("big", &["carl"], |_| {}),
        ],
        qos: vec![qos("normal", |q| q.max_submit_jobs_per_user = Some(8))],
        now: 0,
    });
    let first = submit(&mut b, "alice", "lab", Some("0-1"));
    assert!(matches!(first, Response::Submitted { .. }), "{first:?}");
    let r = submit(&mut b, "alice", "lab", Some("0-1"));
    match r {
        Response::Rejected(Rejection::SubmitLimit { ref limit, have: 2, .. }) => {
            assert!(limit.contains("MaxSubmitJobs=3 of account 'lab'"), "{limit}")
        }
        other => panic!("expected the array refused: {other:?}"),
    }
    let jobs = b.state.jobs.len();
    assert!(matches!(submit(&mut b, "alice", "lab", None), Response::Submitted { .. }));
    assert!(matches!(submit(&mut b, "alice", "lab", None), Response::Rejected(Rejection::SubmitLimit { .. })));
    assert_eq!(b.state.jobs.len(), jobs + 1, "a refused submit takes no job id");
    // Each user has their own three; a sub-account inherits the limit.
    assert!(matches!(submit(&mut b, "bob", "lab", None), Response::Submitted { .. }));
    for _ in 0..3 {
        assert!(matches!(submit(&mut b, "alice", "lab-sub", None), Response::Submitted { .. }));
    }
    let r = submit(&mut b, "alice", "lab-sub", None);
    assert!(
        matches!(r, Response::Rejected(Rejection::SubmitLimit { ref limit, .. }) if limit.contains("'lab'")),
        "{r:?}"
    );
    // The QOS's limit per user, whatever the account.
    for _ in 0..8 {
        assert!(matches!(submit(&mut b, "carl", "big", None), Response::Submitted { .. }));
    }
    let r = submit(&mut b, "carl", "big", None);
    let Response::Rejected(rejection) = r else { panic!("{r:?}") };
    assert_eq!(
        rejection.to_string(),
        "job violates accounting/QOS policy: MaxSubmitJobsPerUser=8 of QOS 'normal' (user 'carl' has 8 jobs pending or running)"
    );
    // Moving a pending job into a full account is refused as its submit would be; changing
    // anything else of a job in a full account is not.
    for _ in 0..2 {
        let bobs = submit(&mut b, "bob", "lab", None);
        assert!(matches!(bobs, Response::Submitted { .. }), "bob's second and third: {bobs:?}");
    }
    b.cmd(Command::UpsertAccount { account: account("lab-b", &["bob"], |_| {}), now: 0 });
    let Response::Submitted { job_id: elsewhere, .. } = submit(&mut b, "bob", "lab-b", None) else { panic!() };
    let into = |account: &str| quorum_model::update::JobUpdate { account: Some(account.into()), ..Default::default() };
    let moved = b.cmd(Command::UpdateJob { job_id: elsewhere, user: "bob".into(), update: into("lab"), now: 0 });
    assert!(matches!(moved, Response::Rejected(Rejection::SubmitLimit { have: 3, .. })), "{moved:?}");
    let in_lab = b.state.jobs.values().find(|j| j.user == "bob" && j.account == "lab").map(|j| j.id).unwrap();
    let renamed = quorum_model::update::JobUpdate { name: Some("renamed".into()), ..into("lab") };
    let r = b.cmd(Command::UpdateJob { job_id: in_lab, user: "bob".into(), update: renamed, now: 0 });
    assert!(!matches!(r, Response::Rejected(_)), "{r:?}");
    // A job that ends frees its place.
    b.at(0);
    let p = b.cycle();
    let carls: Vec<u64> = b.state.jobs.values().filter(|j| j.user == "carl").map(|j| j.id).collect();
    assert!(started(&p).contains(&carls[0]));
    b.end(carls[0]);
    assert!(matches!(submit(&mut b, "carl", "big", None), Response::Submitted { .. }));
}
