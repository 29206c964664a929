//! Agents' sessions with the leader, as the controller's agent service holds them
//! (`control/src/server/agents.rs`), on the controller's own agent hub
//! (`quorum_control::leader::hub::AgentHub`): the hub, not the simulator, decides every launch,
//! kill, suspend and resume a node is sent, holds back the jobs of a replaced session, and keeps
//! when each node was last heard (which node liveness judges by).
//!
//! A session is a stream each way between one agent and one replica incarnation, opened with the
//! node's registration. Each way carries its messages in order, one after another, as TCP does:
//! one lost, or sent while a partition cuts the way, is sent again after a retransmission timeout
//! (and what follows waits behind it), so a partition shorter than the agent's patience leaves
//! the stream up, with what was sent meanwhile delivered late. A stream ends when the hub ends it
//! (the replica stopped leading, or a newer session of the node replaced it), when its replica
//! is gone, or when the agent gives it up (its heartbeats unanswered for three periods and a
//! second, as the real agent's) and opens another. The hub's channel is drained after each call
//! into it, node by node in name order, so that a seed replays the same deliveries (the hub keeps
//! its connections in a `HashMap`, whose order is not the seed's).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorum_control::leader::hub::{AgentHub, AgentInfo, AgentSender, SessionEnds};
use quorum_control::leader::Grants;
use quorum_proto::agent::{controller_message::Msg, ControllerMessage, HeartbeatAck};
use quorum_state::{Command, NodeRegistration};
use tokio::sync::mpsc;

use crate::disk::read;
use crate::leader::{leader_hint, leads, write, WriteError, LEASE};
use crate::net::Host;
use crate::world::{Bug, Replica, World};

/// How many messages a session's channel holds (the controller's).
const CHANNEL: usize = 4096;
/// How long a message lost on a stream (or cut off) waits before it is sent again.
const RETRANSMIT: Duration = Duration::from_millis(200);

/// The controller's hub, as a leader builds it: no launch key (the simulated agents run no
/// processes to sign for), the agents' lease.
pub fn hub() -> AgentHub {
    let histogram = prometheus_client::metrics::histogram::Histogram::new([1.0]);
    AgentHub::new(Grants::new(None), LEASE, histogram)
}

/// What a stream's way from the replica carries.
enum Item {
    Messages(Vec<ControllerMessage>),
    /// The hub ended the session.
    End,
}

/// What a stream's way from the agent carries: a heartbeat (its number and the runs the agent
/// has), or a step's task's exit.
enum Up {
    Beat(u64, Vec<(u64, u64)>),
    StepExit(quorum_proto::agent::StepTaskExit),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Opened by the replica, its answer not yet taken by the agent: nothing flows.
    Opening,
    Up,
    Broken,
}

/// One session's stream, as both ends know it.
pub struct Stream {
    pub replica: u64,
    pub incarnation: u64,
    pub conn: u64,
    pub node: String,
    pub host: Host,
    /// What the node registered as when the session opened (its heartbeats are judged by it).
    registration: NodeRegistration,
    phase: tokio::sync::watch::Sender<Phase>,
    /// The leader the replica named when it ended the session as not leading.
    hint: Mutex<Option<u64>>,
    to_agent: mpsc::UnboundedSender<Item>,
    to_replica: mpsc::UnboundedSender<Up>,
}

impl Stream {
    /// Whether it has not broken (it may still be opening).
    pub fn up(&self) -> bool {
        *self.phase.borrow() != Phase::Broken
    }

    pub fn break_off(&self) {
        self.phase.send_replace(Phase::Broken);
    }

    /// The agent took the answer that opened it: messages flow.
    pub fn adopt(&self) {
        self.phase.send_if_modified(|p| {
            let opening = *p == Phase::Opening;
            if opening {
                *p = Phase::Up;
            }
            opening
        });
    }

