//! The Raft log and vote in RocksDB.
//!
//! Entries live in [`CF_LOG`](crate::CF_LOG) under their big-endian index so that iteration
//! order is log order; the vote, the committed log id and the last purged log id live in
//! [`CF_META`](crate::CF_META). Writes that openraft relies on for safety (appends, truncation,
//! votes) are synced to the WAL before they are acknowledged.
//!
//! Every write goes through one writer thread, in the order it was asked for. An append follows
//! openraft's storage contract: it returns once its entries are readable, held in the log's
//! [`EntryCache`], and the writer encodes them, writes and syncs them and then reports them
//! flushed. The cache keeps the newest entries decoded, and the newest of those encoded too:
//! applying an entry and replicating it read it from memory instead of decoding it from
//! RocksDB again, and the append-entries request to each follower carries the very bytes written
//! to the log (see [`crate::network`]). A follower keeps the bytes it received
//! ([`EntryCache::receive`]) and writes those, so an entry is encoded once in the whole cluster.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    AnyError, Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
};
use rocksdb::{WriteBatch, WriteOptions, DB};

use crate::{QuorumTypeConfig, CF_LOG, CF_META};

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// How many of the newest written entries the cache keeps decoded: enough for the state machine
/// (a few entries behind the log) and a follower a little behind.
const CACHED_ENTRIES: usize = 256;
/// How many of the newest written entries also keep their encoding, for replication. An entry
/// of 64 submits with environments is about 200 KB.
const CACHED_ENCODINGS: u64 = 32;

type StorageResult<T> = Result<T, StorageError<u64>>;

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn io_err(subject: ErrorSubject<u64>, verb: ErrorVerb, e: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::new(subject, verb, AnyError::new(&e)).into()
}

/// One entry of the log's tail.
struct Cached<C: QuorumTypeConfig> {
    entry: Arc<Entry<C>>,
    /// The entry's JSON, as written to the log, while it is among the newest.
    json: Option<Json>,
    written: bool,
}

struct Cache<C: QuorumTypeConfig> {
    /// The newest entries, contiguous, including every one appended and not yet written.
    tail: BTreeMap<u64, Cached<C>>,
    /// Encodings a follower received for entries it is about to append.
    received: BTreeMap<LogId<u64>, Json>,
}

/// The newest log entries in memory, shared by the log store, its readers, the network (which
/// sends their encoding) and the RPC service (which hands over what it received).
pub struct EntryCache<C: QuorumTypeConfig>(Arc<Mutex<Cache<C>>>);

impl<C: QuorumTypeConfig> Clone for EntryCache<C> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<C: QuorumTypeConfig> Default for EntryCache<C> {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(Cache { tail: BTreeMap::new(), received: BTreeMap::new() })))
    }
}

impl<C: QuorumTypeConfig> EntryCache<C> {
    fn lock(&self) -> MutexGuard<'_, Cache<C>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The JSON this replica wrote for the entry `log_id`, if it still holds it. An entry is
    /// known by its log id: two entries with the same one are the same entry (Raft's log
    /// matching).
    pub fn encoded(&self, log_id: &LogId<u64>) -> Option<Arc<[u8]>> {
        let cache = self.lock();
        cache.tail.get(&log_id.index).filter(|c| c.entry.log_id == *log_id).and_then(|c| c.json.clone())
    }

    /// Keeps the encodings of entries received from the leader, so that appending them writes
    /// these bytes instead of encoding the entries again, until the returned guard is dropped
    /// (the request answered, failed, or abandoned by a client that gave up waiting).
    pub fn receive(&self, entries: Vec<ReceivedEntry>) -> Received<C> {
        let ids = entries.iter().map(|(id, _)| *id).collect();
        self.lock().received.extend(entries);
        Received { cache: self.clone(), ids }
    }

    /// How many entries the tail holds, and how many of them keep their encoding.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let cache = self.lock();
        (cache.tail.len(), cache.tail.values().filter(|c| c.json.is_some()).count())
    }
}

/// An entry's JSON, as written to the log.
type Json = Arc<[u8]>;
/// An entry's log id and the JSON it came as from the leader.
pub type ReceivedEntry = (LogId<u64>, Arc<[u8]>);
/// Entries to write, each with its JSON when it came encoded.
type ToWrite<C> = Vec<(Arc<Entry<C>>, Option<Json>)>;
/// Entries written, with their JSON.
type Written<C> = Vec<(Arc<Entry<C>>, Json)>;
/// Puts and deletes for the writer to add to its batch.
type Fill = Box<dyn FnOnce(&DB, &mut WriteBatch) + Send>;

