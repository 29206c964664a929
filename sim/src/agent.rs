//! Simulated agents: a node with 2 CPUs and two GPUs whose jobs are simulated processes. Each
//! heartbeats the replica it believes leads every half second (its registration and the runs it
//! has), takes the lease the answer gives, kills the runs of allocations the leader no longer
//! has, and reports each run's end until a leader commits it. A `--requeue` job runs under the
//! lease: killed when the lease runs out. A frozen node does nothing at all until thawed.
//!
//! Every run is recorded as `jepsen/`'s jobs record theirs (start, last sign of life, end), for
//! the same checkers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorum_jepsen::checker::runs::Run;
use quorum_jepsen::rng::Rng;
use quorum_model::{Gpu, RankOutcome};
use quorum_state::NodeRegistration;
use tokio::time::Instant;

use crate::leader::{self, HeartbeatAnswer, LEASE};
use crate::net::{Host, AGENT_BASE};
use crate::world::{Bug, World};

pub const CPUS: u32 = 2;
const GPUS: u32 = 2;
const TICK: Duration = Duration::from_millis(100);
const HEARTBEAT: Duration = Duration::from_millis(500);
const RPC_DEADLINE: Duration = Duration::from_secs(1);

pub fn host_of(node: &str) -> Option<Host> {
    node.strip_prefix('a')?.parse::<u64>().ok().map(|i| AGENT_BASE + i)
}

/// A launch (or, `kill`, an end) of one job's allocation on one node.
#[derive(Clone, Debug)]
pub struct Launch {
    pub job: u64,
    pub token: u64,
    pub node: String,
    pub gpus: Vec<u32>,
    pub restarts: u32,
    pub leased: bool,
    pub run_for: Duration,
    pub kill: bool,
    /// Not a launch: `Some(true)` freezes the run (suspended by preemption), `Some(false)` thaws it.
    pub suspend: Option<bool>,
    /// A node of a job whose script runs once, on its first node: held for the job's steps, no
    /// process runs here (nothing is recorded) until the job ends and the leader stops it.
    pub held: bool,
    /// A recurring job's entry and firing (its `QUORUM_CRON_ID` and `QUORUM_CRON_TIME`), which
    /// its run records.
    pub cron: Option<(u64, u64)>,
}

pub struct Heartbeat {
    pub node: NodeRegistration,
    /// The runs it has or had: (job, allocation).
    pub has: BTreeSet<(u64, u64)>,
    /// Those of them still running.
    pub running: BTreeSet<(u64, u64)>,
}

struct Running {
    record: Run,
    /// It ran to its end by itself (not killed).
    finished: bool,
    /// A `--requeue` job's lease: killed once past it (renewed by each answered heartbeat).
    deadline: Option<Instant>,
    ends_at: Instant,
    /// Frozen since: it neither runs nor nears its end until thawed.
    suspended_at: Option<Instant>,
    /// Held for steps: no process, no record.
    held: bool,
}

/// The lease a `--requeue` job launched before any heartbeat was answered starts with.
const FIRST_LEASE: Duration = Duration::from_secs(2);

struct State {
    leader: u64,
    /// The send time of the newest heartbeat a leader answered.
    lease_from: Option<Instant>,
    frozen: bool,
    runs: BTreeMap<(u64, u64), Running>,
    /// Allocations killed before their launch arrived: a late launch of one is not started.
    killed_unlaunched: BTreeSet<(u64, u64)>,
    unreported: BTreeMap<(u64, u64), RankOutcome>,
    rng: Rng,
}

pub struct Agent {
    pub host: Host,
    pub name: String,
    state: Mutex<State>,
}

