//! The Raft log and vote in RocksDB.
//!
//! Entries live in [`CF_LOG`](crate::CF_LOG) under their big-endian index so that iteration
//! order is log order; the vote, the committed log id and the last purged log id live in
//! [`CF_META`](crate::CF_META). Writes that openraft relies on for safety (appends, truncation,
//! votes) are synced to the WAL on a blocking thread before they are acknowledged.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
};
use rocksdb::{WriteBatch, WriteOptions, DB};

use crate::{QuorumTypeConfig, CF_LOG, CF_META};

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

type StorageResult<T> = Result<T, StorageError<u64>>;

/// The log store of one replica. Cloning shares the database.
pub struct LogStore<C> {
    db: Arc<DB>,
    committed: Arc<AtomicU64>,
    _types: PhantomData<C>,
}

impl<C> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        Self { db: self.db.clone(), committed: self.committed.clone(), _types: PhantomData }
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn io_err(subject: ErrorSubject<u64>, verb: ErrorVerb, e: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::new(subject, verb, AnyError::new(&e)).into()
}

impl<C: QuorumTypeConfig> LogStore<C> {
    /// The database must have been opened with [`crate::open_db`].
    pub fn new(db: Arc<DB>) -> crate::Result<Self> {
        for cf in [CF_LOG, CF_META] {
            if db.cf_handle(cf).is_none() {
                return Err(crate::Error::MissingColumnFamily(cf));
            }
        }
        Ok(Self { db, committed: Arc::new(AtomicU64::new(0)), _types: PhantomData })
    }

    /// The committed index as last saved by openraft, shared for status reports.
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    fn cf_log(&self) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(CF_LOG).expect("checked in LogStore::new")
    }

    fn cf_meta(&self) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(CF_META).expect("checked in LogStore::new")
    }

    fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        subject: ErrorSubject<u64>,
    ) -> StorageResult<Option<T>> {
        match self.db.get_cf(self.cf_meta(), key) {
            Ok(None) => Ok(None),
            Ok(Some(bytes)) => {
                serde_json::from_slice(&bytes).map(Some).map_err(|e| io_err(subject, ErrorVerb::Read, e))
            }
            Err(e) => Err(io_err(subject, ErrorVerb::Read, e)),
        }
    }

    /// Writes a batch built by `fill` on a blocking thread, synced to the WAL when `sync`.
    async fn write(
        &self,
        subject: ErrorSubject<u64>,
        sync: bool,
        fill: impl FnOnce(&DB, &mut WriteBatch) -> Result<(), serde_json::Error> + Send + 'static,
    ) -> StorageResult<()> {
        let db = self.db.clone();
        let result = tokio::task::spawn_blocking(move || -> Result<(), String> {
            let mut batch = WriteBatch::default();
            fill(&db, &mut batch).map_err(|e| e.to_string())?;
            let mut opts = WriteOptions::default();
            opts.set_sync(sync);
            db.write_opt(batch, &opts).map_err(|e| e.to_string())
        })
        .await;
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(msg)) => Err(io_err(subject, ErrorVerb::Write, std::io::Error::other(msg))),
            Err(join) => Err(io_err(subject, ErrorVerb::Write, join)),
        }
    }

    fn last_entry(&self) -> StorageResult<Option<C::Entry>> {
        let mut iter = self.db.raw_iterator_cf(self.cf_log());
        iter.seek_to_last();
        match iter.value() {
            Some(bytes) => {
                serde_json::from_slice(bytes).map(Some).map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))
            }
            None => iter.status().map(|_| None).map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e)),
        }
    }
}

impl<C: QuorumTypeConfig> RaftLogReader<C> for LogStore<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<C::Entry>> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let mut entries = Vec::new();
        let mut iter = self.db.raw_iterator_cf(self.cf_log());
        iter.seek(index_key(start));
        while let (Some(key), Some(value)) = (iter.key(), iter.value()) {
            let index = u64::from_be_bytes(key.try_into().map_err(|_| {
                io_err(ErrorSubject::Logs, ErrorVerb::Read, std::io::Error::other("log key is not 8 bytes"))
            })?);
            if !range.contains(&index) {
                break;
            }
            let entry: C::Entry =
                serde_json::from_slice(value).map_err(|e| io_err(ErrorSubject::LogIndex(index), ErrorVerb::Read, e))?;
            entries.push(entry);
            iter.next();
        }
        iter.status().map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))?;
        Ok(entries)
    }
}

impl<C: QuorumTypeConfig> RaftLogStorage<C> for LogStore<C> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<C>> {
        let last_purged: Option<LogId<u64>> = self.read_meta(KEY_LAST_PURGED, ErrorSubject::Logs)?;
        let last = self.last_entry()?.map(|e| e.log_id).or(last_purged);
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> StorageResult<()> {
        let value = serde_json::to_vec(vote).map_err(|e| io_err(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        self.write(ErrorSubject::Vote, true, move |db, batch| {
            batch.put_cf(db.cf_handle(CF_META).expect("opened with CF_META"), KEY_VOTE, value);
            Ok(())
        })
        .await
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<u64>>> {
        self.read_meta(KEY_VOTE, ErrorSubject::Vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> StorageResult<()> {
        if let Some(c) = committed {
            self.committed.store(c.index, Ordering::Relaxed);
        }
        let value = serde_json::to_vec(&committed).map_err(|e| io_err(ErrorSubject::Store, ErrorVerb::Write, e))?;
        // Losing the committed index in a crash is safe: it is only a hint for re-applying logs
        // at start-up, so this write is not synced.
        self.write(ErrorSubject::Store, false, move |db, batch| {
            batch.put_cf(db.cf_handle(CF_META).expect("opened with CF_META"), KEY_COMMITTED, value);
            Ok(())
        })
        .await
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<u64>>> {
        Ok(self.read_meta::<Option<LogId<u64>>>(KEY_COMMITTED, ErrorSubject::Store)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<C>) -> StorageResult<()>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        for entry in entries {
            let value =
                serde_json::to_vec(&entry).map_err(|e| io_err(ErrorSubject::Log(entry.log_id), ErrorVerb::Write, e))?;
            encoded.push((entry.log_id.index, value));
        }
        let result = self
            .write(ErrorSubject::Logs, true, move |db, batch| {
                let cf = db.cf_handle(CF_LOG).expect("opened with CF_LOG");
                for (index, value) in encoded {
                    batch.put_cf(cf, index_key(index), value);
                }
                Ok(())
            })
            .await;
        match &result {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        result
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        self.write(ErrorSubject::Logs, true, move |db, batch| {
            let cf = db.cf_handle(CF_LOG).expect("opened with CF_LOG");
            batch.delete_range_cf(cf, index_key(log_id.index), index_key(u64::MAX));
            // delete_range excludes its end; u64::MAX is never a real index
            Ok(())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        let value = serde_json::to_vec(&log_id).map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Delete, e))?;
        self.write(ErrorSubject::Logs, true, move |db, batch| {
            batch.put_cf(db.cf_handle(CF_META).expect("opened with CF_META"), KEY_LAST_PURGED, value);
            let cf = db.cf_handle(CF_LOG).expect("opened with CF_LOG");
            batch.delete_range_cf(cf, index_key(0), index_key(log_id.index + 1));
            Ok(())
        })
        .await
    }
}
