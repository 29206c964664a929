//! `squeue`: the queue as Slurm's squeue prints it, for people and for the tools that parse it:
//! `-h`, `-j`, `-u`, `--me`, `-t`, `-p`, `-n`, `-o` with Slurm's `%` codes and widths (`%.18i`
//! right-aligned in 18 columns, `%-8j` left-aligned, a value longer than its width cut), `-O`
//! with field names (`JobID:10,State`), `-r` for one line per array task. Without `-r`, the
//! pending tasks of an array share one line, `12_[3-9%2]`, as on Slurm. Lines are in Slurm's
//! order (`-S P,t,-p`: by partition, pending first, highest priority first) or `-S`'s.

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_client::display::{
    self, array_line_id, array_line_tasks, elapsed, local_time, local_time_or, null_or, short_state,
};
use quorum_model::parse::format_duration;
use quorum_proto::api::{self, JobInfo};

use crate::commands::{current_user, Context};
use crate::format::{self, parse_format, Piece};

/// Slurm's default `-o`.
const DEFAULT_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";
/// `-l`.
const LONG_FORMAT: &str = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R";
/// `--start`.
const START_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R";
/// Slurm's default order of jobs: by partition, then state (pending first), then priority,
/// highest first.
const DEFAULT_SORT: &str = "P,t,-p";

#[derive(Parser, Debug)]
#[command(name = "squeue", no_binary_name = true, infer_long_args = true, about = "The job queue (Quorum's squeue)")]
pub struct SqueueArgs {
    #[command(flatten)]
    controllers: ControllersArg,
    /// No header line.
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    /// Only these jobs (comma-separated; in any state while the cluster remembers them).
    #[arg(short = 'j', long = "jobs", value_delimiter = ',')]
    jobs: Vec<String>,
    /// Only these users' jobs.
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    users: Vec<String>,
    /// Only your own jobs.
    #[arg(long)]
    me: bool,
    /// Only jobs in these states (PENDING/PD, RUNNING/R, COMPLETED/CD, ...; `all`).
    #[arg(short = 't', long = "states", value_delimiter = ',')]
    states: Vec<String>,
    /// Only these partitions' jobs.
    #[arg(short = 'p', long = "partition", value_delimiter = ',')]
    partitions: Vec<String>,
    /// Only jobs of these names.
    #[arg(short = 'n', long = "name", value_delimiter = ',')]
    names: Vec<String>,
    /// Fields as `%` codes: `%i %P %j %u %T %t %M %l %L %D %C %R %r %N %S %e %V %a %q %A %F %K %Z %o %E %Y %Q %p`.
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    /// Fields by name, each with an optional `:width` (`JobID:10,Name,State`).
    #[arg(short = 'O', long = "Format")]
    long_format: Option<String>,
    /// One line for each array task.
    #[arg(short = 'r', long = "array")]
    array: bool,
    /// Jobs of every partition (they all are shown already).
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// More fields: the state's name and the time limit.
    #[arg(short = 'l', long = "long")]
    long: bool,
    /// Pending jobs with when and where they are expected to start.
    #[arg(long)]
    start: bool,
    /// The order of the lines: `%` codes, each `+` (increasing, the default) or `-`
    /// (decreasing), comma-separated (default `P,t,-p`: partition, state, priority highest first).
    #[arg(short = 'S', long = "sort", allow_hyphen_values = true)]
    sort: Option<String>,
}

