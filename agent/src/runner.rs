//! Runs one rank of a job under its supervisor ([`supervisor`]): its output files
//! ([`crate::output`]), its environment ([`crate::environment`]), its time limit (SIGTERM, then SIGKILL after the kill wait) and cancellation.
//! When the job's main process ends, its supervisor kills whatever is left of its process group,
//! so no process of a finished job survives it, whether the agent is there or not.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use quorum_proto::agent::{ExitKind, JobExit, Launch};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::environment::job_environment;
use crate::output::output_paths;
use crate::record::{self, Status};
use crate::supervisor::{self, signal_group, Prepared};
use crate::{identity, Agent, JobEntry, Order};

/// Starts the job under its supervisor; its end is reported through the agent's job table and
/// `exits_tx`.
pub(crate) fn start(agent: Arc<Agent>, launch: Launch, kill_rx: mpsc::Receiver<Order>) {
    // The job's run, from its launch to its end, in the trace of its submit when it has one.
    let span = tracing::info_span!("job", job_id = launch.job_id, node = %agent.config.name, rank = launch.node_rank);
    quorum_proto::telemetry::continue_trace(&span, &launch.traceparent);
    let run = async move {
        let mut stopped = agent.stopped.subscribe();
        let (ended, prolog) = tokio::select! {
            ended = run(&agent, &launch, kill_rx) => ended,
            // The agent stopped: the job goes on under its supervisor, for the next agent.
            _ = stopped.wait_for(|s| *s) => return,
        };
        // The epilog follows a job whose prolog passed; a refused launch runs neither.
        let problem = match prolog {
            Prolog::Refused => None,
            Prolog::Failed(why) => Some(why),
            Prolog::Passed => epilog(&agent, &launch, ended).await,
        };
        finish(&agent, &launch, ended, problem);
    };
    tokio::spawn(tracing::Instrument::instrument(run, span));
}

/// What a watched job ended with: (kind, exit code, signal).
type Ended = (ExitKind, i32, i32);

/// What the job's supervisor recorded it used, for its exit report.
fn usage_of(record: &std::path::Path) -> Option<quorum_proto::api::JobUsage> {
    record::read_usage(record).map(|u| quorum_proto::api::JobUsage {
        cpu_user_us: u.cpu_user_us,
        cpu_system_us: u.cpu_system_us,
        max_rss_kb: u.max_rss_kb,
        ..Default::default()
    })
}

/// The node's epilog after the job ended here (the job's end is reported once it is done, so
/// that a failing one drains the node before another job lands on it): `Some(reason)` when it
/// failed.
async fn epilog(agent: &Agent, launch: &Launch, (_, code, _): Ended) -> Option<String> {
    let scripts = &agent.config.job_scripts;
    crate::site::around_job(scripts, launch, &agent.config.name, crate::site::Context::Epilog, Some(code)).await
}

