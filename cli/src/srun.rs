//! `srun` inside a job (a batch script, or `salloc`'s shell): a job step of the job in
//! `SLURM_JOB_ID` (or `--jobid`), its tasks spread over the allocation as the options say. The
//! tasks' output comes back to srun's own stdout and stderr (`--label` prefixes each line with
//! its task id; `-o`/`-e` write files, `%t %n %N %j %s %J %%` expanded), srun's stdin goes to
//! task 0, Ctrl-C is forwarded (a second within a second kills the step), and srun exits with
//! the highest exit code of its tasks, as Slurm's does.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_proto::api::{step_event, step_input, EnvVar, StepInput, StepRequest, StepStarted};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

#[derive(Parser, Debug)]
#[command(name = "srun", no_binary_name = true, about = "Run a job step (Quorum's srun)")]
pub struct SrunArgs {
    /// Nodes: N, or MIN-MAX (the step takes MAX when the allocation has them).
    #[arg(short = 'N', long)]
    nodes: Option<String>,
    /// Tasks (default: the job's SLURM_NTASKS, or one per node).
    #[arg(short = 'n', long)]
    ntasks: Option<u32>,
    /// Tasks on each node (Slurm's --ntasks-per-node; --tasks-per-node too).
    #[arg(long = "ntasks-per-node", alias = "tasks-per-node")]
    ntasks_per_node: Option<u32>,
    /// CPUs per task (default: the job's SLURM_CPUS_PER_TASK).
    #[arg(short = 'c', long = "cpus-per-task")]
    cpus_per_task: Option<u32>,
    /// GPUs per task: [type:]N.
    #[arg(long = "gpus-per-task")]
    gpus_per_task: Option<String>,
    /// Nodes of the allocation the step must use (a host list).
    #[arg(short = 'w', long)]
    nodelist: Option<String>,
    /// Dedicated CPUs for the step (the default for steps).
    #[arg(long)]
    exclusive: bool,
    /// Share CPUs and GPUs with the job's other steps instead of waiting for them.
    #[arg(long)]
    overlap: bool,
    /// In a heterogeneous job: the components whose nodes the step runs on (`1`, `0,2`,
    /// `1-3`); component 0 when not given.
    #[arg(long = "het-group", alias = "pack-group")]
    het_group: Option<String>,
    /// From outside a job: an allocation that shares its CPUs with other jobs where the
    /// partition lets jobs that ask do so (`OverSubscribe=YES`). Within a job, nothing.
    #[arg(short = 's', long)]
    oversubscribe: bool,
    /// Prefix each line of output with its task id.
    #[arg(short = 'l', long)]
    label: bool,
    /// Write the tasks' output here (%t task, %n node index, %N node, %j job, %s step, %J
    /// job.step, %A and %a the array's id and task, %u user, %x job name).
    #[arg(short = 'o', long)]
    output: Option<String>,
    /// Write the tasks' errors here (default: with the output).
    #[arg(short = 'e', long)]
    error: Option<String>,
    /// End the step when a task exits with a non-zero code (`--kill-on-bad-exit=0` turns it
    /// off). A value only after `=`, as Slurm's: `-K ./app` runs ./app.
    #[arg(short = 'K', long = "kill-on-bad-exit", num_args = 0..=1, default_missing_value = "1", require_equals = true)]
    kill_on_bad_exit: Option<u8>,
    /// Seconds to let the other tasks run once one has exited, then kill them (0: no limit).
    #[arg(short = 'W', long)]
    wait: Option<u64>,
    /// The job to run the step in (default: SLURM_JOB_ID).
    #[arg(long, alias = "jobid")]
    jobid: Option<u64>,
    /// Working directory of the tasks (default: here).
    #[arg(short = 'D', long)]
    chdir: Option<String>,
    /// Task 0 on a terminal of its own, which srun's terminal drives (`srun --pty bash`):
    /// its size follows srun's, and keys (^C, ^Z) reach it as typed.
    #[arg(long)]
    pty: bool,
    /// Output is sent as it comes (always so here).
    #[arg(short = 'u', long)]
    unbuffered: bool,
    /// From outside a job: the partition of the allocation srun takes.
    #[arg(short = 'p', long)]
    partition: Option<String>,
    /// From outside a job: the allocation's time limit.
    #[arg(short = 't', long)]
    time: Option<String>,
    /// From outside a job: memory per node.
    #[arg(long)]
    mem: Option<String>,
    /// From outside a job: the job's name (default: the program's).
    #[arg(short = 'J', long = "job-name")]
    job_name: Option<String>,
    /// From outside a job: the account the allocation is charged to.
    #[arg(short = 'A', long)]
    account: Option<String>,
    /// From outside a job: the allocation's QOS.
    #[arg(short = 'q', long)]
    qos: Option<String>,
    /// From outside a job, as root: the allocation is this user's (a name or uid), and srun
    /// becomes them once it is granted, so the step runs as them.
    #[arg(long)]
    uid: Option<String>,
    /// With --uid: the group the allocation and its step run with (a name or gid).
    #[arg(long)]
    gid: Option<String>,
    /// The process-management interface the tasks get: `pmi2` (PMI-1 and PMI-2 on PMI_FD, for
    /// MPICH and Intel MPI), `none`; `list` prints what this cluster offers. Default: the
    /// cluster's MpiDefault (or SLURM_MPI_TYPE).
    #[arg(long)]
    mpi: Option<String>,
    /// Where srun's stdin goes: `0` (task 0, the default here) or `none`.
    #[arg(short = 'i', long)]
    input: Option<String>,
    /// Which variables of srun's environment the tasks get: `ALL` (the default), `NONE`, or
    /// names (with `ALL,` first: on top of all), `NAME=value` setting one.
    #[arg(long)]
    export: Option<String>,
    /// Task binding (Slurm's --cpu-bind): `[verbose,]TYPE`, TYPE one of none, rank, threads,
    /// cores, sockets, map_cpu:IDS, mask_cpu:MASKS; each task is bound to its CPUs among the
    /// job's on its node (`verbose` says which). Default: $SLURM_CPU_BIND, else none.
    #[arg(long = "cpu-bind", alias = "cpu_bind")]
    cpu_bind: Option<String>,
    /// More tasks than CPUs: on each node the step needs one task's CPUs, and its tasks share
    /// what it holds there.
    #[arg(short = 'O', long)]
    overcommit: bool,
    /// Steps get exactly the CPUs they ask for (always so here).
    #[arg(long)]
    exact: bool,
    /// Don't print srun's informational messages.
    #[arg(short = 'Q', long)]
    quiet: bool,
    /// More of srun's messages (accepted; srun says what it does only on errors here).
    #[arg(short = 'v', long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Don't end the step when one of its nodes fails (accepted: a failed node's tasks end
    /// with an error, the others run on).
    #[arg(short = 'k', long = "no-kill", num_args = 0..=1, default_missing_value = "", require_equals = true)]
    no_kill: Option<String>,
    /// Copy the program to every node of the step's job first (sbcast) and run that copy:
    /// `--bcast=PATH`, or a directory (`/tmp/`; default: the working directory) where it is
    /// named slurm_bcast_JOBID.PROGRAM.
    #[arg(long, num_args = 0..=1, default_missing_value = "", require_equals = true)]
    bcast: Option<String>,
    /// How tasks are numbered over the step's nodes (Slurm's --distribution): block (the
    /// default) or cyclic; plane=N, arbitrary and the levels after ':' (sockets, cores) are
    /// accepted with a warning. Default: $SLURM_DISTRIBUTION.
    #[arg(short = 'm', long)]
    distribution: Option<String>,
    #[command(flatten)]
    tolerated: StepTolerated,
    #[command(flatten)]
    container: quorum_client::container::ContainerOpts,
    #[command(flatten)]
    controllers: ControllersArg,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, required_unless_present = "mpi")]
    command: Vec<String>,
}

