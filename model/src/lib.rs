//! Domain types shared by the state machine, the scheduler and the services: what a job asks
//! for ([`JobSpec`]), what it is ([`Job`]), what a node has ([`Node`]) and what a job holds
//! ([`Allocation`]). Plain data, serde-encoded into the Raft log and snapshots.
//!
//! A crate of its own, without I/O, so that the command-line client can parse and print what
//! the controller does without linking the controller (nor RocksDB) into every `quorum` call.

pub mod accounts;
pub mod array;
pub mod cidr;
pub mod container;
pub mod cpu_bind;
pub mod cron;
pub mod env;
pub mod gpu_fault;
pub mod het;
mod het_spec;
pub mod hostlist;
pub mod mpi;
mod node_cpus;
pub mod oversubscribe;
pub mod parse;
pub mod policy;
pub mod predict;
pub mod preempt;
pub mod reservation;
pub mod role;
pub mod shared;
pub mod step;
pub mod swf;
pub mod units;
pub mod update;
pub mod usage;

/// The bounds of what a job may ask for and carry, checked at admission
/// ([`JobSpec::check_shape`]). Slurm's `max_script_size` is 4 MB too.
pub mod limits {
    pub const MAX_NODES: u32 = 100_000;
    pub const MAX_TASKS: u32 = 10_000_000;
    pub const MAX_CPUS_PER_NODE: u32 = 1 << 20;
    pub const MAX_GPUS_PER_NODE: u32 = 1024;
    /// 1 PiB.
    pub const MAX_MEM_MB: u64 = 1 << 30;
    pub const MAX_SCRIPT_BYTES: usize = 4 << 20;
    pub const MAX_ARGS: usize = 100_000;
    pub const MAX_ENV_VARS: usize = 16_384;
    pub const MAX_ENV_BYTES: usize = 4 << 20;
    pub const MAX_DEPENDENCIES: usize = 1_000;
    pub const MAX_PATH_BYTES: usize = 4096;
    /// A comment, a wckey, a mail type or address.
    pub const MAX_NOTE_BYTES: usize = 4096;
    pub const MAX_REQUEST_ID_BYTES: usize = 256;
    /// What one submitted spec may take in a Raft entry ([`super::JobSpec::encoded_bytes`]):
    /// bounded, so that one entry ships and is stored within a replication round.
    pub const MAX_SPEC_BYTES: usize = 8 << 20;
    /// The largest request the controllers' gRPC API decodes: a spec at [`MAX_SPEC_BYTES`] with
    /// room for the rest of its request (gRPC's own default, 4 MiB, made a 4 MiB script
    /// impossible to send).
    pub const MAX_REQUEST_BYTES: usize = MAX_SPEC_BYTES + (1 << 20);
    /// The largest body the REST API reads: a spec at [`MAX_SPEC_BYTES`] as JSON, whose
    /// escapes may double a script's bytes.
    pub const MAX_REST_BODY_BYTES: usize = 2 * MAX_SPEC_BYTES + (1 << 20);
}

/// The bytes `text` takes as a JSON string: quotes, and escapes for `"`, `\\` and control
/// characters.
pub fn json_len(text: &str) -> usize {
    2 + text
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

pub use cidr::Cidr;
pub use shared::Shared;
pub use units::{JobId, Millis};

pub use accounts::{Account, AssocLimits, Qos, Tres, TresLimit, TresMins, Usage};
pub use array::{ArraySpec, ArrayTask, TaskRange};
pub use env::Env;
pub use policy::{BackfillMode, BackfillOrder, Policy, QueueLimits, QueueOrder, TresWeights, Weights};
pub use role::Role;
pub use usage::JobUsage;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// What runs: a command line, or a batch script run by bash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Program {
    Argv(Vec<String>),
    Script(String),
}

impl Default for Program {
    fn default() -> Self {
        Program::Argv(Vec::new())
    }
}

/// What a user asked for. Optional fields are filled from the partition at submit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub partition: Option<String>,
    pub nodes: u32,
    pub ntasks: u32,
    pub cpus_per_task: u32,
    pub mem_per_node_mb: Option<u64>,
    pub gpus_per_node: u32,
    pub gpu_type: Option<String>,
    pub time_limit_s: Option<u64>,
    pub program: Program,
    pub work_dir: String,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    #[serde(default)]
    pub env: Env,
    pub submit_dir: String,
    /// Jobs this one waits for (all must be satisfied).
    #[serde(default)]
    pub dependencies: Vec<Dependency>,
    /// Runs only when no other job of the same name and user runs (`--dependency=singleton`).
    #[serde(default)]
    pub singleton: bool,
    /// The dependencies were joined by `?`: any one satisfied is enough (else all must be).
    /// From feature level 12.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dependency_any: bool,
    /// Not before this time (`--begin`).
    #[serde(default)]
    pub begin_time: Option<Millis>,
    #[serde(default)]
    pub qos: Option<String>,
    #[serde(default)]
    pub account: Option<String>,
    /// Lowers (positive) or raises (negative, root only) the priority.
    #[serde(default)]
    pub nice: i32,
    /// Node features every allocated node must have (`--constraint a&b` or `a,b`); with
    /// `constraint_any`, at least one of them.
    #[serde(default)]
    pub constraint: Vec<String>,
    /// `--constraint a|b`: each allocated node has at least one of `constraint` (nodes may
    /// differ). From feature level 12.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub constraint_any: bool,
    /// `--constraint [a|b]` (Slurm's matching OR, with `constraint_any`): every allocated node
    /// has the same one of `constraint`. From feature level 13.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub constraint_same: bool,
    /// `--constraint [a*2&b*4]` (Slurm's node counts): when not empty, as long as `constraint`,
    /// and the job needs this many nodes with each feature of `constraint`, each node counted
    /// for one feature only; its other nodes may have any features. From feature level 15.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraint_counts: Vec<u32>,
    /// `--priority`: the job's priority, instead of the one the scheduler computes (operators
    /// only). From feature level 12.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// `--licenses`: how many of each of the cluster's licenses the job holds while it runs.
    /// From feature level 12.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub licenses: BTreeMap<String, u32>,
    /// Whole nodes only (`--exclusive`).
    #[serde(default)]
    pub exclusive: bool,
    /// Willing to share its CPUs with other jobs where the partition says `OverSubscribe=YES`
    /// (`--oversubscribe`, `-s`). From feature level 24.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oversubscribe: bool,
    /// Allocated as if one task ran on each node (`--overcommit`, `-O`): `cpus_per_task` CPUs
    /// per node whatever `ntasks` says, as Slurm allocates it. From feature level 30.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overcommit: bool,
    /// Submitted held (`--hold`).
    #[serde(default)]
    pub hold: bool,
    /// Back to the queue when a node it runs on fails (`--requeue`), instead of NODE_FAIL.
    #[serde(default)]
    pub requeue: bool,
    /// `--signal`: warned before the time limit. Left out of the encoding when unset, so a job
    /// without it encodes as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warn_signal: Option<WarnSignal>,
    /// `--array`: one job per task id. Only in the submit command: apply makes the tasks and
    /// leaves it out of each task's spec (each task has its [`Job::array`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArraySpec>,
    /// The program runs once, on the first node of the allocation (Slurm's batch step); the
    /// other nodes are held for the job's steps (`srun`). `false`: it runs on every node
    /// (`--every-node`, one-node jobs, and every job submitted before feature level 9).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub batch_step: bool,
    /// An allocation for `salloc` or `srun` from outside a job: nothing of the user's runs on
    /// its nodes but its steps; its owner ends it when the command it ran ends
    /// ([`Rejection`]-checked `EndAllocation`), or its time limit or a cancel does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interactive: bool,
    /// What the job carries for people and tools but nothing schedules by (`--comment`,
    /// `--wckey`, `--mail-type`, `--mail-user`). From feature level 11.
    #[serde(default, skip_serializing_if = "JobNotes::is_empty")]
    pub notes: JobNotes,
    /// `--open-mode=append`: the batch step's output files are appended to, not truncated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub append_output: bool,
    /// `--exclude`: nodes the job must not run on. From feature level 11.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// `--nodelist`: the nodes the job runs on, each of them (as many as it asks for). From
    /// feature level 11.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodelist: Vec<String>,
    /// The batch script's arguments (`sbatch job.sh ARGS...`: `$1`, `$2`, ...). From feature
    /// level 11.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub script_args: Vec<String>,
    /// `--kill-on-invalid-dep=yes`: the job is cancelled once its dependency can never be met,
    /// instead of waiting with `DependencyNeverSatisfied`. From feature level 13.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kill_on_invalid_dep: bool,
    /// `--gid`: the job's processes run with this group (a name) as their primary group, not
    /// their user's; root only. From feature level 13.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_group: Option<String>,
    /// `--reservation`: the job runs only inside this advance reservation. From feature level
    /// 18.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// A heterogeneous job's components after the first (`#SBATCH hetjob`, `sbatch A : B`):
    /// the job itself is component 0. From feature level 25.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub het: Vec<het::HetComponent>,
    /// `--container-image` and the other pyxis options: the batch step runs in this container.
    /// From feature level 28.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<container::Container>,
}

impl Job {
    /// Suspended by preemption (mode SUSPEND): it holds its memory and GPUs, not its CPUs,
    /// which the job that preempted it uses until it is resumed.
    pub fn lends_cpus(&self) -> bool {
        self.state == JobState::Suspended
            && self.preempting.as_ref().is_some_and(|p| p.mode == preempt::PreemptMode::Suspend)
    }

