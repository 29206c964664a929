//! The agent stream. Only the leader accepts it: an agent registers, then heartbeats and reports
//! job exits, and receives launches and kills (see `leader::hub`). An exit is acknowledged only
//! after its `JobEnded` is committed, so an agent keeps re-sending it across leader changes
//! until it is durable. This module carries the messages; what each one turns into is decided
//! by `leader::rules`.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use quorum_proto::agent::agent_service_server::{AgentService, AgentServiceServer};
use quorum_proto::agent::{agent_message, controller_message, AgentMessage, ControllerMessage, ExitAck, HeartbeatAck};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::api::{not_leader, write_status};
use crate::leader::hub::AgentInfo;
use crate::leader::steps::FromAgent;
use crate::leader::{rules, LeaderState};
use crate::model::Gpu;
use crate::replica::batch::ReportBatcher;
use crate::replica::{now_ms, Replica};
use crate::security::Security;
use crate::wire;
use quorum_auth::listener::Peer;
use quorum_auth::pki::PeerRole;
use quorum_state::{Command, NodeRegistration};

pub fn service(replica: Arc<Replica>, leader: Arc<LeaderState>, security: Arc<Security>) -> AgentServiceServer<Agents> {
    let reports = ReportBatcher::reports(replica.clone());
    AgentServiceServer::new(Agents { replica, leader, security, reports })
}

/// The GPU idle policy's verdict on one heartbeat of `node`: its jobs' GPU use noted, and those
/// the policy cancels cancelled, as root, off the stream's task.
fn watch_gpu_idle(
    replica: &Replica,
    leader: &LeaderState,
    reports: &ReportBatcher,
    node: &str,
    running: &[quorum_proto::agent::RunningJob],
) {
    let Some(policy) = &leader.gpu_idle else { return };
    let utils: Vec<(u64, Option<u32>)> = running.iter().map(|r| (r.job_id, r.gpu_util_pct)).collect();
    let cancel = leader.idle_gpus.note(policy, &replica.shared.read().state, &utils, now_ms());
    for job_id in cancel {
        tracing::warn!(job = job_id, node, "cancelling a job whose GPUs stayed idle (gpu_idle)");
        let command = Command::CancelJob { job_id, user: "root".into(), now: now_ms(), whole_array: false };
        let writer = reports.clone();
        tokio::spawn(async move {
            if let Err(e) = writer.write(command).await {
                tracing::warn!(job = job_id, error = %e, "cancelling an idle job");
            }
        });
    }
}

pub struct Agents {
    replica: Arc<Replica>,
    leader: Arc<LeaderState>,
    security: Arc<Security>,
    /// Registrations, job ends and health changes, committed in groups.
    reports: ReportBatcher,
}