fn finish(agent: &Arc<Agent>, launch: &Launch, (kind, code, signal): Ended, problem: Option<String>) {
    let (job_id, token) = (launch.job_id, launch.token);
    let mut usage = usage_of(&record::record_dir(&agent.config.spool_dir, job_id, token));
    tracing::info!(job = job_id, ?kind, code, signal, "job ended");
    {
        let mut jobs = agent.lock_jobs();
        if let Some(e) = jobs.get_mut(&job_id).filter(|e| e.token == token) {
            // With what its GPUs did while it ran, and the most its processes held together
            // at a sample (the supervisor measured the rest).
            let peak = e.pgid.map_or(0, |pgid| agent.take_rss_peak(pgid));
            if let Some(u) = usage.as_mut() {
                e.gpu_use.add_to(u);
                u.max_rss_kb = u.max_rss_kb.max(peak);
            }
            let node_problem = problem.unwrap_or_default();
            let error =
                if kind == ExitKind::LaunchFailed { e.launch_error.take().unwrap_or_default() } else { String::new() };
            e.exit =
                Some(JobExit { job_id, token, kind: kind as i32, exit_code: code, signal, usage, node_problem, error });
            e.kill = None;
        }
    }
    let _ = agent.exits_tx.send(job_id);
    // Its containers here go with it (a named one lasts as long as the job).
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let agent_containers = agent.clone();
        rt.spawn_blocking(move || agent_containers.containers.end_job(job_id));
    }
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
    for found in record::scan(&agent.config.spool_dir) {
        let (job_id, token) = (found.launch.job_id, found.launch.token);
        let mut jobs = agent.lock_jobs();
        if jobs.contains_key(&job_id) {
            continue;
        }
        let mut entry = JobEntry::new(token, None);
        entry.leased = found.launch.spec.as_ref().is_some_and(|s| s.requeue);
        entry.gpus = found.launch.gpus.clone();
        entry.pgid = found.pids.map(|p| p.pgid);
        if let (None, Some(pids)) = (found.status, found.pids) {
            agent.track_rss(pids.pgid);
            if let Some(measured) = record::read_measured(&found.record) {
                agent.resume_measured(&mut entry, pids.pgid, &measured);
            }
        }
        entry.record = Some(found.record.clone());
        match (found.status, found.pids) {
            (None, Some(pids)) => {
                tracing::info!(job = job_id, token, pgid = pids.pgid, "re-attached to a running job");
                let (kill_tx, kill_rx) = mpsc::channel(4);
                entry.kill = Some(kill_tx);
                entry.time_limit_s = found.launch.time_limit_s;
                jobs.insert(job_id, entry);
                let agent = agent.clone();
                tokio::spawn(async move {
                    let mut stopped = agent.stopped.subscribe();
                    let ended = tokio::select! {
                        ended = watch(&agent, &found.launch, &found.record, pids, found.started_ms, found.reason, kill_rx) => ended,
                        _ = stopped.wait_for(|s| *s) => return,
                    };
                    let problem = epilog(&agent, &found.launch, ended).await;
                    finish(&agent, &found.launch, ended, problem);
                });
            }
            (status, _) => {
                let ended =
                    ended_with(found.reason.unwrap_or(ExitKind::Exited), status.unwrap_or(Status::Lost), &found.launch);
                let ((kind, code, signal), cgroup) = oom_verdict(agent, &found.launch, ended);
                if let Some(job) = cgroup {
                    tokio::spawn(async move { job.remove().await });
                }
                remove_tmpdir(agent, &found.launch);
                tracing::info!(
                    job = job_id,
                    token,
                    ?kind,
                    code,
                    signal,
                    "found a job that ended while the agent was away"
                );
                let usage = usage_of(&found.record);
                entry.exit = Some(JobExit {
                    job_id,
                    token,
                    kind: kind as i32,
                    exit_code: code,
                    signal,
                    usage,
                    ..Default::default()
                });
                jobs.insert(job_id, entry);
            }
        }
    }
}

/// The reported end of a job from why the agent signalled it (`Exited` when it did not) and
/// what its supervisor recorded.
fn ended_with(kind: ExitKind, status: Status, launch: &Launch) -> Ended {
    match status {
        Status::Exited(code) => (kind, code, 0),
        Status::Signaled(signal) => (kind, 0, signal),
        Status::LeaseExpired(signal) => {
            tracing::warn!(job = launch.job_id, "the job's supervisor killed it: the node's lease ran out");
            (ExitKind::LeaseExpired, 0, signal)
        }
        Status::LaunchFailed(step, errno) => {
            // chdir and exec failures are written to the job's error output by the job's
            // process itself; the earlier steps have nowhere of the user's to write to.
            tracing::warn!(
                job = launch.job_id,
                user = %launch.user,
                "job launch failed: cannot {}: {}",
                step.what(),
                std::io::Error::from_raw_os_error(errno)
            );
            (ExitKind::LaunchFailed, 127, 0)
        }
        Status::Lost => {
            tracing::warn!(job = launch.job_id, "the job's supervisor is gone without a status; reporting it killed");
            (kind, 0, libc::SIGKILL)
        }
    }
}

/// What became of a launch before its job started: its grant refused (nothing of the site's
/// runs for it), the node's prolog failed (why), or passed (or there is none).
enum Prolog {
    Refused,
    Failed(String),
    Passed,
}