    /// Its time limit counted from its start: lengthened by the time it spent suspended, and
    /// cut at the end of the reservation it runs in (Slurm's `ResvOverRun=0`).
    pub fn limit_from_start_s(&self) -> Option<u64> {
        let limit = self.spec.time_limit_s.map(|l| l.saturating_add(self.suspended_ms / 1000));
        let until_resv_end =
            self.resv_end.map(|e| e.saturating_sub(self.start_time.unwrap_or(e)).div_ceil(1000).max(1));
        match (limit, until_resv_end) {
            (Some(l), Some(r)) => Some(l.min(r)),
            (l, r) => l.or(r),
        }
    }
}

/// Bookkeeping a job carries and shows (`--comment`, `--wckey`, `--mail-type`, `--mail-user`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobNotes {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub comment: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub wckey: String,
    /// Slurm's `--mail-type` list as given (`BEGIN,END,FAIL`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mail_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mail_user: String,
}

/// What `--mail-type` asks to be told about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MailTypes {
    pub begin: bool,
    pub end: bool,
    pub fail: bool,
    pub requeue: bool,
    /// The job reached its time limit (`TIME_LIMIT`).
    pub time_limit: bool,
    /// A mail per task of an array, not one for the array as a whole.
    pub array_tasks: bool,
}

impl MailTypes {
    /// Slurm's `--mail-type` list, in any case: `NONE`, `BEGIN`, `END`, `FAIL`, `REQUEUE`, `ALL`
    /// (all of those), `TIME_LIMIT`, `ARRAY_TASKS`; `TIME_LIMIT_50|80|90`, `INVALID_DEPEND` and
    /// `STAGE_OUT` are taken and never mailed (nothing here reports them).
    pub fn parse(value: &str) -> Result<MailTypes, String> {
        let mut m = MailTypes::default();
        for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word.to_ascii_uppercase().as_str() {
                "NONE" => m = MailTypes::default(),
                "BEGIN" => m.begin = true,
                "END" => m.end = true,
                "FAIL" => m.fail = true,
                "REQUEUE" => m.requeue = true,
                "ALL" => (m.begin, m.end, m.fail, m.requeue) = (true, true, true, true),
                "TIME_LIMIT" => m.time_limit = true,
                "ARRAY_TASKS" => m.array_tasks = true,
                "TIME_LIMIT_50" | "TIME_LIMIT_80" | "TIME_LIMIT_90" | "INVALID_DEPEND" | "STAGE_OUT" => {}
                _ => {
                    return Err(format!(
                        "invalid --mail-type '{value}': unknown type '{word}' (NONE, BEGIN, END, FAIL, REQUEUE, ALL, TIME_LIMIT, TIME_LIMIT_90, TIME_LIMIT_80, TIME_LIMIT_50, ARRAY_TASKS, INVALID_DEPEND, STAGE_OUT)"
                    ))
                }
            }
        }
        Ok(m)
    }

    /// Whether anything is ever mailed.
    pub fn any(&self) -> bool {
        self.begin || self.end || self.fail || self.requeue || self.time_limit
    }
}

impl JobNotes {
    pub fn is_empty(&self) -> bool {
        self.comment.is_empty() && self.wckey.is_empty() && self.mail_type.is_empty() && self.mail_user.is_empty()
    }
}

/// A signal by name (`USR1`, `SIGUSR1`) or number, among those a job may be sent.
/// The signals known by name (without `SIG`), and their numbers.
pub const SIGNALS: [(&str, i32); 12] = [
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("URG", libc::SIGURG),
];

