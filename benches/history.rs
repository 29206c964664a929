//! Ended jobs through the state and into the job history: JOBS jobs (a million by default) are
//! submitted, started and ended through `state::apply` on a cluster of 1,000 nodes, the simulated
//! clock moving 10 ms a job, and every 1,000 jobs the leader's `PurgeJobs` moves those that
//! ended `min_job_age` (300 s) ago into a real RocksDB job history, as a replica's shell does.
//! Every tenth of the run it prints what the hot state holds (jobs, tombstones, its snapshot's
//! size), this process's resident memory, and the history's size on disk; at the end, how long a
//! user's `sacct -S -E` takes over the history, with its block cache cold (the database reopened).
//!
//! `cargo bench --bench history [-- JOBS]` (results in benches/RESULTS.md).

use std::time::Instant;

use quorum_control::model::{Allocation, JobSpec, NodeAllocation, PlannedStart, Program, RankOutcome};
use quorum_control::replica::history::{History, CF_HISTORY};
use quorum_state::{apply, snapshot, ClusterState, Command, NodeRegistration, ReplicaVersion, Response, Submit};

const NODES: usize = 1_000;
const USERS: u64 = 10;
const BATCH: u64 = 1_000;
const MIN_AGE_MS: u64 = 300_000;
const STEP_MS: u64 = 10;
const START_MS: u64 = 1_800_000_000_000;

fn spec(i: u64) -> JobSpec {
    JobSpec {
        name: format!("job-{i}"),
        partition: Some("batch".into()),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        mem_per_node_mb: Some(1_024),
        time_limit_s: Some(3_600),
        program: Program::Argv(vec!["python".into(), "step.py".into(), format!("--seed={i}")]),
        work_dir: "/home/user/project".into(),
        submit_dir: "/home/user/project".into(),
        env: (0..40).map(|v| (format!("VARIABLE_{v:02}"), format!("/opt/software/value/{v:04}"))).collect(),
        ..Default::default()
    }
}

fn rss_mb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next());
    kb.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) / 1024
}

fn dir_mb(path: &std::path::Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
        total += entry.metadata().map(|m| m.len()).unwrap_or(0);
    }
    total >> 20
}

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

