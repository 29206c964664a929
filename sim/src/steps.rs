//! Steps: a job's script starting `srun -n1` one step after another, as `jepsen/`'s job of steps
//! does. The `srun` finds the leader (following the hint of a replica that does not lead); the
//! leader does what the controller's step service does: one step of a job starts at a time, the
//! step is placed with `quorum_state::plan_step` on the applied state, launched on its node by the
//! agent hub (`step_launch`) and recorded as it commits (`StartStep` with `expect`); the step's
//! route (the controller's own `StepRoutes`) carries its task's exit from the agent's stream to
//! the `srun`'s pump, which commits `EndStep` and answers the `srun`. A route that goes with its
//! leader (a crash, or leadership lost) leaves the step running in the state: the next leader ends
//! it as an orphan (`orphan_steps`, `end_orphan`), and its agent kills its task.
//!
//! What is simulated: the `srun` program (one request, its answer carried as a stream carries
//! it), and the script's tasks (an agent's `sleep`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use quorum_control::leader::steps::{end_orphan, orphan_steps, step_launch, FromAgent};
use quorum_model::step::{Placement, StepRequest, StepState};
use quorum_model::JobState;
use quorum_proto::agent::{step_io, StepIo};
use quorum_state::{Command, Response};
use tokio::sync::oneshot;

use crate::disk::read;
use crate::leader::{leader_hint, leads, write};
use crate::net::Host;
use crate::world::{Replica, World};

/// The program a job of steps runs: `quorum-sim-steps SECONDS STEPS` (each step's task runs
/// `sleep SECONDS`).
pub const SCRIPT: &str = "quorum-sim-steps";
/// How long `srun` waits for a replica's answer to its request before it asks another.
const CONNECT: Duration = Duration::from_secs(1);
/// How long a replica may take over an `srun`'s request before the `srun` gives it up (a
/// replica whose writes hang, say): far longer than any answer takes.
const ASK_PATIENCE: Duration = Duration::from_secs(30);
/// How many replicas `srun` asks before it gives up (exit status 1).
const ATTEMPTS: u32 = 8;
/// How often a step's pump looks at whether its step, its job and its leadership still are.
const POLL: Duration = Duration::from_millis(200);
/// How long the answer of a step waits for a cut way back to its `srun` to heal before the
/// stream is given up.
const ANSWER_PATIENCE: Duration = Duration::from_secs(5);
const RETRANSMIT: Duration = Duration::from_millis(200);
/// How long `srun` waits before it asks again for a step the job's other steps hold back.
const BUSY_RETRY: Duration = Duration::from_millis(200);

/// The argv of a job of steps: `steps` steps of `secs` each.
pub fn script(secs: f64, steps: u32) -> Vec<String> {
    vec![SCRIPT.into(), format!("{secs:.1}"), steps.to_string()]
}

/// What a script's argv says: how long each step runs, and how many there are.
pub fn parse(argv: &[String]) -> Option<(Duration, u32)> {
    if argv.first().map(String::as_str) != Some(SCRIPT) {
        return None;
    }
    let secs = argv.get(1)?.parse::<f64>().ok()?;
    let steps = argv.get(2)?.parse().ok()?;
    Some((Duration::from_secs_f64(secs.clamp(0.0, 1e6)), steps))
}

/// What a replica answers an `srun`'s request.
enum Answer {
    NotLeader(Option<u64>),
    /// Started: the step's exit status comes on this channel (closed if its leader went).
    Started(oneshot::Receiver<i32>),
    Refused(String),
    /// The job's other steps hold what the step needs: `srun` asks again (as `quorum srun`
    /// does on `RESOURCE_EXHAUSTED`, Slurm's "step creation temporarily disabled, retrying").
    Busy,
}

