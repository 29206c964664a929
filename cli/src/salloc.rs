//! `salloc`: an allocation held for a command (a shell by default) that runs here, on the
//! submitting host, with the job's variables set, so that `srun` inside it starts steps on the
//! allocation's nodes; the allocation ends when the command does. `srun` from outside a job
//! takes an allocation the same way for its one step ([`allocate`], [`relinquish`]).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use quorum_client::client::{Client, ControllersArg};
use quorum_client::submit::{build_spec, host_name, submit_environment, Payload, SubmitOpts};
use quorum_proto::api::{self, JobInfo};

#[derive(Parser, Debug)]
#[command(name = "salloc", no_binary_name = true, about = "Hold an allocation for a command (Quorum's salloc)")]
pub struct SallocArgs {
    #[command(flatten)]
    opts: Box<SubmitOpts>,
    #[command(flatten)]
    controllers: ControllersArg,
    /// The command to run here while the allocation is held (default: your $SHELL).
    #[arg(trailing_var_arg = true)]
    command: Vec<String>,
}

pub fn main(args: &[String]) -> ExitCode {
    crate::entry::main_of::<SallocArgs, _, _>("salloc", crate::entry::Threads::Workers, args, run)
}

/// An interactive allocation: its spec, and with `--uid` (root only) the user it is for.
pub struct Allocation {
    pub spec: api::JobSpec,
    /// `--uid`: the allocation is this user's, and salloc or srun becomes them once it is
    /// granted ([`become_owner`]).
    pub run_as: Option<String>,
}

/// An interactive allocation's spec: `opts`, with `command` as what runs where salloc or srun
/// runs (nothing of the user's runs on the nodes but steps).
/// Warnings go to stderr as `who`'s.
pub fn allocation_spec(opts: SubmitOpts, command: Vec<String>, who: &str) -> anyhow::Result<Allocation> {
    let cwd = std::env::current_dir()?;
    let built = build_spec(opts, Payload::Command(command), &cwd, submit_environment()).map_err(anyhow::Error::msg)?;
    for w in &built.warnings {
        eprintln!("{who}: warning: {w}");
    }
    let mut spec = built.spec;
    spec.interactive = true;
    Ok(Allocation { spec, run_as: built.run_as })
}

/// Submits the allocation and waits until it runs (saying so on stderr as `who`, as Slurm's
/// commands do). Interrupted while it waits, it cancels the job. With `--uid`, the job is that
/// user's (the controllers check that root asked), and this process becomes that user once the
/// allocation is granted, as Slurm's salloc and srun drop their privileges: what it runs then
/// (salloc's command, srun's step) runs as the job's user, never as root.
pub async fn allocate(client: &Client, allocation: Allocation, who: &str, verbose: bool) -> anyhow::Result<JobInfo> {
    let job = allocate_as(client, allocation.spec, allocation.run_as.as_deref().unwrap_or(""), who, verbose).await?;
    if allocation.run_as.is_some() {
        if let Err(e) = become_owner(&job) {
            relinquish(client, job.id, 1).await?;
            return Err(e);
        }
    }
    Ok(job)
}

/// Becomes the owner of allocation `job` (its user, with its group when `--gid` named one, or
/// the user's own), for good, in every thread of this process.
fn become_owner(job: &JobInfo) -> anyhow::Result<()> {
    use std::ffi::CString;
    let user = quorum_auth::users::by_name(&job.user).map_err(|e| anyhow::anyhow!("--uid: {e}"))?;
    let group = job.spec.as_ref().map(|s| s.group.as_str()).filter(|g| !g.is_empty());
    let gid = match group {
        Some(g) => quorum_auth::users::group(g).map_err(|e| anyhow::anyhow!("--gid: {e}"))?.gid,
        None => user.gid,
    };
    let name = CString::new(user.name.clone()).map_err(|_| anyhow::anyhow!("--uid: a user name with a NUL byte"))?;
    // SAFETY: plain system calls on values made above. glibc applies set*id and setgroups (as
    // initgroups does) to every thread of the process.
    let failed =
        unsafe { libc::initgroups(name.as_ptr(), gid) != 0 || libc::setgid(gid) != 0 || libc::setuid(user.uid) != 0 };
    // SAFETY: getuid and geteuid have no failure mode.
    if failed || unsafe { libc::getuid() != user.uid || libc::geteuid() != user.uid } {
        anyhow::bail!("cannot become user {} (uid {}): {}", user.name, user.uid, std::io::Error::last_os_error());
    }
    Ok(())
}

