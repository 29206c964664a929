//! Runs one rank of a job under its supervisor ([`supervisor`]): its output files, its
//! environment, its time limit (SIGTERM, then SIGKILL after the kill wait) and cancellation.
//! When the job's main process ends, its supervisor kills whatever is left of its process group,
//! so no process of a finished job survives it, whether the agent is there or not.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use quorum_proto::agent::{ExitKind, JobExit, Launch};
use quorum_proto::api::JobSpec;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::supervisor::{self, Prepared, Status};
use crate::{Agent, JobEntry};

/// Sends a signal to a whole process group; a group that is already gone is fine.
pub fn signal_group(pgid: i32, signal: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) with a negative pid signals a process group; it touches no memory.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// Expands `%j` (job id), `%x` (name), `%u` (user), `%N` (node), `%A`/`%a` (array job and
/// task: the job id and 0 until arrays exist) and `%%`.
pub fn expand_pattern(pattern: &str, launch: &Launch, node: &str) -> String {
    let name = launch.spec.as_ref().map(|s| s.name.as_str()).unwrap_or("");
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('j') | Some('A') => out.push_str(&launch.job_id.to_string()),
            Some('a') => out.push('0'),
            Some('x') => out.push_str(name),
            Some('u') => out.push_str(&launch.user),
            Some('N') => out.push_str(node),
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

fn resolve(work_dir: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        work_dir.join(p)
    }
}

/// The job's environment: the submit environment, then Quorum's variables under their
/// `QUORUM_*` and `SLURM_*` names.
pub fn job_environment(launch: &Launch, spec: &JobSpec, node: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = spec.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect();
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()));
    }
    let first_node = quorum_first_host(&launch.nodelist).unwrap_or_else(|| node.to_string());
    let gpus = launch.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",");
    let vars: [(&str, String); 12] = [
        ("JOB_ID", launch.job_id.to_string()),
        ("JOB_NAME", spec.name.clone()),
        ("JOB_NODELIST", launch.nodelist.clone()),
        ("JOB_NUM_NODES", launch.num_nodes.to_string()),
        ("NNODES", launch.num_nodes.to_string()),
        ("NODEID", launch.node_rank.to_string()),
        ("NTASKS", spec.ntasks.to_string()),
        ("CPUS_PER_TASK", spec.cpus_per_task.to_string()),
        ("GPUS_PER_NODE", launch.gpus.len().to_string()),
        ("SUBMIT_DIR", spec.submit_dir.clone()),
        ("JOB_PARTITION", spec.partition.clone()),
        ("JOB_USER", launch.user.clone()),
    ];
    for (suffix, value) in vars {
        env.retain(|(k, _)| k != &format!("QUORUM_{suffix}") && k != &format!("SLURM_{suffix}"));
        env.push((format!("QUORUM_{suffix}"), value.clone()));
        env.push((format!("SLURM_{suffix}"), value));
    }
    env.retain(|(k, _)| k != "QUORUM_MASTER_ADDR" && k != "CUDA_VISIBLE_DEVICES" && k != "SLURMD_NODENAME");
    env.push(("QUORUM_MASTER_ADDR".into(), first_node));
    env.push(("SLURMD_NODENAME".into(), node.to_string()));
    env.push(("CUDA_VISIBLE_DEVICES".into(), gpus));
    env
}

/// The first name of a compressed hostlist, without pulling in the controller's parser.
fn quorum_first_host(nodelist: &str) -> Option<String> {
    let first = nodelist.split(',').next()?;
    match first.find('[') {
        None => Some(first.to_string()),
        Some(open) => {
            let inner = &nodelist[open + 1..];
            let lo = inner.split(['-', ',', ']']).next()?;
            Some(format!("{}{}", &first[..open], lo))
        }
    }
}

fn open_output(path: &Path, truncate: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.create(true).write(true);
    if truncate {
        o.truncate(true);
    } else {
        o.append(true);
    }
    o.open(path)
}

/// Starts the job under its supervisor; its end is reported through the agent's job table and
/// `exits_tx`.
pub fn start(agent: Arc<Agent>, launch: Launch, kill_rx: mpsc::Receiver<ExitKind>) {
    tokio::spawn(async move {
        let mut stopped = agent.stopped.subscribe();
        let ended = tokio::select! {
            ended = run(&agent, &launch, kill_rx) => ended,
            // The agent stopped: the job goes on under its supervisor, for the next agent.
            _ = stopped.wait_for(|s| *s) => return,
        };
        finish(&agent, &launch, ended);
    });
}

