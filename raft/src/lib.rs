//! Quorum's Raft plumbing, independent of what the state machine holds.
//!
//! - [`log_store`]: the Raft log, vote and committed index in RocksDB. An append is
//!   acknowledged to openraft only after RocksDB has synced its WAL; a vote is durable before
//!   `save_vote` returns.
//! - [`network`]: the client side of replica-to-replica RPCs over tonic.
//! - [`service`]: the server side, a gRPC service kept apart from the public API.
//!
//! Everything is generic over a [`QuorumTypeConfig`]: the controller crate declares the type
//! config with its own command and response types and implements the state machine itself.

use std::io::Cursor;

pub mod log_store;
pub mod network;
pub mod service;

pub use openraft;
pub use openraft::BasicNode;

/// A place where a replica can be made to crash, as a power cut or `kill -9` would there: with
/// the `failpoints` feature (only tests build it), `FAILPOINTS=NAME=return` (or `1*return`,
/// `20%return`) in the controller's environment, read by [`arm_crash_points`], aborts the
/// process the next time (the first time, a fifth of the times) it passes; without the feature
/// it does nothing. The names are [`CRASH_POINTS`]. The `fail` crate keeps the registry and
/// parses the actions, as etcd's and TiKV's failpoints do.
#[inline]
pub fn crash_point(name: &'static str) {
    #[cfg(feature = "failpoints")]
    if fail::eval(name, |_| ()).is_some() {
        eprintln!("crash point {name}: aborting, as FAILPOINTS asked");
        std::process::abort();
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

/// Arms the crash points `FAILPOINTS` names (with the `failpoints` feature; otherwise says, when
/// it is set, that this build has none). Called once, at the controller's start.
pub fn arm_crash_points() {
    let Ok(asked) = std::env::var("FAILPOINTS") else { return };
    #[cfg(feature = "failpoints")]
    {
        tracing::warn!(failpoints = %asked, "crash points armed");
        std::mem::forget(fail::FailScenario::setup());
    }
    #[cfg(not(feature = "failpoints"))]
    tracing::warn!(failpoints = %asked, "FAILPOINTS is set, but this build has no crash points (a release build)");
}

/// Every crash point of the controller, for the harnesses that arm them.
pub const CRASH_POINTS: [&str; 7] = [
    // Entries synced to the log, before openraft hears so (raft/src/log_store.rs).
    "raft-after-append",
    // Committed entries about to be applied (control/src/replica/store.rs).
    "apply-before",
    // A client's command committed and applied, before the answer goes back (Replica::write).
    "write-before-reply",
    // A plan that starts jobs committed, before its launches are sent (leader/schedule.rs).
    "plan-before-launch",
    // A snapshot received, before it is installed (control/src/replica/store.rs).
    "snapshot-install",
    // A replica added as a learner, before the membership change that makes it a voter
    // (control/src/server/cluster.rs).
    "membership-change",
    // Job history records written, before the last applied index is recorded with them
    // (control/src/replica/history.rs).
    "history-write",
];

/// The shape of type config every Quorum replica uses: `u64` node ids, nodes known by their
/// address, the standard log entry (of commands that can be cloned, so that the log store hands
/// out entries it holds in memory) and snapshots held in memory as bytes.
pub trait QuorumTypeConfig:
    openraft::RaftTypeConfig<
    NodeId = u64,
    Node = BasicNode,
    D: Clone,
    Entry = openraft::Entry<Self>,
    SnapshotData = Cursor<Vec<u8>>,
>
{
}

impl<T> QuorumTypeConfig for T where
    T: openraft::RaftTypeConfig<
        NodeId = u64,
        Node = BasicNode,
        D: Clone,
        Entry = openraft::Entry<T>,
        SnapshotData = Cursor<Vec<u8>>,
    >
{
}

/// Errors opening or using the replica's RocksDB.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("rocksdb at {path}: {source}")]
    Open { path: String, source: rocksdb::Error },
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("missing column family {0}")]
    MissingColumnFamily(&'static str),
    #[error("starting the raft log's writer thread: {0}")]
    Thread(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Column family holding log entries, keyed by big-endian index.
pub const CF_LOG: &str = "raft_log";
/// Column family holding the vote, the committed log id and the last purged log id.
pub const CF_META: &str = "raft_meta";

/// Opens (creating if needed) the replica's RocksDB with the Raft column families and any
/// `extra` ones the caller keeps beside them.
pub fn open_db(path: &std::path::Path, extra: &[&str]) -> Result<std::sync::Arc<rocksdb::DB>> {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    let mut cfs: Vec<&str> = vec![CF_LOG, CF_META];
    cfs.extend_from_slice(extra);
    // Log entries and snapshots are JSON, with much repeated (environments, names): LZ4 shrinks
    // their table files several times for little CPU.
    let descriptors = cfs.iter().map(|name| {
        let mut cf = rocksdb::Options::default();
        cf.set_compression_type(rocksdb::DBCompressionType::Lz4);
        // Memtables of 16 MB, not RocksDB's 64: up to two per column family stay resident, and
        // the log's entries are purged soon after they reach a table anyway.
        cf.set_write_buffer_size(16 << 20);
        rocksdb::ColumnFamilyDescriptor::new(*name, cf)
    });
    let db = rocksdb::DB::open_cf_descriptors(&opts, path, descriptors)
        .map_err(|source| Error::Open { path: path.display().to_string(), source })?;
    Ok(std::sync::Arc::new(db))
}
