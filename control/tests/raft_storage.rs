//! openraft's storage conformance suite, run against the real RocksDB log store and the
//! controller's state machine in a temporary directory.

use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use quorum_control::replica::store::{StateMachineStore, CF_SNAPSHOT};
use quorum_control::replica::TypeConfig;
use quorum_raft::log_store::LogStore;

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore<TypeConfig>, StateMachineStore, tempfile::TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore<TypeConfig>, StateMachineStore), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = quorum_raft::open_db(&dir.path().join("db"), &[CF_SNAPSHOT]).expect("open rocksdb");
        let log = LogStore::new(db.clone()).expect("log store");
        let sm = StateMachineStore::open(db, quorum_state::FEATURE_LEVEL)?;
        Ok((dir, log, sm))
    }
}

#[test]
fn rocksdb_store_passes_openraft_suite() {
    Suite::test_all(RocksBuilder).expect("openraft storage suite");
}

#[tokio::test]
async fn log_survives_reopen() {
    use openraft::storage::RaftLogStorage;
    use openraft::{RaftLogReader, Vote};
    let dir = tempfile::tempdir().unwrap();
    {
        let db = quorum_raft::open_db(&dir.path().join("db"), &[CF_SNAPSHOT]).unwrap();
        let mut log = LogStore::<TypeConfig>::new(db).unwrap();
        log.save_vote(&Vote::new(3, 2)).await.unwrap();
    }
    let db = quorum_raft::open_db(&dir.path().join("db"), &[CF_SNAPSHOT]).unwrap();
    let mut log = LogStore::<TypeConfig>::new(db).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
    assert!(log.try_get_log_entries(0..10).await.unwrap().is_empty());
}