/// Runs the job here: how it ended, and how its prolog went.
async fn run(agent: &Agent, launch: &Launch, kill_rx: mpsc::Receiver<Order>) -> (Ended, Prolog) {
    // Nothing is created, no prolog runs and no user is switched before the leader's grant
    // verifies.
    let grant = match crate::grants::verify_launch(agent, launch) {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(job = launch.job_id, user = %launch.user, "job launch failed: launch refused: {e}");
            return ((ExitKind::LaunchFailed, 127, 0), Prolog::Refused);
        }
    };
    let (scripts, node) = (&agent.config.job_scripts, agent.config.name.as_str());
    let context = crate::site::Context::Prolog;
    if let Some(failure) = crate::site::around_job(scripts, launch, node, context, None).await {
        return ((ExitKind::PrologFailed, 0, 0), Prolog::Failed(failure));
    }
    let ended = start_job(agent, launch, grant, kill_rx).await;
    if ended.0 == ExitKind::LaunchFailed {
        // A launch that failed before its supervisor started leaves nothing behind either.
        remove_tmpdir(agent, launch);
    }
    (ended, Prolog::Passed)
}

async fn start_job(
    agent: &Agent,
    launch: &Launch,
    grant: Option<quorum_auth::launch::Grant>,
    kill_rx: mpsc::Receiver<Order>,
) -> Ended {
    let node = agent.config.name.as_str();
    let failed = |message: String| {
        tracing::warn!(job = launch.job_id, user = %launch.user, "job launch failed: {message}");
        if let Some(e) = agent.lock_jobs().get_mut(&launch.job_id).filter(|e| e.token == launch.token) {
            e.launch_error = Some(message);
        }
        (ExitKind::LaunchFailed, 127, 0)
    };
    let Some(spec) = launch.spec.as_ref() else {
        return failed("the launch carries no job spec".into());
    };
    let account = match identity::job_account(agent.config.switch_user, &launch.user)
        .and_then(|a| identity::with_group(a, &spec.group))
    {
        Ok(a) => a,
        Err(e) => return failed(e),
    };
    if let (Some(g), Some(a)) = (&grant, &account) {
        if g.uid != a.uid {
            return failed(format!(
                "launch refused: user '{}' is uid {} on this node, but the controller authenticated uid {}",
                a.name, a.uid, g.uid
            ));
        }
    }
    let work_dir = PathBuf::from(&spec.work_dir);
    let (stdout, stderr) = output_paths(launch, spec, node);
    let output = supervisor::Output { stdout, stderr, truncate: launch.node_rank == 0 && !spec.append_output };

    if !launch.gpus.is_empty() {
        agent.read_job_gpus(launch.job_id, launch.token, true).await;
    }
    let record = record::record_dir(&agent.config.spool_dir, launch.job_id, launch.token);
    let started_ms = now_ms();
    if let Err(e) = record::create_record(&record, launch, started_ms) {
        return failed(format!("cannot write the job record {}: {e}", record.display()));
    }
    if let Some(e) = agent.lock_jobs().get_mut(&launch.job_id).filter(|e| e.token == launch.token) {
        e.record = Some(record.clone());
    }
    let argv = if !spec.script.is_empty() {
        let dir = record::script_dir(&agent.config.spool_dir, launch.job_id, launch.token);
        let path = dir.join("slurm_script");
        if let Err(e) = write_script(&dir, &path, &spec.script, account.as_ref()) {
            return failed(format!("cannot write the job script {}: {e}", path.display()));
        }
        let mut argv = script_argv(&spec.script, &path.display().to_string());
        argv.extend(spec.argv.iter().cloned());
        argv
    } else {
        spec.argv.clone()
    };
    let tmp = tmpdir(agent, launch);
    if let Err(e) = make_tmpdir(&tmp, account.as_ref()) {
        return failed(format!("cannot make the job's TMPDIR {}: {e}", tmp.display()));
    }
    let mut env = job_environment(launch, spec, node, agent.config.slurm_commands.as_deref());
    env.retain(|(k, _)| k != "TMPDIR");
    env.push(("TMPDIR".into(), tmp.display().to_string()));
    agent.tell_leader(&mut env);
    if let Some(a) = &account {
        for (name, value) in [("HOME", &a.home), ("USER", &a.name), ("LOGNAME", &a.name), ("SHELL", &a.shell)] {
            if !env.iter().any(|(k, _)| k == name) {
                env.push((name.to_string(), value.clone()));
            }
        }
    }
    let umask = crate::environment::take_umask(&mut env).unwrap_or(supervisor::DEFAULT_UMASK);
    // `#SBATCH --container-image`: the batch step runs in the container, as pyxis runs it.
    let mut argv = argv;
    let mut work_dir = work_dir;
    let mut enter = None;
    // (An allocation's placeholder — salloc's, srun's own — runs on the node: its steps enter the
    // container.)
    if let Some(c) = spec.container.as_ref().filter(|_| !spec.interactive) {
        let script_dir = record::script_dir(&agent.config.spool_dir, launch.job_id, launch.token);
        let request = crate::container::Request {
            job_id: launch.job_id,
            key: "batch".into(),
            account: account.as_ref(),
            env: &env,
            same_path: [tmp.clone(), script_dir].into_iter().filter(|p| p.is_dir()).collect(),
            gpus: crate::devices::own(&agent.config.gpu_devices, &launch.gpus),
        };
        let progress = crate::container::Progress {
            tx: agent.outbox.clone(),
            job_id: launch.job_id,
            token: launch.token,
            launch: true,
        };
        let live = match agent.containers.open(c, request, Some(progress)).await {
            Ok(live) => live,
            Err(e) => {
                write_launch_error(&output, account.as_ref(), &format!("quorum: container: {e}\n"));
                return failed(format!("container: {e}"));
            }
        };
        env = live.environment(env, &c.env);
        argv = live.argv(c, &argv);
        work_dir = PathBuf::from(live.workdir(c));
        enter = match live.enter(account.as_ref()) {
            Ok(e) => Some(e),
            Err(e) => return failed(format!("cannot enter the container: {e}")),
        };
    }
    let mut prepared = match Prepared::new(&argv, &env, &work_dir, &output, &record) {
        Ok(p) => p.umask(umask),
        Err(e) => return failed(format!("cannot run '{}' in {}: {e}", argv[0], work_dir.display())),
    };
    if agent.config.node_hostname {
        prepared = match prepared.hostname(node) {
            Ok(p) => p,
            Err(e) => return failed(format!("cannot name the job's host: {e}")),
        };
        if let Some(hosts) = &agent.config.hosts_file {
            prepared = match prepared.hosts(hosts) {
                Ok(p) => p,
                Err(e) => return failed(format!("cannot give the job the cluster's hosts file: {e}")),
            };
        }
    }
    if let Some(a) = &account {
        prepared = prepared.run_as(supervisor::Credentials { uid: a.uid, gid: a.gid, groups: a.groups.clone() });
    }
    if let Some(e) = enter {
        prepared = prepared.container(e);
    }
    prepared = match agent.limits().cgroups() {
        Some(cg) => {
            // The node's other GPUs' device files are closed to the job (not only hidden from
            // CUDA_VISIBLE_DEVICES, which it may unset).
            let deny = crate::devices::others(&agent.config.gpu_devices, &launch.gpus);
            match cg
                .create(launch.job_id, launch.token, launch.mem_mb, launch.cpus, &deny)
                .and_then(|d| prepared.cgroup(&d))
            {
                Ok(p) => p,
                Err(e) => return failed(format!("cannot make the job's cgroup: {e}")),
            }
        }
        None if launch.mem_mb > 0 => prepared.rlimit_data(launch.mem_mb * 1024 * 1024),
        None => prepared,
    };
    // A job that may be started elsewhere when this node is lost stops when the lease does,
    // by its supervisor's own clock, whatever this agent does meanwhile.
    if spec.requeue {
        if let Some(deadline) = agent.launch_deadline_ms() {
            // The lease ran out before the launch was read (it waited on a stream this agent did
            // not read: the agent frozen, or its answers cut off): the leader may have declared
            // this node DOWN and started the job elsewhere, so it does not start here even for a
            // moment. Its end says so, as a lease kill's does.
            if deadline <= supervisor::monotonic_ms() {
                tracing::warn!(job = launch.job_id, "not starting a --requeue job: the node's lease ran out");
                return (ExitKind::LeaseExpired, 0, 0);
            }
            prepared = match prepared.lease(&record::lease_file(&agent.config.spool_dir), deadline) {
                Ok(p) => p,
                Err(e) => return failed(format!("cannot watch the node's lease: {e}")),
            };
        }
    }
    let spawned = tokio::task::spawn_blocking(move || supervisor::spawn(&prepared)).await;
    let pids = match spawned.map_err(std::io::Error::other).and_then(|r| r) {
        Ok(pids) => pids,
        Err(e) => return failed(format!("cannot start the job's supervisor: {e}")),
    };
    if let Err(e) = record::write_pids(&record, pids) {
        tracing::warn!(job = launch.job_id, error = %e, "cannot record the job's processes; a restarted agent will not find it");
    }
    if let Some(e) = agent.lock_jobs().get_mut(&launch.job_id) {
        e.pgid = Some(pids.pgid);
        agent.track_rss(pids.pgid);
    }
    tracing::info!(
        job = launch.job_id,
        pgid = pids.pgid,
        supervisor = pids.supervisor,
        rank = launch.node_rank,
        user = %launch.user,
        "job started"
    );
    watch(agent, launch, &record, pids, started_ms, None, kill_rx).await
}