pub fn parse_signal(text: &str) -> Result<i32, String> {
    let name = text.trim().to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    let known = SIGNALS;
    if let Some((_, n)) = known.iter().find(|(k, _)| *k == name) {
        return Ok(*n);
    }
    match name.parse::<i32>() {
        Ok(n) if (1..=64).contains(&n) => Ok(n),
        _ => Err(format!(
            "unknown signal '{text}' (use a number 1-64 or one of {})",
            known.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// `--signal=[B:]SIG[@SECONDS]`: the signal sent that many seconds (60 by default) before the
/// time limit, to the batch shell only with `B:`, else to every process of the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarnSignal {
    pub signal: i32,
    pub before_s: u64,
    pub batch_only: bool,
}

impl WarnSignal {
    pub fn parse(text: &str) -> Result<WarnSignal, String> {
        let (batch_only, rest) = match text.trim().split_once(':') {
            Some((p, rest)) if p.eq_ignore_ascii_case("B") => (true, rest),
            Some((p, rest)) if p.eq_ignore_ascii_case("R") => (false, rest),
            Some((p, _)) => return Err(format!("'{p}:' is not a known prefix (B: for the batch shell only)")),
            None => (false, text.trim()),
        };
        let (sig, before_s) = match rest.split_once('@') {
            Some((sig, secs)) => {
                (sig, secs.trim().parse::<u64>().map_err(|_| format!("'{secs}' is not a number of seconds"))?)
            }
            None => (rest, 60),
        };
        Ok(WarnSignal { signal: parse_signal(sig)?, before_s, batch_only })
    }

    /// The canonical form, `[B:]NUMBER@SECONDS`.
    pub fn to_spec(&self) -> String {
        format!("{}{}@{}", if self.batch_only { "B:" } else { "" }, self.signal, self.before_s)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DependencyKind {
    /// The other job has started (or ended).
    After,
    /// The other job has ended, however.
    AfterAny,
    /// The other job has completed successfully.
    AfterOk,
    /// The other job has ended unsuccessfully.
    AfterNotOk,
    /// Each task of this array waits for the task with the same task id in the other array to
    /// complete successfully; a job that is not an array task, or whose task the other array
    /// lacks, waits for the whole other job as `afterok` does. From feature level 12.
    AfterCorr,
}

impl DependencyKind {
    /// Slurm's name for it.
    pub fn name(self) -> &'static str {
        match self {
            DependencyKind::After => "after",
            DependencyKind::AfterAny => "afterany",
            DependencyKind::AfterOk => "afterok",
            DependencyKind::AfterNotOk => "afternotok",
            DependencyKind::AfterCorr => "aftercorr",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Dependency {
    pub kind: DependencyKind,
    pub job: JobId,
    /// `+MINUTES` after the id: an `after` dependency is satisfied that long after the other
    /// job started (or was cancelled). Slurm 22.05 accepts it on the other kinds too, shows it,
    /// and waits no longer for it; so does Quorum. From feature level 12.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delay_min: u32,
}

/// What `--dependency` asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dependencies {
    pub list: Vec<Dependency>,
    /// `singleton`.
    pub singleton: bool,
    /// Joined by `?`: any one of `list` is enough. Slurm reads a `?` anywhere as "any of" for
    /// the whole list, and so does this.
    pub any: bool,
}

/// The most minutes a `+TIME` may say: a year.
const MAX_DEPENDENCY_DELAY_MIN: u32 = 366 * 24 * 60;

/// Parses Slurm's `--dependency`: `afterok:12:13,afterany:14,singleton`, `after:12+5` (minutes),
/// `aftercorr:12`, and items joined by `?` instead of `,` (any of them).
pub fn parse_dependencies(value: &str) -> Result<Dependencies, String> {
    let mut out = Dependencies { any: value.contains('?'), ..Dependencies::default() };
    for item in value.split([',', '?']).map(str::trim).filter(|s| !s.is_empty()) {
        if item == "singleton" {
            out.singleton = true;
            continue;
        }
        let mut parts = item.split(':');
        let kind = match parts.next().unwrap_or("") {
            "after" => DependencyKind::After,
            "afterany" => DependencyKind::AfterAny,
            "afterok" => DependencyKind::AfterOk,
            "afternotok" => DependencyKind::AfterNotOk,
            "aftercorr" => DependencyKind::AfterCorr,
            other => {
                return Err(format!(
                    "invalid --dependency '{value}': unknown type '{other}' (after, afterany, afterok, afternotok, aftercorr, singleton)"
                ))
            }
        };
        let mut named = false;
        for word in parts {
            let (id, delay) = match word.split_once('+') {
                Some((id, minutes)) => {
                    let delay = minutes
                        .parse::<u32>()
                        .ok()
                        .filter(|m| *m <= MAX_DEPENDENCY_DELAY_MIN)
                        .ok_or_else(|| {
                            format!(
                                "invalid --dependency '{value}': '+{minutes}' is not a number of minutes (0 to {MAX_DEPENDENCY_DELAY_MIN})"
                            )
                        })?;
                    (id, delay)
                }
                None => (word, 0),
            };
            let job: JobId =
                id.parse().map_err(|_| format!("invalid --dependency '{value}': '{id}' is not a job id"))?;
            out.list.push(Dependency { kind, job, delay_min: delay });
            named = true;
        }
        if !named {
            return Err(format!("invalid --dependency '{value}': '{item}' names no job"));
        }
    }
    Ok(out)
}

/// Whether a node with `has` gives what `--constraint` asks: every feature of `wanted`, or with
/// `any` at least one of them. Nothing asked is always given.
pub fn features_match(wanted: &[String], any: bool, has: &[String]) -> bool {
    if any && !wanted.is_empty() {
        wanted.iter().any(|f| has.contains(f))
    } else {
        wanted.iter().all(|f| has.contains(f))
    }
}

/// `--constraint` as it was written: joined by `|` (any) or `&` (all); `[a|b]` when every
/// node must have the same one (`same`).
pub fn constraint_string(wanted: &[String], any: bool, same: bool) -> String {
    let joined = wanted.join(if any { "|" } else { "&" });
    if same {
        format!("[{joined}]")
    } else {
        joined
    }
}

/// `--constraint` with node counts as it was written: `[a*2&b*4]`, or `a*2` for one feature.
pub fn counted_constraint_string(wanted: &[String], counts: &[u32]) -> String {
    let joined: Vec<String> = wanted.iter().zip(counts).map(|(f, c)| format!("{f}*{c}")).collect();
    match joined.len() {
        1 => joined[0].clone(),
        _ => format!("[{}]", joined.join("&")),
    }
}

/// How many candidate visits one [`assign_feature_counts`] may make before it gives up: a job
/// of thousands of counted nodes on a cluster of thousands, with features shared between them,
/// must not hold the scheduler (nor the stack: the search keeps its own).
const ASSIGN_BUDGET: usize = 4_000_000;

/// Which of `candidates` (each node's features, best first) give `--constraint` node counts:
/// `counts[i]` nodes with `wanted[i]`, no node counted twice. Returns, for each counted node
/// in the order of `wanted`, its index in `candidates`; `None` when no choice gives them all
/// (or the search ran past [`ASSIGN_BUDGET`]). Each count takes the best free candidates
/// first; when none is left for one, a node taken earlier is moved to another feature it has
/// (augmenting paths), so the answer is exact even where nodes have several of the features.
pub fn assign_feature_counts(wanted: &[String], counts: &[u32], candidates: &[&[String]]) -> Option<Vec<usize>> {
    if counts.iter().map(|&c| c as usize).fold(0usize, usize::saturating_add) > candidates.len() {
        return None;
    }
    // One slot per node asked for: the index of its feature in `wanted`.
    let slots: Vec<usize> = counts.iter().enumerate().flat_map(|(f, &c)| std::iter::repeat_n(f, c as usize)).collect();
    let has = |c: usize, slot: usize| candidates[c].contains(&wanted[slots[slot]]);
    let mut owner: Vec<Option<usize>> = vec![None; candidates.len()];
    let mut of_slot: Vec<usize> = vec![usize::MAX; slots.len()];
    // Per feature, where the scan for a free candidate resumes: those before it are taken or
    // lack the feature (a taken candidate is never freed), so the common case costs one pass.
    let mut cursor = vec![0usize; wanted.len()];
    let mut budget = ASSIGN_BUDGET;
    for s in 0..slots.len() {
        let at = &mut cursor[slots[s]];
        while *at < candidates.len() && (owner[*at].is_some() || !has(*at, s)) {
            *at += 1;
        }
        if *at < candidates.len() {
            owner[*at] = Some(s);
            of_slot[s] = *at;
        } else if !augment(s, candidates.len(), &has, &mut owner, &mut of_slot, &mut budget) {
            return None;
        }
    }
    Some(of_slot)
}

/// Kuhn's augmenting path from slot `s0`, searched with a stack of its own: gives it a
/// candidate with its feature, moving each slot on the path to another of its own.
fn augment(
    s0: usize,
    n: usize,
    has: &impl Fn(usize, usize) -> bool,
    owner: &mut [Option<usize>],
    of_slot: &mut [usize],
    budget: &mut usize,
) -> bool {
    let mut seen = vec![false; n];
    // (slot, next candidate to try); `path[i]` is the candidate `stack[i]`'s slot would take.
    let mut stack: Vec<(usize, usize)> = vec![(s0, 0)];
    let mut path: Vec<usize> = Vec::new();
    while let Some(top) = stack.len().checked_sub(1) {
        let s = stack[top].0;
        let mut found = None;
        while stack[top].1 < n {
            let c = stack[top].1;
            stack[top].1 += 1;
            *budget = match budget.checked_sub(1) {
                Some(b) => b,
                None => return false,
            };
            if !seen[c] && has(c, s) {
                seen[c] = true;
                found = Some(c);
                break;
            }
        }
        match found.map(|c| (c, owner[c])) {
            // This slot cannot move: the one before it tries its next candidate.
            None => {
                stack.pop();
                path.pop();
            }
            Some((c, Some(other))) => {
                path.push(c);
                stack.push((other, 0));
            }
            Some((c, None)) => {
                path.push(c);
                for (&(slot, _), &taken) in stack.iter().zip(&path) {
                    owner[taken] = Some(slot);
                    of_slot[slot] = taken;
                }
                return true;
            }
        }
    }
    false
}

/// Whether `nodes` (each node's features) all have one same feature of `wanted`, as a
/// matching OR (`[a|b]`) asks.
pub fn share_a_feature<'n>(wanted: &[String], nodes: impl Iterator<Item = &'n [String]> + Clone) -> bool {
    wanted.iter().any(|f| nodes.clone().all(|n| n.contains(f)))
}

/// `--licenses`: `name[:count]` joined by commas (a count of 1 when none is given), as Slurm
/// writes them. Slurm's `|` (any of) and `@server` (remote) licenses are refused by name.
pub fn parse_licenses(value: &str) -> Result<BTreeMap<String, u32>, String> {
    let bad = |why: String| Err(format!("invalid --licenses '{value}': {why}"));
    if value.contains('|') {
        return bad("licenses joined by | (any of them) are not supported; join them by commas".into());
    }
    let mut out = BTreeMap::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, count) = match item.split_once([':', '*']) {
            Some((name, count)) => match count.trim().parse::<u32>() {
                Ok(c) if c > 0 => (name.trim(), c),
                _ => return bad(format!("'{count}' is not a count of licenses (1 or more)")),
            },
            None => (item, 1),
        };
        if name.is_empty() || name.contains('@') || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return bad(format!("'{name}' is not a license name (remote licenses, name@server, are not supported)"));
        }
        let total = out.entry(name.to_string()).or_insert(0u32);
        *total = total.saturating_add(count);
    }
    if out.is_empty() {
        return bad("it names no license".into());
    }
    Ok(out)
}

/// Licenses as Slurm shows them: `matlab:2,fluent:1`.
pub fn licenses_string(licenses: &BTreeMap<String, u32>) -> String {
    licenses.iter().map(|(n, c)| format!("{n}:{c}")).collect::<Vec<_>>().join(",")
}

/// The dependencies in `--dependency` syntax, as Slurm shows them.
pub fn dependency_string(deps: &[Dependency], singleton: bool, any: bool) -> String {
    let mut parts: Vec<String> = deps
        .iter()
        .map(|d| match d.delay_min {
            0 => format!("{}:{}", d.kind.name(), d.job),
            m => format!("{}:{}+{m}", d.kind.name(), d.job),
        })
        .collect();
    if singleton {
        parts.push("singleton".into());
    }
    parts.join(if any { "?" } else { "," })
}

/// Who holds a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum HoldKind {
    User,
    Admin,
}

impl HoldKind {
    /// What a job held this way is pending for.
    pub fn reason(self) -> PendingReason {
        match self {
            HoldKind::User => PendingReason::JobHeldUser,
            HoldKind::Admin => PendingReason::JobHeldAdmin,
        }
    }
}

impl JobSpec {
    /// CPUs the job needs on each of its nodes: its tasks spread evenly, rounded up. Bounded by
    /// [`JobSpec::check_shape`] at admission (saturating, should an unchecked spec reach it).
    pub fn cpus_per_node(&self) -> u32 {
        if self.overcommit {
            return self.cpus_per_task;
        }
        self.ntasks.div_ceil(self.nodes.max(1)).saturating_mul(self.cpus_per_task)
    }

    /// Whether the job may have the node `name` with `features`: it has every feature asked
    /// for, is not excluded, and is in the node list when that lists all of the job's nodes (a
    /// shorter list names nodes the job must have among others, from feature level 13).
    pub fn may_use(&self, name: &str, features: &[String]) -> bool {
        (self.counts_features() || features_match(&self.constraint, self.constraint_any, features))
            && !self.exclude.iter().any(|x| x == name)
            && (!self.lists_every_node() || self.nodelist.iter().any(|x| x == name))
    }

    /// Whether `--constraint` counts nodes per feature (`[a*2&b*4]`): then it asks nothing of
    /// each node alone.
    pub fn counts_features(&self) -> bool {
        !self.constraint_counts.is_empty()
    }

    /// The nodes its `--constraint` counts, all features together.
    pub fn counted_nodes(&self) -> u64 {
        self.constraint_counts.iter().map(|&c| u64::from(c)).sum()
    }

    /// `--constraint` as the user wrote it (Slurm's `Features=`).
    pub fn constraint_text(&self) -> String {
        if self.counts_features() {
            counted_constraint_string(&self.constraint, &self.constraint_counts)
        } else {
            constraint_string(&self.constraint, self.constraint_any, self.constraint_same)
        }
    }

    /// Whether the spec carries what only feature level 15 records (`--constraint` node counts).
    pub fn uses_level_15(&self) -> bool {
        self.counts_features()
    }

    /// Whether `--nodelist` names every node of the job (not only some it must have).
    pub fn lists_every_node(&self) -> bool {
        !self.nodelist.is_empty() && self.nodelist.len() >= self.nodes as usize
    }

    /// Whether the spec carries what only feature level 13 records (`--kill-on-invalid-dep`,
    /// `--gid`, `-C [a|b]`, a node list naming only some of the job's nodes).
    pub fn uses_level_13(&self) -> bool {
        self.kill_on_invalid_dep
            || self.constraint_same
            || self.run_group.is_some()
            || (!self.nodelist.is_empty() && !self.lists_every_node())
    }

    /// Whether the spec carries what only feature level 12 records (`aftercorr`, `after:ID+TIME`,
    /// dependencies joined by `?`, features joined by `|`, `--priority`, `--licenses`).
    pub fn uses_level_12(&self) -> bool {
        !self.licenses.is_empty()
            || self.priority.is_some()
            || self.constraint_any
            || self.dependency_any
            || self.dependencies.iter().any(|d| d.kind == DependencyKind::AfterCorr || d.delay_min > 0)
    }

    /// Whether the spec carries what only feature level 11 records (notes, `--open-mode`, node
    /// lists and exclusions, a script's arguments).
    pub fn uses_level_11(&self) -> bool {
        !self.notes.is_empty()
            || self.append_output
            || !self.exclude.is_empty()
            || !self.nodelist.is_empty()
            || !self.script_args.is_empty()
    }

    pub fn check_shape(&self) -> Result<(), Rejection> {
        let invalid = |field: &str, reason: String| Err(Rejection::InvalidSpec { field: field.to_string(), reason });
        if self.nodes == 0 {
            return invalid("nodes", "must be at least 1".into());
        }
        if self.reservation.as_ref().is_some_and(|r| r.is_empty() || r.len() > reservation::MAX_NAME_LEN) {
            return invalid(
                "reservation",
                format!("a reservation's name has 1 to {} bytes", reservation::MAX_NAME_LEN),
            );
        }
        if let Some(c) = &self.container {
            c.check().or_else(|reason| invalid("container", reason))?;
        }
        if self.ntasks == 0 {
            return invalid("ntasks", "must be at least 1".into());
        }
        if self.ntasks < self.nodes {
            return invalid("ntasks", format!("{} tasks cannot spread over {} nodes", self.ntasks, self.nodes));
        }
        if self.cpus_per_task == 0 {
            return invalid("cpus_per_task", "must be at least 1".into());
        }
        match &self.program {
            Program::Argv(argv) if argv.is_empty() || argv[0].trim().is_empty() => {
                return invalid("command", "empty command".into())
            }
            Program::Script(s) if s.trim().is_empty() => return invalid("script", "empty script".into()),
            _ => {}
        }
        if let Some(t) = &self.gpu_type {
            if t.is_empty() || t.contains(|c: char| c.is_whitespace() || c == ':') {
                return invalid("gpu_type", format!("'{t}' is not a GPU type name"));
            }
        }
        if self.nodelist.len() > self.nodes as usize {
            return invalid(
                "nodelist",
                format!(
                    "{} nodes listed for a job of {} nodes: a job has every node it lists, so ask for at least as many as you list",
                    self.nodelist.len(),
                    self.nodes
                ),
            );
        }
        if self.counts_features() {
            if self.constraint_counts.len() != self.constraint.len() || self.constraint_counts.contains(&0) {
                return invalid("constraint", "give one node count of 1 or more for each feature".into());
            }
            if self.constraint_any || self.constraint_same {
                return invalid("constraint", "features with node counts are joined by & only".into());
            }
            if self.counted_nodes() > u64::from(self.nodes) {
                return invalid(
                    "constraint",
                    format!(
                        "{} counts {} nodes, more than the {} the job asks for",
                        self.constraint_text(),
                        self.counted_nodes(),
                        self.nodes
                    ),
                );
            }
            if !self.nodelist.is_empty() {
                return invalid("constraint", "node counts per feature and --nodelist cannot be given together".into());
            }
        }
        if self.gpu_type.is_some() && self.gpus_per_node == 0 {
            return invalid("gpus", "a GPU type was given without a GPU count".into());
        }
        if self.name.len() > 1024 {
            return invalid("name", "longer than 1024 bytes".into());
        }
        self.check_bounds()
    }

    /// What a user sends, bounded: counts and sizes that fit what any cluster has and that no
    /// arithmetic on them overflows, and text without control characters (which would rewrite
    /// other users' terminals in `quorum queue`) or NUL bytes (which fail only at launch).
    /// About how many bytes the spec takes in a Raft entry: its script, command and environment
    /// as JSON strings, and a little for the rest.
    pub fn encoded_bytes(&self) -> usize {
        let program = match &self.program {
            Program::Script(s) => json_len(s),
            Program::Argv(argv) => argv.iter().map(|a| json_len(a) + 1).sum(),
        } + self.script_args.iter().map(|a| json_len(a) + 1).sum::<usize>();
        let env: usize = self.env.iter().map(|(k, v)| json_len(k) + json_len(v) + 4).sum();
        let paths = [&self.work_dir, &self.submit_dir].iter().map(|p| json_len(p)).sum::<usize>();
        program + env + paths + self.name.len() + 1024
    }

    fn check_bounds(&self) -> Result<(), Rejection> {
        let invalid = |field: &str, reason: String| Err(Rejection::InvalidSpec { field: field.to_string(), reason });
        if self.nodes > limits::MAX_NODES {
            return invalid("nodes", format!("{} nodes: at most {}", self.nodes, limits::MAX_NODES));
        }
        if self.ntasks > limits::MAX_TASKS {
            return invalid("ntasks", format!("{} tasks: at most {}", self.ntasks, limits::MAX_TASKS));
        }
        let per_node = self.ntasks.div_ceil(self.nodes.max(1)).checked_mul(self.cpus_per_task);
        if per_node.is_none_or(|c| c > limits::MAX_CPUS_PER_NODE) {
            return invalid(
                "cpus_per_task",
                format!(
                    "{} tasks of {} CPUs on {} nodes need more than {} CPUs on a node",
                    self.ntasks,
                    self.cpus_per_task,
                    self.nodes,
                    limits::MAX_CPUS_PER_NODE
                ),
            );
        }
        if self.gpus_per_node > limits::MAX_GPUS_PER_NODE {
            return invalid(
                "gpus",
                format!("{} GPUs per node: at most {}", self.gpus_per_node, limits::MAX_GPUS_PER_NODE),
            );
        }
        if self.mem_per_node_mb.is_some_and(|m| m > limits::MAX_MEM_MB) {
            return invalid("mem", format!("more than {} MB on a node", limits::MAX_MEM_MB));
        }
        if self.time_limit_s.is_some_and(|t| t > parse::MAX_TIME_LIMIT_S) {
            return invalid("time_limit", "longer than 100 years (use UNLIMITED for none)".into());
        }
        if let Some(c) = self.name.chars().find(|c| c.is_control()) {
            return invalid("name", format!("contains the control character {:?}", c));
        }
        match &self.program {
            Program::Script(s) if s.len() > limits::MAX_SCRIPT_BYTES => {
                return invalid("script", format!("{} bytes: at most {}", s.len(), limits::MAX_SCRIPT_BYTES))
            }
            Program::Script(s) if s.contains('\0') => return invalid("script", "contains a NUL byte".into()),
            Program::Script(s)
                if self.script_args.len() > limits::MAX_ARGS
                    || s.len() + self.script_args.iter().map(String::len).sum::<usize>() > limits::MAX_SCRIPT_BYTES
                    || self.script_args.iter().any(|a| a.contains('\0')) =>
            {
                return invalid(
                    "script_args",
                    format!(
                        "at most {} arguments of {} bytes with the script, without NUL",
                        limits::MAX_ARGS,
                        limits::MAX_SCRIPT_BYTES
                    ),
                )
            }
            Program::Argv(argv) => {
                let bytes: usize = argv.iter().map(String::len).sum();
                if argv.len() > limits::MAX_ARGS || bytes > limits::MAX_SCRIPT_BYTES {
                    return invalid(
                        "command",
                        format!("at most {} arguments and {} bytes", limits::MAX_ARGS, limits::MAX_SCRIPT_BYTES),
                    );
                }
                if argv.iter().any(|a| a.contains('\0')) {
                    return invalid("command", "an argument contains a NUL byte".into());
                }
            }
            _ => {}
        }
        let (mut vars, mut bytes) = (0usize, 0usize);
        for (name, value) in self.env.iter() {
            vars += 1;
            bytes += name.len() + value.len();
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return invalid("env", format!("variable {name:?}: a name without '=' and NUL, a value without NUL"));
            }
        }
        if vars > limits::MAX_ENV_VARS || bytes > limits::MAX_ENV_BYTES {
            return invalid(
                "env",
                format!(
                    "{vars} variables of {bytes} bytes: at most {} and {}",
                    limits::MAX_ENV_VARS,
                    limits::MAX_ENV_BYTES
                ),
            );
        }
        let notes = &self.notes;
        for (field, text) in [
            ("comment", &notes.comment),
            ("wckey", &notes.wckey),
            ("mail_type", &notes.mail_type),
            ("mail_user", &notes.mail_user),
        ] {
            if text.len() > limits::MAX_NOTE_BYTES {
                return invalid(field, format!("{} bytes: at most {}", text.len(), limits::MAX_NOTE_BYTES));
            }
            if let Some(c) = text.chars().find(|c| c.is_control()) {
                return invalid(field, format!("contains the control character {c:?}"));
            }
        }
        for (field, names) in [("exclude", &self.exclude), ("nodelist", &self.nodelist)] {
            if names.len() > limits::MAX_NODES as usize || names.iter().any(|n| n.is_empty() || n.len() > 255) {
                return invalid(field, format!("at most {} node names of 1 to 255 bytes", limits::MAX_NODES));
            }
        }
        if self.dependencies.len() > limits::MAX_DEPENDENCIES {
            return invalid(
                "dependency",
                format!("{} jobs: at most {}", self.dependencies.len(), limits::MAX_DEPENDENCIES),
            );
        }
        for (field, text) in [("work_dir", &self.work_dir), ("submit_dir", &self.submit_dir)] {
            if text.len() > limits::MAX_PATH_BYTES || text.contains('\0') {
                return invalid(field, format!("a path of at most {} bytes without NUL", limits::MAX_PATH_BYTES));
            }
        }
        for (field, text) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if text.as_ref().is_some_and(|t| t.len() > limits::MAX_PATH_BYTES || t.contains('\0')) {
                return invalid(field, format!("a path of at most {} bytes without NUL", limits::MAX_PATH_BYTES));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
    /// The OOM killer killed a process of it in its cgroup.
    OutOfMemory,
    /// Ended to make room for another job (preempt mode CANCEL).
    Preempted,
    /// Stopped by an operator (`scontrol suspend`): it keeps its allocation, its processes are
    /// frozen, and its time limit waits, until it is resumed.
    Suspended,
}

impl JobState {
    pub const ALL: [JobState; 10] = [
        JobState::Pending,
        JobState::Running,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::NodeFail,
        JobState::OutOfMemory,
        JobState::Preempted,
        JobState::Suspended,
    ];

    pub fn is_finished(self) -> bool {
        !matches!(self, JobState::Pending | JobState::Running | JobState::Suspended)
    }

    /// Running or suspended: it holds an allocation.
    pub fn is_allocated(self) -> bool {
        matches!(self, JobState::Running | JobState::Suspended)
    }

    /// The two-letter code squeue prints.
    pub fn short(self) -> &'static str {
        match self {
            JobState::Pending => "PD",
            JobState::Running => "R",
            JobState::Completed => "CD",
            JobState::Failed => "F",
            JobState::Cancelled => "CA",
            JobState::Timeout => "TO",
            JobState::NodeFail => "NF",
            JobState::OutOfMemory => "OOM",
            JobState::Preempted => "PR",
            JobState::Suspended => "S",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::NodeFail => "NODE_FAIL",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
            JobState::Preempted => "PREEMPTED",
            JobState::Suspended => "SUSPENDED",
        }
    }

    pub fn from_name(s: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|st| st.name().eq_ignore_ascii_case(s) || st.short().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a pending job is not running, with Slurm's names so that users recognise them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PendingReason {
    /// Not yet looked at by the scheduler.
    #[default]
    None,
    /// Waiting behind a higher-priority job.
    Priority,
    /// The highest-priority job of its partition, waiting for resources to free up.
    Resources,
    /// No node of the partition has registered yet.
    PartitionNoNodes,
    Dependency,
    DependencyNeverSatisfied,
    BeginTime,
    JobHeldUser,
    JobHeldAdmin,
    PartitionTimeLimit,
    PartitionNodeLimit,
    QOSMaxWallDurationPerJobLimit,
    QOSMaxGRESPerUser,
    QOSMaxJobsPerUserLimit,
    AssocMaxJobsLimit,
    AssocGrpGRES,
    AssocGrpCpuLimit,
    AssocGrpMemLimit,
    AssocGrpNodeLimit,
    AssocMaxWallDurationPerJobLimit,
    /// No node has the requested features (`--constraint`).
    BadConstraints,
    /// As many tasks of its array run as its throttle (`--array=...%N`) allows.
    JobArrayTaskLimit,
    /// Too few of the licenses it asks for (`--licenses`) are free. From feature level 12.
    Licenses,
    /// Its reservation (`--reservation`) is not in force yet. From feature level 18.
    Reservation,
    /// Its reservation no longer exists (it ended, or was deleted).
    ReservationDeleted,
    /// Nodes it could have are in a maintenance reservation (`Flags=MAINT`).
    ReservedForMaintenance,
    /// Nodes it could have are in another advance reservation.
    ReservedForOthers,
    // Limits from feature level 20: what one job may ask for, what one user's or a whole QOS's
    // running jobs may hold, and budgets of TRES-minutes.
    QOSMaxCpuPerJobLimit,
    QOSMaxGRESPerJob,
    QOSMaxMemoryPerJob,
    QOSMaxNodePerJobLimit,
    AssocMaxCpuPerJobLimit,
    AssocMaxGRESPerJob,
    AssocMaxMemPerJob,
    AssocMaxNodePerJobLimit,
    QOSMaxCpuPerUserLimit,
    QOSMaxMemoryPerUser,
    QOSMaxNodePerUserLimit,
    QOSGrpCpuLimit,
    QOSGrpGRES,
    QOSGrpMemLimit,
    QOSGrpNodeLimit,
    QOSGrpJobsLimit,
    AssocGrpCPUMinutesLimit,
    AssocGrpGRESMinutes,
    QOSGrpCPUMinutesLimit,
    QOSGrpGRESMinutes,
    /// Its partition no longer admits its account (`AllowAccounts`/`DenyAccounts` changed).
    AccountNotAllowed,
    /// Its partition no longer admits its QOS (`AllowQos`/`DenyQos` changed).
    QOSNotAllowed,
    /// Its partition is DOWN: it takes jobs but starts none. From feature level 32.
    PartitionDown,
    /// Its partition is INACTIVE: it neither takes nor starts jobs. From feature level 32.
    PartitionInactive,
}

impl PendingReason {
    pub fn name(self) -> &'static str {
        match self {
            PendingReason::None => "None",
            PendingReason::Priority => "Priority",
            PendingReason::Resources => "Resources",
            PendingReason::PartitionNoNodes => "PartitionNoNodes",
            PendingReason::Dependency => "Dependency",
            PendingReason::DependencyNeverSatisfied => "DependencyNeverSatisfied",
            PendingReason::BeginTime => "BeginTime",
            PendingReason::JobHeldUser => "JobHeldUser",
            PendingReason::JobHeldAdmin => "JobHeldAdmin",
            PendingReason::PartitionTimeLimit => "PartitionTimeLimit",
            PendingReason::PartitionNodeLimit => "PartitionNodeLimit",
            PendingReason::QOSMaxWallDurationPerJobLimit => "QOSMaxWallDurationPerJobLimit",
            PendingReason::QOSMaxGRESPerUser => "QOSMaxGRESPerUser",
            PendingReason::QOSMaxJobsPerUserLimit => "QOSMaxJobsPerUserLimit",
            PendingReason::AssocMaxJobsLimit => "AssocMaxJobsLimit",
            PendingReason::AssocGrpGRES => "AssocGrpGRES",
            PendingReason::AssocGrpCpuLimit => "AssocGrpCpuLimit",
            PendingReason::AssocGrpMemLimit => "AssocGrpMemLimit",
            PendingReason::AssocGrpNodeLimit => "AssocGrpNodeLimit",
            PendingReason::AssocMaxWallDurationPerJobLimit => "AssocMaxWallDurationPerJobLimit",
            PendingReason::BadConstraints => "BadConstraints",
            PendingReason::JobArrayTaskLimit => "JobArrayTaskLimit",
            PendingReason::Licenses => "Licenses",
            PendingReason::Reservation => "Reservation",
            PendingReason::ReservationDeleted => "ReservationDeleted",
            PendingReason::ReservedForMaintenance => "ReqNodeNotAvail, Reserved for maintenance",
            PendingReason::ReservedForOthers => "ReqNodeNotAvail, May be reserved for other job",
            PendingReason::QOSMaxCpuPerJobLimit => "QOSMaxCpuPerJobLimit",
            PendingReason::QOSMaxGRESPerJob => "QOSMaxGRESPerJob",
            PendingReason::QOSMaxMemoryPerJob => "QOSMaxMemoryPerJob",
            PendingReason::QOSMaxNodePerJobLimit => "QOSMaxNodePerJobLimit",
            PendingReason::AssocMaxCpuPerJobLimit => "AssocMaxCpuPerJobLimit",
            PendingReason::AssocMaxGRESPerJob => "AssocMaxGRESPerJob",
            PendingReason::AssocMaxMemPerJob => "AssocMaxMemPerJob",
            PendingReason::AssocMaxNodePerJobLimit => "AssocMaxNodePerJobLimit",
            PendingReason::QOSMaxCpuPerUserLimit => "QOSMaxCpuPerUserLimit",
            PendingReason::QOSMaxMemoryPerUser => "QOSMaxMemoryPerUser",
            PendingReason::QOSMaxNodePerUserLimit => "QOSMaxNodePerUserLimit",
            PendingReason::QOSGrpCpuLimit => "QOSGrpCpuLimit",
            PendingReason::QOSGrpGRES => "QOSGrpGRES",
            PendingReason::QOSGrpMemLimit => "QOSGrpMemLimit",
            PendingReason::QOSGrpNodeLimit => "QOSGrpNodeLimit",
            PendingReason::QOSGrpJobsLimit => "QOSGrpJobsLimit",
            PendingReason::AssocGrpCPUMinutesLimit => "AssocGrpCPUMinutesLimit",
            PendingReason::AssocGrpGRESMinutes => "AssocGrpGRESMinutes",
            PendingReason::QOSGrpCPUMinutesLimit => "QOSGrpCPUMinutesLimit",
            PendingReason::QOSGrpGRESMinutes => "QOSGrpGRESMinutes",
            PendingReason::AccountNotAllowed => "AccountNotAllowed",
            PendingReason::QOSNotAllowed => "QOSNotAllowed",
            PendingReason::PartitionDown => "PartitionDown",
            PendingReason::PartitionInactive => "PartitionInactive",
        }
    }
}

/// What one node holds for a job. GPUs are named by index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAllocation {
    pub node: String,
    pub cpus: u32,
    pub mem_mb: u64,
    pub gpus: Vec<u32>,
    /// The component of a heterogeneous job it is for (0 for any other job). From feature
    /// level 25.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub het_group: u32,
}

