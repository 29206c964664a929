//! The leader's connections to agents, and the reconciliation that keeps each node doing what
//! the state says.
//!
//! Launches and kills are derived from the state, never queued: after every applied change and
//! every heartbeat, each connected node's jobs in the state are compared with what was already
//! sent on its current stream and with what the agent reports running. A new stream (after a
//! reconnect or a leader change) starts with nothing sent, so everything is re-sent; agents
//! deduplicate by job id and fencing token, so delivery is at least once and effect exactly once.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use quorum_proto::agent::{
    controller_message::Msg, ControllerMessage, ExitKind, GpuHealth, Kill, Launch, OutputChunk, ReadOutput, ReadUsage,
    UsageSample,
};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::Status;

use super::grants::Grants;
use super::heard::Heard;
use crate::clock::monotonic;
use crate::model::JobId;
use crate::wire;
use quorum_state::ClusterState;

pub type AgentSender = mpsc::Sender<Result<ControllerMessage, Status>>;

/// What a connected agent said of itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentInfo {
    pub version: String,
    pub started_at_ms: u64,
    /// How it limits jobs (cgroups, or rlimits and why).
    pub limits: String,
    /// Each GPU's health from its newest heartbeat.
    pub gpus: Vec<GpuHealth>,
    /// The health check's output while it fails.
    pub health_check: String,
    /// Its image cache: bytes, images.
    pub image_cache: (u64, u32),
    /// What it can run beyond plain jobs (`containers`).
    pub capabilities: Vec<String>,
}

impl AgentInfo {
    /// Whether it makes containers (an agent of an older release, or with them off, does not).
    pub fn runs_containers(&self) -> bool {
        self.can("containers")
    }

    /// Whether it said it can do `capability` when it registered ("containers", "pmi2").
    pub fn can(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }
}

struct Conn {
    id: u64,
    tx: AgentSender,
    agent: AgentInfo,
    /// Each allocation launched on this session, with the time limit (seconds, 0: none) it was
    /// last sent: a limit changed since (`scontrol update`) is sent again as a launch.
    launched: HashMap<(JobId, u64), u64>,
    killed: HashSet<(JobId, u64)>,
    /// Whether each allocation was last told to be frozen (scontrol suspend) or thawed.
    frozen: HashMap<(JobId, u64), bool>,
    /// What the agent said it runs in its last heartbeat, as (job, token).
    reported: Vec<(JobId, u64)>,
    /// Set when a newer session for the node replaced this one.
    superseded: watch::Sender<bool>,
}

/// The jobs a replaced session of a node had been sent or said it ran: never launched on a newer
/// session of the node (another agent process, perhaps still running them) unless it reports
/// them too. One the newer session does not report a lease after the replacement is ended as
/// lost contact ([`AgentHub::overdue_held`]): requeued if `--requeue` (its supervisor killed the
/// old copy with the lease), else `NODE_FAIL`, and the old copy is killed if its agent returns.
struct Held {
    since: Instant,
    jobs: HashSet<(JobId, u64)>,
    /// Those already proposed ended.
    ended: HashSet<(JobId, u64)>,
}

#[derive(Default)]
struct Inner {
    conns: HashMap<String, Conn>,
    next_id: u64,
    /// When each node's agent was last heard from while this replica leads (kept after its
    /// stream ends, so that a node that disconnected is judged from its last heartbeat), and
    /// the nodes being declared DOWN.
    heard: Heard,
    /// Output reads sent to agents and not yet answered, by request id.
    reads: HashMap<u64, oneshot::Sender<OutputChunk>>,
    /// Usage reads (`sstat`) likewise; their ids come from the same counter.
    usage_reads: HashMap<u64, oneshot::Sender<UsageSample>>,
    next_read: u64,
    held: HashMap<String, Held>,
    /// What each job's start waits for on its nodes (an image pulled), as their agents said.
    progress: HashMap<JobId, Progress>,
    /// Container jobs not launched on a node whose agent makes no containers, as (node, job,
    /// token), for the leader to end as failed launches ([`AgentHub::refused`]).
    refused: HashSet<(String, JobId, u64)>,
    /// Those already handed over.
    refused_told: HashSet<(JobId, u64)>,
}

