//! The state machine as openraft sees it: applies committed entries through [`quorum_state::apply`],
//! builds and installs snapshots, and persists the latest snapshot in RocksDB so that a
//! restarted replica resumes from it and replays only the log after it.
//!
//! [`quorum_state::apply`]: quorum_state::apply

use std::io::Cursor;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use openraft::storage::{RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftSnapshotBuilder,
    StorageError, StorageIOError, StoredMembership,
};
use rocksdb::DB;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};

use super::history::History;
use super::types::TypeConfig;
use quorum_state::{ClusterState, Response};

pub use super::snapshot_file::CF_SNAPSHOT;
use super::snapshot_file::{self, Layout};

type StorageResult<T> = Result<T, StorageError<u64>>;

/// The applied state and where in the log it stands.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AppliedState {
    pub state: ClusterState,
    pub last_applied: Option<LogId<u64>>,
    pub membership: StoredMembership<u64, BasicNode>,
}

impl AppliedState {
    pub fn applied_index(&self) -> u64 {
        self.last_applied.map(|l| l.index).unwrap_or(0)
    }
}

/// What the state machine shares with the services and leader loops of its replica.
pub struct SharedState {
    applied: RwLock<AppliedState>,
    /// The last applied index; changes wake the leader's dispatcher.
    pub applied_index: watch::Sender<u64>,
    /// Signalled when an applied command may let the scheduler start something.
    pub sched_kick: Notify,
    /// The digests taken at the latest digest points, as (index, digest), oldest first.
    digests: std::sync::Mutex<std::collections::VecDeque<(u64, u64)>>,
    /// The jobs that left the state, as this replica wrote them when it applied their purge.
    pub history: History,
    /// Signalled when an installed snapshot leaves the history incomplete ([`super::catch_up`]).
    pub history_gap: Notify,
    /// How long each snapshot this replica built took (copy, encoding, writing), and the size
    /// of the newest, for `/metrics`.
    pub snapshot_seconds: prometheus_client::metrics::histogram::Histogram,
    pub snapshot_bytes: prometheus_client::metrics::gauge::Gauge,
}

/// Digest points remembered per replica.
const DIGESTS_KEPT: usize = 16;

impl SharedState {
    fn new(applied: AppliedState, history: History) -> Arc<Self> {
        let index = applied.applied_index();
        Arc::new(Self {
            applied: RwLock::new(applied),
            applied_index: watch::Sender::new(index),
            sched_kick: Notify::new(),
            digests: Default::default(),
            history,
            history_gap: Notify::new(),
            // 10 ms to about 10 minutes.
            snapshot_seconds: prometheus_client::metrics::histogram::Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.01, 2.0, 17),
            ),
            snapshot_bytes: Default::default(),
        })
    }

    /// The digest this replica took at digest point `index`, if it applied that entry itself
    /// (a replica that installed a snapshot past it did not).
    pub fn digest_at(&self, index: u64) -> Option<u64> {
        let digests = self.digests.lock().unwrap_or_else(|p| p.into_inner());
        digests.iter().find(|(i, _)| *i == index).map(|(_, d)| *d)
    }

    fn record_digest(&self, index: u64, digest: u64) {
        let mut digests = self.digests.lock().unwrap_or_else(|p| p.into_inner());
        if digests.len() == DIGESTS_KEPT {
            digests.pop_front();
        }
        digests.push_back((index, digest));
    }

    /// A read view of the applied state. Never hold it across an await.
    pub fn read(&self) -> RwLockReadGuard<'_, AppliedState> {
        self.applied.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, AppliedState> {
        self.applied.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn io_err(subject: ErrorSubject<u64>, verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::new(subject, verb, AnyError::error(e.to_string())).into()
}

/// The openraft state machine of one replica.
pub struct StateMachineStore {
    shared: Arc<SharedState>,
    db: Arc<DB>,
    snapshot_seq: u64,
    /// The highest feature level this replica applies.
    level: u32,
}

impl StateMachineStore {
    /// Opens the state machine, restoring the latest persisted snapshot if there is one.
    pub fn open(db: Arc<DB>, history: History, level: u32) -> Result<Self, StorageError<u64>> {
        let mut applied = AppliedState { state: ClusterState::new(), ..AppliedState::default() };
        if let Some((meta, data)) = read_snapshot(&db)? {
            applied = decode_snapshot(&meta, &data)?;
        }
        Ok(Self { shared: SharedState::new(applied, history), db, snapshot_seq: 0, level })
    }

    pub fn shared(&self) -> Arc<SharedState> {
        self.shared.clone()
    }
}

fn read_snapshot(db: &DB) -> StorageResult<Option<snapshot_file::Stored>> {
    snapshot_file::read(db).map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))
}

