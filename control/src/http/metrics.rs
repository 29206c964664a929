//! `/metrics`: the cluster as the applied state shows it (jobs, nodes, CPUs, memory and GPUs:
//! the same on every replica), this replica's Raft, what the leader's loops measured
//! ([`crate::leader::Stats`]), and, on the leader, its agents (sessions, heartbeat age, GPU
//! health). Encoded by `prometheus-client` in the OpenMetrics text format.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use quorum_proto::telemetry::gauges::{labels, Gauges};

use crate::leader::LeaderState;
use crate::model::JobState;
use crate::replica::Replica;

/// The registry `/metrics` encodes.
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    /// Every metric of this replica. Counts leader changes from now on (a task that ends with
    /// the replica's Raft).
    pub fn new(replica: Arc<Replica>, leader: Arc<LeaderState>, db: Arc<rocksdb::DB>) -> Metrics {
        let mut registry = Registry::with_prefix("quorum");
        leader.stats.register(&mut registry);
        registry.register_with_unit(
            "snapshot_build",
            "How long each snapshot this replica built took (copy, encode, write)",
            prometheus_client::registry::Unit::Seconds,
            replica.shared.snapshot_seconds.clone(),
        );
        registry.register_with_unit(
            "snapshot",
            "The size of the newest snapshot this replica built",
            prometheus_client::registry::Unit::Bytes,
            replica.shared.snapshot_bytes.clone(),
        );
        let leader_changes = Counter::<u64>::default();
        registry.register(
            "raft_leader_changes",
            "Times this replica saw the leader change (or go) since it started",
            leader_changes.clone(),
        );
        tokio::spawn(count_leader_changes(replica.clone(), leader_changes));
        registry.register_collector(Box::new(Snapshot { replica, leader, db }));
        Metrics { registry }
    }

    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

async fn count_leader_changes(replica: Arc<Replica>, changes: Counter<u64>) {
    let mut metrics = replica.raft.metrics();
    let mut leader = metrics.borrow().current_leader;
    while metrics.changed().await.is_ok() {
        let now = metrics.borrow().current_leader;
        if now != leader {
            changes.inc();
            leader = now;
        }
    }
}

/// What the state and Raft show at the moment of a scrape.
struct Snapshot {
    replica: Arc<Replica>,
    leader: Arc<LeaderState>,
    /// The replica's RocksDB (its log, snapshots and job history).
    db: Arc<rocksdb::DB>,
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Snapshot(replica {})", self.replica.id)
    }
}

impl Snapshot {
    /// The gauges the applied state gives (read under its lock, which is then let go).
    fn of_state(&self) -> Vec<Gauges> {
        let mut jobs = Gauges::new("jobs", "Jobs in the hot state, by state and partition");
        let mut pending = Gauges::new("jobs_pending", "Pending jobs by partition and the reason they wait");
        let mut per_user = Gauges::new("user_jobs", "Pending and running jobs by user, account and state");
        let mut nodes = Gauges::new("nodes", "Nodes by state");
        let mut cpus = Gauges::new("cpus", "CPUs of the registered nodes");
        let mut cpus_allocated = Gauges::new("cpus_allocated", "CPUs allocated to jobs");
        let mut memory = Gauges::new("memory_bytes", "Memory of the registered nodes");
        let mut memory_allocated = Gauges::new("memory_allocated_bytes", "Memory allocated to jobs");
        let mut gpus = Gauges::new("gpus", "GPUs of the registered nodes, by type");
        let mut gpus_allocated = Gauges::new("gpus_allocated", "GPUs allocated to jobs, by type");
        let applied = self.replica.shared.read();
        let state = &applied.state;
        for j in state.jobs.values() {
            jobs.add(labels([("state", j.state.name()), ("partition", &j.partition)]), 1);
            if matches!(j.state, JobState::Pending | JobState::Running | JobState::Suspended) {
                per_user.add(labels([("user", &j.user), ("account", &j.account), ("state", j.state.name())]), 1);
            }
            if j.state == JobState::Pending {
                let reason = crate::wire::shown_reason(j);
                pending.add(labels([("partition", &j.partition), ("reason", &reason)]), 1);
            }
        }
        for state_name in ["idle", "mixed", "allocated", "drain", "down"] {
            nodes.set(labels([("state", state_name)]), 0);
        }
        for n in state.nodes.values() {
            nodes.add(labels([("state", n.state().name())]), 1);
            cpus.add(Vec::new(), n.cpus.into());
            cpus_allocated.add(Vec::new(), n.cpus_in_use().into());
            memory.add(Vec::new(), (n.mem_mb * 1024 * 1024) as i64);
            memory_allocated.add(Vec::new(), (n.alloc_mem_mb * 1024 * 1024) as i64);
            for g in &n.gpus {
                let of_type = labels([("type", &g.gpu_type)]);
                gpus.add(of_type.clone(), 1);
                gpus_allocated.add(of_type, n.alloc_gpus.contains(&g.index).into());
            }
        }
        // A cluster with nothing registered yet still says so.
        for g in [&mut cpus, &mut cpus_allocated, &mut memory, &mut memory_allocated] {
            g.add(Vec::new(), 0);
        }
        vec![jobs, pending, per_user, nodes, cpus, cpus_allocated, memory, memory_allocated, gpus, gpus_allocated]
    }

