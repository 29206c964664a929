//! The replicated state machine: `state::apply` throughput for the commands that carry the load
//! (submits, one at a time and in a group-commit entry; plans; job ends), and snapshot build
//! and restore at 100,000 and 1,000,000 jobs.
//!
//! Every figure starts from a cluster of 10,000 GPU nodes (64 CPUs, 8 h100 each) holding 100,000
//! pending jobs, built through `apply` itself. Each submit carries what `quorum submit` sends
//! under `--export=ALL`: argv, directories and a 40-variable environment (about 2.6 KB).
//! `decode+apply` also counts decoding the entry from its log encoding, as a replica does.
//!
//! `cargo bench --bench state` (results in benches/RESULTS.md).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use quorum_control::model::{
    Allocation, Gpu, JobSpec, NodeAllocation, PendingReason, PlannedStart, Program, RankOutcome,
};
use quorum_state::{
    apply, snapshot, ClusterState, Command, NodeRegistration, ReplicaVersion, Response, Submit, FEATURE_LEVEL,
};

const NODES: usize = 10_000;
const NOW_MS: u64 = 1_800_000_000_000;

fn node_name(i: usize) -> String {
    format!("gpu{i:05}")
}

fn spec(i: u64) -> JobSpec {
    JobSpec {
        name: format!("train-{i}"),
        partition: Some("gpu".into()),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 8,
        mem_per_node_mb: Some(65_536),
        gpus_per_node: 1,
        gpu_type: Some("h100".into()),
        time_limit_s: Some(3_600),
        program: Program::Argv(vec!["python".into(), "train.py".into(), format!("--seed={i}")]),
        work_dir: "/home/alice/project".into(),
        submit_dir: "/home/alice/project".into(),
        env: (0..40).map(|v| (format!("VARIABLE_{v:02}"), format!("/opt/software/value/{v:04}/{i}"))).collect(),
        hold: true,
        ..Default::default()
    }
}

/// Applies `command` at the state's next index.
struct Log {
    state: ClusterState,
    index: u64,
}

impl Log {
    fn apply(&mut self, command: Command) -> Response {
        self.index += 1;
        apply(&mut self.state, self.index, command)
    }
}

/// The cluster with `pending` held jobs, each submitted through `apply`.
fn cluster(pending: u64) -> Log {
    let mut log = Log { state: ClusterState::new(), index: 0 };
    let partition = quorum_control::config::PartitionConfig {
        name: "gpu".into(),
        nodes: format!("gpu[00000-{:05}]", NODES - 1),
        default: true,
        ..Default::default()
    };
    let partitions = vec![partition.to_partition().expect("valid partition")];
    log.apply(Command::SetPartitions { partitions, now: NOW_MS });
    for i in 0..NODES {
        let node = NodeRegistration {
            name: node_name(i),
            cpus: 64,
            mem_mb: 512 * 1024,
            gpus: (0..8).map(|g| Gpu { index: g, gpu_type: "h100".into() }).collect(),
            features: vec![],
            version: "bench".into(),
        };
        log.apply(Command::RegisterNode { node, now: NOW_MS });
    }
    for i in 0..pending {
        log.apply(submit(i));
    }
    log
}

fn submit(i: u64) -> Command {
    Command::SubmitJob { spec: Box::new(spec(i)), user: "alice".into(), now: NOW_MS, request_id: format!("req-{i}") }
}

/// A plan starting `n` pending jobs (one GPU and 8 CPUs each, spread over the nodes) and giving
/// the reason of 5,000 others, as a busy cycle does.
fn plan(log: &Log, n: usize) -> Command {
    let pending: Vec<u64> = log.state.active.iter().copied().take(n + 5_000).collect();
    let starts = pending[..n]
        .iter()
        .enumerate()
        .map(|(k, &job_id)| PlannedStart {
            job_id,
            allocation: Allocation {
                nodes: vec![NodeAllocation {
                    node: node_name(k % NODES),
                    cpus: 8,
                    mem_mb: 65_536,
                    gpus: vec![(k / NODES) as u32],
                    het_group: 0,
                }],
                cpu_ways: None,
            },
        })
        .collect();
    let reasons = pending[n..].iter().map(|&id| (id, PendingReason::Resources)).collect();
    Command::ApplyPlan {
        base_index: log.index,
        now: NOW_MS + 1,
        starts,
        reasons,
        preemptions: vec![],
        resumes: vec![],
        shown: vec![],
    }
}