/// One `srun -n1 sleep SECONDS` of job `job` (allocation `token`) from the agent at `from`, which
/// asks replica `first` first: its exit status (0 when its task ran to its end and exited 0).
pub async fn srun(world: &Arc<World>, from: Host, first: u64, job: u64, token: u64, each: Duration) -> i32 {
    let mut to = first;
    let mut attempts = 0;
    while attempts < ATTEMPTS {
        attempts += 1;
        // A request lost on the way, or sent to a replica that is gone, is noticed by the srun's
        // deadline. A replica that has it answers in its own time (a call in flight is not
        // cancelled: the srun waits, as on a connection that stays up), and the answer comes
        // back as a stream carries it; one that never does drops a started step (its pump then
        // kills the task).
        let asked = match world.net.hop(from, to).await {
            true => match world.replica(to) {
                Some(r) => Some(tokio::time::timeout(ASK_PATIENCE, ask(world, &r, job, token, each)).await),
                None => None,
            },
            false => None,
        };
        let answer = match asked {
            Some(Ok(answer)) if carry_back(world, to, from).await => Some(answer),
            _ => None,
        };
        let next = match answer {
            Some(Answer::Started(done)) => {
                // The step's stream: its end is carried back as a stream carries it.
                let rc = done.await.unwrap_or(1);
                return match carry_back(world, to, from).await {
                    true => rc,
                    false => 1,
                };
            }
            Some(Answer::Busy) => {
                attempts = 0;
                tokio::time::sleep(BUSY_RETRY).await;
                continue;
            }
            Some(Answer::Refused(why)) => {
                world.trace(format!("srun of {job}.{token} refused: {why}"));
                return 1;
            }
            Some(Answer::NotLeader(Some(l))) => Some(l),
            Some(Answer::NotLeader(None)) => None,
            None => {
                tokio::time::sleep(CONNECT).await;
                None
            }
        };
        to = match next {
            Some(l) => l,
            None => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                world.between(1, world.opts.replicas as u64)
            }
        };
    }
    world.trace(format!("srun of {job}.{token} found no leader"));
    1
}

/// Carries the end of a step's stream from replica `to` back to `from`: sent again while lost or
/// cut off, for [`ANSWER_PATIENCE`] at most.
async fn carry_back(world: &World, to: Host, from: Host) -> bool {
    let began = tokio::time::Instant::now();
    while began.elapsed() < ANSWER_PATIENCE {
        if world.net.hop(to, from).await {
            return true;
        }
        tokio::time::sleep(RETRANSMIT).await;
    }
    false
}

/// A replica's answer to an `srun`: refused unless it leads; otherwise the step started (see the
/// module's comment).
async fn ask(world: &Arc<World>, r: &Arc<Replica>, job_id: u64, token: u64, each: Duration) -> Answer {
    if !leads(r) {
        return Answer::NotLeader(leader_hint(r).filter(|l| *l != r.id));
    }
    let request = StepRequest { name: "sleep".into(), nodes: 1, ntasks: 1, ..Default::default() };
    let start = quorum_proto::api::StepRequest {
        job_id,
        argv: vec!["sleep".into(), format!("{:.1}", each.as_secs_f64())],
        nodes: 1,
        ntasks: 1,
        ..Default::default()
    };
    // One step of a job starts at a time, so that its placement is the one its entry finds.
    let _starting = r.steps.starting(job_id).await;
    let planned = {
        let a = read(&r.applied);
        match a.state.jobs.get(&job_id) {
            Some(job) if job.state == JobState::Running && job.alloc_index == token => {
                match quorum_state::plan_step(job, &job.user, &request) {
                    Ok(step) => Ok(((**job).clone(), step)),
                    Err(quorum_model::Rejection::StepBusy { .. }) => return Answer::Busy,
                    Err(e) => Err(e.to_string()),
                }
            }
            Some(job) => Err(format!("job {job_id} is {} (allocation {})", job.state.name(), job.alloc_index)),
            None => Err(format!("no job {job_id}")),
        }
    };
    let (job, step) = match planned {
        Ok(planned) => planned,
        Err(why) => return Answer::Refused(why),
    };
    // Launched now, recorded as it commits.
    let from_agents = r.steps.open(job_id, step.id);
    let mut route = Route { r: r.clone(), job_id, step_id: step.id, open: true };
    for i in 0..step.nodes.len() {
        r.hub.launch_step(&step.nodes[i].node, step_launch(&job, &step, i, &start));
    }
    crate::session::pump(world, r);
    let nodes: Vec<String> = step.nodes.iter().map(|n| n.node.clone()).collect();
    let expect = Placement { id: step.id, nodes: step.nodes.clone() };
    let user = job.user.clone();
    let now = world.wall_ms(r.id);
    let command = Command::StartStep { job_id, user, request, now, expect: Some(expect) };
    match write(r, command).await {
        Ok((_, Response::StepStarted { .. })) => {}
        answer => {
            // Not recorded where it was launched: its task goes (and its route, with `route`).
            kill(world, r, job_id, step.id, &nodes);
            if let Ok((_, Response::Rejected(quorum_model::Rejection::StepBusy { .. }))) = answer {
                return Answer::Busy;
            }
            return Answer::Refused(match answer {
                Ok((_, other)) => format!("{other:?}").chars().take(60).collect(),
                Err(e) => e.to_string(),
            });
        }
    }
    world.trace(format!("r{} starts step {job_id}.{} on {}", r.id, step.id, nodes.join(",")));
    let (tx, rx) = oneshot::channel();
    // The pump closes the route from now on.
    route.open = false;
    let pump = Pump { world: world.clone(), r: r.clone(), job_id, step_id: step.id, nodes, tasks: step.ntasks };
    tokio::spawn(pump.run(from_agents, tx));
    Answer::Started(rx)
}

