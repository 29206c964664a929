//! `sacct`: jobs as Slurm's sacct reports them, over the hot state and the job history together
//! (a job that ended moves to the history after `min_job_age`). Tools
//! read it with `--parsable2` (`|` between fields) and `-o` field names: `sacct -j 12
//! -o JobID,State --parsable2` prints `JobID|State`, then `12|COMPLETED` and a line for each of
//! its steps (`12.0`) unless `-X`; an array's pending tasks share a line, `12_[1-3%2]`.

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_client::display::{self, array_line_id, local_time_or};
use quorum_model::het;
use quorum_proto::api::{self, JobInfo, StepInfo};

use crate::commands::{current_user, Context};

/// The most jobs a report asks each for its steps.
const MAX_JOBS_WITH_STEPS: usize = 500;

/// Slurm's default `--format`.
const DEFAULT_FIELDS: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";

#[derive(Parser, Debug)]
#[command(
    name = "sacct",
    no_binary_name = true,
    infer_long_args = true,
    about = "Jobs, as accounting sees them (Quorum's sacct)"
)]
pub struct SacctArgs {
    #[command(flatten)]
    controllers: ControllersArg,
    /// Only these jobs (comma-separated: 12, 12_3), or only one of a job's steps (12.0,
    /// 12.batch).
    #[arg(short = 'j', long = "jobs", value_delimiter = ',')]
    jobs: Vec<String>,
    /// The clusters to report on: `all`, or this cluster's name (`quorum`).
    #[arg(short = 'M', long = "clusters", value_delimiter = ',')]
    clusters: Vec<String>,
    #[command(flatten)]
    report: ReportArgs,
    /// Jobs only, not their steps.
    #[arg(short = 'X', long)]
    allocations: bool,
    /// Every user's jobs (by default, yours).
    #[arg(short = 'a', long)]
    allusers: bool,
    /// Only these users' jobs.
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    users: Vec<String>,
    /// Only jobs of these names.
    #[arg(long = "name", value_delimiter = ',')]
    names: Vec<String>,
    /// Only jobs charged to these accounts.
    #[arg(short = 'A', long = "accounts", value_delimiter = ',')]
    accounts: Vec<String>,
    /// Only jobs of these partitions.
    #[arg(short = 'r', long = "partition", value_delimiter = ',')]
    partitions: Vec<String>,
    /// Only jobs in these states (COMPLETED/CD, FAILED/F, ...).
    #[arg(short = 's', long = "state", value_delimiter = ',')]
    states: Vec<String>,
    /// Jobs that ended after this time, or have not ended (default: today's midnight; any
    /// time when jobs are named): `YYYY-MM-DD[THH:MM[:SS]]`, `now`, `now-2days`.
    #[arg(short = 'S', long)]
    starttime: Option<String>,
    /// Jobs submitted before this time (default: now).
    #[arg(short = 'E', long)]
    endtime: Option<String>,
    /// The jobs, with their steps, as JSON (the shape of Slurm 22.05's `sacct --json`).
    #[arg(long, conflicts_with_all = ["format", "parsable2", "parsable", "noheader", "allocations"])]
    json: bool,
}

/// How sacct and sstat print their report: its fields, and its form.
#[derive(clap::Args, Debug)]
pub(crate) struct ReportArgs {
    /// Fields, comma-separated (`JobID,State`; `Name%20` for a width).
    #[arg(short = 'o', long = "format")]
    pub format: Option<String>,
    #[command(flatten)]
    pub form: FormArgs,
}

/// The form of a report the accounting commands (sacct, sstat, sreport) print.
#[derive(clap::Args, Debug)]
pub(crate) struct FormArgs {
    /// `|` between fields, none after the last.
    #[arg(short = 'P', long)]
    pub parsable2: bool,
    /// `|` after every field.
    #[arg(short = 'p', long)]
    pub parsable: bool,
    /// No header.
    #[arg(short = 'n', long)]
    pub noheader: bool,
}

impl FormArgs {
    /// [`table`]'s `parsable`.
    pub fn parsable(&self) -> Option<bool> {
        match (self.parsable2, self.parsable) {
            (true, _) => Some(false),
            (false, true) => Some(true),
            _ => None,
        }
    }
}