    /// The leader named when it ended, if one was.
    pub fn hint(&self) -> Option<u64> {
        *self.hint.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends a heartbeat to the replica.
    pub fn beat(&self, seq: u64, running: Vec<(u64, u64)>) {
        let _ = self.to_replica.send(Up::Beat(seq, running));
    }

    /// Sends a step's task's exit to the replica.
    pub fn step_exit(&self, exit: quorum_proto::agent::StepTaskExit) {
        let _ = self.to_replica.send(Up::StepExit(exit));
    }

    /// Waits until messages flow; false if it broke first.
    async fn flowing(&self) -> bool {
        let mut phase = self.phase.subscribe();
        let phase = phase.wait_for(|p| *p != Phase::Opening).await;
        phase.is_ok_and(|p| *p == Phase::Up)
    }
}

/// Carries one message of `stream` from `from` to `to` as TCP would: sent again after a
/// retransmission timeout while lost or cut off, until it arrives; false if the stream broke
/// (or its replica went) meanwhile.
async fn carry(world: &World, stream: &Stream, from: Host, to: Host) -> bool {
    loop {
        if !stream.up() || replica_of(world, stream).is_none() {
            stream.break_off();
            return false;
        }
        if world.net.is_cut(from, to) || world.net.chance(world.net.loss) {
            tokio::time::sleep(RETRANSMIT).await;
            continue;
        }
        tokio::time::sleep(world.net.delay()).await;
        if !world.net.is_cut(from, to) && stream.up() {
            return true;
        }
    }
}

/// The stream's way to the agent: each item in turn, once the agent has the stream.
async fn to_agent(world: Arc<World>, stream: Arc<Stream>, mut items: mpsc::UnboundedReceiver<Item>) {
    if !stream.flowing().await {
        return;
    }
    let Some(agent) = world.agents.get(&stream.host).cloned() else { return };
    while let Some(item) = items.recv().await {
        if !carry(&world, &stream, stream.replica, stream.host).await {
            return;
        }
        match item {
            Item::Messages(batch) => {
                for m in batch {
                    if let Some(line) = agent.receive(&stream, m, world.now_s()) {
                        world.trace(line);
                    }
                }
            }
            Item::End => {
                stream.break_off();
                return;
            }
        }
    }
}

/// The stream's way to the replica: each heartbeat and step exit in turn, handled as it
/// arrives (an exit handed to its step's route, as the controller's agent service does).
async fn to_replica(world: Arc<World>, stream: Arc<Stream>, mut items: mpsc::UnboundedReceiver<Up>) {
    if !stream.flowing().await {
        return;
    }
    while let Some(item) = items.recv().await {
        if !carry(&world, &stream, stream.host, stream.replica).await {
            return;
        }
        let Some(r) = replica_of(&world, &stream) else { return stream.break_off() };
        match item {
            Up::Beat(seq, running) => heartbeat(&world, &r, &stream, seq, running).await,
            Up::StepExit(exit) => {
                let (job, step) = (exit.job_id, exit.step_id);
                r.steps.deliver(job, step, quorum_control::leader::steps::FromAgent::Exit(exit)).await;
            }
        }
    }
}

/// The replica's end of a session: the hub's channel to the agent.
pub struct Outbound {
    stream: Arc<Stream>,
    tx: AgentSender,
    rx: mpsc::Receiver<Result<ControllerMessage, tonic::Status>>,
    ends: SessionEnds,
}

pub type Sessions = Mutex<BTreeMap<(String, u64), Outbound>>;

fn sessions(r: &Replica) -> std::sync::MutexGuard<'_, BTreeMap<(String, u64), Outbound>> {
    r.sessions.lock().unwrap_or_else(|p| p.into_inner())
}

pub enum Opened {
    Stream(Arc<Stream>),
    /// Refused: not the leader (naming the one it knows, if any).
    NotLeader(Option<u64>),
}

/// An agent opens a session with `r`: refused unless it leads with a quorum; the node is
/// registered (or registered again) if the state does not have it as it says; then the hub takes
/// the stream and sends what the node should run.
pub async fn open(world: &Arc<World>, r: &Arc<Replica>, host: Host, registration: NodeRegistration) -> Opened {
    if !leads(r) {
        return Opened::NotLeader(leader_hint(r).filter(|l| *l != r.id));
    }
    if !quorum_control::replica::leads_with_quorum(&r.raft.metrics().borrow(), r.id) {
        return Opened::NotLeader(None);
    }
    let node = registration.name.clone();
    if quorum_control::leader::rules::needs_registration(&read(&r.applied).state, &registration) {
        world.trace(format!("r{} registers {node}", r.id));
        let now = world.wall_ms(r.id);
        if let Err(e) = write(r, Command::RegisterNode { node: registration.clone(), now }).await {
            return Opened::NotLeader(match e {
                WriteError::NotLeader(l) => l,
                WriteError::Other(_) => None,
            });
        }
    }
    let (tx, rx) = mpsc::channel(CHANNEL);
    let agent = AgentInfo { version: "sim".into(), ..Default::default() };
    let (conn, ends) = r.hub.attach(&node, tx.clone(), agent);
    // Leadership may have moved while the node registered.
    if !leads(r) {
        r.hub.detach(&node, conn);
        return Opened::NotLeader(leader_hint(r).filter(|l| *l != r.id));
    }
    let (to_agent_tx, to_agent_rx) = mpsc::unbounded_channel();
    let (to_replica_tx, to_replica_rx) = mpsc::unbounded_channel();
    let stream = Arc::new(Stream {
        replica: r.id,
        incarnation: r.incarnation,
        conn,
        node: node.clone(),
        host,
        registration,
        phase: tokio::sync::watch::Sender::new(Phase::Opening),
        hint: Mutex::new(None),
        to_agent: to_agent_tx,
        to_replica: to_replica_tx,
    });
    tokio::spawn(to_agent(world.clone(), stream.clone(), to_agent_rx));
    tokio::spawn(to_replica(world.clone(), stream.clone(), to_replica_rx));
    sessions(r).insert((node.clone(), conn), Outbound { stream: stream.clone(), tx, rx, ends });
    r.hub.reconcile(&read(&r.applied).state, Some(&node));
    pump(world, r);
    world.trace(format!("r{} session {conn} for {node}", r.id));
    Opened::Stream(stream)
}