/// What a watched job ended with: (kind, exit code, signal).
type Ended = (ExitKind, i32, i32);

fn finish(agent: &Agent, launch: &Launch, (kind, code, signal): Ended) {
    let (job_id, token) = (launch.job_id, launch.token);
    let exit = JobExit { job_id, token, kind: kind as i32, exit_code: code, signal };
    tracing::info!(job = job_id, ?kind, code, signal, "job ended");
    {
        let mut jobs = agent.lock_jobs();
        if let Some(e) = jobs.get_mut(&job_id).filter(|e| e.token == token) {
            e.exit = Some(exit);
            e.kill = None;
        }
    }
    let _ = agent.exits_tx.send(job_id);
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// `[B:]NUMBER@SECONDS` as (signal, seconds before the limit, batch shell only).
fn parse_warn_signal(text: &str) -> Option<(i32, u64, bool)> {
    let (batch_only, rest) = match text.strip_prefix("B:") {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (signal, before) = rest.split_once('@')?;
    Some((signal.parse().ok()?, before.parse().ok()?, batch_only))
}

/// Takes over the jobs a previous agent process left in the spool: running ones are watched
/// again, ended ones are reported with the status their supervisor recorded. Runs before the
/// agent connects, so that a launch the leader sends again finds the job already there.
pub fn reattach_all(agent: &Arc<Agent>) {
    for found in supervisor::scan(&agent.config.spool_dir) {
        let (job_id, token) = (found.launch.job_id, found.launch.token);
        let mut jobs = agent.lock_jobs();
        if jobs.contains_key(&job_id) {
            continue;
        }
        let mut entry = JobEntry::new(token, None);
        entry.pgid = found.pids.map(|p| p.pgid);
        entry.record = Some(found.record.clone());
        match (found.status, found.pids) {
            (None, Some(pids)) => {
                tracing::info!(job = job_id, token, pgid = pids.pgid, "re-attached to a running job");
                let (kill_tx, kill_rx) = mpsc::channel(4);
                entry.kill = Some(kill_tx);
                jobs.insert(job_id, entry);
                let agent = agent.clone();
                tokio::spawn(async move {
                    let mut stopped = agent.stopped.subscribe();
                    let ended = tokio::select! {
                        ended = watch(&agent, &found.launch, &found.record, pids, found.started_ms, found.reason, kill_rx, None) => ended,
                        _ = stopped.wait_for(|s| *s) => return,
                    };
                    finish(&agent, &found.launch, ended);
                });
            }
            (status, _) => {
                let (kind, code, signal) = ended_with(
                    found.reason.unwrap_or(ExitKind::Exited),
                    status.unwrap_or(Status::Lost),
                    None,
                    &found.launch,
                );
                tracing::info!(
                    job = job_id,
                    token,
                    ?kind,
                    code,
                    signal,
                    "found a job that ended while the agent was away"
                );
                entry.exit = Some(JobExit { job_id, token, kind: kind as i32, exit_code: code, signal });
                jobs.insert(job_id, entry);
            }
        }
    }
}

/// The reported end of a job from why the agent signalled it (`Exited` when it did not) and
/// what its supervisor recorded.
fn ended_with(kind: ExitKind, status: Status, report: Option<&mut File>, launch: &Launch) -> Ended {
    match status {
        Status::Exited(code) => (kind, code, 0),
        Status::Signaled(signal) => (kind, 0, signal),
        Status::LaunchFailed(errno) => {
            if let Some(f) = report {
                let what = launch.spec.as_ref().map(|s| s.argv.first().map_or("bash", |a| a.as_str())).unwrap_or("");
                let dir = launch.spec.as_ref().map(|s| s.work_dir.as_str()).unwrap_or("");
                launch_error(
                    Some(f),
                    &format!("cannot run '{what}' in {dir}: {}", std::io::Error::from_raw_os_error(errno)),
                );
            }
            (ExitKind::LaunchFailed, 127, 0)
        }
        Status::Lost => {
            tracing::warn!(job = launch.job_id, "the job's supervisor is gone without a status; reporting it killed");
            (kind, 0, libc::SIGKILL)
        }
    }
}

async fn run(agent: &Agent, launch: &Launch, kill_rx: mpsc::Receiver<ExitKind>) -> Ended {
    let node = agent.config.name.as_str();
    let Some(spec) = launch.spec.as_ref() else {
        return (ExitKind::LaunchFailed, 127, 0);
    };
    let work_dir = PathBuf::from(&spec.work_dir);
    let stdout_pattern = if spec.stdout.is_empty() { "quorum-%j.out" } else { spec.stdout.as_str() };
    let stdout_path = resolve(&work_dir, &expand_pattern(stdout_pattern, launch, node));
    let truncate = launch.node_rank == 0;
    let stdout = match open_output(&stdout_path, truncate) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(job = launch.job_id, path = %stdout_path.display(), error = %e, "cannot open output");
            return (ExitKind::LaunchFailed, 127, 0);
        }
    };
    let stderr = if spec.stderr.is_empty() {
        stdout.try_clone()
    } else {
        open_output(&resolve(&work_dir, &expand_pattern(&spec.stderr, launch, node)), truncate)
    };
    let stderr = match stderr {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(job = launch.job_id, error = %e, "cannot open error output");
            return (ExitKind::LaunchFailed, 127, 0);
        }
    };
    let mut report = stderr.try_clone().ok();

    let record = supervisor::record_dir(&agent.config.spool_dir, launch.job_id, launch.token);
    let started_ms = now_ms();
    if let Err(e) = supervisor::create_record(&record, launch, started_ms) {
        launch_error(report.as_mut(), &format!("cannot write the job record {}: {e}", record.display()));
        return (ExitKind::LaunchFailed, 127, 0);
    }
    if let Some(e) = agent.lock_jobs().get_mut(&launch.job_id).filter(|e| e.token == launch.token) {
        e.record = Some(record.clone());
    }
    let argv = if !spec.script.is_empty() {
        let path = record.join("script.sh");
        if let Err(e) = std::fs::write(&path, &spec.script) {
            launch_error(report.as_mut(), &format!("cannot write the job script {}: {e}", path.display()));
            return (ExitKind::LaunchFailed, 127, 0);
        }
        vec!["bash".to_string(), path.display().to_string()]
    } else {
        spec.argv.clone()
    };
    let env = job_environment(launch, spec, node);
    let prepared = match Prepared::new(&argv, &env, &work_dir, stdout, stderr, &record) {
        Ok(p) => p,
        Err(e) => {
            launch_error(report.as_mut(), &format!("cannot run '{}' in {}: {e}", argv[0], work_dir.display()));
            return (ExitKind::LaunchFailed, 127, 0);
        }
    };
    let spawned = tokio::task::spawn_blocking(move || supervisor::spawn(&prepared)).await;
    let pids = match spawned.map_err(std::io::Error::other).and_then(|r| r) {
        Ok(pids) => pids,
        Err(e) => {
            launch_error(report.as_mut(), &format!("cannot start the job's supervisor: {e}"));
            return (ExitKind::LaunchFailed, 127, 0);
        }
    };
    if let Err(e) = supervisor::write_pids(&record, pids) {
        tracing::warn!(job = launch.job_id, error = %e, "cannot record the job's processes; a restarted agent will not find it");
    }
    if let Some(e) = agent.lock_jobs().get_mut(&launch.job_id) {
        e.pgid = Some(pids.pgid);
    }
    tracing::info!(
        job = launch.job_id,
        pgid = pids.pgid,
        supervisor = pids.supervisor,
        rank = launch.node_rank,
        "job started"
    );
    watch(agent, launch, &record, pids, started_ms, None, kill_rx, report.as_mut()).await
}