/// Encodings held by [`EntryCache::receive`]; dropping this lets them go.
#[must_use = "the encodings are forgotten when this is dropped"]
pub struct Received<C: QuorumTypeConfig> {
    cache: EntryCache<C>,
    ids: Vec<LogId<u64>>,
}

impl<C: QuorumTypeConfig> Drop for Received<C> {
    fn drop(&mut self) {
        let mut cache = self.cache.lock();
        for id in &self.ids {
            cache.received.remove(id);
        }
    }
}

/// What the writer thread is asked to do, in order.
enum Op<C: QuorumTypeConfig> {
    Append { entries: ToWrite<C>, callback: LogFlushed<C> },
    Write { fill: Fill, sync: bool, done: Option<tokio::sync::oneshot::Sender<Result<(), String>>> },
}

/// What to do once a batch is written.
enum Done<C: QuorumTypeConfig> {
    Flushed(LogFlushed<C>, Written<C>),
    Written(tokio::sync::oneshot::Sender<Result<(), String>>),
}

/// The writer thread: takes every operation waiting, writes them as one batch (synced if any of
/// them needs it), and then reports each.
fn run_writer<C: QuorumTypeConfig>(db: Arc<DB>, cache: EntryCache<C>, ops: mpsc::Receiver<Op<C>>) {
    let cf = db.cf_handle(CF_LOG).expect("opened with CF_LOG");
    while let Ok(first) = ops.recv() {
        let mut batch = WriteBatch::default();
        let mut sync = false;
        let mut done = Vec::new();
        let mut failed = None;
        for op in std::iter::once(first).chain(std::iter::from_fn(|| ops.try_recv().ok())) {
            match op {
                Op::Append { entries, callback } => {
                    sync = true;
                    let mut written = Vec::with_capacity(entries.len());
                    for (entry, json) in entries {
                        let json = match json {
                            Some(json) => json,
                            None => match serde_json::to_vec(&*entry) {
                                Ok(v) => Arc::from(v),
                                Err(e) => {
                                    failed = Some(format!("encoding log entry {}: {e}", entry.log_id));
                                    continue;
                                }
                            },
                        };
                        batch.put_cf(cf, index_key(entry.log_id.index), &json);
                        written.push((entry, json));
                    }
                    done.push(Done::Flushed(callback, written));
                }
                Op::Write { fill, sync: s, done: d } => {
                    fill(&db, &mut batch);
                    sync |= s;
                    done.extend(d.map(Done::Written));
                }
            }
        }
        let result = match failed {
            Some(e) => Err(e),
            None => {
                let mut opts = WriteOptions::default();
                opts.set_sync(sync);
                db.write_opt(batch, &opts).map_err(|e| e.to_string())
            }
        };
        if result.is_ok() {
            if done.iter().any(|d| matches!(d, Done::Flushed(..))) {
                crate::crash_point("raft-after-append");
            }
            let mut guard = cache.lock();
            for d in &done {
                if let Done::Flushed(_, written) = d {
                    for (entry, json) in written {
                        mark_written(&mut guard, entry, json);
                    }
                }
            }
        }
        for d in done {
            match d {
                Done::Flushed(callback, _) => {
                    callback.log_io_completed(result.clone().map_err(std::io::Error::other));
                }
                Done::Written(tx) => {
                    let _ = tx.send(result.clone());
                }
            }
        }
        if let Err(e) = &result {
            tracing::error!(error = %e, "writing the raft log");
        }
    }
}

/// Records that `entry` is on disk, and lets the oldest entries (and older encodings) go.
fn mark_written<C: QuorumTypeConfig>(cache: &mut Cache<C>, entry: &Arc<Entry<C>>, json: &Json) {
    let index = entry.log_id.index;
    // Truncated and appended again since: the cache holds a newer entry at this index.
    let Some(cached) = cache.tail.get_mut(&index).filter(|c| Arc::ptr_eq(&c.entry, entry)) else {
        return;
    };
    cached.written = true;
    cached.json.get_or_insert_with(|| json.clone());
    if let Some(old) = index.checked_sub(CACHED_ENCODINGS).and_then(|i| cache.tail.get_mut(&i)) {
        old.json = None;
    }
    while cache.tail.len() > CACHED_ENTRIES && cache.tail.first_key_value().is_some_and(|(_, c)| c.written) {
        cache.tail.pop_first();
    }
}