/// Everything a running job holds, one entry per node in rank order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub nodes: Vec<NodeAllocation>,
    /// `Some(N)`: each of its CPUs is shared with up to N jobs (its partition's
    /// `OverSubscribe`), and counts as 1/N of a CPU on its node. From feature level 24.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ways: Option<u32>,
}

impl Allocation {
    /// How many ways its CPUs are shared (1: not).
    pub fn ways(&self) -> u32 {
        self.cpu_ways.unwrap_or(1).max(1)
    }

    pub fn nodelist(&self) -> String {
        let names: Vec<&str> = self.nodes.iter().map(|n| n.node.as_str()).collect();
        hostlist::compress(&names)
    }

    /// What it holds for component `k` of a heterogeneous job (everything, for another job's
    /// component 0).
    pub fn group(&self, k: u32) -> impl Iterator<Item = &NodeAllocation> {
        self.nodes.iter().filter(move |n| n.het_group == k)
    }

    /// The nodes of component `k`, as a host list.
    pub fn group_nodelist(&self, k: u32) -> String {
        let names: Vec<&str> = self.group(k).map(|n| n.node.as_str()).collect();
        hostlist::compress(&names)
    }
}

/// How one rank of a job ended on its node, as its agent reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RankOutcome {
    Exited {
        code: i32,
        signal: i32,
    },
    TimedOut {
        code: i32,
        signal: i32,
    },
    Cancelled {
        code: i32,
        signal: i32,
    },
    LaunchFailed,
    /// The OOM killer killed a process of it.
    OutOfMemory {
        code: i32,
        signal: i32,
    },
    /// The agent killed it itself: it lost contact with the controllers for its lease.
    LostContact,
    /// The node's prolog failed before it started there: the job goes back to the queue (and
    /// the node is drained). From feature level 21.
    PrologFailed,
}