/// Ends a session from the replica's side (it does not lead, or the session was replaced): what
/// the hub sent before goes first, then the end.
fn end(world: &Arc<World>, r: &Arc<Replica>, stream: &Stream, hint: Option<u64>) {
    *stream.hint.lock().unwrap_or_else(|p| p.into_inner()) = hint;
    if let Some(out) = sessions(r).get(&(stream.node.clone(), stream.conn)) {
        let _ = out.tx.try_send(Err(tonic::Status::unavailable("this replica does not lead")));
    }
    r.hub.detach(&stream.node, stream.conn);
    pump(world, r);
}

/// A heartbeat on `stream`, as the controller's agent service answers it: only a leader answers
/// (a deposed one ends the session, naming the leader); not while it may not lease (no quorum
/// heard from it lately, or nothing of its own term applied yet); not on a replaced session. The
/// hub records it (and whether it is a lease: not while the node is being declared DOWN), sends
/// the node what it lacks, and a node DOWN while its stream survived returns to service.
pub async fn heartbeat(world: &Arc<World>, r: &Arc<Replica>, stream: &Arc<Stream>, seq: u64, running: Vec<(u64, u64)>) {
    if !leads(r) {
        end(world, r, stream, leader_hint(r).filter(|l| *l != r.id));
        return;
    }
    let early = world.bug(Bug::EarlyLease);
    if !early && !quorum_control::replica::may_lease(&r.raft.metrics().borrow(), r.id) {
        return;
    }
    if !r.hub.is_current(&stream.node, stream.conn) {
        end(world, r, stream, None);
        return;
    }
    let hb = quorum_proto::agent::Heartbeat { seq, ..Default::default() };
    let lease = r.hub.heartbeat(&stream.node, stream.conn, running, hb) || early;
    let back = {
        let a = read(&r.applied);
        r.hub.reconcile(&a.state, Some(&stream.node));
        let now = world.wall_ms(r.id);
        quorum_control::leader::rules::on_heartbeat(&a.state, &stream.registration, &None, now).return_to_service
    };
    if lease {
        let lease_ms = LEASE.as_millis() as u64;
        if let Some(out) = sessions(r).get(&(stream.node.clone(), stream.conn)) {
            let _ =
                out.tx.try_send(Ok(ControllerMessage { msg: Some(Msg::HeartbeatAck(HeartbeatAck { seq, lease_ms })) }));
        }
    }
    pump(world, r);
    if let Some(command) = back {
        world.trace(format!("r{} returns {} to service", r.id, stream.node));
        let _ = write(r, command).await;
    }
}

/// Sends what the hub put on each session's channel, node by node in name order, on its stream.
/// A session whose channel ended (the hub closed it, or replaced it with a newer one) ends at the
/// agent after what came before it.
pub fn pump(world: &Arc<World>, r: &Arc<Replica>) {
    let mut batches = Vec::new();
    {
        let mut all = sessions(r);
        let mut closed = Vec::new();
        for (key, out) in all.iter_mut() {
            let mut batch = Vec::new();
            let mut ended = false;
            while let Ok(message) = out.rx.try_recv() {
                match message {
                    Ok(m) => batch.push(m),
                    Err(_) => {
                        ended = true;
                        break;
                    }
                }
            }
            let replaced = out.ends.superseded.has_changed().unwrap_or(true);
            let closed_all = out.ends.generation.has_changed().unwrap_or(true);
            ended |= replaced || closed_all;
            if world.bug(Bug::NoFreeze) {
                batch.retain(|m| !matches!(m.msg, Some(Msg::Suspend(_))));
            }
            if ended {
                closed.push(key.clone());
            }
            if !batch.is_empty() || ended {
                batches.push((out.stream.clone(), batch, ended));
            }
        }
        for key in closed {
            all.remove(&key);
        }
    }
    for (stream, batch, ended) in batches {
        if !batch.is_empty() {
            let _ = stream.to_agent.send(Item::Messages(batch));
        }
        if ended {
            let _ = stream.to_agent.send(Item::End);
        }
    }
}

/// Ends every session of `r` (it stopped leading): the hub closes its streams.
pub fn close_all(world: &Arc<World>, r: &Arc<Replica>) {
    r.hub.close_all();
    pump(world, r);
}

/// The live incarnation `stream` was opened with, if it still runs.
pub fn replica_of(world: &World, stream: &Stream) -> Option<Arc<Replica>> {
    world.replica(stream.replica).filter(|r| r.incarnation == stream.incarnation)
}
