//! Simulated agents: a node with 2 CPUs and two GPUs whose jobs are simulated processes. Each
//! holds a session with the replica it believes leads, as a real agent holds its stream
//! ([`crate::session`]): it registers when the session opens, heartbeats on it every half second
//! (the runs it has), and does what the leader's agent hub sends on it (launches, kills, suspends
//! and resumes, the answers to its heartbeats). It takes the lease each answered heartbeat gives,
//! and reports each run's end until a leader commits it. A `--requeue` job runs under the lease:
//! killed when the lease runs out. A session that breaks, ends, or whose leader stops answering
//! is given up for another. A frozen node does nothing at all until thawed (what reaches it
//! meanwhile waits, in order, as on a socket nobody reads).
//!
//! Every run is recorded as `jepsen/`'s jobs record theirs (start, last sign of life, end), for
//! the same checkers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorum_jepsen::checker::runs::Run;
use quorum_jepsen::rng::Rng;
use quorum_model::{Gpu, RankOutcome};
use quorum_proto::agent::{controller_message::Msg, ControllerMessage};
use quorum_state::NodeRegistration;
use tokio::time::Instant;

use crate::leader::{self, LEASE};
use crate::net::{Host, AGENT_BASE};
use crate::session::{self, Opened, Stream};
use crate::world::{Bug, World};

pub const CPUS: u32 = 2;
const GPUS: u32 = 2;
const TICK: Duration = Duration::from_millis(100);
const HEARTBEAT: Duration = Duration::from_millis(500);
const RPC_DEADLINE: Duration = Duration::from_secs(1);
/// A session whose leader answered none of this many heartbeats (and a second more) is given
/// up, as the real agent's is.
const MISSED_HEARTBEATS: u32 = 3;
/// The program the hub sends the nodes of a job whose script runs once, on its first node: held
/// for the job's steps, no job's process (nothing is recorded) until the job ends.
const HOLD: &str = "/bin/sleep";

/// How long a job of the workload runs: its program is `sleep SECONDS` (the hub's hold, a very
/// long sleep).
pub fn duration(argv: &[String]) -> Duration {
    let secs = argv.get(1).and_then(|s| s.parse::<f64>().ok()).unwrap_or(1.0);
    Duration::from_secs_f64(secs.clamp(0.0, 1e6))
}

/// A recurring job's entry and firing, as the firing's submit told it (`QUORUM_CRON_ID`,
/// `QUORUM_CRON_TIME`).
fn cron_of(env: &[quorum_proto::api::EnvVar]) -> Option<(u64, u64)> {
    let number = |name: &str| env.iter().find(|e| e.name == name)?.value.parse().ok();
    Some((number("QUORUM_CRON_ID")?, number("QUORUM_CRON_TIME")?))
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
    /// A script that starts steps one after another ([`crate::steps`]).
    script: Option<Script>,
}

/// A job's script that runs `srun -n1` for each of its steps in turn, as `jepsen/`'s does.
struct Script {
    /// How long each step's task runs.
    each: Duration,
    /// Steps not yet started.
    left: u32,
    /// How many `srun`s it started.
    started: u64,
    /// The `srun` it waits for: its number, and its task (aborted if the script is killed).
    srun: Option<(u64, Option<tokio::task::AbortHandle>)>,
}

/// A step's task here.
struct StepTask {
    record: Run,
    ends_at: Instant,
    suspended_at: Option<Instant>,
}

/// The lease a `--requeue` job launched before any heartbeat was answered starts with.
const FIRST_LEASE: Duration = Duration::from_secs(2);