/// A field `-o` may name: its name as Slurm writes it in the header, and its width in a table.
const FIELDS: &[(&str, usize)] = &[
    ("JobID", 12),
    ("JobIDRaw", 12),
    ("JobName", 10),
    ("Partition", 10),
    ("Account", 10),
    ("QOS", 10),
    ("User", 9),
    ("AllocCPUS", 10),
    ("NCPUS", 10),
    ("NNodes", 8),
    ("NodeList", 15),
    ("State", 10),
    ("ExitCode", 8),
    ("Elapsed", 10),
    ("ElapsedRaw", 10),
    ("Start", 19),
    ("End", 19),
    ("Submit", 19),
    ("ForecastFirst", 19),
    ("ForecastLast", 19),
    ("Timelimit", 10),
    ("WorkDir", 20),
    ("Reason", 20),
    ("Comment", 20),
    ("WCKey", 10),
    ("TotalCPU", 10),
    ("UserCPU", 10),
    ("SystemCPU", 10),
    ("MaxRSS", 10),
    ("ReqMem", 10),
    ("AllocTRES", 40),
    ("GPUUtil", 8),
    ("GPUMem", 10),
    ("GPUEnergy", 10),
];

/// The fields of a `--format`: each name (any case) with a width (`Name%20`, else its own; a
/// negative one, `Name%-20`, leans left).
fn parse_fields(format: &str) -> Result<Vec<(&'static str, isize)>, String> {
    parse_fields_of(format, FIELDS)
}

/// The fields of a `--format` among `known` (sacct's, sstat's): each name in any case, with
/// its width (`Name%20`, else its own; negative leans left, as Slurm's).
pub(crate) fn parse_fields_of(
    format: &str,
    known: &'static [(&'static str, usize)],
) -> Result<Vec<(&'static str, isize)>, String> {
    format
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (name, width) = match f.split_once('%') {
                Some((n, w)) => (n, Some(width(w).ok_or_else(|| format!("invalid width in --format field '{f}'"))?)),
                None => (f, None),
            };
            let (field, own) = known.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).ok_or_else(|| {
                let names: Vec<&str> = known.iter().map(|(n, _)| *n).collect();
                format!("invalid --format field '{name}' (known: {})", names.join(", "))
            })?;
            Ok((*field, width.unwrap_or(*own as isize)))
        })
        .collect()
}

/// A field's width as Slurm's commands write it after `%` (`20`; `-20` leans left), at most
/// 1024 either way.
pub(crate) fn width(text: &str) -> Option<isize> {
    text.parse::<isize>().ok().filter(|w| w.unsigned_abs() <= 1024)
}

/// A duration as sacct prints it: `00:01:02`, `1-00:00:00`.
pub(crate) fn hms(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// CPU time as sacct writes it: `MM:SS.mmm` under an hour, `HH:MM:SS` under a day, then
/// `D-HH:MM:SS`.
pub(crate) fn cpu_time(micros: u64) -> String {
    let ms = micros / 1000;
    if ms < 3_600_000 {
        format!("{:02}:{:02}.{:03}", ms / 60_000, ms / 1000 % 60, ms % 1000)
    } else {
        hms(ms / 1000)
    }
}

/// A line of the report: a job (or an array's pending tasks together), its batch step (its
/// script, on its first node: `12.batch`), or one of its steps.
enum Line<'a> {
    /// `het`: a heterogeneous job's component (`12+1`), `job` holding its resources.
    Job {
        job: &'a JobInfo,
        tasks: Vec<u32>,
        het: Option<usize>,
    },
    Batch {
        job: &'a JobInfo,
    },
    Step {
        job: &'a JobInfo,
        step: &'a StepInfo,
    },
}