/// The most jobs whose progress the leader keeps at once.
const MAX_PROGRESS: usize = 100_000;

/// What a job's start waits for on a node (`JobProgress`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    pub token: u64,
    pub node: String,
    pub text: String,
    /// The job's own start waits (it shows CONFIGURING), not one of its steps.
    pub launch: bool,
}

/// The agents connected to this replica while it leads.
pub struct AgentHub {
    inner: Mutex<Inner>,
    /// Bumped by [`AgentHub::close_all`]; streams end when it changes.
    generation: watch::Sender<u64>,
    grants: Grants,
    /// The agents' lease: how long jobs of a replaced session are held back.
    lease: Duration,
    /// The trace of each job submitted while spans are exported, for its launch spans.
    pub traces: Traces,
    /// Observes each first launch's delay after the job's allocation.
    dispatch_seconds: prometheus_client::metrics::histogram::Histogram,
}

/// How many jobs' traces the leader keeps at most (the oldest go first).
const MAX_TRACED: usize = 100_000;

/// Each traced job's W3C `traceparent`: its submit's, then its scheduling span's once the
/// leader planned its start; a launch continues it, and carries it on to the agent. A submit is
/// known by its request id until its commit returns the job's id: the job may be scheduled, and
/// launched, before that.
#[derive(Default)]
pub struct Traces(Mutex<TracesByKey>);

#[derive(Default)]
struct TracesByKey {
    jobs: std::collections::BTreeMap<JobId, String>,
    requests: std::collections::BTreeMap<String, String>,
}

/// Keeps `value` under `key` in `map`, which holds [`MAX_TRACED`] at most (the first go first).
fn keep<K: Ord>(map: &mut std::collections::BTreeMap<K, String>, key: K, value: String) {
    if value.is_empty() {
        return;
    }
    if map.len() >= MAX_TRACED {
        map.pop_first();
    }
    map.insert(key, value);
}

impl Traces {
    fn lock(&self) -> std::sync::MutexGuard<'_, TracesByKey> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `traceparent` as `job`'s trace (nothing when it is empty: nothing is exported).
    pub fn remember(&self, job: JobId, traceparent: String) {
        keep(&mut self.lock().jobs, job, traceparent);
    }

    /// Keeps the trace of a submit in flight by its request id (none: not kept).
    pub fn remember_request(&self, request_id: &str, traceparent: String) {
        if !request_id.is_empty() && !traceparent.is_empty() {
            keep(&mut self.lock().requests, request_id.to_string(), traceparent);
        }
    }

    /// The submit of `request_id` made `job`: its trace is the job's from now on, unless the
    /// job's start was planned already (its trace then goes on from that span).
    pub fn submitted(&self, request_id: &str, job: JobId, traceparent: String) {
        if traceparent.is_empty() {
            return;
        }
        let mut traces = self.lock();
        let planned = traces.requests.remove(request_id).is_some() && traces.jobs.contains_key(&job);
        if !planned {
            keep(&mut traces.jobs, job, traceparent);
        }
    }

    /// `job`'s trace, or that of the submit in flight (`request_id`) that made it.
    pub fn of(&self, job: JobId, request_id: &str) -> Option<String> {
        let traces = self.lock();
        traces.jobs.get(&job).or_else(|| traces.requests.get(request_id)).cloned()
    }

    pub fn is_empty(&self) -> bool {
        let traces = self.lock();
        traces.jobs.is_empty() && traces.requests.is_empty()
    }
}

/// What ends a session's stream: every stream's generation (the replica stopped leading), and
/// this session's replacement by a newer one for the same node.
pub struct SessionEnds {
    pub generation: watch::Receiver<u64>,
    pub superseded: watch::Receiver<bool>,
}