quorum_client::tolerated! { StepTolerated {
    /// Accepted, not honoured (tasks are not bound to cores or threads here).
    #[arg(long)]
    hint: "--hint" => "tasks are not bound to cores or threads here";
    /// Accepted, not honoured (each task sees the GPUs of its --gpus-per-task, or all of the step's).
    #[arg(long)]
    gpu_bind: "--gpu-bind" => "each task sees the GPUs of its --gpus-per-task, or all of the step's";
    /// Accepted, not honoured (memory is not bound to NUMA nodes).
    #[arg(long)]
    mem_bind: "--mem-bind" => "memory is not bound to NUMA nodes";
    /// Accepted, not honoured (CPU frequencies are not managed).
    #[arg(long)]
    cpu_freq: "--cpu-freq" => "CPU frequencies are not managed";
    /// Accepted, not honoured (tasks are not bound to accelerators).
    #[arg(long)]
    accel_bind: "--accel-bind" => "tasks are not bound to accelerators";
    /// Accepted, not honoured (no network resources are managed).
    #[arg(long)]
    network: "--network" => "no network resources are managed";
    /// Accepted, not honoured (resource limits come from the job's request).
    #[arg(long, num_args = 0..=1, default_missing_value = "", require_equals = true)]
    propagate: "--propagate" => "resource limits come from the job's request";
    /// Accepted, not honoured (a step shares its job's memory).
    #[arg(long = "mem-per-cpu")]
    mem_per_cpu: "--mem-per-cpu" => "a step shares its job's memory";
    /// Accepted, not honoured (a step sees its job's GPUs (--gpus-per-task divides them)).
    #[arg(long)]
    gres: "--gres" => "a step sees its job's GPUs (--gpus-per-task divides them)";
    /// Accepted, not honoured (a step sees its job's GPUs (--gpus-per-task divides them)).
    #[arg(long)]
    gpus: "--gpus" => "a step sees its job's GPUs (--gpus-per-task divides them)";
    /// Accepted, not honoured (a step sees its job's GPUs (--gpus-per-task divides them)).
    #[arg(long = "gpus-per-node")]
    gpus_per_node: "--gpus-per-node" => "a step sees its job's GPUs (--gpus-per-task divides them)";
    /// Accepted, not honoured (nodes offer CPUs, without cores or threads).
    #[arg(long = "threads-per-core")]
    threads_per_core: "--threads-per-core" => "nodes offer CPUs, without cores or threads";
    /// Accepted, not honoured (nodes offer CPUs, without cores or threads).
    #[arg(long = "ntasks-per-core")]
    ntasks_per_core: "--ntasks-per-core" => "nodes offer CPUs, without cores or threads";
    /// Accepted, not honoured (srun's own threads are not configurable).
    #[arg(short = 'T', long)]
    threads: "--threads" => "srun's own threads are not configurable";
    /// Accepted, not honoured (a step gets the CPUs it asks for).
    #[arg(long, num_args = 0, default_missing_value = "")]
    whole: "--whole" => "a step gets the CPUs it asks for";
} }

/// `--distribution` (`-m`): whether tasks are numbered cyclic over the nodes, and a warning for
/// what is accepted but not honoured.
fn distribution(text: &str) -> anyhow::Result<(bool, Option<String>)> {
    quorum_model::step::parse_distribution(text).map_err(anyhow::Error::msg)
}

/// `--distribution`, else srun's input variable `SLURM_DISTRIBUTION` (which a step's tasks have).
fn distribution_option(a: &SrunArgs) -> Option<String> {
    a.distribution.clone().or_else(|| std::env::var("SLURM_DISTRIBUTION").ok().filter(|d| !d.trim().is_empty()))
}

/// `--cpu-bind`, else srun's input variable `SLURM_CPU_BIND` (which a step's tasks have).
fn bind_option(a: &SrunArgs) -> Option<String> {
    a.cpu_bind.clone().or_else(|| std::env::var("SLURM_CPU_BIND").ok())
}

