//! Node liveness: the leader keeps when it last heard each agent in memory only; a node silent
//! for `node_timeout` goes DOWN through Raft.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::state::LeaderState;
use crate::clock::monotonic;
use crate::model::NodeAdminState;
use crate::replica::{now_ms, Replica, WriteError};
use quorum_state::{Command, Response};

/// The nodes, not already DOWN, that have been silent for `node_timeout`.
fn silent_nodes(replica: &Replica, leader: &LeaderState, leading_since: Instant) -> Vec<String> {
    let timeout = leader.liveness.node_timeout;
    let applied = replica.shared.read();
    let now = monotonic();
    applied
        .state
        .nodes
        .values()
        .filter(|n| !matches!(n.admin, NodeAdminState::Down { .. }))
        .filter(|n| leader.hub.silence(&n.name, leading_since, now) >= timeout)
        .map(|n| n.name.clone())
        .collect()
}

/// Ends, as lost contact, the jobs held back from a node's replaced session that its new
/// session has not reported within a lease ([`super::hub::AgentHub::overdue_held`]).
async fn end_overdue_held(replica: &Replica, leader: &LeaderState) {
    let overdue = leader.hub.overdue_held(&replica.shared.read().state);
    for (node, job_id, token) in overdue {
        let outcome = crate::model::RankOutcome::LostContact;
        match replica.write(Command::JobEnded { job_id, token, node: node.clone(), outcome, now: now_ms() }).await {
            Ok((_, response)) => tracing::warn!(
                node,
                job = job_id,
                ?response,
                "a job held from a replaced session of its node was not reported by the new one: ended as lost contact"
            ),
            Err(e) => tracing::warn!(node, job = job_id, error = %e, "ending a job held from a replaced session"),
        }
    }
}

/// Ends, as failed launches, the container jobs placed on nodes whose agents make no
/// containers (an older release, or containers off there), saying why.
async fn end_refused_containers(replica: &Replica, leader: &LeaderState) {
    let refused = leader.hub.refused(&replica.shared.read().state);
    for (node, job_id, token) in refused {
        let why = format!(
            "node {node} cannot run containers (its agent is older than this release, or runs with --no-containers)"
        );
        let outcome = crate::model::RankOutcome::LaunchFailed;
        let ended = Command::JobEnded { job_id, token, node: node.clone(), outcome, now: now_ms() };
        let command = if replica.shared.read().state.cluster_level() >= quorum_state::CONTAINER_LEVEL {
            Command::Batch { commands: vec![Command::JobFailure { job_id, token, why: why.clone() }, ended] }
        } else {
            ended
        };
        tracing::warn!(node, job = job_id, "{why}: the job fails rather than run outside its container");
        if let Err(e) = replica.write(command).await {
            tracing::warn!(node, job = job_id, error = %e, "ending a container job its node cannot run");
        }
    }
}

/// Ends the running steps no `srun` is served for here (theirs went with a previous leader),
/// and has their agents kill their tasks.
async fn end_orphan_steps(replica: &Replica, leader: &LeaderState) {
    let orphans = {
        let applied = replica.shared.read();
        super::steps::orphan_steps(&applied.state, &leader.steps)
    };
    for (job_id, step_id, nodes) in orphans {
        tracing::warn!(
            job = job_id,
            step = step_id,
            "a step's srun is not served here (it went with the last leader): ending it"
        );
        let (kill, command) = super::steps::end_orphan(job_id, step_id, now_ms());
        for node in &nodes {
            leader.hub.step_io(node, kill.clone());
        }
        if let Err(e) = replica.write(command).await {
            tracing::warn!(job = job_id, step = step_id, error = %e, "ending a step without srun");
        }
    }
}

/// Proposes DOWN each node silent for `node_timeout`, checking every tenth of it.
pub(super) async fn liveness_loop(replica: Arc<Replica>, leader: Arc<LeaderState>, mut stop: watch::Receiver<bool>) {
    let leading_since = monotonic();
    let mut told_too_new = false;
    let tick = (leader.liveness.node_timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => return,
        }
        end_overdue_held(&replica, &leader).await;
        end_refused_containers(&replica, &leader).await;
        end_orphan_steps(&replica, &leader).await;
        for node in silent_nodes(&replica, &leader, leading_since) {
            // Judged again, with the node marked, under the hub's lock: a heartbeat that came
            // since keeps it up; one that comes from now on gets no lease until this is over.
            let timeout = leader.liveness.node_timeout;
            let Some(silent) = leader.hub.begin_down(&node, leading_since, timeout) else { continue };
            let reason = format!("not responding: no heartbeat for {:.1}s", silent.as_secs_f64());
            let written =
                replica.write(Command::NodeDown { node: node.clone(), reason: reason.clone(), now: now_ms() }).await;
            leader.hub.down_ended(&node);
            match written {
                Ok((_, Response::NodeDowned { ended, requeued })) => {
                    tracing::warn!(node, reason, ?ended, ?requeued, "node DOWN");
                }
                Ok(_) => {}
                Err(e @ WriteError::TooNew { .. }) => {
                    if !told_too_new {
                        tracing::warn!(node, error = %e, "a silent node cannot be marked DOWN yet");
                        told_too_new = true;
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(node, error = %e, "proposing a node DOWN");
                    break;
                }
            }
        }
    }
}
