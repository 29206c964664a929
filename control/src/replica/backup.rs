//! Backups: a consistent copy of a replica's replicated state and job history at one log index
//! (`quorum admin backup FILE`), and a new cluster started from one (`quorum-controller
//! --restore FILE`, [`restore`]), or from a replica that outlived the rest of its cluster
//! (`--force-new-cluster`, the same path from the replica's own state).
//!
//! The file is a line of its own (`QUORUM-BACKUP`), a JSON [`Header`] line, then frames: a tag
//! byte, a length (u64, little-endian) and that many bytes. `S` frames carry the state as a
//! snapshot encodes it, in pieces; `H` frames one job history record each, as stored; the `E`
//! frame ends the file with the SHA-256 of every byte before its tag. Nothing after it. A file
//! cut short, with a byte changed, or with a frame of a kind this release does not know is
//! refused whole ([`verify`]) before anything of it is written anywhere.
//!
//! The copy is consistent: the state is cloned and the history's RocksDB snapshot taken under
//! the lock that applying an entry holds (apply writes the history records of the jobs it moves
//! out of the state while holding it), so both stand at the same index. It is written as it is
//! read, on a thread of its own: the state once in memory (as a Raft snapshot is), the history a
//! record at a time, the cluster serving meanwhile.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use openraft::{BasicNode, CommittedLeaderId, LogId, Membership, SnapshotMeta, StoredMembership};
use ring::digest::{Context, SHA256};
use serde::{Deserialize, Serialize};

use super::history::History;
use super::store::SharedState;

/// The file's first line.
pub const MAGIC: &[u8] = b"QUORUM-BACKUP\n";
/// The layout this release writes and reads.
pub const FORMAT: u32 = 1;
/// The state goes out in pieces of at most this many bytes.
const STATE_PIECE: usize = 4 << 20;
/// No frame is larger: a length past it is a damaged file, not a reason to allocate.
const MAX_FRAME: u64 = 1 << 30;

const STATE: u8 = b'S';
const HISTORY: u8 = b'H';
const END: u8 = b'E';

/// What a backup says of itself, on its second line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub format: u32,
    /// The cluster's feature level when it was taken: a release below it cannot restore it.
    pub feature_level: u32,
    /// The log entry the state and the history stand at: its index, and the term and node of
    /// the leader that wrote it.
    pub index: u64,
    pub term: u64,
    pub leader: u64,
    /// The replica it was taken from, and when (ms since the epoch).
    pub replica: u64,
    pub taken_ms: u64,
    /// The release that wrote it.
    pub version: String,
}

/// What a backup held, once written or verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub header: Header,
    pub jobs: u64,
    pub history_records: u64,
    pub bytes: u64,
    /// The SHA-256 of the file before its end frame, in hex.
    pub sha256: String,
}

impl Summary {
    /// What it holds, in words.
    pub fn describe(&self) -> String {
        let h = &self.header;
        format!(
            "index {} (term {}), feature level {}, {} jobs, {} job history records, taken from replica {} by release {}, sha256 {}",
            h.index, h.term, h.feature_level, self.jobs, self.history_records, h.replica, h.version, self.sha256
        )
    }
}

/// How a replica's process starts its data before it serves.
#[derive(Clone, Debug, Default)]
pub struct Start {
    /// `--restore FILE`.
    pub restore: Option<std::path::PathBuf>,
    /// `--force-new-cluster`.
    pub force_new_cluster: bool,
}