/// What `-o` may name, with its header.
const CODES: &[(char, &str)] = &[
    ('i', "JOBID"),
    ('A', "JOBID"),
    ('F', "ARRAY_JOB_ID"),
    ('K', "ARRAY_TASK_ID"),
    ('j', "NAME"),
    ('u', "USER"),
    ('P', "PARTITION"),
    ('T', "STATE"),
    ('t', "ST"),
    ('M', "TIME"),
    ('l', "TIME_LIMIT"),
    ('L', "TIME_LEFT"),
    ('D', "NODES"),
    ('C', "CPUS"),
    ('R', "NODELIST(REASON)"),
    ('r', "REASON"),
    ('N', "NODELIST"),
    ('S', "START_TIME"),
    ('e', "END_TIME"),
    ('V', "SUBMIT_TIME"),
    ('a', "ACCOUNT"),
    ('q', "QOS"),
    ('Z', "WORK_DIR"),
    ('o', "COMMAND"),
    ('E', "DEPENDENCY"),
    ('Y', "SCHEDNODES"),
    ('k', "COMMENT"),
    ('v', "RESERVATION"),
    ('w', "WCKEY"),
    ('Q', "PRIORITY"),
    ('p', "PRIORITY"),
];

/// What `-O` may name (case does not matter), and the `%` code it is.
const NAMES: &[(&str, char)] = &[
    ("jobid", 'i'),
    ("jobarrayid", 'i'),
    ("arrayjobid", 'F'),
    ("arraytaskid", 'K'),
    ("name", 'j'),
    ("username", 'u'),
    ("partition", 'P'),
    ("state", 'T'),
    ("statecompact", 't'),
    ("timeused", 'M'),
    ("timelimit", 'l'),
    ("timeleft", 'L'),
    ("numnodes", 'D'),
    ("numcpus", 'C'),
    ("reasonlist", 'R'),
    ("reason", 'r'),
    ("nodelist", 'N'),
    ("starttime", 'S'),
    ("endtime", 'e'),
    ("submittime", 'V'),
    ("account", 'a'),
    ("qos", 'q'),
    ("workdir", 'Z'),
    ("command", 'o'),
    ("dependency", 'E'),
    ("comment", 'k'),
    ("wckey", 'w'),
    ("priority", 'p'),
    ("prioritylong", 'Q'),
];

/// Parses a `-O` format: comma-separated names, each 20 wide unless `:width` says otherwise, and
/// nothing between them (as Slurm's: a value as wide as its field meets the next one).
fn parse_long_format(format: &str) -> Result<Vec<Piece>, String> {
    format
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|field| {
            let (name, width) = match field.split_once(':') {
                Some((n, w)) => (
                    n,
                    w.parse::<usize>()
                        .ok()
                        .filter(|w| *w <= 1024)
                        .ok_or_else(|| format!("invalid width in --Format field '{field}'"))?,
                ),
                None => (field, 20),
            };
            let code = NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, c)| *c).ok_or_else(|| {
                let known: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
                format!("invalid --Format field '{name}' (known: {})", known.join(", "))
            })?;
            Ok(Piece::Field { code, width: Some(width), right: false })
        })
        .collect()
}

/// A line of the queue: a job, or the pending tasks of an array together.
struct Row<'a> {
    job: std::borrow::Cow<'a, JobInfo>,
    /// A heterogeneous job's component on this line (`12+1`).
    het: Option<usize>,
    /// The task ids of an array's pending tasks on this line (empty: the job alone).
    tasks: Vec<u32>,
    /// Its priority (a pending job's; 0 for the others), and that over the most any job can
    /// have (the weights' sum), in [0, 1].
    priority: f64,
    norm: f64,
}