/// Why a job ended badly, as Slurm's controller sets an ended job's `Reason` (what `scontrol`
/// and `squeue` show where a waiting job shows its [`PendingReason`]). Derived from what the job
/// recorded, never stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// A rank's program could not start, or a signal ended the job.
    JobLaunchFailure,
    NonZeroExitCode,
    TimeLimit,
    OutOfMemory,
}

impl EndReason {
    const ALL: [EndReason; 4] =
        [EndReason::JobLaunchFailure, EndReason::NonZeroExitCode, EndReason::TimeLimit, EndReason::OutOfMemory];

    pub fn name(self) -> &'static str {
        match self {
            EndReason::JobLaunchFailure => "JobLaunchFailure",
            EndReason::NonZeroExitCode => "NonZeroExitCode",
            EndReason::TimeLimit => "TimeLimit",
            EndReason::OutOfMemory => "OutOfMemory",
        }
    }

    pub fn from_name(name: &str) -> Option<EndReason> {
        EndReason::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Why `job` ended, if it ended badly; `None` for every other end and for a job not ended.
    pub fn of(job: &Job) -> Option<EndReason> {
        let launch_failed = || job.rank_outcomes.iter().any(|(_, o)| *o == RankOutcome::LaunchFailed);
        match job.state {
            JobState::Failed if launch_failed() || job.signal.is_some_and(|s| s != 0) => {
                Some(EndReason::JobLaunchFailure)
            }
            JobState::Failed if job.exit_code.is_some_and(|c| c != 0) => Some(EndReason::NonZeroExitCode),
            JobState::Timeout => Some(EndReason::TimeLimit),
            JobState::OutOfMemory => Some(EndReason::OutOfMemory),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    /// Shared by the tasks of an array (one copy however many tasks); serialized as the value.
    pub spec: Shared<JobSpec>,
    pub user: String,
    pub partition: String,
    pub state: JobState,
    pub reason: PendingReason,
    pub submit_time: Millis,
    pub start_time: Option<Millis>,
    pub end_time: Option<Millis>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub allocation: Option<Allocation>,
    /// Log index of the command that allocated the job: the fencing token of its launch.
    pub alloc_index: u64,
    pub cancel_requested: bool,
    /// Ranks that have reported their end, by node.
    pub rank_outcomes: Vec<(String, RankOutcome)>,
    pub request_id: String,
    #[serde(default)]
    pub held: Option<HoldKind>,
    /// The account charged, resolved at submit.
    #[serde(default)]
    pub account: String,
    /// The QOS, resolved at submit.
    #[serde(default)]
    pub qos: String,
    /// Times it went back to the queue after a node failure.
    #[serde(default)]
    pub requeues: u32,
    /// The array this job is a task of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayTask>,
    /// Its steps (`srun`): every running one and the newest ended ones
    /// ([`step::KEPT_ENDED_STEPS`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<step::Step>,
    /// The id its next step gets.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_step: u32,
    /// Who cancelled it (a user name; operators act as root), from feature level 13.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_by: Option<String>,
    /// What its batch script used (with every process it waited for), summed over the nodes
    /// that reported (from feature level 14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<JobUsage>,
    /// What its steps (`srun`) used, summed over every step that ended, those no longer kept in
    /// `steps` too (from feature level 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_usage: Option<JobUsage>,
    /// Being stopped to make room for another job (level 17).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempting: Option<preempt::Preempting>,
    /// The job that last preempted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<JobId>,
    /// Pending: the nodes it preempted jobs for, held for it until it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<preempt::Claim>,
    /// Suspended since then (level 17).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_at: Option<Millis>,
    /// How long it was suspended before, in all: its time limit waits that long.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub suspended_ms: u64,
    /// The end of the reservation window it started in: it is stopped there (level 18).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resv_end: Option<Millis>,
    /// Why it could not start, as its node said (an image that could not be pulled, a program
    /// not found): its reason once it ended (level 28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The starts it was shown while it waited (`squeue --start`), kept from its start for the
    /// job history (level 35).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown: Option<ShownStart>,
}

/// The starts a job was shown while it waited (`squeue --start`, `scontrol show job`): the
/// first one shown, and the one in force when it started. Each is backfill's reservation where
/// the job had one, else the leader's forecast; the leader keeps the first in memory, so after
/// a new leader is elected a job's first is the first that leader showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShownStart {
    pub first_ms: Millis,
    pub last_ms: Millis,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub gpu_type: String,
}

/// What an operator or the controller decided about a node, apart from what runs on it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeAdminState {
    #[default]
    Up,
    Drain {
        reason: String,
        /// Drained by the node's own health (a GPU failure, the health check), not by an
        /// operator: it resumes by itself when the node is healthy again.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        auto: bool,
    },
    Down {
        reason: String,
        /// Set DOWN by an operator (`scontrol update state=down`), not found silent: it stays
        /// DOWN when its agent is heard, until an operator resumes it. From feature level 32.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        operator: bool,
    },
}