/// Watches a started job until its supervisor ends: its time limit (SIGTERM, then SIGKILL after
/// the kill wait) and the kills asked for. `reason` is why a previous agent already signalled it.
#[allow(clippy::too_many_arguments)]
async fn watch(
    agent: &Agent,
    launch: &Launch,
    record: &std::path::Path,
    pids: supervisor::Pids,
    started_ms: u64,
    reason: Option<ExitKind>,
    mut kill_rx: mpsc::Receiver<ExitKind>,
    report: Option<&mut File>,
) -> Ended {
    let pgid = pids.pgid;
    let limit = (launch.time_limit_s > 0).then(|| {
        let ends_ms = started_ms + launch.time_limit_s * 1000;
        Instant::now() + Duration::from_millis(ends_ms.saturating_sub(now_ms()))
    });
    // `--signal`, in the canonical `[B:]NUMBER@SECONDS` the controller sends.
    let warn = launch.spec.as_ref().and_then(|s| parse_warn_signal(&s.signal));
    let mut warn_at = match (limit, warn) {
        (Some(limit), Some((_, before, _))) => {
            Some(limit.checked_sub(Duration::from_secs(before)).unwrap_or_else(Instant::now))
        }
        _ => None,
    };
    let mut kind = reason.unwrap_or(ExitKind::Exited);
    // Signalled before a restart: SIGKILL follows after the kill wait, counted again.
    let mut escalate: Option<Instant> = (kind != ExitKind::Exited).then(|| Instant::now() + agent.config.kill_wait);
    let mut kill_open = true;
    let far = Instant::now() + Duration::from_secs(100 * 365 * 86400);
    let ended = supervisor::wait(pids, record);
    tokio::pin!(ended);
    let status = loop {
        tokio::select! {
            st = &mut ended => break st,
            _ = tokio::time::sleep_until(warn_at.unwrap_or(far)), if warn_at.is_some() && kind == ExitKind::Exited => {
                warn_at = None;
                if let Some((signal, before, batch_only)) = warn {
                    tracing::info!(job = launch.job_id, signal, before, batch_only, "warning the job before its time limit");
                    if batch_only {
                        // SAFETY: kill(2) on the job's main process (the group leader); no memory is touched.
                        unsafe { libc::kill(pgid, signal) };
                    } else {
                        signal_group(pgid, signal);
                    }
                }
            }
            _ = tokio::time::sleep_until(limit.unwrap_or(far)), if limit.is_some() && kind == ExitKind::Exited => {
                kind = ExitKind::TimedOut;
                supervisor::write_reason(record, kind);
                signal_group(pgid, libc::SIGTERM);
                escalate = Some(Instant::now() + agent.config.kill_wait);
            }
            why = kill_rx.recv(), if kill_open && kind == ExitKind::Exited => {
                match why {
                    // Cut off from the controllers: the job may be started elsewhere any moment,
                    // so there is no grace period.
                    Some(ExitKind::LeaseExpired) => {
                        kind = ExitKind::LeaseExpired;
                        supervisor::write_reason(record, kind);
                        signal_group(pgid, libc::SIGKILL);
                    }
                    Some(reason) => {
                        kind = reason;
                        supervisor::write_reason(record, kind);
                        signal_group(pgid, libc::SIGTERM);
                        escalate = Some(Instant::now() + agent.config.kill_wait);
                    }
                    None => kill_open = false,
                }
            }
            _ = tokio::time::sleep_until(escalate.unwrap_or(far)), if escalate.is_some() => {
                signal_group(pgid, libc::SIGKILL);
                escalate = None;
            }
        }
    };
    ended_with(kind, status, report, launch)
}

