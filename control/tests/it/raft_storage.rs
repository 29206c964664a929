//! openraft's storage conformance suite, run against the real RocksDB log store and the
//! controller's state machine in a temporary directory.

use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use quorum_control::replica::history::{History, CF_HISTORY};
use quorum_control::replica::store::{StateMachineStore, CF_SNAPSHOT};
use quorum_control::replica::TypeConfig;
use quorum_raft::log_store::LogStore;

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore<TypeConfig>, StateMachineStore, tempfile::TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore<TypeConfig>, StateMachineStore), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = quorum_raft::open_db(&dir.path().join("db"), &[CF_SNAPSHOT, CF_HISTORY]).expect("open rocksdb");
        let log = LogStore::new(db.clone()).expect("log store");
        let history = History::new(db.clone(), Default::default()).unwrap();
        let sm = StateMachineStore::open(db, history, quorum_state::FEATURE_LEVEL)?;
        Ok((dir, log, sm))
    }
}

#[test]
fn rocksdb_store_passes_openraft_suite() {
    Suite::test_all(RocksBuilder).expect("openraft storage suite");
}

/// What the log holds on disk is what a restarted replica reads back: the vote, the entries
/// (real commands, one with a multi-megabyte script), the committed id, and what was purged
/// and truncated stays gone.
#[tokio::test]
async fn log_survives_reopen() {
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, Vote};
    use quorum_model::{JobSpec, Program};
    use quorum_state::Command;
    let id = |index: u64| LogId::new(CommittedLeaderId::new(3, 2), index);
    let entry = |index: u64| {
        let script = if index == 4 {
            "#!/bin/sh\n".to_string() + &"# padding\n".repeat(300_000)
        } else {
            format!("echo {index}")
        };
        let spec = JobSpec { name: format!("job{index}"), program: Program::Script(script), ..Default::default() };
        let command = Command::SubmitJob {
            spec: Box::new(spec),
            user: "alice".into(),
            now: index,
            request_id: format!("alice:r{index}"),
        };
        Entry::<TypeConfig> { log_id: id(index), payload: EntryPayload::Normal(command) }
    };
    let written: Vec<Entry<TypeConfig>> = (1..=9).map(entry).collect();
    let dir = tempfile::tempdir().unwrap();
    {
        let db = quorum_raft::open_db(&dir.path().join("db"), &[CF_SNAPSHOT]).unwrap();
        let mut log = LogStore::<TypeConfig>::new(db).unwrap();
        log.save_vote(&Vote::new(3, 2)).await.unwrap();
        log.blocking_append(written.clone()).await.unwrap();
        log.save_committed(Some(id(7))).await.unwrap();
        log.purge(id(2)).await.unwrap();
        log.truncate(id(9)).await.unwrap();
    }
    let db = quorum_raft::open_db(&dir.path().join("db"), &[CF_SNAPSHOT]).unwrap();
    let mut log = LogStore::<TypeConfig>::new(db).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
    assert_eq!(log.read_committed().await.unwrap(), Some(id(7)));
    let state = log.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(id(2)), Some(id(8))));
    let read = log.try_get_log_entries(0..20).await.unwrap();
    let json = |entries: &[Entry<TypeConfig>]| serde_json::to_string(entries).unwrap();
    assert_eq!(json(&read), json(&written[2..8]), "entries 3 to 8, as written");
    assert!(read.iter().any(|e| serde_json::to_string(e).unwrap().len() > 3_000_000));
}

/// Set in the child process of [`the_history_is_durable_before_a_snapshot_that_no_longer_holds_its_jobs`].
const CRASH_CHILD: &str = "QUORUM_TEST_HISTORY_CRASH";