fn bench_apply(c: &mut Criterion) {
    let base = cluster(100_000);
    let mut group = c.benchmark_group("apply");
    group.sample_size(10).measurement_time(Duration::from_secs(10)).warm_up_time(Duration::from_secs(1));

    // One entry per submit. The state grows by the submits measured, a few thousand on 100,000.
    group.throughput(Throughput::Elements(1));
    group.bench_function("submit", |b| {
        b.iter_custom(|iters| {
            let mut log = Log { state: base.state.clone(), index: base.index };
            let commands: Vec<Command> = (0..iters).map(|i| submit(1_000_000 + i)).collect();
            let start = Instant::now();
            for command in commands {
                black_box(log.apply(command));
            }
            start.elapsed()
        })
    });
    group.bench_function("submit_decode+apply", |b| {
        b.iter_custom(|iters| {
            let mut log = Log { state: base.state.clone(), index: base.index };
            let entries: Vec<Vec<u8>> =
                (0..iters).map(|i| serde_json::to_vec(&submit(1_000_000 + i)).expect("encodes")).collect();
            let start = Instant::now();
            for entry in entries {
                let command: Command = serde_json::from_slice(&entry).expect("decodes");
                black_box(log.apply(command));
            }
            start.elapsed()
        })
    });

    // A group-commit entry of 64 submits; throughput counts submits.
    group.throughput(Throughput::Elements(64));
    group.bench_function("submit_jobs_64", |b| {
        b.iter_custom(|iters| {
            let mut log = Log { state: base.state.clone(), index: base.index };
            let commands: Vec<Command> = (0..iters)
                .map(|e| Command::SubmitJobs {
                    submits: (0..64)
                        .map(|k| {
                            let i = 1_000_000 + e * 64 + k;
                            Submit { spec: Box::new(spec(i)), user: "alice".into(), request_id: format!("req-{i}") }
                        })
                        .collect(),
                    now: NOW_MS,
                })
                .collect();
            let start = Instant::now();
            for command in commands {
                black_box(log.apply(command));
            }
            start.elapsed()
        })
    });

    // A plan starting 1,000 jobs with 5,000 reasons; throughput counts starts.
    group.throughput(Throughput::Elements(1_000));
    let command = plan(&base, 1_000);
    group.bench_function("plan_1000_starts", |b| {
        b.iter_batched(
            || (Log { state: base.state.clone(), index: base.index }, command.clone()),
            |(mut log, command)| match log.apply(command) {
                Response::PlanApplied { started, dropped, .. } => {
                    assert!(started.len() == 1_000 && dropped.is_empty(), "every planned start is accepted");
                    log
                }
                other => panic!("unexpected answer to a plan: {other:?}"),
            },
            BatchSize::PerIteration,
        )
    });

    // The ends of 1,000 running jobs, one entry each.
    let mut running = Log { state: base.state.clone(), index: base.index };
    running.apply(plan(&base, 1_000));
    let token = running.index;
    let ends: Vec<Command> = running
        .state
        .jobs
        .values()
        .filter(|j| j.allocation.is_some())
        .map(|j| Command::JobEnded {
            job_id: j.id,
            token,
            node: j.allocation.as_ref().expect("running").nodes[0].node.clone(),
            outcome: RankOutcome::Exited { code: 0, signal: 0 },
            now: NOW_MS + 2,
        })
        .collect();
    assert_eq!(ends.len(), 1_000);
    group.bench_function("job_ended_1000", |b| {
        b.iter_batched(
            || (Log { state: running.state.clone(), index: running.index }, ends.clone()),
            |(mut log, ends)| {
                for end in ends {
                    let answer = log.apply(end);
                    assert!(matches!(answer, Response::JobFinished { .. }), "a job end is applied: {answer:?}");
                }
                log
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn bench_snapshot(c: &mut Criterion) {
    let mut group = c.benchmark_group("snapshot");
    group.sample_size(10).warm_up_time(Duration::from_secs(1));
    for jobs in [100_000u64, 1_000_000] {
        let plain = cluster(jobs).state;
        // The same state in a cluster whose replicas all run this release: compressed snapshots.
        let mut compressed = plain.clone();
        for id in 1..=3 {
            compressed.replica_versions.insert(id, ReplicaVersion { level: FEATURE_LEVEL, version: "bench".into() });
        }
        group.measurement_time(Duration::from_secs(if jobs > 100_000 { 60 } else { 15 }));
        // What a replica's snapshot build holds the state lock for: the copy.
        group.bench_function(format!("copy_{jobs}_jobs"), |b| b.iter(|| black_box(plain.clone())));
        for (format, state) in [("json", &plain), ("lz4", &compressed)] {
            let bytes = snapshot::encode(state).expect("encodes");
            println!("{format} snapshot of {jobs} jobs on {NODES} nodes: {} MB", bytes.len() / 1_000_000);
            // The build: the copy, then its encoding (RocksDB's write of the bytes not counted).
            group.bench_function(format!("build_{jobs}_jobs_{format}"), |b| {
                b.iter(|| {
                    let copy = state.clone();
                    black_box(snapshot::encode(&copy).expect("encodes"))
                })
            });
            // Installing one on a lagging replica, or restoring at restart.
            group.bench_function(format!("restore_{jobs}_jobs_{format}"), |b| {
                b.iter(|| black_box(snapshot::decode(black_box(&bytes)).expect("decodes")))
            });
            assert_eq!(
                &snapshot::decode(&bytes).expect("decodes"),
                state,
                "a snapshot restores the state it was made of"
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench_apply, bench_snapshot);
criterion_main!(benches);