fn launch_error(report: Option<&mut File>, message: &str) {
    use std::io::Write;
    tracing::warn!(message, "job launch failed");
    if let Some(f) = report {
        let _ = writeln!(f, "quorum-agent: {message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            job_id: 42,
            token: 7,
            spec: Some(JobSpec {
                name: "train".into(),
                partition: "gpu".into(),
                ntasks: 2,
                cpus_per_task: 3,
                submit_dir: "/home/a".into(),
                ..Default::default()
            }),
            user: "alice".into(),
            nodelist: "gpu[03-04]".into(),
            node_rank: 1,
            num_nodes: 2,
            gpus: vec![2, 5],
            ..Default::default()
        }
    }

    #[test]
    fn output_patterns() {
        let l = launch();
        assert_eq!(expand_pattern("%x-%j.%u.%N.out", &l, "gpu04"), "train-42.alice.gpu04.out");
        assert_eq!(expand_pattern("100%%-%q", &l, "n"), "100%-%q");
    }

    #[test]
    fn environment_names_the_allocation() {
        let l = launch();
        let env = job_environment(&l, l.spec.as_ref().unwrap(), "gpu04");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("QUORUM_JOB_ID"), Some("42"));
        assert_eq!(get("SLURM_JOB_ID"), Some("42"));
        assert_eq!(get("SLURM_JOB_NODELIST"), Some("gpu[03-04]"));
        assert_eq!(get("QUORUM_NODEID"), Some("1"));
        assert_eq!(get("QUORUM_MASTER_ADDR"), Some("gpu03"));
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("2,5"));
        assert_eq!(get("SLURM_CPUS_PER_TASK"), Some("3"));
    }
}
