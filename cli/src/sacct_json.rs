//! `sacct --json`: the jobs in the shape Slurm 22.05's `sacct --json` prints them (slurmdbd's
//! REST schema v0.0.38): `meta`, `errors` and `jobs`, each job with its steps (its batch
//! script's first, as `N.batch`). Times are Unix seconds, durations seconds, CPU times seconds
//! and microseconds; what was not measured is left out rather than given as zero.

use quorum_proto::api::{self, JobInfo, StepInfo};
use serde_json::{json, Map, Value};

/// The document for `jobs` (with their steps, when fetched).
pub fn document(jobs: &[JobInfo], now_ms: u64) -> Value {
    json!({
        "meta": {
            "plugin": { "type": "openapi/dbv0.0.38", "name": "Slurm OpenAPI DB v0.0.38" },
            "Slurm": { "version": { "major": 22, "minor": 5, "micro": 0 }, "release": "22.05.0" },
            "quorum": { "version": env!("CARGO_PKG_VERSION") },
        },
        "errors": [],
        "jobs": jobs.iter().map(|j| job(j, now_ms)).collect::<Vec<_>>(),
    })
}

fn secs(ms: u64) -> u64 {
    ms / 1000
}

/// A duration from its start and end (now for one still running; 0 for one not started).
fn elapsed(start_ms: u64, end_ms: u64, now_ms: u64) -> u64 {
    match (start_ms, end_ms) {
        (0, _) => 0,
        (s, 0) => secs(now_ms.saturating_sub(s)),
        (s, e) => secs(e.saturating_sub(s)),
    }
}

fn cpu(us: u64) -> Value {
    json!({ "seconds": us / 1_000_000, "microseconds": us % 1_000_000 })
}

/// `time`'s CPU parts, from what was measured.
fn cpu_times(time: &mut Map<String, Value>, usage: Option<&api::JobUsage>) {
    if let Some(u) = usage {
        time.insert("user".into(), cpu(u.cpu_user_us));
        time.insert("system".into(), cpu(u.cpu_system_us));
        time.insert("total".into(), cpu(u.cpu_user_us + u.cpu_system_us));
    }
}