/// A field's value for `row`.
fn value(code: char, row: &Row, now_ms: u64) -> String {
    let j = &*row.job;
    let spec = j.spec.as_ref();
    let array = j.array.as_ref();
    let limit = (j.time_limit_s > 0).then_some(j.time_limit_s);
    match code {
        'i' => match row.het {
            Some(k) => quorum_model::het::component_name(j.id, k),
            None => array_line_id(j, &row.tasks),
        },
        'A' => j.id.to_string(),
        'F' => array.map_or(j.id, |a| a.array_job_id).to_string(),
        'K' => match array {
            Some(_) if row.tasks.len() > 1 => array_line_tasks(j, &row.tasks),
            Some(a) => a.task_id.to_string(),
            None => "N/A".into(),
        },
        'j' => j.name.clone(),
        'u' => j.user.clone(),
        'P' => j.partition.clone(),
        'T' => j.state.clone(),
        't' => short_state(&j.state).to_string(),
        'M' => elapsed(j, now_ms),
        'l' => limit.map_or_else(|| "UNLIMITED".into(), format_duration),
        'L' => match limit {
            None => "UNLIMITED".into(),
            Some(l) => {
                let used = if j.start_time_ms == 0 { 0 } else { now_ms.saturating_sub(j.start_time_ms) / 1000 };
                format_duration(l.saturating_sub(used))
            }
        },
        'D' => spec.map_or(0, |s| s.nodes).to_string(),
        'C' => spec.map_or(0, |s| u64::from(s.ntasks) * u64::from(s.cpus_per_task.max(1))).to_string(),
        'R' if j.state == "PENDING" => format!("({})", if j.reason.is_empty() { "None" } else { &j.reason }),
        'R' => j.nodelist.clone(),
        'r' => {
            if j.reason.is_empty() {
                "None".into()
            } else {
                j.reason.clone()
            }
        }
        'N' => j.nodelist.clone(),
        'S' if j.start_time_ms == 0 => local_time_or(j.expected_start_ms, "N/A"),
        'S' => local_time(j.start_time_ms),
        'e' => match (j.end_time_ms, limit) {
            (0, Some(l)) if j.start_time_ms > 0 => local_time(j.start_time_ms + l * 1000),
            (e, _) => local_time_or(e, "N/A"),
        },
        'V' => local_time_or(j.submit_time_ms, "N/A"),
        'a' => j.account.clone(),
        'q' => j.qos.clone(),
        'Z' => spec.map_or_else(String::new, |s| s.work_dir.clone()),
        'k' => null_or(spec.map_or("", |s| s.comment.as_str())).to_string(),
        'v' => null_or(spec.map_or("", |s| s.reservation.as_str())).to_string(),
        'w' => null_or(spec.map_or("", |s| s.wckey.as_str())).to_string(),
        'o' => spec.map_or_else(String::new, |s| {
            if !s.script.is_empty() {
                s.script.lines().next().unwrap_or_default().to_string()
            } else {
                s.argv.join(" ")
            }
        }),
        'E' => spec.map_or_else(String::new, |s| s.dependency.clone()),
        'Y' if j.expected_nodes.is_empty() => "(null)".into(),
        'Y' => j.expected_nodes.clone(),
        'Q' => format!("{:.0}", row.priority),
        'p' => format!("{:.8}", row.norm),
        _ => String::new(),
    }
}

fn render(pieces: &[Piece], rows: &[Row], now_ms: u64, header: bool) -> String {
    let mut out = String::new();
    let line = |f: &dyn Fn(char) -> String| format::line(pieces, f);
    if header {
        out.push_str(&line(&|code| CODES.iter().find(|(c, _)| *c == code).map_or("", |(_, h)| h).to_string()));
        out.push('\n');
    }
    for row in rows {
        out.push_str(&line(&|code| value(code, row, now_ms)));
        out.push('\n');
    }
    out
}

/// Slurm's state names and short forms, as `-t` takes them.
fn state_names(states: &[String]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for s in states {
        if s.eq_ignore_ascii_case("all") {
            return Ok(Vec::new());
        }
        let state = quorum_model::JobState::from_name(s.trim()).ok_or_else(|| format!("invalid --states '{s}'"))?;
        out.push(state.name().to_string());
    }
    Ok(out)
}

