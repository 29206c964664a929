//! A job step's tasks on this node (`srun` inside an allocation): each task a process of the
//! job's user in the job's cgroup here, in a process group of its own, with its `SLURM_PROCID`,
//! `SLURM_LOCALID`, `SLURM_NODEID` and GPUs. Its stdout and stderr are read through pipes and
//! sent to the leader, which hands them to the step's `srun`; task 0's stdin comes the other way.
//!
//! Steps run only inside a job this agent runs under the same allocation, and end with it: the
//! job's cgroup is killed when the job ends, and without cgroups the job's end kills each step's
//! process groups ([`Agent::kill_steps`]). The tasks are the agent's children: an agent that
//! stops takes their pipes with it (their `srun` sees the node lost).
//!
//! The agent reaps each task itself with `wait4` (woken by a pidfd), for what it used: its CPU
//! time and largest resident set, with every process it waited for, as the supervisor measures
//! a batch script.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use quorum_proto::agent::{agent_message, step_io, AgentMessage, StepIo, StepLaunch, StepOutput, StepTaskExit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use crate::input::{TaskInput, MAX_WAITING_INPUT};
use crate::{identity, supervisor, Agent};

/// The largest piece of output sent in one message.
const CHUNK: usize = 64 * 1024;

fn send(agent: &Agent, msg: agent_message::Msg) -> impl std::future::Future<Output = ()> + '_ {
    let tx = agent.outbox.clone();
    async move {
        let _ = tx.send(AgentMessage { msg: Some(msg) }).await;
    }
}

async fn task_failed(agent: &Agent, l: &StepLaunch, task: u32, error: String) {
    tracing::warn!(job = l.job_id, step = l.step_id, task, "step task not started: {error}");
    let exit = StepTaskExit { job_id: l.job_id, step_id: l.step_id, task, exit_code: 1, signal: 0, error, usage: None };
    send(agent, agent_message::Msg::StepExit(exit)).await;
}

