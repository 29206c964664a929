use super::*;
use crate::model::{Gpu, Program};

pub(crate) fn partition(name: &str, nodes: &str, default: bool) -> Partition {
    crate::config::PartitionConfig {
        name: name.into(),
        nodes: nodes.into(),
        default,
        max_time: Some("1-00:00:00".into()),
        default_time: None,
        default_mem_per_cpu: Some("1G".into()),
        ..Default::default()
    }
    .to_partition()
    .unwrap()
}

pub(crate) fn spec(argv: &[&str]) -> JobSpec {
    JobSpec {
        name: "t".into(),
        partition: None,
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        mem_per_node_mb: None,
        gpus_per_node: 0,
        gpu_type: None,
        time_limit_s: None,
        program: Program::Argv(argv.iter().map(|s| s.to_string()).collect()),
        work_dir: "/tmp".into(),
        stdout: None,
        stderr: None,
        env: vec![],
        submit_dir: "/tmp".into(),
        ..Default::default()
    }
}

pub(crate) fn register(name: &str, cpus: u32, gpus: u32) -> Command {
    Command::RegisterNode {
        node: NodeRegistration {
            name: name.into(),
            cpus,
            mem_mb: 64 * 1024,
            gpus: (0..gpus).map(|i| Gpu { index: i, gpu_type: "h100".into() }).collect(),
            features: vec![],
            version: "test".into(),
        },
        now: 1,
    }
}

pub(crate) fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    apply(&mut s, 1, Command::SetPartitions { partitions: vec![partition("gpu", "n[1-2]", true)], now: 1 });
    apply(&mut s, 2, register("n1", 8, 4));
    apply(&mut s, 3, register("n2", 8, 4));
    s
}

fn submit(s: &mut ClusterState, index: u64, spec: JobSpec, request_id: &str) -> Response {
    apply(
        s,
        index,
        Command::SubmitJob {
            spec: Box::new(spec),
            user: "alice".into(),
            now: 1000 + index,
            request_id: request_id.into(),
        },
    )
}

#[test]
fn submit_assigns_ids_and_dedups_retries() {
    let mut s = cluster();
    assert_eq!(submit(&mut s, 10, spec(&["true"]), "r1"), Response::Submitted { job_id: 1, duplicate: false });
    assert_eq!(submit(&mut s, 11, spec(&["true"]), "r1"), Response::Submitted { job_id: 1, duplicate: true });
    assert_eq!(submit(&mut s, 12, spec(&["true"]), "r2"), Response::Submitted { job_id: 2, duplicate: false });
    assert_eq!(s.jobs.len(), 2);
    let job = &s.jobs[&1];
    assert_eq!(job.partition, "gpu");
    assert_eq!(job.spec.mem_per_node_mb, Some(1024));
    assert_eq!(job.spec.time_limit_s, Some(86400), "the partition max is the default limit");
}

#[test]
fn bad_submits_are_rejected_and_create_nothing() {
    let mut s = cluster();
    let mut unknown = spec(&["true"]);
    unknown.partition = Some("cpu".into());
    let mut too_many_gpus = spec(&["true"]);
    too_many_gpus.gpus_per_node = 16;
    too_many_gpus.gpu_type = Some("h100".into());
    let mut wrong_type = spec(&["true"]);
    wrong_type.gpus_per_node = 1;
    wrong_type.gpu_type = Some("a100".into());
    let mut too_long = spec(&["true"]);
    too_long.time_limit_s = Some(2 * 86400);
    let mut too_many_nodes = spec(&["true"]);
    too_many_nodes.nodes = 3;
    too_many_nodes.ntasks = 3;
    let cases = [
        (unknown, "unknown partition 'cpu'"),
        (too_many_gpus, "no node with 16 GPUs of type h100; the largest has 4"),
        (wrong_type, "no node with 1 GPUs of type a100; the largest has 0"),
        (too_long, "exceeds partition 'gpu' limit of 1-00:00:00"),
        (too_many_nodes, "has 2 nodes, fewer than the 3 requested"),
        (spec(&[]), "empty command"),
    ];
    for (i, (sp, want)) in cases.into_iter().enumerate() {
        match submit(&mut s, 20 + i as u64, sp, &format!("bad{i}")) {
            Response::Rejected(r) => assert!(r.to_string().contains(want), "{r} should contain {want}"),
            other => panic!("case {i}: expected a rejection, got {other:?}"),
        }
    }
    assert!(s.jobs.is_empty());
    assert!(s.request_ids.is_empty());
    assert_eq!(s.next_job_id, 1);
}

fn start(s: &mut ClusterState, index: u64, job_id: JobId, node: &str, cpus: u32, gpus: Vec<u32>) -> Response {
    let mem_mb = s.jobs[&job_id].spec.mem_per_node_mb.unwrap();
    apply(
        s,
        index,
        Command::ApplyPlan {
            base_index: index - 1,
            now: 2000,
            starts: vec![PlannedStart {
                job_id,
                allocation: Allocation {
                    nodes: vec![crate::model::NodeAllocation { node: node.into(), cpus, mem_mb, gpus }],
                },
            }],
            reasons: vec![],
        },
    )
}

