//! The steps this leader serves: each running step's `srun` stream, which its agents' output and
//! task exits are routed to (agents send them on their own streams, [`StepRoutes::deliver`]),
//! and the launch each node of a step gets.
//!
//! A step's I/O goes through the leader that started it. When leadership moves, the new
//! leader has no route for steps still marked running: the liveness loop ends them
//! ([`StepRoutes::orphans`]) and their agents kill their tasks.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use quorum_model::step::{Step, StepState};
use quorum_proto::agent::{PmiExchange, StepLaunch, StepOutput, StepTaskExit};
use quorum_proto::api::EnvVar;
use tokio::sync::mpsc;

use crate::model::{Job, JobId};

/// What an agent reports of a step's tasks.
#[derive(Debug)]
pub enum FromAgent {
    Output(StepOutput),
    Exit(StepTaskExit),
    /// A node's PMI fence contribution, from the agent of the node named.
    Pmi(String, PmiExchange),
}

/// How much of a step's output may wait for a slow `srun` before its agents' streams are held up.
const ROUTE_CAPACITY: usize = 1024;
/// How long a step marked running may go without a route on this leader before it is ended.
const ORPHAN_GRACE: Duration = Duration::from_secs(5);

/// How many locks the starts of steps are spread over, by job.
const START_STRIPES: usize = 32;

#[derive(Default)]
pub struct StepRoutes {
    routes: Mutex<HashMap<(JobId, u32), mpsc::Sender<FromAgent>>>,
    /// Running steps seen without a route, and since when.
    unrouted: Mutex<HashMap<(JobId, u32), Instant>>,
    /// Held while a step starts, by job (jobs share a lock when their ids are equal modulo
    /// [`START_STRIPES`]).
    starting: [tokio::sync::Mutex<()>; START_STRIPES],
}

impl StepRoutes {
    /// Waits until no other step of `job` is starting here; the next one waits for the guard.
    pub async fn starting(&self, job: JobId) -> tokio::sync::MutexGuard<'_, ()> {
        self.starting[(job % START_STRIPES as u64) as usize].lock().await
    }

    /// Opens the route of a step this leader just started.
    pub fn open(&self, job: JobId, step: u32) -> mpsc::Receiver<FromAgent> {
        let (tx, rx) = mpsc::channel(ROUTE_CAPACITY);
        self.routes.lock().unwrap_or_else(|p| p.into_inner()).insert((job, step), tx);
        rx
    }

    pub fn close(&self, job: JobId, step: u32) {
        self.routes.lock().unwrap_or_else(|p| p.into_inner()).remove(&(job, step));
    }

    /// Hands an agent's report to its step's `srun`. A step nobody serves here drops it. An
    /// `srun` that reads too slowly holds its agents' streams up for at most a second per
    /// message; then the output is dropped (and logged) rather than stall their heartbeats.
    pub async fn deliver(&self, job: JobId, step: u32, report: FromAgent) {
        let Some(tx) = self.routes.lock().unwrap_or_else(|p| p.into_inner()).get(&(job, step)).cloned() else {
            return;
        };
        match tx.try_send(report) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(report)) => {
                if tx.send_timeout(report, Duration::from_secs(1)).await.is_err() {
                    tracing::warn!(job, step, "srun reads too slowly: a piece of its step's output was dropped");
                }
            }
        }
    }

    /// The running steps of `jobs` that no `srun` is served for here, after a grace on the
    /// leader's monotonic clock ([`crate::clock`]): they are ended as cancelled (their `srun` went
    /// with a previous leader).
    pub fn orphans<'a>(&self, jobs: impl Iterator<Item = &'a Job>) -> Vec<(JobId, u32)> {
        let now = crate::clock::monotonic();
        let routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        let mut unrouted = self.unrouted.lock().unwrap_or_else(|p| p.into_inner());
        let mut seen = HashSet::new();
        let mut due = Vec::new();
        for job in jobs {
            for s in job.steps.iter().filter(|s| s.state == StepState::Running) {
                let key = (job.id, s.id);
                if routes.contains_key(&key) {
                    continue;
                }
                seen.insert(key);
                let since = *unrouted.entry(key).or_insert(now);
                if now.saturating_duration_since(since) >= ORPHAN_GRACE {
                    due.push(key);
                }
            }
        }
        unrouted.retain(|k, _| seen.contains(k));
        due
    }
}

/// The running steps of `state` no `srun` is served for by `routes` past the grace (see
/// [`StepRoutes::orphans`]), each with the nodes its tasks run on.
pub fn orphan_steps(state: &quorum_state::ClusterState, routes: &StepRoutes) -> Vec<(JobId, u32, Vec<String>)> {
    let running = state.active.iter().filter_map(|id| state.jobs.get(id)).filter(|j| !j.steps.is_empty());
    routes
        .orphans(running.map(|j| &**j))
        .into_iter()
        .map(|(job, step)| {
            let nodes = state
                .jobs
                .get(&job)
                .and_then(|j| j.steps.iter().find(|s| s.id == step))
                .map(|s| s.nodes.iter().map(|n| n.node.clone()).collect());
            (job, step, nodes.unwrap_or_default())
        })
        .collect()
}

/// How an orphan step ends: SIGKILL sent to its tasks on each of its nodes, and the entry that
/// ends it as cancelled.
pub fn end_orphan(job_id: JobId, step_id: u32, now_ms: u64) -> (quorum_proto::agent::StepIo, quorum_state::Command) {
    let kill = quorum_proto::agent::StepIo {
        job_id,
        step_id,
        msg: Some(quorum_proto::agent::step_io::Msg::Signal(libc::SIGKILL)),
    };
    let command = quorum_state::Command::EndStep {
        job_id,
        step_id,
        exit_code: 0,
        signal: Some(libc::SIGKILL),
        cancelled: true,
        now: now_ms,
        usage: None,
    };
    (kill, command)
}