async fn allocate_as(
    client: &Client,
    spec: api::JobSpec,
    run_as: &str,
    who: &str,
    verbose: bool,
) -> anyhow::Result<JobInfo> {
    let req = api::SubmitJobRequest {
        spec: Some(spec),
        user: String::new(),
        request_id: uuid::Uuid::new_v4().to_string(),
        test_only: false,
        run_as: run_as.to_string(),
    };
    let id = client
        .call(|mut c| {
            let req = req.clone();
            async move { c.submit_job(req).await }
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .job_id;
    if verbose {
        eprintln!("{who}: Pending job allocation {id}");
    }
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let started = Instant::now();
    let mut told_waiting = false;
    loop {
        let req = api::GetJobRequest { job_id: id, stale: false, array_task_id: None };
        let job = client.call(|mut c| async move { c.get_job(req).await }).await;
        if let Ok(Some(job)) = job.map(|r| r.job) {
            match job.state.as_str() {
                "RUNNING" => {
                    if verbose {
                        eprintln!("{who}: Granted job allocation {id}");
                    } else if told_waiting {
                        eprintln!("{who}: job {id} has been allocated resources");
                    }
                    return Ok(job);
                }
                "PENDING" => {}
                other => anyhow::bail!(
                    "job allocation {id} ended {other} before it started{}",
                    if job.reason.is_empty() { String::new() } else { format!(" ({})", job.reason) }
                ),
            }
            if !told_waiting && started.elapsed() > Duration::from_millis(500) {
                let why = if job.reason.is_empty() { "Resources".to_string() } else { job.reason.clone() };
                eprintln!("{who}: job {id} queued and waiting for resources ({why})");
                told_waiting = true;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = interrupt.recv() => return Err(revoke(client, id, who).await),
            _ = terminate.recv() => return Err(revoke(client, id, who).await),
        }
    }
}

async fn revoke(client: &Client, id: u64, who: &str) -> anyhow::Error {
    let req = api::CancelJobRequest { job_ids: vec![id], ..Default::default() };
    let _ = client
        .call(|mut c| {
            let req = req.clone();
            async move { c.cancel_job(req).await }
        })
        .await;
    anyhow::anyhow!("{who}: Job allocation {id} has been revoked: interrupted while it waited")
}

/// Ends the allocation as its command ended (COMPLETED with 0, else FAILED with the code).
pub async fn relinquish(client: &Client, id: u64, exit_code: i32) -> anyhow::Result<()> {
    let req = api::CancelJobRequest { job_ids: vec![id], complete: true, exit_code, ..Default::default() };
    let r = client
        .call(|mut c| {
            let req = req.clone();
            async move { c.cancel_job(req).await }
        })
        .await
        .map_err(|s| anyhow::anyhow!("ending job allocation {id}: {}", s.message()))?;
    match r.results.first() {
        Some(res) if !res.ok && !res.error.contains("is not running") => {
            anyhow::bail!("ending job allocation {id}: {}", res.error)
        }
        _ => Ok(()),
    }
}

/// The variables a command in an allocation gets, as salloc sets them.
pub fn allocation_env(job: &JobInfo) -> Vec<(String, String)> {
    let spec = job.spec.clone().unwrap_or_default();
    let nodes = job.allocation.len().max(1) as u32;
    let mut vars = vec![
        ("SLURM_JOB_ID", job.id.to_string()),
        ("SLURM_JOBID", job.id.to_string()),
        ("SLURM_JOB_NAME", job.name.clone()),
        ("SLURM_JOB_NODELIST", job.nodelist.clone()),
        ("SLURM_NODELIST", job.nodelist.clone()),
        ("SLURM_JOB_NUM_NODES", nodes.to_string()),
        ("SLURM_NNODES", nodes.to_string()),
        ("SLURM_NTASKS", spec.ntasks.to_string()),
        ("SLURM_NPROCS", spec.ntasks.to_string()),
        ("SLURM_CPUS_PER_TASK", spec.cpus_per_task.to_string()),
        ("SLURM_TASKS_PER_NODE", quorum_model::step::tasks_per_node(spec.ntasks, nodes)),
        ("SLURM_JOB_CPUS_PER_NODE", quorum_model::step::run_lengths(job.allocation.iter().map(|a| a.cpus))),
        ("SLURM_JOB_PARTITION", job.partition.clone()),
        ("SLURM_JOB_USER", job.user.clone()),
        ("SLURM_SUBMIT_DIR", spec.submit_dir.clone()),
        ("SLURM_SUBMIT_HOST", host_name()),
        ("SLURM_CLUSTER_NAME", "quorum".into()),
    ];
    for (k, v) in [("SLURM_JOB_ACCOUNT", &job.account), ("SLURM_JOB_QOS", &job.qos)] {
        if !v.is_empty() {
            vars.push((k, v.clone()));
        }
    }
    // What the batch step gets of its first node, as salloc's shell runs where Slurm's would.
    if let Some(first) = job.allocation.first() {
        vars.push(("SLURM_CPUS_ON_NODE", first.cpus.to_string()));
        vars.push(("SLURM_MEM_PER_NODE", first.mem_mb.to_string()));
        if !first.gpus.is_empty() {
            vars.push(("SLURM_GPUS_ON_NODE", first.gpus.len().to_string()));
            vars.push(("SLURM_GPUS_PER_NODE", first.gpus.len().to_string()));
            let ids: Vec<String> = first.gpus.iter().map(u32::to_string).collect();
            vars.push(("SLURM_JOB_GPUS", ids.join(",")));
        }
    }
    if spec.ntasks > 0 && spec.ntasks.is_multiple_of(nodes) {
        vars.push(("SLURM_NTASKS_PER_NODE", (spec.ntasks / nodes).to_string()));
    }
    if spec.overcommit {
        vars.push(("SLURM_OVERCOMMIT", "1".to_string()));
    }
    vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

async fn run(a: SallocArgs) -> anyhow::Result<u8> {
    if a.command.first().is_some_and(|c| c == ":") {
        anyhow::bail!(
            "a heterogeneous allocation (salloc A : B) is not supported here: submit the job with sbatch (#SBATCH hetjob)"
        );
    }
    let client = a.controllers.client()?;
    let command = if a.command.is_empty() {
        vec![std::env::var("SHELL").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "/bin/sh".into())]
    } else {
        a.command.clone()
    };
    // `-m`: the command's sruns read it, as under Slurm's salloc.
    let layout = a.opts.distribution.clone().map(|d| ("SLURM_DISTRIBUTION", d));
    let allocation = allocation_spec(*a.opts, command.clone(), "salloc")?;
    let became = allocation.run_as.is_some();
    let job = allocate(&client, allocation, "salloc", true).await?;
    // Become the job's user (--uid): from here on, requests prove who this process now is.
    let client = if became { a.controllers.client()? } else { client };
    let id = job.id;
    // Ctrl-C is the command's (a shell ignores it); salloc stays.
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let mut child = match tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .envs(allocation_env(&job))
        .envs(layout)
        .env(quorum_proto::LEADER_ENV, client.preferred())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            relinquish(&client, id, 127).await?;
            anyhow::bail!("cannot run '{}': {e}", command[0]);
        }
    };
    let mut check = tokio::time::interval(Duration::from_secs(1));
    let mut revoked = false;
    let code = loop {
        tokio::select! {
            status = child.wait() => {
                use std::os::unix::process::ExitStatusExt;
                let status = status?;
                break status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            }
            _ = interrupt.recv() => {}
            _ = terminate.recv() => signal_child(&child, libc::SIGTERM),
            _ = hangup.recv() => signal_child(&child, libc::SIGHUP),
            _ = check.tick() => {
                let req = api::GetJobRequest { job_id: id, stale: false, array_task_id: None };
                let state = client.call(|mut c| async move { c.get_job(req).await }).await.ok().and_then(|r| r.job).map(|j| j.state);
                if !revoked && state.as_deref().is_some_and(|s| s != "RUNNING") {
                    eprintln!("salloc: Job allocation {id} has been revoked.");
                    signal_child(&child, libc::SIGHUP);
                    revoked = true;
                }
            }
        }
    };
    eprintln!("salloc: Relinquishing job allocation {id}");
    if !revoked {
        relinquish(&client, id, code).await?;
    }
    Ok(code.clamp(0, 255) as u8)
}

fn signal_child(child: &tokio::process::Child, signal: i32) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) on our own child; no memory is touched.
        unsafe { libc::kill(pid as i32, signal) };
    }
}