impl AgentHub {
    pub fn new(
        grants: Grants,
        lease: Duration,
        dispatch_seconds: prometheus_client::metrics::histogram::Histogram,
    ) -> AgentHub {
        AgentHub {
            inner: Mutex::new(Inner::default()),
            generation: watch::Sender::new(0),
            grants,
            lease,
            traces: Traces::default(),
            dispatch_seconds,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a stream for `node`. A node has one session: an older one is cut off at once
    /// (its stream ends, its heartbeats go unanswered), and what it ran is held back from this
    /// one (see [`Held`]). Returns the connection id and what ends the session.
    pub fn attach(&self, node: &str, tx: AgentSender, agent: AgentInfo) -> (u64, SessionEnds) {
        let mut inner = self.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.heard.heard(node, monotonic());
        let (superseded, superseded_rx) = watch::channel(false);
        let old = inner.conns.insert(
            node.to_string(),
            Conn {
                id,
                tx,
                agent,
                launched: HashMap::new(),
                killed: HashSet::new(),
                frozen: HashMap::new(),
                reported: Vec::new(),
                superseded,
            },
        );
        if let Some(old) = old {
            tracing::warn!(node, old = old.id, new = id, "a new session for the node replaces the one it had");
            let _ = old.superseded.send(true);
            let _ = old.tx.try_send(Err(Status::aborted(format!("a newer session for node {node} replaced this one"))));
            let mut jobs: HashSet<(JobId, u64)> = old.launched.keys().chain(&old.reported).copied().collect();
            if let Some(prev) = inner.held.remove(node) {
                jobs.extend(prev.jobs);
            }
            if !jobs.is_empty() {
                inner.held.insert(node.to_string(), Held { since: monotonic(), jobs, ended: HashSet::new() });
            }
        }
        let mut generation = self.generation.subscribe();
        generation.mark_unchanged();
        (id, SessionEnds { generation, superseded: superseded_rx })
    }

    /// Whether `conn_id` is still `node`'s session.
    pub fn is_current(&self, node: &str, conn_id: u64) -> bool {
        self.lock().conns.get(node).is_some_and(|c| c.id == conn_id)
    }

    pub fn detach(&self, node: &str, conn_id: u64) {
        let mut inner = self.lock();
        if inner.conns.get(node).is_some_and(|c| c.id == conn_id) {
            inner.conns.remove(node);
        }
    }

    /// Records a heartbeat of `node`'s session `conn_id`. Whether it may be answered with a
    /// lease: not from a replaced session, nor while the node is being declared DOWN
    /// ([`Heard`]).
    #[must_use]
    pub fn heartbeat(
        &self,
        node: &str,
        conn_id: u64,
        running: Vec<(JobId, u64)>,
        hb: quorum_proto::agent::Heartbeat,
    ) -> bool {
        let mut inner = self.lock();
        let Some(c) = inner.conns.get_mut(node).filter(|c| c.id == conn_id) else { return false };
        c.reported = running;
        c.agent.gpus = hb.gpus;
        c.agent.health_check = hb.health_check;
        c.agent.image_cache = (hb.image_cache_bytes, hb.images_cached);
        inner.heard.heard(node, monotonic())
    }

    /// How long `node`'s agent has been silent, counted from `since` (when this replica began
    /// leading) if it was not heard from since.
    pub fn silence(&self, node: &str, since: Instant, now: Instant) -> Duration {
        self.lock().heard.silence(node, since, now)
    }

    /// See [`Heard::begin_down`] (now).
    pub fn begin_down(&self, node: &str, since: Instant, timeout: Duration) -> Option<Duration> {
        self.lock().heard.begin_down(node, since, monotonic(), timeout)
    }

    /// See [`Heard::down_ended`].
    pub fn down_ended(&self, node: &str) {
        self.lock().heard.down_ended(node);
    }

    /// Ends every stream: the replica stopped leading or is shutting down.
    pub fn close_all(&self) {
        let mut inner = self.lock();
        for (_, conn) in inner.conns.drain() {
            let _ = conn.tx.try_send(Err(Status::unavailable("this replica is no longer the leader")));
        }
        inner.heard.clear();
        inner.held.clear();
        self.generation.send_modify(|g| *g += 1);
    }

    /// Sends a fault to inject into one of `node`'s simulated GPUs.
    pub fn gpu_fault(&self, node: &str, gpu: u32, kind: &str) -> bool {
        let inner = self.lock();
        inner
            .conns
            .get(node)
            .is_some_and(|c| send(c, Msg::GpuFault(quorum_proto::agent::GpuFault { gpu, kind: kind.to_string() })))
    }

    /// Asks `node`'s agent for part of a job's output file; the answer comes on the receiver.
    /// `None` when no agent of that node is connected. A caller that stops waiting calls
    /// [`AgentHub::forget_read`] with the request id.
    pub fn read_output(
        &self,
        node: &str,
        launch: Launch,
        stderr: bool,
        offset: u64,
        max_bytes: u32,
    ) -> Option<(u64, oneshot::Receiver<OutputChunk>)> {
        let mut inner = self.lock();
        inner.next_read += 1;
        let request_id = inner.next_read;
        let read = ReadOutput { request_id, launch: Some(launch), stderr, offset, max_bytes };
        if !send(inner.conns.get(node)?, Msg::ReadOutput(read)) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        inner.reads.insert(request_id, tx);
        Some((request_id, rx))
    }

    /// An agent's answer to [`AgentHub::read_output`].
    pub fn output_read(&self, chunk: OutputChunk) {
        if let Some(tx) = self.lock().reads.remove(&chunk.request_id) {
            let _ = tx.send(chunk);
        }
    }

    pub fn forget_read(&self, request_id: u64) {
        let mut inner = self.lock();
        inner.reads.remove(&request_id);
        inner.usage_reads.remove(&request_id);
    }

    /// Asks `node`'s agent what job `job_id`'s processes there use now; the answer comes on the
    /// receiver. `None` when no agent of that node is connected. A caller that stops waiting
    /// calls [`AgentHub::forget_read`] with the request id.
    pub fn read_usage(&self, node: &str, job_id: JobId) -> Option<(u64, oneshot::Receiver<UsageSample>)> {
        let mut inner = self.lock();
        inner.next_read += 1;
        let request_id = inner.next_read;
        if !send(inner.conns.get(node)?, Msg::ReadUsage(ReadUsage { request_id, job_id })) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        inner.usage_reads.insert(request_id, tx);
        Some((request_id, rx))
    }

    /// An agent's answer to [`AgentHub::read_usage`].
    /// An agent said what a job waits for on its node (or that it no longer does).
    pub fn progress(&self, node: &str, p: quorum_proto::agent::JobProgress) {
        let mut inner = self.lock();
        if p.text.is_empty() {
            if inner.progress.get(&p.job_id).is_some_and(|q| q.node == node) {
                inner.progress.remove(&p.job_id);
            }
        } else {
            if inner.progress.len() >= MAX_PROGRESS && !inner.progress.contains_key(&p.job_id) {
                return;
            }
            let text: String = p.text.chars().take(512).collect();
            inner
                .progress
                .insert(p.job_id, Progress { token: p.token, node: node.to_string(), text, launch: p.launch });
        }
    }

    /// What `job` waits for, while it runs under allocation `token`.
    pub fn progress_of(&self, job: JobId, token: u64) -> Option<Progress> {
        self.lock().progress.get(&job).filter(|p| p.token == token).cloned()
    }

    pub fn usage_read(&self, sample: UsageSample) {
        if let Some(tx) = self.lock().usage_reads.remove(&sample.request_id) {
            let _ = tx.send(sample);
        }
    }

    /// Sends `signal` to job `job_id` (allocation `token`) on `node`; false when no agent of that
    /// node is connected.
    /// The signal carries the job's launch grant for the node, as proof.
    pub fn signal(&self, state: &ClusterState, node: &str, job_id: JobId, token: u64, signal: i32) -> bool {
        let inner = self.lock();
        let Some(launch) = self.launch_for(state, job_id, node) else { return false };
        let signal =
            quorum_proto::agent::Signal { job_id, token, signal, grant: launch.grant, signature: launch.signature };
        inner.conns.get(node).is_some_and(|c| send(c, Msg::Signal(signal)))
    }

    /// Signs and sends a step's launch to `node`; false when no agent of that node is connected.
    pub fn launch_step(&self, node: &str, mut launch: quorum_proto::agent::StepLaunch) -> bool {
        self.grants.sign_step(&mut launch, node, crate::replica::now_ms());
        let inner = self.lock();
        inner.conns.get(node).is_some_and(|c| send(c, Msg::StepLaunch(launch)))
    }

    /// Sends a step's input or a signal for its tasks to `node`.
    pub fn step_io(&self, node: &str, io: quorum_proto::agent::StepIo) -> bool {
        let inner = self.lock();
        inner.conns.get(node).is_some_and(|c| send(c, Msg::StepIo(io)))
    }

    /// The signed launch message for `job_id`'s rank on `node`.
    pub fn launch_for(&self, state: &ClusterState, job_id: JobId, node: &str) -> Option<Launch> {
        let mut launch = unsigned_launch(state, job_id, node)?;
        self.grants.sign(&mut launch, node, crate::replica::now_ms());
        Some(launch)
    }

    /// The launch for `job_id`'s rank on `node`, in a span of the job's trace when it has one,
    /// which the agent's span of the job continues.
    fn traced_launch(&self, state: &ClusterState, job_id: JobId, node: &str) -> Option<Launch> {
        let mut launch = self.launch_for(state, job_id, node)?;
        if !quorum_proto::telemetry::exporting() {
            return Some(launch);
        }
        let request_id = state.jobs.get(&job_id).map_or("", |j| j.request_id.as_str());
        if let Some(parent) = self.traces.of(job_id, request_id) {
            let span = tracing::info_span!("launch", job_id, node);
            quorum_proto::telemetry::continue_trace(&span, &parent);
            launch.traceparent = quorum_proto::telemetry::traceparent(&span);
        }
        Some(launch)
    }

    /// The agent connected for `node`, if one is.
    pub fn agent(&self, node: &str) -> Option<AgentInfo> {
        self.lock().conns.get(node).map(|c| c.agent.clone())
    }

    /// Each connected node with its agent and when it was last heard, read under one lock.
    pub fn sessions(&self) -> Vec<(String, AgentInfo, Option<Instant>)> {
        let inner = self.lock();
        inner.conns.iter().map(|(n, c)| (n.clone(), c.agent.clone(), inner.heard.last(n))).collect()
    }

    pub fn connected_nodes(&self) -> Vec<String> {
        self.lock().conns.keys().cloned().collect()
    }

    /// Sends what each connected node (or only `only`) lacks to match the state.
    ///
    /// Only nodes that hold jobs in the state, or whose agent reports jobs, can have anything to
    /// launch or kill: with every node, this ran after every applied entry over all 10,000
    /// connections of a large cluster (a string lookup each, under the hub's lock and the
    /// state's read lock), and pinned a core while agents registered.
    pub fn reconcile(&self, state: &ClusterState, only: Option<&str>) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        // A held job leaves the set once the state no longer runs that allocation on the node.
        inner.held.retain(|node, h| {
            h.jobs.retain(|key| runs_here(state, node, *key));
            !h.jobs.is_empty()
        });
        let (conns, held, refused) = (&mut inner.conns, &inner.held, &mut inner.refused);
        if let Some(name) = only {
            if let Some(conn) = conns.get_mut(name) {
                self.reconcile_node(state, name, conn, held.get(name), refused);
            }
            return;
        }
        for (name, _) in state.nodes.iter().filter(|(_, n)| !n.jobs.is_empty() || !n.completing.is_empty()) {
            if let Some(conn) = conns.get_mut(name) {
                self.reconcile_node(state, name, conn, held.get(name), refused);
            }
        }
        for (name, conn) in conns.iter_mut().filter(|(_, c)| !c.reported.is_empty()) {
            if state.nodes.get(name).is_none_or(|n| n.jobs.is_empty() && n.completing.is_empty()) {
                self.reconcile_node(state, name, conn, held.get(name), refused);
            }
        }
    }

    /// Container jobs whose node's agent makes no containers, each once, as (node, job, token):
    /// the leader ends them as failed launches, never runs them outside their container.
    pub fn refused(&self, state: &ClusterState) -> Vec<(String, JobId, u64)> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        inner.refused.retain(|(node, job, token)| runs_here(state, node, (*job, *token)));
        inner.refused_told.retain(|key| state.jobs.get(&key.0).is_some_and(|j| j.alloc_index == key.1));
        let told = &mut inner.refused_told;
        inner.refused.iter().filter(|(_, job, token)| told.insert((*job, *token))).cloned().collect()
    }