/// `--cpu-bind` (or srun's input variable `SLURM_CPU_BIND`) as the step carries it, and a
/// warning for a type Slurm has that this cluster does not make (its tasks are then not bound).
fn cpu_bind(bind: Option<&str>) -> anyhow::Result<(String, Option<String>)> {
    let Some(bind) = bind.map(str::trim).filter(|b| !b.is_empty()) else { return Ok((String::new(), None)) };
    Ok(match quorum_model::cpu_bind::CpuBind::parse(bind).map_err(anyhow::Error::msg)? {
        Some(b) if b.binds() || b.verbose => (b.to_string(), None),
        Some(_) => (String::new(), None),
        None => (
            String::new(),
            Some(format!("--cpu-bind={bind} is accepted but not honoured: locality domains and boards are not bound here (use cores, threads, sockets, map_cpu or mask_cpu)")),
        ),
    })
}

/// srun's environment as `--export` passes it on: everything (ALL, the default), or only the
/// `SLURM_*` variables and those named (NONE, or names without ALL), with `NAME=value` set.
fn exported(export: Option<&str>, all: Vec<(String, String)>) -> anyhow::Result<Vec<(String, String)>> {
    let Some(export) = export else { return Ok(all) };
    let mut keep_all = false;
    let mut names = Vec::new();
    let mut set = Vec::new();
    for item in export.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item {
            "ALL" => keep_all = true,
            "NONE" | "NIL" => {}
            _ => match item.split_once('=') {
                Some((k, v)) if !k.is_empty() => set.push((k.to_string(), v.to_string())),
                Some(_) => anyhow::bail!("invalid --export item '{item}': give NAME or NAME=value"),
                None => names.push(item.to_string()),
            },
        }
    }
    let mut env: Vec<(String, String)> = all
        .into_iter()
        .filter(|(k, _)| keep_all || k.starts_with("SLURM_") || names.contains(k))
        .filter(|(k, _)| !set.iter().any(|(s, _)| s == k))
        .collect();
    env.extend(set);
    Ok(env)
}

/// `srun ARGS...`.
pub fn main(args: &[String]) -> ExitCode {
    crate::entry::main_of::<SrunArgs, _, _>("srun", crate::entry::Threads::Workers, args, run)
}

fn env_u32(name: &str) -> Option<u32> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).filter(|&n| n > 0)
}

/// `[type:]N` as N.
fn gpu_count(text: &str) -> anyhow::Result<u32> {
    let n = text.rsplit(':').next().unwrap_or(text);
    n.trim().parse().map_err(|_| anyhow::anyhow!("invalid --gpus-per-task '{text}': give [type:]N"))
}

/// `--het-group`'s components: numbers and ranges, comma-separated (`0,2-3`).
fn het_groups(text: &str) -> anyhow::Result<Vec<u32>> {
    let bad = || anyhow::anyhow!("invalid --het-group '{text}': give component numbers, e.g. 1 or 0,2-3");
    let mut groups = Vec::new();
    for part in text.split(',').map(str::trim) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi): (u32, u32) = (lo.trim().parse().map_err(|_| bad())?, hi.trim().parse().map_err(|_| bad())?);
        if lo > hi || hi >= quorum_model::het::MAX_COMPONENTS as u32 {
            return Err(bad());
        }
        groups.extend(lo..=hi);
    }
    groups.sort_unstable();
    groups.dedup();
    Ok(groups)
}

fn request(a: &SrunArgs, job_id: u64) -> anyhow::Result<StepRequest> {
    let het_groups = a.het_group.as_deref().map(het_groups).transpose()?.unwrap_or_default();
    let nodes = match &a.nodes {
        None => 0,
        Some(n) => {
            let max = n.rsplit('-').next().unwrap_or(n);
            max.trim().parse().map_err(|_| anyhow::anyhow!("invalid --nodes '{n}': give N or MIN-MAX"))?
        }
    };
    let nodelist = match &a.nodelist {
        None => Vec::new(),
        Some(w) => {
            quorum_model::hostlist::expand(w.trim()).map_err(|e| anyhow::anyhow!("invalid --nodelist '{w}': {e}"))?
        }
    };
    // The job's task count applies when the step says nothing of its shape, as with Slurm.
    let shaped = a.nodes.is_some() || a.ntasks.is_some() || a.ntasks_per_node.is_some() || !nodelist.is_empty();
    // In a heterogeneous job, the components' tasks (Slurm's `_HET_GROUP_K` variables).
    let het_env = |name: &str| -> Option<Vec<u32>> {
        let groups = if het_groups.is_empty() { vec![0] } else { het_groups.clone() };
        std::env::var("SLURM_HET_SIZE").ok()?;
        groups.iter().map(|k| env_u32(&format!("SLURM_{name}_HET_GROUP_{k}"))).collect()
    };
    let job_tasks = || het_env("NTASKS").map(|t| t.iter().sum()).or_else(|| env_u32("SLURM_NTASKS"));
    let ntasks = a.ntasks.or_else(|| (!shaped).then(job_tasks).flatten()).unwrap_or(0);
    let het_cpus = het_env("CPUS_PER_TASK").and_then(|c| c.iter().max().copied());
    let cpus_per_task = a
        .cpus_per_task
        .or_else(|| env_u32("SRUN_CPUS_PER_TASK"))
        .or(het_cpus)
        .or_else(|| env_u32("SLURM_CPUS_PER_TASK"))
        .unwrap_or(1);
    let cwd = match &a.chdir {
        Some(d) if d.starts_with('/') => d.clone(),
        Some(d) => std::env::current_dir()?.join(d).display().to_string(),
        None => std::env::current_dir()?.display().to_string(),
    };
    let container = a.container.spec(std::path::Path::new(&cwd)).map_err(anyhow::Error::msg)?;
    Ok(StepRequest {
        job_id,
        argv: a.command.clone(),
        nodes,
        ntasks,
        ntasks_per_node: a.ntasks_per_node.unwrap_or(0),
        cpus_per_task,
        gpus_per_task: a.gpus_per_task.as_deref().map(gpu_count).transpose()?.unwrap_or(0),
        nodelist,
        overlap: a.overlap,
        env: exported(a.export.as_deref(), quorum_client::submit::process_environment())?
            .into_iter()
            .filter(|(name, _)| name != "SLURM_DISTRIBUTION")
            // Slurm's tasks see the distribution srun was given, as given.
            .chain(distribution_option(a).map(|d| ("SLURM_DISTRIBUTION".to_string(), d)))
            .map(|(name, value)| EnvVar { name, value })
            .collect(),
        work_dir: cwd,
        pty: a.pty,
        window: if a.pty { terminal_size() } else { None },
        het_groups,
        container,
        mpi: match a.mpi.clone().or_else(|| std::env::var("SLURM_MPI_TYPE").ok().filter(|m| !m.is_empty())) {
            // Checked here to say what is wrong before anything is asked; the leader checks again.
            Some(m) => quorum_model::mpi::Mpi::parse(&m).map_err(anyhow::Error::msg)?.to_string(),
            None => String::new(),
        },
        cpu_bind: cpu_bind(bind_option(a).as_deref())?.0,
        // Inside an allocation made with --overcommit, its steps overcommit too (Slurm's
        // SLURM_OVERCOMMIT, which salloc and the batch step set).
        overcommit: a.overcommit
            || std::env::var("SLURM_OVERCOMMIT").is_ok_and(|v| matches!(v.as_str(), "1" | "yes" | "true")),
        cyclic: match distribution_option(a) {
            Some(d) => distribution(&d)?.0,
            None => false,
        },
    })
}

