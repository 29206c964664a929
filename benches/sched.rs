//! One full scheduling cycle (`sched::schedule`) at several sizes: GPU nodes with 64 CPUs and 8
//! GPUs, half of them busy with running jobs of varied remaining time, and a pending queue of
//! mixed sizes (1–8 GPUs, a tenth of them 2–4 nodes) under multifactor priority and EASY backfill.
//!
//! With `preempt`, the other half of the nodes run whole-node jobs of a scavenger partition
//! (tier 0, requeued when preempted) that the pending jobs' partition (tier 1) may preempt.
//!
//! `cargo bench --bench sched` (results in benches/RESULTS.md).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use quorum_control::model::oversubscribe::OverSubscribe;
use quorum_control::model::preempt::{PreemptMode, PreemptType};
use quorum_control::model::reservation::{Reservation, ResvFlags};
use quorum_control::model::{Account, AssocLimits, Gpu, Job, JobSpec, JobState, Node, NodeAdminState, Program, Shared};
use quorum_control::model::{BackfillMode, BackfillOrder, Policy};
use quorum_control::model::{Qos, TresLimit, TresMins, Usage};
use quorum_sched::view::{DepStatus, Name, PartitionView, RunningJob};
use quorum_sched::{schedule, schedule_with, ClusterView, CycleCache, NodeView, PendingJob, Plan, Res};
use quorum_state::ClusterState;

/// A small deterministic generator, so every run schedules the same cluster.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub const NOW_MS: u64 = 1_800_000_000_000;

/// A job of `partition` holding all of node `i` (id `base + i`).
fn whole_node_job(base: u64, i: usize, partition: &str, start_s: u64, end_s: u64) -> RunningJob {
    RunningJob {
        id: base + i as u64,
        user: format!("u{}", i % 50),
        account: format!("acct{}", i % 10),
        qos: "normal".into(),
        end_s,
        predicted_end_s: None,
        alloc: vec![(i, Res { cpus: 64, mem: 512 * 1024, gpus: 8 })],
        cpu_parts: 1,
        gpus_by_type: vec![("h100".into(), 8)],
        licenses: vec![],
        partition: partition.into(),
        start_s,
        preempting: false,
        suspended: false,
        lent_cpus: vec![],
        left_s: u64::MAX,
        // Charged from its start, as the state's running jobs are.
        charge: quorum_sched::view::Charge {
            cpus: 64,
            gpus: 8,
            from_ms: start_s * 1000,
            until_ms: None,
            limit_ms: None,
        },
    }
}

pub fn cluster(pending: usize, nodes: usize) -> ClusterView {
    cluster_with(pending, nodes, false)
}