/// The writer thread's queue. Dropping it (with the last clone of the log store) ends the
/// thread after it has written what was queued, and waits for that: then the database is free
/// to open again.
struct Writer<C: QuorumTypeConfig> {
    queue: Option<mpsc::Sender<Op<C>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl<C: QuorumTypeConfig> Drop for Writer<C> {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The log store of one replica. Cloning shares the database, the cache and the writer.
pub struct LogStore<C: QuorumTypeConfig> {
    db: Arc<DB>,
    committed: Arc<AtomicU64>,
    cache: EntryCache<C>,
    writer: Arc<Writer<C>>,
}

impl<C: QuorumTypeConfig> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        Self {
            db: self.db.clone(),
            committed: self.committed.clone(),
            cache: self.cache.clone(),
            writer: self.writer.clone(),
        }
    }
}

impl<C: QuorumTypeConfig> LogStore<C> {
    /// The database must have been opened with [`crate::open_db`].
    pub fn new(db: Arc<DB>) -> crate::Result<Self> {
        for cf in [CF_LOG, CF_META] {
            if db.cf_handle(cf).is_none() {
                return Err(crate::Error::MissingColumnFamily(cf));
            }
        }
        let cache = EntryCache::default();
        let (tx, rx) = mpsc::channel();
        let (writer_db, writer_cache) = (db.clone(), cache.clone());
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || run_writer(writer_db, writer_cache, rx))
            .map_err(|e| crate::Error::Thread(e.to_string()))?;
        Ok(Self {
            db,
            committed: Arc::new(AtomicU64::new(0)),
            cache,
            writer: Arc::new(Writer { queue: Some(tx), thread: Some(thread) }),
        })
    }

    /// The committed index as last saved by openraft, shared for status reports.
    pub fn committed_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    /// The newest entries in memory, to share with the network and the RPC service.
    pub fn entry_cache(&self) -> EntryCache<C> {
        self.cache.clone()
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

    fn send(&self, subject: ErrorSubject<u64>, op: Op<C>) -> StorageResult<()> {
        let queue = self.writer.queue.as_ref().expect("taken only on drop");
        queue.send(op).map_err(|_| {
            io_err(subject, ErrorVerb::Write, std::io::Error::other("the raft log's writer thread has stopped"))
        })
    }

    /// Queues a batch built by `fill` behind every write asked for before, synced to the WAL
    /// when `sync`, and waits until it is written.
    async fn write(
        &self,
        subject: ErrorSubject<u64>,
        sync: bool,
        fill: impl FnOnce(&DB, &mut WriteBatch) + Send + 'static,
    ) -> StorageResult<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(subject.clone(), Op::Write { fill: Box::new(fill), sync, done: Some(tx) })?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(msg)) => Err(io_err(subject, ErrorVerb::Write, std::io::Error::other(msg))),
            Err(_) => Err(io_err(subject, ErrorVerb::Write, std::io::Error::other("the raft log's writer stopped"))),
        }
    }

    fn last_entry(&self) -> StorageResult<Option<LogId<u64>>> {
        if let Some((_, c)) = self.cache.lock().tail.last_key_value() {
            return Ok(Some(c.entry.log_id));
        }
        let mut iter = self.db.raw_iterator_cf(self.cf_log());
        iter.seek_to_last();
        match iter.value() {
            Some(bytes) => serde_json::from_slice::<Entry<C>>(bytes)
                .map(|e| Some(e.log_id))
                .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e)),
            None => iter.status().map(|_| None).map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e)),
        }
    }

    /// Entries `start..end` (`end` unbounded when `None`) from RocksDB.
    fn read_from_db(&self, start: u64, end: Option<u64>, into: &mut Vec<Entry<C>>) -> StorageResult<()> {
        let mut iter = self.db.raw_iterator_cf(self.cf_log());
        iter.seek(index_key(start));
        while let (Some(key), Some(value)) = (iter.key(), iter.value()) {
            let index = u64::from_be_bytes(key.try_into().map_err(|_| {
                io_err(ErrorSubject::Logs, ErrorVerb::Read, std::io::Error::other("log key is not 8 bytes"))
            })?);
            if end.is_some_and(|end| index >= end) {
                break;
            }
            let entry: Entry<C> =
                serde_json::from_slice(value).map_err(|e| io_err(ErrorSubject::LogIndex(index), ErrorVerb::Read, e))?;
            into.push(entry);
            iter.next();
        }
        iter.status().map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Read, e))
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
        let end = match range.end_bound() {
            Bound::Included(i) => Some(i.saturating_add(1)),
            Bound::Excluded(i) => Some(*i),
            Bound::Unbounded => None,
        };
        if end.is_some_and(|end| end <= start) {
            return Ok(Vec::new());
        }
        // The cache first, then RocksDB below the cache's first index: an entry leaves the
        // cache only after it is written, so whatever the cache no longer holds is on disk.
        let (cached_from, cached) = {
            let cache = self.cache.lock();
            let first = cache.tail.first_key_value().map(|(i, _)| *i);
            let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
            let entries: Vec<Arc<Entry<C>>> =
                cache.tail.range((Bound::Included(start), upper)).map(|(_, c)| c.entry.clone()).collect();
            (first, entries)
        };
        let mut entries = Vec::new();
        match cached_from {
            Some(first) if first <= start => {}
            Some(first) => self.read_from_db(start, Some(end.map_or(first, |e| e.min(first))), &mut entries)?,
            None => self.read_from_db(start, end, &mut entries)?,
        }
        entries.extend(cached.iter().map(|e| Entry::clone(e)));
        Ok(entries)
    }
}