impl Agent {
    pub fn new(index: u64, rng: Rng) -> Agent {
        let state = State {
            leader: 1,
            lease_from: None,
            frozen: false,
            runs: BTreeMap::new(),
            killed_unlaunched: BTreeSet::new(),
            unreported: BTreeMap::new(),
            rng,
        };
        Agent { host: AGENT_BASE + index, name: format!("a{index}"), state: Mutex::new(state) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn freeze(&self, on: bool) {
        self.state().frozen = on;
    }

    fn registration(&self) -> NodeRegistration {
        NodeRegistration {
            name: self.name.clone(),
            cpus: CPUS,
            mem_mb: 4096,
            gpus: (0..GPUS).map(|index| Gpu { index, gpu_type: "h100".into() }).collect(),
            features: vec![],
            version: "sim".into(),
        }
    }

    /// The runs here that ran to their end by themselves: (job, restarts).
    pub fn finished(&self) -> Vec<(u64, u32)> {
        self.state().runs.values().filter(|r| r.finished).map(|r| (r.record.job, r.record.restarts)).collect()
    }

    /// Every run recorded here (a node held for steps runs nothing, and records nothing).
    pub fn runs(&self) -> Vec<Run> {
        self.state().runs.values().filter(|r| !r.held).map(|r| r.record.clone()).collect()
    }

    /// A launch, kill, suspend or resume from a leader; what it did, when the trace should say.
    pub fn receive(&self, m: Launch, world_time: f64) -> Option<String> {
        let mut s = self.state();
        if s.frozen {
            return None;
        }
        let key = (m.job, m.token);
        if let Some(freeze) = m.suspend {
            let now = Instant::now();
            let run = s.runs.get_mut(&key).filter(|r| !r.record.ended)?;
            return match (freeze, run.suspended_at) {
                (true, None) => {
                    run.suspended_at = Some(now);
                    // Frozen the instant it was launched (the launch and the suspend of a job
                    // preempted before its launch arrived come together): it has not run yet.
                    if run.record.active == [(world_time, world_time)] {
                        run.record.active.clear();
                    }
                    Some(format!("{} suspends {}.{}", self.name, m.job, m.token))
                }
                (false, Some(since)) => {
                    run.ends_at += now - since;
                    run.suspended_at = None;
                    // Running again from now: a stretch of its own, however short the pause.
                    run.record.active.push((world_time, world_time));
                    Some(format!("{} resumes {}.{}", self.name, m.job, m.token))
                }
                _ => None,
            };
        }
        if m.kill {
            let now = Instant::now();
            match s.runs.get_mut(&key) {
                Some(run) if !run.record.ended => {
                    run.record.ended = true;
                    run.ends_at = now;
                    s.unreported.insert(key, RankOutcome::Cancelled { code: 0, signal: 15 });
                }
                Some(_) => {}
                // Never launched here: nothing to kill, and it has ended as far as this node goes.
                None => {
                    s.killed_unlaunched.insert(key);
                    s.unreported.insert(key, RankOutcome::Cancelled { code: 0, signal: 15 });
                }
            }
            return None;
        }
        if s.runs.contains_key(&key) || s.killed_unlaunched.contains(&key) {
            return None;
        }
        let now = Instant::now();
        let deadline = m.leased.then(|| s.lease_from.map_or(now + FIRST_LEASE, |from| from + LEASE));
        s.runs.insert(
            key,
            Running {
                finished: false,
                record: Run {
                    job: m.job,
                    file: format!("{}.{}", m.job, m.token),
                    node: m.node,
                    gpus: m.gpus,
                    restarts: m.restarts,
                    start: world_time,
                    last: world_time,
                    ended: false,
                    active: vec![(world_time, world_time)],
                    cron: m.cron,
                    step: None,
                    sruns: Vec::new(),
                },
                deadline,
                ends_at: now + m.run_for,
                suspended_at: None,
                held: m.held,
            },
        );
        None
    }
}

/// An agent's loops: its processes, its heartbeats and its exit reports.
pub fn start(world: &Arc<World>, agent: Arc<Agent>) {
    tokio::spawn(processes(world.clone(), agent.clone()));
    tokio::spawn(heartbeats(world.clone(), agent.clone()));
    tokio::spawn(reports(world.clone(), agent));
}

async fn processes(world: Arc<World>, agent: Arc<Agent>) {
    loop {
        tokio::time::sleep(TICK).await;
        let now = Instant::now();
        let t = world.now_s();
        let mut lines = Vec::new();
        {
            let mut s = agent.state();
            if s.frozen {
                continue;
            }
            let fence = !world.bug(Bug::LeaseFence);
            let mut ended = Vec::new();
            for (key, run) in s.runs.iter_mut().filter(|(_, r)| !r.record.ended) {
                if run.deadline.is_some_and(|d| now > d) && fence {
                    // Killed as it was: its last sign of life stays the last tick.
                    run.record.ended = true;
                    ended.push((*key, RankOutcome::Exited { code: 0, signal: 9 }));
                    lines.push(format!("{} kills {}.{}: lease ran out", agent.name, key.0, key.1));
                } else if run.suspended_at.is_some() {
                    // Frozen: no sign of life.
                } else if run.ends_at <= now {
                    run.record.ended = true;
                    run.record.seen_at(t);
                    run.finished = true;
                    ended.push((*key, RankOutcome::Exited { code: 0, signal: 0 }));
                    lines.push(format!("{} run {}.{} ended", agent.name, key.0, key.1));
                } else {
                    run.record.seen_at(t);
                }
            }
            s.unreported.extend(ended);
        }
        for line in lines {
            world.trace(line);
        }
    }
}

/// The replica to ask next when the one asked does not lead and names none.
fn next_replica(world: &World, s: &mut State) {
    let n = world.opts.replicas as u64;
    s.leader = s.rng.between(1, n);
}

async fn heartbeats(world: Arc<World>, agent: Arc<Agent>) {
    let mut wait = HEARTBEAT;
    loop {
        tokio::time::sleep(wait).await;
        wait = HEARTBEAT;
        let (to, hb) = {
            let s = agent.state();
            if s.frozen {
                continue;
            }
            let has = s.runs.keys().chain(&s.killed_unlaunched).copied().collect();
            let running = s.runs.iter().filter(|(_, r)| !r.record.ended).map(|(k, _)| *k).collect();
            (s.leader, Heartbeat { node: agent.registration(), has, running })
        };
        let sent = Instant::now();
        let from = agent.host;
        let w = world.clone();
        let trip = async move {
            if !w.net.hop(from, to).await {
                return futures::future::pending().await;
            }
            let Some(r) = w.replica(to) else { return futures::future::pending().await };
            let answer = leader::heartbeat(&w, &r, &hb).await;
            if !w.net.hop(to, from).await {
                return futures::future::pending().await;
            }
            answer
        };
        let answer = tokio::time::timeout(RPC_DEADLINE, trip).await;
        let mut lines = Vec::new();
        {
            let mut s = agent.state();
            if s.frozen {
                continue;
            }
            match answer {
                Ok(HeartbeatAnswer::Ok { index, runs, lease }) => {
                    if lease {
                        if s.lease_from.is_none_or(|t| t < sent) {
                            s.lease_from = Some(sent);
                        }
                        for run in s.runs.values_mut() {
                            if let Some(d) = run.deadline.as_mut() {
                                *d = (*d).max(sent + LEASE);
                            }
                        }
                    }
                    // Runs of allocations the leader no longer has are strays: killed.
                    let mut strays = Vec::new();
                    for (key, run) in s.runs.iter_mut().filter(|(_, r)| !r.record.ended) {
                        if key.1 <= index && !runs.contains(key) {
                            run.record.ended = true;
                            strays.push(*key);
                            lines.push(format!("{} kills stray {}.{}", agent.name, key.0, key.1));
                        }
                    }
                    for key in strays {
                        s.unreported.insert(key, RankOutcome::Cancelled { code: 0, signal: 9 });
                    }
                }
                // Told where the leader is: a session there begins at once (the real agent
                // registers and heartbeats as soon as its stream is up).
                Ok(HeartbeatAnswer::NotLeader(Some(l))) => {
                    s.leader = l;
                    wait = Duration::from_millis(10);
                }
                Ok(HeartbeatAnswer::Unanswered) => {}
                Ok(HeartbeatAnswer::NotLeader(None)) | Err(_) => next_replica(&world, &mut s),
            }
        }
        for line in lines {
            world.trace(line);
        }
    }
}

async fn reports(world: Arc<World>, agent: Arc<Agent>) {
    loop {
        tokio::time::sleep(TICK * 2).await;
        let (to, report) = {
            let s = agent.state();
            if s.frozen {
                continue;
            }
            let Some((key, outcome)) = s.unreported.iter().next() else { continue };
            (s.leader, (*key, *outcome))
        };
        let ((job, token), outcome) = report;
        let (from, node) = (agent.host, agent.name.clone());
        let w = world.clone();
        let trip = async move {
            if !w.net.hop(from, to).await {
                return futures::future::pending().await;
            }
            let Some(r) = w.replica(to) else { return futures::future::pending().await };
            let done = leader::exit(&w, &r, job, token, &node, outcome).await;
            if !w.net.hop(to, from).await {
                return futures::future::pending().await;
            }
            done
        };
        if let Ok(true) = tokio::time::timeout(RPC_DEADLINE * 3, trip).await {
            agent.state().unreported.remove(&(job, token));
        }
    }
}
