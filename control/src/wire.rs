//! Conversions between the wire types of `quorum-proto` and the domain model, for the services
//! (`server`) and the agent hub (`leader::hub`) alike.

use quorum_proto::agent::{ExitKind, JobExit};
use quorum_proto::api;

use crate::model::{Job, JobSpec, Program, RankOutcome, Rejection};

/// A submitted spec as the model holds it. Shape errors are left to [`JobSpec::check_shape`].
pub fn spec_from_proto(p: api::JobSpec) -> Result<JobSpec, Rejection> {
    // With a script, `argv` holds the script's arguments.
    let (program, script_args) = match (p.argv.is_empty(), p.script.is_empty()) {
        (false, true) => (Program::Argv(p.argv), Vec::new()),
        (_, false) => (Program::Script(p.script), p.argv),
        (true, true) => (Program::Argv(Vec::new()), Vec::new()),
    };
    let opt = |s: String| (!s.is_empty()).then_some(s);
    let deps = crate::model::parse_dependencies(&p.dependency)
        .map_err(|reason| Rejection::InvalidSpec { field: "dependency".into(), reason })?;
    if p.work_dir.is_empty() || !p.work_dir.starts_with('/') {
        return Err(Rejection::InvalidSpec {
            field: "work_dir".into(),
            reason: format!("'{}' is not an absolute path", p.work_dir),
        });
    }
    // One more than a job may have is enough for admission to refuse it by name.
    let limit = crate::model::het::MAX_COMPONENTS + 1;
    let mut het: Vec<_> = p.het.into_iter().take(limit).map(component_from_proto).collect();
    // A component names a partition of its own only where it is not the job's.
    for c in &mut het {
        if c.partition.as_deref() == Some(p.partition.as_str()) {
            c.partition = None;
        }
    }
    Ok(JobSpec {
        // A heterogeneous job runs its script once too, on component 0's first node.
        batch_step: (p.nodes > 1 || !het.is_empty()) && !p.every_node,
        het,
        interactive: p.interactive,
        name: p.name,
        partition: opt(p.partition),
        nodes: p.nodes,
        ntasks: p.ntasks,
        cpus_per_task: p.cpus_per_task,
        mem_per_node_mb: (p.mem_per_node_mb > 0).then_some(p.mem_per_node_mb),
        gpus_per_node: p.gpus_per_node,
        gpu_type: opt(p.gpu_type),
        time_limit_s: (p.time_limit_s > 0).then_some(p.time_limit_s),
        program,
        work_dir: p.work_dir.clone(),
        stdout: opt(p.stdout),
        stderr: opt(p.stderr),
        env: p.env.into_iter().map(|e| (e.name, e.value)).collect(),
        submit_dir: opt(p.submit_dir).unwrap_or(p.work_dir),
        dependencies: deps.list,
        singleton: deps.singleton,
        dependency_any: deps.any,
        begin_time: (p.begin_time_ms > 0).then_some(p.begin_time_ms),
        qos: opt(p.qos),
        account: opt(p.account),
        nice: p.nice,
        constraint: p.constraint.into_iter().filter(|c| !c.is_empty()).collect(),
        constraint_any: p.constraint_any || p.constraint_same,
        constraint_same: p.constraint_same,
        constraint_counts: p.constraint_counts,
        priority: p.priority,
        licenses: p.licenses.into_iter().collect(),
        kill_on_invalid_dep: p.kill_on_invalid_dep,
        run_group: opt(p.group),
        reservation: opt(p.reservation),
        container: p.container.map(container_from_proto),
        exclusive: p.exclusive,
        oversubscribe: p.oversubscribe,
        overcommit: p.overcommit,
        hold: p.hold,
        requeue: p.requeue,
        warn_signal: match p.signal.trim() {
            "" => None,
            s => Some(
                crate::model::WarnSignal::parse(s)
                    .map_err(|reason| Rejection::InvalidConfig { what: format!("--signal '{s}'"), reason })?,
            ),
        },
        notes: crate::model::JobNotes {
            comment: p.comment,
            wckey: p.wckey,
            mail_type: p.mail_type,
            mail_user: p.mail_user,
        },
        append_output: p.append_output,
        exclude: p.exclude,
        nodelist: p.nodelist,
        script_args,
        array: match p.array.trim() {
            "" => None,
            s => Some(
                crate::model::ArraySpec::parse(s)
                    .map_err(|reason| Rejection::InvalidSpec { field: "array".into(), reason })?,
            ),
        },
    })
}