/// The lines of the queue, pending first, then the others, by id within (before `-S` sorts
/// them; a sort keeps this order among equal lines).
fn rows(jobs: &[JobInfo], expand: bool) -> Vec<Row<'_>> {
    let mut rows: Vec<Row> = Vec::new();
    for j in jobs {
        let array = j.array.as_ref().filter(|_| !expand && j.state == "PENDING");
        if let Some(a) = array {
            if let Some(row) = rows.iter_mut().rev().find(|r| {
                r.job.state == "PENDING"
                    && r.job.reason == j.reason
                    && r.job.array.as_ref().is_some_and(|b| b.array_job_id == a.array_job_id)
            }) {
                row.tasks.push(a.task_id);
                continue;
            }
        }
        if display::het_size(j) > 1 {
            // A heterogeneous job: a line per component, as Slurm lists them.
            for k in 0..display::het_size(j) {
                let job = std::borrow::Cow::Owned(display::het_component(j, k));
                rows.push(Row { job, het: Some(k), tasks: Vec::new(), priority: 0.0, norm: 0.0 });
            }
            continue;
        }
        let tasks = array.map(|a| vec![a.task_id]).unwrap_or_default();
        rows.push(Row { job: std::borrow::Cow::Borrowed(j), het: None, tasks, priority: 0.0, norm: 0.0 });
    }
    rows.sort_by_key(|r| (r.job.state != "PENDING", r.job.id, r.het));
    rows
}

/// One key of `-S`: a field's `%` code, increasing or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SortKey {
    code: char,
    decreasing: bool,
}

/// Reads `-S`: `%` codes (the `%` optional), each with `+` or `-` before it, comma-separated.
fn parse_sort(text: &str) -> Result<Vec<SortKey>, String> {
    let mut keys = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (decreasing, rest) = match part.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, part.strip_prefix('+').unwrap_or(part)),
        };
        let rest = rest.strip_prefix('%').unwrap_or(rest);
        let mut chars = rest.chars();
        let (Some(code), None) = (chars.next(), chars.next()) else {
            return Err(format!("invalid --sort key '{part}': one field's letter, as -o's % codes"));
        };
        if !CODES.iter().any(|(c, _)| *c == code) {
            let known: String = CODES.iter().map(|(c, _)| *c).collect();
            return Err(format!("invalid --sort key '{part}' (fields: {known})"));
        }
        keys.push(SortKey { code, decreasing });
    }
    Ok(keys)
}

/// Slurm's order of job states (its `job_states` enum): pending first.
fn state_rank(state: &str) -> u32 {
    const ORDER: [&str; 12] = [
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    ];
    ORDER.iter().position(|s| *s == state).map_or(ORDER.len() as u32, |p| p as u32)
}

/// How `-S` compares a field: numbers as numbers, states in Slurm's order, the rest as shown.
#[derive(PartialEq, PartialOrd)]
enum Sortable {
    Number(f64),
    Text(String),
}

fn sortable(code: char, row: &Row, now_ms: u64) -> Sortable {
    let j = &*row.job;
    let n = |v: u64| Sortable::Number(v as f64);
    match code {
        // A heterogeneous job's components are jobs of their own ids on Slurm (`12+1` is 13).
        'i' | 'A' => n(j.id + row.het.unwrap_or(0) as u64),
        'F' => n(j.array.as_ref().map_or(j.id, |a| a.array_job_id)),
        'K' => n(j.array.as_ref().map_or(0, |a| u64::from(a.task_id))),
        't' | 'T' => n(u64::from(state_rank(&j.state))),
        'Q' | 'p' => Sortable::Number(row.priority),
        'D' | 'C' => value(code, row, now_ms).parse().map_or_else(|_| Sortable::Text(String::new()), Sortable::Number),
        'M' => n(if j.start_time_ms == 0 { 0 } else { now_ms.saturating_sub(j.start_time_ms) }),
        'l' => n(if j.time_limit_s == 0 { u64::MAX } else { j.time_limit_s }),
        'S' => n(if j.start_time_ms == 0 { j.expected_start_ms } else { j.start_time_ms }),
        'e' => n(j.end_time_ms),
        'V' => n(j.submit_time_ms),
        _ => Sortable::Text(value(code, row, now_ms)),
    }
}

