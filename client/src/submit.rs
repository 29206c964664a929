//! `quorum submit`: options from the command line and from `#SBATCH` lines in a batch script,
//! validated and turned into the API's job spec. Command-line options win over the script's, as
//! with sbatch. Every error names the bad value, and for a script line, the line.

use std::path::{Path, PathBuf};

use clap::Parser;
use quorum_model::parse;
use quorum_proto::api;

/// `--nodes`: a count, or Slurm's `MIN-MAX` range, of which Quorum allocates the minimum (it
/// fixes a job's node count at submit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeCount {
    pub min: u32,
    pub max: u32,
}

impl NodeCount {
    pub fn exact(n: u32) -> NodeCount {
        NodeCount { min: n, max: n }
    }
}

impl std::str::FromStr for NodeCount {
    type Err = String;

    fn from_str(s: &str) -> Result<NodeCount, String> {
        let bad = || format!("'{s}' is not a node count (N, or MIN-MAX)");
        let n = |t: &str| t.trim().parse::<u32>().map_err(|_| bad());
        match s.split_once('-') {
            None => n(s).map(NodeCount::exact),
            Some((a, b)) => {
                let (min, max) = (n(a)?, n(b)?);
                if min > max {
                    return Err(bad());
                }
                Ok(NodeCount { min, max })
            }
        }
    }
}

// The options a job takes, on the command line or in `#SBATCH` lines. (Not a doc comment:
// clap would make it the about of each command that flattens these, over the command's own,
// when `quorum`'s subcommands are built on demand.)
#[derive(clap::Args, Debug, Default, Clone)]
pub struct SubmitOpts {
    /// Job name.
    #[arg(short = 'J', long = "job-name")]
    pub job_name: Option<String>,
    /// Partition (default: the cluster's default partition).
    #[arg(short = 'p', long)]
    pub partition: Option<String>,
    /// Number of nodes, all allocated together: N, or MIN-MAX (the job gets MIN).
    #[arg(short = 'N', long)]
    pub nodes: Option<NodeCount>,
    /// Number of tasks (default: one per node).
    #[arg(short = 'n', long)]
    pub ntasks: Option<u32>,
    /// CPUs per task.
    #[arg(short = 'c', long = "cpus-per-task")]
    pub cpus_per_task: Option<u32>,
    /// Tasks on each node: with --nodes, the job's tasks are the nodes times this; with
    /// --ntasks, the nodes are as many as the tasks need at this many each.
    #[arg(long = "ntasks-per-node", visible_alias = "tasks-per-node")]
    pub ntasks_per_node: Option<u32>,
    /// Memory per node, like 4G or 512M (a number alone is megabytes).
    #[arg(long)]
    pub mem: Option<String>,
    /// Memory per CPU: each node gets this times the CPUs of its tasks.
    #[arg(long)]
    pub mem_per_cpu: Option<String>,
    /// Memory per GPU: each node gets this times its GPUs.
    #[arg(long)]
    pub mem_per_gpu: Option<String>,
    /// GPUs for the whole job: [type:]N, spread evenly over the nodes.
    #[arg(short = 'G', long)]
    pub gpus: Option<String>,
    /// GPUs on each node: [type:]N.
    #[arg(long)]
    pub gpus_per_node: Option<String>,
    /// GPUs for each task: [type:]N; a node gets this times its tasks.
    #[arg(long)]
    pub gpus_per_task: Option<String>,
    /// Generic resources per node: gpu:[type:]N.
    #[arg(long)]
    pub gres: Option<String>,
    /// Time limit: minutes, [H:]M:S, or D-H[:M[:S]].
    #[arg(short = 't', long)]
    pub time: Option<String>,
    /// Standard output file (default quorum-%j.out in the working directory).
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// Standard error file (default: with the output).
    #[arg(short = 'e', long)]
    pub error: Option<String>,
    /// Working directory (default: where you submit from).
    #[arg(short = 'D', long)]
    pub chdir: Option<String>,
    /// Wait for other jobs: afterok:ID[:ID...],afterany:ID,afternotok:ID,after:ID[+MINUTES],
    /// aftercorr:ARRAY,singleton; joined by ',' (all) or '?' (any).
    #[arg(short = 'd', long)]
    pub dependency: Option<String>,
    /// Not before: now+COUNT[seconds|minutes|hours|days|weeks], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]],
    /// MM/DD[/YY], today, tomorrow, midnight, noon, ... (local time, as Slurm's).
    #[arg(long)]
    pub begin: Option<String>,
    /// Submit held; `quorum release` lets it run.
    #[arg(short = 'H', long)]
    pub hold: bool,
    /// Quality of service.
    #[arg(short = 'q', long)]
    pub qos: Option<String>,
    /// Account to charge (default: your first account).
    #[arg(short = 'A', long)]
    pub account: Option<String>,
    /// Lower the priority by this much (negative: raise it; root only).
    #[arg(long, allow_hyphen_values = true)]
    pub nice: Option<i32>,
    /// This priority instead of the computed one (operators and administrators only).
    #[arg(long)]
    pub priority: Option<String>,
    /// Submit the job as this user, by name or uid (root only).
    #[arg(long)]
    pub uid: Option<String>,
    /// Run the job with this group, by name or gid, as its primary group (root only).
    #[arg(long)]
    pub gid: Option<String>,
    /// Licenses the job holds while it runs: name[:count][,name[:count]...].
    #[arg(short = 'L', long)]
    pub licenses: Option<String>,
    /// Node features required, `a&b` or `a,b`.
    #[arg(short = 'C', long)]
    pub constraint: Option<String>,
    /// Whole nodes only (`--exclusive=user` or `=mcs`, which Slurm lets share a node among one
    /// user's jobs, also gives whole nodes here).
    #[arg(
        long,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_value = "false",
        default_missing_value = "true",
        value_parser = parse_exclusive
    )]
    pub exclusive: bool,
    /// Share CPUs with other jobs where the partition lets jobs that ask do so
    /// (`OverSubscribe=YES`); a partition with `FORCE` shares them anyway, one with `NO` never.
    /// Memory and GPUs are never shared.
    #[arg(short = 's', long, conflicts_with = "exclusive")]
    pub oversubscribe: bool,
    /// Allocate as if one task ran on each node: --cpus-per-task CPUs per node, whatever
    /// --ntasks says (the tasks then share them); steps inside overcommit too (SLURM_OVERCOMMIT).
    #[arg(short = 'O', long)]
    pub overcommit: bool,
    /// How the job's steps number their tasks over their nodes: block or cyclic (Slurm's
    /// `NODES[:SOCKETS[:CORES]]`; see srun). The job gets it as SLURM_DISTRIBUTION, which srun
    /// reads.
    #[arg(short = 'm', long)]
    pub distribution: Option<String>,
    /// Back to the queue if a node it runs on fails (default: it ends NODE_FAIL).
    #[arg(long, conflicts_with = "no_requeue")]
    pub requeue: bool,
    /// End NODE_FAIL if a node it runs on fails (the default; overrides a script's --requeue).
    #[arg(long)]
    pub no_requeue: bool,
    /// `[B:]SIG[@SECONDS]`: send SIG that many seconds (60) before the time limit, to the batch
    /// shell only with `B:`.
    #[arg(long)]
    pub signal: Option<String>,
    /// Which of your environment variables the job gets: `ALL` (the default), `NONE` (only
    /// `SLURM_*` and `QUORUM_*` ones), or a list of names and `NAME=value` settings, with `ALL` in
    /// the list to keep everything else too (`ALL,OMP_NUM_THREADS=4`).
    #[arg(long)]
    pub export: Option<String>,
    /// A job array: one job per task id, such as `0-15`, `1,3,5`, `0-99:10`, with `%N` at the
    /// end to run at most N at once (`0-15%4`).
    #[arg(short = 'a', long)]
    pub array: Option<String>,
    /// Run the script (or command) on every node of the allocation, each copy its node's rank
    /// in `SLURM_PROCID`, instead of once on the first node with `srun` starting what runs on
    /// the others (the default, as Slurm does).
    #[arg(long)]
    pub every_node: bool,
    /// Nodes the job must not run on: a host list, or a file of names when it has a `/`.
    #[arg(short = 'x', long)]
    pub exclude: Option<String>,
    /// The nodes the job runs on, each of them: a host list, or a file of names when it has a
    /// `/`. The job asks for as many nodes as are listed.
    #[arg(short = 'w', long)]
    pub nodelist: Option<String>,
    /// CPUs for each GPU: a node's tasks share this times its GPUs.
    #[arg(long)]
    pub cpus_per_gpu: Option<u32>,
    /// Tasks for each GPU: the job runs this times its GPUs tasks.
    #[arg(long)]
    pub ntasks_per_gpu: Option<u32>,
    /// A comment, shown with the job (squeue %k, sacct Comment, scontrol show job).
    #[arg(long)]
    pub comment: Option<String>,
    /// A workload characterization key, recorded and shown with the job.
    #[arg(long)]
    pub wckey: Option<String>,
    /// Run only inside this advance reservation (`scontrol show reservation` lists them).
    #[arg(long)]
    pub reservation: Option<String>,
    /// Events to mail about (`BEGIN`, `END`, `FAIL`, `REQUEUE`, `TIME_LIMIT`, `ARRAY_TASKS`,
    /// `ALL`, `NONE`): mailed through the controllers' `mail_program`, once per change the
    /// leader sees; recorded and shown, and not mailed, where no `mail_program` is configured.
    /// `TIME_LIMIT_50`/`_80`/`_90`, `INVALID_DEPEND` and `STAGE_OUT` are accepted, never mailed.
    #[arg(long)]
    pub mail_type: Option<String>,
    /// Who gets the job's mail (the submitting user by default).
    #[arg(long)]
    pub mail_user: Option<String>,
    /// `truncate` (the default) or `append`: how the output files are opened.
    #[arg(long)]
    pub open_mode: Option<String>,
    /// Wait for the job to end, and exit with its exit code (`sbatch -W`).
    #[arg(short = 'W', long)]
    pub wait: bool,
    /// Accepted: the job gets the submitter's environment already (`--export=ALL`).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    pub get_user_env: Option<String>,
    /// Accepted: a job's nodes all start it together.
    #[arg(long)]
    pub wait_all_nodes: Option<String>,
    /// `yes`: cancel the job once its dependency can never be met (reason
    /// `DependencyNeverSatisfied`); `no` (the default): it waits with that reason until cancelled.
    #[arg(long)]
    pub kill_on_invalid_dep: Option<String>,
    #[command(flatten)]
    pub container: crate::container::ContainerOpts,
    #[command(flatten)]
    pub tolerated: Tolerated,
}