/// `--bcast`: copies `program` (found on this PATH) to every node of the job with sbcast, and
/// says where it is there.
fn broadcast(to: &str, program: &str, work_dir: &str, job_id: u64) -> anyhow::Result<String> {
    use std::os::unix::process::CommandExt;
    let path = std::env::var("PATH").unwrap_or_default();
    let local = if program.contains('/') {
        std::path::PathBuf::from(program)
    } else {
        path.split(':')
            .map(|d| std::path::Path::new(d).join(program))
            .find(|p| p.is_file())
            .ok_or_else(|| anyhow::anyhow!("--bcast: '{program}' is not found on PATH"))?
    };
    let name = local.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let dest = match to {
        "" => format!("{work_dir}/slurm_bcast_{job_id}.{name}"),
        dir if dir.ends_with('/') => format!("{dir}slurm_bcast_{job_id}.{name}"),
        file => file.to_string(),
    };
    let dest = if dest.starts_with('/') { dest } else { format!("{work_dir}/{dest}") };
    let program = std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot find this program: {e}"))?;
    let done = std::process::Command::new(&program)
        .arg0("sbcast")
        .args(["--jobid", &job_id.to_string(), "--force"])
        .arg(&local)
        .arg(&dest)
        .status()
        .map_err(|e| anyhow::anyhow!("--bcast: running sbcast: {e}"))?;
    if !done.success() {
        anyhow::bail!("--bcast: {} could not be copied to the job's nodes (sbcast said why above)", local.display());
    }
    Ok(dest)
}

/// What `%a` stands for outside a job array (Slurm's NO_VAL), as in the batch step's files.
const NO_ARRAY_TASK: &str = "4294967294";

/// The enclosing job's names for output patterns, from the environment it gave srun: its
/// array's id and task id (`%A`, `%a`), its user (`%u`) and name (`%x`).
struct JobNames {
    array: Option<(String, String)>,
    user: String,
    name: String,
}

impl JobNames {
    fn from_env() -> JobNames {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        JobNames {
            array: var("SLURM_ARRAY_JOB_ID").zip(var("SLURM_ARRAY_TASK_ID")),
            user: var("SLURM_JOB_USER").or_else(|| var("USER")).unwrap_or_default(),
            name: var("SLURM_JOB_NAME").unwrap_or_default(),
        }
    }
}

/// Where the tasks' output goes.
struct Sink {
    label_width: Option<usize>,
    output: Option<String>,
    error: Option<String>,
    started: StepStarted,
    job: JobNames,
    files: HashMap<String, std::fs::File>,
    /// Partial lines per (task, stderr), when labelling.
    partial: HashMap<(u32, bool), Vec<u8>>,
}

impl Sink {
    fn node_of(&self, task: u32) -> (usize, &str) {
        let i = if self.started.cyclic {
            // Round-robin: find the node whose share holds the task.
            quorum_model::step::task_ranks(&self.started.node_tasks, true)
                .iter()
                .position(|r| r.binary_search(&task).is_ok())
                .unwrap_or(0)
        } else {
            self.started.first_task.iter().rposition(|&f| f <= task).unwrap_or(0)
        };
        (i, self.started.nodes.get(i).map(String::as_str).unwrap_or(""))
    }

    fn expand(&self, pattern: &str, task: u32) -> String {
        let (node_index, node) = self.node_of(task);
        let mut out = String::new();
        let mut chars = pattern.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            // A width pads a number with zeros (`%5t`), as Slurm does.
            let mut width = String::new();
            while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                width.push(*d);
                chars.next();
            }
            let width = width.parse::<usize>().unwrap_or(0).min(10);
            let number = |n: u64| format!("{n:0width$}");
            match chars.next() {
                Some('t') => out.push_str(&number(task.into())),
                Some('n') => out.push_str(&number(node_index as u64)),
                Some('N') => out.push_str(node),
                Some('j') => out.push_str(&number(self.started.job_id)),
                Some('s') => out.push_str(&number(self.started.step_id.into())),
                Some('J') => out.push_str(&format!("{}.{}", number(self.started.job_id), self.started.step_id)),
                Some('A') => match &self.job.array {
                    Some((array, _)) => out.push_str(&format!("{array:0>width$}")),
                    None => out.push_str(&number(self.started.job_id)),
                },
                Some('a') => out.push_str(self.job.array.as_ref().map_or(NO_ARRAY_TASK, |(_, task)| task)),
                Some('u') => out.push_str(&self.job.user),
                Some('x') => out.push_str(&self.job.name),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        out
    }