/// The launch of `step`'s tasks on its `node_id`-th node, unsigned: the environment is `srun`'s, with the
/// job's and the step's `SLURM_*` variables set over it (the agent adds each task's own).
pub fn step_launch(job: &Job, step: &Step, node_id: usize, start: &quorum_proto::api::StepRequest) -> StepLaunch {
    let (argv, env, work_dir) = (&start.argv, &start.env, start.work_dir.as_str());
    let node = &step.nodes[node_id];
    let nodelist = crate::model::hostlist::compress(&step.node_names());
    let allocation = job.allocation.as_ref();
    // A heterogeneous job's step sees the nodes of the components it runs on as its job's.
    let groups: &[u32] = if start.het_groups.is_empty() { &[0] } else { &start.het_groups };
    let het = !job.spec.het.is_empty();
    let mine = |n: &&crate::model::NodeAllocation| !het || groups.contains(&n.het_group);
    let job_names: Vec<&str> =
        allocation.map(|a| a.nodes.iter().filter(mine).map(|n| n.node.as_str()).collect()).unwrap_or_default();
    let job_nodes = crate::model::hostlist::compress(&job_names);
    let num_job_nodes = job_names.len();
    let ours = |k: &str| k.starts_with("SLURM_STEP_") || k == "SLURM_TASKS_PER_NODE";
    let mut vars: Vec<EnvVar> = env.iter().filter(|e| !ours(&e.name)).cloned().collect();
    if let Some(a) = allocation.filter(|_| het) {
        let het_vars = job.spec.het_environment(job.id, &job.partition, a);
        vars.retain(|e| !het_vars.iter().any(|(k, _)| *k == e.name));
        vars.extend(het_vars.into_iter().map(|(name, value)| EnvVar { name, value }));
    }
    let set = [
        ("SLURM_JOB_ID", job.id.to_string()),
        ("SLURM_JOBID", job.id.to_string()),
        ("SLURM_JOB_NODELIST", job_nodes.clone()),
        ("SLURM_NODELIST", job_nodes),
        ("SLURM_JOB_NUM_NODES", num_job_nodes.to_string()),
        ("SLURM_JOB_USER", job.user.clone()),
        // A step on one component of a heterogeneous job: that component's partition.
        (
            "SLURM_JOB_PARTITION",
            match groups {
                [g] if het => job.spec.partition_of(*g as usize).unwrap_or(&job.partition).to_string(),
                _ => job.partition.clone(),
            },
        ),
        ("SLURM_JOB_ACCOUNT", job.account.clone()),
        ("SLURM_JOB_QOS", job.qos.clone()),
        ("SLURM_STEP_ID", step.id.to_string()),
        ("SLURM_STEPID", step.id.to_string()),
        ("SLURM_STEP_NODELIST", nodelist),
        ("SLURM_STEP_NUM_NODES", step.nodes.len().to_string()),
        ("SLURM_STEP_NUM_TASKS", step.ntasks.to_string()),
        ("SLURM_STEP_TASKS_PER_NODE", step.tasks_per_node()),
        ("SLURM_TASKS_PER_NODE", step.tasks_per_node()),
        ("SLURM_NTASKS", step.ntasks.to_string()),
        ("SLURM_NPROCS", step.ntasks.to_string()),
        ("SLURM_NNODES", step.nodes.len().to_string()),
        ("SLURM_CPUS_PER_TASK", step.cpus_per_task.to_string()),
        // The job's CPUs on this node, not srun's (which names its own node's).
        (
            "SLURM_CPUS_ON_NODE",
            allocation
                .and_then(|a| a.nodes.iter().find(|n| n.node == node.node))
                .map(|n| n.cpus.to_string())
                .unwrap_or_default(),
        ),
        ("SLURM_GPUS_PER_TASK", step.gpus_per_task.to_string()),
    ];
    vars.retain(|e| !set.iter().any(|(k, _)| *k == e.name));
    vars.extend(
        set.into_iter()
            .filter(|(k, v)| (*k != "SLURM_GPUS_PER_TASK" || v != "0") && !v.is_empty())
            .map(|(k, v)| EnvVar { name: k.to_string(), value: v }),
    );
    StepLaunch {
        job_id: job.id,
        token: job.alloc_index,
        step_id: step.id,
        user: job.user.clone(),
        argv: argv.clone(),
        env: vars,
        work_dir: work_dir.to_string(),
        node_id: node_id as u32,
        first_task: node.first_task,
        tasks: node.tasks,
        gpus: node.gpus.clone(),
        gpus_per_task: step.gpus_per_task,
        grant: Vec::new(),
        signature: Vec::new(),
        pty: start.pty && node.first_task == 0,
        window: start.window,
        group: job.spec.run_group.clone().unwrap_or_default(),
        // Without options of its own, a step runs in the job's container (salloc's or sbatch's
        // --container-image), as pyxis passes a job's options on to its steps.
        container: start.container.clone().or_else(|| job.spec.container.as_ref().map(crate::wire::container_to_proto)),
        // With PMI or the cyclic numbering, every node knows the step's layout (PMI_process_mapping,
        // fences, which tasks are its own).
        node_tasks: if start.mpi.is_empty() && !step.cyclic {
            Vec::new()
        } else {
            step.nodes.iter().map(|n| n.tasks).collect()
        },
        cyclic: step.cyclic,
        mpi: start.mpi.clone(),
        cpu_bind: start.cpu_bind.clone(),
    }
}
