//! The leader records what each voter runs, so that the cluster's feature level (the lowest
//! among the voters) is replicated state and nothing above it is ever proposed.
//!
//! A voter that cannot be asked keeps what was recorded for it; one never recorded counts as the
//! base level, so an unknown replica can only hold the cluster back, never let a newer command
//! through.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use quorum_proto::api::ReplicaStatusRequest;
use tokio::sync::watch;

use crate::replica::peers::Peers;
use crate::replica::{now_ms, Replica, VERSION};
use quorum_state::{lowest_level, Command, ReplicaVersion, BASE_LEVEL};

/// How often the leader asks the voters.
const POLL: Duration = Duration::from_secs(1);
/// How long one voter may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// What a replica that answers with `feature_level` runs: 0 is a release from before levels.
pub fn reported(feature_level: u32, version: String) -> ReplicaVersion {
    ReplicaVersion { level: feature_level.max(BASE_LEVEL), version }
}

/// Asks the replica at `addr` what it runs; `None` when it does not answer.
pub async fn ask(peers: &Peers, addr: &str) -> Option<ReplicaVersion> {
    let status = peers.client(addr).ok()?.get_replica_status(ReplicaStatusRequest {}).await.ok()?.into_inner();
    Some(reported(status.feature_level, status.version))
}

/// Records, every [`POLL`], what each voter runs.
pub async fn versions_loop(replica: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    let peers = Peers::new(replica.dialer.clone(), Some(ASK_TIMEOUT));
    loop {
        let voters: Vec<(u64, String)> = {
            let m = replica.raft.metrics();
            let m = m.borrow();
            let membership = m.membership_config.membership();
            membership.voter_ids().filter_map(|id| membership.get_node(&id).map(|n| (id, n.addr.clone()))).collect()
        };
        let recorded = replica.shared.read().state.replica_versions.clone();
        let mut versions = BTreeMap::new();
        for (id, addr) in voters {
            let known = if id == replica.id {
                Some(ReplicaVersion { level: replica.feature_level, version: VERSION.to_string() })
            } else {
                ask(&peers, &addr).await
            };
            let version = known
                .or_else(|| recorded.get(&id).cloned())
                .unwrap_or(ReplicaVersion { level: BASE_LEVEL, version: "unknown (not reachable yet)".into() });
            versions.insert(id, version);
        }
        if versions != recorded {
            let before = lowest_level(&recorded);
            match replica.write(Command::SetReplicaVersions { versions: versions.clone(), now: now_ms() }).await {
                Ok(_) => {
                    let after = replica.shared.read().state.cluster_level();
                    if after != before {
                        tracing::info!(from = before, to = after, ?versions, "cluster feature level changed");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "recording replica versions"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = stop.changed() => return,
        }
    }
}
