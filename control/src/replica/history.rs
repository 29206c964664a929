//! The job history: every job that left the hot state, as each replica's shell writes it when it
//! applies a `PurgeJobs` (apply hands the jobs over in `Response::Purged`). It lives in a RocksDB
//! column family of its own, on disk and not in memory, so a replica's memory stays flat however
//! long the cluster runs; every replica applies the same log and so writes the same history.
//!
//! Keys (ids and times big-endian, so that they sort as numbers):
//! - `j` id → the job, JSON (its script and environment only when the config keeps them);
//! - `u` user `\0` end id → submit time, then the job as listings show it (protobuf
//!   `JobInfo` in [`crate::wire::listed`] form): a user's jobs by end time, each where a window
//!   reads it (`sacct -u USER -S ... -E ...` reads one stretch of the disk and decodes no JSON).
//!   A copy of what the record says, made by the release that wrote it; a release that lists
//!   more of a job raises [`LAYOUT`], and the index is made again from the records on opening;
//! - `e` end id → submit time: every job by end time (`sacct -a -S ... -E ...`);
//! - `r` request id → id: a retried submit whose first job has left finds it here;
//! - `a` index id → nothing: every job in the order it entered the history, by the Raft index of
//!   the entry that moved it (the record's `archived`), which an exporter follows
//!   ([`History::entered_after`]): the same on every replica, since every replica applies the
//!   same entries and a copied record keeps its index;
//! - `v` → the layout's version: a history of an older layout gets its indexes again on
//!   opening (1 added `a`, 2 the listing in `u`);
//! - `m` → the longest any job took from its submit to its end (ms): a window's read of the
//!   end-time index stops where no job submitted inside the window can have ended.
//!
//! Writes skip the write-ahead log, which the Raft log shares (a synced log append waits for
//! every byte before it); [`History::flush`] makes them durable, and the state machine calls it
//! before it saves a snapshot that no longer holds the jobs. A crash before that replays the log
//! from the previous snapshot, whose `PurgeJobs` writes the same records again.
//!
//! A replica that installs a snapshot from its leader skips the entries that wrote the history
//! of the jobs the snapshot no longer holds. It marks its history incomplete up to the
//! snapshot's index (key `g`, written durably before the snapshot), answers no history read
//! while the mark is there (a caller is told to try again, not given a partial answer), and
//! copies the records from a peer whose own history is complete ([`super::catch_up`]); the mark
//! goes once they are durable. The snapshot stays the size of the hot state, and a regular
//! snapshot writes no history at all.

use std::sync::Arc;

use rocksdb::{Direction, FlushOptions, IteratorMode, WriteBatch, WriteOptions, DB};

use crate::model::{Job, JobId, Millis, Program};

/// Column family of the job history.
pub const CF_HISTORY: &str = "job_history";

const JOB: u8 = b'j';
const BY_USER: u8 = b'u';
const BY_END: u8 = b'e';
const BY_REQUEST: u8 = b'r';
const BY_ENTRY: u8 = b'a';
/// The layout's version, and the one this release writes.
const VERSION: &[u8] = b"v";
const LAYOUT: u64 = 2;
/// The longest a job in the history took from submit to end, in ms, big-endian.
const LONGEST: &[u8] = b"m";
/// The mark of an incomplete history: the Raft index of the snapshot installed, big-endian.
const GAP: &[u8] = b"g";

/// What the history keeps of a job's submit beyond its resources (Slurm's
/// `AccountingStoreFlags=job_script,job_env`); neither by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Keep {
    pub script: bool,
    pub env: bool,
}

/// One replica's job history.
#[derive(Clone)]
pub struct History {
    db: Arc<DB>,
    keep: Keep,
    /// The index its records are missing up to (the mark `g`); zero when complete. Held while
    /// the mark is set or taken away, so that a snapshot installed meanwhile keeps its mark.
    gap: Arc<std::sync::Mutex<u64>>,
    /// The longest a job written took from submit to end (`m`), in ms.
    longest: Arc<std::sync::atomic::AtomicU64>,
}

/// A read or write of the history failed (RocksDB, or a record it cannot decode), or a read
/// found it incomplete.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("job history: {0}")]
    Failed(String),
    #[error(
        "this replica's job history is still being copied from its peers (it installed a snapshot at index {0}); try again shortly"
    )]
    Incomplete(u64),
}

type Result<T> = std::result::Result<T, HistoryError>;