/// sinfo's node states; IDLE, MIXED and ALLOCATED follow from what is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    Idle,
    Mixed,
    Allocated,
    Drain,
    Down,
}

impl NodeState {
    pub fn name(self) -> &'static str {
        match self {
            NodeState::Idle => "idle",
            NodeState::Mixed => "mixed",
            NodeState::Allocated => "allocated",
            NodeState::Drain => "drain",
            NodeState::Down => "down",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub cpus: u32,
    pub mem_mb: u64,
    pub gpus: Vec<Gpu>,
    pub features: Vec<String>,
    pub admin: NodeAdminState,
    pub alloc_cpus: u32,
    pub alloc_mem_mb: u64,
    pub alloc_gpus: BTreeSet<u32>,
    /// CPUs held by jobs that share them (`OverSubscribe`), by how many ways each is shared;
    /// `alloc_cpus` holds the others' ([`Node::cpus_fit`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shared_cpus: BTreeMap<u32, u32>,
    /// Jobs running here.
    pub jobs: BTreeSet<JobId>,
    pub agent_version: String,
    pub registered_at: Millis,
    /// Lower weights are allocated first, all else equal (Slurm's `Weight`; 1 unless an
    /// operator set it). From feature level 32.
    #[serde(default = "one_u32", skip_serializing_if = "is_one_u32")]
    pub weight: u32,
    /// Features an operator set (`scontrol update nodename=... features=...`), in force over
    /// those its agent reports until cleared. From feature level 32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features_set: Option<Vec<String>>,
    /// What ended allocations still hold here until this node's agent reports their processes
    /// gone (Slurm's COMPLETING): a job ends when its first rank decides it, or its node is
    /// declared DOWN, while its other ranks are still being killed. Counted in `alloc_cpus`,
    /// `shared_cpus`, `alloc_mem_mb` and `alloc_gpus` until then, so that no new job shares a
    /// CPU or GPU with them. From feature level 34.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub completing: Vec<Completing>,
}

/// One ended allocation's share of a node, held until the node's agent reports its processes
/// there gone ([`Node::completing`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completing {
    pub job_id: JobId,
    /// The allocation's fencing token.
    pub token: u64,
    /// CPUs held: 0 for a job suspended by preemption, which had lent its CPUs.
    pub cpus: u32,
    /// The ways those CPUs were shared (`OverSubscribe`).
    pub ways: u32,
    pub mem_mb: u64,
    pub gpus: Vec<u32>,
}

fn one_u32() -> u32 {
    1
}

fn is_one_u32(n: &u32) -> bool {
    *n == 1
}

impl Node {
    pub fn state(&self) -> NodeState {
        match self.admin {
            NodeAdminState::Down { .. } => NodeState::Down,
            NodeAdminState::Drain { .. } => NodeState::Drain,
            NodeAdminState::Up if self.jobs.is_empty() && self.completing.is_empty() => NodeState::Idle,
            NodeAdminState::Up
                if self.cpus_in_use() >= self.cpus
                    || (self.alloc_mem_mb >= self.mem_mb)
                    || (!self.gpus.is_empty() && self.alloc_gpus.len() >= self.gpus.len()) =>
            {
                NodeState::Allocated
            }
            NodeAdminState::Up => NodeState::Mixed,
        }
    }