/// Starts this node's tasks of a step.
pub(crate) async fn launch(agent: Arc<Agent>, l: StepLaunch) {
    // This node's tasks: in blocks, or its share of the cyclic numbering.
    let (tasks, layout_error) = match crate::pmi::local_ranks(&l) {
        Ok(tasks) => (tasks, None),
        Err(e) => ((l.first_task..l.first_task.saturating_add(l.tasks)).collect(), Some(e)),
    };
    let refuse = |error: String| {
        let (agent, l, tasks) = (agent.clone(), l.clone(), tasks.clone());
        async move {
            for task in tasks {
                task_failed(&agent, &l, task, error.clone()).await;
            }
            forget_if_idle(&agent, (l.job_id, l.step_id));
        }
    };
    if let Some(e) = layout_error {
        return refuse(format!("step launch refused: {e}")).await;
    }
    let grant = match crate::grants::verify_step(&agent, &l) {
        Ok(g) => g,
        Err(e) => return refuse(format!("step launch refused: {e}")).await,
    };
    // Only inside the job's allocation here, while it runs.
    let running = agent.lock_jobs().get(&l.job_id).is_some_and(|e| e.token == l.token && e.exit.is_none());
    if !running {
        return refuse(format!("job {} does not run on {} under this allocation", l.job_id, agent.config.name)).await;
    }
    let account = match identity::job_account(agent.config.switch_user, &l.user)
        .and_then(|a| identity::with_group(a, &l.group))
    {
        Ok(a) => a,
        Err(e) => return refuse(e).await,
    };
    if let (Some(g), Some(a)) = (&grant, &account) {
        if g.uid != a.uid {
            return refuse(format!(
                "user '{}' is uid {} on this node, but the controller authenticated uid {}",
                a.name, a.uid, g.uid
            ))
            .await;
        }
    }
    let cgroup_procs = match agent.limits().cgroups() {
        Some(cg) => cg.job(l.job_id, l.token).procs_files(),
        None => Vec::new(),
    };
    // `--mpi=pmi2`: its PMI, made when the launch came.
    let pmi = match l.mpi.as_str() {
        "" => None,
        crate::pmi::CAPABILITY => {
            let made = agent.lock_steps().get(&(l.job_id, l.step_id)).and_then(|e| e.pmi.clone());
            match made {
                Some(pmi) => Some(pmi),
                None => return refuse(format!("no PMI for the step's layout {:?}", l.node_tasks)).await,
            }
        }
        crate::pmix::CAPABILITY => None,
        other => return refuse(format!("--mpi={other} is not served by this node's agent")).await,
    };
    let tmpdir = crate::runner::tmpdir_of(&agent, l.job_id, l.token);
    // `--mpi=pmix`: the step's PMIx server here, started before its tasks.
    let pmix_env = if l.mpi == crate::pmix::CAPABILITY {
        let made = agent.lock_steps().get(&(l.job_id, l.step_id)).and_then(|e| e.pmix.clone());
        let Some(pmix) = made else {
            return refuse(format!("no PMIx for the step's layout {:?}", l.node_tasks)).await;
        };
        if !crate::pmix::available() {
            return refuse(format!("--mpi=pmix: {} has no PMIx library (libpmix2)", agent.config.name)).await;
        }
        // `PMIx_Abort`: the step's tasks here are killed.
        let kill = {
            let (agent, key) = (agent.clone(), (l.job_id, l.step_id));
            move || {
                if let Some(entry) = agent.lock_steps().get_mut(&key) {
                    entry.killed = true;
                    for &pgid in &entry.pgids {
                        supervisor::signal_group(pgid, libc::SIGKILL);
                    }
                }
            }
        };
        match pmix.start(kill, account.as_ref(), &cgroup_procs, &tmpdir).await {
            Ok(envs) => Some(envs),
            Err(e) => return refuse(format!("--mpi=pmix on {}: {e}", agent.config.name)).await,
        }
    } else {
        None
    };
    // `--container-image`: the one container every task of the step here enters.
    let container = match &l.container {
        None => None,
        Some(spec) => {
            let job_env: Vec<(String, String)> = l.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect();
            let request = crate::container::Request {
                job_id: l.job_id,
                key: format!("step.{}", l.step_id),
                account: account.as_ref(),
                env: &job_env,
                same_path: [tmpdir.clone()].into_iter().filter(|p| p.is_dir()).collect(),
                gpus: crate::devices::own(&agent.config.gpu_devices, &l.gpus),
            };
            let progress = crate::container::Progress {
                tx: agent.outbox.clone(),
                job_id: l.job_id,
                token: l.token,
                launch: false,
            };
            match agent.containers.open(spec, request, Some(progress)).await {
                Ok(live) => Some((live, spec.clone())),
                Err(e) => return refuse(format!("container: {e}")).await,
            }
        }
    };
    {
        let mut steps = agent.lock_steps();
        let entry = steps.entry((l.job_id, l.step_id)).or_default();
        if let Some((live, spec)) = &container {
            live.users.fetch_add(l.tasks as usize, Ordering::Relaxed);
            entry.container = Some(crate::container::StepUse {
                live: live.clone(),
                spec: spec.clone(),
                left: l.tasks as usize,
                // One node saves (`--container-save`): the step's first.
                save: l.node_id == 0,
                account: account.clone(),
            });
        }
    }
    // `--cpu-bind`: the job's CPUs here, each task bound to its share.
    let binding = match quorum_model::cpu_bind::CpuBind::parse(&l.cpu_bind) {
        _ if l.cpu_bind.is_empty() => None,
        Ok(Some(b)) => Some(b),
        Ok(None) => return refuse(format!("--cpu-bind={} is not made by this node's agent", l.cpu_bind)).await,
        Err(e) => return refuse(e).await,
    };
    let job_cpus = binding.as_ref().map(|_| {
        let cpus = agent.limits().cgroups().and_then(|cg| cg.job(l.job_id, l.token).cpus()).unwrap_or_else(own_cpus);
        places(&cpus)
    });
    let cpus_per_task =
        l.env.iter().find(|e| e.name == "SLURM_CPUS_PER_TASK").and_then(|e| e.value.parse::<u32>().ok()).unwrap_or(1);
    for (local, &task) in (0u32..).zip(&tasks) {
        let bound = match (&binding, &job_cpus) {
            (Some(b), Some(cpus)) => match b.cpus(cpus, local, cpus_per_task) {
                Ok(mine) => Some(Binding::new(b, &mine, &agent.config.name, task, local)),
                Err(e) => {
                    task_failed(&agent, &l, task, format!("{e} on {}", agent.config.name)).await;
                    continue;
                }
            },
            _ => None,
        };
        // The GPUs this task sees.
        let gpus: Vec<String> = if l.gpus_per_task == 0 {
            l.gpus.iter().map(u32::to_string).collect()
        } else {
            let from = (local * l.gpus_per_task) as usize;
            l.gpus.iter().skip(from).take(l.gpus_per_task as usize).map(u32::to_string).collect()
        };
        let gpus = gpus.join(",");
        let mut env: Vec<(String, String)> = l
            .env
            .iter()
            .filter(|e| e.name != quorum_model::mpi::PMIX_SECRET_ENV)
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        let node = agent.config.name.clone();
        let own = [
            ("SLURM_PROCID", task.to_string()),
            ("SLURM_LOCALID", local.to_string()),
            ("SLURM_NODEID", l.node_id.to_string()),
            ("SLURM_STEP_NODEID", l.node_id.to_string()),
            ("SLURMD_NODENAME", node),
            ("SLURM_GPUS_ON_NODE", l.gpus.len().to_string()),
            ("SLURM_STEP_GPUS", l.gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
            ("GPU_DEVICE_ORDINAL", gpus.clone()),
            ("CUDA_VISIBLE_DEVICES", gpus),
            ("TMPDIR", tmpdir.display().to_string()),
        ];
        let own: Vec<(&str, String)> = own.into_iter().chain(bound.iter().flat_map(|b| b.environment())).collect();
        env.retain(|(k, _)| !own.iter().any(|(o, _)| o == k));
        env.extend(own.into_iter().map(|(k, v)| (k.to_string(), v)));
        // PMI on a socket the task inherits; the agent serves its end.
        let pmi_socket = match &pmi {
            None => None,
            Some(pmi) => match crate::pmi::socket_pair() {
                Ok((ours, theirs)) => {
                    let vars = pmi.environment(task, theirs.as_raw_fd());
                    env.retain(|(k, _)| !vars.iter().any(|(o, _)| o == k));
                    env.extend(vars);
                    tokio::spawn(pmi.clone().serve(task, ours));
                    Some(theirs)
                }
                Err(e) => {
                    task_failed(&agent, &l, task, format!("cannot make the task's PMI socket: {e}")).await;
                    continue;
                }
            },
        };
        if let Some(vars) = pmix_env.as_ref().and_then(|e| e.get(&task)) {
            env.retain(|(k, _)| !vars.iter().any(|(o, _)| o == k));
            env.extend(vars.iter().cloned());
        }
        agent.tell_leader(&mut env);
        let umask = crate::environment::take_umask(&mut env).unwrap_or(supervisor::DEFAULT_UMASK);
        if let Some(a) = &account {
            for (name, value) in [("HOME", &a.home), ("USER", &a.name), ("LOGNAME", &a.name)] {
                if !env.iter().any(|(k, _)| k == name) {
                    env.push((name.to_string(), value.clone()));
                }
            }
        }
        let hostname = agent.config.node_hostname.then_some(agent.config.name.as_str());
        // `srun --pty`: task 0 on a terminal of its own.
        let pty = match (l.pty && task == 0).then(|| open_pty(l.window.as_ref())).transpose() {
            Ok(p) => p,
            Err(e) => {
                task_failed(&agent, &l, task, format!("cannot open a pseudo-terminal: {e}")).await;
                continue;
            }
        };
        if agent.lock_steps().get(&(l.job_id, l.step_id)).is_some_and(|e| e.killed) {
            task_failed(&agent, &l, task, "the step was killed before this task started".into()).await;
            continue;
        }
        let slave = pty.as_ref().map(|(_, s)| s);
        let inside = match &container {
            None => None,
            Some((live, spec)) => {
                env = live.environment(env, &spec.env);
                let argv = live.argv(spec, &l.argv);
                match (live.find_program(&argv[0], &env), live.enter(account.as_ref())) {
                    (Some(program), Ok(enter)) => Some(Inside { argv, program, cwd: live.workdir(spec), enter }),
                    (None, _) => {
                        let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone()).unwrap_or_default();
                        let error = format!("'{}' is not found on the container's PATH ({path})", argv[0]);
                        task_failed(&agent, &l, task, error).await;
                        container_task_gone(&agent, &l).await;
                        continue;
                    }
                    (_, Err(e)) => {
                        task_failed(&agent, &l, task, format!("cannot enter the container: {e}")).await;
                        container_task_gone(&agent, &l).await;
                        continue;
                    }
                }
            }
        };
        let spawned = spawn(
            &l,
            &env,
            umask,
            account.as_ref(),
            &cgroup_procs,
            task == 0,
            hostname,
            hostname.and(agent.config.hosts_file.as_deref()),
            slave,
            inside.as_ref(),
            pmi_socket.as_ref().map(|s| s.as_raw_fd()),
            bound.as_ref(),
        );
        drop(pmi_socket);
        match spawned {
            Ok(child) => watch(agent.clone(), l.clone(), task, child, pty.map(|(m, _)| m)),
            Err(e) => {
                let (program, cwd) = inside
                    .as_ref()
                    .map_or((l.argv[0].as_str(), l.work_dir.as_str()), |i| (i.argv[0].as_str(), i.cwd.as_str()));
                let place = if inside.is_some() { " (in the container)" } else { "" };
                task_failed(&agent, &l, task, format!("cannot run '{program}' in {cwd}{place}: {e}")).await;
                container_task_gone(&agent, &l).await;
            }
        }
    }
    forget_if_idle(&agent, (l.job_id, l.step_id));
}

