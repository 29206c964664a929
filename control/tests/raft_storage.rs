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
        let history = History::new(db.clone(), Default::default());
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
