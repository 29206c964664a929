//! `RunStep`: a job step for `srun`. The leader records the step through Raft (where its tasks
//! go, [`quorum_model::step::layout`]), sends each node its launch, and then carries the step's
//! I/O: `srun`'s input and signals to the agents, the tasks' output and exits back to `srun`.
//! When every task has ended the step's end is recorded with the highest exit code.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use quorum_auth::Caller;
use quorum_model::step::{Placement, Step, StepRequest as Request};
use quorum_proto::agent::{step_io, StepIo};
use quorum_proto::api::{step_event, step_input, StepEnd, StepEvent, StepInput, StepStarted, TaskExit, TaskOutput};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::api::{acting_as, not_leader, write_status, Api};
use crate::leader::steps::{step_launch, FromAgent};
use crate::model::{JobId, JobState, Rejection};
use crate::replica::now_ms;
use quorum_state::{plan_step, Command, Response, EARLY_STEP_LEVEL};

pub type StepStream = Pin<Box<dyn Stream<Item = Result<StepEvent, Status>> + Send>>;

/// At most this many nodes named in a step's `--nodelist`.
const MAX_NODELIST: usize = 65_536;

fn event(msg: step_event::Msg) -> Result<StepEvent, Status> {
    Ok(StepEvent { msg: Some(msg) })
}

/// How a refused step is answered: RESOURCE_EXHAUSTED while other steps hold what it needs
/// (`srun` waits and asks again), FAILED_PRECONDITION when it can never run in the job.
fn refused(r: &Rejection) -> Status {
    match r {
        Rejection::StepBusy { .. } => Status::resource_exhausted(r.to_string()),
        Rejection::StepNeverFits { .. } | Rejection::NotRunning { .. } | Rejection::JobFinished { .. } => {
            Status::failed_precondition(r.to_string())
        }
        other => super::api::rejection_status(other),
    }
}