/// The cluster of [`cluster`]; with `scavengers`, every node that runs no job runs a
/// preemptable one of partition `scavenger`.
pub fn cluster_with(pending: usize, nodes: usize, scavengers: bool) -> ClusterView {
    let mut rng = Rng(0x5eed);
    let now = NOW_MS / 1000;
    let mut view = ClusterView::default();
    for i in 0..nodes {
        let name = format!("gpu{i:05}");
        view.nodes.push(Arc::new(NodeView {
            name,
            schedulable: true,
            weight: 1,
            features: vec![],
            switch: Some(format!("sw{}", i / 32)),
            capacity: Res { cpus: 64, mem: 512 * 1024, gpus: 8 },
            gpus: (0..8).map(|g| (g, "h100".to_string())).collect(),
            free_gpus: (0..8).collect(),
            uniform_gpu_type: Some("h100".into()),
            completing: Res::default(),
        }));
    }
    // Half the nodes run a whole-node job ending within a day.
    for i in (0..nodes).step_by(2) {
        Arc::make_mut(&mut view.nodes[i]).free_gpus.clear();
        let end_s = now + 60 + rng.below(86_400);
        view.running.push(Arc::new(whole_node_job(10_000_000, i, "gpu", now - 600, end_s)));
    }
    if scavengers {
        for i in (1..nodes).step_by(2) {
            Arc::make_mut(&mut view.nodes[i]).free_gpus.clear();
            let end_s = now + 60 + rng.below(86_400);
            let start_s = now - rng.below(3600);
            view.running.push(Arc::new(whole_node_job(20_000_000, i, "scavenger", start_s, end_s)));
        }
        view.partitions.insert(
            "scavenger".into(),
            PartitionView {
                name: "scavenger".into(),
                nodes: (0..nodes).collect(),
                tier: 0,
                max_time_s: None,
                max_nodes: None,
                exclusive: false,
                oversubscribe: Default::default(),
                preempt_mode: Some(PreemptMode::Requeue),
                grace_s: 60,
                access: Default::default(),
                holds_back: None,
            },
        );
    }
    view.partitions.insert(
        "gpu".into(),
        PartitionView {
            name: "gpu".into(),
            nodes: (0..nodes).collect(),
            tier: 1,
            max_time_s: None,
            max_nodes: None,
            exclusive: false,
            oversubscribe: Default::default(),
            preempt_mode: None,
            grace_s: 0,
            access: Default::default(),
            holds_back: None,
        },
    );
    for a in 0..10 {
        view.accounts.insert(
            format!("acct{a}"),
            Account {
                name: format!("acct{a}"),
                parent: None,
                shares: 1 + a,
                users: Default::default(),
                limits: AssocLimits::default(),
                user_shares: Default::default(),
                ..Default::default()
            },
        );
    }
    // One copy of each name, shared by the jobs that carry it, as the leader's view has them
    // (its cache interns them).
    let users: Vec<Name> = (0..200).map(|u| format!("u{u}").into()).collect();
    let accounts: Vec<Name> = (0..10).map(|a| format!("acct{a}").into()).collect();
    let (normal, gpu, h100): (Name, Name, Name) = ("normal".into(), "gpu".into(), "h100".into());
    for j in 0..pending {
        let gpus = [1, 1, 2, 4, 8][rng.below(5) as usize];
        let multi = rng.below(10) == 0;
        view.pending.push(Arc::new(PendingJob {
            id: j as u64 + 1,
            user: users[rng.below(200) as usize].clone(),
            account: accounts[rng.below(10) as usize].clone(),
            qos: normal.clone(),
            partition: gpu.clone(),
            submit_ms: NOW_MS - rng.below(3 * 86_400_000),
            begin_ms: None,
            nodes: if multi { 2 + rng.below(3) as u32 } else { 1 },
            per_node: Res { cpus: 8 * gpus, mem: 64 * 1024 * gpus, gpus },
            cpu_parts: 1,
            gpu_type: Some(h100.clone()),
            time_limit_s: Some(600 + rng.below(86_400)),
            plan_s: None,
            nice: 0,
            exclusive: false,
            features: vec![],
            features_any: false,
            features_same: false,
            feature_counts: Vec::new(),
            priority: None,
            licenses: vec![],
            exclude: vec![],
            only: vec![],
            held: None,
            dependency: DepStatus::Satisfied,
            dependency_ready_ms: None,
            reason: Default::default(),
            claim: Vec::new(),
            reservation: None,
            het: Vec::new(),
        }));
    }
    view
}

/// A dozen advance reservations of 64 nodes each, from one to twelve hours ahead for four hours
/// (every third a maintenance window, the last one daily), for every user; one pending job in
/// a hundred asks for one of them.
pub fn with_reservations(mut view: ClusterView) -> ClusterView {
    let users: Vec<String> = (0..200).map(|u| format!("u{u}")).collect();
    for k in 0..12u64 {
        let first = 100 + 64 * k as usize;
        let flags = ResvFlags::parse(match k {
            11 => "MAINT,IGNORE_JOBS,DAILY",
            k if k % 3 == 0 => "MAINT,IGNORE_JOBS",
            _ => "IGNORE_JOBS",
        })
        .expect("valid flags");
        let start_ms = NOW_MS + (k + 1) * 3_600_000;
        view.reservations.push(Reservation {
            name: format!("r{k:02}"),
            nodes: (first..first + 64).map(|i| format!("gpu{i:05}")).collect(),
            start_ms,
            end_ms: Some(start_ms + 4 * 3_600_000),
            users: users.clone(),
            accounts: vec![],
            partition: None,
            flags,
        });
    }
    for (j, job) in view.pending.iter_mut().enumerate().filter(|(j, _)| j % 100 == 0) {
        Arc::make_mut(job).reservation = Some(format!("r{:02}", j / 100 % 12).into());
    }
    view
}