    /// The held jobs that the node's current session has not reported a lease after the session
    /// they were held from was replaced, as (node, job, token), each once: the leader ends them
    /// as lost contact rather than launching them a second time.
    pub fn overdue_held(&self, state: &ClusterState) -> Vec<(String, JobId, u64)> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut overdue = Vec::new();
        for (node, held) in
            inner.held.iter_mut().filter(|(_, h)| monotonic().saturating_duration_since(h.since) >= self.lease)
        {
            let reported = inner.conns.get(node).map(|c| c.reported.as_slice()).unwrap_or_default();
            for key in held.jobs.iter().copied() {
                if !reported.contains(&key) && runs_here(state, node, key) && held.ended.insert(key) {
                    overdue.push((node.clone(), key.0, key.1));
                }
            }
        }
        overdue
    }

    fn reconcile_node(
        &self,
        state: &ClusterState,
        name: &str,
        conn: &mut Conn,
        held: Option<&Held>,
        refused: &mut HashSet<(String, JobId, u64)>,
    ) {
        let dispatched = |job: &crate::model::Job| {
            let since = crate::replica::now_ms().saturating_sub(job.start_time.unwrap_or(u64::MAX));
            self.dispatch_seconds.observe(since as f64 / 1000.0);
        };
        let containers = conn.agent.runs_containers();
        let launch = |job_id: JobId| {
            let job = state.jobs.get(&job_id)?;
            // A container job is never sent to an agent that would run it on the node itself.
            if job.spec.container.is_some() && !job.spec.interactive && !containers {
                refused.insert((name.to_string(), job_id, job.alloc_index));
                return None;
            }
            self.traced_launch(state, job_id, name)
        };
        reconcile_node(state, name, conn, held, launch, dispatched);
    }
}