    pub fn reason(&self) -> &str {
        match &self.admin {
            NodeAdminState::Up => "",
            NodeAdminState::Drain { reason, .. } | NodeAdminState::Down { reason, .. } => reason,
        }
    }

    /// Gives back what ended allocation `token` of `job_id` still held here, once its processes
    /// here are gone; whether it held anything.
    pub fn release_completing(&mut self, job_id: JobId, token: u64) -> bool {
        let Some(i) = self.completing.iter().position(|c| c.job_id == job_id && c.token == token) else {
            return false;
        };
        let c = self.completing.swap_remove(i);
        self.release(c.cpus, c.ways, c.mem_mb, &c.gpus);
        true
    }

    /// Gives back a share: `cpus` shared `ways` ways, memory and GPUs.
    pub fn release(&mut self, cpus: u32, ways: u32, mem_mb: u64, gpus: &[u32]) {
        self.release_cpus(cpus, ways);
        self.alloc_mem_mb = self.alloc_mem_mb.saturating_sub(mem_mb);
        for g in gpus {
            self.alloc_gpus.remove(g);
        }
    }

    /// New work may be placed here.
    pub fn schedulable(&self) -> bool {
        self.admin == NodeAdminState::Up
    }

    /// GPUs of a type (any type when `None`) the node has in all.
    pub fn gpu_count(&self, gpu_type: Option<&str>) -> u32 {
        self.gpus.iter().filter(|g| gpu_type.is_none_or(|t| g.gpu_type == t)).count() as u32
    }

    /// The node could ever hold one node's share of the request, were it empty.
    pub fn could_hold(&self, cpus: u32, mem_mb: u64, gpus: u32, gpu_type: Option<&str>) -> bool {
        self.cpus >= cpus && self.mem_mb >= mem_mb && self.gpu_count(gpu_type) >= gpus
    }

    /// Comma-separated GPU types with counts, like `h100:4`.
    pub fn gpu_summary(&self) -> String {
        let mut types: Vec<(&str, u32)> = Vec::new();
        for g in &self.gpus {
            match types.iter_mut().find(|(t, _)| *t == g.gpu_type) {
                Some((_, n)) => *n += 1,
                None => types.push((&g.gpu_type, 1)),
            }
        }
        types.iter().map(|(t, n)| format!("{t}:{n}")).collect::<Vec<_>>().join(",")
    }
}

/// A partition as the operator configured it; replicated so that every replica agrees.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    pub name: String,
    /// Hostlist expression naming its nodes.
    pub nodes: String,
    /// The expanded names, sorted.
    pub node_names: BTreeSet<String>,
    pub default: bool,
    pub max_time_s: Option<u64>,
    pub default_time_s: Option<u64>,
    pub default_mem_per_cpu_mb: u64,
    /// Priority tier: jobs of higher-tier partitions rank higher (the partition factor).
    #[serde(default)]
    pub priority_tier: u32,
    /// Most nodes one job may ask for (`PartitionNodeLimit`).
    #[serde(default)]
    pub max_nodes: Option<u32>,
    /// Every job gets whole nodes (Slurm's `OverSubscribe=EXCLUSIVE`).
    #[serde(default)]
    pub exclusive: bool,
    /// Whether its jobs share CPUs (`OverSubscribe=YES|FORCE[:N]`). From feature level 24.
    #[serde(default, skip_serializing_if = "oversubscribe::OverSubscribe::is_no")]
    pub oversubscribe: oversubscribe::OverSubscribe,
    /// What becomes of its jobs when preempted; `None`: the cluster's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_mode: Option<preempt::PreemptMode>,
    /// Seconds between a preempted job's SIGTERM and its SIGKILL (`GraceTime`; 0: the agent's
    /// kill wait).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub grace_time_s: u64,
    /// Which accounts and QOS it admits (all, unless it says).
    #[serde(default, skip_serializing_if = "PartitionAccess::is_open")]
    pub access: PartitionAccess,
    /// Whether it takes and starts jobs (Slurm's partition `State`). From feature level 32.
    #[serde(default, skip_serializing_if = "PartitionState::is_up")]
    pub state: PartitionState,
}

/// Whether a partition takes jobs and starts them, as Slurm's partition `State=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartitionState {
    /// Takes jobs and starts them.
    #[default]
    Up,
    /// Takes jobs, starts none (they wait, `PartitionDown`).
    Down,
    /// Takes no new jobs; those it has start as usual.
    Drain,
    /// Takes no new jobs and starts none.
    Inactive,
}

impl PartitionState {
    pub fn is_up(&self) -> bool {
        *self == PartitionState::Up
    }

    /// New jobs may be submitted to it.
    pub fn takes_jobs(self) -> bool {
        matches!(self, PartitionState::Up | PartitionState::Down)
    }

    /// Why its jobs may not start, if they may not.
    pub fn holds_back(self) -> Option<PendingReason> {
        match self {
            PartitionState::Up | PartitionState::Drain => None,
            PartitionState::Down => Some(PendingReason::PartitionDown),
            PartitionState::Inactive => Some(PendingReason::PartitionInactive),
        }
    }

    /// As Slurm writes it: `UP`, `DOWN`, `DRAIN`, `INACTIVE`.
    pub fn name(self) -> &'static str {
        match self {
            PartitionState::Up => "UP",
            PartitionState::Down => "DOWN",
            PartitionState::Drain => "DRAIN",
            PartitionState::Inactive => "INACTIVE",
        }
    }

    /// A state as Slurm takes it, in any case.
    pub fn parse(s: &str) -> Result<PartitionState, String> {
        match s.to_ascii_uppercase().as_str() {
            "UP" => Ok(PartitionState::Up),
            "DOWN" => Ok(PartitionState::Down),
            "DRAIN" => Ok(PartitionState::Drain),
            "INACTIVE" => Ok(PartitionState::Inactive),
            _ => Err(format!("'{s}' is not a partition state (UP, DOWN, DRAIN or INACTIVE)")),
        }
    }
}

/// Who may use a partition, as Slurm's `AllowAccounts`, `DenyAccounts`, `AllowQos` and
/// `DenyQos`: a partition of nodes a group bought admits its accounts only. An empty list says
/// nothing; accounts and QOS are named exactly (a sub-account is not its parent), as Slurm's are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionAccess {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_accounts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_accounts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_qos: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_qos: Vec<String>,
}

impl PartitionAccess {
    /// Admits every account and QOS.
    pub fn is_open(&self) -> bool {
        *self == PartitionAccess::default()
    }

    fn refuses(allow: &[String], deny: &[String], name: &str, allow_key: &str, deny_key: &str) -> Option<String> {
        if !allow.is_empty() && !allow.iter().any(|a| a == name) {
            return Some(format!("{allow_key}={}", allow.join(",")));
        }
        deny.iter().any(|d| d == name).then(|| format!("{deny_key}={}", deny.join(",")))
    }

    /// The rule that keeps `account` out (`AllowAccounts=lab`), if one does.
    pub fn refuses_account(&self, account: &str) -> Option<String> {
        Self::refuses(&self.allow_accounts, &self.deny_accounts, account, "AllowAccounts", "DenyAccounts")
    }

    /// The rule that keeps `qos` out (`AllowQos=high`), if one does.
    pub fn refuses_qos(&self, qos: &str) -> Option<String> {
        Self::refuses(&self.allow_qos, &self.deny_qos, qos, "AllowQos", "DenyQos")
    }

    /// Both an allow list and a deny list of one kind is a mistake (Slurm takes one or the other).
    pub fn check(&self) -> Result<(), String> {
        for (allow, deny, what) in
            [(&self.allow_accounts, &self.deny_accounts, "accounts"), (&self.allow_qos, &self.deny_qos, "QOS")]
        {
            if !allow.is_empty() && !deny.is_empty() {
                return Err(format!("allow and deny {what} both given: give one or the other"));
            }
            if let Some(bad) =
                allow.iter().chain(deny).find(|n| n.is_empty() || n.contains(|c: char| c == ',' || c.is_whitespace()))
            {
                return Err(format!("'{bad}' is not a name of {what}"));
            }
        }
        Ok(())
    }
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// A start the scheduler planned; apply re-checks it against the state it meets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedStart {
    pub job_id: JobId,
    pub allocation: Allocation,
}