/// The limits of feature level 20 besides: per-job, per-user and whole-QOS TRES limits on the
/// QOS every job has, per-job limits and budgets of CPU- and GPU-minutes (none spent) on every
/// account, and usage by user for the 200 users (so that fairshare goes down to them).
pub fn with_limits(mut view: ClusterView) -> ClusterView {
    let limit = |cpus, gpus, nodes| TresLimit { cpus: Some(cpus), gpus: Some(gpus), mem_mb: None, nodes: Some(nodes) };
    view.qos.insert(
        "normal".into(),
        Qos {
            name: "normal".into(),
            max_tres_per_job: limit(4096, 64, 8),
            max_tres_per_user: limit(100_000, 512, 256),
            grp_tres: limit(1_000_000, 60_000, 10_000),
            grp_jobs: Some(50_000),
            ..Default::default()
        },
    );
    let mut users = std::collections::BTreeMap::new();
    for a in 0..10u32 {
        let account = view.accounts.get_mut(&format!("acct{a}")).expect("made above");
        account.limits.max_tres_per_job = limit(4096, 64, 8);
        account.limits.grp_tres_mins = TresMins { cpu: Some(u64::MAX / 2), gpu: Some(u64::MAX / 2) };
        account.users = (0..200).map(|u| format!("u{u}")).collect();
        let per_user = (0..200u32)
            .map(|u| (format!("u{u}"), Usage { value: f64::from(u * 1000 + a), at: NOW_MS, ..Default::default() }))
            .collect();
        users.insert(format!("acct{a}"), per_user);
    }
    view.user_usage = users.into();
    view
}

/// One case of the cycle: benchmarked, or with `SCHED_PLAN_DIGEST` set, planned once and its
/// plan's digest printed instead (FNV-1a of its debug form, with its counts), so that a change
/// meant to keep behaviour shows the same plans byte for byte:
/// `SCHED_PLAN_DIGEST=1 cargo bench --bench sched -- schedule_cycle`, before and after.
fn case(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: String,
    view: &ClusterView,
    policy: &Policy,
) {
    if std::env::var_os("SCHED_PLAN_DIGEST").is_some() {
        let plan = schedule(view, NOW_MS, policy);
        let digest = format!("{plan:?}")
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        let (starts, estimates, preempted) = (plan.starts.len(), plan.estimates.len(), plan.preemptions.len());
        println!("{name}: plan {digest:016x} ({starts} starts, {estimates} reservations, {preempted} preempted)");
        return;
    }
    group.bench_function(name, |b| b.iter(|| black_box(schedule(black_box(view), NOW_MS, policy))));
}