/// Does what `start` asks before the replica starts, and says what it did (also in the log).
pub async fn prepare(config: &crate::config::ControllerConfig, start: &Start) -> anyhow::Result<Option<String>> {
    if let Some(file) = &start.restore {
        let s = restore(config, file).await?;
        tracing::info!(index = s.header.index, jobs = s.jobs, "restored from {}", file.display());
        return Ok(Some(format!("replica {} restored from {}: {}", config.id, file.display(), s.describe())));
    }
    if start.force_new_cluster {
        let r = force_new_cluster(config).await?;
        let kept = r.last.saturating_sub(r.committed);
        tracing::warn!(index = r.summary.header.index, committed = r.committed, kept, "forced a new cluster of one");
        return Ok(Some(format!(
            "replica {} is now a cluster of one at index {} ({} jobs); {kept} entries after index {} that it had not yet seen committed were kept (the old leader may have acknowledged them); writes that never reached this replica are lost. Its old data is in {}. Add replicas with `quorum admin add-replica`.",
            config.id,
            r.summary.header.index,
            r.summary.jobs,
            r.committed,
            r.moved_to.display()
        )));
    }
    Ok(None)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes what it is given, hashing every byte.
struct Hashing<W: Write> {
    out: W,
    hash: Context,
    bytes: u64,
}

impl<W: Write> Hashing<W> {
    fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.hash.update(data);
        self.bytes += data.len() as u64;
        self.out.write_all(data)
    }

    fn frame(&mut self, tag: u8, data: &[u8]) -> std::io::Result<()> {
        self.put(&[tag])?;
        self.put(&(data.len() as u64).to_le_bytes())?;
        self.put(data)
    }
}

/// Writes a backup of this replica to `out`. Refused while its job history is incomplete (it
/// installed a snapshot and is still copying the records from its peers) or before it applied
/// anything.
pub fn write(shared: &Arc<SharedState>, replica: u64, out: impl Write) -> Result<Summary, String> {
    if let Some(gap) = shared.history.gap() {
        return Err(format!(
            "replica {replica}'s job history is still being copied from its peers (it installed a snapshot at index {gap}): back up from another replica, or try again shortly"
        ));
    }
    let applied = shared.read();
    let (state, last) = (applied.state.clone(), applied.last_applied);
    // The history's view is taken while no entry can be applied, so that it stands where the
    // state does; the lock goes as soon as it is taken.
    shared.history.with_view(move || drop(applied), |records| write_taken(&state, last, replica, records, out))
}

