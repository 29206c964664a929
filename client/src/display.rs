//! Output of the read commands: tables like squeue, sinfo and scontrol, and `--json`.

use quorum_model::parse::{format_duration, format_mem_mb};
use quorum_proto::api::{JobInfo, NodeInfo, PriorityResponse, ReplicaStatus, SharesResponse};
use serde::Serialize;

/// A job as `--json` prints it.
#[derive(Serialize)]
pub struct JobJson {
    pub id: u64,
    pub name: String,
    pub user: String,
    pub partition: String,
    pub state: String,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The allocated nodes in rank order.
    pub nodes: Vec<String>,
    pub nodelist: String,
    pub num_nodes: u32,
    pub ntasks: u32,
    pub cpus_per_task: u32,
    pub mem_per_node_mb: u64,
    pub gpus_per_node: u32,
    pub gpu_type: Option<String>,
    pub gpus: Vec<Vec<u32>>,
    pub time_limit_s: Option<u64>,
    pub submit_time_ms: u64,
    pub start_time_ms: Option<u64>,
    pub end_time_ms: Option<u64>,
    pub work_dir: String,
    pub stdout: String,
    pub stderr: String,
    pub command: Vec<String>,
    pub script: bool,
    pub account: String,
    pub qos: String,
    pub held: Option<String>,
    pub dependency: Option<String>,
    /// Where a pending job is expected to start: backfill's reservation, or a forecast.
    pub expected_start_ms: Option<u64>,
    pub expected_nodes: Option<String>,
    /// The expected start is a forecast (on predicted run times), not a reservation.
    pub expected_forecast: bool,
    /// Once started: the start it was first shown while it waited, and the one in force when
    /// it started (a reservation or a forecast).
    pub shown_first_ms: Option<u64>,
    pub shown_last_ms: Option<u64>,
    /// Back to the queue if its node fails.
    pub requeue: bool,
    /// Times it went back to the queue after a node failure.
    pub requeues: u32,
    /// For a task of a job array: the array's id and the task id.
    pub array_job_id: Option<u64>,
    pub array_task_id: Option<u32>,
}

fn nonzero(v: u64) -> Option<u64> {
    (v != 0).then_some(v)
}

pub fn job_json(j: &JobInfo) -> JobJson {
    let spec = j.spec.clone().unwrap_or_default();
    JobJson {
        id: j.id,
        name: j.name.clone(),
        user: j.user.clone(),
        partition: j.partition.clone(),
        state: j.state.clone(),
        reason: (!j.reason.is_empty()).then(|| j.reason.clone()),
        exit_code: j.has_exit_code.then_some(j.exit_code),
        signal: (j.signal != 0).then_some(j.signal),
        nodes: j.allocation.iter().map(|a| a.node.clone()).collect(),
        nodelist: j.nodelist.clone(),
        num_nodes: spec.nodes,
        ntasks: spec.ntasks,
        cpus_per_task: spec.cpus_per_task,
        mem_per_node_mb: spec.mem_per_node_mb,
        gpus_per_node: spec.gpus_per_node,
        gpu_type: (!spec.gpu_type.is_empty()).then(|| spec.gpu_type.clone()),
        gpus: j.allocation.iter().map(|a| a.gpus.clone()).collect(),
        time_limit_s: nonzero(j.time_limit_s),
        submit_time_ms: j.submit_time_ms,
        start_time_ms: nonzero(j.start_time_ms),
        end_time_ms: nonzero(j.end_time_ms),
        work_dir: spec.work_dir.clone(),
        stdout: spec.stdout.clone(),
        stderr: spec.stderr.clone(),
        command: spec.argv.clone(),
        script: !spec.script.is_empty(),
        account: j.account.clone(),
        qos: j.qos.clone(),
        held: (!j.held.is_empty()).then(|| j.held.clone()),
        dependency: (!spec.dependency.is_empty()).then(|| spec.dependency.clone()),
        expected_start_ms: nonzero(j.expected_start_ms),
        expected_nodes: (!j.expected_nodes.is_empty()).then(|| j.expected_nodes.clone()),
        expected_forecast: j.expected_forecast,
        shown_first_ms: nonzero(j.shown_first_ms),
        shown_last_ms: nonzero(j.shown_last_ms),
        requeue: spec.requeue,
        requeues: j.requeues,
        array_job_id: j.array.as_ref().map(|a| a.array_job_id),
        array_task_id: j.array.as_ref().map(|a| a.task_id),
    }
}