/// A field of a job's batch step: the job's, but for what is the script's own.
fn batch_value(field: &str, job: &JobInfo, now_ms: u64) -> String {
    let first = job.allocation.first();
    match field {
        "JobID" if display::het_size(job) > 1 => format!("{}.batch", het::component_name(job.id, 0)),
        "JobID" => format!("{}.batch", array_line_id(job, &[])),
        "JobIDRaw" => format!("{}.batch", job.id),
        "JobName" => "batch".into(),
        "Partition" | "QOS" | "User" | "Timelimit" | "Reason" | "Comment" | "WCKey" => String::new(),
        "AllocCPUS" | "NCPUS" => first.map_or(0, |a| a.cpus).to_string(),
        "NNodes" => "1".into(),
        "NodeList" => first.map_or_else(|| "None assigned".into(), |a| a.node.clone()),
        // The script was killed at the limit: its step shows CANCELLED, the job TIMEOUT.
        "State" if job.state == "TIMEOUT" => "CANCELLED".into(),
        // What the script used, with every process it waited for (not its steps).
        "TotalCPU" | "UserCPU" | "SystemCPU" | "MaxRSS" | "GPUUtil" | "GPUMem" | "GPUEnergy" => {
            used(field, job.batch_usage.as_ref())
        }
        _ => value(field, &Line::Job { job, tasks: Vec::new(), het: None }, now_ms),
    }
}

/// A usage field (`TotalCPU`, `UserCPU`, `SystemCPU`, `MaxRSS`) of what was measured, if it was.
fn used(field: &str, usage: Option<&api::JobUsage>) -> String {
    let Some(u) = usage else { return String::new() };
    match field {
        "TotalCPU" => cpu_time(u.cpu_user_us + u.cpu_system_us),
        "UserCPU" => cpu_time(u.cpu_user_us),
        "SystemCPU" => cpu_time(u.cpu_system_us),
        "MaxRSS" => format!("{}K", u.max_rss_kb),
        // Its GPUs' mean utilization, the most memory one held, and the energy they drew,
        // sampled by the agents while it ran (nothing for a job without GPUs).
        "GPUUtil" => gpu_util(u).unwrap_or_default(),
        "GPUMem" if u.gpu_samples > 0 => format!("{}M", u.gpu_mem_max_mb),
        "GPUEnergy" if u.gpu_energy_mj > 0 => format!("{:.0}J", u.gpu_energy_mj as f64 / 1000.0),
        _ => String::new(),
    }
}

/// A job's GPUs' mean utilization over the agents' samples: `63.5%`.
pub(crate) fn gpu_util(u: &api::JobUsage) -> Option<String> {
    (u.gpu_samples > 0).then(|| format!("{:.1}%", u.gpu_util_sum as f64 / u.gpu_samples as f64))
}