/// Puts `rows` in `keys`' order; lines equal on every key keep theirs (by job id).
fn sort_rows(rows: &mut [Row], keys: &[SortKey], now_ms: u64) {
    rows.sort_by(|a, b| {
        for k in keys {
            let (x, y) = (sortable(k.code, a, now_ms), sortable(k.code, b, now_ms));
            let order = x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal);
            let order = if k.decreasing { order.reverse() } else { order };
            if order != std::cmp::Ordering::Equal {
                return order;
            }
        }
        std::cmp::Ordering::Equal
    });
}

/// Gives each pending line its job's priority, from the controllers' (sprio's) answer; a held
/// job's is 0, as `scontrol show job` shows it (and Slurm's).
fn set_priorities(rows: &mut [Row], r: &api::PriorityResponse) {
    let most = crate::sprio::total_weight(r);
    let of: std::collections::HashMap<u64, f64> = r.jobs.iter().map(|j| (j.job_id, j.total)).collect();
    for row in rows.iter_mut().filter(|row| row.job.held.is_empty()) {
        if let Some(&total) = of.get(&row.job.id) {
            row.priority = total;
            row.norm = (total / most).clamp(0.0, 1.0);
        }
    }
}

pub async fn run(a: SqueueArgs) -> anyhow::Result<u8> {
    let pieces = match (&a.long_format, &a.format) {
        (Some(f), _) => parse_long_format(f),
        (None, Some(f)) => parse_format(f, CODES, "squeue"),
        (None, None) if a.start => parse_format(START_FORMAT, CODES, "squeue"),
        (None, None) if a.long => parse_format(LONG_FORMAT, CODES, "squeue"),
        (None, None) => parse_format(DEFAULT_FORMAT, CODES, "squeue"),
    }
    .map_err(anyhow::Error::msg)?;
    let sort = parse_sort(a.sort.as_deref().unwrap_or(DEFAULT_SORT)).map_err(anyhow::Error::msg)?;
    let named: Vec<quorum_client::client::JobRef> =
        a.jobs.iter().map(|j| j.parse()).collect::<Result<_, String>>().map_err(anyhow::Error::msg)?;
    let mut states = state_names(&a.states).map_err(anyhow::Error::msg)?;
    if a.start {
        states = vec!["PENDING".into()];
    } else if a.states.is_empty() && a.jobs.is_empty() {
        states = vec!["PENDING".into(), "RUNNING".into(), "SUSPENDED".into()];
    }
    let mut users: Vec<String> = a.users.clone();
    if a.me {
        users.push(current_user());
    }
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let req = api::ListJobsRequest {
        states,
        user: if users.len() == 1 { users[0].clone() } else { String::new() },
        ..Default::default()
    };
    let all = ctx.list_all_jobs(req).await?;
    let now_ms = all.now_ms;
    let jobs: Vec<JobInfo> = all
        .jobs
        .into_iter()
        .filter(|j| {
            (named.is_empty() || named.iter().any(|r| r.names(j)))
                && (users.is_empty() || users.contains(&j.user))
                && (a.partitions.is_empty() || a.partitions.contains(&j.partition))
                && (a.names.is_empty() || a.names.contains(&j.name))
        })
        .collect();
    let _ = a.all;
    let mut lines = rows(&jobs, a.array);
    let asks_priority = |code: char| code == 'p' || code == 'Q';
    let shown = pieces.iter().any(|p| matches!(p, Piece::Field { code, .. } if asks_priority(*code)));
    if (shown || sort.iter().any(|k| asks_priority(k.code))) && jobs.iter().any(|j| j.state == "PENDING") {
        // As scontrol's records: without an answer (an older controller), no priorities, and
        // the lines stay in id order among equals.
        let req = api::PriorityRequest::default();
        if let Ok(r) = ctx.send(req, |mut c, r| async move { c.priorities(r).await }).await {
            set_priorities(&mut lines, &r);
        }
    }
    sort_rows(&mut lines, &sort, now_ms);
    if a.long && !a.noheader {
        // As Slurm's, the long table starts with the time it shows.
        println!("{}", format::ctime(now_ms));
    }
    print!("{}", render(&pieces, &lines, now_ms, !a.noheader));
    Ok(0)
}