/// Declares a struct `$name` of the options Quorum understands and accepts but cannot honour on
/// this cluster (the hardware layout or configuration they need is not modelled): each is
/// accepted with a warning that names it, so that scripts written for other sites run. `sbatch`'s
/// here, `srun`'s in the CLI.
#[macro_export]
macro_rules! tolerated {
    ($name:ident { $( $(#[$attr:meta])* $field:ident: $what:literal => $why:literal; )* }) => {
        #[derive(clap::Args, Debug, Default, Clone)]
        pub struct $name {
            $( $(#[$attr])* pub $field: Option<String>, )*
        }

        impl $name {
            /// `self`, with every option it lacks taken from `other`.
            #[allow(dead_code)]
            fn or(self, other: $name) -> $name {
                $name { $( $field: self.$field.or(other.$field), )* }
            }

            /// One warning for each option given that is accepted but not honoured.
            pub fn warnings(&self) -> Vec<String> {
                let mut out = Vec::new();
                $( if let Some(v) = &self.$field {
                    let shown = if v.is_empty() { String::new() } else { format!("={v}") };
                    out.push(format!("{}{shown} is accepted but not honoured: {}", $what, $why));
                } )*
                out
            }
        }
    };
}

tolerated! { Tolerated {
    /// Accepted, not honoured (no CPU binding hints).
    #[arg(long)]
    hint: "--hint" => "tasks are not bound to cores or threads here";
    /// Accepted, not honoured (hardware threads are not modelled).
    #[arg(long)]
    threads_per_core: "--threads-per-core" => "nodes offer CPUs, without sockets, cores or threads";
    /// Accepted, not honoured (sockets and cores are not modelled).
    #[arg(long)]
    cores_per_socket: "--cores-per-socket" => "nodes offer CPUs, without sockets, cores or threads";
    /// Accepted, not honoured (sockets are not modelled).
    #[arg(long)]
    sockets_per_node: "--sockets-per-node" => "nodes offer CPUs, without sockets, cores or threads";
    /// Accepted, not honoured (no GPU binding).
    #[arg(long)]
    gpu_bind: "--gpu-bind" => "each task sees all of its node's GPUs of the job";
    /// Accepted, not honoured (no memory binding).
    #[arg(long)]
    mem_bind: "--mem-bind" => "memory is not bound to NUMA nodes";
    /// Accepted, not honoured (no network topology is configured).
    #[arg(long)]
    switches: "--switches" => "no switch topology limits placement here";
    /// Accepted, not honoured (CPU frequencies are not managed).
    #[arg(long)]
    cpu_freq: "--cpu-freq" => "CPU frequencies are not managed";
    /// Accepted, not honoured (the job runs with its --time).
    #[arg(long)]
    time_min: "--time-min" => "the job is planned and limited by its --time";
    /// Accepted, not honoured (no deadline is enforced).
    #[arg(long)]
    deadline: "--deadline" => "the job is not cancelled when it cannot end in time";
    /// Accepted, not honoured (usage is not sampled).
    #[arg(long)]
    acctg_freq: "--acctg-freq" => "usage is not sampled";
    /// Accepted, not honoured (no profiling).
    #[arg(long)]
    profile: "--profile" => "jobs are not profiled";
    /// Accepted, not honoured (limits come from the job's request).
    #[arg(long, num_args = 0..=1, default_missing_value = "", require_equals = true)]
    propagate: "--propagate" => "resource limits come from the job's request, not the submit shell";
    /// Accepted, not honoured (each node's CPUs are what the job asks for).
    #[arg(long)]
    mincpus: "--mincpus" => "each node gives the job the CPUs its tasks ask for";
    /// Accepted, not honoured (local disk is not modelled).
    #[arg(long)]
    tmp: "--tmp" => "nodes' local disk is not modelled";
    /// Accepted, not honoured (only the local cluster).
    #[arg(short = 'M', long)]
    clusters: "--clusters" => "jobs go to this cluster";
    /// Accepted, not honoured (hardware threads are not modelled).
    #[arg(long)]
    ntasks_per_core: "--ntasks-per-core" => "nodes offer CPUs, without sockets, cores or threads";
    /// Accepted, not honoured (tasks are laid out in blocks).
    #[arg(long, num_args = 0..=1, default_missing_value = "", require_equals = true)]
    spread_job: "--spread-job" => "tasks are laid out in blocks, filling each node in turn";
    /// Accepted, not honoured (a job gets exactly the nodes it asks for).
    #[arg(long, num_args = 0..=1, default_missing_value = "", require_equals = true)]
    use_min_nodes: "--use-min-nodes" => "a job gets exactly the nodes it asks for";
    /// Accepted, not honoured (GPUs are not bound to sockets).
    #[arg(long)]
    gres_flags: "--gres-flags" => "GPUs are not bound to sockets or cores";
    /// Accepted, not honoured (nodes are not rebooted for jobs).
    #[arg(long, num_args = 0..=1, default_missing_value = "", require_equals = true)]
    reboot: "--reboot" => "nodes are not rebooted for jobs";
    /// Accepted, not honoured (nodes are not rebooted for jobs).
    #[arg(long)]
    delay_boot: "--delay-boot" => "nodes are not rebooted for jobs";
    /// Accepted, not honoured (no network resources are managed).
    #[arg(long)]
    network: "--network" => "no network resources are managed";
    /// Accepted, not honoured (no burst buffers).
    #[arg(long)]
    bb: "--bb" => "this cluster has no burst buffers";
} }

#[derive(Parser, Debug)]
#[command(no_binary_name = true, disable_help_flag = true, disable_version_flag = true, infer_long_args = true)]
struct SbatchLine {
    #[command(flatten)]
    opts: SubmitOpts,
}

impl SubmitOpts {
    /// `self`, with every option it lacks taken from `other`.
    fn or(self, other: SubmitOpts) -> SubmitOpts {
        SubmitOpts {
            job_name: self.job_name.or(other.job_name),
            partition: self.partition.or(other.partition),
            nodes: self.nodes.or(other.nodes),
            ntasks: self.ntasks.or(other.ntasks),
            cpus_per_task: self.cpus_per_task.or(other.cpus_per_task),
            ntasks_per_node: self.ntasks_per_node.or(other.ntasks_per_node),
            mem: self.mem.or(other.mem),
            mem_per_cpu: self.mem_per_cpu.or(other.mem_per_cpu),
            mem_per_gpu: self.mem_per_gpu.or(other.mem_per_gpu),
            gpus: self.gpus.or(other.gpus),
            gpus_per_node: self.gpus_per_node.or(other.gpus_per_node),
            gpus_per_task: self.gpus_per_task.or(other.gpus_per_task),
            gres: self.gres.or(other.gres),
            time: self.time.or(other.time),
            output: self.output.or(other.output),
            error: self.error.or(other.error),
            chdir: self.chdir.or(other.chdir),
            dependency: self.dependency.or(other.dependency),
            begin: self.begin.or(other.begin),
            hold: self.hold || other.hold,
            qos: self.qos.or(other.qos),
            account: self.account.or(other.account),
            nice: self.nice.or(other.nice),
            priority: self.priority.or(other.priority),
            uid: self.uid.or(other.uid),
            gid: self.gid.or(other.gid),
            licenses: self.licenses.or(other.licenses),
            constraint: self.constraint.or(other.constraint),
            // The command line's choice between sharing and whole nodes wins over the script's.
            exclusive: self.exclusive || (other.exclusive && !self.oversubscribe),
            oversubscribe: self.oversubscribe || (other.oversubscribe && !self.exclusive),
            overcommit: self.overcommit || other.overcommit,
            distribution: self.distribution.or(other.distribution),
            requeue: self.requeue || (other.requeue && !self.no_requeue),
            no_requeue: self.no_requeue || (other.no_requeue && !self.requeue),
            signal: self.signal.or(other.signal),
            export: self.export.or(other.export),
            array: self.array.or(other.array),
            every_node: self.every_node || other.every_node,
            exclude: self.exclude.or(other.exclude),
            nodelist: self.nodelist.or(other.nodelist),
            cpus_per_gpu: self.cpus_per_gpu.or(other.cpus_per_gpu),
            ntasks_per_gpu: self.ntasks_per_gpu.or(other.ntasks_per_gpu),
            comment: self.comment.or(other.comment),
            wckey: self.wckey.or(other.wckey),
            reservation: self.reservation.or(other.reservation),
            mail_type: self.mail_type.or(other.mail_type),
            mail_user: self.mail_user.or(other.mail_user),
            open_mode: self.open_mode.or(other.open_mode),
            wait: self.wait || other.wait,
            get_user_env: self.get_user_env.or(other.get_user_env),
            wait_all_nodes: self.wait_all_nodes.or(other.wait_all_nodes),
            kill_on_invalid_dep: self.kill_on_invalid_dep.or(other.kill_on_invalid_dep),
            container: self.container.or(other.container),
            tolerated: self.tolerated.or(other.tolerated),
        }
    }

    /// `--mem=0`: all of each node's memory.
    pub fn mem_is_all(&self) -> bool {
        self.mem.as_deref().is_some_and(|m| m.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic()) == "0")
    }

    /// Checks the values that have a format, so that a bad one is reported where it was written.
    fn check_values(&self) -> Result<(), String> {
        // `--mem=0` (all of a node's memory) is resolved against the cluster's nodes by the
        // submitter (`mem_is_all`).
        let all = self.mem_is_all();
        for m in [&self.mem, &self.mem_per_cpu, &self.mem_per_gpu].into_iter().flatten().filter(|_| !all) {
            parse::parse_mem_mb(m).map_err(|e| e.to_string())?;
        }
        if let Some(t) = &self.time {
            parse::parse_time_limit(t).map_err(|e| e.to_string())?;
        }
        for (what, g) in
            [("--gpus", &self.gpus), ("--gpus-per-node", &self.gpus_per_node), ("--gpus-per-task", &self.gpus_per_task)]
        {
            if let Some(g) = g {
                parse_gpu_count(g, what)?;
            }
        }
        if let Some(g) = &self.gres {
            parse_gres(g)?;
        }
        if let Some(d) = &self.dependency {
            quorum_model::parse_dependencies(d)?;
        }
        if let Some(b) = &self.begin {
            parse_begin(b, 0)?;
        }
        if let Some(e) = &self.export {
            apply_export(e, Vec::new())?;
        }
        if let Some(a) = &self.array {
            quorum_model::ArraySpec::parse(a)?;
        }
        if let Some(m) = &self.open_mode {
            if !["append", "a", "truncate", "t"].contains(&m.to_ascii_lowercase().as_str()) {
                return Err(format!("invalid --open-mode '{m}': give append or truncate"));
            }
        }
        for (what, v) in [
            ("--nodes", self.nodes.map(|n| n.min)),
            ("--ntasks", self.ntasks),
            ("--cpus-per-task", self.cpus_per_task),
            ("--ntasks-per-node", self.ntasks_per_node),
            ("--cpus-per-gpu", self.cpus_per_gpu),
            ("--ntasks-per-gpu", self.ntasks_per_gpu),
        ] {
            if v == Some(0) {
                return Err(format!("invalid {what} '0': must be at least 1"));
            }
        }
        Ok(())
    }
}

/// The environment the job gets from the submit environment `env`, as `--export` says.
pub fn apply_export(export: &str, env: Vec<(String, String)>) -> Result<Vec<(String, String)>, String> {
    let ours = |name: &str| name.starts_with("SLURM_") || name.starts_with("QUORUM_");
    match export.trim() {
        "ALL" | "" => return Ok(env),
        "NONE" => return Ok(env.into_iter().filter(|(k, _)| ours(k)).collect()),
        _ => {}
    }
    let mut items = Vec::new();
    for item in export.split(',').map(str::trim) {
        let (name, value) = match item.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (item, None),
        };
        if item == "ALL" || item == "NONE" {
            items.push((item, None));
            continue;
        }
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "invalid --export '{export}': '{item}' is not a variable name or NAME=value (give ALL, NONE or a list)"
            ));
        }
        items.push((name, value));
    }
    if items.iter().any(|(n, _)| *n == "NONE") {
        return Err(format!("invalid --export '{export}': NONE cannot be part of a list"));
    }
    let all = items.iter().any(|(n, _)| *n == "ALL");
    let mut out: Vec<(String, String)> =
        if all { env.clone() } else { env.iter().filter(|(k, _)| ours(k)).cloned().collect() };
    for (name, value) in items.into_iter().filter(|(n, _)| *n != "ALL") {
        let value = match value {
            Some(v) => Some(v.to_string()),
            None => env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
        };
        out.retain(|(k, _)| k != name);
        if let Some(v) = value {
            out.push((name.to_string(), v));
        }
    }
    Ok(out)
}