/// A GPU's health as an agent reported it, as `quorum nodes` and `/metrics` name it.
pub use quorum_proto::gpu_state_name;

/// A component of a heterogeneous job: what it asks for.
fn component_from_proto(c: api::HetComponent) -> crate::model::het::HetComponent {
    crate::model::het::HetComponent {
        nodes: c.nodes,
        ntasks: c.ntasks,
        cpus_per_task: c.cpus_per_task,
        mem_per_node_mb: (c.mem_per_node_mb > 0).then_some(c.mem_per_node_mb),
        gpus_per_node: c.gpus_per_node,
        gpu_type: (!c.gpu_type.is_empty()).then_some(c.gpu_type),
        constraint: c.constraint.into_iter().filter(|f| !f.is_empty()).collect(),
        constraint_any: c.constraint_any || c.constraint_same,
        constraint_same: c.constraint_same,
        constraint_counts: c.constraint_counts,
        exclusive: c.exclusive,
        exclude: c.exclude,
        nodelist: c.nodelist,
        partition: (!c.partition.is_empty()).then_some(c.partition),
    }
}

/// A component of a heterogeneous job as the wire carries it: its resources.
fn component_to_proto(c: &crate::model::het::HetComponent) -> api::HetComponent {
    api::HetComponent {
        nodes: c.nodes,
        ntasks: c.ntasks,
        cpus_per_task: c.cpus_per_task,
        mem_per_node_mb: c.mem_per_node_mb.unwrap_or(0),
        gpus_per_node: c.gpus_per_node,
        gpu_type: c.gpu_type.clone().unwrap_or_default(),
        constraint: c.constraint.clone(),
        constraint_any: c.constraint_any,
        constraint_same: c.constraint_same,
        constraint_counts: c.constraint_counts.clone(),
        exclusive: c.exclusive,
        exclude: c.exclude.clone(),
        nodelist: c.nodelist.clone(),
        partition: c.partition.clone().unwrap_or_default(),
    }
}

/// `with_env` false leaves the submit environment out (it is large, and a listing shows none).
pub fn spec_to_proto(s: &JobSpec, with_env: bool) -> api::JobSpec {
    let (argv, script) = match &s.program {
        Program::Argv(a) => (a.clone(), String::new()),
        Program::Script(sc) => (s.script_args.clone(), sc.clone()),
    };
    api::JobSpec {
        name: s.name.clone(),
        partition: s.partition.clone().unwrap_or_default(),
        nodes: s.nodes,
        ntasks: s.ntasks,
        cpus_per_task: s.cpus_per_task,
        mem_per_node_mb: s.mem_per_node_mb.unwrap_or(0),
        gpus_per_node: s.gpus_per_node,
        gpu_type: s.gpu_type.clone().unwrap_or_default(),
        time_limit_s: s.time_limit_s.unwrap_or(0),
        argv,
        script,
        work_dir: s.work_dir.clone(),
        stdout: s.stdout.clone().unwrap_or_default(),
        stderr: s.stderr.clone().unwrap_or_default(),
        env: match with_env {
            true => s.env.iter().map(|(name, value)| api::EnvVar { name: name.into(), value: value.into() }).collect(),
            false => Vec::new(),
        },
        submit_dir: s.submit_dir.clone(),
        dependency: dependency_string(s),
        begin_time_ms: s.begin_time.unwrap_or(0),
        hold: s.hold,
        qos: s.qos.clone().unwrap_or_default(),
        account: s.account.clone().unwrap_or_default(),
        nice: s.nice,
        constraint: s.constraint.clone(),
        constraint_any: s.constraint_any,
        constraint_same: s.constraint_same,
        constraint_counts: s.constraint_counts.clone(),
        priority: s.priority,
        licenses: s.licenses.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        kill_on_invalid_dep: s.kill_on_invalid_dep,
        group: s.run_group.clone().unwrap_or_default(),
        reservation: s.reservation.clone().unwrap_or_default(),
        exclusive: s.exclusive,
        oversubscribe: s.oversubscribe,
        overcommit: s.overcommit,
        requeue: s.requeue,
        signal: s.warn_signal.map(|w| w.to_spec()).unwrap_or_default(),
        array: s.array.as_ref().map(|a| a.to_spec()).unwrap_or_default(),
        every_node: s.nodes > 1 && !s.batch_step,
        interactive: s.interactive,
        comment: s.notes.comment.clone(),
        wckey: s.notes.wckey.clone(),
        mail_type: s.notes.mail_type.clone(),
        mail_user: s.notes.mail_user.clone(),
        append_output: s.append_output,
        exclude: s.exclude.clone(),
        nodelist: s.nodelist.clone(),
        het: s.het.iter().map(component_to_proto).collect(),
        container: s.container.as_ref().map(container_to_proto),
    }
}