fn value(field: &str, line: &Line, now_ms: u64) -> String {
    let (job, step) = match line {
        Line::Job { job, .. } => (*job, None),
        Line::Batch { job } => return batch_value(field, job, now_ms),
        Line::Step { job, step } => (*job, Some(*step)),
    };
    let spec = job.spec.as_ref();
    let (start, end) = match step {
        Some(s) => (s.start_time_ms, s.end_time_ms),
        None => (job.start_time_ms, job.end_time_ms),
    };
    let elapsed = match (start, end) {
        (0, _) => 0,
        (s, 0) => now_ms.saturating_sub(s) / 1000,
        (s, e) => e.saturating_sub(s) / 1000,
    };
    let cpus = match step {
        Some(s) => u64::from(s.ntasks) * u64::from(s.cpus_per_task.max(1)),
        None if job.start_time_ms == 0 => 0,
        None => job.allocation.iter().map(|a| u64::from(a.cpus)).sum(),
    };
    match field {
        "JobID" => match (line, step) {
            (Line::Job { het: Some(k), .. }, _) => het::component_name(job.id, *k),
            (Line::Job { tasks, .. }, _) => array_line_id(job, tasks),
            (_, Some(s)) => format!("{}.{}", array_line_id(job, &[]), s.id),
            _ => String::new(),
        },
        "JobIDRaw" => match (line, step) {
            (_, Some(s)) => format!("{}.{}", job.id, s.id),
            (Line::Job { het: Some(k), .. }, None) => (job.id + *k as u64).to_string(),
            (_, None) => job.id.to_string(),
        },
        "JobName" => step.map_or_else(|| job.name.clone(), |s| s.name.clone()),
        "Partition" => job.partition.clone(),
        "Account" => job.account.clone(),
        "QOS" => job.qos.clone(),
        "User" => job.user.clone(),
        "AllocCPUS" | "NCPUS" => cpus.to_string(),
        "NNodes" => match step {
            Some(s) => quorum_model::hostlist::expand(&s.nodelist).map(|n| n.len()).unwrap_or(0).to_string(),
            None => spec.map_or(0, |s| s.nodes).to_string(),
        },
        "NodeList" => {
            let list = step.map_or(job.nodelist.as_str(), |s| s.nodelist.as_str());
            if list.is_empty() {
                "None assigned".into()
            } else {
                list.to_string()
            }
        }
        "State" => match step {
            Some(s) => s.state.clone(),
            None => cancelled_by(job).unwrap_or_else(|| job.state.clone()),
        },
        "ExitCode" => match step {
            Some(s) => format!("{}:{}", s.exit_code, s.signal),
            None if job.has_exit_code => format!("{}:{}", job.exit_code, job.signal),
            None => "0:0".into(),
        },
        "Elapsed" => hms(elapsed),
        "ElapsedRaw" => elapsed.to_string(),
        "Start" => local_time_or(start, "Unknown"),
        "End" => local_time_or(end, "Unknown"),
        "Submit" => local_time_or(job.submit_time_ms, "Unknown"),
        // The start it was first shown while it waited, and the one in force when it started.
        "ForecastFirst" => local_time_or(job.shown_first_ms, "Unknown"),
        "ForecastLast" => local_time_or(job.shown_last_ms, "Unknown"),
        "Timelimit" if job.time_limit_s == 0 => "UNLIMITED".into(),
        "Timelimit" => hms(job.time_limit_s),
        "WorkDir" => spec.map_or_else(String::new, |s| s.work_dir.clone()),
        "Comment" => spec.map_or_else(String::new, |s| s.comment.clone()),
        "WCKey" => spec.map_or_else(String::new, |s| s.wckey.clone()),
        // What a step's tasks used; for the job, its script's and its steps' together.
        "TotalCPU" | "UserCPU" | "SystemCPU" | "MaxRSS" | "GPUUtil" | "GPUMem" | "GPUEnergy" => match step {
            Some(s) => used(field, s.usage.as_ref()),
            None => used(field, job.usage.as_ref()),
        },
        // What the job asked for in all (every node's), as Slurm 22.05 writes it.
        "ReqMem" => spec.map_or_else(String::new, |s| {
            quorum_model::parse::format_mem_mb(s.mem_per_node_mb.saturating_mul(u64::from(s.nodes.max(1))))
        }),
        "AllocTRES" if step.is_some() || job.allocation.is_empty() => String::new(),
        // What it was given, in sacct's order (by name).
        "AllocTRES" => {
            let a = &job.allocation;
            let gpus: usize = a.iter().map(|n| n.gpus.len()).sum();
            let mut tres = vec![format!("cpu={}", a.iter().map(|n| u64::from(n.cpus)).sum::<u64>())];
            if gpus > 0 {
                tres.push(format!("gres/gpu={gpus}"));
            }
            tres.push(format!("mem={}", quorum_model::parse::format_mem_mb(a.iter().map(|n| n.mem_mb).sum())));
            tres.push(format!("node={}", a.len()));
            tres.join(",")
        }
        // Why a job waits (or, cancelled for a dependency never satisfied, waited), not why it
        // ended: `scontrol` and `squeue` show that; Slurm's accounting keeps a waiting reason here.
        "Reason" => {
            if job.reason.is_empty()
                || job.state == "FAILED"
                || quorum_model::EndReason::from_name(&job.reason).is_some()
            {
                "None".into()
            } else {
                job.reason.clone()
            }
        }
        _ => String::new(),
    }
}

/// `CANCELLED by UID` as Slurm's sacct writes a job someone cancelled (the uid from this host's
/// user database; the name when it does not know it).
fn cancelled_by(job: &JobInfo) -> Option<String> {
    if job.state != "CANCELLED" || job.cancelled_by.is_empty() {
        return None;
    }
    let who =
        quorum_auth::users::by_name(&job.cancelled_by).map_or_else(|_| job.cancelled_by.clone(), |u| u.uid.to_string());
    Some(format!("CANCELLED by {who}"))
}

