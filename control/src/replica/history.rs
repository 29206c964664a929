//! The job history: every job that left the hot state, as each replica's shell writes it when it
//! applies a `PurgeJobs` (apply hands the jobs over in `Response::Purged`). It lives in a RocksDB
//! column family of its own, on disk and not in memory, so a replica's memory stays flat however
//! long the cluster runs; every replica applies the same log and so writes the same history.
//!
//! Keys (ids and times big-endian, so that they sort as numbers):
//! - `j` id → the job, JSON (its script and environment only when the config keeps them);
//! - `u` user `\0` end id → submit time: a user's jobs by end time (`sacct -u USER -S ... -E ...`);
//! - `e` end id → submit time: every job by end time (`sacct -a -S ... -E ...`);
//! - `r` request id → id: a retried submit whose first job has left finds it here.
//!
//! Writes skip the write-ahead log, which the Raft log shares (a synced log append waits for
//! every byte before it); [`History::flush`] makes them durable, and the state machine calls it
//! before it saves a snapshot that no longer holds the jobs. A crash before that replays the log
//! from the previous snapshot, whose `PurgeJobs` writes the same records again.

use std::sync::Arc;

use rocksdb::{Direction, FlushOptions, IteratorMode, WriteBatch, WriteOptions, DB};

use crate::model::{Job, JobId, Millis, Program};

/// Column family of the job history.
pub const CF_HISTORY: &str = "job_history";

const JOB: u8 = b'j';
const BY_USER: u8 = b'u';
const BY_END: u8 = b'e';
const BY_REQUEST: u8 = b'r';

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
}

/// A read or write of the history failed (RocksDB, or a record it cannot decode).
#[derive(Debug, thiserror::Error)]
#[error("job history: {0}")]
pub struct HistoryError(String);

type Result<T> = std::result::Result<T, HistoryError>;

fn err(e: impl std::fmt::Display) -> HistoryError {
    HistoryError(e.to_string())
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

fn request_key(request_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(request_id.len() + 1);
    k.push(BY_REQUEST);
    k.extend_from_slice(request_id.as_bytes());
    k
}

/// The id at the end of an index key.
fn trailing_id(key: &[u8]) -> Option<JobId> {
    let tail: [u8; 8] = key.get(key.len().checked_sub(8)?..)?.try_into().ok()?;
    Some(JobId::from_be_bytes(tail))
}

/// The end a job is indexed under: when it ended (every job in the history has ended).
fn end_of(job: &Job) -> Millis {
    job.end_time.unwrap_or(job.submit_time)
}

impl History {
    pub fn new(db: Arc<DB>, keep: Keep) -> History {
        History { db, keep }
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

    /// Writes these jobs (idempotent: a job written again replaces itself).
    pub fn write(&self, jobs: &[crate::model::Shared<Job>]) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let cf = self.cf()?;
        let mut batch = WriteBatch::default();
        for job in jobs {
            let record = serde_json::to_vec(&self.record(job)).map_err(err)?;
            let end = end_of(job);
            batch.put_cf(cf, job_key(job.id), record);
            let submitted = job.submit_time.to_be_bytes();
            batch.put_cf(cf, end_and_id(user_prefix(&job.user), end, job.id), submitted);
            batch.put_cf(cf, end_and_id(vec![BY_END], end, job.id), submitted);
            if !job.request_id.is_empty() {
                batch.put_cf(cf, request_key(&job.request_id), job.id.to_be_bytes());
            }
        }
        let mut opts = WriteOptions::default();
        opts.disable_wal(true);
        self.db.write_opt(batch, &opts).map_err(err)
    }

    /// Makes every write so far durable.
    pub fn flush(&self) -> Result<()> {
        let mut opts = FlushOptions::default();
        opts.set_wait(true);
        self.db.flush_cf_opt(self.cf()?, &opts).map_err(err)
    }

    pub fn get(&self, id: JobId) -> Result<Option<Job>> {
        match self.db.get_pinned_cf(self.cf()?, job_key(id)).map_err(err)? {
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(err),
            None => Ok(None),
        }
    }

    /// The jobs with ids in `from..=to`, in id order.
    pub fn range(&self, from: JobId, to: JobId) -> Result<Vec<Job>> {
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
    pub fn by_request(&self, request_id: &str) -> Result<Option<JobId>> {
        let Some(bytes) = self.db.get_pinned_cf(self.cf()?, request_key(request_id)).map_err(err)? else {
            return Ok(None);
        };
        Ok(<[u8; 8]>::try_from(&bytes[..]).ok().map(JobId::from_be_bytes))
    }

    /// The ids of the jobs (of `user`, or everyone's) that ended at or after `ended_after` and
    /// were submitted at or before `submitted_before`, in end order. Reads the index only.
    pub fn ended_since(&self, user: Option<&str>, ended_after: Millis, submitted_before: Millis) -> Result<Vec<JobId>> {
        let prefix = match user {
            Some(u) => user_prefix(u),
            None => vec![BY_END],
        };
        let start = end_and_id(prefix.clone(), ended_after, 0);
        let cf = self.cf()?;
        let mut ids = Vec::new();
        for item in self.db.iterator_cf(cf, IteratorMode::From(&start, Direction::Forward)) {
            let (key, value) = item.map_err(err)?;
            if !key.starts_with(&prefix) || key.len() != prefix.len() + 16 {
                break;
            }
            let submitted = <[u8; 8]>::try_from(&value[..]).map(Millis::from_be_bytes).unwrap_or(0);
            if submitted > submitted_before {
                continue;
            }
            ids.extend(trailing_id(&key));
        }
        Ok(ids)
    }

    /// These jobs, those the history has, in the order asked.
    pub fn get_many(&self, ids: &[JobId]) -> Result<Vec<Job>> {
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
