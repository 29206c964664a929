//! A replica's simulated disk, which outlives the replica's crashes, and the Raft log store and
//! state machine over it.
//!
//! What was written but not yet synced is lost when the replica crashes, except for a prefix of
//! it (a torn tail: the disk got part of the writes). Syncs take the disk's latency, one after
//! another. A fault makes every write fail (EIO, or ENOSPC): openraft then stops the replica,
//! as the real log store's error stops a controller.
//!
//! The log store answers openraft as the real one does (an append is acknowledged once synced;
//! a vote is durable before `save_vote` returns; the committed index is a hint that may be
//! lost); the state machine applies entries with the real `quorum_state::apply` and snapshots
//! with the real snapshot encoding.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use quorum_state::{ClusterState, Command, Response};
use tokio::time::Instant;

use crate::runtime::SimConfig;
use crate::world::{Fuse, Point};

type StorageResult<T> = Result<T, StorageError<u64>>;

/// When the kernel writes back what was written and never synced (Linux's
/// `dirty_expire_centisecs`, 30 s).
const WRITEBACK: Duration = Duration::from_secs(30);

/// A disk fault in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFault {
    Eio,
    Enospc,
}

/// What a replica keeps across crashes.
pub struct Disk {
    /// Bumped by each crash: syncs begun before it complete nothing.
    epoch: u64,
    vote: Option<Vote<u64>>,
    /// Entries synced.
    log: BTreeMap<u64, Entry<SimConfig>>,
    /// Entries written and not yet synced, each with the epoch that wrote it.
    unsynced: BTreeMap<u64, Entry<SimConfig>>,
    /// A vote written and not yet synced (only the broken build `log-no-sync` answers before).
    unsynced_vote: Option<Vote<u64>>,
    purged: Option<LogId<u64>>,
    snapshot: Option<(SnapshotMeta<u64, BasicNode>, Vec<u8>)>,
    /// When the last sync queued completes: syncs complete in order.
    sync_free_at: Option<Instant>,
    pub latency: Duration,
    pub fault: Option<DiskFault>,
    /// The job history (the controller's `replica::history`, RocksDB there): each record (the
    /// job's JSON) by job id, as synced, and as written since (lost in a crash; the entries after
    /// the last snapshot write them again when they are applied again).
    history: BTreeMap<u64, Vec<u8>>,
    history_unsynced: BTreeMap<u64, Vec<u8>>,
    /// Set when an installed snapshot left the history incomplete: the snapshot's index.
    history_gap: Option<u64>,
}

impl Default for Disk {
    fn default() -> Self {
        Disk {
            epoch: 0,
            vote: None,
            log: BTreeMap::new(),
            unsynced: BTreeMap::new(),
            unsynced_vote: None,
            purged: None,
            snapshot: None,
            sync_free_at: None,
            latency: Duration::from_millis(1),
            fault: None,
            history: BTreeMap::new(),
            history_unsynced: BTreeMap::new(),
            history_gap: None,
        }
    }
}

impl Disk {
    /// The replica crashed: what was not synced is lost, but for the first `keep` entries of it
    /// (a torn tail). Syncs in flight complete nothing.
    pub fn crash(&mut self, keep: usize) -> usize {
        self.epoch += 1;
        self.sync_free_at = None;
        self.unsynced_vote = None;
        self.history_unsynced.clear();
        let unsynced = std::mem::take(&mut self.unsynced);
        let lost = unsynced.len().saturating_sub(keep);
        // A prefix only: the log is written in order, and a contiguous log is what openraft may
        // assume of its store.
        let mut next = self.log.last_key_value().map(|(i, _)| i + 1);
        for (index, entry) in unsynced.into_iter().take(keep) {
            if next.is_some_and(|n| n != index) {
                break;
            }
            next = Some(index + 1);
            self.log.insert(index, entry);
        }
        lost
    }