/// A record with its place in the order of entry: the index of the entry that moved it, its
/// id, and the record as stored.
pub type Entered = (u64, JobId, Vec<u8>);

/// A page of a user's listings (each job's id and its protobuf `JobInfo`), in id order, with the
/// last id given when more were left.
pub type Listings = (Vec<(JobId, Vec<u8>)>, Option<JobId>);

fn err(e: impl std::fmt::Display) -> HistoryError {
    HistoryError::Failed(e.to_string())
}

fn job_key(id: JobId) -> [u8; 9] {
    let mut k = [JOB; 9];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

fn user_prefix(user: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(user.len() + 2);
    k.push(BY_USER);
    k.extend_from_slice(user.as_bytes());
    k.push(0);
    k
}

fn end_and_id(prefix: Vec<u8>, end: Millis, id: JobId) -> Vec<u8> {
    let mut k = prefix;
    k.extend_from_slice(&end.to_be_bytes());
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn entry_key(index: u64, id: JobId) -> [u8; 17] {
    let mut k = [BY_ENTRY; 17];
    k[1..9].copy_from_slice(&index.to_be_bytes());
    k[9..].copy_from_slice(&id.to_be_bytes());
    k
}

/// A record as stored: the job, and the index of the entry that moved it to the history (0 for
/// one a replica of an older release wrote).
#[derive(serde::Serialize)]
struct Record<'a> {
    #[serde(flatten)]
    job: &'a Job,
    archived: u64,
}

/// What a stored record's indexes are made of, read without decoding the whole job.
#[derive(serde::Deserialize)]
struct Indexed {
    user: String,
    #[serde(default)]
    request_id: String,
    #[serde(default)]
    archived: u64,
}

/// How long a job took from its submit to its end (the bound of a window's read).
fn took(submit: Millis, end: Option<Millis>) -> Millis {
    end.unwrap_or(submit).saturating_sub(submit)
}

fn request_key(request_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(request_id.len() + 1);
    k.push(BY_REQUEST);
    k.extend_from_slice(request_id.as_bytes());
    k
}

/// Writes that skip the write-ahead log (see the module's notes).
fn no_wal() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.disable_wal(true);
    opts
}

/// The id at the end of an index key.
fn trailing_id(key: &[u8]) -> Option<JobId> {
    let tail: [u8; 8] = key.get(key.len().checked_sub(8)?..)?.try_into().ok()?;
    Some(JobId::from_be_bytes(tail))
}

/// The submit time a user's or the end-time index holds (first, in a user's).
fn submitted(value: &[u8]) -> Millis {
    value.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(Millis::from_be_bytes).unwrap_or(0)
}

/// The end a job is indexed under: when it ended (every job in the history has ended).
fn end_of(job: &Job) -> Millis {
    job.end_time.unwrap_or(job.submit_time)
}

impl History {
    pub fn new(db: Arc<DB>, keep: Keep) -> Result<History> {
        let history = History { db, keep, gap: Default::default(), longest: Default::default() };
        *history.gap.lock().unwrap_or_else(|p| p.into_inner()) = history.number(GAP)?;
        history.longest.store(history.number(LONGEST)?, std::sync::atomic::Ordering::Relaxed);
        history.upgrade()?;
        Ok(history)
    }

    /// The number a key of its own holds (`g`, `m`, `v`), big-endian; 0 when absent.
    fn number(&self, key: &[u8]) -> Result<u64> {
        let value = self.db.get_pinned_cf(self.cf()?, key).map_err(err)?;
        Ok(value.and_then(|b| <[u8; 8]>::try_from(&b[..]).ok()).map(u64::from_be_bytes).unwrap_or(0))
    }

    /// Gives a history of an older layout its indexes again (the entry index `a` came with
    /// layout 1, the listing in `u` with 2): every record's, the record itself untouched. Once,
    /// durably.
    fn upgrade(&self) -> Result<()> {
        if self.number(VERSION)? >= LAYOUT {
            return Ok(());
        }
        let cf = self.cf()?;
        let mut batch = WriteBatch::default();
        let (mut indexed, mut longest) = (0u64, 0u64);
        for item in self.db.iterator_cf(cf, IteratorMode::From(&[JOB], Direction::Forward)) {
            let (key, value) = item.map_err(err)?;
            if key.first() != Some(&JOB) || key.len() != 9 {
                break;
            }
            let job: Job = serde_json::from_slice(&value).map_err(err)?;
            let archived = serde_json::from_slice::<Indexed>(&value).map_err(err)?.archived;
            longest = longest.max(self.index(&mut batch, cf, &job, archived)?);
            indexed += 1;
            if batch.len() >= 10_000 {
                self.db.write_opt(std::mem::take(&mut batch), &no_wal()).map_err(err)?;
            }
        }
        batch.put_cf(cf, VERSION, LAYOUT.to_be_bytes());
        let longest = self.longest.load(std::sync::atomic::Ordering::Relaxed).max(longest);
        batch.put_cf(cf, LONGEST, longest.to_be_bytes());
        self.db.write_opt(batch, &no_wal()).map_err(err)?;
        self.longest.store(longest, std::sync::atomic::Ordering::Relaxed);
        self.flush()?;
        if indexed > 0 {
            tracing::info!(indexed, layout = LAYOUT, "job history: records indexed again for this release's layout");
        }
        Ok(())
    }