#[test]
fn plan_is_rechecked_at_apply_and_job_end_frees_resources() {
    let mut s = cluster();
    let mut sp = spec(&["true"]);
    sp.cpus_per_task = 8;
    sp.gpus_per_node = 4;
    submit(&mut s, 10, sp.clone(), "a");
    submit(&mut s, 11, sp, "b");
    assert_eq!(
        start(&mut s, 12, 1, "n1", 8, vec![0, 1, 2, 3]),
        Response::PlanApplied { started: vec![1], dropped: vec![] }
    );
    // A stale plan placing job 2 on the same node is dropped, not applied.
    match start(&mut s, 13, 2, "n1", 8, vec![0, 1, 2, 3]) {
        Response::PlanApplied { started, dropped } => {
            assert!(started.is_empty());
            assert_eq!(dropped[0].0, 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.nodes["n1"].state(), crate::model::NodeState::Allocated);
    assert_eq!(s.jobs[&1].alloc_index, 12);
    // A report with an older token changes nothing.
    let ended = |token, code| Command::JobEnded {
        job_id: 1,
        token,
        node: "n1".into(),
        outcome: RankOutcome::Exited { code, signal: 0 },
        now: 3000,
    };
    assert_eq!(apply(&mut s, 14, ended(5, 0)), Response::Ignored);
    assert_eq!(apply(&mut s, 15, ended(12, 3)), Response::JobFinished { job_id: 1, state: JobState::Failed });
    assert_eq!(s.jobs[&1].exit_code, Some(3));
    assert_eq!(s.nodes["n1"].alloc_cpus, 0);
    assert!(s.nodes["n1"].alloc_gpus.is_empty());
    assert_eq!(s.nodes["n1"].state(), crate::model::NodeState::Idle);
    assert_eq!(apply(&mut s, 16, ended(12, 0)), Response::Ignored, "a job ends once");
}

#[test]
fn cancel_pending_and_running() {
    let mut s = cluster();
    submit(&mut s, 10, spec(&["sleep", "1000"]), "a");
    submit(&mut s, 11, spec(&["sleep", "1000"]), "b");
    start(&mut s, 12, 1, "n1", 1, vec![]);
    let cancel = |id, user: &str| Command::CancelJob { job_id: id, user: user.into(), now: 4000 };
    assert!(matches!(apply(&mut s, 13, cancel(2, "mallory")), Response::Rejected(Rejection::NotOwner { .. })));
    assert_eq!(apply(&mut s, 14, cancel(2, "alice")), Response::Cancelled { job_id: 2, was_running: false });
    assert_eq!(s.jobs[&2].state, JobState::Cancelled);
    assert_eq!(apply(&mut s, 15, cancel(1, "alice")), Response::Cancelled { job_id: 1, was_running: true });
    assert_eq!(s.jobs[&1].state, JobState::Running, "running until its processes are gone");
    let r = apply(
        &mut s,
        16,
        Command::JobEnded {
            job_id: 1,
            token: 12,
            node: "n1".into(),
            outcome: RankOutcome::Cancelled { code: 0, signal: 15 },
            now: 5000,
        },
    );
    assert_eq!(r, Response::JobFinished { job_id: 1, state: JobState::Cancelled });
    assert!(matches!(apply(&mut s, 17, cancel(1, "alice")), Response::Rejected(Rejection::JobFinished { .. })));
    assert!(matches!(apply(&mut s, 18, cancel(99, "alice")), Response::Rejected(Rejection::UnknownJob { id: 99 })));
}

#[test]
fn clock_never_moves_backwards_and_apply_is_deterministic() {
    let run = || {
        let mut s = cluster();
        submit(&mut s, 10, spec(&["true"]), "a");
        apply(
            &mut s,
            11,
            Command::SubmitJob { spec: Box::new(spec(&["true"])), user: "bob".into(), now: 5, request_id: "b".into() },
        );
        s
    };
    let (a, b) = (run(), run());
    assert_eq!(a.clock, 1010);
    assert_eq!(a.jobs[&2].submit_time, 1010);
    assert_eq!(digest(&a), digest(&b));
}

#[test]
fn snapshots_reproduce_the_state_bit_for_bit() {
    // Fairshare usage is a float; a snapshot that parsed it 1 ULP off would make a replica that
    // installed it disagree with the others (found by the catch-up-by-snapshot test).
    let mut s = cluster();
    for i in 1..2000u32 {
        let value = f64::from(i) * 0.001 / 7.0 + 0.1 + 0.2;
        s.usage.insert(format!("a{i}"), crate::model::Usage { value, at: u64::from(i) });
    }
    let bytes = serde_json::to_vec(&s).unwrap();
    let back: ClusterState = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(back, s);
    assert_eq!(digest(&back), digest(&s));
}