    /// The job history as a read sees it: every record written, by job id.
    pub fn history(&self) -> BTreeMap<u64, Vec<u8>> {
        let mut all = self.history.clone();
        all.extend(self.history_unsynced.iter().map(|(id, r)| (*id, r.clone())));
        all
    }

    /// Job `id`'s record, as a read sees it (the last written).
    pub fn history_record(&self, id: u64) -> Option<&[u8]> {
        self.history_unsynced.get(&id).or_else(|| self.history.get(&id)).map(Vec::as_slice)
    }

    /// The index of the snapshot whose install left the history incomplete, if one did.
    pub fn history_gap(&self) -> Option<u64> {
        self.history_gap
    }

    /// Records copied from a peer, written and synced; the mark taken away if it is still
    /// `gap` (a later snapshot's install moved it: copied again then). Whether it was.
    pub fn history_copied(&mut self, records: BTreeMap<u64, Vec<u8>>, gap: u64) -> bool {
        self.history.extend(records);
        let closed = self.history_gap == Some(gap);
        if closed {
            self.history_gap = None;
        }
        closed
    }

    /// When a sync begun now completes.
    fn sync_at(&mut self) -> Instant {
        let at = self.sync_free_at.map_or(Instant::now(), |t| t.max(Instant::now())) + self.latency;
        self.sync_free_at = Some(at);
        at
    }

    fn failure(&self, subject: ErrorSubject<u64>, verb: ErrorVerb) -> Option<StorageError<u64>> {
        let fault = self.fault?;
        let e = std::io::Error::other(match fault {
            DiskFault::Eio => "Input/output error (os error 5), simulated",
            DiskFault::Enospc => "No space left on device (os error 28), simulated",
        });
        Some(StorageError::IO { source: StorageIOError::new(subject, verb, openraft::AnyError::new(&e)) })
    }

    fn entries(&self, start: u64, end: Option<u64>) -> Vec<Entry<SimConfig>> {
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        let mut merged: BTreeMap<u64, Entry<SimConfig>> =
            self.log.range((Bound::Included(start), upper)).map(|(i, e)| (*i, e.clone())).collect();
        for (i, e) in self.unsynced.range((Bound::Included(start), upper)) {
            merged.insert(*i, e.clone());
        }
        merged.into_values().collect()
    }

    fn last(&self) -> Option<LogId<u64>> {
        let a = self.log.last_key_value().map(|(_, e)| e.log_id);
        let b = self.unsynced.last_key_value().map(|(_, e)| e.log_id);
        a.max(b).or(self.purged)
    }
}

pub type SharedDisk = Arc<Mutex<Disk>>;

pub fn lock(disk: &SharedDisk) -> std::sync::MutexGuard<'_, Disk> {
    disk.lock().unwrap_or_else(|p| p.into_inner())
}

/// One incarnation's log store: the disk, and the epoch it was opened in.
#[derive(Clone)]
pub struct LogStore {
    disk: SharedDisk,
    epoch: u64,
    fuse: Fuse,
    /// The broken build (`--bug log-no-sync`, as `jepsen/bugs/log-no-sync.patch`): appends and
    /// votes are answered when written and never synced, durable only once the kernel writes
    /// them back (a power cut before then loses them, as the shim of `jepsen/`'s power cuts
    /// loses what was not synced).
    no_sync: bool,
}

impl LogStore {
    pub fn open(disk: SharedDisk, fuse: Fuse, no_sync: bool) -> Self {
        let epoch = lock(&disk).epoch;
        LogStore { disk, epoch, fuse, no_sync }
    }

    /// Whether this incarnation still owns the disk: a crashed one writes nothing more (its
    /// tasks may run on a moment until they are stopped, as nothing of a dead process does).
    fn owns(&self, disk: &Disk) -> bool {
        disk.epoch == self.epoch
    }

    /// Waits for a sync begun now, and says whether this incarnation still owns the disk.
    async fn sync(&self) -> bool {
        let at = lock(&self.disk).sync_at();
        tokio::time::sleep_until(at).await;
        lock(&self.disk).epoch == self.epoch
    }