/// What a task runs in its container.
struct Inside {
    argv: Vec<String>,
    program: String,
    cwd: String,
    enter: crate::container::Enter,
}

/// One of the step's tasks here is done with its container (ended, or never started); the last
/// one saves it (`--container-save`) and lets it go. Then an error of the save, if any.
async fn container_task_gone(agent: &Arc<Agent>, l: &StepLaunch) -> Option<String> {
    let done = {
        let mut steps = agent.lock_steps();
        let entry = steps.get_mut(&(l.job_id, l.step_id))?;
        let c = entry.container.as_mut()?;
        c.left = c.left.saturating_sub(1);
        c.live.users.fetch_sub(1, Ordering::Relaxed);
        if c.left > 0 {
            return None;
        }
        entry.container.take()?
    };
    let (agent, job) = (agent.clone(), l.job_id);
    let released = tokio::task::spawn_blocking(move || {
        let save = done.save.then_some((done.spec.save.as_str(), done.account.as_ref()));
        agent.containers.release(job, &done.live, save)
    })
    .await;
    match released {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(e) => Some(e.to_string()),
    }
}

/// Registers a step whose launch came, before the launch is handled: a kill right behind it is
/// kept, and with task 0 here, `srun`'s input that arrives before task 0 starts waits for it
/// (bounded as all input is) instead of being dropped.
pub(crate) fn expect(agent: &Agent, l: &StepLaunch) {
    let mut steps = agent.lock_steps();
    let entry = steps.entry((l.job_id, l.step_id)).or_default();
    // Its PMI from now on: the other nodes' fence contributions may come before its tasks start.
    if l.mpi == crate::pmi::CAPABILITY && entry.pmi.is_none() {
        match crate::pmi::StepPmi::new(l, agent.outbox.clone()) {
            Ok(pmi) => entry.pmi = Some(pmi),
            Err(e) => tracing::warn!(job = l.job_id, step = l.step_id, "no PMI for the step: {e}"),
        }
    }
    if l.mpi == crate::pmix::CAPABILITY && entry.pmix.is_none() {
        match crate::pmix::StepPmix::new(l, agent.outbox.clone()) {
            Ok(pmix) => entry.pmix = Some(pmix),
            Err(e) => tracing::warn!(job = l.job_id, step = l.step_id, "no PMIx for the step: {e}"),
        }
    }
    if l.first_task == 0 && l.tasks > 0 && entry.stdin.is_none() {
        let (input, rx, waiting) = TaskInput::new();
        entry.stdin = Some(input);
        entry.early_input = Some((rx, waiting));
    }
}