/// How users name a job: `12`, or `12_3` for task 3 of array 12.
pub fn job_name_id(j: &JobInfo) -> String {
    match &j.array {
        Some(a) => format!("{}_{}", a.array_job_id, a.task_id),
        None => j.id.to_string(),
    }
}

/// Milliseconds since the epoch as `2026-11-22T05:27:08Z`.
pub fn utc_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86400) as i64, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// Sorted ids as Slurm writes a list of array tasks: `0-3,5,7-9`.
pub fn id_ranges(ids: &[u32]) -> String {
    quorum_model::parse::ranges(ids)
}

/// An array's pending `tasks` as squeue and sacct write them on one line: `0-3,7%2` (with the
/// array's throttle).
pub fn array_line_tasks(j: &JobInfo, tasks: &[u32]) -> String {
    match j.array.as_ref().map(|a| a.throttle).filter(|t| *t > 0) {
        Some(t) => format!("{}%{t}", id_ranges(tasks)),
        None => id_ranges(tasks),
    }
}

/// The id of a line of squeue or sacct: `12`, a task `12_3`, or an array's pending `tasks`
/// together, `12_[0-3%2]`.
pub fn array_line_id(j: &JobInfo, tasks: &[u32]) -> String {
    match &j.array {
        Some(a) if tasks.len() > 1 => format!("{}_[{}]", a.array_job_id, array_line_tasks(j, tasks)),
        Some(a) => format!("{}_{}", a.array_job_id, a.task_id),
        None => j.id.to_string(),
    }
}

/// [`local_time`], or `none` for 0 (not yet, or never).
pub fn local_time_or(ms: u64, none: &str) -> String {
    if ms == 0 {
        none.into()
    } else {
        local_time(ms)
    }
}