/// Appends `message` to the job's error file (its output file without one), written as the
/// job's user, so that why the job could not start is where its output would have been.
fn write_launch_error(output: &supervisor::Output, account: Option<&identity::Account>, message: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = output.stderr.clone().unwrap_or_else(|| output.stdout.clone());
    let (account, message) = (account.cloned(), message.to_string());
    let _ = std::thread::spawn(move || {
        if let Some(a) = &account {
            crate::as_user::become_for_files(a).ok()?;
        }
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .ok()?;
        f.write_all(message.as_bytes()).ok()
    })
    .join();
}

/// How a batch script is started: by the interpreter its `#!` line names, with that line's one
/// optional argument, as the kernel would start it (`#!/bin/bash -l` is a login shell,
/// `#!/usr/bin/env python3` finds python3 on the job's PATH); by bash when it has none, as
/// Slurm does. The agent reads the line itself, so a spool on a `noexec` file system works.
pub fn script_argv(script: &str, path: &str) -> Vec<String> {
    let line = script.lines().next().unwrap_or("");
    let Some(rest) = line.strip_prefix("#!") else {
        return vec!["bash".into(), path.into()];
    };
    let rest = rest.trim_matches([' ', '\t']);
    let (interpreter, argument) = match rest.split_once([' ', '\t']) {
        Some((i, a)) => (i, Some(a.trim_matches([' ', '\t']))),
        None => (rest, None),
    };
    if interpreter.is_empty() {
        return vec!["bash".into(), path.into()];
    }
    let mut argv = vec![interpreter.to_string()];
    argv.extend(argument.filter(|a| !a.is_empty()).map(str::to_string));
    argv.push(path.into());
    argv
}