/// A step's route until its pump takes it over: closed if the request is given up first.
struct Route {
    r: Arc<Replica>,
    job_id: u64,
    step_id: u32,
    open: bool,
}

impl Drop for Route {
    fn drop(&mut self) {
        if self.open {
            self.r.steps.close(self.job_id, self.step_id);
        }
    }
}

fn kill(world: &Arc<World>, r: &Arc<Replica>, job_id: u64, step_id: u32, nodes: &[String]) {
    for node in nodes {
        let io = StepIo { job_id, step_id, msg: Some(step_io::Msg::Signal(libc::SIGKILL)) };
        r.hub.step_io(node, io);
    }
    crate::session::pump(world, r);
}

/// One step's pump on its leader, as the controller's: its tasks' exits in, `EndStep` out.
struct Pump {
    world: Arc<World>,
    r: Arc<Replica>,
    job_id: u64,
    step_id: u32,
    nodes: Vec<String>,
    tasks: u32,
}

impl Pump {
    /// Whether this incarnation still runs (a crashed replica's tasks do nothing more).
    fn alive(&self) -> bool {
        self.world.replica(self.r.id).is_some_and(|live| Arc::ptr_eq(&live, &self.r))
    }

    /// Why the step can no longer be served here, if it cannot.
    fn gone(&self) -> Option<String> {
        if !leads(&self.r) {
            return Some("its leader stopped leading".into());
        }
        let a = read(&self.r.applied);
        match a.state.jobs.get(&self.job_id) {
            Some(j) if j.state == JobState::Running => match j.steps.iter().find(|s| s.id == self.step_id) {
                Some(s) if s.state != StepState::Running => Some(format!("it was ended ({})", s.state.name())),
                _ => None,
            },
            _ => Some("its job ended".into()),
        }
    }

    async fn run(self, mut from_agents: tokio::sync::mpsc::Receiver<FromAgent>, mut answer: oneshot::Sender<i32>) {
        let mut exits: BTreeMap<u32, (i32, i32)> = BTreeMap::new();
        let cancelled = loop {
            tokio::select! {
                report = from_agents.recv() => match report {
                    Some(FromAgent::Exit(x)) => {
                        exits.insert(x.task, (x.exit_code, x.signal));
                        if exits.len() as u32 >= self.tasks {
                            break false;
                        }
                    }
                    Some(_) => {}
                    None => break true,
                },
                _ = answer.closed() => {
                    // The srun went (its script was killed): its tasks go too.
                    kill(&self.world, &self.r, self.job_id, self.step_id, &self.nodes);
                    break true;
                }
                _ = tokio::time::sleep(POLL) => {
                    if !self.alive() {
                        return;
                    }
                    if let Some(why) = self.gone() {
                        self.world.trace(format!("step {}.{} ends: {why}", self.job_id, self.step_id));
                        self.r.steps.close(self.job_id, self.step_id);
                        return;
                    }
                }
            }
        };
        let exit_code = exits.values().map(|(code, _)| *code).max().unwrap_or(0);
        let signal = exits.values().map(|(_, s)| *s).find(|s| *s != 0);
        let now = self.world.wall_ms(self.r.id);
        let command = Command::EndStep {
            job_id: self.job_id,
            step_id: self.step_id,
            exit_code,
            signal,
            cancelled,
            now,
            usage: None,
        };
        let ended = write(&self.r, command).await;
        self.r.steps.close(self.job_id, self.step_id);
        if !self.alive() {
            return;
        }
        let rc = match (&ended, cancelled, signal) {
            (Err(_), _, _) | (_, true, _) => 1,
            (Ok(_), false, Some(s)) => 128 + s,
            (Ok(_), false, None) => exit_code,
        };
        self.world.trace(format!("r{} ends step {}.{}: {rc}", self.r.id, self.job_id, self.step_id));
        let _ = answer.send(rc);
    }
}

/// The leader's part of node liveness for steps: each running step no `srun` is served for
/// here (it went with a previous leader) ended after the grace, and its task killed.
pub async fn end_orphans(world: &Arc<World>, r: &Arc<Replica>) -> Result<(), crate::leader::WriteError> {
    let orphans = orphan_steps(&read(&r.applied).state, &r.steps);
    for (job_id, step_id, nodes) in orphans {
        let (io, command) = end_orphan(job_id, step_id, world.wall_ms(r.id));
        for node in &nodes {
            r.hub.step_io(node, io.clone());
        }
        crate::session::pump(world, r);
        let (_, response) = write(r, command).await?;
        let response: String = format!("{response:?}").chars().take(40).collect();
        world.trace(format!("r{} ends orphan step {job_id}.{step_id}: {response}", r.id));
    }
    Ok(())
}