struct State {
    /// The replica it asks to open its next session.
    leader: u64,
    /// Its session, while it has one.
    stream: Option<Arc<Stream>>,
    seq: u64,
    /// The send times of the heartbeats on this session not yet answered.
    unanswered: BTreeMap<u64, Instant>,
    /// When this session began, or its last heartbeat was answered.
    last_ack: Instant,
    /// The send time of the newest heartbeat a leader answered.
    lease_from: Option<Instant>,
    frozen: bool,
    /// What reached it while frozen, handled in order once thawed.
    inbox: Vec<(Arc<Stream>, ControllerMessage)>,
    runs: BTreeMap<(u64, u64), Running>,
    /// Allocations killed before their launch arrived: a late launch of one is not started.
    killed_unlaunched: BTreeSet<(u64, u64)>,
    unreported: BTreeMap<(u64, u64), RankOutcome>,
    /// Steps' tasks, by (job, step).
    steps: BTreeMap<(u64, u32), StepTask>,
    /// Their exits, for the leader (sent on the session, if there is one, each tick).
    step_exits: Vec<quorum_proto::agent::StepTaskExit>,
    rng: Rng,
}

impl State {
    /// Whether `stream` is this agent's session, still up.
    fn on(&self, stream: &Arc<Stream>) -> bool {
        self.stream.as_ref().is_some_and(|s| Arc::ptr_eq(s, stream)) && stream.up()
    }
}

pub struct Agent {
    pub host: Host,
    pub name: String,
    /// Whether `--requeue` jobs are fenced by the lease (not in the broken build
    /// [`Bug::LeaseFence`]).
    fence: bool,
    /// Whether a `--requeue` job's launch read after the lease ran out starts nothing (not in
    /// the broken builds [`Bug::LeaseFence`] and [`Bug::LateLaunch`]).
    refuse_late: bool,
    /// Whether a job's steps' tasks are killed with it (not in the broken build
    /// [`Bug::StepsOutliveJob`]).
    steps_with_job: bool,
    state: Mutex<State>,
}