#[cfg(test)]
mod tests {
    use quorum_proto::api::{JobInfo, JobSpec, NodeAllocation};

    /// What launchers read of an allocation (Open MPI's and MPICH's `mpirun` among them), as
    /// Slurm writes it: CPUs per node with repeats folded, the first node's share.
    #[test]
    fn the_allocation_is_described_as_slurm_writes_it() {
        let node = |name: &str, cpus, gpus: Vec<u32>| NodeAllocation {
            node: name.into(),
            cpus,
            mem_mb: 2048,
            gpus,
            ..Default::default()
        };
        let job = JobInfo {
            id: 9,
            spec: Some(JobSpec { ntasks: 6, ..Default::default() }),
            allocation: vec![node("n1", 4, vec![0, 1]), node("n2", 4, vec![2, 3]), node("n3", 2, vec![0, 1])],
            ..Default::default()
        };
        let env = super::allocation_env(&job);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("SLURM_JOB_CPUS_PER_NODE"), Some("4(x2),2"));
        assert_eq!(get("SLURM_NTASKS_PER_NODE"), Some("2"));
        assert_eq!((get("SLURM_CPUS_ON_NODE"), get("SLURM_MEM_PER_NODE")), (Some("4"), Some("2048")));
        assert_eq!((get("SLURM_GPUS_ON_NODE"), get("SLURM_JOB_GPUS")), (Some("2"), Some("0,1")));
        let uneven = JobInfo { spec: Some(JobSpec { ntasks: 4, ..Default::default() }), ..job };
        assert_eq!(super::allocation_env(&uneven).iter().find(|(k, _)| k == "SLURM_NTASKS_PER_NODE"), None);
    }
}