/// A business rejection: returned as data from `apply`, shown to the user as an error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    #[error("invalid {field}: {reason}")]
    InvalidSpec { field: String, reason: String },
    #[error("unknown partition '{name}' (partitions: {known})")]
    UnknownPartition { name: String, known: String },
    #[error("no partition given and no default partition is configured")]
    NoDefaultPartition,
    #[error("requested node configuration is not available: {detail}")]
    NeverFits { detail: String },
    #[error("time limit {requested} exceeds partition '{partition}' limit of {limit}")]
    TimeLimitExceedsPartition { partition: String, requested: String, limit: String },
    #[error("job {id} does not exist")]
    UnknownJob { id: JobId },
    #[error("job {id} has already finished ({state})")]
    JobFinished { id: JobId, state: JobState },
    /// The owner is kept for the record, never shown: a refusal names no other user (Slurm
    /// answers "Access/permission denied" alike).
    #[error("user '{user}' may not change job {id}: it is another user's")]
    NotOwner { id: JobId, user: String, owner: String },
    #[error("invalid account '{account}' for user '{user}' ({why})")]
    InvalidAccount { account: String, user: String, why: String },
    #[error("invalid qos '{qos}' (known: {known})")]
    InvalidQos { qos: String, known: String },
    #[error("job {id} is not pending ({state})")]
    NotPending { id: JobId, state: JobState },
    #[error("job {id} is held by an administrator; only root may release it")]
    AdminHold { id: JobId },
    #[error("job {id} was suspended to make room for job {by}; it resumes by itself once its CPUs are free")]
    SuspendedByPreemption { id: JobId, by: JobId },
    #[error("job {id} is {state}: its {field} can change only while it is pending")]
    NotChangeable { id: JobId, state: JobState, field: String },
    #[error("only an operator may {what}")]
    OperatorOnly { what: String },
    #[error("invalid {what}: {reason}")]
    InvalidConfig { what: String, reason: String },
    #[error("node '{name}' is not registered")]
    UnknownNode { name: String },
    #[error("job {id} cannot run this step: {reason}")]
    StepNeverFits { id: JobId, reason: String },
    #[error("job {id}'s step must wait: {reason}")]
    StepBusy { id: JobId, reason: String },
    #[error("job {id} is not running ({state}): steps run only inside a running job")]
    NotRunning { id: JobId, state: JobState },
    #[error("node '{name}' is DOWN ({reason}); it returns to service by itself when its agent is heard again")]
    NodeIsDown { name: String, reason: String },
    #[error("reservation '{name}': {reason}")]
    Reservation { name: String, reason: String },
    #[error("cron entry {id}: {reason}")]
    Cron { id: u64, reason: String },
    #[error("job violates accounting/QOS policy: {limit} (user '{user}' has {have} jobs pending or running)")]
    SubmitLimit { user: String, limit: String, have: u32 },
    #[error("invalid qos specification: user '{user}' may not use QOS '{qos}' (allowed: {allowed})")]
    QosNotPermitted { user: String, qos: String, allowed: String },
    #[error("the cluster is full: it holds {have} jobs pending or running and {adding} more would pass its MaxJobCount={max}; try again once jobs end")]
    QueueFull { have: u64, adding: u32, max: u32 },
    #[error("invalid account or account/partition combination specified: partition '{partition}' does not admit account '{account}' ({rule})")]
    AccountNotAllowed { partition: String, account: String, rule: String },
    #[error("invalid qos specification: partition '{partition}' does not admit QOS '{qos}' ({rule})")]
    QosNotAllowed { partition: String, qos: String, rule: String },
    #[error("required partition not available (inactive or drain): partition '{partition}' is {state}")]
    PartitionClosed { partition: String, state: String },
    #[error("partition '{name}': {reason}")]
    Partition { name: String, reason: String },
}

#[cfg(test)]
mod bounds_tests {
    use super::*;

    #[test]
    fn end_reasons_are_read_back_from_their_names() {
        for r in EndReason::ALL {
            assert_eq!(EndReason::from_name(r.name()), Some(r));
        }
        assert_eq!(EndReason::from_name("DependencyNeverSatisfied"), None);
        assert_eq!(EndReason::from_name(""), None);
    }

    #[test]
    fn dependencies_parse_as_slurm_writes_them() {
        use DependencyKind::*;
        let d = parse_dependencies("afterok:12:13+5,after:14+2,singleton").unwrap();
        assert_eq!(
            d.list,
            vec![
                Dependency { kind: AfterOk, job: 12, delay_min: 0 },
                Dependency { kind: AfterOk, job: 13, delay_min: 5 },
                Dependency { kind: After, job: 14, delay_min: 2 },
            ]
        );
        assert!(d.singleton && !d.any);
        assert_eq!(dependency_string(&d.list, d.singleton, d.any), "afterok:12,afterok:13+5,after:14+2,singleton");
        // A '?' anywhere makes the whole list "any of", as Slurm 22.05 reads it.
        let d = parse_dependencies("afterok:3?afterany:5,aftercorr:6").unwrap();
        assert!(d.any);
        assert_eq!(d.list.iter().map(|d| d.kind).collect::<Vec<_>>(), vec![AfterOk, AfterAny, AfterCorr]);
        assert_eq!(dependency_string(&d.list, false, true), "afterok:3?afterany:5?aftercorr:6");
        assert_eq!(parse_dependencies("").unwrap(), Dependencies::default());
        for (bad, says) in [
            ("afterok", "names no job"),
            ("afterok:x", "'x' is not a job id"),
            ("after:3+", "'+' is not a number of minutes"),
            ("after:3+-1", "'+-1' is not a number of minutes"),
            ("after:3+999999999", "is not a number of minutes"),
            ("afterwards:3", "unknown type 'afterwards'"),
            ("afterok:+5", "'' is not a job id"),
        ] {
            let e = parse_dependencies(bad).unwrap_err();
            assert!(e.contains(says) && e.contains(bad), "{bad}: {e}");
        }
    }

    fn spec() -> JobSpec {
        JobSpec {
            name: "t".into(),
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 1,
            program: Program::Argv(vec!["true".into()]),
            ..Default::default()
        }
    }

    fn refused(s: JobSpec, field: &str) {
        match s.check_shape() {
            Err(Rejection::InvalidSpec { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected {field} refused, got {other:?}"),
        }
    }

    #[test]
    fn counts_sizes_and_text_a_user_sends_are_bounded() {
        assert!(spec().check_shape().is_ok());
        refused(JobSpec { ntasks: 65536, cpus_per_task: 65536, ..spec() }, "cpus_per_task");
        assert_eq!(JobSpec { ntasks: 65536, cpus_per_task: 65536, ..spec() }.cpus_per_node(), u32::MAX, "saturates");
        refused(JobSpec { nodes: 200_000, ntasks: 200_000, ..spec() }, "nodes");
        refused(JobSpec { time_limit_s: Some(307_445_734_561_825_861), ..spec() }, "time_limit");
        refused(JobSpec { name: "\u{1b}[2J".into(), ..spec() }, "name");
        let counted = |counts: Vec<u32>| JobSpec {
            nodes: 4,
            ntasks: 4,
            constraint: vec!["a".into(), "b".into()],
            constraint_counts: counts,
            ..spec()
        };
        assert!(counted(vec![1, 3]).check_shape().is_ok());
        refused(counted(vec![1]), "constraint");
        refused(counted(vec![1, 0]), "constraint");
        refused(counted(vec![u32::MAX, u32::MAX]), "constraint");
        refused(JobSpec { constraint_any: true, ..counted(vec![1, 1]) }, "constraint");
        refused(JobSpec { nodelist: vec!["n1".into()], ..counted(vec![1, 1]) }, "constraint");
        refused(JobSpec { program: Program::Script("#!/bin/sh\n".repeat(500_000)), ..spec() }, "script");
        refused(JobSpec { program: Program::Argv(vec!["a\0b".into()]), ..spec() }, "command");
        refused(JobSpec { env: Env::new([("A", "x\0y")]), ..spec() }, "env");
        let many = (0..20_000).map(|i| (format!("V{i}"), "1".to_string()));
        refused(JobSpec { env: Env::new(many), ..spec() }, "env");
        refused(JobSpec { work_dir: "/".repeat(5000), ..spec() }, "work_dir");
        let notes = |comment: String| JobNotes { comment, ..JobNotes::default() };
        refused(JobSpec { notes: notes("x".repeat(5000)), ..spec() }, "comment");
        refused(JobSpec { notes: notes("a\x1b[2Jb".into()), ..spec() }, "comment");
        refused(JobSpec { exclude: vec![String::new()], ..spec() }, "exclude");
        let script = Program::Script("#!/bin/sh\n".into());
        refused(JobSpec { program: script, script_args: vec!["a\0b".into()], ..spec() }, "script_args");
        assert!(parse::parse_time_limit("307445734561825861").unwrap_err().to_string().contains("longest"));
        assert!(parse::parse_time_limit("99999999999999-0").is_err());
        assert_eq!(parse::parse_time_limit("36500-00:00:00").unwrap(), Some(36500 * 86400));
    }

    #[test]
    fn node_counts_per_feature_count_each_node_once() {
        let f = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        let (a, ab, b, none) = (f(&["a"]), f(&["a", "b"]), f(&["b"]), f(&[]));
        let wanted = f(&["a", "b"]);
        // The best candidates first: a*1 takes n0, b*1 the first with b left.
        let nodes: Vec<&[String]> = vec![&ab, &a, &none, &b];
        assert_eq!(assign_feature_counts(&wanted, &[1, 1], &nodes), Some(vec![0, 3]));
        // The only node with b is the one a took first: a moves to the other node with a.
        let nodes: Vec<&[String]> = vec![&ab, &a];
        assert_eq!(assign_feature_counts(&wanted, &[1, 1], &nodes), Some(vec![1, 0]));
        // One node with both cannot be counted for both.
        let nodes: Vec<&[String]> = vec![&ab, &none, &none];
        assert_eq!(assign_feature_counts(&wanted, &[1, 1], &nodes), None);
        assert_eq!(assign_feature_counts(&wanted, &[2, 1], &[&ab, &ab, &a]), Some(vec![1, 2, 0]), "moved twice");
        assert_eq!(assign_feature_counts(&wanted, &[u32::MAX, u32::MAX], &[&ab]), None, "no slot per count");
        let spec =
            JobSpec { nodes: 6, constraint: wanted.clone(), constraint_counts: vec![2, 4], ..Default::default() };
        assert_eq!(spec.constraint_text(), "[a*2&b*4]");
        assert!(spec.may_use("n", &none), "a counted feature asks nothing of each node");
        assert_eq!(spec.counted_nodes(), 6);
    }
}