/// `--exclusive[=user|mcs|topo]`: a whole node in every case.
fn parse_exclusive(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "user" | "mcs" | "topo" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("'{other}' is not one of user, mcs or topo")),
    }
}

/// `[type:]N` → (type, N).
fn parse_gpu_count(value: &str, what: &str) -> Result<(Option<String>, u32), String> {
    let (ty, n) = match value.rsplit_once(':') {
        Some((t, n)) => (Some(t.to_string()), n),
        None => (None, value),
    };
    let n: u32 = n.parse().map_err(|_| format!("invalid {what} '{value}': expected [type:]count such as h100:2"))?;
    if ty.as_deref().is_some_and(|t| t.is_empty() || t.contains(':')) {
        return Err(format!("invalid {what} '{value}': expected [type:]count such as h100:2"));
    }
    Ok((ty, n))
}

/// `gpu:[type:]N` → (type, N per node).
fn parse_gres(value: &str) -> Result<(Option<String>, u32), String> {
    match value.strip_prefix("gpu:") {
        Some(rest) => parse_gpu_count(rest, "--gres"),
        None if value == "gpu" => Ok((None, 1)),
        None => Err(format!("invalid --gres '{value}': only gpu:[type:]count is supported")),
    }
}

/// Parses `--begin` as Slurm does, in local time; returns milliseconds since the epoch:
/// - `now`, `now+COUNT[UNIT]` (`seconds` by default, `minutes`, `hours`, `days`, `weeks`, each
///   also singular or as `s`, `m`, `h`, `d`, `w`), `now-COUNT...` (a time past: now);
/// - `today`, `tomorrow` (its midnight), `midnight`, `noon`, `fika` (15:00), `teatime` (16:00);
/// - `HH:MM[:SS][AM|PM]`: that time today, or tomorrow when it has passed;
/// - `YYYY-MM-DD[THH:MM[:SS]]`, `MMDD[YY]`, `MM/DD[/YY]`, `MM.DD[.YY]`: that day's midnight.
pub fn parse_begin(value: &str, now_ms: u64) -> Result<u64, String> {
    let bad = || {
        format!(
            "invalid --begin '{value}': expected now[+COUNT[seconds|minutes|hours|days|weeks]], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], MMDDYY, today, tomorrow, midnight, noon, fika or teatime"
        )
    };
    let v = value.trim().to_ascii_lowercase();
    let now_s = i64::try_from(now_ms / 1000).map_err(|_| bad())?;
    let ms = |secs: i64| u64::try_from(secs.max(now_s)).ok().and_then(|s| s.checked_mul(1000)).ok_or_else(bad);
    if let Some(rest) = v.strip_prefix("now") {
        if rest.is_empty() {
            return Ok(now_ms);
        }
        let (sign, rest) = match (rest.strip_prefix('+'), rest.strip_prefix('-')) {
            (Some(r), _) => (1, r),
            (_, Some(r)) => (-1, r),
            _ => return Err(bad()),
        };
        let (num, unit) = rest.split_at(rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len()));
        let n: i64 = num.parse().map_err(|_| bad())?;
        let unit: i64 = match unit {
            "" | "s" | "second" | "seconds" => 1,
            "m" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86400,
            "w" | "week" | "weeks" => 7 * 86400,
            _ => return Err(bad()),
        };
        let secs = n.checked_mul(unit).and_then(|d| now_s.checked_add(sign * d)).ok_or_else(bad)?;
        // A time already past is now (the job may start at once), as Slurm takes it.
        return Ok(if sign < 0 { now_ms } else { ms(secs)? });
    }
    let today = local_date(now_s).ok_or_else(bad)?;
    let at =
        |(y, m, d): (i64, i64, i64), (hh, mm, ss): (i64, i64, i64)| local_time(y, m, d, hh, mm, ss).ok_or_else(bad);
    let next = |(hh, mm, ss): (i64, i64, i64)| -> Result<u64, String> {
        let t = at(today, (hh, mm, ss))?;
        // A time of day already past today is tomorrow's.
        ms(if t <= now_s { at((today.0, today.1, today.2 + 1), (hh, mm, ss))? } else { t })
    };
    match v.as_str() {
        "today" => return Ok(now_ms),
        "tomorrow" | "midnight" => return ms(at((today.0, today.1, today.2 + 1), (0, 0, 0))?),
        "noon" => return next((12, 0, 0)),
        "fika" => return next((15, 0, 0)),
        "teatime" => return next((16, 0, 0)),
        _ => {}
    }
    let number = |t: &str| -> Result<i64, String> {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) || t.len() > 4 {
            return Err(bad());
        }
        t.parse().map_err(|_| bad())
    };
    let clock = |t: &str| -> Result<(i64, i64, i64), String> {
        let (t, shift) = match (t.strip_suffix("am"), t.strip_suffix("pm")) {
            (Some(t), _) => (t, Some(0)),
            (_, Some(t)) => (t, Some(12)),
            _ => (t, None),
        };
        let parts: Vec<i64> = t.split(':').map(number).collect::<Result<_, _>>()?;
        let (mut hh, mm, ss) = match parts[..] {
            [h, m] => (h, m, 0),
            [h, m, s] => (h, m, s),
            _ => return Err(bad()),
        };
        if let Some(shift) = shift {
            if !(1..=12).contains(&hh) {
                return Err(bad());
            }
            hh = hh % 12 + shift;
        }
        if !(0..24).contains(&hh) || !(0..60).contains(&mm) || !(0..61).contains(&ss) {
            return Err(bad());
        }
        Ok((hh, mm, ss))
    };
    let year = |yy: i64| if yy < 100 { 2000 + yy } else { yy };
    let date = |d: &str| -> Result<(i64, i64, i64), String> {
        let ymd = if d.contains('-') {
            match d.split('-').map(number).collect::<Result<Vec<_>, _>>()?[..] {
                [y, m, day] => (y, m, day),
                _ => return Err(bad()),
            }
        } else if let Some(sep) = ['/', '.'].into_iter().find(|c| d.contains(*c)) {
            match d.split(sep).map(number).collect::<Result<Vec<_>, _>>()?[..] {
                [m, day] => (today.0, m, day),
                [m, day, y] => (year(y), m, day),
                _ => return Err(bad()),
            }
        } else if (d.len() == 4 || d.len() == 6) && d.bytes().all(|b| b.is_ascii_digit()) {
            let n = |r: std::ops::Range<usize>| number(&d[r]);
            (if d.len() == 6 { year(n(4..6)?) } else { today.0 }, n(0..2)?, n(2..4)?)
        } else {
            return Err(bad());
        };
        if !(1..=12).contains(&ymd.1) || !(1..=31).contains(&ymd.2) {
            return Err(bad());
        }
        Ok(ymd)
    };
    if v.contains(':') && !v.contains('t') {
        return next(clock(&v)?);
    }
    match v.split_once('t') {
        Some((d, t)) => ms(at(date(d)?, clock(t)?)?),
        None => ms(at(date(&v)?, (0, 0, 0))?),
    }
}