    /// This replica's Raft as it sees it.
    fn of_raft(&self) -> Vec<Gauges> {
        let metrics = self.replica.raft.metrics();
        let m = metrics.borrow();
        let id = self.replica.id.to_string();
        let one = |name, help, value: u64| {
            let mut g = Gauges::new(name, help);
            g.set(labels([("replica", &id)]), value as i64);
            g
        };
        vec![
            one("raft_term", "The current Raft term", m.current_term),
            one(
                "raft_last_log_index",
                "The index of the newest entry in this replica's log",
                m.last_log_index.unwrap_or(0),
            ),
            one("raft_commit_index", "The newest index this replica knows committed", self.replica.committed_index()),
            one("raft_applied_index", "The newest index this replica applied", m.last_applied.map_or(0, |l| l.index)),
            one(
                "raft_snapshot_index",
                "The index of this replica's newest snapshot",
                m.snapshot.map_or(0, |l| l.index),
            ),
            one(
                "raft_log_entries",
                "Entries in this replica's log since its last purge (what a snapshot has not absorbed)",
                m.last_log_index.unwrap_or(0).saturating_sub(m.purged.map_or(0, |l| l.index)),
            ),
            one("raft_is_leader", "1 on the leader", u64::from(m.current_leader == Some(self.replica.id))),
            one("raft_voters", "Voters in the membership", m.membership_config.membership().voter_ids().count() as u64),
            one("feature_level", "The feature level this replica applies", self.replica.feature_level.into()),
        ]
    }

    /// This replica's RocksDB: whether writes are stopped or slowed down (a write stall holds
    /// every commit back), and the compaction behind it.
    fn of_storage(&self) -> Vec<Gauges> {
        let id = self.replica.id.to_string();
        let property = |name, help, key: &str| {
            let mut g = Gauges::new(name, help);
            let value = self.db.property_int_value(key).ok().flatten().unwrap_or(0);
            g.set(labels([("replica", &id)]), i64::try_from(value).unwrap_or(i64::MAX));
            g
        };
        vec![
            property(
                "rocksdb_write_stopped",
                "1 while RocksDB stops writes (a write stall)",
                "rocksdb.is-write-stopped",
            ),
            property(
                "rocksdb_delayed_write_rate_bytes",
                "The rate RocksDB slows writes down to, in bytes a second (0: not slowed)",
                "rocksdb.actual-delayed-write-rate",
            ),
            property(
                "rocksdb_pending_compaction_bytes",
                "Bytes RocksDB estimates compaction has to rewrite",
                "rocksdb.estimate-pending-compaction-bytes",
            ),
            property("rocksdb_running_compactions", "Compactions running now", "rocksdb.num-running-compactions"),
            property("rocksdb_memtable_bytes", "Bytes in RocksDB's memtables", "rocksdb.cur-size-all-mem-tables"),
        ]
    }

    /// The leader's agents: who is connected, how long since each was heard, each GPU's health.
    /// A follower has no agents: these are empty there.
    fn of_agents(&self) -> Vec<Gauges> {
        let mut connected = Gauges::new("agents_connected", "Agents with a session to this replica (the leader)");
        let mut heard =
            Gauges::new("agent_heartbeat_age_seconds", "Seconds since each connected agent's last heartbeat");
        let mut health = Gauges::new("gpu_health", "Each GPU's health as its agent last reported it: 1 for its state");
        let sessions = self.leader.hub.sessions();
        connected.set(Vec::new(), sessions.len() as i64);
        for (node, agent, last_heard) in &sessions {
            if let Some(at) = last_heard {
                heard.set(
                    labels([("node", node)]),
                    crate::clock::monotonic().saturating_duration_since(*at).as_secs() as i64,
                );
            }
            for g in &agent.gpus {
                let state = crate::wire::gpu_state_name(g.state);
                health.set(labels([("node", node), ("gpu", &g.index.to_string()), ("state", state)]), 1);
            }
        }
        vec![connected, heard, health]
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        for gauges in self.of_state().iter().chain(&self.of_raft()).chain(&self.of_storage()).chain(&self.of_agents()) {
            gauges.encode(&mut encoder)?;
        }
        Ok(())
    }
}