/// Writes the batch script into `dir`, a directory of the job's user's own (0700) that nobody
/// else may read (the spool's `scripts/` is not listable), as Slurm's `slurm_script`; whatever
/// an earlier run of this allocation left there is removed first.
fn write_script(dir: &Path, path: &Path, script: &str, account: Option<&identity::Account>) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if std::fs::symlink_metadata(dir).is_ok() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    quorum_auth::private::write(path, script.as_bytes())?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o500))?;
    if let Some(a) = account {
        std::os::unix::fs::chown(path, Some(a.uid), Some(a.gid))?;
        std::os::unix::fs::chown(dir, Some(a.uid), Some(a.gid))?;
    }
    Ok(())
}

/// Watches a started job until its supervisor ends: its time limit (SIGTERM, then SIGKILL after
/// the kill wait) and the kills asked for. `reason` is why a previous agent already signalled it.
#[allow(clippy::too_many_arguments)]
async fn watch(
    agent: &Agent,
    launch: &Launch,
    record: &std::path::Path,
    pids: record::Pids,
    started_ms: u64,
    reason: Option<ExitKind>,
    mut kill_rx: mpsc::Receiver<Order>,
) -> Ended {
    let pgid = pids.pgid;
    // When the job is killed for its time limit (`seconds` after its start), if it has one.
    let limit_at = |seconds: u64| {
        (seconds > 0).then(|| {
            let ends_ms = started_ms.saturating_add(seconds.saturating_mul(1000));
            Instant::now() + Duration::from_millis(ends_ms.saturating_sub(now_ms()))
        })
    };
    let mut limit = limit_at(launch.time_limit_s);
    // Suspended (scontrol suspend): frozen, and its time limit disarmed until resumed.
    let mut suspended = false;
    // `--signal`, in the canonical `[B:]NUMBER@SECONDS` the controller sends.
    let warn = launch.spec.as_ref().and_then(|s| parse_warn_signal(&s.signal));
    let warn_at_for = |limit: Option<Instant>| match (limit, warn) {
        (Some(limit), Some((_, before, _))) => {
            Some(limit.checked_sub(Duration::from_secs(before)).unwrap_or_else(Instant::now))
        }
        _ => None,
    };
    let mut warn_at = warn_at_for(limit);
    let mut warned = false;
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
                warned = true;
                if let Some((signal, before, batch_only)) = warn {
                    tracing::info!(job = launch.job_id, signal, before, batch_only, "warning the job before its time limit");
                    warn_job(pgid, signal, batch_only);
                }
            }
            _ = tokio::time::sleep_until(limit.unwrap_or(far)), if limit.is_some() && kind == ExitKind::Exited => {
                kind = ExitKind::TimedOut;
                record::write_reason(record, kind);
                signal_group(pgid, libc::SIGTERM);
                escalate = Some(Instant::now() + agent.config.kill_wait);
            }
            why = kill_rx.recv(), if kill_open && kind == ExitKind::Exited => {
                match why {
                    // `scontrol update`: the limit moved; a warning not yet given moves with it.
                    // While suspended its limit waits: the resume brings the one to keep.
                    Some(Order::TimeLimit(seconds)) => {
                        if !suspended {
                            limit = limit_at(seconds);
                            if !warned {
                                warn_at = warn_at_for(limit);
                            }
                        }
                    }
                    Some(Order::Suspend) => {
                        if !suspended {
                            tracing::info!(job = launch.job_id, "suspending the job");
                            freeze(agent, launch, pgid, true);
                            (suspended, limit, warn_at) = (true, None, None);
                        }
                    }
                    Some(Order::Resume(seconds)) => {
                        if suspended {
                            tracing::info!(job = launch.job_id, "resuming the job");
                            freeze(agent, launch, pgid, false);
                            suspended = false;
                        }
                        limit = limit_at(seconds);
                        if !warned {
                            warn_at = warn_at_for(limit);
                        }
                    }
                    // Cut off from the controllers: the job may be started elsewhere any moment,
                    // so there is no grace period.
                    Some(Order::Kill(ExitKind::LeaseExpired)) => {
                        kind = ExitKind::LeaseExpired;
                        record::write_reason(record, kind);
                        signal_group(pgid, libc::SIGKILL);
                    }
                    // Preempted with a grace time: SIGKILL only once it is over. Its `--signal`
                    // first, as Slurm's `preempt_send_user_signal`, so that a job that checkpoints
                    // on that signal (submitit's, for one) does so now.
                    Some(Order::Preempt(grace_s)) => {
                        if std::mem::take(&mut suspended) {
                            freeze(agent, launch, pgid, false);
                        }
                        tracing::info!(job = launch.job_id, grace_s, "preempted: SIGTERM, SIGKILL after the grace time");
                        kind = ExitKind::Cancelled;
                        record::write_reason(record, kind);
                        if let Some((signal, _, batch_only)) = warn {
                            warn_job(pgid, signal, batch_only);
                        }
                        signal_group(pgid, libc::SIGTERM);
                        escalate = Some(Instant::now() + Duration::from_secs(grace_s));
                    }
                    Some(Order::Kill(reason)) => {
                        // Thawed first, so that it can act on SIGTERM.
                        if std::mem::take(&mut suspended) {
                            freeze(agent, launch, pgid, false);
                        }
                        kind = reason;
                        record::write_reason(record, kind);
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
    let ended = ended_with(kind, status, launch);
    conclude(agent, launch, ended).await
}

/// The job's `--signal`: to its batch shell alone (`B:`), or to its whole process group.
fn warn_job(pgid: i32, signal: i32, batch_only: bool) {
    if batch_only {
        // SAFETY: kill(2) on the job's main process (the group leader); no memory is touched.
        unsafe { libc::kill(pgid, signal) };
    } else {
        signal_group(pgid, signal);
    }
}

/// Freezes (or thaws) a job's processes here: its cgroup's freezer where it has a v2 cgroup,
/// which holds every process in it however it was started; else SIGSTOP (SIGCONT) to its
/// process group.
fn freeze(agent: &Agent, launch: &Launch, pgid: i32, frozen: bool) {
    let cgroup = agent.limits().cgroups().map(|cg| cg.job(launch.job_id, launch.token)).filter(|j| j.v2);
    if let Some(job) = cgroup.filter(|j| j.dirs[0].exists()) {
        match job.freeze(frozen) {
            Ok(()) => return,
            Err(e) => tracing::warn!(job = launch.job_id, error = %e, "the cgroup freezer failed; signalling instead"),
        }
    }
    signal_group(pgid, if frozen { libc::SIGSTOP } else { libc::SIGCONT });
}

/// With a cgroup: an OOM kill in it makes the job OUT_OF_MEMORY; the cgroup goes.
async fn conclude(agent: &Agent, launch: &Launch, ended: Ended) -> Ended {
    if !launch.gpus.is_empty() {
        agent.read_job_gpus(launch.job_id, launch.token, false).await;
    }
    agent.kill_steps(launch.job_id);
    let (ended, cgroup) = oom_verdict(agent, launch, ended);
    if let Some(job) = cgroup {
        job.remove().await;
    }
    remove_tmpdir(agent, launch);
    ended
}

/// The job's private temporary directory on this node (its `TMPDIR`):
/// `<tmp_base>/quorum-<job>.<token>.<node>` (the node's name too, for agents sharing a host).
fn tmpdir(agent: &Agent, launch: &Launch) -> PathBuf {
    tmpdir_of(agent, launch.job_id, launch.token)
}

/// The temporary directory of job `job_id`'s allocation `token` here.
pub(crate) fn tmpdir_of(agent: &Agent, job_id: u64, token: u64) -> PathBuf {
    agent.config.tmp_base.join(format!("quorum-{job_id}.{token}.{}", agent.config.name))
}

/// Makes the job's temporary directory, empty and its user's alone (mode 0700).
fn make_tmpdir(path: &Path, account: Option<&identity::Account>) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    // Whatever an earlier run of this allocation left is not the job's to find.
    if std::fs::symlink_metadata(path).is_ok() {
        std::fs::remove_dir_all(path)?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    if let Some(a) = account {
        std::os::unix::fs::chown(path, Some(a.uid), Some(a.gid))?;
    }
    Ok(())
}

/// Removes the job's temporary directory with all the job left in it (`remove_dir_all` does not
/// follow links the job made).
/// The batch script's directory goes with it.
fn remove_tmpdir(agent: &Agent, launch: &Launch) {
    let script = record::script_dir(&agent.config.spool_dir, launch.job_id, launch.token);
    for (path, what) in [(tmpdir(agent, launch), "TMPDIR"), (script, "script directory")] {
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(job = launch.job_id, path = %path.display(), error = %e, "cannot remove the job's {what}")
            }
        }
    }
}