pub fn container_from_proto(c: api::Container) -> crate::model::container::Container {
    crate::model::container::Container {
        image: c.image,
        mounts: c.mounts,
        workdir: c.workdir,
        name: c.name,
        save: c.save,
        mount_home: c.mount_home,
        remap_root: c.remap_root,
        readonly: c.readonly,
        env: c.env,
        entrypoint: c.entrypoint,
    }
}

pub fn container_to_proto(c: &crate::model::container::Container) -> api::Container {
    api::Container {
        image: c.image.clone(),
        mounts: c.mounts.clone(),
        workdir: c.workdir.clone(),
        name: c.name.clone(),
        save: c.save.clone(),
        mount_home: c.mount_home,
        remap_root: c.remap_root,
        readonly: c.readonly,
        env: c.env.clone(),
        entrypoint: c.entrypoint,
    }
}

pub fn array_to_proto(a: &crate::model::ArrayTask) -> api::ArrayTask {
    api::ArrayTask {
        array_job_id: a.array_job_id,
        task_id: a.task_id,
        count: a.count,
        min: a.min,
        max: a.max,
        throttle: a.throttle,
    }
}

/// The spec's dependencies in `--dependency` syntax.
pub fn dependency_string(s: &JobSpec) -> String {
    crate::model::dependency_string(&s.dependencies, s.singleton, s.dependency_any)
}

/// The job's `Reason`, as Slurm shows it: why a pending job waits (or why it was cancelled
/// unstarted, when its dependency could never be met), and why an ended job ended badly
/// ([`crate::model::EndReason`]). A hold is known at once: a held job does not wake the
/// scheduler, so until a cycle runs its recorded reason is still None.
pub fn shown_reason(j: &crate::model::Job) -> String {
    use crate::model::{EndReason, JobState, PendingReason};
    match (j.state, j.held, j.reason) {
        (JobState::Pending, Some(hold), PendingReason::None) => hold.reason().name().to_string(),
        (JobState::Pending, _, r) => r.name().to_string(),
        // Cancelled by `--kill-on-invalid-dep=yes`: why, as Slurm shows it.
        (JobState::Cancelled, _, r @ PendingReason::DependencyNeverSatisfied) => r.name().to_string(),
        // Why it could not start, as its node said (Slurm's state description).
        (JobState::Failed, _, _) if j.failure.is_some() => j.failure.clone().unwrap_or_default(),
        _ => EndReason::of(j).map_or_else(String::new, |r| r.name().to_string()),
    }
}