pub fn main(args: &[String]) -> std::process::ExitCode {
    crate::entry::main_of::<SqueueArgs, _, _>("squeue", crate::entry::Threads::One, args, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, state: &str, name: &str) -> JobInfo {
        JobInfo {
            id,
            name: name.into(),
            user: "alice".into(),
            partition: "gpu".into(),
            state: state.into(),
            reason: if state == "PENDING" { "JobHeldUser".into() } else { String::new() },
            spec: Some(api::JobSpec { nodes: 2, ntasks: 4, cpus_per_task: 2, ..Default::default() }),
            time_limit_s: 3600,
            nodelist: if state == "RUNNING" { "node[01-02]".into() } else { String::new() },
            start_time_ms: if state == "RUNNING" { 1_000_000 } else { 0 },
            ..Default::default()
        }
    }

    #[test]
    fn formats_are_read_and_printed_as_squeue_does() {
        assert_eq!(
            parse_format("%.18i|%-5j%%%T", CODES, "squeue").unwrap(),
            [
                Piece::Field { code: 'i', width: Some(18), right: true },
                Piece::Text("|".into()),
                Piece::Field { code: 'j', width: Some(5), right: false },
                Piece::Text("%".into()),
                Piece::Field { code: 'T', width: None, right: false },
            ]
        );
        assert!(parse_format("%z", CODES, "squeue").unwrap_err().contains("%z is not a field"));
        assert!(parse_format("%.1", CODES, "squeue").unwrap_err().contains("middle of a field"));
        assert!(parse_long_format("JobID:10,Bogus").unwrap_err().contains("'Bogus'"));

        let mut tasks: Vec<JobInfo> = (0..4)
            .map(|t| {
                let mut j = job(20 + t, "PENDING", "arr");
                j.array =
                    Some(api::ArrayTask { array_job_id: 20, task_id: t as u32, count: 4, min: 0, max: 3, throttle: 2 });
                j
            })
            .collect();
        tasks[1].state = "RUNNING".into();
        tasks[1].reason.clear();
        tasks[1].nodelist = "node01".into();
        tasks[1].start_time_ms = 1_000_000;
        let mut jobs = vec![job(7, "RUNNING", "a-very-long-name"), job(8, "PENDING", "b")];
        jobs.extend(tasks);
        let now = 1_061_000;
        // The default format, pending array tasks on one line.
        let out = render(&parse_format(DEFAULT_FORMAT, CODES, "squeue").unwrap(), &rows(&jobs, false), now, true);
        assert_eq!(
            out,
            "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)\n\
             \x20                8       gpu        b    alice PD       0:00      2 (JobHeldUser)\n\
             \x20     20_[0,2-3%2]       gpu      arr    alice PD       0:00      2 (JobHeldUser)\n\
             \x20                7       gpu a-very-l    alice  R       1:01      2 node[01-02]\n\
             \x20             20_1       gpu      arr    alice  R       1:01      2 node01\n"
        );
        // What tools ask for: no header, one line per task, their own fields.
        let out =
            render(&parse_format("%i|%T|%A|%F|%K|%C|%l|%L", CODES, "squeue").unwrap(), &rows(&jobs, true), now, false);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "8|PENDING|8|8|N/A|8|1:00:00|1:00:00");
        assert_eq!(lines[1], "20_0|PENDING|20|20|0|8|1:00:00|1:00:00");
        assert_eq!(lines.len(), 6);
        assert_eq!(lines[4], "7|RUNNING|7|7|N/A|8|1:00:00|58:59");
        let out = render(&parse_long_format("JobID:6,State:5,Name").unwrap(), &rows(&jobs[..1], false), now, true);
        assert_eq!(out, "JOBID STATENAME\n7     RUNNIa-very-long-name\n");
    }

    #[test]
    fn the_start_table_names_where_a_job_is_expected_to_start() {
        let mut j = job(9, "PENDING", "b");
        let out = render(
            &parse_format(START_FORMAT, CODES, "squeue").unwrap(),
            &rows(std::slice::from_ref(&j), false),
            0,
            true,
        );
        assert_eq!(
            out,
            "             JOBID PARTITION     NAME     USER ST          START_TIME  NODES SCHEDNODES           NODELIST(REASON)\n\
             \x20                9       gpu        b    alice PD                 N/A      2 (null)               (JobHeldUser)\n"
        );
        j.expected_nodes = "node[01-02]".into();
        let out =
            render(&parse_format("%Y", CODES, "squeue").unwrap(), &rows(std::slice::from_ref(&j), false), 0, false);
        assert_eq!(out, "node[01-02]\n");
        assert_eq!(format::ctime(0).len(), "Thu Jan  1 00:00:00 1970".len());
    }

    /// Slurm's default order: by partition, pending before running, and among pending jobs the
    /// highest priority first (not the lowest id); `-S` any other, `-` for decreasing.
    #[test]
    fn lines_are_in_slurms_order_or_sorts() {
        let mut jobs = vec![job(3, "RUNNING", "r"), job(4, "PENDING", "low"), job(5, "PENDING", "high")];
        jobs.push(JobInfo { partition: "a-first".into(), ..job(9, "PENDING", "other") });
        let r = api::PriorityResponse {
            jobs: vec![
                api::JobPriority { job_id: 4, total: 1200.0, ..Default::default() },
                api::JobPriority { job_id: 5, total: 3400.0, ..Default::default() },
                api::JobPriority { job_id: 9, total: 100.0, ..Default::default() },
            ],
            weight_age: 1000,
            weight_fairshare: 9000,
            ..Default::default()
        };
        let shown = |sort: &str, format: &str| {
            let mut lines = rows(&jobs, false);
            set_priorities(&mut lines, &r);
            sort_rows(&mut lines, &parse_sort(sort).unwrap(), 2_000_000);
            render(&parse_format(format, CODES, "squeue").unwrap(), &lines, 2_000_000, false)
        };
        assert_eq!(shown(DEFAULT_SORT, "%i %P %t %Q"), "9 a-first PD 100\n5 gpu PD 3400\n4 gpu PD 1200\n3 gpu R 0\n");
        assert_eq!(shown("-i", "%i"), "9\n5\n4\n3\n");
        assert_eq!(shown("+j", "%j"), "high\nlow\nother\nr\n");
        assert_eq!(shown("-p,i", "%i %p"), "5 0.34000000\n4 0.12000000\n9 0.01000000\n3 0.00000000\n");
        assert!(parse_sort("P,zz").unwrap_err().contains("'zz'"));
        // `-S -V` as users type it: the key begins with a hyphen.
        let args = SqueueArgs::try_parse_from(["-S", "-V"]).expect("-S takes a decreasing key");
        assert_eq!(args.sort.as_deref(), Some("-V"));
        assert!(parse_sort("-z").unwrap_err().contains("'-z'"));
        assert_eq!(
            parse_sort("%P,-%p").unwrap(),
            [SortKey { code: 'P', decreasing: false }, SortKey { code: 'p', decreasing: true }]
        );
    }

    #[test]
    fn states_are_taken_by_name_or_short_form() {
        assert_eq!(state_names(&["pd".into(), "RUNNING".into()]).unwrap(), ["PENDING", "RUNNING"]);
        assert!(state_names(&["all".into()]).unwrap().is_empty());
        assert!(state_names(&["nope".into()]).unwrap_err().contains("'nope'"));
    }
}