/// A signal's description, as `strsignal` gives it (Slurm's name for it).
fn signal_name(signal: i32) -> String {
    // SAFETY: strsignal returns a pointer to a NUL-terminated string, or NULL; it is read at
    // once, before anything else in this single-threaded report could call it again.
    let name = unsafe { libc::strsignal(signal) };
    if name.is_null() {
        return format!("signal {signal}");
    }
    // SAFETY: a non-null pointer from strsignal is a NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

fn exit_code(ended: bool, code: i32, signal: i32) -> Value {
    let status = match (ended, code, signal) {
        (false, _, _) => "PENDING",
        (true, _, s) if s != 0 => "SIGNALED",
        (true, 0, _) => "SUCCESS",
        _ => "FAILED",
    };
    let mut out = json!({ "status": status, "return_code": code });
    if signal != 0 {
        out["signal"] = json!({ "signal_id": signal, "name": signal_name(signal) });
    }
    out
}

/// A TRES list: CPUs, memory (MiB), nodes and GPUs, each that is there.
fn tres(cpus: u64, mem_mb: u64, nodes: u64, gpus: u64) -> Value {
    let mut list = vec![
        json!({ "type": "cpu", "name": "", "id": 1, "count": cpus }),
        json!({ "type": "mem", "name": "", "id": 2, "count": mem_mb }),
        json!({ "type": "node", "name": "", "id": 4, "count": nodes }),
    ];
    if gpus > 0 {
        list.push(json!({ "type": "gres", "name": "gpu", "id": 1001, "count": gpus }));
    }
    Value::Array(list)
}

fn job(j: &JobInfo, now_ms: u64) -> Value {
    let spec = j.spec.clone().unwrap_or_default();
    let a = &j.allocation;
    let (cpus, mem, gpus) = (
        a.iter().map(|n| u64::from(n.cpus)).sum::<u64>(),
        a.iter().map(|n| n.mem_mb).sum::<u64>(),
        a.iter().map(|n| n.gpus.len() as u64).sum::<u64>(),
    );
    let nodes = u64::from(spec.nodes.max(1));
    let requested_cpus = u64::from(spec.ntasks.max(1)) * u64::from(spec.cpus_per_task.max(1));
    let mut time = Map::new();
    time.insert("elapsed".into(), json!(elapsed(j.start_time_ms, j.end_time_ms, now_ms)));
    time.insert("end".into(), json!(secs(j.end_time_ms)));
    time.insert("start".into(), json!(secs(j.start_time_ms)));
    time.insert("submission".into(), json!(secs(j.submit_time_ms)));
    time.insert("suspended".into(), json!(0));
    time.insert("limit".into(), json!(j.time_limit_s / 60));
    cpu_times(&mut time, j.usage.as_ref());
    let mut steps = Vec::new();
    if j.start_time_ms > 0 && !spec.interactive {
        steps.push(batch_step(j, now_ms));
    }
    steps.extend(j.steps.iter().map(|s| step(j, s, now_ms)));
    let derived = j.steps.iter().filter(|s| s.has_exit_code).map(|s| s.exit_code).max().unwrap_or(0);
    let group = quorum_client::display::job_group(&j.user, &spec.group).map(|g| g.name).unwrap_or_default();
    let array = match &j.array {
        Some(t) => json!({
            "job_id": t.array_job_id, "task_id": t.task_id, "task": t.task_id.to_string(),
            "limits": { "max": { "running": { "tasks": t.throttle } } },
        }),
        None => json!({ "job_id": 0, "limits": { "max": { "running": { "tasks": 0 } } } }),
    };
    json!({
        "account": j.account,
        "comment": { "administrator": "", "job": spec.comment, "system": "" },
        "allocation_nodes": a.len(),
        "array": array,
        "time": time,
        "association": { "account": j.account, "cluster": "", "partition": "", "user": j.user },
        "cluster": "",
        "constraints": spec.constraint.join(if spec.constraint_any { "|" } else { "&" }),
        "derived_exit_code": exit_code(j.has_exit_code, derived, 0),
        "exit_code": exit_code(j.has_exit_code, j.exit_code, j.signal),
        "flags": [],
        "group": group,
        "job_id": j.id,
        "name": j.name,
        "nodes": if j.nodelist.is_empty() { "None assigned" } else { j.nodelist.as_str() },
        "partition": j.partition,
        "qos": j.qos,
        "required": { "CPUs": requested_cpus, "memory": spec.mem_per_node_mb },
        "kill_request_user": j.cancelled_by,
        "state": { "current": j.state, "reason": if j.reason.is_empty() { "None" } else { j.reason.as_str() } },
        "steps": steps,
        "tres": { "allocated": if a.is_empty() { json!([]) } else { tres(cpus, mem, a.len() as u64, gpus) },
                  "requested": tres(requested_cpus, spec.mem_per_node_mb * nodes, nodes, u64::from(spec.gpus_per_node) * nodes) },
        "user": j.user,
        "wckey": { "wckey": spec.wckey, "flags": [] },
        "working_directory": spec.work_dir,
    })
}

/// A step's `time`: when it ran, and the CPU time it used where that was measured.
fn step_time(start_ms: u64, end_ms: u64, now_ms: u64, usage: Option<&api::JobUsage>) -> Map<String, Value> {
    let mut time = Map::new();
    time.insert("elapsed".into(), json!(elapsed(start_ms, end_ms, now_ms)));
    time.insert("end".into(), json!(secs(end_ms)));
    time.insert("start".into(), json!(secs(start_ms)));
    time.insert("suspended".into(), json!(0));
    cpu_times(&mut time, usage);
    time
}

/// The batch script's step: on the job's first node, with what the script used.
fn batch_step(j: &JobInfo, now_ms: u64) -> Value {
    let first = j.allocation.first();
    let time = step_time(j.start_time_ms, j.end_time_ms, now_ms, j.batch_usage.as_ref());
    let state = if j.state == "TIMEOUT" { "CANCELLED" } else { j.state.as_str() };
    json!({
        "time": time,
        "exit_code": exit_code(j.has_exit_code, j.exit_code, j.signal),
        "nodes": { "count": 1, "range": first.map_or("", |n| n.node.as_str()) },
        "tasks": { "count": 1 },
        "state": state,
        "step": { "job_id": j.id, "id": format!("{}.batch", j.id), "name": "batch" },
        "tres": {
            "allocated": first.map_or_else(|| json!([]), |n| tres(u64::from(n.cpus), n.mem_mb, 1, n.gpus.len() as u64)),
            "requested": used(j.batch_usage.as_ref()),
        },
    })
}

fn step(j: &JobInfo, s: &StepInfo, now_ms: u64) -> Value {
    let time = step_time(s.start_time_ms, s.end_time_ms, now_ms, s.usage.as_ref());
    let nodes = quorum_model::hostlist::expand(&s.nodelist).map(|n| n.len()).unwrap_or(0) as u64;
    let cpus = u64::from(s.ntasks) * u64::from(s.cpus_per_task.max(1));
    let gpus = u64::from(s.ntasks) * u64::from(s.gpus_per_task);
    json!({
        "time": time,
        "exit_code": exit_code(s.has_exit_code, s.exit_code, s.signal),
        "nodes": { "count": nodes, "range": s.nodelist },
        "tasks": { "count": s.ntasks },
        "state": s.state,
        "step": { "job_id": j.id, "id": format!("{}.{}", j.id, s.id), "name": s.name },
        "tres": { "allocated": tres(cpus, 0, nodes, gpus), "requested": used(s.usage.as_ref()) },
    })
}

/// What a step's processes used beside CPU time, as Slurm's `TRESUsageIn*`: the largest resident
/// set in bytes (`max`'s `mem`, sacct's MaxRSS), and what its GPUs did (utilization, memory,
/// energy in joules); nothing when it was not measured.
fn used(usage: Option<&api::JobUsage>) -> Value {
    let Some(u) = usage else { return json!({}) };
    let mut max = vec![json!({ "type": "mem", "name": "", "id": 2, "count": u.max_rss_kb * 1024 })];
    let mut out = Map::new();
    // Its GPUs, as Slurm 23 names them: gres/gpuutil (mean percent), gres/gpumem (bytes).
    if let Some(mean) = u.gpu_util_sum.checked_div(u.gpu_samples) {
        max.push(json!({ "type": "gres", "name": "gpumem", "id": 1002, "count": u.gpu_mem_max_mb << 20 }));
        out.insert("average".into(), json!([{ "type": "gres", "name": "gpuutil", "id": 1003, "count": mean }]));
    }
    if u.gpu_energy_mj > 0 {
        out.insert("total".into(), json!([{ "type": "energy", "name": "", "id": 3, "count": u.gpu_energy_mj / 1000 }]));
    }
    out.insert("max".into(), Value::Array(max));
    Value::Object(out)
}