type OutStream = Pin<Box<dyn Stream<Item = Result<ControllerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for Agents {
    type SessionStream = OutStream;

    async fn session(&self, req: Request<Streaming<AgentMessage>>) -> Result<Response<OutStream>, Status> {
        if !self.replica.is_leader() {
            return Err(not_leader(self.replica.leader_addr().as_deref()));
        }
        if !self.replica.leads_with_quorum() {
            // Perhaps cut off from the others: the agent tries the next replica.
            return Err(not_leader(None));
        }
        let peer = req.extensions().get::<Peer>().cloned().unwrap_or_default();
        let mut inbound = req.into_inner();
        let register = match inbound.message().await? {
            Some(AgentMessage { msg: Some(agent_message::Msg::Register(r)) }) => r,
            _ => return Err(Status::invalid_argument("the first message on the agent stream must be register")),
        };
        if register.node.is_empty() {
            return Err(Status::invalid_argument("register: empty node name"));
        }
        // An agent registers only as the node its certificate names.
        match &peer.role {
            Some(PeerRole::Agent(name)) if *name == register.node => {}
            None if self.security.plaintext_trusted(&peer) => {}
            other => {
                let status = Status::permission_denied(format!(
                    "register as node '{}' refused: the certificate is for {}",
                    register.node,
                    match other {
                        Some(PeerRole::Agent(n)) => format!("node '{n}'"),
                        Some(r) => format!("{r:?}, not an agent"),
                        None => "no one (none presented)".into(),
                    }
                ));
                tracing::warn!(peer = %peer.describe(), node = register.node, reason = status.message(), "refused an agent");
                return Err(status);
            }
        }
        let node = register.node.clone();
        let agent = AgentInfo {
            version: register.version.clone(),
            started_at_ms: register.started_at_ms,
            limits: register.limits.clone(),
            capabilities: register.capabilities.clone(),
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
        let needed = rules::needs_registration(&self.replica.shared.read().state, &registration);
        if needed {
            let command = Command::RegisterNode { node: registration.clone(), now: now_ms() };
            self.reports.write(command).await.map_err(write_status)?;
        }
        tracing::info!(node, "agent connected");

        let (tx, rx) = mpsc::channel(4096);
        let (conn_id, mut ends) = self.leader.hub.attach(&node, tx.clone(), agent);
        // Leadership may have moved while the agent registered; the hub closed its streams
        // then, before this one was attached.
        if !self.replica.is_leader() {
            self.leader.hub.detach(&node, conn_id);
            return Err(not_leader(self.replica.leader_addr().as_deref()));
        }
        {
            let applied = self.replica.shared.read();
            self.leader.hub.reconcile(&applied.state, Some(&node));
        }
        let (replica, leader, reports) = (self.replica.clone(), self.leader.clone(), self.reports.clone());
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    m = inbound.message() => m,
                    _ = ends.generation.changed() => break,
                    _ = ends.superseded.changed() => break,
                };
                let msg = match msg {
                    Ok(Some(AgentMessage { msg: Some(m) })) => m,
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                };
                match msg {
                    agent_message::Msg::Register(_) => {}
                    agent_message::Msg::Output(chunk) => leader.hub.output_read(chunk),
                    agent_message::Msg::Usage(sample) => leader.hub.usage_read(sample),
                    agent_message::Msg::Progress(p) => {
                        // Only for an allocation this node runs: no agent speaks for another's jobs.
                        let ours = replica.shared.read().state.jobs.get(&p.job_id).is_some_and(|j| {
                            j.alloc_index == p.token
                                && j.allocation.as_ref().is_some_and(|a| a.nodes.iter().any(|n| n.node == node))
                        });
                        if ours || p.text.is_empty() {
                            leader.hub.progress(&node, p);
                        }
                    }
                    agent_message::Msg::StepOutput(o) => {
                        let (job, step) = (o.job_id, o.step_id);
                        leader.steps.deliver(job, step, FromAgent::Output(o)).await;
                    }
                    agent_message::Msg::StepExit(e) => {
                        let (job, step) = (e.job_id, e.step_id);
                        leader.steps.deliver(job, step, FromAgent::Exit(e)).await;
                    }
                    agent_message::Msg::Pmi(x) => {
                        let (job, step) = (x.job_id, x.step_id);
                        leader.steps.deliver(job, step, FromAgent::Pmi(node.clone(), x)).await;
                    }
                    agent_message::Msg::Heartbeat(hb) => {
                        // Only the leader answers heartbeats: an answer extends the agent's lease,
                        // and a deposed leader's would keep jobs running on a node the real leader
                        // declares DOWN (and requeues elsewhere). The agent follows the hint.
                        if !replica.is_leader() {
                            let _ = tx.send(Err(not_leader(replica.leader_addr().as_deref()))).await;
                            break;
                        }
                        // A leader no quorum has heard from lately answers nothing: the agent's
                        // lease runs out (and it looks for another leader) before the majority's
                        // leader may declare the node DOWN. Nor does one that has not yet applied
                        // what older terms left in its log (`replica::may_lease`).
                        if !replica.may_lease() {
                            continue;
                        }
                        // A replaced session's heartbeats are not answered: its lease runs out.
                        if !leader.hub.is_current(&node, conn_id) {
                            break;
                        }
                        watch_gpu_idle(&replica, &leader, &reports, &node, &hb.running);
                        let running = hb.running.iter().map(|r| (r.job_id, r.token)).collect();
                        let problem = rules::health_problem(&hb.gpus, &hb.health_check);
                        let seq = hb.seq;
                        // No lease while the node is being declared DOWN (the strays are
                        // still killed below, and the next heartbeat is answered).
                        let lease = leader.hub.heartbeat(&node, conn_id, running, hb);
                        let actions = {
                            let applied = replica.shared.read();
                            leader.hub.reconcile(&applied.state, Some(&node));
                            rules::on_heartbeat(&applied.state, &registration, &problem, now_ms())
                        };
                        if let Some(command) = actions.health {
                            // Off the stream's task: the heartbeat is answered at once.
                            let (reports, node) = (reports.clone(), node.clone());
                            tokio::spawn(async move {
                                match &problem {
                                    Some(p) => tracing::warn!(node, problem = %p, "draining an unhealthy node"),
                                    None => tracing::info!(node, "the node is healthy again: resuming it"),
                                }
                                if let Err(e) = reports.write(command).await {
                                    tracing::warn!(node, error = %e, "recording a node's health");
                                }
                            });
                        }
                        if let Some(command) = actions.return_to_service {
                            if let Err(e) = reports.write(command).await {
                                tracing::warn!(node, error = %e, "returning a node to service");
                            }
                        }
                        if !lease {
                            continue;
                        }
                        let ack = ControllerMessage {
                            msg: Some(controller_message::Msg::HeartbeatAck(HeartbeatAck {
                                seq,
                                lease_ms: leader.liveness.agent_lease.as_millis() as u64,
                            })),
                        };
                        if tx.send(Ok(ack)).await.is_err() {
                            break;
                        }
                    }
                    agent_message::Msg::Exit(exit) => {
                        let (replica, reports) = (replica.clone(), reports.clone());
                        let tx = tx.clone();
                        let node = node.clone();
                        tokio::spawn(async move {
                            let command = {
                                let state = &replica.shared.read().state;
                                let ended = rules::job_ended(
                                    state,
                                    exit.job_id,
                                    exit.token,
                                    node,
                                    wire::outcome(&exit),
                                    wire::usage(exit.usage.as_ref()),
                                    &exit.node_problem,
                                    now_ms(),
                                );
                                rules::with_failure(state, ended, &exit)
                            };
                            match reports.write(command).await {
                                Ok(_) => {
                                    let ack = ControllerMessage {
                                        msg: Some(controller_message::Msg::ExitAck(ExitAck { job_id: exit.job_id })),
                                    };
                                    let _ = tx.send(Ok(ack)).await;
                                }
                                Err(e) => {
                                    tracing::warn!(job = exit.job_id, error = %e, "recording a job exit")
                                }
                            }
                        });
                    }
                }
            }
            leader.hub.detach(&node, conn_id);
            tracing::info!(node, "agent disconnected");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
