//! Runs one rank of a job: its own session and process group, its output files, its
//! environment, its time limit (SIGTERM, then SIGKILL after the kill wait) and cancellation.
//! When the job's main process ends, whatever is left of its process group is killed, so no
//! process of a finished job survives it.

use std::fs::{File, OpenOptions};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use quorum_proto::agent::{ExitKind, JobExit, Launch};
use quorum_proto::api::JobSpec;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::Agent;

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

/// How the process ended: (exit code, signal).
fn status_parts(status: std::process::ExitStatus) -> (i32, i32) {
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, 0),
        (None, Some(sig)) => (0, sig),
        (None, None) => (0, 0),
    }
}

/// Starts the job and returns the pid of its process group leader; its end is reported through
/// the agent's job table and `exits_tx`.
pub fn start(agent: Arc<Agent>, launch: Launch, kill_rx: mpsc::Receiver<ExitKind>) {
    tokio::spawn(async move {
        let job_id = launch.job_id;
        let token = launch.token;
        let (kind, code, signal) = run(&agent, &launch, kill_rx).await;
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
    });
}

async fn run(agent: &Agent, launch: &Launch, mut kill_rx: mpsc::Receiver<ExitKind>) -> (ExitKind, i32, i32) {
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

    let mut cmd = if !spec.script.is_empty() {
        let path = agent.config.spool_dir.join(format!("job-{}-{}.sh", launch.job_id, launch.token));
        if let Err(e) =
            std::fs::create_dir_all(&agent.config.spool_dir).and_then(|_| std::fs::write(&path, &spec.script))
        {
            launch_error(&mut report, &format!("cannot write the job script {}: {e}", path.display()));
            return (ExitKind::LaunchFailed, 127, 0);
        }
        let mut c = tokio::process::Command::new("bash");
        c.arg(path);
        c
    } else {
        let mut c = tokio::process::Command::new(&spec.argv[0]);
        c.args(&spec.argv[1..]);
        c
    };
    cmd.current_dir(&work_dir)
        .env_clear()
        .envs(job_environment(launch, spec, node))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .kill_on_drop(false);
    // SAFETY: setsid() is async-signal-safe and is all that runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let what = if spec.script.is_empty() { spec.argv[0].as_str() } else { "bash" };
            launch_error(&mut report, &format!("cannot run '{what}' in {}: {e}", work_dir.display()));
            return (ExitKind::LaunchFailed, 127, 0);
        }
    };
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);
    if let Some(e) = agent.lock_jobs().get_mut(&launch.job_id) {
        e.pgid = Some(pgid);
    }
    tracing::info!(job = launch.job_id, pgid, rank = launch.node_rank, "job started");

    let limit = (launch.time_limit_s > 0).then(|| Instant::now() + Duration::from_secs(launch.time_limit_s));
    let mut kind = ExitKind::Exited;
    let mut escalate: Option<Instant> = None;
    let mut kill_open = true;
    let far = Instant::now() + Duration::from_secs(100 * 365 * 86400);
    let status = loop {
        tokio::select! {
            st = child.wait() => break st,
            _ = tokio::time::sleep_until(limit.unwrap_or(far)), if limit.is_some() && kind == ExitKind::Exited => {
                kind = ExitKind::TimedOut;
                signal_group(pgid, libc::SIGTERM);
                escalate = Some(Instant::now() + agent.config.kill_wait);
            }
            why = kill_rx.recv(), if kill_open && kind == ExitKind::Exited => {
                match why {
                    // Cut off from the controllers: the job may be started elsewhere any moment,
                    // so there is no grace period.
                    Some(ExitKind::LeaseExpired) => {
                        kind = ExitKind::LeaseExpired;
                        signal_group(pgid, libc::SIGKILL);
                    }
                    Some(reason) => {
                        kind = reason;
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
    // Nothing of a finished job outlives it.
    signal_group(pgid, libc::SIGKILL);
    if let Some(path) = (!spec.script.is_empty())
        .then(|| agent.config.spool_dir.join(format!("job-{}-{}.sh", launch.job_id, launch.token)))
    {
        let _ = std::fs::remove_file(path);
    }
    let (code, signal) = match status {
        Ok(s) => status_parts(s),
        Err(e) => {
            tracing::warn!(job = launch.job_id, error = %e, "waiting for the job");
            (1, 0)
        }
    };
    (kind, code, signal)
}

fn launch_error(report: &mut Option<File>, message: &str) {
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