impl<C: QuorumTypeConfig> RaftLogStorage<C> for LogStore<C> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<C>> {
        let last_purged: Option<LogId<u64>> = self.read_meta(KEY_LAST_PURGED, ErrorSubject::Logs)?;
        let last = self.last_entry()?.or(last_purged);
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> StorageResult<()> {
        let value = serde_json::to_vec(vote).map_err(|e| io_err(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        self.write(ErrorSubject::Vote, true, move |db, batch| {
            batch.put_cf(db.cf_handle(CF_META).expect("opened with CF_META"), KEY_VOTE, value);
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
        // at start-up, so this write is neither synced nor waited for (the writer logs a
        // failure, and the next synced write fails the same way).
        let fill = move |db: &DB, batch: &mut WriteBatch| {
            batch.put_cf(db.cf_handle(CF_META).expect("opened with CF_META"), KEY_COMMITTED, value);
        };
        self.send(ErrorSubject::Store, Op::Write { fill: Box::new(fill), sync: false, done: None })
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<u64>>> {
        Ok(self.read_meta::<Option<LogId<u64>>>(KEY_COMMITTED, ErrorSubject::Store)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<C>) -> StorageResult<()>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let batch: ToWrite<C> = {
            let mut cache = self.cache.lock();
            entries
                .into_iter()
                .map(|entry| {
                    let entry = Arc::new(entry);
                    let json = cache.received.remove(&entry.log_id);
                    let cached = Cached { entry: entry.clone(), json: json.clone(), written: false };
                    cache.tail.insert(entry.log_id.index, cached);
                    (entry, json)
                })
                .collect()
        };
        if batch.is_empty() {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        self.send(ErrorSubject::Logs, Op::Append { entries: batch, callback })
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        // Gone from memory at once (nothing reads past the log's end), from disk in order
        // behind the appends queued before.
        self.cache.lock().tail.split_off(&log_id.index);
        self.write(ErrorSubject::Logs, true, move |db, batch| {
            let cf = db.cf_handle(CF_LOG).expect("opened with CF_LOG");
            batch.delete_range_cf(cf, index_key(log_id.index), index_key(u64::MAX));
            // delete_range excludes its end; u64::MAX is never a real index
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        let value = serde_json::to_vec(&log_id).map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Delete, e))?;
        self.cache.lock().tail.retain(|&index, _| index > log_id.index);
        self.write(ErrorSubject::Logs, true, move |db, batch| {
            batch.put_cf(db.cf_handle(CF_META).expect("opened with CF_META"), KEY_LAST_PURGED, value);
            let cf = db.cf_handle(CF_LOG).expect("opened with CF_LOG");
            batch.delete_range_cf(cf, index_key(0), index_key(log_id.index + 1));
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::Cursor; // named by declare_raft_types!

    use openraft::{CommittedLeaderId, EntryPayload};

    openraft::declare_raft_types!(Types: D = String, R = String);

    fn entry(term: u64, index: u64) -> Entry<Types> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(format!("command {index} of term {term}")),
        }
    }

    async fn append(log: &mut LogStore<Types>, entries: Vec<Entry<Types>>) {
        use openraft::storage::RaftLogStorageExt;
        log.blocking_append(entries).await.unwrap();
    }

    fn open(dir: &std::path::Path) -> LogStore<Types> {
        LogStore::new(crate::open_db(&dir.join("db"), &[]).unwrap()).unwrap()
    }

    /// Reads cross from RocksDB into the cache in order; the cache keeps only the newest entries,
    /// and only the newest of those encoded; everything is on disk after a reopen.
    #[tokio::test]
    async fn reads_span_disk_and_cache_and_the_cache_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let total = CACHED_ENTRIES as u64 * 3;
        {
            let mut log = open(dir.path());
            for start in (1..=total).step_by(8) {
                append(&mut log, (start..start + 8).map(|i| entry(1, i)).collect()).await;
            }
            let (held, encoded) = log.entry_cache().held();
            assert_eq!((held, encoded), (CACHED_ENTRIES, CACHED_ENCODINGS as usize));
            let all = log.try_get_log_entries(1..=total).await.unwrap();
            assert_eq!(all, (1..=total).map(|i| entry(1, i)).collect::<Vec<_>>());
            let across = log.try_get_log_entries(total - CACHED_ENTRIES as u64 - 5..total - 200).await.unwrap();
            let want: Vec<_> = (total - CACHED_ENTRIES as u64 - 5..total - 200).map(|i| entry(1, i)).collect();
            assert_eq!(across, want);
            let newest = log.entry_cache().encoded(&entry(1, total).log_id).expect("newest entry encoded");
            assert_eq!(&*newest, serde_json::to_vec(&entry(1, total)).unwrap().as_slice());
            assert!(log.entry_cache().encoded(&entry(2, total).log_id).is_none(), "another term's entry");
        }
        let mut log = open(dir.path());
        assert_eq!(log.entry_cache().held(), (0, 0));
        assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(entry(1, total).log_id));
        let all = log.try_get_log_entries(1..).await.unwrap();
        assert_eq!(all.len() as u64, total);
        assert_eq!(all.last(), Some(&entry(1, total)));
    }

    /// A follower writes an entry's bytes as the leader sent them, not encoded again; what it did
    /// not receive it encodes itself.
    #[tokio::test]
    async fn received_bytes_are_written_as_they_came() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path());
        let sent = entry(1, 1);
        // Valid JSON for the same entry, spelled differently from what serde writes.
        let spelled = format!(" {} ", serde_json::to_string(&sent).unwrap());
        let held = log.entry_cache().receive(vec![(sent.log_id, Arc::from(spelled.as_bytes()))]);
        append(&mut log, vec![sent.clone(), entry(1, 2)]).await;
        drop(held);
        assert!(log.entry_cache().0.lock().unwrap().received.is_empty(), "forgotten with the guard");
        let db = log.db.clone();
        let cf = db.cf_handle(CF_LOG).unwrap();
        assert_eq!(db.get_cf(cf, index_key(1)).unwrap().unwrap(), spelled.as_bytes());
        assert_eq!(db.get_cf(cf, index_key(2)).unwrap().unwrap(), serde_json::to_vec(&entry(1, 2)).unwrap());
        assert_eq!(log.try_get_log_entries(1..3).await.unwrap(), vec![sent, entry(1, 2)]);
    }

    /// After a truncation neither memory nor disk has the old tail, and the new entries replace it.
    #[tokio::test]
    async fn truncate_and_purge_reach_memory_and_disk() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut log = open(dir.path());
            append(&mut log, (1..=20).map(|i| entry(1, i)).collect()).await;
            log.truncate(entry(1, 15).log_id).await.unwrap();
            assert_eq!(log.try_get_log_entries(10..).await.unwrap(), (10..15).map(|i| entry(1, i)).collect::<Vec<_>>());
            append(&mut log, (15..=16).map(|i| entry(2, i)).collect()).await;
            log.purge(entry(1, 5).log_id).await.unwrap();
            let state = log.get_log_state().await.unwrap();
            assert_eq!(state.last_purged_log_id, Some(entry(1, 5).log_id));
            assert_eq!(state.last_log_id, Some(entry(2, 16).log_id));
            assert_eq!(log.try_get_log_entries(..7).await.unwrap(), vec![entry(1, 6)]);
        }
        let mut log = open(dir.path());
        let want: Vec<_> = (6..15).map(|i| entry(1, i)).chain((15..=16).map(|i| entry(2, i))).collect();
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), want);
    }
}