/// Whether the state has allocation `token` of `job_id` on `node` (anything else an agent runs
/// there is a stray).
pub fn runs_here(state: &ClusterState, node: &str, (job_id, token): (JobId, u64)) -> bool {
    state.jobs.get(&job_id).is_some_and(|j| {
        j.alloc_index == token
            && j.state.is_allocated()
            && state.nodes.get(node).is_some_and(|n| n.jobs.contains(&job_id))
    })
}

fn send(conn: &Conn, msg: Msg) -> bool {
    conn.tx.try_send(Ok(ControllerMessage { msg: Some(msg) })).is_ok()
}

fn reconcile_node(
    state: &ClusterState,
    name: &str,
    conn: &mut Conn,
    held: Option<&Held>,
    mut launch_for: impl FnMut(JobId) -> Option<Launch>,
    dispatched: impl Fn(&crate::model::Job),
) {
    if let Some(node) = state.nodes.get(name) {
        for job_id in &node.jobs {
            let Some(job) = state.jobs.get(job_id) else { continue };
            let key = (job.id, job.alloc_index);
            if job.cancel_requested || job.preempting.as_ref().is_some_and(|p| p.mode.stops()) {
                // Preempted: SIGKILL follows SIGTERM after its grace time. (Suspended by
                // preemption instead: frozen and thawed as below.)
                let grace = job.preempting.as_ref().filter(|_| !job.cancel_requested).map_or(0, |p| p.grace_s);
                let kill = Kill {
                    job_id: job.id,
                    token: job.alloc_index,
                    reason: ExitKind::Cancelled as i32,
                    grace_s: u32::try_from(grace).unwrap_or(u32::MAX),
                };
                if !conn.killed.contains(&key) && send(conn, Msg::Kill(kill)) {
                    conn.killed.insert(key);
                }
            } else if let Some(&sent) = conn.launched.get(&key) {
                // Suspended or resumed (scontrol suspend|resume, or by preemption): told once
                // a session, only for a job that was ever suspended.
                let suspended = job.state == crate::model::JobState::Suspended;
                if (suspended || job.suspended_ms > 0)
                    && conn.frozen.get(&key) != Some(&suspended)
                    && send(conn, Msg::Suspend(suspend_order(job, !suspended)))
                {
                    conn.frozen.insert(key, suspended);
                }
                // Its time limit moved: the launch again, which the agent running it reads for
                // the new limit (and ignores otherwise).
                let limit = job.limit_from_start_s().unwrap_or(0);
                if sent != limit {
                    if let Some(launch) = launch_for(job.id) {
                        if send(conn, Msg::Launch(launch)) {
                            conn.launched.insert(key, limit);
                        }
                    }
                }
            } else {
                // Another session of this node may still run it: not launched here unless this
                // session runs it too (then the launch is a no-op for it).
                if held.is_some_and(|h| h.jobs.contains(&key)) && !conn.reported.contains(&key) {
                    continue;
                }
                if let Some(launch) = launch_for(job.id) {
                    if send(conn, Msg::Launch(launch)) {
                        conn.launched.insert(key, job.limit_from_start_s().unwrap_or(0));
                        // Suspended before this session had it (preempted before its first
                        // launch reached the node, or across a reconnect): frozen right behind
                        // its launch on the stream, not a reconciliation later, so that it does
                        // not run on the CPUs it lent meanwhile.
                        if job.state == crate::model::JobState::Suspended
                            && send(conn, Msg::Suspend(suspend_order(job, false)))
                        {
                            conn.frozen.insert(key, true);
                        }
                        // A first launch: not one sent again to a new session of an agent
                        // that runs it already.
                        if !conn.reported.contains(&key) {
                            dispatched(job);
                        }
                    }
                }
            }
        }
    }
    // Anything the agent runs that the state does not place here (ended, cancelled, or from an
    // older allocation) is killed; so is what an ended allocation still holds here, whether
    // the agent said it runs it or not (it reports the end even of one never launched, and
    // that frees the share).
    let completing = state.nodes.get(name).into_iter().flat_map(|n| n.completing.iter().map(|c| (c.job_id, c.token)));
    let reported = conn.reported.iter().copied().filter(|key| !runs_here(state, name, *key));
    let stray: Vec<(JobId, u64)> = completing.chain(reported).collect();
    for key in stray {
        if !conn.killed.contains(&key)
            && send(
                conn,
                Msg::Kill(Kill { job_id: key.0, token: key.1, reason: ExitKind::Cancelled as i32, grace_s: 0 }),
            )
        {
            conn.killed.insert(key);
        }
    }
}