/// The local calendar date at `secs` since the epoch.
fn local_date(secs: i64) -> Option<(i64, i64, i64)> {
    let t = secs as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`, which lives here.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return None;
    }
    Some((i64::from(tm.tm_year) + 1900, i64::from(tm.tm_mon) + 1, i64::from(tm.tm_mday)))
}

/// Seconds since the epoch of a local date and time; days past the month's end roll over
/// (the 32nd is the next month's 1st), as mktime(3) normalizes them.
fn local_time(y: i64, m: i64, d: i64, hh: i64, mm: i64, ss: i64) -> Option<libc::time_t> {
    let int = |v: i64| libc::c_int::try_from(v).ok();
    // SAFETY: tm is plain data; mktime reads and normalizes it and touches nothing else.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    (tm.tm_year, tm.tm_mon, tm.tm_mday) = (int(y - 1900)?, int(m - 1)?, int(d)?);
    (tm.tm_hour, tm.tm_min, tm.tm_sec, tm.tm_isdst) = (int(hh)?, int(mm)?, int(ss)?, -1);
    let t = unsafe { libc::mktime(&mut tm) };
    (t != -1).then_some(t)
}

/// Splits a directive line into words, honouring single and double quotes and stopping at a
/// `#` that starts a word (a trailing comment).
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None if c == '#' && !in_word => break,
            None => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err("unterminated quote".into());
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// The options in a script's `#SBATCH` (or `#QUORUM`) lines, read like sbatch does: from the
/// top, until the first line that is neither blank nor a comment; a heterogeneous job's, those
/// of its component 0 (before the first `#SBATCH hetjob`).
pub fn script_options(path: &str, script: &str) -> Result<SubmitOpts, String> {
    Ok(script_sections(path, script)?.swap_remove(0))
}

/// Whether a directive line separates the components of a heterogeneous job (`hetjob`, or
/// `packjob` as Slurm before 20.02 wrote it).
fn is_separator(words: &[String]) -> bool {
    matches!(words, [w] if w == "hetjob" || w == "packjob")
}

/// The options of each component a script's `#SBATCH` lines give: one section, or one per
/// component of a heterogeneous job (separated by `#SBATCH hetjob` lines).
pub fn script_sections(path: &str, script: &str) -> Result<Vec<SubmitOpts>, String> {
    let mut sections = Vec::new();
    let mut opts = SubmitOpts::default();
    for (i, line) in script.lines().enumerate() {
        let trimmed = line.trim();
        if i == 0 && trimmed.starts_with("#!") {
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        if !trimmed.starts_with('#') {
            break;
        }
        let rest = match trimmed.strip_prefix("#SBATCH").or_else(|| trimmed.strip_prefix("#QUORUM")) {
            Some(r) if r.is_empty() || r.starts_with(char::is_whitespace) => r,
            _ => continue,
        };
        let at = |msg: String| format!("{path} line {}: '{trimmed}': {msg}", i + 1);
        let tokens = words(rest).map_err(at)?;
        if is_separator(&tokens) {
            sections.push(std::mem::take(&mut opts));
            continue;
        }
        let parsed = SbatchLine::try_parse_from(&tokens).map_err(|e| {
            let msg = e.to_string();
            at(msg.lines().next().unwrap_or("invalid option").trim_start_matches("error: ").to_string())
        })?;
        parsed.opts.check_values().map_err(at)?;
        // A later line overrides an earlier one.
        opts = parsed.opts.or(opts);
    }
    sections.push(opts);
    Ok(sections)
}

/// The options of a heterogeneous job's components after the first: each component's own
/// (`cli[k-1]` from `sbatch A : B`, then its script section), then what Slurm carries over from
/// the component before it (`--mem`, `--exclude`, its partition, and what is the job's: account,
/// QOS). Empty for a job of one component. Each component may have a partition of its own, as
/// on Slurm; one that names another account or QOS than component 0 is refused: they are the
/// job's here.
pub fn component_options(
    first: &SubmitOpts,
    cli: Vec<SubmitOpts>,
    script: Vec<SubmitOpts>,
) -> Result<Vec<SubmitOpts>, String> {
    let count = cli.len().max(script.len());
    let (mut cli, mut script) = (cli.into_iter(), script.into_iter());
    let mut previous = first.clone();
    let mut out = Vec::new();
    for k in 1..=count {
        let own = cli.next().unwrap_or_default().or(script.next().unwrap_or_default());
        let carried = SubmitOpts {
            mem: previous.mem.clone().filter(|_| own.mem_per_cpu.is_none() && own.mem_per_gpu.is_none()),
            exclude: previous.exclude.clone(),
            partition: previous.partition.clone(),
            account: previous.account.clone(),
            qos: previous.qos.clone(),
            ..SubmitOpts::default()
        };
        let merged = own.or(carried);
        for (what, mine, job) in [("account", &merged.account, &first.account), ("qos", &merged.qos, &first.qos)] {
            if mine != job {
                return Err(format!(
                    "component {k} of the heterogeneous job asks for {what} '{}', component 0 for '{}': the components of a job share one {what} here",
                    mine.as_deref().unwrap_or("(default)"),
                    job.as_deref().unwrap_or("(default)")
                ));
            }
        }
        previous = merged.clone();
        out.push(merged);
    }
    Ok(out)
}

/// A component's spec as the submit carries it: what it asks for (the rest is the job's).
pub fn component_spec(opts: SubmitOpts, cwd: &Path) -> Result<api::HetComponent, String> {
    let built = build_spec(opts, Payload::Command(vec!["true".into()]), cwd, Vec::new())?;
    let s = built.spec;
    Ok(api::HetComponent {
        nodes: s.nodes,
        ntasks: s.ntasks,
        cpus_per_task: s.cpus_per_task,
        mem_per_node_mb: s.mem_per_node_mb,
        gpus_per_node: s.gpus_per_node,
        gpu_type: s.gpu_type,
        constraint: s.constraint,
        constraint_any: s.constraint_any,
        constraint_same: s.constraint_same,
        constraint_counts: s.constraint_counts,
        exclusive: s.exclusive,
        exclude: s.exclude,
        nodelist: s.nodelist,
        partition: s.partition,
    })
}

/// This host's name, as the kernel has it.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// The environment a job submitted from here starts from: this process's, with
/// `SLURM_SUBMIT_HOST` naming this host (Slurm tells a job where it was submitted from,
/// whatever `--export` says, and not where an enclosing job was), without the shell's
/// credentials ([`quorum_model::env::CREDENTIAL_VARIABLES`]), and with this process's umask
/// (`SLURM_UMASK`, as `sbatch` sends it) for the job's processes.
pub fn submit_environment() -> Vec<(String, String)> {
    let mut env = process_environment();
    env.retain(|(k, _)| k != "SLURM_SUBMIT_HOST");
    env.push(("SLURM_SUBMIT_HOST".into(), host_name()));
    env
}

/// This process's environment as a job or a step gets it: without credentials, with
/// `SLURM_UMASK` (this process's umask, unless the variable is set already, as Slurm's
/// commands do).
pub fn process_environment() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        std::env::vars().filter(|(k, _)| !quorum_model::env::is_credential(k)).collect();
    if !env.iter().any(|(k, _)| k == "SLURM_UMASK") {
        if let Some(mask) = process_umask() {
            env.push(("SLURM_UMASK".into(), format!("{mask:04o}")));
        }
    }
    env
}

/// This process's umask, from `/proc/self/status` (reading it with umask(2) would change it
/// for a moment under every thread).
fn process_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
}

/// What to run: a script file or a command line.
pub enum Payload {
    Script { path: String, text: String },
    Command(Vec<String>),
}

/// The options a submit of `payload` takes: `cli`'s, then its script's `#SBATCH` lines'.
pub fn merged_options(cli: &SubmitOpts, payload: &Payload) -> Result<SubmitOpts, String> {
    match payload {
        Payload::Script { path, text } => Ok(cli.clone().or(script_options(path, text)?)),
        Payload::Command(_) => Ok(cli.clone()),
    }
}

/// How many nodes `opts` asks for when it names only a task count (`-n 12`, without `-N` or
/// `--ntasks-per-node`): as Slurm chooses, the fewest nodes of `cpus_per_node` that hold its
/// tasks; `None` when it names its nodes, has one task, or no node holds even one task.
pub fn nodes_for_tasks(opts: &SubmitOpts, cpus_per_node: u32) -> Option<u32> {
    if opts.nodes.is_some() || opts.ntasks_per_node.is_some() || opts.nodelist.is_some() {
        return None;
    }
    let tasks = opts.ntasks.filter(|&t| t > 1)?;
    let per_node = cpus_per_node / opts.cpus_per_task.unwrap_or(1).max(1);
    (per_node > 0).then(|| tasks.div_ceil(per_node).max(counted_nodes(opts)))
}

/// A job spec built from the options, with what the submitter should be told.
#[derive(Debug)]
pub struct Built {
    pub spec: api::JobSpec,
    /// `--uid`: the user the job is submitted as (a name), for root.
    pub run_as: Option<String>,
    /// Options accepted but not honoured here, each named.
    pub warnings: Vec<String>,
    /// `--wait`: the submitter waits for the job to end.
    pub wait: bool,
}