    /// Waits for the kernel's writeback of what was written now and never synced (dirty pages
    /// older than 30 s), and says whether this incarnation still owns the disk.
    async fn written_back(&self) -> bool {
        tokio::time::sleep(WRITEBACK).await;
        lock(&self.disk).epoch == self.epoch
    }

    /// Makes the entries `ids` durable (those still as written move to the synced log): by a
    /// sync, or (the broken build, which syncs nothing) by the kernel's writeback; says whether
    /// this incarnation still owns the disk.
    async fn sync_entries(&self, ids: &[LogId<u64>]) -> bool {
        let durable = match self.no_sync {
            true => self.written_back().await,
            false => self.sync().await,
        };
        if !durable {
            return false;
        }
        let mut disk = lock(&self.disk);
        for id in ids {
            if disk.unsynced.get(&id.index).is_some_and(|e| e.log_id == *id) {
                let entry = disk.unsynced.remove(&id.index).expect("just seen");
                disk.log.insert(id.index, entry);
            }
        }
        true
    }
}

impl RaftLogReader<SimConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<SimConfig>>> {
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
        Ok(lock(&self.disk).entries(start, end))
    }
}

impl RaftLogStorage<SimConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<SimConfig>> {
        let disk = lock(&self.disk);
        Ok(LogState { last_purged_log_id: disk.purged, last_log_id: disk.last() })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> StorageResult<()> {
        let failure = lock(&self.disk).failure(ErrorSubject::Vote, ErrorVerb::Write);
        if let Some(e) = failure {
            return Err(e);
        }
        if self.no_sync {
            // Written and answered, never synced: durable once the kernel writes it back.
            lock(&self.disk).unsynced_vote = Some(*vote);
            let store = self.clone();
            let vote = *vote;
            tokio::spawn(async move {
                if store.written_back().await {
                    let mut disk = lock(&store.disk);
                    if disk.unsynced_vote == Some(vote) {
                        disk.unsynced_vote = None;
                        disk.vote = Some(vote);
                    }
                }
            });
            return Ok(());
        }
        if self.sync().await {
            lock(&self.disk).vote = Some(*vote);
            Ok(())
        } else {
            // Crashed while syncing: this incarnation is gone, and its answer with it.
            futures::future::pending().await
        }
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<u64>>> {
        let disk = lock(&self.disk);
        Ok(disk.unsynced_vote.or(disk.vote))
    }

    // The committed index is a hint: not kept, as a crash may lose it.
    async fn save_committed(&mut self, _committed: Option<LogId<u64>>) -> StorageResult<()> {
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<u64>>> {
        Ok(None)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<SimConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<SimConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let ids: Option<Vec<LogId<u64>>> = {
            let mut disk = lock(&self.disk);
            if let Some(e) = disk.failure(ErrorSubject::Logs, ErrorVerb::Write) {
                return Err(e);
            }
            self.owns(&disk).then(|| {
                entries
                    .into_iter()
                    .map(|entry| {
                        let id = entry.log_id;
                        disk.unsynced.insert(id.index, entry);
                        id
                    })
                    .collect()
            })
        };
        let Some(ids) = ids else { return futures::future::pending().await };
        if self.fuse.blow(Point::Append) {
            return futures::future::pending().await;
        }
        let store = self.clone();
        if self.no_sync {
            callback.log_io_completed(Ok(()));
            tokio::spawn(async move { store.sync_entries(&ids).await });
            return Ok(());
        }
        tokio::spawn(async move {
            if store.sync_entries(&ids).await {
                callback.log_io_completed(Ok(()));
            }
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        let owned = {
            let mut disk = lock(&self.disk);
            if let Some(e) = disk.failure(ErrorSubject::Logs, ErrorVerb::Delete) {
                return Err(e);
            }
            let owned = self.owns(&disk);
            if owned {
                disk.unsynced.split_off(&log_id.index);
                disk.log.split_off(&log_id.index);
            }
            owned
        };
        if !owned {
            return futures::future::pending().await;
        }
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        let owned = {
            let mut disk = lock(&self.disk);
            let owned = self.owns(&disk);
            if owned {
                disk.log.retain(|&i, _| i > log_id.index);
                disk.unsynced.retain(|&i, _| i > log_id.index);
                disk.purged = Some(log_id);
            }
            owned
        };
        if !owned {
            return futures::future::pending().await;
        }
        Ok(())
    }
}

/// A replica's applied state, in memory: lost at a crash, rebuilt from its snapshot and log.
#[derive(Clone)]
pub struct Applied {
    pub state: ClusterState,
    pub last_applied: Option<LogId<u64>>,
    pub membership: StoredMembership<u64, BasicNode>,
    /// The digest each `Digest` entry answered here, by index.
    pub digests: BTreeMap<u64, u64>,
}

impl Applied {
    pub fn index(&self) -> u64 {
        self.last_applied.map_or(0, |l| l.index)
    }
}

pub type SharedApplied = Arc<Mutex<Applied>>;

pub fn read(applied: &SharedApplied) -> std::sync::MutexGuard<'_, Applied> {
    applied.lock().unwrap_or_else(|p| p.into_inner())
}

/// The state machine: entries applied by the real `quorum_state::apply`.
pub struct Machine {
    pub applied: SharedApplied,
    disk: SharedDisk,
    epoch: u64,
    fuse: Fuse,
    /// Set when an applied entry may let the scheduler start something.
    pub kick: Arc<tokio::sync::Notify>,
}

impl Machine {
    /// The state machine of a replica starting on `disk`: its last snapshot, if any.
    pub fn open(disk: SharedDisk, fuse: Fuse) -> anyhow::Result<Machine> {
        let (epoch, snapshot) = {
            let d = lock(&disk);
            (d.epoch, d.snapshot.clone())
        };
        let applied = match snapshot {
            Some((meta, data)) => Applied {
                state: quorum_state::snapshot::decode(&data)?,
                last_applied: meta.last_log_id,
                membership: meta.last_membership,
                digests: BTreeMap::new(),
            },
            None => Applied {
                state: ClusterState::new(),
                last_applied: None,
                membership: StoredMembership::default(),
                digests: BTreeMap::new(),
            },
        };
        Ok(Machine { applied: Arc::new(Mutex::new(applied)), disk, epoch, fuse, kick: Default::default() })
    }

    async fn store_snapshot(&self, meta: &SnapshotMeta<u64, BasicNode>, data: &[u8]) -> StorageResult<()> {
        let failure = lock(&self.disk).failure(ErrorSubject::Snapshot(Some(meta.signature())), ErrorVerb::Write);
        if let Some(e) = failure {
            return Err(e);
        }
        let at = lock(&self.disk).sync_at();
        tokio::time::sleep_until(at).await;
        let stored = {
            let mut disk = lock(&self.disk);
            let owned = disk.epoch == self.epoch;
            if owned {
                // The history is made durable first, as the controller's is: the snapshot no
                // longer holds the jobs whose records the entries before it wrote.
                let written = std::mem::take(&mut disk.history_unsynced);
                disk.history.extend(written);
                disk.snapshot = Some((meta.clone(), data.to_vec()));
            }
            owned
        };
        if !stored {
            // Crashed meanwhile: nothing is stored, and nothing is answered.
            return futures::future::pending().await;
        }
        Ok(())
    }

    fn snapshot_id(last: Option<LogId<u64>>) -> String {
        match last {
            Some(l) => format!("{}-{}", l.leader_id.term, l.index),
            None => "none".into(),
        }
    }
}

fn decode_error(e: serde_json::Error) -> StorageError<u64> {
    StorageError::IO {
        source: StorageIOError::new(ErrorSubject::Snapshot(None), ErrorVerb::Read, openraft::AnyError::new(&e)),
    }
}

impl RaftSnapshotBuilder<SimConfig> for Machine {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<SimConfig>> {
        let (data, last, membership) = {
            let a = read(&self.applied);
            (quorum_state::snapshot::encode(&a.state).map_err(decode_error)?, a.last_applied, a.membership.clone())
        };
        let meta =
            SnapshotMeta { last_log_id: last, last_membership: membership, snapshot_id: Self::snapshot_id(last) };
        if self.fuse.blow(Point::SnapshotBuild) {
            return futures::future::pending().await;
        }
        self.store_snapshot(&meta, &data).await?;
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl RaftStateMachine<SimConfig> for Machine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>)> {
        let a = read(&self.applied);
        Ok((a.last_applied, a.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Response>>
    where
        I: IntoIterator<Item = Entry<SimConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        if self.fuse.blow(Point::Apply) {
            return futures::future::pending().await;
        }
        let mut responses = Vec::new();
        let mut wake = false;
        // The state's lock is let go before any await (a crash at the history's write pends).
        let crashed = {
            let mut crashed = false;
            let mut a = read(&self.applied);
            for entry in entries {
                a.last_applied = Some(entry.log_id);
                let response = match entry.payload {
                    EntryPayload::Blank => Response::Ok,
                    EntryPayload::Normal(command) => {
                        wake |= command.wakes_scheduler();
                        let digest_point = matches!(command, Command::Digest { .. });
                        let response = quorum_state::apply(&mut a.state, entry.log_id.index, command);
                        if let (true, Response::Digest { digest }) = (digest_point, &response) {
                            a.digests.insert(entry.log_id.index, *digest);
                        }
                        if let Response::Purged { jobs } = &response {
                            // Written before the state that no longer holds them is read, as the
                            // controller writes them; a failing disk fails the apply.
                            let mut disk = lock(&self.disk);
                            if let Some(e) = disk.failure(ErrorSubject::Apply(entry.log_id), ErrorVerb::Write) {
                                return Err(e);
                            }
                            if disk.epoch == self.epoch {
                                for job in jobs {
                                    let record = serde_json::to_vec(&**job).map_err(decode_error)?;
                                    disk.history_unsynced.insert(job.id, record);
                                }
                            }
                            drop(disk);
                            crashed = self.fuse.blow(Point::HistoryWrite);
                        }
                        response
                    }
                    EntryPayload::Membership(m) => {
                        a.membership = StoredMembership::new(Some(entry.log_id), m);
                        Response::Ok
                    }
                };
                responses.push(response);
                if crashed {
                    break;
                }
            }
            crashed
        };
        if crashed {
            return futures::future::pending().await;
        }
        if wake {
            self.kick.notify_one();
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Machine {
            applied: self.applied.clone(),
            disk: self.disk.clone(),
            epoch: self.epoch,
            fuse: self.fuse.clone(),
            kick: self.kick.clone(),
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
        let data = snapshot.into_inner();
        let state = quorum_state::snapshot::decode(&data).map_err(decode_error)?;
        if self.fuse.blow(Point::SnapshotInstall) {
            return futures::future::pending().await;
        }
        {
            // The entries the snapshot stands for wrote records this replica never got: its
            // history is incomplete until copied from a peer ([`crate::history::catch_up`]).
            let mut disk = lock(&self.disk);
            if disk.epoch == self.epoch && !self.fuse.bug(crate::world::Bug::HistoryGap) {
                let at = meta.last_log_id.map_or(0, |l| l.index);
                disk.history_gap = Some(disk.history_gap.map_or(at, |g| g.max(at)));
            }
        }
        self.store_snapshot(meta, &data).await?;
        let mut a = read(&self.applied);
        a.state = state;
        a.last_applied = meta.last_log_id;
        a.membership = meta.last_membership.clone();
        drop(a);
        self.kick.notify_one();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<SimConfig>>> {
        let stored = lock(&self.disk).snapshot.clone();
        Ok(stored.map(|(meta, data)| Snapshot { meta, snapshot: Box::new(Cursor::new(data)) }))
    }
}