fn bench_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("schedule_cycle");
    group.sample_size(10).measurement_time(Duration::from_secs(20)).warm_up_time(Duration::from_secs(2));
    for (pending, nodes) in [(1_000, 100), (10_000, 1_000), (100_000, 10_000)] {
        let view = cluster(pending, nodes);
        for (label, backfill) in [("easy", BackfillMode::Easy), ("conservative100", BackfillMode::Conservative)] {
            let policy = Policy { backfill, reservations: 100, ..Policy::default() };
            case(&mut group, format!("{pending}_jobs_{nodes}_nodes_{label}"), &view, &policy);
        }
    }
    // The largest size again, its partition sharing every CPU two ways (`OverSubscribe=FORCE:2`).
    let (pending, nodes) = (100_000, 10_000);
    let view = shared_two_ways(cluster(pending, nodes));
    let policy = Policy { backfill: BackfillMode::Easy, reservations: 100, ..Policy::default() };
    case(&mut group, format!("{pending}_jobs_{nodes}_nodes_easy_force2"), &view, &policy);
    // The largest size again, one pending job in a hundred heterogeneous (a launcher node
    // besides its workers), beside the same cluster without them.
    let view = with_het(cluster(pending, nodes));
    case(&mut group, format!("{pending}_jobs_{nodes}_nodes_easy_het"), &view, &policy);
    // The largest size again, planned on predicted run times (`Policy::predict`): every job
    // predicted to run a random share of its limit, running jobs to end that much sooner.
    let view = with_predictions(cluster(pending, nodes));
    case(&mut group, format!("{pending}_jobs_{nodes}_nodes_easy_predict"), &view, &policy);
    // And with every reservation late (each waiting job was promised a start when it became
    // eligible): the cycle planned on predictions up to the late reservation, and again on
    // limits; then a cycle after it, planned on limits at once while the last one's
    // reservation is late.
    let late = with_late_promises(view.clone());
    let on_limits = late.on_limits().expect("jobs planned on predictions");
    let plan = schedule(&late, NOW_MS, &policy);
    assert_eq!(plan.starts, schedule(&on_limits, NOW_MS, &policy).starts, "the late cycle is planned on limits");
    let again = ClusterView { previous: plan.estimates, ..late.clone() };
    assert!(again.late(&again.previous), "the reservation stays late");
    for (label, view) in [("late", &late), ("late_again", &again)] {
        case(&mut group, format!("{pending}_jobs_{nodes}_nodes_easy_predict_{label}"), view, &policy);
    }
    // And those behind the reservation tried shortest predicted run time first (EASY++).
    let shortest = Policy { backfill_order: BackfillOrder::Shortest, ..policy.clone() };
    case(&mut group, format!("{pending}_jobs_{nodes}_nodes_easy_predict_shortest"), &view, &shortest);
    // The largest size again, with preemptable jobs running on the other half of the nodes:
    // preemption on, and off (the same cluster, nothing preempted).
    let (pending, nodes) = (100_000, 10_000);
    let view = cluster_with(pending, nodes, true);
    for (label, preempt_type) in [("preempt", PreemptType::PartitionPrio), ("scavengers_no_preempt", PreemptType::Off)]
    {
        let policy = Policy { preempt_type, ..Policy::default() };
        case(&mut group, format!("{pending}_jobs_{nodes}_nodes_easy_{label}"), &view, &policy);
    }
    // And with a dozen advance reservations besides (issue 28's measure).
    let view = with_reservations(view);
    let policy = Policy { preempt_type: PreemptType::PartitionPrio, ..Policy::default() };
    case(&mut group, format!("{pending}_jobs_{nodes}_nodes_easy_preempt_reservations"), &view, &policy);
    // And with the limits sites set most, and fairshare down to users.
    let view = with_limits(view);
    case(&mut group, format!("{pending}_jobs_{nodes}_nodes_easy_preempt_reservations_limits"), &view, &policy);
    // A cycle after 100 ends and 100 submits on the cluster the first cycle filled (issue 62's
    // incremental cycle): made from nothing, and from what the cycle before it kept.
    let policy = Policy { backfill: BackfillMode::Easy, reservations: 100, ..Policy::default() };
    let mut view = cluster(pending, nodes);
    let first = schedule(&view, NOW_MS - 11_000, &policy);
    start(&mut view, &first, (NOW_MS - 11_000) / 1000);
    // Sixty cycles in the ten seconds before, as a busy leader's: the cache keeps at most 2,000
    // new jobs a cycle.
    let mut kept = CycleCache::default();
    for k in (1..=60).rev() {
        let before = schedule_with(&view, NOW_MS - 160 * k, &policy, &mut kept);
        assert!(before.starts.len() < 10, "the first cycle filled the cluster: {} start", before.starts.len());
    }
    churn(&mut view, 100, 100);
    let name = format!("{pending}_jobs_{nodes}_nodes_easy_after_100_ends_100_submits");
    let full = schedule(&view, NOW_MS, &policy);
    assert_eq!(
        schedule_with(&view, NOW_MS, &policy, &mut kept.clone()),
        full,
        "a kept cycle plans what a full one does"
    );
    assert!(full.starts.len() >= 50, "the ends make room for a cycle's worth of starts: {}", full.starts.len());
    case(&mut group, format!("{name}_full"), &view, &policy);
    if std::env::var_os("SCHED_PLAN_DIGEST").is_none() {
        group.bench_function(format!("{name}_kept"), |b| {
            b.iter_batched(
                || kept.clone(),
                |mut k| black_box(schedule_with(black_box(&view), NOW_MS, &policy, &mut k)),
                BatchSize::LargeInput,
            )
        });
        // The leader's first cycle (after an election, or a change of policy, partitions or
        // QOS): `100000_jobs_10000_nodes_easy` made with an empty cache, which it fills.
        let view = cluster(pending, nodes);
        group.bench_function(format!("{pending}_jobs_{nodes}_nodes_easy_empty_cache"), |b| {
            b.iter_batched(
                CycleCache::default,
                |mut k| black_box(schedule_with(black_box(&view), NOW_MS, &policy, &mut k)),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

/// Applies `plan`'s starts to `view` at `now_s`, as the state would: each job moves from the
/// queue to the running jobs, holding what its allocation names until its limit.
fn start(view: &mut ClusterView, plan: &Plan, now_s: u64) {
    let started: std::collections::BTreeSet<u64> = plan.starts.iter().map(|s| s.job_id).collect();
    let jobs: std::collections::BTreeMap<u64, Arc<PendingJob>> =
        view.pending.iter().filter(|j| started.contains(&j.id)).map(|j| (j.id, j.clone())).collect();
    for s in &plan.starts {
        let job = &jobs[&s.job_id];
        let mut alloc = vec![];
        for a in &s.allocation.nodes {
            let i = view.node_index(&a.node).expect("a planned node is in the view");
            Arc::make_mut(&mut view.nodes[i]).free_gpus.retain(|g| !a.gpus.contains(g));
            let cpus = i64::from(a.cpus) * view.cpu_parts.max(1);
            alloc.push((i, Res { cpus, mem: a.mem_mb as i64, gpus: a.gpus.len() as i64 }));
        }
        let (cpus, gpus): (i64, i64) = alloc.iter().fold((0, 0), |(c, g), (_, r)| (c + r.cpus, g + r.gpus));
        view.running.push(Arc::new(RunningJob {
            id: job.id,
            user: job.user.to_string(),
            account: job.account.to_string(),
            qos: job.qos.to_string(),
            end_s: now_s + job.limit_s(),
            predicted_end_s: None,
            alloc,
            cpu_parts: view.cpu_parts.max(1),
            gpus_by_type: vec![("h100".into(), gpus)],
            licenses: vec![],
            partition: job.partition.to_string(),
            start_s: now_s,
            preempting: false,
            suspended: false,
            lent_cpus: vec![],
            left_s: u64::MAX,
            charge: quorum_sched::view::Charge {
                cpus: cpus as u64,
                gpus: gpus as u64,
                from_ms: now_s * 1000,
                until_ms: None,
                limit_ms: None,
            },
        }));
    }
    view.pending.retain(|j| !started.contains(&j.id));
}

/// `ends` running jobs of the last cycle end (what they held is free again) and `submits` new
/// jobs, of the queue's mix, are submitted.
fn churn(view: &mut ClusterView, ends: usize, submits: usize) {
    let mut rng = Rng(0xc4a2);
    for _ in 0..ends {
        let k = view.running.len() - 1 - rng.below(view.running.len() as u64 / 4) as usize;
        let job = view.running.remove(k);
        for &(i, r) in &job.alloc {
            let node = Arc::make_mut(&mut view.nodes[i]);
            let held: Vec<u32> = (0..8).filter(|g| !node.free_gpus.contains(g)).take(r.gpus as usize).collect();
            node.free_gpus.extend(held);
            node.free_gpus.sort_unstable();
        }
    }
    let template = cluster(submits, 1);
    let first = view.pending.iter().map(|j| j.id).max().unwrap_or(0) + 1;
    for (k, job) in template.pending.into_iter().enumerate() {
        view.pending.push(Arc::new(PendingJob { id: first + k as u64, submit_ms: NOW_MS - 500, ..(*job).clone() }));
    }
}

/// `view` as the view of a state with `Policy::predict` and every user's history shows it:
/// each pending job planned for a random share (a tenth to all) of its limit, each running job
/// predicted to end a random share sooner.
pub fn with_predictions(mut view: ClusterView) -> ClusterView {
    let mut rng = Rng(0x9e3d);
    let now = NOW_MS / 1000;
    for p in &mut view.pending {
        let p = Arc::make_mut(p);
        let limit = p.time_limit_s.unwrap_or(86_400);
        p.plan_s = Some((limit * (1 + rng.below(10)) / 10).max(1)).filter(|&s| s < limit);
    }
    for r in &mut view.running {
        let r = Arc::make_mut(r);
        let left = r.end_s.saturating_sub(now);
        r.predicted_end_s = Some(now + 1 + left * rng.below(10) / 10).filter(|&e| e < r.end_s);
    }
    view
}

/// `view` with every waiting job promised a start when it became eligible, so that any
/// reservation is late ([`ClusterView::late`]).
pub fn with_late_promises(mut view: ClusterView) -> ClusterView {
    view.promised = view.pending.iter().map(|j| (j.id, j.eligible_ms())).collect();
    view
}

/// `view` with one pending job in a hundred heterogeneous: component 0 a launcher of one node
/// and 4 CPUs without GPUs, component 1 the job's own workers.
pub fn with_het(mut view: ClusterView) -> ClusterView {
    for p in view.pending.iter_mut().step_by(100) {
        let p = Arc::make_mut(p);
        let workers = PendingJob { het: Vec::new(), ..p.clone() };
        (p.nodes, p.per_node, p.gpu_type) = (1, Res { cpus: 4, mem: 16 * 1024, gpus: 0 }, None);
        p.het = vec![workers];
    }
    view
}

/// `view` with its partition sharing every CPU two ways, as the view of a state with
/// `OverSubscribe=FORCE:2` is: the nodes' books count CPUs in halves, and every job, running or
/// pending, takes one half per CPU it has (the pending jobs' one part per CPU is already so).
pub fn shared_two_ways(mut view: ClusterView) -> ClusterView {
    view.cpu_parts = 2;
    view.oversubscribed = true;
    for n in &mut view.nodes {
        Arc::make_mut(n).capacity.cpus *= 2;
    }
    for r in &mut view.running {
        let r = Arc::make_mut(r);
        r.cpu_parts = 1;
    }
    for p in view.partitions.values_mut() {
        p.oversubscribe = OverSubscribe::Force(2);
    }
    view
}

/// A replicated state as the leader holds it: 10,000 nodes and 100,000 pending jobs (built
/// directly, not through `apply`, to keep the setup short).
fn state(pending: usize, nodes: usize) -> ClusterState {
    let mut s = ClusterState::new();
    let names: Vec<String> = (0..nodes).map(|i| format!("gpu{i:05}")).collect();
    for n in &names {
        s.nodes.insert(
            n.clone(),
            Node {
                name: n.clone(),
                cpus: 64,
                mem_mb: 512 * 1024,
                gpus: (0..8).map(|g| Gpu { index: g, gpu_type: "h100".into() }).collect(),
                features: vec![],
                admin: NodeAdminState::Up,
                alloc_cpus: 0,
                alloc_mem_mb: 0,
                alloc_gpus: Default::default(),
                shared_cpus: Default::default(),
                jobs: Default::default(),
                agent_version: String::new(),
                registered_at: 0,
                weight: 1,
                features_set: None,
                completing: Vec::new(),
            },
        );
    }
    let part = quorum_control::config::PartitionConfig {
        name: "gpu".into(),
        nodes: format!("gpu[00000-{:05}]", nodes - 1),
        default: true,
        ..Default::default()
    };
    s.partitions.insert("gpu".into(), part.to_partition().expect("valid partition"));
    for id in 1..=pending as u64 {
        let spec = JobSpec {
            name: "train".into(),
            partition: Some("gpu".into()),
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 8,
            mem_per_node_mb: Some(65536),
            gpus_per_node: 1,
            gpu_type: Some("h100".into()),
            time_limit_s: Some(3600),
            program: Program::Argv(vec!["python".into(), "train.py".into()]),
            work_dir: "/home/u".into(),
            submit_dir: "/home/u".into(),
            ..Default::default()
        };
        s.jobs.insert(
            id,
            Shared::new(Job {
                id,
                spec: spec.into(),
                user: format!("u{}", id % 200),
                partition: "gpu".into(),
                state: JobState::Pending,
                reason: Default::default(),
                submit_time: NOW_MS,
                start_time: None,
                end_time: None,
                exit_code: None,
                signal: None,
                allocation: None,
                alloc_index: 0,
                cancel_requested: false,
                rank_outcomes: vec![],
                request_id: String::new(),
                held: None,
                account: "root".into(),
                qos: "normal".into(),
                requeues: 0,
                array: None,
                steps: vec![],
                next_step: 0,
                cancelled_by: None,
                usage: None,
                step_usage: None,
                preempting: None,
                preempted_by: None,
                claim: None,
                suspended_at: None,
                suspended_ms: 0,
                resv_end: None,
                failure: None,
                shown: None,
            }),
        );
        // The view walks the active jobs' index, as the state machine keeps it.
        s.active.insert(id);
    }
    s
}

fn bench_view(c: &mut Criterion) {
    let mut group = c.benchmark_group("view_from_state");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    let mut s = state(100_000, 10_000);
    group.bench_function("100000_jobs_10000_nodes", |b| b.iter(|| black_box(ClusterView::from_state(black_box(&s)))));
    // With predictions: every user's last two run times looked up for each of their jobs.
    s.policy.predict = true;
    s.recent_runs = (0..200)
        .map(|u| (format!("u{u}"), quorum_control::model::predict::RecentRuns { last_s: 600 + u, before_s: Some(900) }))
        .collect();
    group.bench_function("100000_jobs_10000_nodes_predict", |b| {
        b.iter(|| black_box(ClusterView::from_state(black_box(&s))))
    });
    group.finish();
}

criterion_group!(benches, bench_cycle, bench_view);
criterion_main!(benches);