/// The order to freeze `job`'s allocation (scontrol suspend, or preemption), or to thaw it.
fn suspend_order(job: &crate::model::Job, resume: bool) -> quorum_proto::agent::Suspend {
    quorum_proto::agent::Suspend {
        job_id: job.id,
        token: job.alloc_index,
        resume,
        time_limit_s: job.limit_from_start_s().unwrap_or(0),
    }
}

/// What a batch step job runs on the nodes after its first: nothing of the user's, only a
/// process that holds the node's share of the allocation (its cgroup, its TMPDIR, its time
/// limit) for the job's steps until the job ends, as Slurm's extern step does with a sleep. Its
/// output goes nowhere; it ends when the job does (killed as a stray once the first node's
/// script ended, or with the job's cancel or time limit).
fn hold_allocation(spec: &mut quorum_proto::api::JobSpec) {
    spec.script.clear();
    spec.argv = vec!["/bin/sleep".into(), "100000000".into()];
    spec.stdout = "/dev/null".into();
    spec.stderr = "/dev/null".into();
    spec.signal.clear();
}

/// The launch message for `job_id`'s rank on `node`, before [`AgentHub::launch_for`] signs it.
fn unsigned_launch(state: &ClusterState, job_id: JobId, node: &str) -> Option<Launch> {
    let job = state.jobs.get(&job_id)?;
    let allocation = job.allocation.as_ref()?;
    let rank = allocation.nodes.iter().position(|a| a.node == node)?;
    let mine = &allocation.nodes[rank];
    let mut spec = wire::spec_to_proto(&job.spec, true);
    if job.spec.interactive || (job.spec.batch_step && rank > 0) {
        hold_allocation(&mut spec);
    }
    // A heterogeneous job's script is told of each of its components.
    let het = job.spec.het_environment(job_id, &job.partition, allocation);
    spec.env.extend(het.into_iter().map(|(name, value)| quorum_proto::api::EnvVar { name, value }));
    Some(Launch {
        job_id,
        token: job.alloc_index,
        spec: Some(spec),
        user: job.user.clone(),
        nodelist: allocation.nodelist(),
        node_rank: rank as u32,
        restart_count: job.requeues,
        num_nodes: allocation.nodes.len() as u32,
        cpus: mine.cpus,
        mem_mb: mine.mem_mb,
        gpus: mine.gpus.clone(),
        time_limit_s: job.limit_from_start_s().unwrap_or(0),
        array: job.array.as_ref().map(wire::array_to_proto),
        // Signed by the hub (see `AgentHub::launch_for`).
        grant: Vec::new(),
        signature: Vec::new(),
        traceparent: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorum_state::{apply, testing, Command, Response};

    /// n1 runs job 1 (started by the scheduler's plan), then an operator suspends it.
    fn suspended() -> (ClusterState, JobId) {
        let mut s = testing::cluster();
        let Response::Submitted { job_id, .. } = testing::submit(&mut s, 4, testing::spec(&["sleep", "100"]), "r1")
        else {
            panic!("submitted")
        };
        let plan = quorum_sched::schedule(&quorum_sched::ClusterView::from_state(&s), 2000, &s.policy);
        let plan = Command::apply_plan(4, 2000, plan.starts, Vec::new(), Vec::new(), Vec::new()).expect("a start");
        apply(&mut s, 5, plan);
        let suspend = Command::SuspendJob { job_id, user: "root".into(), resume: false, now: 3000 };
        let r = apply(&mut s, 6, suspend);
        assert_eq!(s.jobs[&job_id].state, crate::model::JobState::Suspended, "{r:?}");
        (s, job_id)
    }

    fn hub() -> AgentHub {
        AgentHub::new(
            Grants::new(None),
            Duration::from_secs(3),
            prometheus_client::metrics::histogram::Histogram::new([1.0]),
        )
    }

    fn drain(rx: &mut mpsc::Receiver<Result<ControllerMessage, Status>>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(Ok(m)) = rx.try_recv() {
            out.push(match m.msg {
                Some(Msg::Launch(l)) => format!("launch {}.{}", l.job_id, l.token),
                Some(Msg::Suspend(s)) => {
                    format!("{} {}.{}", if s.resume { "resume" } else { "suspend" }, s.job_id, s.token)
                }
                Some(Msg::Kill(k)) => format!("kill {}.{}", k.job_id, k.token),
                other => format!("{other:?}"),
            });
        }
        out
    }

    /// A job suspended before a session of its node had it is frozen right behind its launch on
    /// that session's stream (not a reconciliation later: it would run meanwhile on the CPUs it
    /// lent), once; resumed, it is thawed.
    #[test]
    fn a_suspended_jobs_launch_on_a_new_session_is_followed_by_its_suspend() {
        let (mut s, job) = suspended();
        let token = s.jobs[&job].alloc_index;
        let hub = hub();
        let (tx, mut rx) = mpsc::channel(16);
        let _session = hub.attach("n1", tx, AgentInfo::default());
        hub.reconcile(&s, Some("n1"));
        assert_eq!(drain(&mut rx), [format!("launch {job}.{token}"), format!("suspend {job}.{token}")]);
        hub.reconcile(&s, None);
        assert_eq!(drain(&mut rx), Vec::<String>::new(), "told once a session");
        apply(&mut s, 7, Command::SuspendJob { job_id: job, user: "root".into(), resume: true, now: 4000 });
        hub.reconcile(&s, None);
        // (Its time limit moved by the time it was suspended: the launch again says so.)
        let told = drain(&mut rx);
        assert_eq!(told.first(), Some(&format!("resume {job}.{token}")), "{told:?}");
        assert!(!told.iter().any(|m| m.starts_with("suspend")), "{told:?}");
    }
}