/// Node names from a host list, or from a file of names (whitespace or commas between them)
/// when `value` has a `/`, as Slurm reads `--nodelist` and `--exclude`.
fn node_names(what: &str, value: &str, cwd: &Path) -> Result<Vec<String>, String> {
    let text = if value.contains('/') {
        let path = cwd.join(value);
        std::fs::read_to_string(&path)
            .map_err(|e| format!("invalid {what} '{value}': cannot read {}: {e}", path.display()))?
    } else {
        value.to_string()
    };
    let mut names = Vec::new();
    for list in text.split(|c: char| c.is_whitespace()).filter(|l| !l.is_empty()) {
        let expanded = quorum_model::hostlist::expand(list).map_err(|e| format!("invalid {what} '{value}': {e}"))?;
        for name in expanded {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    if names.is_empty() {
        return Err(format!("invalid {what} '{value}': no node names"));
    }
    Ok(names)
}

/// The job's total GPU count from `--gpus`, `--gres` or `--gpus-per-node` on `nodes` nodes
/// (for `--ntasks-per-gpu`, which sets the task count before the layout is known).
fn total_gpus(opts: &SubmitOpts, nodes: u32) -> Result<u32, String> {
    let per_node = |(_, n): (Option<String>, u32)| n.checked_mul(nodes).ok_or_else(|| "too many GPUs".to_string());
    if let Some(g) = &opts.gpus {
        Ok(parse_gpu_count(g, "--gpus")?.1)
    } else if let Some(g) = &opts.gres {
        per_node(parse_gres(g)?)
    } else if let Some(g) = &opts.gpus_per_node {
        per_node(parse_gpu_count(g, "--gpus-per-node")?)
    } else {
        Err("--ntasks-per-gpu needs GPUs from --gpus, --gres or --gpus-per-node".into())
    }
}

/// What `--constraint` asks for.
#[derive(Debug, Default, PartialEq)]
struct Constraint {
    features: Vec<String>,
    /// Joined by `|`: a node has one of them (nodes may differ).
    any: bool,
    /// `[a|b]`, Slurm's matching OR: every node has the same one.
    same: bool,
    /// `[a*2&b*4]`: this many nodes with each feature, one count per feature; empty without.
    counts: Vec<u32>,
}

impl Constraint {
    /// The nodes its counts add up to (`[a*2&b*4]`: 6); 0 without counts.
    fn counted_nodes(&self) -> u32 {
        self.counts.iter().fold(0u32, |a, &n| a.saturating_add(n))
    }
}

/// `--constraint`: features joined by `&` or `,` (a node has all of them), by `|` (a node has
/// at least one; nodes may differ), `[a|b]` (every node has the same one), or with node counts,
/// `a*2` and `[a*2&b*4]` (that many of the job's nodes have each feature). Other brackets, and
/// mixes of `&` with `|` or of counted with uncounted features, are refused, naming what is not
/// taken.
fn parse_constraint(c: &str) -> Result<Constraint, String> {
    let bad = |why: &str| Err(format!("invalid --constraint '{c}': {why}"));
    let trimmed = c.trim();
    let inner = trimmed.strip_prefix('[').and_then(|r| r.strip_suffix(']'));
    if trimmed.contains('*') {
        let terms = inner.unwrap_or(trimmed);
        if terms.contains(['[', ']']) {
            return bad("node counts (feature*N) take one pair of brackets around all of them, [a*2&b*4]");
        }
        if terms.contains('|') {
            return bad("features with node counts (feature*N) are joined by & only, not |");
        }
        let mut out = Constraint::default();
        for term in terms.split(['&', ',']).map(str::trim) {
            let Some((name, count)) = term.split_once('*') else {
                return bad(&format!(
                    "'{term}' has no node count: give every feature a count (rack1*2&rack2*4) or none"
                ));
            };
            let name = name.trim();
            if name.is_empty() {
                return bad("a feature name is missing before a node count");
            }
            match count.trim().parse::<u32>() {
                Ok(n) if n > 0 => {
                    out.features.push(name.to_string());
                    out.counts.push(n);
                }
                _ => return bad(&format!("'{count}' is not a node count (1 or more) for feature '{name}'")),
            }
        }
        return Ok(out);
    }
    if let Some(inner) = inner {
        if !inner.contains(['[', ']', '&', ',']) {
            let words = parse_constraint(inner)?.features;
            let same = words.len() > 1;
            return Ok(Constraint { features: words, any: same, same, counts: Vec::new() });
        }
    }
    if c.contains(['[', ']']) {
        return bad("brackets take one matching OR of features, [a|b], or node counts, [a*2&b*4]; join features by & (all of them) or | (any of them)");
    }
    let any = c.contains('|');
    if any && c.contains(['&', ',']) {
        return bad("join the features by & (all of them) or by | (any of them), not both");
    }
    let words: Vec<String> = c.split(['&', ',', '|']).map(|f| f.trim().to_string()).collect();
    if words.iter().any(|w| w.is_empty()) && words.len() > 1 {
        return bad("a feature name is missing between two operators");
    }
    Ok(Constraint {
        features: words.into_iter().filter(|w| !w.is_empty()).collect(),
        any,
        same: false,
        counts: Vec::new(),
    })
}

/// The nodes `--constraint` counts (`[a*2&b*4]` counts 6), for a job that does not give `--nodes`.
fn counted_nodes(opts: &SubmitOpts) -> u32 {
    opts.constraint.as_deref().and_then(|c| parse_constraint(c).ok()).map_or(0, |c| c.counted_nodes())
}

/// Builds the job spec from the merged options. `cwd` is where the user submits from.
pub fn build_spec(cli: SubmitOpts, payload: Payload, cwd: &Path, env: Vec<(String, String)>) -> Result<Built, String> {
    cli.check_values()?;
    let (opts, argv, script, default_name) = match payload {
        Payload::Script { path, text } => {
            let from_script = script_options(&path, &text)?;
            let name = Path::new(&path)
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_else(|| "script".into());
            (cli.or(from_script), Vec::new(), text, name)
        }
        Payload::Command(argv) => {
            if argv.is_empty() || argv[0].trim().is_empty() {
                return Err("empty command: give a script or -- COMMAND [ARGS...]".into());
            }
            let name = Path::new(&argv[0])
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_else(|| argv[0].clone());
            (cli, argv, String::new(), name)
        }
    };
    let exclude = opts.exclude.as_deref().map(|x| node_names("--exclude", x, cwd)).transpose()?.unwrap_or_default();
    let nodelist = opts.nodelist.as_deref().map(|w| node_names("--nodelist", w, cwd)).transpose()?.unwrap_or_default();
    if let Some(both) = nodelist.iter().find(|n| exclude.contains(n)) {
        return Err(format!("node '{both}' is both in --nodelist and in --exclude"));
    }
    let listed = u32::try_from(nodelist.len()).map_err(|_| "invalid --nodelist: too many nodes".to_string())?;
    let mut opts = opts;
    if listed > 0 {
        match opts.nodes.map(|n| n.min) {
            None => opts.nodes = Some(NodeCount::exact(listed)),
            Some(n) if n < listed => {
                return Err(format!(
                    "--nodes {n} with {listed} nodes in --nodelist: a job has every node it lists, so ask for at least as many nodes as you list"
                ))
            }
            Some(_) => {}
        }
    }
    let constraint = match opts.constraint.as_deref() {
        Some(c) => parse_constraint(c)?,
        None => Constraint::default(),
    };
    let counted = constraint.counted_nodes();
    if counted > 0 && listed > 0 {
        return Err(format!(
            "invalid --constraint '{}': node counts per feature and --nodelist cannot be given together",
            opts.constraint.as_deref().unwrap_or_default()
        ));
    }
    let per_node = opts.ntasks_per_node;
    let nodes = match (opts.nodes.map(|n| n.min), opts.ntasks, per_node) {
        (Some(n), _, _) if n < counted => {
            return Err(format!(
                "--nodes {n} with --constraint '{}', which counts {counted} nodes: ask for at least as many nodes as it counts",
                opts.constraint.as_deref().unwrap_or_default()
            ))
        }
        (Some(n), _, _) => n,
        // As Slurm does, a job that names no node count gets the nodes its features count.
        (None, Some(tasks), Some(k)) => tasks.div_ceil(k).max(counted),
        _ => counted.max(1),
    };
    if let (Some(k), None) = (opts.ntasks_per_gpu, opts.ntasks) {
        if k == 0 {
            return Err("invalid --ntasks-per-gpu '0': must be at least 1".into());
        }
        let gpus = total_gpus(&opts, nodes).map_err(|e| format!("invalid --ntasks-per-gpu '{k}': {e}"))?;
        opts.ntasks =
            Some(k.checked_mul(gpus).ok_or_else(|| format!("invalid --ntasks-per-gpu '{k}': too many tasks"))?);
    }
    let ntasks = match opts.ntasks {
        Some(n) => n,
        None => nodes.checked_mul(per_node.unwrap_or(1)).ok_or_else(|| {
            format!("invalid --ntasks-per-node: {nodes} nodes × {} tasks is too many", per_node.unwrap_or(1))
        })?,
    };
    if ntasks < nodes {
        return Err(format!("invalid --ntasks '{ntasks}': fewer tasks than the {nodes} nodes requested"));
    }
    if let Some(k) = per_node.filter(|&k| u64::from(ntasks) > u64::from(nodes) * u64::from(k)) {
        return Err(format!("invalid --ntasks '{ntasks}': more than {nodes} nodes × --ntasks-per-node {k}"));
    }
    // The most tasks a node runs (block distribution).
    let busiest = ntasks.div_ceil(nodes);
    let given: Vec<&str> = [
        ("--gpus", &opts.gpus),
        ("--gres", &opts.gres),
        ("--gpus-per-node", &opts.gpus_per_node),
        ("--gpus-per-task", &opts.gpus_per_task),
    ]
    .into_iter()
    .filter_map(|(what, v)| v.as_ref().map(|_| what))
    .collect();
    if given.len() > 1 {
        return Err(format!("give one way of asking for GPUs, not {}", given.join(" and ")));
    }
    let (gpu_type, gpus_per_node) = if let Some(g) = &opts.gpus {
        let (ty, total) = parse_gpu_count(g, "--gpus")?;
        if total % nodes != 0 {
            return Err(format!("invalid --gpus '{g}': {total} GPUs do not spread evenly over {nodes} nodes"));
        }
        (ty, total / nodes)
    } else if let Some(g) = &opts.gres {
        parse_gres(g)?
    } else if let Some(g) = &opts.gpus_per_node {
        parse_gpu_count(g, "--gpus-per-node")?
    } else if let Some(g) = &opts.gpus_per_task {
        let (ty, n) = parse_gpu_count(g, "--gpus-per-task")?;
        let per_node = n.checked_mul(busiest).ok_or_else(|| format!("invalid --gpus-per-task '{g}': too many GPUs"))?;
        (ty, per_node)
    } else {
        (None, 0)
    };
    let cpus_per_task = match (opts.cpus_per_task, opts.cpus_per_gpu) {
        (Some(_), Some(_)) => return Err("give one of --cpus-per-task and --cpus-per-gpu, not both".into()),
        (Some(c), None) => c,
        (None, Some(k)) if gpus_per_node == 0 => {
            return Err(format!("invalid --cpus-per-gpu '{k}': the job asks for no GPUs"))
        }
        // The node's tasks share the CPUs of its GPUs.
        (None, Some(k)) => k
            .checked_mul(gpus_per_node)
            .ok_or_else(|| format!("invalid --cpus-per-gpu '{k}': too many CPUs"))?
            .div_ceil(busiest)
            .max(1),
        (None, None) => 1,
    };
    let given: Vec<&str> =
        [("--mem", &opts.mem), ("--mem-per-cpu", &opts.mem_per_cpu), ("--mem-per-gpu", &opts.mem_per_gpu)]
            .into_iter()
            .filter_map(|(what, v)| v.as_ref().map(|_| what))
            .collect();
    if given.len() > 1 {
        return Err(format!("give one way of asking for memory, not {}", given.join(" and ")));
    }
    if opts.mem_is_all() {
        return Err(format!(
            "invalid --mem '{}': all of each node's memory needs the cluster's node sizes; give an amount (sbatch and quorum submit resolve it)",
            opts.mem.as_deref().unwrap_or_default()
        ));
    }
    let mem = |v: &str| parse::parse_mem_mb(v).map_err(|e| e.to_string());
    let too_much = |what: &str, v: &str| format!("invalid {what} '{v}': too much memory per node");
    let mem_per_node_mb = if let Some(m) = &opts.mem {
        mem(m)?
    } else if let Some(m) = &opts.mem_per_cpu {
        let cpus = u64::from(busiest) * u64::from(cpus_per_task);
        mem(m)?.checked_mul(cpus).ok_or_else(|| too_much("--mem-per-cpu", m))?
    } else if let Some(m) = &opts.mem_per_gpu {
        if gpus_per_node == 0 {
            return Err(format!("invalid --mem-per-gpu '{m}': the job asks for no GPUs"));
        }
        mem(m)?.checked_mul(u64::from(gpus_per_node)).ok_or_else(|| too_much("--mem-per-gpu", m))?
    } else {
        0
    };
    let work_dir: PathBuf = match &opts.chdir {
        Some(d) if Path::new(d).is_absolute() => PathBuf::from(d),
        Some(d) => cwd.join(d),
        None => cwd.to_path_buf(),
    };
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let begin_time_ms = match &opts.begin {
        Some(b) => parse_begin(b, now_ms)?,
        None => 0,
    };
    let mut env = apply_export(opts.export.as_deref().unwrap_or("ALL"), env)?;
    let mut layout_warning = None;
    if let Some(d) = &opts.distribution {
        // As Slurm's sbatch does: the script gets it, and its sruns read it.
        layout_warning = quorum_model::step::parse_distribution(d)?.1;
        env.retain(|(k, _)| k != "SLURM_DISTRIBUTION");
        env.push(("SLURM_DISTRIBUTION".into(), d.clone()));
    }
    let append_output = match opts.open_mode.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("truncate") | Some("t") => false,
        Some("append") | Some("a") => true,
        Some(_) => {
            return Err(format!(
                "invalid --open-mode '{}': give append or truncate",
                opts.open_mode.as_deref().unwrap_or_default()
            ))
        }
    };
    let mut warnings = opts.tolerated.warnings();
    warnings.extend(layout_warning);
    if let Some(NodeCount { min, max }) = opts.nodes.filter(|n| n.max > n.min) {
        warnings.push(format!(
            "--nodes={min}-{max} is accepted as {min}: a job gets exactly its minimum number of nodes here"
        ));
    }
    let kill_on_invalid_dep = match opts.kill_on_invalid_dep.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("no") => false,
        Some("yes") => true,
        Some(_) => {
            return Err(format!(
                "invalid --kill-on-invalid-dep '{}': give yes or no",
                opts.kill_on_invalid_dep.as_deref().unwrap_or_default()
            ))
        }
    };
    if let Some(m) = &opts.mail_type {
        quorum_model::MailTypes::parse(m)?;
    }
    let wait = opts.wait;
    let priority = match opts.priority.as_deref() {
        None => None,
        Some(p) => Some(p.trim().parse::<u32>().map_err(|_| {
            format!("invalid --priority '{p}': give a number (0 to {}); TOP is not supported", u32::MAX)
        })?),
    };
    // A uid is sent as its user's name; a name is the controllers' to check.
    let run_as = match opts.uid.as_deref().map(str::trim) {
        None => None,
        Some(u) => Some(match u.parse::<u32>() {
            Ok(uid) => quorum_auth::users::by_uid(uid)
                .map(|user| user.name)
                .map_err(|_| format!("invalid --uid '{u}': no such user"))?,
            Err(_) => u.to_string(),
        }),
    };
    // A gid is sent as its group's name, as a uid is; a name is the controllers' to check.
    let group = match opts.gid.as_deref().map(str::trim) {
        None => String::new(),
        Some(g) if g.parse::<u32>().is_ok() => {
            quorum_auth::users::group(g).map(|g| g.name).map_err(|_| format!("invalid --gid '{g}': no such group"))?
        }
        Some(g) => g.to_string(),
    };
    let spec = api::JobSpec {
        group,
        comment: opts.comment.clone().unwrap_or_default(),
        wckey: opts.wckey.clone().unwrap_or_default(),
        reservation: match opts.reservation.as_deref().map(str::trim) {
            Some(r) if r.is_empty() || r.len() > 64 || r.chars().any(|c| c.is_whitespace() || c.is_control()) => {
                return Err(format!("invalid --reservation '{r}': expected a reservation's name"))
            }
            r => r.unwrap_or_default().to_string(),
        },
        mail_type: opts.mail_type.clone().unwrap_or_default(),
        mail_user: opts.mail_user.clone().unwrap_or_default(),
        append_output,
        exclude,
        nodelist,
        dependency: opts.dependency.clone().unwrap_or_default(),
        begin_time_ms,
        hold: opts.hold,
        qos: opts.qos.clone().unwrap_or_default(),
        account: opts.account.clone().unwrap_or_default(),
        nice: opts.nice.unwrap_or(0),
        priority,
        kill_on_invalid_dep,
        licenses: match opts.licenses.as_deref() {
            Some(l) => quorum_model::parse_licenses(l)?.into_iter().collect(),
            None => Default::default(),
        },
        constraint: constraint.features,
        constraint_any: constraint.any,
        constraint_same: constraint.same,
        constraint_counts: constraint.counts,
        exclusive: opts.exclusive,
        oversubscribe: opts.oversubscribe,
        overcommit: opts.overcommit,
        requeue: opts.requeue,
        signal: opts.signal.clone().unwrap_or_default(),
        array: opts.array.clone().unwrap_or_default(),
        name: opts.job_name.unwrap_or(default_name),
        partition: opts.partition.unwrap_or_default(),
        nodes,
        ntasks,
        cpus_per_task,
        mem_per_node_mb,
        gpus_per_node,
        gpu_type: gpu_type.unwrap_or_default(),
        time_limit_s: match &opts.time {
            Some(t) => parse::parse_time_limit(t).map_err(|e| e.to_string())?.unwrap_or(0),
            None => 0,
        },
        argv,
        script,
        work_dir: work_dir.display().to_string(),
        stdout: opts.output.unwrap_or_default(),
        stderr: opts.error.unwrap_or_default(),
        env: env.into_iter().map(|(name, value)| api::EnvVar { name, value }).collect(),
        submit_dir: cwd.display().to_string(),
        every_node: opts.every_node,
        interactive: false,
        // Its other components, when heterogeneous, are added by the caller.
        het: Vec::new(),
        container: opts.container.spec(cwd)?,
    };
    Ok(Built { spec, warnings, wait, run_as })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hetjob_lines_separate_the_components_of_a_script() {
        let script = "#!/bin/sh\n#SBATCH -N1 -c2 --mem=1G -p batch\n#SBATCH hetjob\n#SBATCH -N2 -n4\n#SBATCH packjob\n#SBATCH -n1 --mem-per-cpu=100\necho\n";
        let sections = script_sections("job.sh", script).unwrap();
        assert_eq!(sections.len(), 3);
        assert_eq!(script_options("job.sh", script).unwrap().cpus_per_task, Some(2));
        let first = &sections[0];
        // The command line's component 1 wins over the script's; --mem and the partition carry
        // over, --mem-per-cpu stops --mem from carrying.
        let cli = vec![SubmitOpts { ntasks: Some(6), ..Default::default() }];
        let rest = component_options(first, cli, sections[1..].to_vec()).unwrap();
        assert_eq!(rest.len(), 2);
        assert_eq!((rest[0].ntasks, rest[0].nodes.map(|n| n.min)), (Some(6), Some(2)));
        assert_eq!((rest[0].mem.as_deref(), rest[0].partition.as_deref()), (Some("1G"), Some("batch")));
        assert_eq!((rest[1].mem.as_deref(), rest[1].mem_per_cpu.as_deref()), (None, Some("100")));
        let c = component_spec(rest[0].clone(), Path::new("/home/a")).unwrap();
        assert_eq!((c.nodes, c.ntasks, c.cpus_per_task, c.mem_per_node_mb), (2, 6, 1, 1024));
        // A component in another partition keeps it (and the next carries it on); one in
        // another account is refused, naming both.
        let other = vec![SubmitOpts { partition: Some("gpu".into()), ..Default::default() }, SubmitOpts::default()];
        let rest = component_options(first, other, Vec::new()).unwrap();
        assert_eq!((rest[0].partition.as_deref(), rest[1].partition.as_deref()), (Some("gpu"), Some("gpu")));
        assert_eq!(component_spec(rest[0].clone(), Path::new("/home/a")).unwrap().partition, "gpu");
        let other = vec![SubmitOpts { account: Some("physics".into()), ..Default::default() }];
        let e = component_options(first, other, Vec::new()).unwrap_err();
        assert!(e.contains("component 1") && e.contains("'physics'"), "{e}");
        // One section for a script without separators.
        assert_eq!(script_sections("job.sh", "#!/bin/sh\n#SBATCH -n2\ntrue\n").unwrap().len(), 1);
    }

    fn script_spec(text: &str, cli: SubmitOpts) -> Result<api::JobSpec, String> {
        build_spec(cli, Payload::Script { path: "job.sh".into(), text: text.into() }, Path::new("/home/a"), vec![])
            .map(|b| b.spec)
    }

    #[test]
    fn begin_times_are_read_as_slurm_reads_them() {
        // What the Slurm peer printed for each, asked at 2026-11-25T05:14:48.
        let at = |y, m, d, hh, mm, ss| local_time(y, m, d, hh, mm, ss).unwrap() as u64 * 1000;
        let now = at(2026, 11, 25, 5, 14, 48);
        for (text, want) in [
            ("now", now),
            ("now+90", now + 90_000),
            ("now+10seconds", now + 10_000),
            ("now+5minute", now + 300_000),
            ("now+5minutes", now + 300_000),
            ("now+1hour", now + 3_600_000),
            ("NOW+2hours", now + 7_200_000),
            ("now+1day", at(2026, 11, 26, 5, 14, 48)),
            ("now+2weeks", at(2026, 12, 9, 5, 14, 48)),
            ("now-1hour", now),
            ("today", now),
            ("noon", at(2026, 11, 25, 12, 0, 0)),
            ("fika", at(2026, 11, 25, 15, 0, 0)),
            ("teatime", at(2026, 11, 25, 16, 0, 0)),
            ("midnight", at(2026, 11, 26, 0, 0, 0)),
            ("tomorrow", at(2026, 11, 26, 0, 0, 0)),
            ("16:00", at(2026, 11, 25, 16, 0, 0)),
            ("4:00PM", at(2026, 11, 25, 16, 0, 0)),
            ("05:00", at(2026, 11, 26, 5, 0, 0)),
            ("05:00:30", at(2026, 11, 26, 5, 0, 30)),
            ("12:30am", at(2026, 11, 26, 0, 30, 0)),
            ("2026-11-27", at(2026, 11, 27, 0, 0, 0)),
            ("2026-11-27T10:00", at(2026, 11, 27, 10, 0, 0)),
            ("2026-11-27T10:00:05", at(2026, 11, 27, 10, 0, 5)),
            ("1127", at(2026, 11, 27, 0, 0, 0)),
            ("112726", at(2026, 11, 27, 0, 0, 0)),
            ("11/27", at(2026, 11, 27, 0, 0, 0)),
            ("11/27/26", at(2026, 11, 27, 0, 0, 0)),
            ("11.27.26", at(2026, 11, 27, 0, 0, 0)),
        ] {
            assert_eq!(parse_begin(text, now), Ok(want), "--begin={text}");
        }
        for text in [
            "now+5min",
            "now+1fortnight",
            "now*3",
            "now+",
            "elevenses",
            "2026-11-27T10",
            "25:00",
            "13:00pm",
            "2026-13-01",
            "123",
            "now+99999999999999999999",
            // Found by fuzzing: a letter of more than one byte where digits or a sign belong
            // (it panicked, slicing inside the character).
            "1\u{43c}~30",
            "now\u{e9}",
        ] {
            let err = parse_begin(text, now).unwrap_err();
            assert!(err.starts_with(&format!("invalid --begin '{text}': expected now[+COUNT")), "{text}: {err}");
        }
    }

    #[test]
    fn sbatch_lines_are_read_until_the_first_command() {
        let text = "#!/bin/bash\n#SBATCH -J train\n#SBATCH --nodes=2 -n 4\n# a comment\n#SBATCH --gres=gpu:h100:2 --mem 8G\n#SBATCH -t 1:00:00 -o out-%j.txt # trailing\n\necho hi\n#SBATCH -p ignored\n";
        let s = script_spec(text, SubmitOpts::default()).unwrap();
        assert_eq!(s.name, "train");
        assert_eq!((s.nodes, s.ntasks), (2, 4));
        assert_eq!((s.gpu_type.as_str(), s.gpus_per_node), ("h100", 2));
        assert_eq!(s.mem_per_node_mb, 8192);
        assert_eq!(s.time_limit_s, 3600);
        assert_eq!(s.stdout, "out-%j.txt");
        assert_eq!(s.partition, "", "directives after the first command are ignored");
        assert_eq!(s.work_dir, "/home/a");
        // The command line wins.
        let cli = SubmitOpts { job_name: Some("other".into()), ..Default::default() };
        assert_eq!(script_spec(text, cli).unwrap().name, "other");
        // --requeue from the script, unless the command line says --no-requeue.
        assert!(!script_spec(text, SubmitOpts::default()).unwrap().requeue);
        let requeued = text.replace("#SBATCH -J train", "#SBATCH -J train --requeue");
        assert!(script_spec(&requeued, SubmitOpts::default()).unwrap().requeue);
        let warned = text.replace("#SBATCH -J train", "#SBATCH -J train --signal=B:USR1@30");
        assert_eq!(script_spec(&warned, SubmitOpts::default()).unwrap().signal, "B:USR1@30");
        let cli = SubmitOpts { no_requeue: true, ..Default::default() };
        assert!(!script_spec(&requeued, cli).unwrap().requeue);
    }

    /// Each spelling of an option, in an `#SBATCH` line, gives the values Slurm's sbatch gives
    /// (checked against Slurm 22.05's `sbatch --test-only` where its nodes allow): nodes, tasks,
    /// CPUs per task, GPUs per node and their type, memory per node (MiB), time limit (s).
    #[test]
    fn option_spellings_give_the_values_slurm_gives() {
        type Row = (u32, u32, u32, u32, &'static str, u64, u64);
        let cases: &[(&str, Row)] = &[
            ("-N 2 --ntasks-per-node=4", (2, 8, 1, 0, "", 0, 0)),
            ("--nodes=2 --tasks-per-node 3", (2, 6, 1, 0, "", 0, 0)),
            ("-n 4 --ntasks-per-node=2", (2, 4, 1, 0, "", 0, 0)),
            ("-n 5 --ntasks-per-node=2", (3, 5, 1, 0, "", 0, 0)),
            ("--ntasks-per-node=2", (1, 2, 1, 0, "", 0, 0)),
            ("-N2 --gpus-per-node=h100:4", (2, 2, 1, 4, "h100", 0, 0)),
            ("-N 2 -G 8", (2, 2, 1, 4, "", 0, 0)),
            ("--gpus=a100:2", (1, 1, 1, 2, "a100", 0, 0)),
            ("--gres=gpu:2", (1, 1, 1, 2, "", 0, 0)),
            ("-N2 --ntasks-per-node=2 --gpus-per-task=1", (2, 4, 1, 2, "", 0, 0)),
            ("-n 3 --gpus-per-task=2", (1, 3, 1, 6, "", 0, 0)),
            ("-n 4 -c 2 --mem-per-cpu=1G", (1, 4, 2, 0, "", 8192, 0)),
            ("-N 2 -n 4 --mem-per-cpu 100", (2, 4, 1, 0, "", 200, 0)),
            ("--gpus-per-node=2 --mem-per-gpu=10g", (1, 1, 1, 2, "", 20480, 0)),
            ("--mem 2048", (1, 1, 1, 0, "", 2048, 0)),
            ("--mem=4g", (1, 1, 1, 0, "", 4096, 0)),
            ("--mem=512MB", (1, 1, 1, 0, "", 512, 0)),
            ("--mem=1T", (1, 1, 1, 0, "", 1 << 20, 0)),
            ("--time=90", (1, 1, 1, 0, "", 0, 5400)),
            ("-t 1:30", (1, 1, 1, 0, "", 0, 90)),
            ("-t 2:00:00", (1, 1, 1, 0, "", 0, 7200)),
            ("-t 2-0", (1, 1, 1, 0, "", 0, 172_800)),
            ("--time 1-2:30", (1, 1, 1, 0, "", 0, 95_400)),
            ("-t 1-02:30:15", (1, 1, 1, 0, "", 0, 95_415)),
            ("-t UNLIMITED", (1, 1, 1, 0, "", 0, 0)),
            // Unambiguous prefixes, as getopt takes them.
            ("--nodes=2 --ntasks-per-n=2", (2, 4, 1, 0, "", 0, 0)),
            ("--cpus-per-t=3 --time=5", (1, 1, 3, 0, "", 0, 300)),
            // Per GPU: CPUs shared by a node's tasks, tasks for each of the job's GPUs.
            ("--gpus-per-node=2 --cpus-per-gpu=4", (1, 1, 8, 2, "", 0, 0)),
            ("-N 2 --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-gpu=3", (2, 4, 3, 2, "", 0, 0)),
            ("-N 2 --gpus=4 --ntasks-per-gpu=2", (2, 8, 1, 2, "", 0, 0)),
            ("--nodelist=n[1-3]", (3, 3, 1, 0, "", 0, 0)),
            // Fewer listed than asked for: those, and others chosen.
            ("-N 3 -w n1", (3, 3, 1, 0, "", 0, 0)),
            ("--exclusive=user -N 2", (2, 2, 1, 0, "", 0, 0)),
            // A range: the minimum, as Slurm records it at submit.
            ("--nodes=1-2 -n 2", (1, 2, 1, 0, "", 0, 0)),
            ("--exclusive --ntasks-per-core=1 --spread-job", (1, 1, 1, 0, "", 0, 0)),
        ];
        for (line, want) in cases {
            let s = script_spec(&format!("#!/bin/bash\n#SBATCH {line}\nhostname\n"), SubmitOpts::default())
                .unwrap_or_else(|e| panic!("{line}: {e}"));
            let got = (
                s.nodes,
                s.ntasks,
                s.cpus_per_task,
                s.gpus_per_node,
                s.gpu_type.as_str(),
                s.mem_per_node_mb,
                s.time_limit_s,
            );
            assert_eq!(&got, want, "#SBATCH {line}");
        }
        for (line, named) in [
            ("--job=train --out=o.txt --err=e.txt --partit=gpu", ("train", "o.txt", "e.txt", "gpu")),
            ("--job-name train -o %x-%j.out -p a100", ("train", "%x-%j.out", "", "a100")),
        ] {
            let s = script_spec(&format!("#SBATCH {line}\n"), SubmitOpts::default()).unwrap();
            assert_eq!((s.name.as_str(), s.stdout.as_str(), s.stderr.as_str(), s.partition.as_str()), named, "{line}");
        }
    }

    #[test]
    fn options_that_contradict_each_other_are_refused_naming_them() {
        for (line, says) in [
            ("--gpus-per=1", "--gpus-per"),
            ("--mem=1G --mem-per-cpu=1G", "give one way of asking for memory, not --mem and --mem-per-cpu"),
            ("--gpus=1 --gres=gpu:1", "give one way of asking for GPUs, not --gpus and --gres"),
            ("-N 2 -n 9 --ntasks-per-node=4", "invalid --ntasks '9': more than 2 nodes × --ntasks-per-node 4"),
            ("--mem-per-gpu=1G", "invalid --mem-per-gpu '1G': the job asks for no GPUs"),
            ("--ntasks-per-node=0", "invalid --ntasks-per-node '0'"),
            ("--gpus-per-task=x:y:1", "invalid --gpus-per-task 'x:y:1'"),
            ("--mem-per-cpu=lots", "invalid memory size 'lots'"),
        ] {
            let e = script_spec(&format!("#SBATCH {line}\n"), SubmitOpts::default()).unwrap_err();
            assert!(e.contains(says), "#SBATCH {line}: {e}");
        }
    }

    #[test]
    fn notes_node_lists_and_options_accepted_or_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bad-nodes"), "n7\nn[8-9] n7\n").unwrap();
        let text = "#!/bin/bash\n#SBATCH --comment='a b' --wckey=w --mail-type=END,FAIL --mail-user=a@b\n\
                    #SBATCH -x ./bad-nodes --open-mode=append --hint=nomultithread --threads-per-core=1\n\
                    #SBATCH -W\nhostname\n";
        let payload = Payload::Script { path: "job.sh".into(), text: text.into() };
        let built = build_spec(SubmitOpts::default(), payload, dir.path(), vec![]).unwrap();
        let s = &built.spec;
        assert_eq!((s.comment.as_str(), s.wckey.as_str()), ("a b", "w"));
        assert_eq!((s.mail_type.as_str(), s.mail_user.as_str()), ("END,FAIL", "a@b"));
        assert_eq!(s.exclude, ["n7", "n8", "n9"]);
        assert!(s.constraint.is_empty() && !s.constraint_any && s.priority.is_none() && built.run_as.is_none());
        let payload = Payload::Script { path: "job.sh".into(), text: "#SBATCH --priority=7 --uid=0\ntrue\n".into() };
        let root = build_spec(SubmitOpts::default(), payload, dir.path(), vec![]).unwrap();
        assert_eq!((root.spec.priority, root.run_as.as_deref()), (Some(7), Some("root")), "a uid is sent as its name");
        let payload = Payload::Script { path: "job.sh".into(), text: "#SBATCH -L matlab:2,fluent\ntrue\n".into() };
        let licensed = build_spec(SubmitOpts::default(), payload, dir.path(), vec![]).unwrap();
        let mut got: Vec<(String, u32)> = licensed.spec.licenses.into_iter().collect();
        got.sort();
        assert_eq!(got, [("fluent".to_string(), 1), ("matlab".to_string(), 2)], "a count of 1 when none is given");
        let payload = Payload::Script { path: "job.sh".into(), text: "#SBATCH --gid=0\ntrue\n".into() };
        let grouped = build_spec(SubmitOpts::default(), payload, dir.path(), vec![]).unwrap();
        assert_eq!(grouped.spec.group, "root", "a gid is sent as its group's name");
        let payload = Payload::Script { path: "job.sh".into(), text: "#SBATCH --uid=alice\ntrue\n".into() };
        let named = build_spec(SubmitOpts::default(), payload, dir.path(), vec![]).unwrap();
        assert_eq!(named.run_as.as_deref(), Some("alice"), "a name is the controllers' to check");
        for (line, want, any, same) in [
            ("-C ib", &["ib"][..], false, false),
            ("-C 'ib&v100'", &["ib", "v100"], false, false),
            ("--constraint=ib,v100", &["ib", "v100"], false, false),
            ("-C 'skylake|icelake'", &["skylake", "icelake"], true, false),
            ("-C '[rack1|rack2|rack3]'", &["rack1", "rack2", "rack3"], true, true),
            ("-C '[rack1]'", &["rack1"], false, false),
        ] {
            let s = script_spec(&format!("#SBATCH {line}\ntrue\n"), SubmitOpts::default()).unwrap();
            assert_eq!(
                (s.constraint.iter().map(String::as_str).collect::<Vec<_>>(), s.constraint_any, s.constraint_same),
                (want.to_vec(), any, same),
                "{line}"
            );
            assert!(s.constraint_counts.is_empty(), "{line}");
        }
        // Node counts: as Slurm, a job that gives no node count gets the nodes its features
        // count; one that gives more has the others free of any feature.
        for (line, want, counts, nodes) in [
            ("-C 'rack1*2'", &["rack1"][..], &[2][..], 2),
            ("-C '[rack1*2&rack2*4]'", &["rack1", "rack2"], &[2, 4], 6),
            ("-C 'rack1*2,rack2*1'", &["rack1", "rack2"], &[2, 1], 3),
            ("-N 8 -C '[ ib*1 & opa*3 ]'", &["ib", "opa"], &[1, 3], 8),
            ("-n 4 --ntasks-per-node=4 -C 'gpu*2'", &["gpu"], &[2], 2),
        ] {
            let s = script_spec(&format!("#SBATCH {line}\ntrue\n"), SubmitOpts::default()).unwrap();
            assert_eq!(
                (s.constraint.iter().map(String::as_str).collect::<Vec<_>>(), s.constraint_counts.as_slice(), s.nodes),
                (want.to_vec(), counts, nodes),
                "{line}"
            );
            assert!(!s.constraint_any && !s.constraint_same, "{line}");
        }
        assert!(s.append_output && built.wait);
        assert_eq!(
            built.warnings,
            [
                "--hint=nomultithread is accepted but not honoured: tasks are not bound to cores or threads here",
                "--threads-per-core=1 is accepted but not honoured: nodes offer CPUs, without sockets, cores or threads",
            ]
        );
        let warned = |text: &str| {
            let payload = Payload::Script { path: "job.sh".into(), text: text.into() };
            build_spec(SubmitOpts::default(), payload, dir.path(), vec![]).unwrap().warnings
        };
        assert_eq!(
            warned("#SBATCH --kill-on-invalid-dep no\ntrue\n"),
            Vec::<String>::new(),
            "what happens here anyway"
        );
        assert_eq!(
            warned("#SBATCH -N 2-4\ntrue\n"),
            ["--nodes=2-4 is accepted as 2: a job gets exactly its minimum number of nodes here"]
        );
        assert_eq!(warned("#SBATCH --kill-on-invalid-dep yes\ntrue\n"), Vec::<String>::new(), "honoured");
        let spec = |text: &str| {
            let payload = Payload::Script { path: "job.sh".into(), text: text.into() };
            build_spec(SubmitOpts::default(), payload, dir.path(), vec![]).unwrap().spec
        };
        assert!(spec("#SBATCH --kill-on-invalid-dep=YES\ntrue\n").kill_on_invalid_dep);
        assert!(!spec("#SBATCH --kill-on-invalid-dep=no\ntrue\n").kill_on_invalid_dep);
        for (line, says) in [
            ("-L matlab:0", "invalid --licenses 'matlab:0': '0' is not a count of licenses"),
            ("-L 'matlab|fluent'", "licenses joined by | (any of them) are not supported"),
            ("-L matlab@db", "remote licenses, name@server, are not supported"),
            ("--reservation=' '", "invalid --reservation '': expected a reservation's name"),
            ("--gid=4294967295", "invalid --gid '4294967295': no such group"),
            ("--priority=TOP", "invalid --priority 'TOP': give a number"),
            ("--mail-type=BEGIN,SOMETIMES", "invalid --mail-type 'BEGIN,SOMETIMES': unknown type 'SOMETIMES'"),
            ("--uid=4294967295", "invalid --uid '4294967295': no such user"),
            ("--open-mode=sideways", "invalid --open-mode 'sideways': give append or truncate"),
            ("-N 1 -w n[1-2]", "--nodes 1 with 2 nodes in --nodelist"),
            ("-w n1 -x n1", "node 'n1' is both in --nodelist and in --exclude"),
            ("-C '[ib&opa]'", "invalid --constraint '[ib&opa]': brackets take one matching OR of features"),
            ("-C '[ib*2|opa*2]'", "features with node counts (feature*N) are joined by & only, not |"),
            ("-C 'ib*2&opa'", "'opa' has no node count: give every feature a count"),
            ("-C 'ib*0'", "'0' is not a node count (1 or more) for feature 'ib'"),
            ("-C 'ib*x'", "'x' is not a node count"),
            ("-C '*2'", "a feature name is missing before a node count"),
            ("-C '[[ib*2]&opa*1]'", "node counts (feature*N) take one pair of brackets"),
            ("-N 2 -C '[ib*2&opa*2]'", "--nodes 2 with --constraint '[ib*2&opa*2]', which counts 4 nodes"),
            ("-w n1 -C 'ib*1'", "node counts per feature and --nodelist cannot be given together"),
            ("-C 'ib|opa&gpu'", "join the features by & (all of them) or by | (any of them), not both"),
            ("-C 'ib||opa'", "a feature name is missing between two operators"),
            ("--cpus-per-gpu=2", "invalid --cpus-per-gpu '2': the job asks for no GPUs"),
            ("--ntasks-per-gpu=2", "--ntasks-per-gpu needs GPUs"),
            ("-x ./missing-file", "invalid --exclude './missing-file': cannot read"),
            ("--ti=5", "--ti"),
            ("--mem=0", "invalid --mem '0': all of each node's memory needs the cluster's node sizes"),
            ("--cpu-bind=cores", "--cpu-bind"),
            ("--exclusive=sideways", "--exclusive"),
            ("--kill-on-invalid-dep maybe", "invalid --kill-on-invalid-dep 'maybe': give yes or no"),
            ("--nodes=3-2", "'3-2' is not a node count"),
        ] {
            let e = script_spec(&format!("#SBATCH {line}\n"), SubmitOpts::default()).unwrap_err();
            assert!(e.contains(says), "#SBATCH {line}: {e}");
        }
    }

    #[test]
    fn a_task_count_alone_takes_as_many_nodes_as_its_tasks_need() {
        let opts = |line: &str| script_options("job.sh", &format!("#SBATCH {line}\n")).unwrap();
        assert_eq!(nodes_for_tasks(&opts("-n 12"), 8), Some(2));
        assert_eq!(nodes_for_tasks(&opts("-n 2 -C '[a*2&b*2]'"), 8), Some(4), "the features count 4 nodes");
        assert_eq!(nodes_for_tasks(&opts("-n 12 -c 4"), 8), Some(6));
        assert_eq!(nodes_for_tasks(&opts("-n 8"), 8), Some(1));
        assert_eq!(nodes_for_tasks(&opts("-n 12 -N 1"), 8), None, "the nodes are named");
        assert_eq!(nodes_for_tasks(&opts("-n 12 --ntasks-per-node=4"), 8), None);
        assert_eq!(nodes_for_tasks(&opts("-c 16"), 8), None, "one task");
        assert_eq!(nodes_for_tasks(&opts("-n 2 -c 16"), 8), None, "no node holds a task");
    }

    #[test]
    fn a_bad_sbatch_line_is_named() {
        let e =
            script_spec("#!/bin/bash\n#SBATCH -J x\n#SBATCH --mem=lots\necho\n", SubmitOpts::default()).unwrap_err();
        assert!(e.contains("job.sh line 3") && e.contains("invalid memory size 'lots'"), "{e}");
        let e = script_spec("#SBATCH --frobnicate\n", SubmitOpts::default()).unwrap_err();
        assert!(e.contains("line 1") && e.contains("--frobnicate"), "{e}");
        let e = script_spec("#SBATCH -t 1:2:3:4\n", SubmitOpts::default()).unwrap_err();
        assert!(e.contains("invalid time '1:2:3:4'"), "{e}");
    }

    #[test]
    fn export_takes_all_none_or_a_list() {
        let env = || {
            vec![
                ("HOME".to_string(), "/home/a".to_string()),
                ("SLURM_CONF".to_string(), "/etc/slurm.conf".to_string()),
                ("OMP_NUM_THREADS".to_string(), "8".to_string()),
            ]
        };
        let names = |v: Vec<(String, String)>| v.into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
        assert_eq!(apply_export("ALL", env()).unwrap(), env());
        assert_eq!(names(apply_export("NONE", env()).unwrap()), ["SLURM_CONF=/etc/slurm.conf"]);
        assert_eq!(
            names(apply_export("HOME,FOO=bar,MISSING", env()).unwrap()),
            ["SLURM_CONF=/etc/slurm.conf", "HOME=/home/a", "FOO=bar"]
        );
        assert_eq!(
            names(apply_export("ALL,OMP_NUM_THREADS=2", env()).unwrap()),
            ["HOME=/home/a", "SLURM_CONF=/etc/slurm.conf", "OMP_NUM_THREADS=2"]
        );
        assert!(apply_export("HOME,1BAD", env()).unwrap_err().contains("'1BAD' is not a variable name"));
        assert!(apply_export("NONE,HOME", env()).unwrap_err().contains("NONE cannot be part of a list"));
        let cli = SubmitOpts { export: Some("A=1,,B".into()), ..Default::default() };
        let err = build_spec(cli, Payload::Command(vec!["x".into()]), Path::new("/"), env()).unwrap_err();
        assert!(err.contains("invalid --export 'A=1,,B': '' is not a variable name"), "{err}");
        let cli = SubmitOpts { export: Some("NONE".into()), ..Default::default() };
        let spec = build_spec(cli, Payload::Command(vec!["x".into()]), Path::new("/"), env()).unwrap().spec;
        assert_eq!(spec.env.len(), 1);
    }

    #[test]
    fn gpus_spread_over_nodes() {
        let cli = SubmitOpts { nodes: Some(NodeCount::exact(2)), gpus: Some("a100:8".into()), ..Default::default() };
        let s = build_spec(cli, Payload::Command(vec!["x".into()]), Path::new("/"), vec![]).unwrap().spec;
        assert_eq!((s.gpus_per_node, s.gpu_type.as_str()), (4, "a100"));
        let cli = SubmitOpts { nodes: Some(NodeCount::exact(2)), gpus: Some("3".into()), ..Default::default() };
        assert!(build_spec(cli, Payload::Command(vec!["x".into()]), Path::new("/"), vec![])
            .unwrap_err()
            .contains("do not spread evenly"));
        assert!(build_spec(SubmitOpts::default(), Payload::Command(vec![]), Path::new("/"), vec![])
            .unwrap_err()
            .contains("empty command"));
    }
}