fn write_taken(
    state: &quorum_state::ClusterState,
    last: Option<LogId<u64>>,
    replica: u64,
    records: &mut dyn Iterator<Item = Result<Vec<u8>, String>>,
    out: impl Write,
) -> Result<Summary, String> {
    let last = last.ok_or("this replica has applied nothing yet: there is nothing to back up")?;
    let header = Header {
        format: FORMAT,
        feature_level: state.cluster_level(),
        index: last.index,
        term: last.leader_id.term,
        leader: last.leader_id.node_id,
        replica,
        taken_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let jobs = state.jobs.len() as u64;
    let data = quorum_state::snapshot::encode(state).map_err(|e| format!("encoding the state: {e}"))?;
    let mut w = Hashing { out, hash: Context::new(&SHA256), bytes: 0 };
    let io = |e: std::io::Error| format!("writing the backup: {e}");
    w.put(MAGIC).map_err(io)?;
    let mut line = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
    line.push(b'\n');
    w.put(&line).map_err(io)?;
    for piece in data.chunks(STATE_PIECE) {
        w.frame(STATE, piece).map_err(io)?;
    }
    drop(data);
    let mut history_records = 0;
    for record in records {
        w.frame(HISTORY, &record?).map_err(io)?;
        history_records += 1;
    }
    let digest = w.hash.clone().finish();
    let bytes = w.bytes;
    w.out.write_all(&[END]).map_err(io)?;
    w.out.write_all(&(digest.as_ref().len() as u64).to_le_bytes()).map_err(io)?;
    w.out.write_all(digest.as_ref()).map_err(io)?;
    w.out.flush().map_err(io)?;
    Ok(Summary { header, jobs, history_records, bytes, sha256: hex(digest.as_ref()) })
}

/// A backup read back: its header, the state's bytes, and its history records.
pub struct Contents {
    pub summary: Summary,
    pub state: quorum_state::ClusterState,
    pub state_bytes: Vec<u8>,
    pub records: Vec<Vec<u8>>,
}

/// Reads a whole backup and checks it: the first line, the header, every frame, the checksum,
/// that nothing follows, and that the state decodes; what this release (`level`) cannot apply
/// is refused.
pub fn read(mut input: impl Read, level: u32) -> Result<Contents, String> {
    let mut hash = Context::new(&SHA256);
    let mut bytes = 0u64;
    let mut take = |n: usize, what: &str| -> Result<Vec<u8>, String> {
        let mut buf = vec![0; n];
        input.read_exact(&mut buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => format!("the file ends inside {what}: it is cut short"),
            _ => format!("reading {what}: {e}"),
        })?;
        Ok(buf)
    };
    let magic = take(MAGIC.len(), "its first line")?;
    if magic != MAGIC {
        return Err("not a Quorum backup (its first line is not QUORUM-BACKUP)".into());
    }
    hash.update(&magic);
    bytes += magic.len() as u64;
    // The header line, a byte at a time up to its end (bounded).
    let mut line = Vec::new();
    loop {
        let b = take(1, "its header")?;
        hash.update(&b);
        bytes += 1;
        if b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
        if line.len() > 64 << 10 {
            return Err("its header line is longer than any backup's".into());
        }
    }
    let header: Header = serde_json::from_slice(&line).map_err(|e| format!("its header: {e}"))?;
    if header.format != FORMAT {
        return Err(format!("backup format {} (this release reads format {FORMAT})", header.format));
    }
    if header.feature_level > level {
        return Err(format!(
            "the backup was taken at feature level {}; this release applies up to {level}: restore it with release {} or later",
            header.feature_level, header.version
        ));
    }
    let mut state_bytes = Vec::new();
    let mut records = Vec::new();
    loop {
        let tag = take(1, "a frame")?[0];
        let len = u64::from_le_bytes(take(8, "a frame's length")?.try_into().map_err(|_| "a frame's length")?);
        if len > MAX_FRAME {
            return Err(format!("a frame of {len} bytes: the file is damaged"));
        }
        if tag == END {
            let digest = take(len as usize, "its checksum")?;
            let expected = hash.finish();
            if digest != expected.as_ref() {
                return Err(format!(
                    "its checksum does not match its contents (a byte changed or the file is damaged): it says {}, the contents give {}",
                    hex(&digest),
                    hex(expected.as_ref())
                ));
            }
            let mut rest = [0u8; 1];
            if input.read(&mut rest).map_err(|e| e.to_string())? != 0 {
                return Err("bytes follow its end".into());
            }
            let state =
                quorum_state::snapshot::decode(&state_bytes).map_err(|e| format!("its state does not decode: {e}"))?;
            let summary = Summary {
                jobs: state.jobs.len() as u64,
                history_records: records.len() as u64,
                bytes,
                sha256: hex(&digest),
                header,
            };
            return Ok(Contents { summary, state, state_bytes, records });
        }
        let data = take(len as usize, "a frame")?;
        hash.update(&[tag]);
        hash.update(&len.to_le_bytes());
        hash.update(&data);
        bytes += 9 + len;
        match tag {
            STATE => state_bytes.extend_from_slice(&data),
            HISTORY => records.push(data),
            other => return Err(format!("a frame of unknown kind {other:#04x}: the file is damaged")),
        }
    }
}

/// Verifies the backup at `path` without writing anything.
pub fn verify(path: &Path, level: u32) -> Result<Summary, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    read(std::io::BufReader::with_capacity(1 << 20, file), level).map(|c| c.summary)
}

/// Whether a replica's data directory holds a replica already (its database has any Raft
/// state, snapshot or job history).
pub fn holds_data(data_dir: &Path) -> bool {
    data_dir.join("db").join("CURRENT").exists()
}

/// Starts the data of a new cluster in `db` from `contents`: the job history, then the state as
/// the replica's snapshot at the backup's index with `members` as its membership, and a vote in
/// the backup's term, so that the first election (in the next term) continues its log. The
/// database must be new.
pub async fn install(
    db: &Arc<rocksdb::DB>,
    history: &History,
    contents: Contents,
    members: std::collections::BTreeMap<u64, BasicNode>,
    own_id: u64,
) -> Result<(), String> {
    use openraft::storage::RaftLogStorage;
    for chunk in contents.records.chunks(5_000) {
        history.write_records(chunk).map_err(|e| e.to_string())?;
    }
    history.flush().map_err(|e| e.to_string())?;
    let h = &contents.summary.header;
    let log_id = LogId::new(CommittedLeaderId::new(h.term, h.leader), h.index);
    let membership = Membership::new(vec![members.keys().copied().collect()], members);
    let meta = SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
        snapshot_id: format!("restored-{}-{}", h.term, h.index),
    };
    super::snapshot_file::write(db, meta, &contents.state_bytes, super::snapshot_file::Layout::default())?;
    let mut log =
        quorum_raft::log_store::LogStore::<super::types::TypeConfig>::new(db.clone()).map_err(|e| e.to_string())?;
    log.save_vote(&openraft::Vote::new(h.term, own_id)).await.map_err(|e| e.to_string())?;
    Ok(())
}