impl Agent {
    pub fn new(index: u64, rng: Rng, bug: Option<Bug>) -> Agent {
        let fence = bug != Some(Bug::LeaseFence);
        let refuse_late = fence && bug != Some(Bug::LateLaunch);
        let state = State {
            leader: 1,
            stream: None,
            seq: 0,
            unanswered: BTreeMap::new(),
            last_ack: Instant::now(),
            lease_from: None,
            frozen: false,
            inbox: Vec::new(),
            runs: BTreeMap::new(),
            killed_unlaunched: BTreeSet::new(),
            unreported: BTreeMap::new(),
            steps: BTreeMap::new(),
            step_exits: Vec::new(),
            rng,
        };
        let steps_with_job = bug != Some(Bug::StepsOutliveJob);
        let name = format!("a{index}");
        Agent { host: AGENT_BASE + index, name, fence, refuse_late, steps_with_job, state: Mutex::new(state) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn freeze(&self, on: bool) {
        self.state().frozen = on;
    }

    pub fn registration(&self) -> NodeRegistration {
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

    /// Every run recorded here, steps' tasks included (a node held for steps runs nothing, and
    /// records nothing).
    pub fn runs(&self) -> Vec<Run> {
        let s = self.state();
        let scripts = s.runs.values().filter(|r| !r.held).map(|r| r.record.clone());
        scripts.chain(s.steps.values().map(|t| t.record.clone())).collect()
    }

    /// What `srun` number `n` of run `key`'s script returned.
    fn srun_returned(&self, key: (u64, u64), n: u64, rc: i32, world_time: f64) -> Option<String> {
        let mut s = self.state();
        let run = s.runs.get_mut(&key).filter(|r| !r.record.ended)?;
        let script = run.script.as_mut().filter(|sc| sc.srun.as_ref().is_some_and(|(m, _)| *m == n))?;
        script.srun = None;
        script.left = script.left.saturating_sub(1);
        run.record.sruns.push((world_time, rc));
        Some(format!("{} srun of {}.{} returned {rc}", self.name, key.0, key.1))
    }

    /// A message of the leader's on `stream`; what it did, when the trace should say. Nothing of
    /// a session given up is read.
    pub fn receive(&self, stream: &Arc<Stream>, m: ControllerMessage, world_time: f64) -> Option<String> {
        let mut s = self.state();
        if !s.on(stream) {
            return None;
        }
        if s.frozen {
            s.inbox.push((stream.clone(), m));
            return None;
        }
        self.handle(&mut s, m, world_time)
    }

    fn handle(&self, s: &mut State, m: ControllerMessage, world_time: f64) -> Option<String> {
        match m.msg? {
            Msg::HeartbeatAck(ack) => {
                s.last_ack = Instant::now();
                let lease = Duration::from_millis(ack.lease_ms);
                let answered: Vec<u64> = s.unanswered.range(..=ack.seq).map(|(seq, _)| *seq).collect();
                for seq in answered {
                    let Some(sent) = s.unanswered.remove(&seq) else { continue };
                    if seq != ack.seq {
                        continue;
                    }
                    if s.lease_from.is_none_or(|t| t < sent) {
                        s.lease_from = Some(sent);
                    }
                    for run in s.runs.values_mut() {
                        if let Some(d) = run.deadline.as_mut() {
                            *d = (*d).max(sent + lease);
                        }
                    }
                }
                None
            }
            Msg::Suspend(order) => self.suspend((order.job_id, order.token), !order.resume, s, world_time),
            Msg::Kill(k) => {
                let key = (k.job_id, k.token);
                let now = Instant::now();
                match s.runs.get_mut(&key) {
                    Some(run) if !run.record.ended => {
                        run.record.ended = true;
                        run.ends_at = now;
                        stop_script(run);
                        s.unreported.insert(key, RankOutcome::Cancelled { code: 0, signal: 15 });
                        if self.steps_with_job {
                            kill_steps(s, key.0, libc::SIGTERM);
                        }
                        Some(format!("{} kills {}.{}", self.name, key.0, key.1))
                    }
                    Some(_) => None,
                    // Never launched here: nothing to kill, and it has ended as far as this node goes.
                    None => {
                        s.killed_unlaunched.insert(key);
                        s.unreported.insert(key, RankOutcome::Cancelled { code: 0, signal: 15 });
                        None
                    }
                }
            }
            Msg::Launch(l) => {
                let key = (l.job_id, l.token);
                if s.runs.contains_key(&key) || s.killed_unlaunched.contains(&key) {
                    return None;
                }
                let spec = l.spec.unwrap_or_default();
                let held = spec.argv.first().is_some_and(|p| p == HOLD);
                let script =
                    crate::steps::parse(&spec.argv).map(|(each, left)| Script { each, left, started: 0, srun: None });
                let now = Instant::now();
                let deadline = spec.requeue.then(|| s.lease_from.map_or(now + FIRST_LEASE, |from| from + LEASE));
                // A `--requeue` job's launch read after the lease ran out (it waited while the
                // node was frozen) starts nothing, as the real agent's: the leader may have
                // started it elsewhere.
                if deadline.is_some_and(|d| d <= now) && self.refuse_late {
                    s.killed_unlaunched.insert(key);
                    s.unreported.insert(key, RankOutcome::LostContact);
                    return Some(format!("{} refuses {}.{}: lease ran out", self.name, key.0, key.1));
                }
                s.runs.insert(
                    key,
                    Running {
                        finished: false,
                        record: Run {
                            job: l.job_id,
                            file: format!("{}.{}", l.job_id, l.token),
                            node: self.name.clone(),
                            gpus: l.gpus,
                            restarts: l.restart_count,
                            start: world_time,
                            last: world_time,
                            ended: false,
                            active: vec![(world_time, world_time)],
                            cron: cron_of(&spec.env),
                            step: None,
                            sruns: Vec::new(),
                        },
                        deadline,
                        ends_at: now + duration(&spec.argv),
                        suspended_at: None,
                        held,
                        script,
                    },
                );
                None
            }
            Msg::StepLaunch(l) => self.launch_step(s, l, world_time),
            Msg::StepIo(io) => {
                let Some(quorum_proto::agent::step_io::Msg::Signal(signal)) = io.msg else { return None };
                let task = s.steps.get_mut(&(io.job_id, io.step_id)).filter(|t| !t.record.ended)?;
                task.record.ended = true;
                s.step_exits.push(task_exit(io.job_id, io.step_id, 0, signal, ""));
                Some(format!("{} kills step {}.{}", self.name, io.job_id, io.step_id))
            }
            _ => None,
        }
    }

    /// Freezes (suspended by preemption) or thaws one run.
    fn suspend(&self, key: (u64, u64), freeze: bool, s: &mut State, world_time: f64) -> Option<String> {
        let now = Instant::now();
        // The job's steps' tasks here freeze and thaw with it (one cgroup).
        for task in s.steps.iter_mut().filter(|(k, t)| k.0 == key.0 && !t.record.ended).map(|(_, t)| t) {
            match (freeze, task.suspended_at) {
                (true, None) => task.suspended_at = Some(now),
                (false, Some(since)) => {
                    task.ends_at += now - since;
                    task.suspended_at = None;
                    task.record.active.push((world_time, world_time));
                }
                _ => {}
            }
        }
        let run = s.runs.get_mut(&key).filter(|r| !r.record.ended)?;
        match (freeze, run.suspended_at) {
            (true, None) => {
                run.suspended_at = Some(now);
                // Frozen the instant it was launched (the launch and the suspend of a job
                // preempted before its launch arrived come together): it has not run yet.
                if run.record.active == [(world_time, world_time)] {
                    run.record.active.clear();
                }
                Some(format!("{} suspends {}.{}", self.name, key.0, key.1))
            }
            (false, Some(since)) => {
                run.ends_at += now - since;
                run.suspended_at = None;
                // Running again from now: a stretch of its own, however short the pause.
                run.record.active.push((world_time, world_time));
                Some(format!("{} resumes {}.{}", self.name, key.0, key.1))
            }
            _ => None,
        }
    }
}

impl Agent {
    /// A step's task launched here: only within the job's allocation running here, once.
    fn launch_step(&self, s: &mut State, l: quorum_proto::agent::StepLaunch, world_time: f64) -> Option<String> {
        let key = (l.job_id, l.step_id);
        if s.steps.contains_key(&key) {
            return None;
        }
        let now = Instant::now();
        let fence = self.fence;
        // Only inside the job's allocation running here, within its lease.
        let live = |r: &&mut Running| !(r.record.ended || (fence && r.deadline.is_some_and(|d| d <= now)));
        let Some(script) = s.runs.get_mut(&(l.job_id, l.token)).filter(live) else {
            s.step_exits.push(task_exit(l.job_id, l.step_id, 1, 0, "the job does not run here under that allocation"));
            return Some(format!("{} refuses step {}.{}: no such run here", self.name, l.job_id, l.step_id));
        };
        // Its script waits in `srun`, ticking: alive as its step starts (on a node that thaws,
        // the script's tick due while frozen comes at once).
        if script.suspended_at.is_none() {
            script.record.seen_at(world_time);
        }
        let record = Run {
            job: l.job_id,
            file: format!("{}.s{}.{}", l.job_id, l.step_id, l.token),
            node: self.name.clone(),
            gpus: script.record.gpus.clone(),
            restarts: script.record.restarts,
            start: world_time,
            last: world_time,
            ended: false,
            active: vec![(world_time, world_time)],
            cron: None,
            step: Some(l.step_id),
            sruns: Vec::new(),
        };
        let suspended_at = script.suspended_at.map(|_| now);
        s.steps.insert(key, StepTask { record, ends_at: now + duration(&l.argv), suspended_at });
        Some(format!("{} starts step {}.{}", self.name, l.job_id, l.step_id))
    }
}

fn task_exit(job_id: u64, step_id: u32, exit_code: i32, signal: i32, error: &str) -> quorum_proto::agent::StepTaskExit {
    quorum_proto::agent::StepTaskExit { job_id, step_id, task: 0, exit_code, signal, error: error.into(), usage: None }
}

/// A script killed: the `srun` it waits for goes with it.
fn stop_script(run: &mut Running) {
    if let Some((_, Some(task))) = run.script.as_mut().and_then(|sc| sc.srun.take()) {
        task.abort();
    }
}

/// Kills the tasks here of `job`'s steps (with the job: one cgroup).
fn kill_steps(s: &mut State, job: u64, signal: i32) {
    let mut exits = Vec::new();
    for ((_, step), task) in s.steps.iter_mut().filter(|(k, t)| k.0 == job && !t.record.ended) {
        task.record.ended = true;
        exits.push(task_exit(job, *step, 0, signal, ""));
    }
    s.step_exits.extend(exits);
}

/// An agent's loops: its processes, its session and heartbeats, and its exit reports.
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
            // Thawed: what reached it meanwhile, in order.
            for (stream, m) in std::mem::take(&mut s.inbox) {
                if s.on(&stream) {
                    lines.extend(agent.handle(&mut s, m, t));
                }
            }
            let fence = agent.fence;
            let mut ended = Vec::new();
            let mut sruns = Vec::new();
            for (key, run) in s.runs.iter_mut().filter(|(_, r)| !r.record.ended) {
                let script_done = run.script.as_ref().map(|sc| sc.left == 0 && sc.srun.is_none());
                if run.deadline.is_some_and(|d| now > d) && fence {
                    // Killed as it was: its last sign of life stays the last tick.
                    run.record.ended = true;
                    stop_script(run);
                    // Reported as the real agent's lease kill is (LEASE_EXPIRED: lost contact).
                    ended.push((*key, RankOutcome::LostContact));
                    lines.push(format!("{} kills {}.{}: lease ran out", agent.name, key.0, key.1));
                } else if run.suspended_at.is_some() {
                    // Frozen: no sign of life.
                } else if script_done == Some(false) {
                    // A script between its steps starts the next `srun`; one waiting for its
                    // `srun` ticks.
                    run.record.seen_at(t);
                    if let Some(sc) = run.script.as_mut().filter(|sc| sc.srun.is_none()) {
                        sc.started += 1;
                        sc.srun = Some((sc.started, None));
                        sruns.push((*key, sc.started, sc.each));
                    }
                } else if script_done == Some(true) || (run.script.is_none() && run.ends_at <= now) {
                    run.record.ended = true;
                    run.record.seen_at(t);
                    run.finished = true;
                    ended.push((*key, RankOutcome::Exited { code: 0, signal: 0 }));
                    lines.push(format!("{} run {}.{} ended", agent.name, key.0, key.1));
                } else {
                    run.record.seen_at(t);
                }
            }
            for (key, _) in ended.iter().filter(|_| agent.steps_with_job) {
                kill_steps(&mut s, key.0, libc::SIGKILL);
            }
            s.unreported.extend(ended);
            let st = &mut *s;
            for ((job, step), task) in st.steps.iter_mut().filter(|(_, t)| !t.record.ended) {
                if task.suspended_at.is_some() {
                    // Frozen with its job.
                } else if task.ends_at <= now {
                    task.record.ended = true;
                    task.record.seen_at(t);
                    st.step_exits.push(task_exit(*job, *step, 0, 0, ""));
                    lines.push(format!("{} step {job}.{step} ended", agent.name));
                } else {
                    task.record.seen_at(t);
                }
            }
            // The steps' exits go to the leader on the session; without one they wait.
            if let Some(stream) = s.stream.clone().filter(|st| s.on(st)) {
                for exit in std::mem::take(&mut s.step_exits) {
                    stream.step_exit(exit);
                }
            }
            // Each `srun` runs as a program of its own, until its step ends (or the script is
            // killed, and it with it).
            let first = s.stream.as_ref().map_or(s.leader, |stream| stream.replica);
            for (key, n, each) in sruns {
                let (w, a) = (world.clone(), agent.clone());
                let task = tokio::spawn(async move {
                    let rc = crate::steps::srun(&w, a.host, first, key.0, key.1, each).await;
                    // A program on a frozen node returns once the node thaws.
                    while a.state().frozen {
                        tokio::time::sleep(TICK).await;
                    }
                    if let Some(line) = a.srun_returned(key, n, rc, w.now_s()) {
                        w.trace(line);
                    }
                });
                if let Some(sc) = s.runs.get_mut(&key).and_then(|r| r.script.as_mut()) {
                    sc.srun = Some((n, Some(task.abort_handle())));
                }
            }
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

/// What the session loop does next.
enum Next {
    Open(u64),
    Beat(Arc<Stream>, u64, Vec<(u64, u64)>),
}

async fn heartbeats(world: Arc<World>, agent: Arc<Agent>) {
    let mut wait = HEARTBEAT;
    loop {
        tokio::time::sleep(wait).await;
        wait = HEARTBEAT;
        let next = {
            let mut s = agent.state();
            if s.frozen {
                continue;
            }
            let silent = s.last_ack.elapsed() > HEARTBEAT * MISSED_HEARTBEATS + Duration::from_secs(1);
            match s.stream.clone() {
                Some(stream) if stream.up() && !silent && session::replica_of(&world, &stream).is_some() => {
                    s.seq += 1;
                    let seq = s.seq;
                    s.unanswered.insert(seq, Instant::now());
                    let running = s.runs.iter().filter(|(_, r)| !r.record.ended).map(|(k, _)| *k).collect();
                    Next::Beat(stream, seq, running)
                }
                Some(stream) => {
                    // Given up: redirected to the leader it named, or another replica.
                    stream.break_off();
                    s.stream = None;
                    match stream.hint() {
                        Some(l) => {
                            s.leader = l;
                            wait = Duration::from_millis(10);
                        }
                        None => next_replica(&world, &mut s),
                    }
                    world.trace(format!("{} leaves session {} with r{}", agent.name, stream.conn, stream.replica));
                    continue;
                }
                None => Next::Open(s.leader),
            }
        };
        match next {
            Next::Beat(stream, seq, running) => stream.beat(seq, running),
            Next::Open(to) => {
                let (from, registration) = (agent.host, agent.registration());
                let w = world.clone();
                // The stream the replica opened, whether or not its answer comes back in time:
                // one that does not is given up.
                let opened_slot: Arc<Mutex<Option<Arc<Stream>>>> = Arc::default();
                let slot = opened_slot.clone();
                let trip = async move {
                    if !w.net.hop(from, to).await {
                        return futures::future::pending().await;
                    }
                    let Some(r) = w.replica(to) else { return futures::future::pending().await };
                    let opened = session::open(&w, &r, from, registration).await;
                    if let Opened::Stream(stream) = &opened {
                        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(stream.clone());
                    }
                    if !w.net.hop(to, from).await {
                        return futures::future::pending().await;
                    }
                    opened
                };
                let opened = tokio::time::timeout(RPC_DEADLINE, trip).await;
                let mut s = agent.state();
                match opened {
                    Ok(Opened::Stream(stream)) => {
                        stream.adopt();
                        s.stream = Some(stream);
                        s.unanswered.clear();
                        s.last_ack = Instant::now();
                        wait = Duration::from_millis(10);
                    }
                    // Told where the leader is: a session there begins at once.
                    Ok(Opened::NotLeader(Some(l))) => {
                        s.leader = l;
                        wait = Duration::from_millis(10);
                    }
                    Ok(Opened::NotLeader(None)) | Err(_) => {
                        if let Some(orphan) = opened_slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
                            orphan.break_off();
                        }
                        next_replica(&world, &mut s);
                    }
                }
            }
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
            (s.stream.as_ref().map_or(s.leader, |stream| stream.replica), (*key, *outcome))
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