/// The report: a header (and, in a table, its underline), then a line per job and step.
fn render(
    fields: &[(&'static str, isize)],
    lines: &[Line],
    now_ms: u64,
    parsable: Option<bool>,
    header: bool,
) -> String {
    let rows = lines.iter().map(|line| fields.iter().map(|(f, _)| value(f, line, now_ms)).collect());
    table(fields, rows, parsable, header)
}

/// Rows as sacct and sstat print them: `|`-separated with `--parsable2` (`Some(false)`) or
/// `--parsable` (`Some(true)`, one after each field too), else a table of the fields' widths,
/// a value longer than its column cut with `+`; a header (and a table's underline) first. A
/// negative width leans left, as does the job id; the rest lean right.
pub(crate) fn table(
    fields: &[(&'static str, isize)],
    rows: impl Iterator<Item = Vec<String>>,
    parsable: Option<bool>,
    header: bool,
) -> String {
    let mut out = String::new();
    let row = |cells: Vec<String>| -> String {
        match parsable {
            // --parsable2: between fields; --parsable: after each.
            Some(trailing) => {
                let mut s = cells.join("|");
                if trailing {
                    s.push('|');
                }
                s
            }
            None => cells
                .iter()
                .zip(fields)
                .enumerate()
                .map(|(i, (c, (_, w)))| {
                    let (left, w) = (*w < 0, w.unsigned_abs());
                    // A value longer than its column ends in `+` where it is cut, as sacct's.
                    let c = quorum_client::display::escape(c);
                    let c: String = if c.chars().count() > w {
                        c.chars().take(w.saturating_sub(1)).chain(std::iter::once('+')).collect()
                    } else {
                        c.into_owned()
                    };
                    // The job id leans left, the rest right, as sacct's table does.
                    if left || (i == 0 && fields[0].0 == "JobID") {
                        format!("{c:<w$} ")
                    } else {
                        format!("{c:>w$} ")
                    }
                })
                .collect(),
        }
    };
    if header {
        out.push_str(&row(fields.iter().map(|(n, _)| n.to_string()).collect()));
        out.push('\n');
        if parsable.is_none() {
            out.push_str(&fields.iter().map(|(_, w)| format!("{} ", "-".repeat(w.unsigned_abs()))).collect::<String>());
            out.push('\n');
        }
    }
    for cells in rows {
        let cells = cells.iter().map(|c| quorum_client::display::escape(c).into_owned()).collect();
        out.push_str(&row(cells));
        out.push('\n');
    }
    out
}

/// `YYYY-MM-DD[THH:MM[:SS]]` (local), `now`, `now-N[days|hours|minutes|seconds]`: milliseconds.
pub(crate) fn parse_time(text: &str, now_ms: u64) -> Result<u64, String> {
    let bad = || format!("invalid time '{text}': give YYYY-MM-DD[THH:MM[:SS]], now or now-2days");
    let t = text.trim();
    if let Some(rest) = t.strip_prefix("now") {
        if rest.is_empty() {
            return Ok(now_ms);
        }
        let rest = rest.strip_prefix('-').ok_or_else(bad)?;
        let split = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let n: u64 = rest[..split].parse().map_err(|_| bad())?;
        let unit = match rest[split..].to_ascii_lowercase().as_str() {
            "" | "s" | "second" | "seconds" => 1,
            "m" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86400,
            "w" | "week" | "weeks" => 7 * 86400,
            _ => return Err(bad()),
        };
        return Ok(now_ms.saturating_sub(n.saturating_mul(unit).saturating_mul(1000)));
    }
    let (date, clock) = t.split_once('T').unwrap_or((t, "00:00:00"));
    let d: Vec<i32> = date.split('-').map(|p| p.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    let c: Vec<i32> = clock.split(':').map(|p| p.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    if d.len() != 3 || !(2..=3).contains(&c.len()) {
        return Err(bad());
    }
    // SAFETY: mktime reads and normalizes `tm`, which lives here.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    (tm.tm_year, tm.tm_mon, tm.tm_mday) = (d[0] - 1900, d[1] - 1, d[2]);
    (tm.tm_hour, tm.tm_min, tm.tm_sec) = (c[0], c[1], c.get(2).copied().unwrap_or(0));
    tm.tm_isdst = -1;
    let secs = unsafe { libc::mktime(&mut tm) };
    u64::try_from(secs).map(|s| s * 1000).map_err(|_| bad())
}

/// Today's midnight, local, in milliseconds since the epoch.
pub(crate) fn midnight(now_ms: u64) -> u64 {
    let secs = (now_ms / 1000) as libc::time_t;
    // SAFETY: localtime_r and mktime work only on `tm`, which lives here.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return 0;
    }
    (tm.tm_hour, tm.tm_min, tm.tm_sec) = (0, 0, 0);
    u64::try_from(unsafe { libc::mktime(&mut tm) }).map_or(0, |s| s * 1000)
}

pub async fn run(a: SacctArgs) -> anyhow::Result<u8> {
    let fields = parse_fields(a.report.format.as_deref().unwrap_or(DEFAULT_FIELDS)).map_err(anyhow::Error::msg)?;
    // One cluster answers here: `all`, `-1` (Slurm's all) or its own name.
    if let Some(other) = a.clusters.iter().map(|c| c.trim()).find(|c| !matches!(*c, "all" | "-1" | "quorum" | "")) {
        anyhow::bail!("unknown cluster '{other}': this is cluster 'quorum' (-M all or -M quorum)");
    }
    let mut named = Vec::new();
    // A step named (`12.0`, `12.batch`): that job's lines are that step's alone.
    let mut steps: Vec<(u64, String)> = Vec::new();
    for j in &a.jobs {
        let (job, step) = match j.split_once('.') {
            Some((job, step)) => (job, Some(step)),
            None => (j.as_str(), None),
        };
        let r = job.parse::<quorum_client::client::JobRef>().map_err(anyhow::Error::msg)?;
        if let Some(step) = step {
            if step != "batch" && step != "extern" && step.parse::<u32>().is_err() {
                anyhow::bail!("invalid step '{j}': give a job and step such as 12.0 or 12.batch");
            }
            steps.push((r.id, step.to_string()));
        }
        named.push(r);
    }
    let states: Vec<String> = a
        .states
        .iter()
        .map(|s| {
            quorum_model::JobState::from_name(s.trim())
                .map(|st| st.name().to_string())
                .ok_or_else(|| anyhow::anyhow!("invalid --state '{s}'"))
        })
        .collect::<anyhow::Result<_>>()?;
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let users: Vec<String> = if !a.users.is_empty() {
        a.users.clone()
    } else if a.allusers || !named.is_empty() {
        Vec::new()
    } else {
        vec![current_user()]
    };
    // The window in this host's clock (relative times such as now-2days), sent with the request
    // so that the controllers read only that part of the job history.
    let local_now = crate::format::now_ms();
    let since = match &a.starttime {
        Some(t) => parse_time(t, local_now).map_err(anyhow::Error::msg)?,
        None if named.is_empty() => midnight(local_now),
        None => 0,
    };
    let until = a
        .endtime
        .as_deref()
        .map(|t| parse_time(t, local_now))
        .transpose()
        .map_err(anyhow::Error::msg)?
        .unwrap_or(u64::MAX);
    let req = api::ListJobsRequest {
        states: states.clone(),
        user: if users.len() == 1 { users[0].clone() } else { String::new() },
        history: true,
        ended_after_ms: since,
        submitted_before_ms: if until == u64::MAX { 0 } else { until },
        job_ids: named.iter().map(|r| r.id).collect(),
        ..Default::default()
    };
    let all = ctx.list_all_jobs(req).await?;
    let (mut jobs, now_ms) = (all.jobs, all.now_ms);
    jobs.retain(|j| {
        (named.is_empty() || named.iter().any(|r| r.names(j)))
            && (users.is_empty() || users.contains(&j.user))
            && (a.names.is_empty() || a.names.contains(&j.name))
            && (a.accounts.is_empty() || a.accounts.contains(&j.account))
            && (a.partitions.is_empty() || a.partitions.contains(&j.partition))
            && (j.end_time_ms == 0 || j.end_time_ms >= since)
            && j.submit_time_ms <= until
    });
    // Steps are not in listings: each job's own answer has them, one request per job, so a
    // report of many jobs leaves them out rather than send thousands of requests.
    let started = jobs.iter().filter(|j| j.start_time_ms > 0).count();
    if !a.allocations && started > MAX_JOBS_WITH_STEPS {
        eprintln!("sacct: {started} jobs: their steps are left out above {MAX_JOBS_WITH_STEPS} (name jobs with -j, or use -X)");
    }
    if !a.allocations && started <= MAX_JOBS_WITH_STEPS {
        for j in jobs.iter_mut().filter(|j| j.start_time_ms > 0) {
            let req = api::GetJobRequest { job_id: j.id, stale: false, array_task_id: None };
            if let Ok(full) = ctx.send(req, |mut c, r| async move { c.get_job(r).await }).await {
                j.steps = full.job.map(|f| f.steps).unwrap_or_default();
            }
        }
    }
    if a.json {
        let text = serde_json::to_string_pretty(&crate::sacct_json::document(&jobs, now_ms))?;
        println!("{text}");
        return Ok(0);
    }
    // A heterogeneous job's components, each a line of its own (`12+0`, `12+1`), as Slurm's.
    let components: Vec<Vec<JobInfo>> = jobs
        .iter()
        .map(|j| match display::het_size(j) {
            1 => Vec::new(),
            n => (0..n).map(|k| display::het_component(j, k)).collect(),
        })
        .collect();
    let mut lines: Vec<Line> = Vec::new();
    for (j, parts) in jobs.iter().zip(&components) {
        if !parts.is_empty() {
            for (k, part) in parts.iter().enumerate() {
                lines.push(Line::Job { job: part, tasks: Vec::new(), het: Some(k) });
                if k == 0 && !a.allocations && j.start_time_ms > 0 {
                    lines.push(Line::Batch { job: j });
                }
            }
            if !a.allocations {
                lines.extend(j.steps.iter().map(|s| Line::Step { job: j, step: s }));
            }
            continue;
        }
        if let Some(t) = j.array.as_ref().filter(|_| j.state == "PENDING") {
            if let Some(Line::Job { tasks, .. }) = lines.iter_mut().rev().find(|l| {
                matches!(l, Line::Job { job, tasks, .. } if !tasks.is_empty() && job.array.as_ref().is_some_and(|b| b.array_job_id == t.array_job_id))
            }) {
                tasks.push(t.task_id);
                continue;
            }
            lines.push(Line::Job { job: j, tasks: vec![t.task_id], het: None });
            continue;
        }
        lines.push(Line::Job { job: j, tasks: Vec::new(), het: None });
        if a.allocations {
            continue;
        }
        // A batch job that started has its script's step; an allocation (salloc) has none.
        if j.start_time_ms > 0 && !j.spec.as_ref().is_some_and(|s| s.interactive) {
            lines.push(Line::Batch { job: j });
        }
        lines.extend(j.steps.iter().map(|s| Line::Step { job: j, step: s }));
    }
    if !steps.is_empty() {
        lines.retain(|l| step_named(l, &steps, &a.jobs));
    }
    print!("{}", render(&fields, &lines, now_ms, a.report.form.parsable(), !a.report.form.noheader));
    Ok(0)
}

/// Whether `line` is shown when steps are named (`-j 12.0`): a job named with a step shows that
/// step's line alone; one named (also) without shows all of its lines.
fn step_named(line: &Line, steps: &[(u64, String)], jobs: &[String]) -> bool {
    let job = match line {
        Line::Job { job, .. } | Line::Batch { job } | Line::Step { job, .. } => *job,
    };
    let mine: Vec<&str> = steps.iter().filter(|(id, _)| *id == job.id).map(|(_, s)| s.as_str()).collect();
    let whole = jobs.iter().any(|j| !j.contains('.') && j.split('_').next() == Some(&job.id.to_string()));
    if mine.is_empty() || whole {
        return true;
    }
    match line {
        Line::Job { .. } => false,
        Line::Batch { .. } => mine.contains(&"batch"),
        Line::Step { step, .. } => mine.contains(&step.id.to_string().as_str()),
    }
}

pub fn main(args: &[String]) -> std::process::ExitCode {
    crate::entry::main_of::<SacctArgs, _, _>("sacct", crate::entry::Threads::One, args, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_times_and_lines_read_as_sacct_prints_them() {
        assert_eq!(parse_fields("jobid,State,JobName%5").unwrap(), [("JobID", 12), ("State", 10), ("JobName", 5)]);
        assert!(parse_fields("Bogus").unwrap_err().contains("'Bogus'"));
        assert_eq!((hms(62), hms(90_061)), ("00:01:02".to_string(), "1-01:01:01".to_string()));
        assert_eq!(cpu_time(1_234_567), "00:01.234");
        assert_eq!(cpu_time(61_000_000), "01:01.000");
        assert_eq!(cpu_time(3_723_000_000), "01:02:03");
        assert_eq!(parse_time("now-2days", 200_000_000).unwrap(), 200_000_000 - 172_800_000);
        assert_eq!(parse_time("now-1hour", 200_000_000).unwrap(), 200_000_000 - 3_600_000);
        assert_eq!(parse_time("now-90m", 200_000_000).unwrap(), 200_000_000 - 5_400_000);
        assert!(parse_time("yesterday", 0).is_err());

        let mut job = JobInfo {
            id: 12,
            name: "train".into(),
            state: "COMPLETED".into(),
            has_exit_code: true,
            nodelist: "node[01-02]".into(),
            start_time_ms: 1_000_000,
            end_time_ms: 1_062_000,
            allocation: ["node01", "node02"]
                .map(|n| api::NodeAllocation { node: n.into(), cpus: 2, ..Default::default() })
                .to_vec(),
            ..Default::default()
        };
        job.steps = vec![StepInfo {
            id: 0,
            name: "hostname".into(),
            state: "FAILED".into(),
            nodelist: "node01".into(),
            ntasks: 1,
            cpus_per_task: 1,
            exit_code: 3,
            start_time_ms: 1_000_000,
            end_time_ms: 1_001_000,
            ..Default::default()
        }];
        let mut pending = JobInfo { id: 13, state: "PENDING".into(), ..Default::default() };
        pending.array = Some(api::ArrayTask { array_job_id: 13, task_id: 0, count: 3, min: 0, max: 2, throttle: 2 });
        let lines = vec![
            Line::Job { job: &job, tasks: vec![], het: None },
            Line::Batch { job: &job },
            Line::Step { job: &job, step: &job.steps[0] },
            Line::Job { job: &pending, tasks: vec![0, 1], het: None },
        ];
        let fields = parse_fields("JobID,State,ExitCode,Elapsed,AllocCPUS,NodeList").unwrap();
        assert_eq!(
            render(&fields, &lines, 2_000_000, Some(false), true),
            "JobID|State|ExitCode|Elapsed|AllocCPUS|NodeList\n\
             12|COMPLETED|0:0|00:01:02|4|node[01-02]\n\
             12.batch|COMPLETED|0:0|00:01:02|2|node01\n\
             12.0|FAILED|3:0|00:00:01|1|node01\n\
             13_[0-1%2]|PENDING|0:0|00:00:00|0|None assigned\n"
        );
        assert!(render(&fields[..2], &lines[..1], 0, Some(true), false).ends_with("12|COMPLETED|\n"));
        assert_eq!(
            render(&fields[..2], &lines[..1], 0, None, true),
            "JobID             State \n------------ ---------- \n12            COMPLETED \n"
        );
        let narrow = parse_fields("JobID,State%5").unwrap();
        assert_eq!(render(&narrow, &lines[..1], 0, None, false), "12           COMP+ \n");
        // What it asked for and was given.
        let given =
            |mem_mb, gpus: Vec<u32>| api::NodeAllocation { node: "n".into(), cpus: 4, mem_mb, gpus, het_group: 0 };
        let asked = api::JobSpec { nodes: 2, mem_per_node_mb: 3072, ..Default::default() };
        let job = JobInfo {
            spec: Some(asked),
            allocation: vec![given(3072, vec![0, 1]), given(3072, vec![2, 3])],
            ..job.clone()
        };
        let fields = parse_fields("ReqMem,AllocTRES").unwrap();
        assert_eq!(
            render(&fields, &[Line::Job { job: &job, tasks: vec![], het: None }], 0, Some(false), false),
            "6G|cpu=8,gres/gpu=4,mem=6G,node=2\n"
        );
        assert_eq!(render(&fields, &lines[3..], 0, Some(false), false), "|\n", "nothing asked, nothing given");
    }
}