fn decode_snapshot(meta: &SnapshotMeta<u64, BasicNode>, data: &[u8]) -> StorageResult<AppliedState> {
    let state = quorum_state::snapshot::decode(data)
        .map_err(|e| io_err(ErrorSubject::Snapshot(Some(meta.signature())), ErrorVerb::Read, e))?;
    Ok(AppliedState { state, last_applied: meta.last_log_id, membership: meta.last_membership.clone() })
}

/// Runs snapshot work (encoding, decoding, writing: seconds of CPU at a million jobs) on a
/// thread of its own at the lowest CPU priority, off the async workers. On a busy machine the
/// Raft core, whose heartbeats hold off elections, and the API then go first.
async fn in_background<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, std::io::Error> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("snapshot".into()).spawn(move || {
        // SAFETY: setpriority on this thread's own id changes nothing but its niceness; raising
        // one's own niceness is always permitted. A failure leaves the default priority.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
        }
        let _ = tx.send(work());
    })?;
    rx.await.map_err(|_| std::io::Error::other("the snapshot thread ended without an answer"))
}

/// Stores the snapshot durably off the async workers; hands the data back for openraft. The job
/// history is made durable first: the snapshot may no longer hold jobs whose history records
/// were written without the write-ahead log, and once it is saved the log that would write them
/// again is purged.
async fn persist_snapshot(
    db: Arc<DB>,
    history: History,
    meta: SnapshotMeta<u64, BasicNode>,
    data: Vec<u8>,
) -> StorageResult<Vec<u8>> {
    let signature = meta.signature();
    let result = in_background(move || {
        history.flush().map_err(|e| e.to_string())?;
        snapshot_file::write(&db, meta, &data, Layout::default()).map(|()| data)
    })
    .await;
    match result {
        Ok(Ok(data)) => Ok(data),
        Ok(Err(e)) => Err(io_err(ErrorSubject::Snapshot(Some(signature)), ErrorVerb::Write, e)),
        Err(e) => Err(io_err(ErrorSubject::Snapshot(Some(signature)), ErrorVerb::Write, e)),
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let began = std::time::Instant::now();
        // A copy under the lock, encoded outside it: applies wait for the copy only.
        let (state, last_applied, membership) = {
            let applied = self.shared.read();
            (applied.state.clone(), applied.last_applied, applied.membership.clone())
        };
        let data = in_background(move || quorum_state::snapshot::encode(&state))
            .await
            .map_err(|e| io_err(ErrorSubject::StateMachine, ErrorVerb::Read, e))?
            .map_err(|e| io_err(ErrorSubject::StateMachine, ErrorVerb::Read, e))?;
        self.snapshot_seq += 1;
        let snapshot_id = match last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, self.snapshot_seq),
            None => format!("none-{}", self.snapshot_seq),
        };
        let meta = SnapshotMeta { last_log_id: last_applied, last_membership: membership, snapshot_id };
        let data = persist_snapshot(self.db.clone(), self.shared.history.clone(), meta.clone(), data).await?;
        self.shared.snapshot_bytes.set(i64::try_from(data.len()).unwrap_or(i64::MAX));
        self.shared.snapshot_seconds.observe(began.elapsed().as_secs_f64());
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>)> {
        let applied = self.shared.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Response>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        quorum_raft::crash_point("apply-before");
        let mut responses = Vec::new();
        let mut wake = false;
        let index = {
            let mut applied = self.shared.write();
            for entry in entries {
                if let EntryPayload::Normal(command) = &entry.payload {
                    let (needs, what) = command.level();
                    if needs > self.level {
                        // What a replica of the older release meets: an entry it cannot decode.
                        tracing::error!(
                            index = entry.log_id.index,
                            needs,
                            level = self.level,
                            what,
                            "entry above this replica's feature level"
                        );
                        return Err(io_err(
                            ErrorSubject::Apply(entry.log_id),
                            ErrorVerb::Read,
                            format!("{what} needs feature level {needs}; this replica applies up to {}", self.level),
                        ));
                    }
                }
                applied.last_applied = Some(entry.log_id);
                let response = match entry.payload {
                    EntryPayload::Blank => Response::Ok,
                    EntryPayload::Normal(command) => {
                        wake |= command.wakes_scheduler();
                        let mut response = quorum_state::apply(&mut applied.state, entry.log_id.index, command);
                        if let Response::ForgetHistory { ended_before, max } = response {
                            let (count, more) = self
                                .shared
                                .history
                                .forget(ended_before, max)
                                .map_err(|e| io_err(ErrorSubject::Apply(entry.log_id), ErrorVerb::Write, e))?;
                            response = Response::Forgotten { count, more };
                        }
                        match &response {
                            Response::Digest { digest } => self.shared.record_digest(entry.log_id.index, *digest),
                            // Written before the state that no longer holds them is visible.
                            Response::Purged { jobs } => self
                                .shared
                                .history
                                .write(jobs, entry.log_id.index)
                                .map_err(|e| io_err(ErrorSubject::Apply(entry.log_id), ErrorVerb::Write, e))?,
                            _ => {}
                        }
                        response
                    }
                    EntryPayload::Membership(m) => {
                        applied.membership = StoredMembership::new(Some(entry.log_id), m);
                        Response::Ok
                    }
                };
                responses.push(response);
            }
            applied.applied_index()
        };
        self.shared.applied_index.send_replace(index);
        if wake {
            self.shared.sched_kick.notify_one();
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Self {
            shared: self.shared.clone(),
            db: self.db.clone(),
            snapshot_seq: self.snapshot_seq + 1000,
            level: self.level,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        quorum_raft::crash_point("snapshot-install");
        let data = snapshot.into_inner();
        // The entries this snapshot stands for wrote history records this replica never got:
        // marked before the snapshot is saved, so that a crash cannot lose the mark.
        let at = meta.last_log_id.map(|l| l.index).unwrap_or(0);
        let history = self.shared.history.clone();
        in_background(move || history.mark_gap(at))
            .await
            .map_err(|e| io_err(ErrorSubject::Snapshot(Some(meta.signature())), ErrorVerb::Write, e))?
            .map_err(|e| io_err(ErrorSubject::Snapshot(Some(meta.signature())), ErrorVerb::Write, e))?;
        self.shared.history_gap.notify_one();
        let (installed, data) = {
            let owned = meta.clone();
            in_background(move || decode_snapshot(&owned, &data).map(|state| (state, data)))
                .await
                .map_err(|e| io_err(ErrorSubject::Snapshot(Some(meta.signature())), ErrorVerb::Read, e))??
        };
        persist_snapshot(self.db.clone(), self.shared.history.clone(), meta.clone(), data).await?;
        let index = installed.applied_index();
        *self.shared.write() = installed;
        self.shared.applied_index.send_replace(index);
        self.shared.sched_kick.notify_one();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let db = self.db.clone();
        let stored = tokio::task::spawn_blocking(move || read_snapshot(&db))
            .await
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Read, e))??;
        Ok(stored.map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
    }
}