/// A replica applies a job's end and its purge, saves a snapshot (`snapshot`) or not, and is
/// killed: it ends with `_exit`, so RocksDB is never closed and whatever is only in memory is
/// lost, as with `kill -9`.
async fn apply_purge_and_die(dir: &std::path::Path, snapshot: bool) -> ! {
    use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
    use quorum_model::{Allocation, NodeAllocation, PlannedStart, RankOutcome};
    use quorum_state::testing::{partition, register, spec};
    use quorum_state::{Command, ReplicaVersion};

    let db = quorum_raft::open_db(&dir.join("db"), &[CF_SNAPSHOT, CF_HISTORY]).expect("open rocksdb");
    let history = History::new(db.clone(), Default::default()).unwrap();
    let mut sm = StateMachineStore::open(db, history, quorum_state::FEATURE_LEVEL).expect("state machine");
    let level = ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "test".into() };
    let start = PlannedStart {
        job_id: 1,
        allocation: Allocation {
            nodes: vec![NodeAllocation { node: "n1".into(), cpus: 1, mem_mb: 1024, gpus: vec![], het_group: 0 }],
            cpu_ways: None,
        },
    };
    let commands = vec![
        Command::SetReplicaVersions { versions: (1..=3).map(|id| (id, level.clone())).collect(), now: 1 },
        Command::SetPartitions { partitions: vec![partition("gpu", "n1", true)], now: 1 },
        register("n1", 8, 0),
        Command::SubmitJob { spec: Box::new(spec(&["true"])), user: "alice".into(), now: 2, request_id: "r".into() },
        Command::ApplyPlan {
            base_index: 4,
            now: 3,
            starts: vec![start],
            reasons: vec![],
            preemptions: vec![],
            resumes: vec![],
            shown: vec![],
        },
        Command::JobEnded {
            job_id: 1,
            token: 5,
            node: "n1".into(),
            outcome: RankOutcome::Exited { code: 0, signal: 0 },
            now: 4,
        },
        Command::PurgeJobs { jobs: vec![1], min_age: 1_000, now: 10_000 },
    ];
    let entries = commands.into_iter().enumerate().map(|(i, command)| Entry::<TypeConfig> {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), i as u64 + 1),
        payload: EntryPayload::Normal(command),
    });
    sm.apply(entries.collect::<Vec<_>>()).await.expect("apply");
    if snapshot {
        let mut builder = sm.get_snapshot_builder().await;
        builder.build_snapshot().await.expect("snapshot");
    }
    // SAFETY: ends this process at once, as a kill would; nothing after it runs.
    unsafe { libc::_exit(0) }
}

/// The snapshot no longer holds a purged job, and the log that would purge it again is dropped
/// once the snapshot is saved: so the history must be on disk before the snapshot is. A replica
/// killed just after saving one still has the job in its history when it restarts; one killed
/// before saving any (its history never flushed) has lost it, which its log would write again.
#[tokio::test]
async fn the_history_is_durable_before_a_snapshot_that_no_longer_holds_its_jobs() {
    if let Some(dir) = std::env::var_os(CRASH_CHILD) {
        let snapshot = std::env::var("QUORUM_TEST_SNAPSHOT").is_ok_and(|v| v == "1");
        apply_purge_and_die(std::path::Path::new(&dir), snapshot).await;
    }
    for snapshot in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &this_test("the_history_is_durable_before_a_snapshot_that_no_longer_holds_its_jobs"),
                "--nocapture",
            ])
            .env(CRASH_CHILD, dir.path())
            .env("QUORUM_TEST_SNAPSHOT", if snapshot { "1" } else { "0" })
            .status()
            .unwrap();
        assert!(status.success(), "the replica's process failed before its end");
        let db = quorum_raft::open_db(&dir.path().join("db"), &[CF_SNAPSHOT, CF_HISTORY]).unwrap();
        let history = History::new(db.clone(), Default::default()).unwrap();
        let sm = StateMachineStore::open(db, history.clone(), quorum_state::FEATURE_LEVEL).unwrap();
        let restarted = sm.shared();
        let state = &restarted.read().state;
        let recorded = history.get(1).unwrap();
        if snapshot {
            assert!(!state.jobs.contains_key(&1), "the snapshot was taken after the purge");
            let job = recorded.expect("the purged job is in the history after the kill");
            assert_eq!(job.state, quorum_model::JobState::Completed);
        } else {
            assert!(state.jobs.is_empty(), "no snapshot: the state starts from the log");
            assert!(recorded.is_none(), "without a snapshot nothing flushed the history: the kill lost it");
        }
    }
}

/// The name the test harness knows test `name` of this module by (`raft_storage::...`).
fn this_test(name: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{name}")
}