fn main() {
    let jobs: u64 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("db");
    let db = quorum_raft::open_db(&path, &[CF_HISTORY]).expect("open rocksdb");
    let history = History::new(db.clone(), Default::default()).expect("opening the job history");

    let mut log = Log { state: ClusterState::new(), index: 0 };
    let names: Vec<String> = (0..NODES).map(|i| format!("n{i:04}")).collect();
    let versions =
        (1..=3).map(|id| (id, ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "bench".into() }));
    log.apply(Command::SetReplicaVersions { versions: versions.collect(), now: START_MS });
    let partition = quorum_control::model::Partition {
        name: "batch".into(),
        nodes: quorum_control::model::hostlist::compress(&names),
        node_names: names.iter().cloned().collect(),
        default: true,
        max_time_s: None,
        default_time_s: None,
        default_mem_per_cpu_mb: 1_024,
        priority_tier: 0,
        max_nodes: None,
        exclusive: false,
        oversubscribe: Default::default(),
        preempt_mode: None,
        grace_time_s: 0,
        access: Default::default(),
        state: Default::default(),
    };
    log.apply(Command::SetPartitions { partitions: vec![partition], now: START_MS });
    for name in &names {
        let node = NodeRegistration {
            name: name.clone(),
            cpus: 64,
            mem_mb: 256 * 1024,
            gpus: vec![],
            features: vec![],
            version: "bench".into(),
        };
        log.apply(Command::RegisterNode { node, now: START_MS });
    }

    println!("| jobs run | hot jobs | tombstones | snapshot | resident | history on disk | elapsed |");
    println!("|---|---|---|---|---|---|---|");
    let started = Instant::now();
    let mut now = START_MS;
    let mut moved = 0u64;
    for batch in 0..jobs.div_ceil(BATCH) {
        let first = batch * BATCH;
        let n = BATCH.min(jobs - first);
        let submits = (first..first + n)
            .map(|i| Submit {
                spec: Box::new(spec(i)),
                user: format!("user{}", i % USERS),
                request_id: format!("r{i}"),
            })
            .collect();
        log.apply(Command::SubmitJobs { submits, now });
        let ids: Vec<u64> = log.state.active.iter().copied().collect();
        let starts = ids
            .iter()
            .enumerate()
            .map(|(k, &job_id)| PlannedStart {
                job_id,
                allocation: Allocation {
                    nodes: vec![NodeAllocation {
                        node: names[k % NODES].clone(),
                        cpus: 1,
                        mem_mb: 1_024,
                        gpus: vec![],
                        het_group: 0,
                    }],
                    cpu_ways: None,
                },
            })
            .collect();
        let base_index = log.index;
        log.apply(Command::ApplyPlan {
            base_index,
            now,
            starts,
            reasons: vec![],
            preemptions: vec![],
            resumes: vec![],
            shown: vec![],
        });
        for (k, &job_id) in ids.iter().enumerate() {
            now += STEP_MS;
            let token = log.state.jobs[&job_id].alloc_index;
            let node = names[k % NODES].clone();
            let outcome = RankOutcome::Exited { code: (job_id % 7 == 0) as i32, signal: 0 };
            log.apply(Command::JobEnded { job_id, token, node, outcome, now });
        }
        let due: Vec<u64> = log
            .state
            .jobs
            .iter()
            .filter(|(id, j)| !log.state.active.contains(id) && quorum_state::aged(j, now, MIN_AGE_MS))
            .map(|(id, _)| *id)
            .collect();
        if let Response::Purged { jobs } = log.apply(Command::PurgeJobs { jobs: due, min_age: MIN_AGE_MS, now }) {
            history.write(&jobs, log.index).expect("history write");
            moved += jobs.len() as u64;
        }
        let done = first + n;
        if done.is_multiple_of((jobs / 10).max(BATCH)) || done == jobs {
            let snapshot = snapshot::encode(&log.state).expect("snapshot");
            println!(
                "| {done} | {} | {} | {:.1} MB | {} MB | {} MB | {:.1} s |",
                log.state.jobs.len(),
                log.state.departed.len(),
                snapshot.len() as f64 / 1e6,
                rss_mb(),
                dir_mb(&path),
                started.elapsed().as_secs_f64()
            );
        }
    }
    history.flush().expect("flush");
    println!();
    println!(
        "{moved} jobs moved to the history; {:.0} bytes on disk per job",
        (dir_mb(&path) << 20) as f64 / moved as f64
    );

    // A user's jobs of a window in the middle of the run, the database reopened and (when this
    // process may) the kernel's page cache dropped: a cold read, as `sacct -u user3 -S -E` makes.
    drop(history);
    drop(db);
    let db = quorum_raft::open_db(&path, &[CF_HISTORY]).expect("reopen rocksdb");
    let history = History::new(db, Default::default()).expect("opening the job history");
    for minutes in [1u64, 10, 60] {
        let cold = drop_page_cache();
        let from = START_MS + (jobs * STEP_MS) / 2;
        let to = from + minutes * 60_000;
        let t = Instant::now();
        let ids = history.ended_since(Some("user3"), from, to).expect("index");
        let index_ms = t.elapsed().as_secs_f64() * 1e3;
        let mut read = 0;
        for page in ids.chunks(20_000) {
            read += history.get_many(page).expect("records").len();
        }
        let records_ms = t.elapsed().as_secs_f64() * 1e3;
        // The same window as the server lists it (a page of at most 20,000 jobs and about 2 MiB,
        // each page the next ids), every listing decoded, after dropping the cache again.
        drop_page_cache();
        let t = Instant::now();
        let (mut listed, mut after, mut pages) = (0, 0, 0);
        loop {
            let (page, more) = history.listed_since("user3", from, to, after, 20_000, 2 << 20).expect("listings");
            for (_, bytes) in &page {
                let info = <quorum_proto::api::JobInfo as prost::Message>::decode(&bytes[..]).expect("a listing");
                assert!(info.end_time_ms >= from && info.submit_time_ms <= to);
            }
            listed += page.len();
            pages += 1;
            match more {
                Some(last) => after = last,
                None => break,
            }
        }
        assert_eq!(listed, ids.len(), "the listings and the index agree");
        println!(
            "user3 ({} of its jobs in the history), {minutes} min window in the run's middle: {} jobs in the index in {index_ms:.1} ms, all {read} records read in {records_ms:.1} ms; listed from the index in {pages} pages in {:.1} ms ({})",
            moved / USERS,
            ids.len(),
            t.elapsed().as_secs_f64() * 1e3,
            if cold { "page cache dropped" } else { "block cache cold, page cache not dropped" }
        );
    }
}

/// Drops the kernel's page cache (root only): whether it could.
fn drop_page_cache() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}