/// A job for display; `with_env` false leaves the submit environment out (it is large).
pub fn job_to_proto(j: &Job, with_env: bool) -> api::JobInfo {
    let spec = spec_to_proto(&j.spec, with_env);
    let allocation = j.allocation.as_ref();
    api::JobInfo {
        id: j.id,
        name: j.spec.name.clone(),
        user: j.user.clone(),
        partition: j.partition.clone(),
        state: j.state.name().to_string(),
        reason: shown_reason(j),
        spec: Some(spec),
        submit_time_ms: j.submit_time,
        start_time_ms: j.start_time.unwrap_or(0),
        end_time_ms: j.end_time.unwrap_or(0),
        has_exit_code: j.exit_code.is_some(),
        exit_code: j.exit_code.unwrap_or(0),
        signal: j.signal.unwrap_or(0),
        allocation: allocation
            .map(|a| {
                a.nodes
                    .iter()
                    .map(|n| api::NodeAllocation {
                        node: n.node.clone(),
                        cpus: n.cpus,
                        mem_mb: n.mem_mb,
                        gpus: n.gpus.clone(),
                        het_group: n.het_group,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        nodelist: allocation.map(|a| a.nodelist()).unwrap_or_default(),
        alloc_index: j.alloc_index,
        time_limit_s: j.spec.time_limit_s.unwrap_or(0),
        cancel_requested: j.cancel_requested,
        expected_start_ms: 0,
        expected_nodes: String::new(),
        account: j.account.clone(),
        qos: j.qos.clone(),
        held: match j.held {
            Some(crate::model::HoldKind::User) => "USER".into(),
            Some(crate::model::HoldKind::Admin) => "ADMIN".into(),
            None => String::new(),
        },
        requeues: j.requeues,
        preempted_by: j.preempted_by.unwrap_or(0),
        preempting_for: j.preempting.as_ref().map_or(0, |p| p.by),
        claimed_nodes: j.claim.as_ref().map(|c| crate::model::hostlist::compress(&c.nodes)).unwrap_or_default(),
        gpu_idle_since_ms: 0,
        // Set by the listings from the leader's forecasts.
        expected_forecast: false,
        forecast_at_ms: 0,
        shown_first_ms: j.shown.map_or(0, |s| s.first_ms),
        shown_last_ms: j.shown.map_or(0, |s| s.last_ms),
        cancelled_by: j.cancelled_by.clone().unwrap_or_default(),
        usage: crate::model::JobUsage::total(j.usage, j.step_usage).map(usage_to_proto),
        batch_usage: j.usage.map(usage_to_proto),
        array: j.array.as_ref().map(array_to_proto),
        steps: j
            .steps
            .iter()
            .map(|s| api::StepInfo {
                id: s.id,
                name: s.name.clone(),
                state: s.state.name().to_string(),
                nodelist: crate::model::hostlist::compress(&s.node_names()),
                ntasks: s.ntasks,
                cpus_per_task: s.cpus_per_task,
                gpus_per_task: s.gpus_per_task,
                start_time_ms: s.start,
                end_time_ms: s.end.unwrap_or(0),
                has_exit_code: s.exit_code.is_some(),
                exit_code: s.exit_code.unwrap_or(0),
                signal: s.signal.unwrap_or(0),
                usage: s.usage.map(usage_to_proto),
            })
            .collect(),
    }
}

/// A job as listings show it: of its script only the first line (`quorum show` has it all),
/// no environment, and its command only when short, so that no one job can fill a page.
pub fn listed(mut info: api::JobInfo) -> api::JobInfo {
    info.steps.clear();
    fn cut(text: &mut String, max: usize) {
        let mut end = text.len().min(max);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    if let Some(spec) = info.spec.as_mut() {
        if let Some(newline) = spec.script.find('\n') {
            spec.script.truncate(newline);
        }
        cut(&mut spec.script, 256);
        spec.env.clear();
        if spec.argv.iter().map(String::len).sum::<usize>() > 4096 {
            spec.argv.truncate(1);
            if let Some(first) = spec.argv.first_mut() {
                cut(first, 4096);
            }
        }
    }
    info
}

fn usage_to_proto(u: crate::model::JobUsage) -> api::JobUsage {
    api::JobUsage {
        cpu_user_us: u.cpu_user_us,
        cpu_system_us: u.cpu_system_us,
        max_rss_kb: u.max_rss_kb,
        gpu_samples: u.gpu_samples,
        gpu_util_sum: u.gpu_util_sum,
        gpu_mem_max_mb: u.gpu_mem_max_mb,
        gpu_energy_mj: u.gpu_energy_mj,
    }
}

/// What an agent's exit report says the job used on its node.
pub fn usage(u: Option<&api::JobUsage>) -> Option<crate::model::JobUsage> {
    u.map(|u| crate::model::JobUsage {
        cpu_user_us: u.cpu_user_us,
        cpu_system_us: u.cpu_system_us,
        max_rss_kb: u.max_rss_kb,
        gpu_samples: u.gpu_samples,
        gpu_util_sum: u.gpu_util_sum,
        gpu_mem_max_mb: u.gpu_mem_max_mb,
        gpu_energy_mj: u.gpu_energy_mj,
    })
}

/// How an agent's exit report says a job's process on its node ended.
pub fn outcome(exit: &JobExit) -> RankOutcome {
    let (code, signal) = (exit.exit_code, exit.signal);
    match ExitKind::try_from(exit.kind).unwrap_or(ExitKind::Exited) {
        ExitKind::TimedOut => RankOutcome::TimedOut { code, signal },
        ExitKind::Cancelled => RankOutcome::Cancelled { code, signal },
        ExitKind::LaunchFailed => RankOutcome::LaunchFailed,
        ExitKind::OutOfMemory => RankOutcome::OutOfMemory { code, signal },
        ExitKind::LeaseExpired => RankOutcome::LostContact,
        ExitKind::PrologFailed => RankOutcome::PrologFailed,
        ExitKind::Exited | ExitKind::Unspecified => RankOutcome::Exited { code, signal },
    }
}

/// A TRES limit for the API (absent when it limits nothing).
pub fn tres_limit_to_proto(t: &crate::model::TresLimit) -> Option<api::TresLimit> {
    let out = api::TresLimit { cpus: t.cpus, gpus: t.gpus, mem_mb: t.mem_mb, nodes: t.nodes };
    (out != api::TresLimit::default()).then_some(out)
}

/// A budget of TRES-minutes for the API (absent when there is none).
pub fn tres_mins_to_proto(t: &crate::model::TresMins) -> Option<api::TresMins> {
    (t.cpu.is_some() || t.gpu.is_some()).then_some(api::TresMins { cpu: t.cpu, gpu: t.gpu })
}

/// An account as the API shows it (`sacctmgr show account`).
pub fn account_to_proto(a: &crate::model::Account) -> api::AccountSpec {
    let l = &a.limits;
    api::AccountSpec {
        name: a.name.clone(),
        parent: a.parent.clone().unwrap_or_default(),
        shares: a.shares,
        users: a.users.iter().cloned().collect(),
        max_jobs: l.max_jobs,
        grp_gpus: l.grp_gpus,
        grp_cpus: l.grp_cpus,
        max_wall_s: l.max_wall_s,
        grp_mem_mb: l.grp_mem_mb,
        grp_nodes: l.grp_nodes,
        grp_gpus_by_type: l.grp_gpus_by_type.clone().into_iter().collect(),
        max_tres_per_job: tres_limit_to_proto(&l.max_tres_per_job),
        max_submit_jobs: l.max_submit_jobs,
        grp_tres_mins: tres_mins_to_proto(&l.grp_tres_mins),
        user_shares: a.user_shares.clone().into_iter().collect(),
        qos: a.qos.clone(),
        default_qos: a.default_qos.clone().unwrap_or_default(),
    }
}

/// A QOS as the API shows it (`sacctmgr show qos`).
pub fn qos_to_proto(q: &crate::model::Qos) -> api::QosSpec {
    api::QosSpec {
        name: q.name.clone(),
        priority: q.priority,
        max_wall_s: q.max_wall_s,
        max_gpus_per_user: q.max_gpus_per_user,
        max_jobs_per_user: q.max_jobs_per_user,
        max_tres_per_job: tres_limit_to_proto(&q.max_tres_per_job),
        max_tres_per_user: tres_limit_to_proto(&q.max_tres_per_user),
        grp_tres: tres_limit_to_proto(&q.grp_tres),
        grp_jobs: q.grp_jobs,
        grp_tres_mins: tres_mins_to_proto(&q.grp_tres_mins),
        max_submit_jobs_per_user: q.max_submit_jobs_per_user,
        no_decay: q.no_decay,
    }
}

/// A TRES limit from the API; absent: no limit.
pub fn tres_limit(t: Option<api::TresLimit>) -> crate::model::TresLimit {
    let t = t.unwrap_or_default();
    crate::model::TresLimit { cpus: t.cpus, gpus: t.gpus, mem_mb: t.mem_mb, nodes: t.nodes }
}

/// A budget of TRES-minutes from the API; absent: no budget.
pub fn tres_mins(t: Option<api::TresMins>) -> crate::model::TresMins {
    let t = t.unwrap_or_default();
    crate::model::TresMins { cpu: t.cpu, gpu: t.gpu }
}