    fn write(&mut self, task: u32, stderr: bool, data: &[u8]) -> std::io::Result<()> {
        let data = match self.label_width {
            None => data.to_vec(),
            Some(width) => {
                let buf = self.partial.entry((task, stderr)).or_default();
                buf.extend_from_slice(data);
                let Some(end) = buf.iter().rposition(|&b| b == b'\n') else { return Ok(()) };
                let lines: Vec<u8> = buf.drain(..=end).collect();
                label(&lines, task, width)
            }
        };
        self.emit(task, stderr, &data)
    }

    fn emit(&mut self, task: u32, stderr: bool, data: &[u8]) -> std::io::Result<()> {
        let pattern = if stderr { self.error.clone().or_else(|| self.output.clone()) } else { self.output.clone() };
        match pattern {
            None if stderr => std::io::stderr().write_all(data),
            None => {
                let mut out = std::io::stdout().lock();
                out.write_all(data)?;
                out.flush()
            }
            Some(p) => {
                let path = self.expand(&p, task);
                if !self.files.contains_key(&path) {
                    let f = std::fs::File::create(&path)
                        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot write {path}: {e}")))?;
                    self.files.insert(path.clone(), f);
                }
                self.files.get_mut(&path).expect("just opened").write_all(data)
            }
        }
    }

    /// What is left of a task's last line, once it ended.
    fn flush(&mut self, task: u32) -> std::io::Result<()> {
        for stderr in [false, true] {
            if let (Some(width), Some(rest)) = (self.label_width, self.partial.remove(&(task, stderr))) {
                if !rest.is_empty() {
                    let mut rest = rest;
                    rest.push(b'\n');
                    let data = label(&rest, task, width);
                    self.emit(task, stderr, &data)?;
                }
            }
        }
        Ok(())
    }
}

/// Each line of `lines` (ending in a newline) prefixed with the task id, as `srun -l` does.
fn label(lines: &[u8], task: u32, width: usize) -> Vec<u8> {
    let prefix = format!("{task:>width$}: ");
    let mut out = Vec::with_capacity(lines.len() + prefix.len() * 2);
    for line in lines.split_inclusive(|&b| b == b'\n') {
        out.extend_from_slice(prefix.as_bytes());
        out.extend_from_slice(line);
    }
    out
}

/// From outside a job: the allocation srun takes for its step, shaped as the step asks.
fn outside_spec(a: &SrunArgs) -> anyhow::Result<crate::salloc::Allocation> {
    let nodes = match &a.nodes {
        Some(n) => Some(
            n.rsplit('-')
                .next()
                .unwrap_or(n)
                .trim()
                .parse::<u32>()
                .map_err(|_| anyhow::anyhow!("invalid --nodes '{n}'"))?,
        ),
        None => None,
    };
    let ntasks = a.ntasks.unwrap_or_else(|| nodes.unwrap_or(1) * a.ntasks_per_node.unwrap_or(1));
    let nodes = nodes.unwrap_or_else(|| a.ntasks_per_node.map_or(1, |per| ntasks.div_ceil(per.max(1))));
    let gpus = a.gpus_per_task.as_deref().map(gpu_count).transpose()?.unwrap_or(0);
    let opts = quorum_client::submit::SubmitOpts {
        job_name: a
            .job_name
            .clone()
            .or_else(|| a.command.first().map(|c| c.rsplit('/').next().unwrap_or(c).to_string())),
        partition: a.partition.clone(),
        nodes: Some(quorum_client::submit::NodeCount::exact(nodes)),
        ntasks: Some(ntasks),
        cpus_per_task: a.cpus_per_task,
        mem: a.mem.clone(),
        gres: (gpus > 0).then(|| format!("gpu:{}", gpus * ntasks.div_ceil(nodes.max(1)))),
        time: a.time.clone(),
        account: a.account.clone(),
        qos: a.qos.clone(),
        oversubscribe: a.oversubscribe,
        overcommit: a.overcommit,
        uid: a.uid.clone(),
        gid: a.gid.clone(),
        ..Default::default()
    };
    crate::salloc::allocation_spec(opts, a.command.clone(), "srun")
}

async fn run(a: SrunArgs) -> anyhow::Result<u8> {
    if a.mpi.as_deref() == Some("list") {
        println!("MPI plugin types are...");
        for t in quorum_model::mpi::OFFERED {
            println!("\t{t}");
        }
        println!("specific pmix plugin versions available: {}", quorum_model::mpi::PMIX_VERSIONS.join(","));
        return Ok(0);
    }
    if a.command.is_empty() {
        anyhow::bail!("no command given: srun [OPTIONS] PROGRAM [ARGS...]");
    }
    match a.input.as_deref().map(str::trim) {
        None | Some("none") | Some("0") => {}
        Some(other) => anyhow::bail!(
            "--input={other} is not supported here: srun's stdin goes to task 0 (--input=0) or nowhere (--input=none)"
        ),
    }
    let (_, unbound) = cpu_bind(bind_option(&a).as_deref())?;
    if !a.quiet {
        let chosen = unbound;
        let layout = match distribution_option(&a) {
            Some(d) => distribution(&d)?.1,
            None => None,
        };
        for w in a.tolerated.warnings().into_iter().chain(chosen).chain(layout) {
            eprintln!("srun: warning: {w}");
        }
    }
    if a.command.first().is_some_and(|c| c == ":") {
        anyhow::bail!(
            "a heterogeneous step or allocation (srun A : B) is not supported here: submit the job with sbatch (#SBATCH hetjob) and run one srun per component with --het-group"
        );
    }
    let client = a.controllers.client()?;
    match a.jobid.or_else(|| std::env::var("SLURM_JOB_ID").ok().and_then(|v| v.trim().parse().ok())) {
        Some(_) if a.uid.is_some() || a.gid.is_some() => anyhow::bail!(
            "--uid and --gid take effect only when srun takes an allocation of its own: a job's steps run as the job's user"
        ),
        Some(id) => step(&a, &client, id).await,
        None if a.het_group.is_some() => {
            anyhow::bail!("--het-group names components of a heterogeneous job: use it inside one (its batch script)")
        }
        None => {
            // From a login node: an allocation of its own for this one step, ended with it.
            let allocation = outside_spec(&a)?;
            let became = allocation.run_as.is_some();
            let job = crate::salloc::allocate(&client, allocation, "srun", false).await?;
            // Become the job's user (--uid): from here on, requests prove who this process now is.
            let client = if became { a.controllers.client()? } else { client };
            let code = match step(&a, &client, job.id).await {
                Ok(code) => i32::from(code),
                Err(e) => {
                    eprintln!("srun: error: {e:#}");
                    1
                }
            };
            crate::salloc::relinquish(&client, job.id, code).await?;
            Ok(code as u8)
        }
    }
}

