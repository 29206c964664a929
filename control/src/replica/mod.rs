//! One replica's part in Raft: its RocksDB, the openraft handle, the applied state, and
//! proposing. [`Replica::write`] gates a command on the cluster's feature level and commits it;
//! [`batch`] groups concurrent writes into one entry; [`Replica::linearizable`] fences reads;
//! who leads, leadership transfer and the leader watchdog live here too. It knows nothing of
//! agents, the scheduler's estimates, gRPC statuses or the services: the composition root
//! (`node.rs`) wires those.

pub mod backup;
pub mod batch;
pub mod catch_up;
pub mod history;
pub mod peers;
mod snapshot_file;
pub mod store;
mod transfer;
pub mod types;
pub mod watchdog;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::BasicNode;
use quorum_raft::log_store::LogStore;
use quorum_raft::network::Network;

pub use store::{AppliedState, SharedState};
pub use types::{Raft, TypeConfig};

use crate::config::ControllerConfig;
use crate::faults::Faults;
use quorum_state::{Command, Response};

/// The software version each replica reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The leader's wall clock in milliseconds since the epoch; stamped on commands.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// What a write answers when this replica stopped leading the term it proposed in before the
/// entry was applied: it may still be committed by the next leader, or never.
pub const DEPOSED: &str =
    "this replica stopped leading before the write was applied; it may or may not have been committed";

