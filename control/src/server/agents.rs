//! The agent stream. Only the leader accepts it: an agent registers, then heartbeats and reports
//! job exits, and receives launches and kills (see `leader::hub`). An exit is acknowledged only
//! after its `JobEnded` is committed, so an agent keeps re-sending it across leader changes
//! until it is durable.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use quorum_proto::agent::agent_service_server::{AgentService, AgentServiceServer};
use quorum_proto::agent::{
    agent_message, controller_message, AgentMessage, ControllerMessage, ExitAck, ExitKind, GpuHealth, GpuState,
    HeartbeatAck, JobExit,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::batch::ReportBatcher;
use super::not_leader;
use crate::leader::hub::AgentInfo;
use crate::model::{Gpu, NodeAdminState, RankOutcome};
use crate::replica::{now_ms, Core};
use quorum_state::{Command, NodeRegistration};

pub fn service(core: Arc<Core>) -> AgentServiceServer<Agents> {
    let reports = ReportBatcher::reports(core.clone());
    AgentServiceServer::new(Agents { core, reports })
}

pub struct Agents {
    core: Arc<Core>,
    /// Registrations, job ends and health changes, committed in groups.
    reports: ReportBatcher,
}

type OutStream = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

/// Why a node should not take new jobs, from its heartbeat: GPUs in FAILURE, a failing health
/// check. WARNING is shown but is no reason.
fn health_problem(gpus: &[GpuHealth], check: &str) -> Option<String> {
    let mut parts: Vec<String> = gpus
        .iter()
        .filter(|g| g.state == GpuState::GpuFailure as i32)
        .map(|g| format!("GPU {} failure: {}", g.index, g.detail))
        .collect();
    if !check.is_empty() {
        parts.push(format!("health check failed: {check}"));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

fn outcome(exit: &JobExit) -> RankOutcome {
    let (code, signal) = (exit.exit_code, exit.signal);
    match ExitKind::try_from(exit.kind).unwrap_or(ExitKind::Exited) {
        ExitKind::TimedOut => RankOutcome::TimedOut { code, signal },
        ExitKind::Cancelled => RankOutcome::Cancelled { code, signal },
        ExitKind::LaunchFailed => RankOutcome::LaunchFailed,
        ExitKind::OutOfMemory => RankOutcome::OutOfMemory { code, signal },
        ExitKind::LeaseExpired => RankOutcome::LostContact,
        ExitKind::Exited | ExitKind::Unspecified => RankOutcome::Exited { code, signal },
    }
}

#[tonic::async_trait]
impl AgentService for Agents {
    type SessionStream = OutStream;

    async fn session(&self, req: Request<Streaming<AgentMessage>>) -> Result<Response<OutStream>, Status> {
        if !self.core.is_leader() {
            return Err(not_leader(self.core.leader_addr().as_deref()));
        }
        if !self.core.leads_with_quorum() {
            // Perhaps cut off from the others: the agent tries the next replica.
            return Err(not_leader(None));
        }
        let mut inbound = req.into_inner();
        let register = match inbound.message().await? {
            Some(AgentMessage { msg: Some(agent_message::Msg::Register(r)) }) => r,
            _ => return Err(Status::invalid_argument("the first message on the agent stream must be register")),
        };
        if register.node.is_empty() {
            return Err(Status::invalid_argument("register: empty node name"));
        }
        let node = register.node.clone();
        let agent = AgentInfo {
            version: register.version.clone(),
            started_at_ms: register.started_at_ms,
            limits: register.limits.clone(),
            ..Default::default()
        };
        let registration = NodeRegistration {
            name: register.node,
            cpus: register.cpus,
            mem_mb: register.mem_mb,
            gpus: register.gpus.into_iter().map(|g| Gpu { index: g.index, gpu_type: g.gpu_type }).collect(),
            features: register.features,
            version: register.version,
        };
        let unchanged = {
            let applied = self.core.shared.read();
            applied.state.nodes.get(&node).is_some_and(|n| {
                n.cpus == registration.cpus
                    && n.mem_mb == registration.mem_mb
                    && n.gpus == registration.gpus
                    && n.features == registration.features
                    && n.agent_version == registration.version
                    && n.schedulable()
            })
        };
        if !unchanged {
            self.reports.write(Command::RegisterNode { node: registration.clone(), now: now_ms() }).await?;
        }
        tracing::info!(node, "agent connected");

        let (tx, rx) = mpsc::channel(4096);
        let (conn_id, mut closed) = self.core.hub.attach(&node, tx.clone(), agent);
        // Leadership may have moved while the agent registered; the hub closed its streams
        // then, before this one was attached.
        if !self.core.is_leader() {
            self.core.hub.detach(&node, conn_id);
            return Err(not_leader(self.core.leader_addr().as_deref()));
        }
        {
            let applied = self.core.shared.read();
            self.core.hub.reconcile(&applied.state, Some(&node));
        }
        let (core, reports) = (self.core.clone(), self.reports.clone());
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    m = inbound.message() => m,
                    _ = closed.changed() => break,
                };
                let msg = match msg {
                    Ok(Some(AgentMessage { msg: Some(m) })) => m,
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                };
                match msg {
                    agent_message::Msg::Register(_) => {}
                    agent_message::Msg::Output(chunk) => core.hub.output_read(chunk),
                    agent_message::Msg::Heartbeat(hb) => {
                        // Only the leader answers heartbeats: an answer extends the agent's lease,
                        // and a deposed leader's would keep jobs running on a node the real leader
                        // declares DOWN (and requeues elsewhere). The agent follows the hint.
                        if !core.is_leader() {
                            let _ = tx.send(Err(not_leader(core.leader_addr().as_deref()))).await;
                            break;
                        }
                        // A leader no quorum has heard from lately answers nothing: the agent's
                        // lease runs out (and it looks for another leader) before the majority's
                        // leader may declare the node DOWN.
                        if !core.leads_with_quorum() {
                            continue;
                        }
                        let running = hb.running.iter().map(|r| (r.job_id, r.token)).collect();
                        let problem = health_problem(&hb.gpus, &hb.health_check);
                        core.hub.heartbeat(&node, conn_id, running, hb.gpus, hb.health_check);
                        let (down, health_changed) = {
                            let applied = core.shared.read();
                            core.hub.reconcile(&applied.state, Some(&node));
                            let admin = applied.state.nodes.get(&node).map(|n| &n.admin);
                            let changed = match (admin, &problem) {
                                (Some(NodeAdminState::Up), Some(_)) => true,
                                (Some(NodeAdminState::Drain { auto: true, reason }), Some(p)) => reason != p,
                                (Some(NodeAdminState::Drain { auto: true, .. }), None) => true,
                                _ => false,
                            };
                            let able = applied.state.cluster_level() >= 4;
                            (matches!(admin, Some(NodeAdminState::Down { .. })), changed && able)
                        };
                        if health_changed {
                            // Off the stream's task: the heartbeat is answered at once.
                            let (reports, node, problem) = (reports.clone(), node.clone(), problem.clone());
                            tokio::spawn(async move {
                                match &problem {
                                    Some(p) => tracing::warn!(node, problem = %p, "draining an unhealthy node"),
                                    None => tracing::info!(node, "the node is healthy again: resuming it"),
                                }
                                let command = Command::SetNodeHealth { node: node.clone(), problem, now: now_ms() };
                                if let Err(e) = reports.write(command).await {
                                    tracing::warn!(node, error = %e.message(), "recording a node's health");
                                }
                            });
                        }
                        // Declared DOWN while its stream survived (a long stall, a partition
                        // that healed): heard again, it returns to service as on a reconnect.
                        if down {
                            let command = Command::RegisterNode { node: registration.clone(), now: now_ms() };
                            if let Err(e) = reports.write(command).await {
                                tracing::warn!(node, error = %e.message(), "returning a node to service");
                            }
                        }
                        let ack = ControllerMessage {
                            msg: Some(controller_message::Msg::HeartbeatAck(HeartbeatAck {
                                seq: hb.seq,
                                lease_ms: core.liveness.agent_lease.as_millis() as u64,
                            })),
                        };
                        if tx.send(Ok(ack)).await.is_err() {
                            break;
                        }
                    }
                    agent_message::Msg::Exit(exit) => {
                        let (core, reports) = (core.clone(), reports.clone());
                        let tx = tx.clone();
                        let node = node.clone();
                        tokio::spawn(async move {
                            let mut outcome = outcome(&exit);
                            if let RankOutcome::OutOfMemory { code, signal } = outcome {
                                // Replicas of an older release know no OUT_OF_MEMORY: FAILED then.
                                if core.shared.read().state.cluster_level() < 4 {
                                    outcome = RankOutcome::Exited { code, signal };
                                }
                            }
                            let command = Command::JobEnded {
                                job_id: exit.job_id,
                                token: exit.token,
                                node,
                                outcome,
                                now: now_ms(),
                            };
                            match reports.write(command).await {
                                Ok(_) => {
                                    let ack = ControllerMessage {
                                        msg: Some(controller_message::Msg::ExitAck(ExitAck { job_id: exit.job_id })),
                                    };
                                    let _ = tx.send(Ok(ack)).await;
                                }
                                Err(e) => {
                                    tracing::warn!(job = exit.job_id, error = %e.message(), "recording a job exit")
                                }
                            }
                        });
                    }
                }
            }
            core.hub.detach(&node, conn_id);
            tracing::info!(node, "agent disconnected");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