/// A job that exited after an OOM kill in its cgroup ended OUT_OF_MEMORY; also the cgroup, for
/// the caller to remove.
fn oom_verdict(agent: &Agent, launch: &Launch, ended: Ended) -> (Ended, Option<crate::limits::JobCgroup>) {
    let Some(cg) = agent.limits().cgroups() else { return (ended, None) };
    let job = cg.job(launch.job_id, launch.token);
    let ended = match ended {
        (ExitKind::Exited, code, signal) if job.oom_killed() => {
            tracing::info!(job = launch.job_id, "the OOM killer killed the job");
            (ExitKind::OutOfMemory, code, signal)
        }
        other => other,
    };
    (ended, Some(job))
}

#[cfg(test)]
mod tests {
    use super::script_argv;

    #[test]
    fn a_script_runs_under_the_interpreter_its_first_line_names() {
        let argv = |script: &str| script_argv(script, "/spool/s");
        assert_eq!(argv("echo hi\n"), ["bash", "/spool/s"]);
        assert_eq!(argv("#!/bin/sh\necho hi\n"), ["/bin/sh", "/spool/s"]);
        assert_eq!(argv("#!/bin/bash -l\n"), ["/bin/bash", "-l", "/spool/s"]);
        assert_eq!(argv("#! /usr/bin/env  python3 -u \n"), ["/usr/bin/env", "python3 -u", "/spool/s"]);
        assert_eq!(argv("#!\n"), ["bash", "/spool/s"]);
        assert_eq!(argv(""), ["bash", "/spool/s"]);
    }
}