/// Completes once `raft` (replica `id`) no longer leads term `term`. openraft answers a deposed
/// leader's pending write when a new leader's log replaces the entry, but not when a snapshot
/// does (the entry is purged, never truncated): such a write would wait for ever, and with it
/// the leader loop that made it, found by the simulator (`jepsen/RESULTS.md`). It looks every
/// 100 ms rather than waiting on the metrics channel: a watch channel wakes its many waiters in
/// an order of chance, which the simulator's one seed could not replay.
pub async fn deposed<C: openraft::RaftTypeConfig<NodeId = u64>>(raft: &openraft::Raft<C>, id: u64, term: u64) {
    loop {
        {
            let metrics = raft.metrics();
            let m = metrics.borrow();
            if m.current_term != term || m.current_leader != Some(id) || m.running_state.is_err() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How long a linearizable read waits for this leader to apply what its log held when the read
/// began ([`linearizable_read`]).
pub const READ_APPLY_LIMIT: Duration = Duration::from_secs(5);

/// Why a linearizable read could not be served here.
#[derive(Debug, thiserror::Error)]
pub enum ReadError<N: openraft::Node> {
    #[error("{0}")]
    Raft(Box<RaftError<u64, CheckIsLeaderError<u64, N>>>),
    #[error("this leader did not apply its log within {READ_APPLY_LIMIT:?}; try again")]
    Behind,
}

/// openraft's `ensure_linearizable` (a quorum confirms this replica leads, then the state has
/// applied its read index), made safe for a leader restored at start-up. openraft restarts a
/// node whose saved vote says it led as leader at once (`Engine::startup`), with the commit
/// index it saved, which is only a hint (ours is not synced, and a power cut loses it): its read
/// index, the larger of that and its first entry of the term, may then be below entries
/// committed and acknowledged before the crash, and a read would miss an acknowledged write
/// (found by the simulator, seed 204257: a job read as missing after a power cut of every
/// replica). Every committed entry is in the leader's log (Leader Completeness), so the read
/// also waits until the state has applied the last entry the log held when the read began:
/// enough always, and otherwise no more than the commit of the writes in flight. Shared with
/// the simulator.
pub async fn linearizable_read<C: openraft::RaftTypeConfig<NodeId = u64>>(
    raft: &openraft::Raft<C>,
) -> Result<(), ReadError<C::Node>> {
    let last = raft.metrics().borrow().last_log_index;
    raft.ensure_linearizable().await.map_err(|e| ReadError::Raft(Box::new(e)))?;
    let Some(last) = last else { return Ok(()) };
    // Polled every millisecond rather than waited for on the metrics channel: a watch channel
    // wakes its waiters in an order of chance, which the simulator's one seed could not replay
    // (as `deposed`). Usually applied already, else within a commit or two.
    let started = tokio::time::Instant::now();
    loop {
        if raft.metrics().borrow().last_applied.is_some_and(|a| a.index >= last) {
            return Ok(());
        }
        if started.elapsed() >= READ_APPLY_LIMIT {
            return Err(ReadError::Behind);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Whether replica `id`, with these metrics, may answer agents' heartbeats with a lease: it leads,
/// a quorum acknowledged it within [`QUORUM_FRESHNESS`], and it has applied an entry of its own
/// term. The last holds back what an older term left in the log: a `NodeDown` proposed by a
/// leader deposed before its commit is committed by the next one, and must be applied (the
/// node's jobs requeued, so its heartbeat's reconciliation kills their copies there) before any
/// lease is given to the node, else that copy would run on under the lease beside the new one.
/// Shared with the simulator.
pub fn may_lease<N: openraft::Node>(m: &openraft::RaftMetrics<u64, N>, id: u64) -> bool {
    leads_with_quorum(m, id) && m.last_applied.is_some_and(|applied| applied.leader_id.term == m.current_term)
}

/// Whether replica `id`, with these metrics, leads and a quorum acknowledged it within
/// [`QUORUM_FRESHNESS`] ([`Replica::leads_with_quorum`]).
pub fn leads_with_quorum<N: openraft::Node>(m: &openraft::RaftMetrics<u64, N>, id: u64) -> bool {
    m.current_leader == Some(id)
        && m.millis_since_quorum_ack.is_some_and(|ms| ms <= QUORUM_FRESHNESS.as_millis() as u64)
}

/// Why a write was not committed. Cloned to every write of a group that failed together.
#[derive(Clone, Debug, thiserror::Error)]
pub enum WriteError {
    #[error("this replica is not the leader (leader: {})", leader.as_deref().unwrap_or("unknown"))]
    NotLeader { leader: Option<String> },
    #[error("raft: {0}")]
    Raft(String),
    #[error(
        "{what} needs cluster feature level {needs}, but the cluster is at level {cluster}: a voter runs an older release (see `quorum admin versions`); upgrade every replica first"
    )]
    TooNew { what: &'static str, needs: u32, cluster: u32 },
    #[error("this replica stopped before the write was committed")]
    Stopping,
    #[error("unexpected answer: {0}")]
    Unexpected(String),
}

/// How recently a quorum must have acknowledged the leader for it to answer agents' heartbeats
/// (see [`Replica::leads_with_quorum`]); well below the agents' lease.
pub const QUORUM_FRESHNESS: std::time::Duration = std::time::Duration::from_secs(1);

/// One replica: what the services and leader loops of it share about Raft.
pub struct Replica {
    pub id: u64,
    pub addr: String,
    pub raft: Raft,
    pub shared: Arc<SharedState>,
    /// Held while a membership change runs, so that only one runs at a time.
    pub membership_change: tokio::sync::Mutex<()>,
    /// Set while this leader hands leadership over: it proposes nothing more, so that the
    /// followers' leases can run out and the target can win.
    transferring: std::sync::atomic::AtomicBool,
    /// The log's newest entries, shared by the log store, the network and the RPC service.
    pub entry_cache: quorum_raft::log_store::EntryCache<TypeConfig>,
    /// When a leader last replicated to this replica.
    pub leader_contact: quorum_raft::service::LeaderContact,
    /// The feature level this replica reports and applies (below [`FEATURE_LEVEL`] only when
    /// emulating an older release).
    ///
    /// [`FEATURE_LEVEL`]: quorum_state::FEATURE_LEVEL
    pub feature_level: u32,
    /// When this replica started, in milliseconds since the epoch.
    pub started_at_ms: u64,
    /// How this replica reaches the others (TLS with its replica certificate, or plaintext).
    pub dialer: quorum_raft::network::Dialer,
    committed: Arc<AtomicU64>,
}

impl Replica {
    /// Proposes a command and waits until it is committed and applied here.
    pub async fn write(&self, command: Command) -> Result<(u64, Response), WriteError> {
        if self.transferring.load(Ordering::SeqCst) {
            return Err(WriteError::NotLeader { leader: None });
        }
        let (needs, what) = command.level();
        let cluster = self.shared.read().state.cluster_level();
        if needs > cluster {
            return Err(WriteError::TooNew { what, needs, cluster });
        }
        let term = self.raft.metrics().borrow().current_term;
        let written = tokio::select! {
            written = self.raft.client_write(command) => written,
            () = deposed(&self.raft, self.id, term) => return Err(WriteError::Raft(DEPOSED.into())),
        };
        match written {
            Ok(r) => {
                quorum_raft::crash_point("write-before-reply");
                Ok((r.log_id.index, r.data))
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(WriteError::NotLeader { leader: f.leader_node.map(|n| n.addr) })
            }
            Err(e) => Err(WriteError::Raft(e.to_string())),
        }
    }

    /// Returns once this replica has confirmed with a quorum that it still leads and has applied
    /// everything committed before the call: a read after this is linearizable.
    pub async fn linearizable(&self) -> Result<(), WriteError> {
        match linearizable_read(&self.raft).await {
            Ok(()) => Ok(()),
            Err(ReadError::Raft(e)) => match *e {
                RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => {
                    Err(WriteError::NotLeader { leader: f.leader_node.map(|n| n.addr) })
                }
                e => Err(WriteError::Raft(e.to_string())),
            },
            Err(e) => Err(WriteError::Raft(e.to_string())),
        }
    }

    /// Waits, as leader, until replica `id` has every entry up to `upto`, or `limit` passes;
    /// on timeout, how far it got as (replicated, wanted).
    pub async fn wait_replicated(&self, id: u64, upto: UpTo, limit: Duration) -> Result<(), (u64, u64)> {
        let mut metrics = self.raft.metrics();
        let fixed = metrics.borrow().last_log_index.unwrap_or(0);
        let started = std::time::Instant::now();
        loop {
            let (matched, wanted) = {
                let m = metrics.borrow_and_update();
                let wanted = match upto {
                    UpTo::Start => fixed,
                    UpTo::Latest => m.last_log_index.unwrap_or(0),
                };
                (matched_index(&m, id), wanted)
            };
            if matched >= wanted {
                return Ok(());
            }
            let left = limit.saturating_sub(started.elapsed());
            if left.is_zero() || tokio::time::timeout(left, metrics.changed()).await.is_err() {
                return Err((matched, wanted));
            }
        }
    }

    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.id)
    }

    /// This replica leads and a quorum acknowledged it within [`QUORUM_FRESHNESS`]. A leader cut
    /// off from the others (openraft 0.9 keeps it leader until it hears of a newer term) must
    /// not extend its agents' leases: their jobs would run on while the majority's leader
    /// declares the nodes DOWN and requeues the jobs elsewhere.
    pub fn leads_with_quorum(&self) -> bool {
        leads_with_quorum(&self.raft.metrics().borrow(), self.id)
    }

    /// See [`may_lease`].
    pub fn may_lease(&self) -> bool {
        may_lease(&self.raft.metrics().borrow(), self.id)
    }

    /// The current leader's address as this replica knows it.
    pub fn leader_addr(&self) -> Option<String> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let id = m.current_leader?;
        m.membership_config.membership().get_node(&id).map(|n| n.addr.clone())
    }

    pub fn committed_index(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
    }
}

/// How far [`Replica::wait_replicated`] waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpTo {
    /// The leader's last entry when the wait began (a learner catching up under load).
    Start,
    /// The leader's last entry at each check (nothing new is being proposed).
    Latest,
}

/// The index up to which the leader has replicated to `id` (0 when unknown).
pub fn matched_index(m: &openraft::RaftMetrics<u64, BasicNode>, id: u64) -> u64 {
    m.replication.as_ref().and_then(|r| r.get(&id).copied().flatten()).map_or(0, |l| l.index)
}

impl Replica {
    /// Opens the data directory and starts Raft, initializing the cluster from the configured
    /// replicas if this replica's log is empty (or waiting to be added, with `join`). Returns
    /// the database too, which the caller closes after shutting Raft down.
    pub async fn start(
        config: &ControllerConfig,
        faults: &Faults,
        dialer: quorum_raft::network::Dialer,
    ) -> anyhow::Result<(Arc<Replica>, Arc<rocksdb::DB>)> {
        // The log and snapshots hold every job's script and environment: the directory is the
        // controller's alone, and what an older release left readable is made private.
        quorum_auth::private::make_private(&config.data_dir)
            .map_err(|e| anyhow::anyhow!("preparing data directory {}: {e}", config.data_dir.display()))?;
        let db = quorum_raft::open_db(&config.data_dir.join("db"), &[store::CF_SNAPSHOT, history::CF_HISTORY])?;
        // Again, now that RocksDB made its directory and files (with the process's umask).
        quorum_auth::private::make_private(&config.data_dir)
            .map_err(|e| anyhow::anyhow!("preparing data directory {}: {e}", config.data_dir.display()))?;
        let log_store = LogStore::<TypeConfig>::new(db.clone())?;
        let committed = log_store.committed_index();
        let entry_cache = log_store.entry_cache();
        let keep = history::Keep { script: config.accounting.store_job_script, env: config.accounting.store_job_env };
        let history = history::History::new(db.clone(), keep)?;
        let sm = store::StateMachineStore::open(db.clone(), history, config.feature_level())?;
        let shared = sm.shared();

        let raft_config = openraft::Config {
            cluster_name: "quorum".into(),
            heartbeat_interval: config.raft_heartbeat_ms,
            election_timeout_min: config.election_timeout_min_ms,
            election_timeout_max: config.election_timeout_max_ms,
            // The last chunk's RPC waits for the follower to decode and store the snapshot: tens
            // of seconds at a million jobs on a busy machine. A shorter deadline made the leader
            // resend the whole snapshot again and again, and the follower never caught up.
            install_snapshot_timeout: 300_000,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: config.snapshot_keep_logs,
            max_payload_entries: config.raft_max_payload_entries,
            ..Default::default()
        }
        .validate()?;
        let network = Network::new(faults.raft.clone(), dialer.clone()).with_entry_cache(entry_cache.clone());
        let raft = Raft::new(config.id, Arc::new(raft_config), network, log_store, sm).await?;

        if config.join {
            tracing::info!(replica = config.id, "joining: waiting to be added with `quorum admin add-replica`");
        } else if !raft.is_initialized().await? {
            let members: BTreeMap<u64, BasicNode> =
                config.replicas.iter().map(|r| (r.id, BasicNode::new(r.addr.clone()))).collect();
            // Every replica of a new cluster proposes the same initial membership; openraft
            // accepts identical ones, so no replica has to be special.
            if let Err(e) = raft.initialize(members).await {
                tracing::debug!(error = %e, "initialize");
            }
        }

        let replica = Arc::new(Replica {
            id: config.id,
            addr: config.advertise_addr().to_string(),
            raft,
            shared,
            membership_change: tokio::sync::Mutex::new(()),
            transferring: Default::default(),
            entry_cache,
            leader_contact: Default::default(),
            feature_level: config.feature_level(),
            started_at_ms: now_ms(),
            dialer,
            committed,
        });
        Ok((replica, db))
    }
}