async fn step(a: &SrunArgs, client: &quorum_client::client::Client, job_id: u64) -> anyhow::Result<u8> {
    let mut start = request(a, job_id)?;
    if let Some(to) = &a.bcast {
        start.argv[0] = broadcast(to, &start.argv[0], &start.work_dir, job_id)?;
    }
    let slot: Arc<Mutex<Option<mpsc::Sender<StepInput>>>> = Arc::default();
    let mut told_busy = false;
    let mut events = loop {
        let answer = client
            .call(|mut api| {
                let (tx, rx) = mpsc::channel(64);
                let _ = tx.try_send(StepInput { msg: Some(step_input::Msg::Start(start.clone())) });
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
                async move { api.run_step(ReceiverStream::new(rx)).await }
            })
            .await;
        match answer {
            Ok(stream) => break stream,
            Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                if !told_busy {
                    eprintln!("srun: Job {job_id} step creation temporarily disabled, retrying ({})", s.message());
                    told_busy = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => anyhow::bail!("{}", s.message()),
        }
    };
    let input = slot.lock().unwrap_or_else(|p| p.into_inner()).take().expect("the stream's sender");
    let started = match events.message().await? {
        Some(e) => match e.msg {
            Some(step_event::Msg::Started(s)) => s,
            other => anyhow::bail!("the step's first answer was not its start: {other:?}"),
        },
        None => anyhow::bail!("the step ended before it started"),
    };
    if told_busy {
        eprintln!("srun: Step created for StepId={}.{}", started.job_id, started.step_id);
    }
    let width = started.ntasks.saturating_sub(1).to_string().len();
    let mut sink = Sink {
        label_width: a.label.then_some(width),
        output: a.output.clone(),
        error: a.error.clone(),
        started,
        job: JobNames::from_env(),
        files: HashMap::new(),
        partial: HashMap::new(),
    };
    // With --pty, srun's terminal passes every key on (raw) until srun ends.
    let _raw = if a.pty { RawTerminal::enter() } else { None };
    if a.input.as_deref().map(str::trim) == Some("none") {
        let _ = input.send(StepInput { msg: Some(step_input::Msg::StdinEof(true)) }).await;
    } else {
        forward_stdin(input.clone());
    }
    let mut signals = Signals::new()?;
    let mut resized = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let kill_on_bad_exit = a.kill_on_bad_exit.is_some_and(|k| k != 0);
    let mut first_exit: Option<Instant> = None;
    let mut killed = false;
    // Each ended task's (exit code, signal, whether srun had killed the step by then).
    let mut ended: HashMap<u32, (i32, i32, bool)> = HashMap::new();
    let far = Duration::from_secs(100 * 365 * 86400);
    loop {
        let wait_left = match (a.wait, first_exit) {
            (Some(w), Some(at)) if w > 0 && !killed => Duration::from_secs(w).saturating_sub(at.elapsed()),
            _ => far,
        };
        tokio::select! {
            event = events.message() => {
                let Some(event) = event? else { anyhow::bail!("lost the step's stream before its end") };
                match event.msg {
                    Some(step_event::Msg::Output(o)) => sink.write(o.task, o.stderr, &o.data)?,
                    Some(step_event::Msg::Exit(x)) => {
                        sink.flush(x.task)?;
                        first_exit.get_or_insert_with(Instant::now);
                        ended.insert(x.task, (x.exit_code, x.signal, killed));
                        let (_, node) = sink.node_of(x.task);
                        if !x.error.is_empty() {
                            eprintln!("srun: error: {node}: task {}: {}", x.task, x.error);
                        } else if x.signal != 0 {
                            eprintln!("srun: error: {node}: task {}: {}", x.task, signal_name(x.signal));
                        } else if x.exit_code != 0 {
                            eprintln!("srun: error: {node}: task {}: Exited with exit code {}", x.task, x.exit_code);
                        }
                        let bad = x.exit_code != 0 || x.signal != 0 || !x.error.is_empty();
                        if bad && kill_on_bad_exit && !killed {
                            eprintln!("srun: Terminating StepId={}.{}", sink.started.job_id, sink.started.step_id);
                            send_signal(&input, libc::SIGKILL).await;
                            killed = true;
                        }
                    }
                    Some(step_event::Msg::End(end)) => {
                        if !end.reason.is_empty() {
                            eprintln!("srun: error: StepId={}.{} ended: {}", sink.started.job_id, sink.started.step_id, end.reason);
                            return Ok(if end.exit_code == 0 { 1 } else { end.exit_code.clamp(1, 255) as u8 });
                        }
                        return Ok(exit_code(&ended).unwrap_or(end.exit_code).clamp(0, 255) as u8);
                    }
                    _ => {}
                }
            }
            _ = tokio::time::sleep(wait_left) => {
                eprintln!("srun: error: Timed out waiting for the step's other tasks (--wait={}): killing them", a.wait.unwrap_or(0));
                send_signal(&input, libc::SIGKILL).await;
                killed = true;
            }
            _ = resized.recv(), if a.pty => {
                if let Some(w) = terminal_size() {
                    let _ = input.send(StepInput { msg: Some(step_input::Msg::Window(w)) }).await;
                }
            }
            signal = signals.next() => {
                match signal {
                    Some(libc::SIGINT) => {
                        if signals.second_interrupt() {
                            eprintln!("srun: forcing job termination");
                            send_signal(&input, libc::SIGKILL).await;
                        } else {
                            eprintln!("srun: interrupt (one more within 1 sec to abort)");
                            send_signal(&input, libc::SIGINT).await;
                        }
                    }
                    Some(s) => send_signal(&input, s).await,
                    None => {}
                }
            }
        }
    }
}

/// srun's exit code: the highest of its tasks' (128 + the signal for one a signal killed),
/// leaving out the tasks srun itself killed (`--kill-on-bad-exit`, `--wait`), so that the code is
/// the failing task's, as with Slurm. `None` when every task was killed so.
fn exit_code(ended: &HashMap<u32, (i32, i32, bool)>) -> Option<i32> {
    ended
        .values()
        .filter(|(_, signal, killed)| !(*killed && *signal == libc::SIGKILL))
        .map(|&(code, signal, _)| if signal != 0 { 128 + signal } else { code })
        .max()
}

/// The size of srun's terminal (its stdin), when it has one.
fn terminal_size() -> Option<quorum_proto::api::StepWindow> {
    let mut size = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes a winsize to the pointer given.
    let ok = unsafe { libc::ioctl(0, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_row > 0)
        .then(|| quorum_proto::api::StepWindow { rows: size.ws_row.into(), cols: size.ws_col.into() })
}

/// srun's terminal in raw mode (no echo, no line editing, keys passed on as typed), put back as
/// it was when dropped.
struct RawTerminal(libc::termios);

impl RawTerminal {
    fn enter() -> Option<RawTerminal> {
        // SAFETY: isatty, tcgetattr and tcsetattr on fd 0 with a termios we own.
        unsafe {
            if libc::isatty(0) != 1 {
                return None;
            }
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut saved) != 0 {
                return None;
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            (libc::tcsetattr(0, libc::TCSANOW, &raw) == 0).then_some(RawTerminal(saved))
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: puts back the attributes read from fd 0.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &self.0) };
    }
}

async fn send_signal(input: &mpsc::Sender<StepInput>, signal: i32) {
    let _ = input.send(StepInput { msg: Some(step_input::Msg::Signal(signal)) }).await;
}

fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGKILL => "Killed".into(),
        libc::SIGTERM => "Terminated".into(),
        libc::SIGINT => "Interrupt".into(),
        libc::SIGSEGV => "Segmentation fault".into(),
        libc::SIGABRT => "Aborted".into(),
        s => format!("killed by signal {s}"),
    }
}