pub(super) async fn run_step(api: &Api, caller: Caller, mut input: Streaming<StepInput>) -> Result<StepStream, Status> {
    if !api.replica.is_leader() {
        return Err(not_leader(api.replica.leader_addr().as_deref()));
    }
    let mut start = match input.message().await? {
        Some(StepInput { msg: Some(step_input::Msg::Start(s)) }) => s,
        _ => return Err(Status::invalid_argument("the first message of a step must be its start")),
    };
    // The tasks never get a credential of the shell that started the step.
    start.env.retain(|e| !crate::model::env::is_credential(&e.name));
    let argv = start.argv.clone();
    let Some(program) = argv.first().filter(|p| !p.is_empty()) else {
        return Err(Status::invalid_argument("invalid step: no command given"));
    };
    let bytes: usize = argv.iter().map(String::len).sum::<usize>()
        + start.env.iter().map(|e| e.name.len() + e.value.len()).sum::<usize>()
        + start.work_dir.len();
    if bytes > api.limits.max_submit_bytes || start.env.len() > api.limits.max_env_vars {
        return Err(Status::invalid_argument(format!(
            "invalid step: {bytes} bytes of command and environment ({} variables); at most {} bytes and {} variables",
            start.env.len(),
            api.limits.max_submit_bytes,
            api.limits.max_env_vars
        )));
    }
    if start.het_groups.len() > crate::model::het::MAX_COMPONENTS {
        return Err(Status::invalid_argument(format!(
            "invalid step: {} components named in --het-group; a job has at most {}",
            start.het_groups.len(),
            crate::model::het::MAX_COMPONENTS
        )));
    }
    // `--mpi`, or the cluster's MpiDefault; carried to the agents by name ("" for none).
    let mpi = if start.mpi.is_empty() {
        api.leader.mpi_default
    } else {
        crate::model::mpi::Mpi::parse(&start.mpi).map_err(|e| Status::invalid_argument(format!("invalid step: {e}")))?
    };
    start.mpi = mpi.wire().to_string();
    // PMIx: the step's secret, which names its namespace on every node (what srun sent under
    // that name is not kept).
    start.env.retain(|e| e.name != crate::model::mpi::PMIX_SECRET_ENV);
    if mpi == crate::model::mpi::Mpi::Pmix {
        let mut secret = [0u8; 16];
        // SAFETY: fills the buffer given, of the length given.
        let filled = unsafe { libc::getrandom(secret.as_mut_ptr().cast(), secret.len(), 0) };
        if filled != secret.len() as isize {
            return Err(Status::unavailable("no randomness for the step's PMIx secret"));
        }
        let value = secret.iter().map(|b| format!("{b:02x}")).collect();
        start.env.push(quorum_proto::api::EnvVar { name: crate::model::mpi::PMIX_SECRET_ENV.into(), value });
    }
    // `--cpu-bind`, checked and carried in its canonical form ("" when tasks are not bound and
    // nothing is reported, so that the launch is what it was before binding).
    let binding = match crate::model::cpu_bind::CpuBind::parse(&start.cpu_bind) {
        Ok(Some(b)) if b.binds() || b.verbose => Some(b),
        Ok(_) => None,
        Err(e) => return Err(Status::invalid_argument(format!("invalid step: {e}"))),
    };
    start.cpu_bind = binding.as_ref().map(ToString::to_string).unwrap_or_default();
    if let Some(c) = &start.container {
        crate::wire::container_from_proto(c.clone())
            .check()
            .map_err(|reason| Status::invalid_argument(format!("invalid step: {reason}")))?;
    }
    if start.nodelist.len() > MAX_NODELIST || !start.work_dir.starts_with('/') {
        return Err(Status::invalid_argument(format!(
            "invalid step: {}",
            if start.work_dir.starts_with('/') {
                format!("{} nodes named; at most {MAX_NODELIST}", start.nodelist.len())
            } else {
                format!("working directory '{}' is not an absolute path", start.work_dir)
            }
        )));
    }
    let request = Request {
        name: program.rsplit('/').next().unwrap_or(program).chars().take(256).collect(),
        nodes: start.nodes,
        ntasks: start.ntasks,
        ntasks_per_node: start.ntasks_per_node,
        cpus_per_task: start.cpus_per_task,
        gpus_per_task: start.gpus_per_task,
        nodelist: start.nodelist.clone(),
        overlap: start.overlap,
        het_groups: start.het_groups.clone(),
        overcommit: start.overcommit,
        cyclic: start.cyclic,
    };
    for (asked, needs, what) in [
        (start.overcommit, quorum_state::OVERCOMMIT_LEVEL, "--overcommit"),
        (start.cyclic, quorum_state::CYCLIC_LEVEL, "--distribution=cyclic"),
    ] {
        let level = api.replica.shared.read().state.cluster_level();
        if asked && level < needs {
            return Err(Status::failed_precondition(format!(
                "{what} needs every replica at feature level {needs} (the cluster is at {level}: finish the upgrade first)"
            )));
        }
    }
    let job_id = start.job_id;
    let user = acting_as(&caller);
    let routes = &api.leader.steps;
    // One step of a job starts at a time here, so that the placement computed from the applied
    // state is the one its entry finds.
    let _starting = routes.starting(job_id).await;
    let mut early = None;
    // Launched now, recorded as it commits (from level 10): its tasks start while the entry is
    // replicated.
    let planned = {
        let shared = api.replica.shared.read();
        (shared.state.cluster_level() >= EARLY_STEP_LEVEL).then(|| match shared.state.jobs.get(&job_id) {
            None => Err(Rejection::UnknownJob { id: job_id }),
            Some(job) => plan_step(job, &user, &request).map(|step| ((**job).clone(), step)),
        })
    };
    if let Some(planned) = planned {
        let (job, step) = planned.map_err(|r| refused(&r))?;
        // A node of the step whose agent cannot do what the step needs.
        let lacking = |capability: &str| {
            step.nodes.iter().find(|n| api.leader.hub.agent(&n.node).is_some_and(|a| !a.can(capability)))
        };
        // A step in a container never goes to an agent that would run it on the node itself.
        if start.container.is_some() || job.spec.container.is_some() {
            if let Some(n) = lacking("containers") {
                return Err(Status::failed_precondition(format!(
                    "node {} cannot run containers (its agent is older than this release, or runs with --no-containers)",
                    n.node
                )));
            }
        }
        if mpi != crate::model::mpi::Mpi::None {
            if let Some(n) = lacking(mpi.wire()) {
                return Err(Status::failed_precondition(format!(
                    "node {} cannot serve --mpi={mpi} (its agent is older than this release{})",
                    n.node,
                    if mpi == crate::model::mpi::Mpi::Pmix {
                        ", or finds no PMIx library: install libpmix2 there"
                    } else {
                        ""
                    }
                )));
            }
        }
        if binding.is_some() {
            if let Some(n) = lacking(crate::model::cpu_bind::CAPABILITY) {
                return Err(Status::failed_precondition(format!(
                    "node {} cannot bind tasks to CPUs (--cpu-bind; its agent is older than this release)",
                    n.node
                )));
            }
        }
        let from_agents = routes.open(job_id, step.id);
        let unreachable = launch(api, &job, &step, &start);
        let expect = Placement { id: step.id, nodes: step.nodes.clone() };
        let command = Command::StartStep {
            job_id,
            user: user.clone(),
            request: request.clone(),
            now: now_ms(),
            expect: Some(expect),
        };
        match api.replica.write(command).await {
            Ok((_, Response::StepStarted { step, .. })) => early = Some((*step, from_agents, unreachable)),
            answer => {
                // Not recorded where it was launched: its tasks go, and it starts the slow way.
                for n in &step.nodes {
                    let kill = StepIo { job_id, step_id: step.id, msg: Some(step_io::Msg::Signal(libc::SIGKILL)) };
                    api.leader.hub.step_io(&n.node, kill);
                }
                routes.close(job_id, step.id);
                if let Err(e) = answer {
                    return Err(write_status(e));
                }
            }
        }
    }
    let (step, from_agents, unreachable) = match early {
        Some(started) => started,
        None => {
            let command = Command::StartStep { job_id, user, request, now: now_ms(), expect: None };
            let step = match api.replica.write(command).await.map_err(write_status)?.1 {
                Response::StepStarted { step, .. } => *step,
                Response::Rejected(r) => return Err(refused(&r)),
                other => return Err(Status::internal(format!("unexpected answer to a step: {other:?}"))),
            };
            let from_agents = routes.open(job_id, step.id);
            let job = api.replica.shared.read().state.jobs.get(&job_id).map(|j| (**j).clone());
            let Some(job) = job else {
                routes.close(job_id, step.id);
                return Err(Status::failed_precondition(format!("job {job_id} ended as its step started")));
            };
            let unreachable = launch(api, &job, &step, &start);
            (step, from_agents, unreachable)
        }
    };
    tracing::info!(job = job_id, step = step.id, nodes = %step.node_names().join(","), tasks = step.ntasks, "step started");
    let (tx, rx) = mpsc::channel(256);
    let started = StepStarted {
        job_id,
        step_id: step.id,
        nodelist: crate::model::hostlist::compress(&step.node_names()),
        ntasks: step.ntasks,
        nodes: step.nodes.iter().map(|n| n.node.clone()).collect(),
        first_task: step.nodes.iter().map(|n| n.first_task).collect(),
        node_tasks: step.nodes.iter().map(|n| n.tasks).collect(),
        cyclic: step.cyclic,
    };
    let _ = tx.send(event(step_event::Msg::Started(started))).await;
    let handles = Handles { replica: api.replica.clone(), leader: api.leader.clone() };
    let pump = Pump { api: handles, step, job_id, tx, exits: BTreeMap::new(), usage: None };
    tokio::spawn(pump.run(input, from_agents, unreachable));
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// Sends each node of `step` its launch; the indexes of the nodes no agent is connected for.
fn launch(api: &Api, job: &crate::model::Job, step: &Step, start: &quorum_proto::api::StepRequest) -> Vec<usize> {
    let mut unreachable = Vec::new();
    for (i, n) in step.nodes.iter().enumerate() {
        if !api.leader.hub.launch_step(&n.node, step_launch(job, step, i, start)) {
            unreachable.push(i);
        }
    }
    unreachable
}

/// What a step's pump needs of the API, owned.
struct Handles {
    replica: std::sync::Arc<crate::replica::Replica>,
    leader: std::sync::Arc<crate::leader::LeaderState>,
}

/// Carries one step's I/O until it ends.
struct Pump {
    api: Handles,
    step: Step,
    job_id: JobId,
    tx: mpsc::Sender<Result<StepEvent, Status>>,
    /// Each ended task's (exit code, signal).
    exits: BTreeMap<u32, (i32, i32)>,
    /// What the ended tasks used, as their agents measured it.
    usage: Option<crate::model::JobUsage>,
}

impl Pump {
    fn to_nodes(&self, nodes: impl Iterator<Item = usize>, msg: step_io::Msg) {
        for i in nodes {
            let io = StepIo { job_id: self.job_id, step_id: self.step.id, msg: Some(msg.clone()) };
            self.api.leader.hub.step_io(&self.step.nodes[i].node, io);
        }
    }

    /// Passes a node's PMI fence contribution on to every node of the step, the sender's own
    /// included (each completes the fence once it holds every node's). Only from the agent of
    /// the node it names: no agent speaks for another node of the step.
    fn pmi(&self, node: &str, x: quorum_proto::agent::PmiExchange) {
        if self.step.nodes.get(x.node_id as usize).is_none_or(|n| n.node != node) {
            tracing::warn!(
                job = self.job_id,
                step = self.step.id,
                node,
                claimed = x.node_id,
                "a PMI fence contribution for another node was dropped"
            );
            return;
        }
        self.to_nodes(0..self.step.nodes.len(), step_io::Msg::Pmi(x));
    }

    fn signal_all(&self, signal: i32) {
        self.to_nodes(0..self.step.nodes.len(), step_io::Msg::Signal(signal));
    }

    /// Whether the job still runs this step, served here: a replica that stopped leading no
    /// longer hears from the step's agents (the new leader ends the step).
    fn step_running(&self) -> Result<(), String> {
        if !self.api.replica.is_leader() {
            return Err("the controller serving the step stopped leading; the new leader ends it".into());
        }
        let applied = self.api.replica.shared.read();
        match applied.state.jobs.get(&self.job_id) {
            Some(j) if j.state == JobState::Running => match j.steps.iter().find(|s| s.id == self.step.id) {
                Some(s) if s.state != quorum_model::step::StepState::Running => {
                    Err(format!("step {}.{} was ended ({})", self.job_id, self.step.id, s.state.name()))
                }
                _ => Ok(()),
            },
            Some(j) => Err(format!("job {} ended ({})", self.job_id, j.state.name())),
            None => Err(format!("job {} is gone", self.job_id)),
        }
    }

    async fn task_exit(&mut self, exit: TaskExit) -> bool {
        self.exits.insert(exit.task, (exit.exit_code, exit.signal));
        self.tx.send(event(step_event::Msg::Exit(exit))).await.is_ok()
    }

    async fn run(
        mut self,
        mut input: Streaming<StepInput>,
        mut from_agents: mpsc::Receiver<FromAgent>,
        unreachable: Vec<usize>,
    ) {
        let ranks = self.step.ranks();
        for i in unreachable {
            let n = self.step.nodes[i].clone();
            for &task in &ranks[i] {
                let error = format!("node {} has no agent connected", n.node);
                self.task_exit(TaskExit { task, exit_code: 1, signal: 0, error }).await;
            }
        }
        let mut check = tokio::time::interval(Duration::from_secs(1));
        let reason = loop {
            if self.exits.len() as u32 >= self.step.ntasks {
                break None;
            }
            tokio::select! {
                msg = input.message() => match msg {
                    Ok(Some(StepInput { msg: Some(m) })) => match m {
                        step_input::Msg::Stdin(data) => self.to_nodes(std::iter::once(0), step_io::Msg::Stdin(data)),
                        step_input::Msg::StdinEof(_) => self.to_nodes(std::iter::once(0), step_io::Msg::StdinEof(true)),
                        step_input::Msg::Signal(s) if (1..=64).contains(&s) => self.signal_all(s),
                        step_input::Msg::Window(w) => self.to_nodes(std::iter::once(0), step_io::Msg::Window(w)),
                        _ => {}
                    },
                    Ok(Some(_)) => {}
                    // srun went away: its tasks go too, as with Slurm.
                    Ok(None) | Err(_) => {
                        self.signal_all(libc::SIGKILL);
                        break Some("srun went away".to_string());
                    }
                },
                report = from_agents.recv() => match report {
                    Some(FromAgent::Output(o)) => {
                        let out = TaskOutput { task: o.task, stderr: o.stderr, data: o.data };
                        if self.tx.send(event(step_event::Msg::Output(out))).await.is_err() {
                            self.signal_all(libc::SIGKILL);
                            break Some("srun went away".to_string());
                        }
                    }
                    Some(FromAgent::Pmi(node, x)) => self.pmi(&node, x),
                    Some(FromAgent::Exit(e)) => {
                        self.usage = crate::model::JobUsage::total(self.usage, crate::wire::usage(e.usage.as_ref()));
                        let exit = TaskExit { task: e.task, exit_code: e.exit_code, signal: e.signal, error: e.error };
                        if !self.task_exit(exit).await {
                            self.signal_all(libc::SIGKILL);
                            break Some("srun went away".to_string());
                        }
                    }
                    None => break Some("the leader stopped serving the step".to_string()),
                },
                _ = check.tick() => {
                    if let Err(why) = self.step_running() {
                        break Some(why);
                    }
                }
            }
        };
        // Slurm's step exit code: the highest of its tasks' (128 + signal for a killed one).
        let code = self.exits.values().map(|&(c, s)| if s != 0 { 128 + s } else { c }).max().unwrap_or(0);
        let signal = self.exits.values().map(|&(_, s)| s).find(|&s| s != 0);
        let cancelled = reason.is_some();
        let command = Command::EndStep {
            job_id: self.job_id,
            step_id: self.step.id,
            exit_code: self.exits.values().map(|&(c, _)| c).max().unwrap_or(0),
            signal,
            cancelled,
            now: now_ms(),
            // A replica of an older release could not apply it with what the step used.
            usage: self
                .usage
                .filter(|_| self.api.replica.shared.read().state.cluster_level() >= quorum_state::STEP_USAGE_LEVEL),
        };
        if let Err(e) = self.api.replica.write(command).await {
            tracing::warn!(job = self.job_id, step = self.step.id, error = %e, "recording a step's end");
        }
        self.api.leader.steps.close(self.job_id, self.step.id);
        tracing::info!(
            job = self.job_id,
            step = self.step.id,
            code,
            reason = reason.as_deref().unwrap_or(""),
            "step ended"
        );
        let end = StepEnd { exit_code: code, reason: reason.unwrap_or_default() };
        let _ = self.tx.send(event(step_event::Msg::End(end))).await;
    }
}