/// Task 0's input queue: the one its early input waits in, or a new one.
fn input_queue(entry: &mut crate::agent::StepEntry) -> crate::input::Queue {
    match entry.early_input.take() {
        Some(queue) if entry.stdin.is_some() => queue,
        _ => {
            let (input, rx, waiting) = TaskInput::new();
            entry.stdin = Some(input);
            (rx, waiting)
        }
    }
}

/// Drops what the agent keeps of a step once none of its tasks runs here (input that waited
/// for a task 0 that never started goes with it).
fn forget_if_idle(agent: &Agent, key: (u64, u32)) {
    let mut steps = agent.lock_steps();
    if steps.get(&key).is_some_and(|e| e.pgids.is_empty() && (e.stdin.is_none() || e.early_input.is_some())) {
        if let Some(e) = steps.remove(&key) {
            if let Some(pmi) = e.pmi {
                pmi.close();
            }
            if let Some(pmix) = e.pmix {
                pmix.close();
            }
        }
    }
}

/// Starts one task: its own process group, the job's cgroup, the job's user, the step's
/// directory, then exec (looked up on the task's `PATH`).
#[allow(clippy::too_many_arguments)]
fn spawn(
    l: &StepLaunch,
    env: &[(String, String)],
    umask: u32,
    account: Option<&identity::Account>,
    cgroup_procs: &[std::path::PathBuf],
    takes_stdin: bool,
    node_hostname: Option<&str>,
    agent_hosts_file: Option<&std::path::Path>,
    pty: Option<&std::os::fd::OwnedFd>,
    inside: Option<&Inside>,
    pmi_fd: Option<i32>,
    bound: Option<&Binding>,
) -> std::io::Result<std::process::Child> {
    use std::ffi::CString;
    let argv = inside.map_or(l.argv.as_slice(), |i| i.argv.as_slice());
    let program = argv.first().ok_or_else(|| std::io::Error::other("no command"))?;
    let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or("/usr/bin:/bin");
    let resolved = if let Some(i) = inside {
        std::path::PathBuf::from(&i.program)
    } else if program.contains('/') {
        std::path::PathBuf::from(program)
    } else {
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| std::path::Path::new(d).join(program))
            .find(|p| p.is_file())
            .ok_or_else(|| std::io::Error::other(format!("'{program}' is not found on the task's PATH ({path})")))?
    };
    let procs = crate::as_user::cgroup_files(cgroup_procs)?;
    let cwd = CString::new(inside.map_or(l.work_dir.as_str(), |i| i.cwd.as_str())).map_err(std::io::Error::other)?;
    let enter = inside.map(|i| i.enter.clone());
    let affinity = bound.map(|b| (b.set, b.report.clone()));
    let ids = account.map(|a| (a.uid, a.gid, a.groups.clone()));
    let hostname = match node_hostname {
        Some(n) => Some(CString::new(n).map_err(std::io::Error::other)?),
        None => None,
    };
    let hosts = match agent_hosts_file {
        Some(f) => Some(CString::new(f.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?),
        None => None,
    };
    let mut cmd = std::process::Command::new(&resolved);
    cmd.arg0(program)
        .args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(if takes_stdin { std::process::Stdio::piped() } else { std::process::Stdio::null() })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let terminal = pty.is_some();
    if let Some(slave) = pty {
        cmd.stdin(slave.try_clone()?).stdout(slave.try_clone()?).stderr(slave.try_clone()?);
    }
    // SAFETY: between fork and exec only async-signal-safe calls run (setpgid, open, write,
    // close, setgroups, setgid, setuid, chdir, umask, sched_setaffinity, getpid) on memory
    // prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            // On a terminal: a session of its own with the terminal as its controlling one (job
            // control, ^C); otherwise a process group of its own.
            if terminal {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(name) = &hostname {
                if !supervisor::set_hostname(name, hosts.as_ref()) {
                    return Err(std::io::Error::last_os_error());
                }
            }
            crate::as_user::join_cgroups(&procs)?;
            if let Some(e) = &enter {
                if !e.root() {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(ids) = &ids {
                crate::as_user::become_ids(ids)?;
            }
            if let Some(e) = &enter {
                if !e.user() {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::chdir(cwd.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::umask(umask as libc::mode_t);
            // `--cpu-bind`: the task's CPUs, said on its stderr when asked (`verbose`).
            if let Some((set, report)) = &affinity {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some((before, after)) = report {
                    let mut digits = [0u8; 12];
                    let pid = decimal(libc::getpid() as u32, &mut digits);
                    for part in [before.as_slice(), pid, after.as_slice()] {
                        libc::write(2, part.as_ptr().cast(), part.len());
                    }
                }
            }
            // The task's end of its PMI socket stays open across exec, at the number PMI_FD says.
            if let Some(fd) = pmi_fd {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// A task's `--cpu-bind`: its CPUs as the kernel takes them, the variables Slurm sets, and with
/// `verbose` the line it writes (Slurm's words, the task's pid between the two parts).
pub(crate) struct Binding {
    set: libc::cpu_set_t,
    cpus: Vec<u32>,
    kind: String,
    verbose: bool,
    report: Option<(Vec<u8>, Vec<u8>)>,
}

impl Binding {
    fn new(b: &quorum_model::cpu_bind::CpuBind, cpus: &[u32], node: &str, task: u32, local: u32) -> Binding {
        use quorum_model::cpu_bind::mask_text;
        // SAFETY: a cpu_set_t is plain bits; CPU_ZERO and CPU_SET only write within it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for c in cpus.iter().filter(|c| (**c as usize) < libc::CPU_SETSIZE as usize) {
            unsafe { libc::CPU_SET(*c as usize, &mut set) };
        }
        let shown = quorum_model::cpu_bind::CpuBind { verbose: false, ..b.clone() }.to_string();
        let label = if b.binds() { "MASK" } else { "NONE" };
        let report = b.verbose.then(|| {
            (
                format!("cpu-bind={label} - {node}, task {task:2} {local:2} [").into_bytes(),
                format!("]: mask {} set\n", mask_text(cpus)).into_bytes(),
            )
        });
        Binding { set, cpus: cpus.to_vec(), kind: shown, verbose: b.verbose, report }
    }

    /// `SLURM_CPU_BIND*`, as Slurm's task/affinity sets them for each task.
    fn environment(&self) -> Vec<(&'static str, String)> {
        let verbose = if self.verbose { "verbose" } else { "quiet" };
        let mask = quorum_model::cpu_bind::mask_text(&self.cpus);
        vec![
            ("SLURM_CPU_BIND", format!("{verbose},{}", self.kind)),
            ("SLURM_CPU_BIND_TYPE", format!("{},", self.kind.split(':').next().unwrap_or_default())),
            ("SLURM_CPU_BIND_LIST", mask),
            ("SLURM_CPU_BIND_VERBOSE", verbose.into()),
        ]
    }
}

/// `n` in decimal, written into `buf` without allocating (between fork and exec).
fn decimal(mut n: u32, buf: &mut [u8; 12]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// The CPUs this agent may run on (where the job has no cpuset of its own).
fn own_cpus() -> Vec<u32> {
    // SAFETY: sched_getaffinity fills the set it is given, which lives here.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize).filter(|c| unsafe { libc::CPU_ISSET(*c, &set) }).map(|c| c as u32).collect()
}

/// Each CPU with its socket and core, from sysfs (a CPU it does not describe is a core of its
/// own).
fn places(cpus: &[u32]) -> Vec<(u32, quorum_model::cpu_bind::Place)> {
    let read = |cpu: u32, file: &str| {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{file}"))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
    };
    cpus.iter()
        .map(|c| {
            let socket = read(*c, "physical_package_id").unwrap_or(0);
            let core = read(*c, "core_id").map_or(u32::MAX - *c, |k| k);
            (*c, quorum_model::cpu_bind::Place { socket, core })
        })
        .collect()
}

/// Waits for task `pid` to end and reaps it: its wait status and what it used (itself and every
/// process it waited for). A pidfd says when it has ended; without one (a kernel before 5.3) a
/// blocking thread waits.
async fn reap(pid: i32) -> std::io::Result<(libc::c_int, libc::rusage)> {
    // SAFETY: pidfd_open takes a pid and flags, and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd >= 0 {
        // SAFETY: a descriptor pidfd_open just returned, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: the OwnedFd moves into the AsyncFd, which alone closes it, when dropped.
        let ready = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        loop {
            let mut guard = ready.readable().await?;
            if let Some(ended) = wait4(pid, libc::WNOHANG)? {
                return Ok(ended);
            }
            guard.clear_ready();
        }
    }
    tokio::task::spawn_blocking(move || wait4(pid, 0))
        .await
        .map_err(std::io::Error::other)?
        .and_then(|r| r.ok_or_else(|| std::io::Error::other("wait4 returned without the task")))
}

/// `wait4(pid, flags)`: the status and usage of `pid` once it has ended (`None` with `WNOHANG`
/// while it runs).
fn wait4(pid: i32, flags: libc::c_int) -> std::io::Result<Option<(libc::c_int, libc::rusage)>> {
    let mut status = 0;
    // SAFETY: rusage is plain data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child, with pointers to live locals.
        match unsafe { libc::wait4(pid, &mut status, flags, &mut usage) } {
            0 => return Ok(None),
            r if r == pid => return Ok(Some((status, usage))),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
        }
    }
}

/// What a task's `wait4` says it used.
fn task_usage(u: &libc::rusage) -> quorum_proto::api::JobUsage {
    let micros = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
    quorum_proto::api::JobUsage {
        cpu_user_us: micros(u.ru_utime),
        cpu_system_us: micros(u.ru_stime),
        max_rss_kb: u.ru_maxrss.max(0) as u64,
        ..Default::default()
    }
}

/// A pseudo-terminal pair (master, slave) of `window`'s size.
fn open_pty(window: Option<&quorum_proto::api::StepWindow>) -> std::io::Result<(OwnedFd, OwnedFd)> {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (-1, -1);
    let size =
        window.map(|w| libc::winsize { ws_row: w.rows as u16, ws_col: w.cols as u16, ws_xpixel: 0, ws_ypixel: 0 });
    let size_ptr = size.as_ref().map_or(std::ptr::null(), |s| s as *const libc::winsize);
    // SAFETY: openpty writes two descriptors; the name and termios arguments may be null.
    if unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), size_ptr) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just opened and are owned by nobody else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [&master, &slave] {
        // SAFETY: fcntl on a descriptor we own.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok((master, slave))
}

/// Resizes a step's terminal (`srun --pty` saw its own change).
fn resize(pty: &OwnedFd, w: &quorum_proto::api::StepWindow) {
    let size = libc::winsize { ws_row: w.rows as u16, ws_col: w.cols as u16, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads a winsize from the pointer given.
    unsafe { libc::ioctl(pty.as_raw_fd(), libc::TIOCSWINSZ, &size) };
}

/// Forwards a task's output and input, then reports its exit once all its output is sent.
fn watch(agent: Arc<Agent>, l: StepLaunch, task: u32, mut child: std::process::Child, pty: Option<OwnedFd>) {
    let key = (l.job_id, l.step_id);
    let mut terminal_reader = None;
    let pid = child.id();
    {
        let mut steps = agent.lock_steps();
        let entry = steps.entry(key).or_default();
        entry.pgids.push(pid as i32);
        agent.track_rss(pid as i32);
        if entry.killed {
            supervisor::signal_group(pid as i32, libc::SIGKILL);
        }
        if let Some(master) = pty {
            let (reader, writer) = match (master.try_clone(), master.try_clone()) {
                (Ok(r), Ok(w)) => (r, w),
                _ => return,
            };
            let mut writer = tokio::fs::File::from_std(std::fs::File::from(writer));
            terminal_reader = Some(tokio::fs::File::from_std(std::fs::File::from(reader)));
            entry.pty = Some(Arc::new(master));
            let (mut rx, waiting) = input_queue(entry);
            tokio::spawn(async move {
                while let Some(Some(data)) = rx.recv().await {
                    if writer.write_all(&data).await.is_err() || writer.flush().await.is_err() {
                        break;
                    }
                    waiting.fetch_sub(data.len(), Ordering::Relaxed);
                }
            });
        }
        if let Some(mut stdin) = child.stdin.take().and_then(|s| pipe::Sender::from_owned_fd(s.into()).ok()) {
            let (mut rx, waiting) = input_queue(entry);
            tokio::spawn(async move {
                while let Some(Some(data)) = rx.recv().await {
                    if stdin.write_all(&data).await.is_err() {
                        break;
                    }
                    waiting.fetch_sub(data.len(), Ordering::Relaxed);
                }
            });
        }
    }
    let stdout = child.stdout.take().and_then(|s| pipe::Receiver::from_owned_fd(s.into()).ok());
    let stderr = child.stderr.take().and_then(|s| pipe::Receiver::from_owned_fd(s.into()).ok());
    let readers: Vec<_> = [stdout.map(Pipe::Out), stderr.map(Pipe::Err), terminal_reader.map(Pipe::Terminal)]
        .into_iter()
        .flatten()
        .map(|pipe| {
            let (agent, l) = (agent.clone(), l.clone());
            tokio::spawn(async move { forward(&agent, &l, task, pipe).await })
        })
        .collect();
    tokio::spawn(async move {
        let ended = reap(pid as i32).await;
        for r in readers {
            let _ = r.await;
        }
        // The most the task's processes held together at a heartbeat's sample, where more than
        // its largest one reached.
        let peak = agent.take_rss_peak(pid as i32);
        let used = |u: &libc::rusage| {
            let mut usage = task_usage(u);
            usage.max_rss_kb = usage.max_rss_kb.max(peak);
            usage
        };
        let (exit_code, signal, usage) = match ended {
            Ok((status, u)) if libc::WIFSIGNALED(status) => (0, libc::WTERMSIG(status), Some(used(&u))),
            Ok((status, u)) => (libc::WEXITSTATUS(status), 0, Some(used(&u))),
            Err(e) => {
                tracing::warn!(job = l.job_id, step = l.step_id, task, error = %e, "waiting for a step's task");
                (0, libc::SIGKILL, None)
            }
        };
        // Whatever the task left in its group goes with it.
        supervisor::signal_group(pid as i32, libc::SIGKILL);
        {
            let mut steps = agent.lock_steps();
            if let Some(e) = steps.get_mut(&key) {
                e.pgids.retain(|&p| p as u32 != pid);
                if task == 0 {
                    e.stdin = None;
                    e.pty = None;
                }
            }
        }
        tracing::debug!(job = l.job_id, step = l.step_id, task, exit_code, signal, "step task ended");
        // The last task here saves the container (`--container-save`) before its exit is told,
        // so that the file is there when srun returns.
        let error = container_task_gone(&agent, &l).await.unwrap_or_default();
        let exit = StepTaskExit { job_id: l.job_id, step_id: l.step_id, task, exit_code, signal, error, usage };
        send(&agent, agent_message::Msg::StepExit(exit)).await;
        forget_if_idle(&agent, key);
    });
}

enum Pipe {
    Out(pipe::Receiver),
    Err(pipe::Receiver),
    /// A terminal's master side: its output (errors too), until its last process closes it.
    Terminal(tokio::fs::File),
}

async fn forward(agent: &Agent, l: &StepLaunch, task: u32, pipe: Pipe) {
    let mut buf = vec![0u8; CHUNK];
    let (mut reader, stderr): (Box<dyn tokio::io::AsyncRead + Unpin + Send>, bool) = match pipe {
        Pipe::Out(o) => (Box::new(o), false),
        Pipe::Err(e) => (Box::new(e), true),
        Pipe::Terminal(t) => (Box::new(t), false),
    };
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let out = StepOutput { job_id: l.job_id, step_id: l.step_id, task, stderr, data: buf[..n].to_vec() };
        send(agent, agent_message::Msg::StepOutput(out)).await;
    }
}

/// `srun`'s input and signals for a step's tasks here.
pub(crate) fn io(agent: &Agent, io: StepIo) {
    let mut steps = agent.lock_steps();
    let Some(entry) = steps.get_mut(&(io.job_id, io.step_id)) else { return };
    match io.msg {
        Some(step_io::Msg::Stdin(data)) => {
            let Some(input) = &mut entry.stdin else { return };
            if !input.push(data) && !input.told {
                input.told = true;
                let note = format!(
                    "quorum-agent: task 0 has {} MiB of input it has not read; what srun sends beyond that is dropped\n",
                    MAX_WAITING_INPUT >> 20
                );
                tracing::warn!(
                    job = io.job_id,
                    step = io.step_id,
                    "a step's input is dropped: task 0 does not read it"
                );
                let out = StepOutput {
                    job_id: io.job_id,
                    step_id: io.step_id,
                    task: 0,
                    stderr: true,
                    data: note.into_bytes(),
                };
                let _ = agent.outbox.try_send(AgentMessage { msg: Some(agent_message::Msg::StepOutput(out)) });
            }
        }
        Some(step_io::Msg::StdinEof(_)) => {
            if let Some(input) = &entry.stdin {
                let _ = input.tx.send(None);
            }
        }
        Some(step_io::Msg::Window(w)) => {
            if let Some(pty) = &entry.pty {
                resize(pty, &w);
            }
        }
        Some(step_io::Msg::Pmi(x)) => {
            if let Some(pmix) = &entry.pmix {
                pmix.arrive_exchange(x);
            } else if let Some(pmi) = &entry.pmi {
                pmi.arrive(x.node_id, x.seq, x.pairs.into_iter().map(|p| (p.key, p.value)).collect());
            }
        }
        Some(step_io::Msg::Signal(signal)) if (1..=64).contains(&signal) => {
            entry.killed |= signal == libc::SIGKILL;
            for &pgid in &entry.pgids {
                supervisor::signal_group(pgid, signal);
            }
        }
        _ => {}
    }
}