/// srun's stdin, to task 0, then its end. The sender stays alive (in the caller) after it: the
/// stream's end is how the leader learns that srun went away.
fn forward_stdin(input: mpsc::Sender<StepInput>) {
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = input.send(StepInput { msg: Some(step_input::Msg::StdinEof(true)) }).await;
                    return;
                }
                Ok(n) => {
                    let msg = StepInput { msg: Some(step_input::Msg::Stdin(buf[..n].to_vec())) };
                    if input.send(msg).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
}

/// The signals srun forwards to its tasks.
struct Signals {
    streams: Vec<(i32, tokio::signal::unix::Signal)>,
    last_interrupt: Option<Instant>,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut streams = Vec::new();
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1, libc::SIGUSR2, libc::SIGHUP, libc::SIGQUIT] {
            streams.push((s, signal(SignalKind::from_raw(s))?));
        }
        Ok(Signals { streams, last_interrupt: None })
    }

    async fn next(&mut self) -> Option<i32> {
        let futures = self.streams.iter_mut().map(|(n, s)| {
            let n = *n;
            Box::pin(async move { s.recv().await.map(|_| n) })
        });
        futures::future::select_all(futures).await.0
    }

    /// Whether this interrupt comes within a second of the last.
    fn second_interrupt(&mut self) -> bool {
        let now = Instant::now();
        let second = self.last_interrupt.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1));
        self.last_interrupt = Some(now);
        second
    }
}

#[cfg(test)]
mod tests {
    use super::{label, outside_spec, SrunArgs};
    use clap::Parser;

    #[test]
    fn an_allocation_of_its_own_shares_its_cpus_when_srun_asks() {
        let spec = |args: &[&str]| outside_spec(&SrunArgs::try_parse_from(args).unwrap()).unwrap().spec;
        let shared = spec(&["-s", "-p", "asked", "-c", "8", "hostname"]);
        assert!(shared.oversubscribe && !shared.exclusive);
        assert_eq!((shared.partition.as_str(), shared.cpus_per_task), ("asked", 8));
        assert!(!spec(&["hostname"]).oversubscribe);
    }

    #[test]
    fn uid_names_the_allocation_srun_takes_for_another_user() {
        let alloc = |args: &[&str]| outside_spec(&SrunArgs::try_parse_from(args).unwrap()).unwrap();
        assert_eq!(alloc(&["--uid", "root", "--gid", "root", "id"]).run_as.as_deref(), Some("root"));
        assert_eq!(alloc(&["--uid", "root", "--gid", "root", "id"]).spec.group, "root");
        assert_eq!(alloc(&["id"]).run_as, None);
    }

    #[test]
    fn the_exit_code_is_the_highest_leaving_out_tasks_srun_killed() {
        use std::collections::HashMap;
        let ended = |v: &[(u32, (i32, i32, bool))]| v.iter().copied().collect::<HashMap<_, _>>();
        assert_eq!(super::exit_code(&ended(&[(0, (0, 0, false)), (1, (3, 0, false))])), Some(3));
        assert_eq!(super::exit_code(&ended(&[(0, (0, 9, true)), (1, (3, 0, false))])), Some(3));
        assert_eq!(super::exit_code(&ended(&[(0, (0, 9, false)), (1, (3, 0, false))])), Some(137));
        assert_eq!(super::exit_code(&ended(&[(0, (0, 9, true))])), None);
    }