/// The database of a replica's data directory, its job history, and how the config keeps it.
fn open(config: &crate::config::ControllerConfig) -> anyhow::Result<(Arc<rocksdb::DB>, History)> {
    let db =
        quorum_raft::open_db(&config.data_dir.join("db"), &[super::store::CF_SNAPSHOT, super::history::CF_HISTORY])?;
    let keep =
        super::history::Keep { script: config.accounting.store_job_script, env: config.accounting.store_job_env };
    let history = History::new(db.clone(), keep)?;
    Ok((db, history))
}

/// The replicas of `config` as a membership.
fn members_of(config: &crate::config::ControllerConfig) -> std::collections::BTreeMap<u64, BasicNode> {
    config.replicas.iter().map(|r| (r.id, BasicNode::new(r.addr.clone()))).collect()
}

/// `quorum-controller --restore FILE`: this replica of a new cluster (the config's replicas as
/// its members) starts from the backup, checked whole before anything is written. Its data
/// directory must hold no replica yet. Every replica of the new cluster restores the same file.
pub async fn restore(config: &crate::config::ControllerConfig, file: &Path) -> anyhow::Result<Summary> {
    let f = std::fs::File::open(file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let contents = read(std::io::BufReader::with_capacity(1 << 20, f), config.feature_level())
        .map_err(|e| anyhow::anyhow!("{} is refused: {e}", file.display()))?;
    if holds_data(&config.data_dir) {
        anyhow::bail!(
            "{} already holds a replica's data: restore into an empty data directory (move this one aside first)",
            config.data_dir.display()
        );
    }
    std::fs::create_dir_all(&config.data_dir)?;
    quorum_auth::private::make_private(&config.data_dir)?;
    let summary = contents.summary.clone();
    let (db, history) = open(config)?;
    install(&db, &history, contents, members_of(config), config.id).await.map_err(anyhow::Error::msg)?;
    db.flush_wal(true)?;
    drop(history);
    drop(db);
    quorum_auth::private::make_private(&config.data_dir)?;
    Ok(summary)
}

/// What `--force-new-cluster` did.
#[derive(Debug)]
pub struct Recovered {
    pub summary: Summary,
    /// The last entry the survivor knew committed, and the last in its log: those after the
    /// first were kept, as the old leader may have acknowledged them.
    pub committed: u64,
    pub last: u64,
    /// Where the old data went.
    pub moved_to: std::path::PathBuf,
}

/// `quorum-controller --force-new-cluster`: after the loss of a majority, this replica (its
/// disk intact) becomes a new cluster of one with everything in its log, the entries it had
/// not yet seen committed included (the old leader may have acknowledged them; what never
/// reached this replica is what is lost). Refused while another old member answers on its
/// address. Its old data is kept beside the new (`db.before-recovery-MS`). Add replicas after
/// with `quorum admin add-replica`.
pub async fn force_new_cluster(config: &crate::config::ControllerConfig) -> anyhow::Result<Recovered> {
    use openraft::storage::RaftLogStorage;
    if !holds_data(&config.data_dir) {
        anyhow::bail!("{} holds no replica's data: there is nothing to recover from", config.data_dir.display());
    }
    for r in config.replicas.iter().filter(|r| r.id != config.id) {
        let reachable =
            tokio::time::timeout(std::time::Duration::from_secs(2), tokio::net::TcpStream::connect(r.addr.as_str()))
                .await
                .is_ok_and(|c| c.is_ok());
        if reachable {
            anyhow::bail!(
                "replica {} answers at {}: the old cluster may still be running; stop every other replica (or take it off the network) before --force-new-cluster",
                r.id,
                r.addr
            );
        }
    }
    // Everything in the log, committed as far as this replica knows or not, applied, then
    // written as a backup beside the data.
    let path = config.data_dir.join(format!(".recovery-{}.backup", std::process::id()));
    let (committed, last) = {
        let (db, history) = open(config)?;
        let mut log = quorum_raft::log_store::LogStore::<super::types::TypeConfig>::new(db.clone())?;
        let state = log.get_log_state().await.map_err(|e| anyhow::anyhow!("reading the log: {e}"))?;
        let committed = log.read_committed().await.map_err(|e| anyhow::anyhow!("reading the log: {e}"))?;
        let mut sm = super::store::StateMachineStore::open(db.clone(), history, config.feature_level())?;
        let shared = sm.shared();
        let applied = shared.read().last_applied;
        if let Some(last) = state.last_log_id.filter(|l| Some(*l) > applied) {
            use openraft::storage::RaftStateMachine;
            use openraft::RaftLogReader;
            let from = applied.map_or(0, |a| a.index + 1);
            let entries = log.try_get_log_entries(from..last.index + 1).await.map_err(|e| anyhow::anyhow!("{e}"))?;
            sm.apply(entries).await.map_err(|e| anyhow::anyhow!("applying the log: {e}"))?;
        }
        let out = std::fs::File::create(&path)?;
        let summary = {
            let shared = shared.clone();
            let id = config.id;
            tokio::task::spawn_blocking(move || {
                let mut w = std::io::BufWriter::new(out);
                let s = write(&shared, id, &mut w)?;
                w.into_inner().map_err(|e| e.to_string())?.sync_all().map_err(|e| e.to_string())?;
                Ok::<_, String>(s)
            })
            .await?
            .map_err(anyhow::Error::msg)?
        };
        drop((sm, shared, log));
        drop(db);
        (committed.map_or(0, |c| c.index), summary.header.index)
    };
    let moved_to = config.data_dir.join(format!(
        "db.before-recovery-{}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
    ));
    std::fs::rename(config.data_dir.join("db"), &moved_to)?;
    let alone = crate::config::ControllerConfig {
        replicas: config.replicas.iter().filter(|r| r.id == config.id).cloned().collect(),
        ..config.clone()
    };
    let summary = restore(&alone, &path).await?;
    std::fs::remove_file(&path)?;
    Ok(Recovered { summary, committed, last, moved_to })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contents_of(records: Vec<Vec<u8>>) -> Vec<u8> {
        let mut state = quorum_state::ClusterState::new();
        state.next_job_id = 42;
        let last = Some(LogId::new(CommittedLeaderId::new(3, 2), 17));
        let mut out = Vec::new();
        let mut it = records.into_iter().map(Ok);
        write_taken(&state, last, 2, &mut it, &mut out).unwrap();
        out
    }

    #[test]
    fn a_backup_reads_back_and_any_damage_is_refused() {
        let file = contents_of(vec![b"{\"id\":1}".to_vec(), b"{\"id\":2}".to_vec()]);
        let back = read(&file[..], u32::MAX).unwrap();
        assert_eq!((back.summary.header.index, back.summary.header.term, back.summary.header.leader), (17, 3, 2));
        assert_eq!(back.state.next_job_id, 42);
        assert_eq!(back.records, vec![b"{\"id\":1}".to_vec(), b"{\"id\":2}".to_vec()]);
        // Every byte flipped, and every cut, is refused.
        for i in 0..file.len() {
            let mut bad = file.clone();
            bad[i] ^= 0x20;
            assert!(read(&bad[..], u32::MAX).is_err(), "byte {i} flipped");
            assert!(read(&file[..i], u32::MAX).is_err(), "cut at {i}");
        }
        let mut longer = file.clone();
        longer.push(0);
        assert_eq!(read(&longer[..], u32::MAX).err().as_deref(), Some("bytes follow its end"));
        let e = read(&file[..], 0).err().unwrap();
        assert!(e.contains("feature level"), "{e}");
    }
}