    /// The Raft index up to which records may be missing (a snapshot was installed), if any.
    pub fn gap(&self) -> Option<u64> {
        match *self.gap.lock().unwrap_or_else(|p| p.into_inner()) {
            0 => None,
            g => Some(g),
        }
    }

    /// Reads answer only a complete history.
    fn complete(&self) -> Result<()> {
        match self.gap() {
            Some(g) => Err(HistoryError::Incomplete(g)),
            None => Ok(()),
        }
    }

    /// Marks the history as missing what left the hot state up to `index` (a snapshot is being
    /// installed); durable before it returns.
    pub fn mark_gap(&self, index: u64) -> Result<()> {
        let mut gap = self.gap.lock().unwrap_or_else(|p| p.into_inner());
        let index = index.max(1).max(*gap);
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db.put_cf_opt(self.cf()?, GAP, index.to_be_bytes(), &opts).map_err(err)?;
        *gap = index;
        Ok(())
    }

    /// Takes the mark away once the records up to `index` are copied (made durable first);
    /// false when a later snapshot has moved the mark meanwhile.
    pub fn close_gap(&self, index: u64) -> Result<bool> {
        self.flush()?;
        let mut gap = self.gap.lock().unwrap_or_else(|p| p.into_inner());
        if *gap != index {
            return Ok(false);
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db.delete_cf_opt(self.cf()?, GAP, &opts).map_err(err)?;
        *gap = 0;
        Ok(true)
    }

    /// Up to `limit` records (and about `max_bytes`) after the job `after`, in id order, as
    /// stored: what a peer copies. With the last id given and whether none are left.
    pub fn page_after(&self, after: JobId, limit: usize, max_bytes: usize) -> Result<(Vec<Vec<u8>>, JobId, bool)> {
        let cf = self.cf()?;
        let (mut out, mut bytes, mut last) = (Vec::new(), 0usize, after);
        let Some(first) = after.checked_add(1) else { return Ok((out, last, true)) };
        for item in self.db.iterator_cf(cf, IteratorMode::From(&job_key(first), Direction::Forward)) {
            let (key, value) = item.map_err(err)?;
            let Some(id) = trailing_id(&key).filter(|_| key.first() == Some(&JOB) && key.len() == 9) else {
                break;
            };
            if out.len() >= limit || (bytes > 0 && bytes + value.len() > max_bytes) {
                return Ok((out, last, false));
            }
            bytes += value.len();
            out.push(value.to_vec());
            last = id;
        }
        Ok((out, last, true))
    }

    /// Calls `taken` once a point-in-time view of the history exists (a RocksDB snapshot), then
    /// `read` with every record of that view in id order, as stored: what a backup copies. Later
    /// writes and deletions do not change what `read` sees.
    pub fn with_view<T>(
        &self,
        taken: impl FnOnce(),
        read: impl FnOnce(&mut dyn Iterator<Item = std::result::Result<Vec<u8>, String>>) -> T,
    ) -> T {
        let snapshot = self.db.snapshot();
        taken();
        let Ok(cf) = self.cf() else {
            let mut failed = std::iter::once(Err::<Vec<u8>, String>(format!("missing column family {CF_HISTORY}")));
            return read(&mut failed);
        };
        let mut opts = rocksdb::ReadOptions::default();
        opts.set_snapshot(&snapshot);
        let iter = self.db.iterator_cf_opt(cf, opts, IteratorMode::From(&[JOB], Direction::Forward));
        let mut records = iter
            .map(|item| item.map_err(|e| format!("reading the job history: {e}")))
            .take_while(|item| item.as_ref().map_or(true, |(key, _)| key.first() == Some(&JOB) && key.len() == 9))
            .map(|item| item.map(|(_, value)| value.to_vec()));
        read(&mut records)
    }

    /// Writes records a peer sent ([`History::page_after`]), indexing them as its own, each at
    /// the index it entered the peer's history at.
    pub fn write_records(&self, records: &[Vec<u8>]) -> Result<()> {
        let cf = self.cf()?;
        let (mut batch, mut longest) = (WriteBatch::default(), 0);
        for r in records {
            let bad = |e: serde_json::Error| err(format!("a record a peer sent: {e}"));
            let job = serde_json::from_slice::<Job>(r).map_err(bad)?;
            let archived = serde_json::from_slice::<Indexed>(r).map_err(bad)?.archived;
            longest = longest.max(self.put(&mut batch, cf, &job, archived)?);
        }
        self.commit(batch, cf, longest)
    }

    /// Writes `batch`, with `longest` (the longest of its jobs took) when that is a new longest.
    fn commit(&self, mut batch: WriteBatch, cf: &rocksdb::ColumnFamily, longest: Millis) -> Result<()> {
        if longest > self.longest.load(std::sync::atomic::Ordering::Relaxed) {
            batch.put_cf(cf, LONGEST, longest.to_be_bytes());
        }
        self.db.write_opt(batch, &no_wal()).map_err(err)?;
        self.longest.fetch_max(longest, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Up to `limit` records (and about `max_bytes`) of the jobs that entered the history after
    /// `after` (the index of the entry that moved a job, then its id), in that order, as stored:
    /// what an exporter follows. Each with its position, and whether none are left.
    pub fn entered_after(&self, after: (u64, JobId), limit: usize, max_bytes: usize) -> Result<(Vec<Entered>, bool)> {
        self.complete()?;
        let cf = self.cf()?;
        let (mut out, mut bytes) = (Vec::new(), 0usize);
        let start = match after.1.checked_add(1) {
            Some(id) => entry_key(after.0, id),
            None => match after.0.checked_add(1) {
                Some(index) => entry_key(index, 0),
                None => return Ok((out, true)),
            },
        };
        for item in self.db.iterator_cf(cf, IteratorMode::From(&start, Direction::Forward)) {
            let (key, _) = item.map_err(err)?;
            if key.first() != Some(&BY_ENTRY) || key.len() != 17 {
                break;
            }
            let index = u64::from_be_bytes(key[1..9].try_into().map_err(err)?);
            let id = trailing_id(&key).ok_or_else(|| err("a short entry index key"))?;
            // Forgotten meanwhile (`purge_job_after_s`): its index entry went with it.
            let Some(record) = self.db.get_cf(cf, job_key(id)).map_err(err)? else { continue };
            if out.len() >= limit || (bytes > 0 && bytes + record.len() > max_bytes) {
                return Ok((out, false));
            }
            bytes += record.len();
            out.push((index, id, record));
        }
        Ok((out, true))
    }

    fn cf(&self) -> Result<&rocksdb::ColumnFamily> {
        self.db.cf_handle(CF_HISTORY).ok_or_else(|| err(format!("missing column family {CF_HISTORY}")))
    }

    /// The job as the history keeps it.
    fn record(&self, job: &Job) -> Job {
        let mut job = job.clone();
        if !(self.keep.script && self.keep.env) {
            let mut spec = (*job.spec).clone();
            if !self.keep.env {
                spec.env = Default::default();
            }
            if !self.keep.script {
                if let Program::Script(s) = &mut spec.program {
                    s.clear();
                }
            }
            job.spec = crate::model::Shared::new(spec);
        }
        job
    }

    /// Writes these jobs, moved to the history by the entry at `index` (idempotent: a job
    /// written again replaces itself).
    pub fn write(&self, jobs: &[crate::model::Shared<Job>], index: u64) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let cf = self.cf()?;
        let (mut batch, mut longest) = (WriteBatch::default(), 0);
        for job in jobs {
            longest = longest.max(self.put(&mut batch, cf, job, index)?);
        }
        self.commit(batch, cf, longest)?;
        quorum_raft::crash_point("history-write");
        Ok(())
    }

    /// A job's record and index entries, into `batch`: how long it took from submit to end.
    fn put(&self, batch: &mut WriteBatch, cf: &rocksdb::ColumnFamily, job: &Job, archived: u64) -> Result<Millis> {
        let job = self.record(job);
        batch.put_cf(cf, job_key(job.id), serde_json::to_vec(&Record { job: &job, archived }).map_err(err)?);
        self.index(batch, cf, &job, archived)
    }

    /// A recorded job's index entries, into `batch`: how long it took from submit to end.
    fn index(&self, batch: &mut WriteBatch, cf: &rocksdb::ColumnFamily, job: &Job, archived: u64) -> Result<Millis> {
        let end = end_of(job);
        let submitted = job.submit_time.to_be_bytes();
        let listing = crate::wire::listed(crate::wire::job_to_proto(job, false));
        let mut by_user = Vec::with_capacity(8 + prost::Message::encoded_len(&listing));
        by_user.extend_from_slice(&submitted);
        prost::Message::encode(&listing, &mut by_user).map_err(err)?;
        batch.put_cf(cf, end_and_id(user_prefix(&job.user), end, job.id), by_user);
        batch.put_cf(cf, end_and_id(vec![BY_END], end, job.id), submitted);
        batch.put_cf(cf, entry_key(archived, job.id), []);
        if !job.request_id.is_empty() {
            batch.put_cf(cf, request_key(&job.request_id), job.id.to_be_bytes());
        }
        Ok(took(job.submit_time, job.end_time))
    }

    /// Forgets up to `max` of the jobs that ended before `ended_before`, the earliest first,
    /// with every index entry of theirs: how many went, and whether more ended before then.
    /// Like [`History::write`], without the write-ahead log (a replay forgets them again).
    pub fn forget(&self, ended_before: Millis, max: u32) -> Result<(u32, bool)> {
        let cf = self.cf()?;
        let mut batch = WriteBatch::default();
        let mut count = 0u32;
        let prefix = [BY_END];
        for item in self.db.iterator_cf(cf, IteratorMode::From(&prefix, Direction::Forward)) {
            let (key, _) = item.map_err(err)?;
            if key.first() != Some(&BY_END) || key.len() != 17 {
                break;
            }
            let end = Millis::from_be_bytes(key[1..9].try_into().map_err(err)?);
            if end >= ended_before {
                break;
            }
            if count >= max {
                return self.db.write_opt(batch, &no_wal()).map_err(err).map(|()| (count, true));
            }
            let id = trailing_id(&key).ok_or_else(|| err("a short end-time index key"))?;
            if let Some(bytes) = self.db.get_pinned_cf(cf, job_key(id)).map_err(err)? {
                let job: Indexed = serde_json::from_slice(&bytes).map_err(err)?;
                batch.delete_cf(cf, end_and_id(user_prefix(&job.user), end, id));
                batch.delete_cf(cf, entry_key(job.archived, id));
                if !job.request_id.is_empty() && self.by_request(&job.request_id)? == Some(id) {
                    batch.delete_cf(cf, request_key(&job.request_id));
                }
            }
            batch.delete_cf(cf, job_key(id));
            batch.delete_cf(cf, &key);
            count += 1;
        }
        self.db.write_opt(batch, &no_wal()).map_err(err).map(|()| (count, false))
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<()> {
        let mut opts = FlushOptions::default();
        opts.set_wait(true);
        self.db.flush_cf_opt(self.cf()?, &opts).map_err(err)
    }

    pub fn get(&self, id: JobId) -> Result<Option<Job>> {
        self.complete()?;
        match self.db.get_pinned_cf(self.cf()?, job_key(id)).map_err(err)? {
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(err),
            None => Ok(None),
        }
    }

    /// The jobs with ids in `from..=to`, in id order.
    pub fn range(&self, from: JobId, to: JobId) -> Result<Vec<Job>> {
        self.complete()?;
        let cf = self.cf()?;
        let mut out = Vec::new();
        let start = job_key(from);
        for item in self.db.iterator_cf(cf, IteratorMode::From(&start, Direction::Forward)) {
            let (key, value) = item.map_err(err)?;
            if key.first() != Some(&JOB) {
                break;
            }
            match trailing_id(&key) {
                Some(id) if id <= to => out.push(serde_json::from_slice(&value).map_err(err)?),
                _ => break,
            }
        }
        Ok(out)
    }

    /// The job a submit with this request id made, if it has left the hot state.
    ///
    /// Answered while the history is incomplete too: what it may lack left the hot state
    /// `min_job_age` or more before the snapshot, far longer ago than a client retries a submit,
    /// and refusing submits until the copy ends would stop a new leader taking jobs for as long.
    pub fn by_request(&self, request_id: &str) -> Result<Option<JobId>> {
        let Some(bytes) = self.db.get_pinned_cf(self.cf()?, request_key(request_id)).map_err(err)? else {
            return Ok(None);
        };
        Ok(<[u8; 8]>::try_from(&bytes[..]).ok().map(JobId::from_be_bytes))
    }

    /// The ids of the jobs (of `user`, or everyone's) that ended at or after `ended_after` and
    /// were submitted at or before `submitted_before`, in end order. Reads the index only, and
    /// only as far as a job submitted by then can have ended (the longest any job took).
    pub fn ended_since(&self, user: Option<&str>, ended_after: Millis, submitted_before: Millis) -> Result<Vec<JobId>> {
        let prefix = match user {
            Some(u) => user_prefix(u),
            None => vec![BY_END],
        };
        let mut ids = Vec::new();
        self.window(prefix, ended_after, submitted_before, |id, _| ids.push(id))?;
        Ok(ids)
    }

    /// Each entry of the end-time index under `prefix` (a user's, or everyone's) of a job that
    /// ended at or after `ended_after` and was submitted at or before `submitted_before`, in end
    /// order, to `visit` with its value after the submit time. Reads only as far as a job
    /// submitted by then can have ended (the longest any job took).
    fn window(
        &self,
        prefix: Vec<u8>,
        ended_after: Millis,
        submitted_before: Millis,
        mut visit: impl FnMut(JobId, &[u8]),
    ) -> Result<()> {
        self.complete()?;
        let start = end_and_id(prefix.clone(), ended_after, 0);
        let last_end = submitted_before.saturating_add(self.longest.load(std::sync::atomic::Ordering::Relaxed));
        let cf = self.cf()?;
        for item in self.db.iterator_cf(cf, IteratorMode::From(&start, Direction::Forward)) {
            let (key, value) = item.map_err(err)?;
            if !key.starts_with(&prefix) || key.len() != prefix.len() + 16 {
                break;
            }
            let end = <[u8; 8]>::try_from(&key[prefix.len()..prefix.len() + 8]).map(Millis::from_be_bytes).unwrap_or(0);
            if end > last_end {
                break;
            }
            if value.len() < 8 || submitted(&value) > submitted_before {
                continue;
            }
            visit(trailing_id(&key).ok_or_else(|| err("a short end-time index key"))?, &value[8..]);
        }
        Ok(())
    }

    /// A user's jobs as listings show them (protobuf `JobInfo`, [`crate::wire::listed`]), of
    /// those with ids above `after` that ended at or after `ended_after` and were submitted at or
    /// before `submitted_before`: the lowest ids, in id order, at most `limit` of them and about
    /// `max_bytes` (always one when any). With the last id given when more were left.
    ///
    /// One read of the user's stretch of the index, which holds the listings: no record is
    /// looked up or decoded. However large the window, it holds at most one page.
    pub fn listed_since(
        &self,
        user: &str,
        ended_after: Millis,
        submitted_before: Millis,
        after: JobId,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Listings> {
        let limit = limit.max(1);
        // The lowest ids seen so far that fit, the highest on top; `left` once one did not.
        let mut kept = std::collections::BinaryHeap::<(JobId, Vec<u8>)>::new();
        let (mut bytes, mut left) = (0usize, false);
        self.window(user_prefix(user), ended_after, submitted_before, |id, listing| {
            if id <= after {
                return;
            }
            if kept.len() >= limit && kept.peek().is_some_and(|(top, _)| *top < id) {
                left = true;
                return;
            }
            bytes += listing.len();
            kept.push((id, listing.to_vec()));
            while kept.len() > limit || (kept.len() > 1 && bytes > max_bytes) {
                if let Some((_, dropped)) = kept.pop() {
                    bytes -= dropped.len();
                }
                left = true;
            }
        })?;
        let page = kept.into_sorted_vec();
        let read_up_to = if left { page.last().map(|(id, _)| *id) } else { None };
        Ok((page, read_up_to))
    }

    /// These jobs, those the history has, in the order asked.
    pub fn get_many(&self, ids: &[JobId]) -> Result<Vec<Job>> {
        self.complete()?;
        let cf = self.cf()?;
        let keys = ids.iter().map(|id| (cf, job_key(*id)));
        let mut out = Vec::with_capacity(ids.len());
        for value in self.db.multi_get_cf(keys) {
            if let Some(bytes) = value.map_err(err)? {
                out.push(serde_json::from_slice(&bytes).map_err(err)?);
            }
        }
        Ok(out)
    }
}