    #[test]
    fn the_options_are_consistent() {
        use clap::CommandFactory;
        SrunArgs::command().debug_assert();
    }

    /// What Open MPI's (4 and 5) and MPICH's Slurm launchers pass to srun parses, and the command
    /// after them is the program's.
    #[test]
    fn mpi_launchers_options_are_accepted() {
        let ompi4 = [
            "--ntasks-per-node=1",
            "--kill-on-bad-exit",
            "--mpi=none",
            "--nodes=2",
            "--nodelist=node01,node02",
            "--ntasks=2",
            "orted",
            "-mca",
            "ess",
            "slurm",
        ];
        let a = SrunArgs::try_parse_from(ompi4).unwrap();
        assert_eq!((a.mpi.as_deref(), a.ntasks, a.command[0].as_str()), (Some("none"), Some(2), "orted"));
        assert_eq!(a.command.len(), 4);
        let ompi5 = ["--ntasks-per-node=1", "--kill-on-bad-exit", "--cpu-bind=none", "--mpi=none", "-N", "2", "prted"];
        assert_eq!(SrunArgs::try_parse_from(ompi5).unwrap().cpu_bind.as_deref(), Some("none"));
        let hydra = ["-N", "2", "-n", "2", "--input", "none", "hydra_pmi_proxy", "--control-port", "x"];
        let a = SrunArgs::try_parse_from(hydra).unwrap();
        assert_eq!((a.input.as_deref(), a.command[0].as_str()), (Some("none"), "hydra_pmi_proxy"));
        let snakemake = ["-n1", "--cpu-bind=q", "--cpus-per-task=1", "bash", "-c", "true"];
        let a = SrunArgs::try_parse_from(snakemake).unwrap();
        assert_eq!(super::cpu_bind(a.cpu_bind.as_deref()).unwrap(), (String::new(), None));
        assert_eq!(super::cpu_bind(Some("cores,verbose")).unwrap(), ("verbose,cores".to_string(), None));
        assert!(super::cpu_bind(Some("map_ldom:0")).unwrap().1.unwrap().contains("not honoured"));
        assert!(super::cpu_bind(Some("bogus")).unwrap_err().to_string().contains("'bogus'"));
        assert!(SrunArgs::try_parse_from(["--mpi=list"]).is_ok());
        let a = SrunArgs::try_parse_from(["--whole", "--gres=gpu:1", "-m", "block:cyclic", "true"]).unwrap();
        let warned = a.tolerated.warnings();
        assert!(warned.iter().any(|w| w.starts_with("--whole is accepted but not honoured")), "{warned:?}");
        assert!(warned.iter().any(|w| w.starts_with("--gres=gpu:1 is accepted")), "{warned:?}");
        assert!(!super::distribution(a.distribution.as_deref().unwrap()).unwrap().0);
        assert_eq!(super::distribution("block").unwrap(), (false, None));
        assert_eq!(super::distribution("cyclic").unwrap(), (true, None));
        assert_eq!(super::distribution("cyclic,NoPack").unwrap(), (true, None));
        let (cyclic, warning) = super::distribution("cyclic:block").unwrap();
        assert!(cyclic && warning.unwrap().contains("levels within a node"));
        assert!(super::distribution("plane=4").unwrap().1.unwrap().contains("plane"));
        for bad in ["bogus", "plane=0", "block:x", "block:block:block:block", "cyclic,loose"] {
            let e = super::distribution(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("invalid --distribution '{bad}'")), "{e}");
        }
        assert!(SrunArgs::try_parse_from(["-N2"]).is_err());
    }

    #[test]
    fn export_passes_all_none_or_the_names_given() {
        let env = || vec![("A".to_string(), "1".to_string()), ("SLURM_X".into(), "2".into()), ("B".into(), "3".into())];
        assert_eq!(super::exported(None, env()).unwrap(), env());
        assert_eq!(super::exported(Some("ALL"), env()).unwrap(), env());
        let none = super::exported(Some("NONE"), env()).unwrap();
        assert_eq!(none, vec![("SLURM_X".to_string(), "2".to_string())]);
        let some = super::exported(Some("B,C=4"), env()).unwrap();
        assert_eq!(some.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["SLURM_X", "B", "C"]);
        let over = super::exported(Some("ALL,A=9"), env()).unwrap();
        assert!(over.contains(&("A".to_string(), "9".to_string())) && over.len() == 3);
        assert!(super::exported(Some("=x"), env()).is_err());
    }

    /// srun's file names: task, node and step numbers padded to the width asked, as Slurm's.
    #[test]
    fn output_patterns_pad_numbers_to_their_width() {
        let mut sink = super::Sink {
            label_width: None,
            output: None,
            error: None,
            started: quorum_proto::api::StepStarted {
                job_id: 42,
                step_id: 3,
                nodelist: "n[1-2]".into(),
                ntasks: 4,
                nodes: vec!["n1".into(), "n2".into()],
                first_task: vec![0, 2],
                node_tasks: vec![2, 2],
                cyclic: false,
            },
            job: super::JobNames { array: None, user: "alice".into(), name: "x".into() },
            files: Default::default(),
            partial: Default::default(),
        };
        assert_eq!(sink.expand("o-%J-%s-%n-%t-%N", 3), "o-42.3-3-1-3-n2");
        assert_eq!(sink.expand("%5j.%3t.%2n.%4J", 2), "00042.002.01.0042.3");
        // Cyclic: task 2 on the first node, 3 on the second.
        sink.started.cyclic = true;
        sink.started.first_task = vec![0, 1];
        assert_eq!(sink.expand("%t-%N", 2), "2-n1");
        assert_eq!(sink.expand("%t-%n", 3), "3-1");
    }

    #[test]
    fn labels_prefix_every_line_with_the_task_id_padded_to_the_widest() {
        assert_eq!(label(b"a\nb\n", 3, 2), b" 3: a\n 3: b\n");
        assert_eq!(label(b"x\n", 0, 1), b"0: x\n");
    }
}