/// Milliseconds since the epoch as Slurm prints a time: local, `2026-11-24T20:56:25`.
pub fn local_time(ms: u64) -> String {
    let secs = (ms / 1000) as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`, which lives here.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return "N/A".into();
    }
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Elapsed run time as squeue shows it.
pub fn elapsed(j: &JobInfo, now_ms: u64) -> String {
    let secs = match (j.start_time_ms, j.end_time_ms) {
        (0, _) => 0,
        (s, 0) => now_ms.saturating_sub(s) / 1000,
        (s, e) => e.saturating_sub(s) / 1000,
    };
    format_duration(secs)
}

pub fn short_state(state: &str) -> &'static str {
    match state {
        // A running job whose nodes are getting ready (its image pulled), as Slurm's CF.
        "CONFIGURING" => "CF",
        _ => quorum_model::JobState::from_name(state).map(|s| s.short()).unwrap_or("?"),
    }
}

/// A plain left-aligned table.
/// User text as a terminal may print it: control characters (escape sequences that would move
/// the cursor or clear other users' screens) are shown escaped, `\u{1b}`, never sent.
pub fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(
        s.chars().map(|c| if c.is_control() { c.escape_unicode().to_string() } else { c.to_string() }).collect(),
    )
}

pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|c| escape(c).into_owned()).collect()).collect();
    let rows = &rows;
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

pub fn queue_table(jobs: &[JobInfo], now_ms: u64) -> String {
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let where_ = if j.state == "PENDING" {
                format!("({})", if j.reason.is_empty() { "None" } else { &j.reason })
            } else if j.gpu_idle_since_ms > 0 && j.state == "RUNNING" {
                // Flagged by the GPU idle policy: for how long its GPUs have been idle.
                let idle_s = now_ms.saturating_sub(j.gpu_idle_since_ms) / 1000;
                format!("{} (GPUs idle {})", j.nodelist, quorum_model::parse::format_duration(idle_s))
            } else {
                j.nodelist.clone()
            };
            vec![
                job_name_id(j),
                j.partition.clone(),
                j.name.chars().take(24).collect(),
                j.user.clone(),
                short_state(&j.state).to_string(),
                elapsed(j, now_ms),
                j.spec.as_ref().map(|s| s.nodes).unwrap_or(0).to_string(),
                where_,
            ]
        })
        .collect();
    table(&["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES", "NODELIST(REASON)"], &rows)
}

/// Pending jobs with their expected start, like `squeue --start`.
pub fn start_table(jobs: &[JobInfo]) -> String {
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            vec![
                job_name_id(j),
                j.partition.clone(),
                j.name.chars().take(24).collect(),
                j.user.clone(),
                short_state(&j.state).to_string(),
                match (j.expected_start_ms, j.expected_forecast) {
                    (0, _) => "N/A".into(),
                    // A forecast, not a reservation: marked.
                    (at, true) => format!("{} (forecast)", utc_time(at)),
                    (at, false) => utc_time(at),
                },
                j.spec.as_ref().map(|s| s.nodes).unwrap_or(0).to_string(),
                if j.expected_nodes.is_empty() { "(null)".into() } else { j.expected_nodes.clone() },
                format!("({})", if j.reason.is_empty() { "None" } else { &j.reason }),
            ]
        })
        .collect();
    table(&["JOBID", "PARTITION", "NAME", "USER", "ST", "START_TIME", "NODES", "SCHEDNODES", "NODELIST(REASON)"], &rows)
}

/// Priorities like sprio: the weighted contribution of each factor.
pub fn prio_table(r: &PriorityResponse) -> String {
    let mut jobs = r.jobs.clone();
    jobs.sort_by(|a, b| b.total.total_cmp(&a.total).then(a.job_id.cmp(&b.job_id)));
    let w = |weight: u32, f: f64| format!("{:.0}", f64::from(weight) * f);
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            vec![
                j.job_id.to_string(),
                j.partition.clone(),
                j.user.clone(),
                j.account.clone(),
                format!("{:.0}", j.total),
                w(r.weight_age, j.age),
                w(r.weight_fairshare, j.fairshare),
                w(r.weight_job_size, j.job_size),
                w(r.weight_partition, j.partition_factor),
                w(r.weight_qos, j.qos),
                j.nice.to_string(),
            ]
        })
        .collect();
    let mut out = format!(
        "weights: age={} fairshare={} jobsize={} partition={} qos={}\n",
        r.weight_age, r.weight_fairshare, r.weight_job_size, r.weight_partition, r.weight_qos
    );
    out.push_str(&table(
        &[
            "JOBID",
            "PARTITION",
            "USER",
            "ACCOUNT",
            "PRIORITY",
            "AGE",
            "FAIRSHARE",
            "JOBSIZE",
            "PARTITION",
            "QOS",
            "NICE",
        ],
        &rows,
    ));
    out
}

pub fn prio_json(r: &PriorityResponse) -> serde_json::Value {
    serde_json::json!({
        "weights": {
            "age": r.weight_age, "fairshare": r.weight_fairshare, "job_size": r.weight_job_size,
            "partition": r.weight_partition, "qos": r.weight_qos,
            "tres": r.tres_names.iter().zip(&r.weight_tres).map(|(n, w)| (n.clone(), serde_json::json!(w)))
                .collect::<serde_json::Map<_, _>>(),
        },
        "jobs": r.jobs.iter().map(|j| serde_json::json!({
            "id": j.job_id, "user": j.user, "account": j.account, "partition": j.partition,
            "priority": j.total, "age": j.age, "fairshare": j.fairshare, "job_size": j.job_size,
            "partition_factor": j.partition_factor, "qos": j.qos, "nice": j.nice,
            "tres": r.tres_names.iter().zip(&j.tres).map(|(n, f)| (n.clone(), serde_json::json!(f)))
                .collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
    })
}

/// The account tree like sshare.
pub fn share_table(r: &SharesResponse) -> String {
    let depth = |name: &str| {
        let mut d = 0;
        let mut cur = r.accounts.iter().find(|a| a.name == name);
        while let Some(a) = cur.filter(|a| !a.parent.is_empty()) {
            d += 1;
            cur = r.accounts.iter().find(|p| p.name == a.parent);
            if d > 64 {
                break;
            }
        }
        d
    };
    let mut rows: Vec<Vec<String>> = Vec::new();
    for a in &r.accounts {
        let d = depth(&a.name);
        rows.push(vec![
            format!("{}{}", " ".repeat(d), a.name),
            a.raw_shares.to_string(),
            format!("{:.6}", a.norm_shares),
            format!("{:.0}", a.raw_usage),
            format!("{:.6}", a.norm_usage),
            format!("{:.6}", a.fairshare),
            a.users.join(","),
        ]);
        // Each user's own line under its account: its shares, usage and factor.
        for u in r.users.iter().filter(|u| u.account == a.name) {
            rows.push(vec![
                format!("{}{}", " ".repeat(d + 1), a.name),
                u.raw_shares.to_string(),
                format!("{:.6}", u.norm_shares),
                format!("{:.0}", u.raw_usage),
                format!("{:.6}", u.effective_usage),
                format!("{:.6}", u.fairshare),
                u.user.clone(),
            ]);
        }
    }
    table(&["ACCOUNT", "RAWSHARES", "NORMSHARES", "RAWUSAGE", "NORMUSAGE", "FAIRSHARE", "USERS"], &rows)
}

pub fn share_json(r: &SharesResponse) -> serde_json::Value {
    serde_json::Value::Array(
        r.accounts
            .iter()
            .map(|a| {
                serde_json::json!({
                    "account": a.name, "parent": a.parent, "raw_shares": a.raw_shares,
                    "norm_shares": a.norm_shares, "raw_usage": a.raw_usage, "norm_usage": a.norm_usage,
                    "fairshare": a.fairshare, "users": a.users,
                    "user_shares": r.users.iter().filter(|u| u.account == a.name).map(|u| serde_json::json!({
                        "user": u.user, "raw_shares": u.raw_shares, "norm_shares": u.norm_shares,
                        "raw_usage": u.raw_usage, "effective_usage": u.effective_usage, "fairshare": u.fairshare,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

fn mem(mb: u64) -> String {
    if mb == 0 {
        "0".into()
    } else {
        format_mem_mb(mb)
    }
}

/// `cgroup v1`, `cgroup v2` or `rlimits`, for the LIMITS column.
fn limits_word(limits: &str) -> String {
    match limits.split(" (").next() {
        Some(w) if w.starts_with("cgroup") => w.to_string(),
        _ => "rlimits".into(),
    }
}

pub fn nodes_table(nodes: &[NodeInfo]) -> String {
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            let mut state = n.state.clone();
            if !n.connected && n.state != "down" {
                state.push('*');
            }
            // The worst GPU, like dstack's `idle (failure)`; WARNING shows without draining.
            let worst = n.gpu_health.iter().filter(|g| g.state != "ok").max_by_key(|g| g.state == "failure");
            if let Some(g) = worst {
                state.push_str(&format!(" ({})", g.state));
            }
            let mut reason = n.reason.clone();
            if reason.is_empty() {
                let warnings: Vec<String> = n
                    .gpu_health
                    .iter()
                    .filter(|g| g.state == "warning")
                    .map(|g| format!("GPU {} warning: {}", g.index, g.detail))
                    .collect();
                reason = warnings.join("; ");
            }
            vec![
                n.name.clone(),
                n.partitions.join(","),
                state,
                format!("{}/{}", n.alloc_cpus, n.cpus),
                format!("{}/{}", mem(n.alloc_mem_mb), mem(n.mem_mb)),
                format!("{}/{}", n.alloc_gpus, n.gpus),
                if n.gpu_types.is_empty() { "-".into() } else { n.gpu_types.clone() },
                if n.limits.is_empty() { "-".into() } else { limits_word(&n.limits) },
                if n.images_cached == 0 {
                    "-".into()
                } else {
                    format!("{}/{}", n.images_cached, mem(n.image_cache_bytes >> 20))
                },
                reason,
            ]
        })
        .collect();
    let header =
        ["NODE", "PARTITION", "STATE", "CPUS(A/T)", "MEM(A/T)", "GPUS(A/T)", "GPU_TYPES", "LIMITS", "IMAGES", "REASON"];
    table(&header, &rows)
}

/// Why nodes have no cgroups (too long for a column), a line per reason; for standard error, so
/// that the table stays a table for scripts.
pub fn nodes_notes(nodes: &[NodeInfo]) -> String {
    let mut out = String::new();
    let mut why: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for n in nodes {
        // Turned off on purpose: nothing to tell the operator.
        if let Some(w) = n.limits.strip_prefix("rlimits only: ").filter(|w| *w != quorum_proto::CGROUPS_OFF) {
            why.entry(w).or_default().push(&n.name);
        }
    }
    for (w, names) in why {
        let which = if names.len() <= 3 { names.join(",") } else { format!("{} nodes", names.len()) };
        out.push_str(&format!("{which}: no cgroups for jobs ({w}); memory is capped with rlimits\n"));
    }
    out
}

/// What the job holds (running) or asks for (pending) as Slurm's `TRES=` writes it: CPUs,
/// memory in megabytes, nodes and GPUs, all jobs' totals.
fn tres(j: &JobInfo, spec: &quorum_proto::api::JobSpec) -> String {
    let (cpus, mem, nodes, gpus) = resources(j, spec);
    let gpus = if gpus > 0 { format!(",gres/gpu={gpus}") } else { String::new() };
    format!("cpu={cpus},mem={mem}M,node={nodes}{gpus}")
}

/// What the job holds (running) or asks for (pending): CPUs, memory in megabytes, nodes and
/// GPUs, all its nodes' together. An overcommitted job asks for one task's CPUs per node.
fn resources(j: &JobInfo, spec: &quorum_proto::api::JobSpec) -> (u64, u64, u64, u64) {
    if j.allocation.is_empty() {
        let nodes = u64::from(spec.nodes);
        let cpus = match spec.overcommit {
            true => nodes * u64::from(spec.cpus_per_task),
            false => u64::from(spec.ntasks) * u64::from(spec.cpus_per_task),
        };
        (cpus, spec.mem_per_node_mb * nodes, nodes, u64::from(spec.gpus_per_node) * nodes)
    } else {
        let a = &j.allocation;
        (
            a.iter().map(|n| u64::from(n.cpus)).sum(),
            a.iter().map(|n| n.mem_mb).sum(),
            a.len() as u64,
            a.iter().map(|n| n.gpus.len() as u64).sum(),
        )
    }
}

/// Slurm's word for an unset text field.
pub fn null_or(text: &str) -> &str {
    if text.is_empty() {
        "(null)"
    } else {
        text
    }
}

/// The group a job runs with, from this host's databases: `run_group` (`--gid`) when given,
/// else its user's own; `None` when this host does not know it.
pub fn job_group(user: &str, run_group: &str) -> Option<quorum_auth::users::Group> {
    match run_group {
        "" => quorum_auth::users::by_name(user).ok().and_then(|u| quorum_auth::users::group(&u.gid.to_string()).ok()),
        g => quorum_auth::users::group(g).ok(),
    }
}

/// `UserId=alice(1001) GroupId=alice(1001)` as Slurm writes them, from this host's user and group
/// databases: the job's group is the one it runs with (`--gid`), else its user's own; a name
/// this host does not know is written alone.
fn user_and_group(user: &str, run_group: &str) -> String {
    let found = quorum_auth::users::by_name(user).ok();
    let uid = found.as_ref().map_or_else(|| user.to_string(), |u| format!("{user}({})", u.uid));
    let group = job_group(user, run_group);
    let gid = match (group, run_group) {
        (Some(g), _) => format!("{}({})", g.name, g.gid),
        (None, "") => "(null)".into(),
        (None, g) => g.to_string(),
    };
    format!("UserId={uid} GroupId={gid}")
}

/// How many components a job has: 1 unless it is heterogeneous.
pub fn het_size(j: &JobInfo) -> usize {
    1 + j.spec.as_ref().map_or(0, |s| s.het.len())
}

/// Component `k` of a heterogeneous job as a job of its own, as Slurm lists it: the job with
/// the component's resources, and its nodes alone.
pub fn het_component(j: &JobInfo, k: usize) -> JobInfo {
    let mut c = j.clone();
    if let (Some(spec), Some(own)) = (c.spec.as_mut(), j.spec.as_ref().and_then(|s| s.het.get(k.wrapping_sub(1)))) {
        spec.nodes = own.nodes;
        spec.ntasks = own.ntasks;
        spec.cpus_per_task = own.cpus_per_task;
        spec.mem_per_node_mb = own.mem_per_node_mb;
        spec.gpus_per_node = own.gpus_per_node;
        spec.gpu_type = own.gpu_type.clone();
        spec.constraint = own.constraint.clone();
        spec.constraint_any = own.constraint_any;
        spec.constraint_same = own.constraint_same;
        spec.constraint_counts = own.constraint_counts.clone();
        spec.exclusive = own.exclusive;
        spec.exclude = own.exclude.clone();
        spec.nodelist = own.nodelist.clone();
        // Its own partition, where it has one.
        if !own.partition.is_empty() {
            spec.partition = own.partition.clone();
            c.partition = own.partition.clone();
        }
    }
    c.allocation.retain(|n| n.het_group as usize == k);
    if k > 0 {
        // Its steps are listed once, with component 0 (whose id they carry).
        c.steps.clear();
    }
    let names: Vec<&str> = c.allocation.iter().map(|n| n.node.as_str()).collect();
    c.nodelist = quorum_model::hostlist::compress(&names);
    c
}

/// `scontrol show job`'s record; `priority` as the scheduler ranks the job now, when pending.
/// A heterogeneous job has one record per component, each with its `HetJobId`.
pub fn show_job(j: &JobInfo, now_ms: u64, priority: Option<u64>) -> String {
    match het_size(j) {
        1 => show_one_job(j, now_ms, priority, None),
        // Records apart by a blank line, as `scontrol show job` writes several.
        n => (0..n)
            .map(|k| show_one_job(&het_component(j, k), now_ms, priority, Some((k, n))))
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

fn show_one_job(j: &JobInfo, now_ms: u64, priority: Option<u64>, het: Option<(usize, usize)>) -> String {
    let spec = j.spec.clone().unwrap_or_default();
    // Local times without a zone, as Slurm writes them (tools read them so); `Unknown` for none.
    let ms = |v: u64| local_time_or(v, "Unknown");
    let mut lines = vec![
        match &j.array {
            Some(a) => format!(
                "JobId={} ArrayJobId={} ArrayTaskId={} ArrayTasks={} ArrayThrottle={} JobName={}",
                j.id,
                a.array_job_id,
                a.task_id,
                a.count,
                if a.throttle == 0 { "none".to_string() } else { a.throttle.to_string() },
                j.name
            ),
            None => match het {
                Some((k, n)) => format!(
                    "JobId={} HetJobId={} HetJobOffset={k} JobName={} HetJobIdSet={}-{}",
                    j.id + k as u64,
                    j.id,
                    j.name,
                    j.id,
                    j.id + n as u64 - 1
                ),
                None => format!("JobId={} JobName={}", j.id, j.name),
            },
        },
        format!(
            "{} Partition={} Reservation={}",
            user_and_group(&j.user, &spec.group),
            j.partition,
            null_or(&spec.reservation)
        ),
        format!(
            "{}Nice={} Account={} QOS={}",
            priority.map_or(String::new(), |p| format!("Priority={p} ")),
            spec.nice,
            null_or(&j.account),
            null_or(&j.qos)
        ),
        format!(
            "JobState={} Reason={} ExitCode={}:{}",
            j.state,
            if j.reason.is_empty() { "None" } else { &j.reason },
            if j.has_exit_code { j.exit_code.to_string() } else { "-".into() },
            j.signal
        ),
        format!(
            "RunTime={} TimeLimit={}",
            elapsed(j, now_ms),
            if j.time_limit_s == 0 { "UNLIMITED".into() } else { format_duration(j.time_limit_s) }
        ),
        format!(
            "Requeue={} Restarts={} PreemptedBy={}{}",
            u8::from(spec.requeue),
            j.requeues,
            if j.preempted_by == 0 { "(null)".to_string() } else { j.preempted_by.to_string() },
            match (j.preempting_for, j.claimed_nodes.as_str()) {
                (0, "") => String::new(),
                (0, nodes) => format!(" ClaimedNodes={nodes}"),
                (by, _) => format!(" PreemptingFor={by}"),
            }
        ),
        // A pending job's StartTime is when it is expected to start (its reservation, or the
        // forecast), as Slurm's shows backfill's estimate there.
        format!(
            "SubmitTime={} StartTime={} EndTime={}",
            ms(j.submit_time_ms),
            ms(if j.start_time_ms == 0 && j.state == "PENDING" { j.expected_start_ms } else { j.start_time_ms }),
            ms(j.end_time_ms)
        ),
        format!(
            "NumNodes={} NumCPUs={} NumTasks={} CPUs/Task={} MinMemoryNode={} Gpus/Node={}{}",
            spec.nodes,
            resources(j, &spec).0,
            spec.ntasks,
            spec.cpus_per_task,
            mem(spec.mem_per_node_mb),
            spec.gpus_per_node,
            if spec.gpu_type.is_empty() { String::new() } else { format!(" GpuType={}", spec.gpu_type) }
        ),
        format!("NodeList={}", if j.nodelist.is_empty() { "(null)" } else { &j.nodelist }),
        format!("TRES={}", tres(j, &spec)),
        format!(
            "ReqNodeList={} ExcNodeList={} Features={}",
            null_or(&quorum_model::hostlist::compress(&spec.nodelist)),
            null_or(&quorum_model::hostlist::compress(&spec.exclude)),
            null_or(&match spec.constraint_counts.is_empty() {
                true => quorum_model::constraint_string(&spec.constraint, spec.constraint_any, spec.constraint_same),
                false => quorum_model::counted_constraint_string(&spec.constraint, &spec.constraint_counts),
            })
        ),
        format!(
            "OverSubscribe={} Licenses={}",
            // Slurm's job values: NO for whole nodes, YES when it asked to share, else OK (as
            // its partition says).
            if spec.exclusive {
                "NO"
            } else if spec.oversubscribe {
                "YES"
            } else {
                "OK"
            },
            null_or(&quorum_model::licenses_string(&spec.licenses.iter().map(|(k, v)| (k.clone(), *v)).collect()))
        ),
    ];
    let notes = [
        ("Comment", &spec.comment),
        ("WCKey", &spec.wckey),
        ("MailUser", &spec.mail_user),
        ("MailType", &spec.mail_type),
    ];
    let notes: Vec<String> = notes.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k}={v}")).collect();
    if !notes.is_empty() {
        lines.push(notes.join(" "));
    }
    for a in &j.allocation {
        lines.push(format!(
            "  Node={} CPUs={} Mem={} GPUs={}",
            a.node,
            a.cpus,
            mem(a.mem_mb),
            a.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")
        ));
    }
    let command = match (spec.script.is_empty(), spec.argv.is_empty()) {
        (true, _) => spec.argv.join(" "),
        (false, true) => "(batch script)".into(),
        (false, false) => format!("(batch script) {}", spec.argv.join(" ")),
    };
    lines.push(format!("Command={command}"));
    lines.push(format!("WorkDir={}", spec.work_dir));
    lines.push(format!("StdOut={}", if spec.stdout.is_empty() { "quorum-%j.out" } else { &spec.stdout }));
    lines.push(format!("StdErr={}", if spec.stderr.is_empty() { "(with StdOut)" } else { &spec.stderr }));
    if spec.append_output {
        lines.push("OpenMode=append".into());
    }
    for s in &j.steps {
        lines.push(format!(
            "StepId={}.{} Name={} State={} NodeList={} NTasks={} CPUs/Task={}{} StartTime={} EndTime={} ExitCode={}:{}",
            j.id,
            s.id,
            s.name,
            s.state,
            s.nodelist,
            s.ntasks,
            s.cpus_per_task,
            if s.gpus_per_task > 0 { format!(" Gpus/Task={}", s.gpus_per_task) } else { String::new() },
            ms(s.start_time_ms),
            ms(s.end_time_ms),
            if s.has_exit_code { s.exit_code.to_string() } else { "-".into() },
            s.signal
        ));
    }
    lines.iter().map(|l| escape(l)).collect::<Vec<_>>().join("\n") + "\n"
}

#[derive(Serialize)]
pub struct ReplicaJson {
    pub id: u64,
    pub address: String,
    pub role: String,
    pub reachable: bool,
    pub term: u64,
    pub last_log_index: u64,
    pub committed_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    pub leader_id: Option<u64>,
    pub version: String,
    /// The highest feature level it applies (0 when unreachable).
    pub feature_level: u32,
    /// The cluster's feature level as it has applied it (0 when unreachable).
    pub cluster_level: u32,
    /// When its process started, ms since the epoch (0 when unreachable).
    pub started_at_ms: u64,
}

/// Each member of the cluster with what it says of itself; one that does not answer within 2 s
/// is listed unreachable.
pub async fn replica_statuses(client: &crate::client::Client) -> Result<Vec<ReplicaJson>, tonic::Status> {
    let members =
        client.call(|mut c| async move { c.cluster_members(quorum_proto::api::ClusterStatusRequest {}).await }).await?;
    let mut replicas = Vec::new();
    for m in members.members {
        let status = match client.replica(&m.address) {
            Ok(mut c) => tokio::time::timeout(
                std::time::Duration::from_secs(2),
                c.get_replica_status(quorum_proto::api::ReplicaStatusRequest {}),
            )
            .await
            .ok()
            .and_then(Result::ok)
            .map(tonic::Response::into_inner),
            Err(_) => None,
        };
        replicas.push(replica_json(m.id, &m.address, status.as_ref()));
    }
    Ok(replicas)
}

pub fn replica_json(id: u64, address: &str, status: Option<&ReplicaStatus>) -> ReplicaJson {
    match status {
        Some(s) => ReplicaJson {
            id,
            address: address.to_string(),
            role: s.role.clone(),
            reachable: true,
            term: s.term,
            last_log_index: s.last_log_index,
            committed_index: s.committed_index,
            applied_index: s.applied_index,
            snapshot_index: s.snapshot_index,
            leader_id: s.has_leader.then_some(s.leader_id),
            version: s.version.clone(),
            feature_level: s.feature_level.max(1),
            cluster_level: s.cluster_level.max(1),
            started_at_ms: s.started_at_ms,
        },
        None => ReplicaJson {
            id,
            address: address.to_string(),
            role: "unreachable".into(),
            reachable: false,
            term: 0,
            last_log_index: 0,
            committed_index: 0,
            applied_index: 0,
            snapshot_index: 0,
            leader_id: None,
            version: String::new(),
            feature_level: 0,
            cluster_level: 0,
            started_at_ms: 0,
        },
    }
}

pub fn cluster_table(replicas: &[ReplicaJson]) -> String {
    let rows: Vec<Vec<String>> = replicas
        .iter()
        .map(|r| {
            let n = |v: u64| if r.reachable { v.to_string() } else { "-".into() };
            vec![
                r.id.to_string(),
                r.address.clone(),
                r.role.clone(),
                n(r.term),
                n(r.last_log_index),
                n(r.committed_index),
                n(r.applied_index),
                if r.version.is_empty() { "-".into() } else { r.version.clone() },
            ]
        })
        .collect();
    table(&["ID", "ADDRESS", "ROLE", "TERM", "LAST_LOG", "COMMITTED", "APPLIED", "VERSION"], &rows)
}

/// `quorum admin versions`: what each replica runs, and the cluster's feature level as the most
/// up-to-date reachable replica has applied it.
pub fn versions_table(replicas: &[ReplicaJson]) -> String {
    let rows: Vec<Vec<String>> = replicas
        .iter()
        .map(|r| {
            let dash = |s: String| if r.reachable { s } else { "-".into() };
            vec![
                r.id.to_string(),
                r.address.clone(),
                r.role.clone(),
                dash(r.version.clone()),
                dash(r.feature_level.to_string()),
                dash(r.applied_index.to_string()),
            ]
        })
        .collect();
    let mut out = table(&["ID", "ADDRESS", "ROLE", "VERSION", "LEVEL", "APPLIED"], &rows);
    match cluster_level(replicas) {
        Some(level) => out.push_str(&format!("cluster feature level: {level} (the lowest among the voters)\n")),
        None => out.push_str("cluster feature level: unknown (no replica answered)\n"),
    }
    out
}

/// The cluster level as the reachable replica with the highest applied index knows it.
pub fn cluster_level(replicas: &[ReplicaJson]) -> Option<u32> {
    replicas.iter().filter(|r| r.reachable).max_by_key(|r| r.applied_index).map(|r| r.cluster_level)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_reach_no_terminal() {
        let t = super::table(&["NAME"], &[vec!["\u{1b}[2Jgone".into()], vec!["plain".into()]]);
        assert!(!t.contains('\u{1b}'), "{t:?}");
        assert!(t.contains("\\u{1b}[2Jgone"), "{t:?}");
        assert_eq!(super::escape("plain"), "plain");
        let job = quorum_proto::api::JobInfo {
            name: "x\u{7}".into(),
            spec: Some(quorum_proto::api::JobSpec {
                argv: vec!["echo".into(), "\u{1b}]0;pwned\u{7}".into()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let shown = super::show_job(&job, 0, None);
        assert!(!shown.chars().any(|c| c.is_control() && c != '\n'), "{shown:?}");
    }

    #[test]
    fn users_and_groups_are_written_with_their_ids() {
        assert_eq!(super::user_and_group("root", ""), "UserId=root(0) GroupId=root(0)");
        let other = quorum_auth::users::group("1").unwrap().name;
        assert_eq!(super::user_and_group("root", &other), format!("UserId=root(0) GroupId={other}(1)"));
        assert_eq!(super::user_and_group("no-such-user-here", ""), "UserId=no-such-user-here GroupId=(null)");
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_time(1_795_325_228_731), "2026-11-22T05:27:08Z");
        assert_eq!(utc_time(951_782_400_000), "2000-02-29T00:00:00Z");
    }
}
