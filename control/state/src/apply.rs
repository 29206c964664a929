//! [`apply`]: the only writer of [`ClusterState`], one command at a time, and what each
//! command does.

use std::collections::BTreeMap;

use quorum_model::preempt::{Claim, PlannedPreemption, PreemptMode, Preempting, Victim};
use quorum_model::update::JobUpdate;
use quorum_model::{
    step, Account, Allocation, ArrayTask, Completing, HoldKind, Job, JobId, JobSpec, JobState, Millis, Node,
    NodeAdminState, Partition, PendingReason, PlannedStart, RankOutcome, Rejection, Shared,
};

use crate::cluster::{ClusterState, DEFAULT_ACCOUNT, DEFAULT_QOS};
use crate::commands::{
    Command, DropReason, NodeRegistration, NodeUpdate, Response, CANCELLED_BY_LEVEL, HET_PARTITIONS_LEVEL,
    NODE_CHOICE_LEVEL, NODE_LIST_PART_LEVEL,
};
use crate::digest::digest;

/// Applies one committed command at log index `index`. Deterministic; see the module comment.
pub fn apply(state: &mut ClusterState, index: u64, command: Command) -> Response {
    match command {
        Command::SubmitJob { spec, user, now, request_id } => {
            advance_clock(state, now);
            submit(state, *spec, user, request_id)
        }
        Command::SubmitJobs { submits, now } => {
            advance_clock(state, now);
            Response::SubmittedMany(submits.into_iter().map(|s| submit(state, *s.spec, s.user, s.request_id)).collect())
        }
        Command::Batch { commands } => {
            Response::Batch(commands.into_iter().map(|command| apply(state, index, command)).collect())
        }
        Command::ApplyPlan { starts, reasons, now, preemptions, resumes, shown, .. } => {
            advance_clock(state, now);
            for job_id in resumes {
                resume_lent(state, job_id);
            }
            match apply_plan(state, index, starts, reasons, shown) {
                Response::PlanApplied { started, dropped, .. } => {
                    let preempted = preemptions.into_iter().flat_map(|p| preempt(state, p)).collect();
                    Response::PlanApplied { started, dropped, preempted }
                }
                other => other,
            }
        }
        Command::JobFailure { job_id, token, why } => match state.jobs.get_mut(&job_id) {
            Some(job) if job.alloc_index == token && job.failure.is_none() => {
                job.failure = Some(why.chars().take(MAX_FAILURE_CHARS).collect());
                Response::Ok
            }
            _ => Response::Ignored,
        },
        Command::SetNodeHealth { node, problem, now } => {
            advance_clock(state, now);
            set_node_health(state, &node, problem)
        }
        Command::JobEnded { job_id, token, node, outcome, now } => {
            advance_clock(state, now);
            job_ended(state, job_id, token, &node, outcome)
        }
        Command::CancelJob { job_id, user, now, whole_array } => {
            advance_clock(state, now);
            if whole_array {
                cancel_array(state, job_id, &user)
            } else {
                cancel(state, job_id, &user)
            }
        }
        Command::RegisterNode { node, now } => {
            advance_clock(state, now);
            register_node(state, node);
            Response::Ok
        }
        Command::SetPartitions { partitions, now } => {
            advance_clock(state, now);
            state.partitions = partitions.into_iter().map(|p| (p.name.clone(), p)).collect();
            Response::Ok
        }
        Command::SeedPartitions { partitions, now } => {
            advance_clock(state, now);
            if state.partitions_seeded {
                return Response::Ignored;
            }
            state.partitions = partitions.into_iter().map(|p| (p.name.clone(), p)).collect();
            state.partitions_seeded = true;
            Response::Ok
        }
        Command::PutPartition { partition, previous, now } => {
            advance_clock(state, now);
            put_partition(state, partition, previous)
        }
        Command::DeletePartition { name, now } => {
            advance_clock(state, now);
            delete_partition(state, &name)
        }
        Command::UpdateNodes { nodes, update, now } => {
            advance_clock(state, now);
            update_nodes(state, &nodes, update)
        }
        Command::SetPolicy { policy, now } => {
            advance_clock(state, now);
            state.policy = policy;
            Response::Ok
        }
        Command::SetLicenses { licenses, now } => {
            advance_clock(state, now);
            state.licenses = licenses;
            Response::Ok
        }
        Command::SetTopology { switches, now } => {
            advance_clock(state, now);
            state.switches = switches;
            Response::Ok
        }
        Command::SeedAccounts { accounts, qos, now } => {
            advance_clock(state, now);
            if state.accounts.is_empty() && state.qos.is_empty() {
                state.accounts = accounts.into_iter().map(|a| (a.name.clone(), a)).collect::<BTreeMap<_, _>>().into();
                state.qos = qos.into_iter().map(|q| (q.name.clone(), q)).collect::<BTreeMap<_, _>>().into();
            }
            Response::Ok
        }
        Command::UpsertAccount { account, now } => {
            advance_clock(state, now);
            match check_account(state, &account) {
                Ok(()) => {
                    state.accounts.insert(account.name.clone(), account);
                    Response::Ok
                }
                Err(r) => Response::Rejected(r),
            }
        }
        Command::UpsertQos { qos, now } => {
            advance_clock(state, now);
            state.qos.insert(qos.name.clone(), qos);
            Response::Ok
        }
        Command::HoldJob { job_id, user, now } => {
            advance_clock(state, now);
            hold(state, job_id, &user)
        }
        Command::ReleaseJob { job_id, user, now } => {
            advance_clock(state, now);
            release(state, job_id, &user)
        }
        Command::RequeueJob { job_id, user, now } => {
            advance_clock(state, now);
            requeue(state, job_id, &user)
        }
        Command::SuspendJob { job_id, user, resume, now } => {
            advance_clock(state, now);
            match suspend(state, job_id, &user, resume) {
                Ok(()) => Response::Suspended { job_id, resumed: resume },
                Err(r) => Response::Rejected(r),
            }
        }
        Command::UpdateJob { job_id, user, update, now } => {
            advance_clock(state, now);
            match update_job(state, job_id, &user, &update) {
                Ok(()) => Response::Updated { job_id },
                Err(r) => Response::Rejected(r),
            }
        }
        Command::NodeDown { node, reason, now } => {
            advance_clock(state, now);
            node_down(state, &node, reason, false)
        }
        // The state is left exactly as it was, clock included.
        Command::Digest { now: _ } => Response::Digest { digest: digest(state) },
        Command::SetNodesDrained { nodes, drain, now } => {
            advance_clock(state, now);
            set_drained(state, &nodes, drain)
        }
        Command::SetReplicaVersions { versions, now } => {
            advance_clock(state, now);
            state.replica_versions = versions;
            Response::Ok
        }
        Command::StartStep { job_id, user, request, now, expect } => {
            advance_clock(state, now);
            start_step(state, job_id, &user, &request, expect.as_ref())
        }
        Command::EndStep { job_id, step_id, exit_code, signal, cancelled, now, usage } => {
            advance_clock(state, now);
            end_step(state, job_id, step_id, StepEnd { exit_code, signal, cancelled, usage })
        }
        Command::EndAllocation { job_id, user, exit_code, now } => {
            advance_clock(state, now);
            end_allocation(state, job_id, &user, exit_code)
        }
        Command::JobUsed { job_id, token, node, usage } => job_used(state, job_id, token, &node, usage),
        Command::PurgeJobs { jobs, min_age, now } => {
            advance_clock(state, now);
            crate::reserve::purge_expired(state);
            crate::purge::purge(state, jobs, min_age)
        }
        Command::ForgetHistory { ended_before, max } => Response::ForgetHistory { ended_before, max },
        Command::RecallJobs { jobs, now } => {
            advance_clock(state, now);
            crate::purge::recall(state, jobs)
        }
        Command::CreateReservation { request, user, now } => {
            advance_clock(state, now);
            reserved(crate::reserve::reserve(state, &request, &user, false))
        }
        Command::UpdateReservation { request, user, now } => {
            advance_clock(state, now);
            reserved(crate::reserve::reserve(state, &request, &user, true))
        }
        Command::AddCron { entry, now } => {
            advance_clock(state, now);
            add_cron(state, *entry)
        }
        Command::RemoveCron { id, user, now } => {
            advance_clock(state, now);
            match state.cron.get(&id) {
                None => Response::Rejected(Rejection::Cron { id, reason: "no such entry".into() }),
                Some(e) if e.user != user && user != "root" => Response::Rejected(Rejection::Cron {
                    id,
                    reason: format!("it is another user's; '{user}' may not remove it"),
                }),
                Some(_) => {
                    state.cron.remove(&id);
                    Response::Ok
                }
            }
        }
        Command::FireCron { id, due_ms, next_ms, now } => {
            advance_clock(state, now);
            fire_cron(state, id, due_ms, next_ms)
        }
        Command::DeleteReservation { name, user, now } => {
            advance_clock(state, now);
            match crate::reserve::delete(state, &name, &user) {
                Ok(()) => Response::Ok,
                Err(r) => Response::Rejected(r),
            }
        }
        Command::SetRole { user, role, now } => {
            advance_clock(state, now);
            if user.is_empty() {
                return Response::Rejected(Rejection::InvalidConfig {
                    what: "role".into(),
                    reason: "empty user name".into(),
                });
            }
            if role == quorum_model::Role::User {
                state.roles.remove(&user);
            } else {
                state.roles.insert(user, role);
            }
            Response::Ok
        }
    }
}

/// An account's parent must exist and must not be the account itself or below it.
fn check_account(state: &ClusterState, account: &Account) -> Result<(), Rejection> {
    let bad = |reason: String| Rejection::InvalidConfig { what: format!("account '{}'", account.name), reason };
    if account.name.is_empty() {
        return Err(bad("empty name".into()));
    }
    let mut parent = account.parent.clone();
    let mut hops = 0;
    while let Some(p) = parent {
        if p == account.name {
            return Err(bad("it would be its own ancestor".into()));
        }
        let a = state.accounts.get(&p).ok_or_else(|| bad(format!("parent '{p}' does not exist")))?;
        parent = a.parent.clone();
        hops += 1;
        if hops > 64 {
            return Err(bad("the account tree is deeper than 64 levels".into()));
        }
    }
    Ok(())
}

/// The longest reason a job's failure keeps.
const MAX_FAILURE_CHARS: usize = 512;

fn owned_pending_job<'a>(state: &'a mut ClusterState, job_id: JobId, user: &str) -> Result<&'a mut Job, Rejection> {
    let job = state.jobs.get_mut(&job_id).ok_or(Rejection::UnknownJob { id: job_id })?;
    if user != job.user && user != "root" {
        return Err(Rejection::NotOwner { id: job_id, user: user.to_string(), owner: job.user.clone() });
    }
    if job.state != JobState::Pending {
        return Err(Rejection::NotPending { id: job_id, state: job.state });
    }
    Ok(job)
}

fn hold(state: &mut ClusterState, job_id: JobId, user: &str) -> Response {
    match owned_pending_job(state, job_id, user) {
        Ok(job) => {
            // root's hold is an administrator's hold, which only root can release
            let kind = if user == "root" && job.user != "root" { HoldKind::Admin } else { HoldKind::User };
            job.held = Some(job.held.map_or(kind, |k| k.max(kind)));
            Response::Held { job_id }
        }
        Err(r) => Response::Rejected(r),
    }
}

fn release(state: &mut ClusterState, job_id: JobId, user: &str) -> Response {
    match owned_pending_job(state, job_id, user) {
        Ok(job) if job.held == Some(HoldKind::Admin) && user != "root" => {
            Response::Rejected(Rejection::AdminHold { id: job_id })
        }
        Ok(job) => {
            job.held = None;
            Response::Released { job_id }
        }
        Err(r) => Response::Rejected(r),
    }
}

/// `scontrol requeue` by its owner or root: a running job back to the queue, as when it loses a
/// node with `--requeue`; a pending job stays as it is; a finished one is refused.
fn requeue(state: &mut ClusterState, job_id: JobId, user: &str) -> Response {
    let Some(job) = state.jobs.get(&job_id) else {
        return Response::Rejected(Rejection::UnknownJob { id: job_id });
    };
    if user != job.user && user != "root" {
        return Response::Rejected(Rejection::NotOwner { id: job_id, user: user.to_string(), owner: job.user.clone() });
    }
    match job.state {
        JobState::Running | JobState::Suspended if job.cancel_requested => {
            Response::Rejected(Rejection::JobFinished { id: job_id, state: JobState::Cancelled })
        }
        JobState::Running | JobState::Suspended => {
            requeue_job(state, job_id);
            Response::Requeued { job_id }
        }
        JobState::Pending => Response::Requeued { job_id },
        finished => Response::Rejected(Rejection::JobFinished { id: job_id, state: finished }),
    }
}

/// `scontrol suspend|resume` by an operator: a running job becomes SUSPENDED (its agents
/// freeze it) and a suspended one RUNNING again, its time limit lengthened by the time it was
/// suspended.
fn suspend(state: &mut ClusterState, job_id: JobId, user: &str, resume: bool) -> Result<(), Rejection> {
    let clock = state.clock;
    let job = state.jobs.get_mut(&job_id).ok_or(Rejection::UnknownJob { id: job_id })?;
    if user != "root" {
        let what = if resume { "resume" } else { "suspend" };
        return Err(Rejection::OperatorOnly { what: format!("{what} a job (job {job_id})") });
    }
    if let Some(p) = job.preempting.as_ref().filter(|p| !p.mode.stops() && !job.cancel_requested) {
        return Err(Rejection::SuspendedByPreemption { id: job_id, by: p.by });
    }
    if job.cancel_requested || job.preempting.is_some() {
        return Err(Rejection::JobFinished { id: job_id, state: JobState::Cancelled });
    }
    match (job.state, resume) {
        (JobState::Running, false) => {
            job.state = JobState::Suspended;
            job.suspended_at = Some(clock);
            Ok(())
        }
        (JobState::Suspended, true) => {
            let since = job.suspended_at.take().unwrap_or(clock);
            job.suspended_ms = job.suspended_ms.saturating_add(clock.saturating_sub(since));
            job.state = JobState::Running;
            Ok(())
        }
        (JobState::Pending, _) => Err(Rejection::NotRunning { id: job_id, state: JobState::Pending }),
        (JobState::Running, true) | (JobState::Suspended, false) => Ok(()),
        (finished, _) => Err(Rejection::JobFinished { id: job_id, state: finished }),
    }
}

/// `scontrol update` of `job_id` by `user` (its owner, or `root` for an operator), all or
/// nothing. As Slurm: a job that ended cannot change; a running one only its time limit, name
/// and comment; a pending one also its partition, QOS, account, nice, dependencies and node
/// count, each checked as its submit was. Only operators raise a time limit, set a negative
/// nice or make a job's limit exceed its partition's.
fn update_job(state: &mut ClusterState, job_id: JobId, user: &str, update: &JobUpdate) -> Result<(), Rejection> {
    let job = state.jobs.get(&job_id).ok_or(Rejection::UnknownJob { id: job_id })?;
    if user != job.user && user != "root" {
        return Err(Rejection::NotOwner { id: job_id, user: user.to_string(), owner: job.user.clone() });
    }
    let operator = user == "root";
    match job.state {
        JobState::Pending => {}
        JobState::Running | JobState::Suspended if !job.cancel_requested => {
            if let Some(field) = update.pending_only().first() {
                return Err(Rejection::NotChangeable { id: job_id, state: job.state, field: field.to_string() });
            }
        }
        JobState::Running | JobState::Suspended => {
            return Err(Rejection::JobFinished { id: job_id, state: JobState::Cancelled })
        }
        finished => return Err(Rejection::JobFinished { id: job_id, state: finished }),
    }
    let mut spec = JobSpec::clone(&job.spec);
    let old_limit = spec.time_limit_s;
    if let Some(change) = update.time_limit {
        spec.time_limit_s = change.applied_to(old_limit);
        let raised = match (old_limit, spec.time_limit_s) {
            (Some(old), Some(new)) => new > old,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if raised && !operator {
            return Err(Rejection::OperatorOnly {
                what: format!(
                    "raise a job's time limit (job {job_id}: {} to {}); its owner may lower it",
                    limit_text(old_limit),
                    limit_text(spec.time_limit_s)
                ),
            });
        }
    }
    if let Some(n) = update.nice {
        if n < 0 && !operator {
            return Err(Rejection::OperatorOnly { what: format!("set a negative nice ({n})") });
        }
        spec.nice = n;
    }
    if let Some(name) = &update.name {
        spec.name = name.clone();
    }
    if let Some(comment) = &update.comment {
        spec.notes.comment = comment.clone();
    }
    if let Some(d) = &update.dependencies {
        if d.list.iter().any(|dep| dep.job == job_id) {
            return Err(Rejection::InvalidSpec {
                field: "dependency".into(),
                reason: "a job cannot wait for itself".into(),
            });
        }
        (spec.dependencies, spec.singleton, spec.dependency_any) = (d.list.clone(), d.singleton, d.any);
    }
    if let Some(nodes) = update.nodes {
        // One task a node (the default) stays one task a node.
        if spec.ntasks == spec.nodes {
            spec.ntasks = nodes;
        }
        spec.nodes = nodes;
    }
    let (mut partition, mut account, mut qos) = (job.partition.clone(), job.account.clone(), job.qos.clone());
    if job.state == JobState::Pending {
        if let Some(r) = &update.reservation {
            spec.reservation = r.clone();
        }
        if let Some(p) = &update.partition {
            spec.partition = Some(p.clone());
        }
        if let Some(q) = &update.qos {
            spec.qos = Some(q.clone());
        } else if state.cluster_level() >= crate::commands::QOS_ACCESS_LEVEL {
            // It keeps its QOS, whatever the default of the account it moves to.
            spec.qos = Some(job.qos.clone());
        }
        spec.account = Some(update.account.clone().unwrap_or_else(|| account.clone()));
        // The partition's time limit binds the owner, not an operator (Slurm's rule for
        // updates): an operator's limit is kept out of admit's comparison and put back.
        let limit = spec.time_limit_s;
        if operator {
            spec.time_limit_s = limit.map(|_| 0);
        }
        partition = admit(state, &mut spec)?;
        if operator && limit.is_some() {
            spec.time_limit_s = limit;
            spec.check_shape()?;
        }
        let owner = job.user.clone();
        let nice = std::mem::take(&mut spec.nice);
        (account, qos) = admit_association(state, &spec, &owner)?;
        check_partitions_access(state, &partition, &spec, &account, &qos)?;
        spec.nice = nice;
        // Moved to another account or QOS: its submit limits hold there too, as Slurm's do.
        if (account.as_str(), qos.as_str()) != (job.account.as_str(), job.qos.as_str()) {
            check_submit_limits(state, &owner, &account, &qos, 1, Some(job_id))?;
        }
    } else {
        spec.check_shape()?;
    }
    let job = state.jobs.get_mut(&job_id).expect("looked up above");
    (job.partition, job.account, job.qos) = (partition, account, qos);
    // A new value, not the old one changed in place: the scheduler's cached views of the job
    // notice a spec that is not the one they were made from.
    job.spec = Shared::new(spec);
    Ok(())
}

/// `AddCron`: the entry's job is checked as its owner's submit would be, now; it gets the next
/// id. A cluster and a user have a bounded number of entries.
fn add_cron(state: &mut ClusterState, mut entry: quorum_model::cron::CronEntry) -> Response {
    use quorum_model::cron::{MAX_ENTRIES, MAX_PER_USER};
    let id = state.next_cron_id.max(1);
    let full = |reason: String| Response::Rejected(Rejection::Cron { id, reason });
    if state.cron.len() >= MAX_ENTRIES {
        return full(format!("the cluster has {MAX_ENTRIES} cron entries, its most"));
    }
    if state.cron.values().filter(|e| e.user == entry.user).count() >= MAX_PER_USER {
        return full(format!("user '{}' has {MAX_PER_USER} cron entries, the most one user may", entry.user));
    }
    if let Err(r) = check_submit(state, entry.spec.clone(), &entry.user) {
        return Response::Rejected(r);
    }
    (entry.id, entry.added_ms, entry.fired) = (id, state.clock, 0);
    (entry.last_fired_ms, entry.last_job, entry.last_error) = (None, None, None);
    state.next_cron_id = id + 1;
    state.cron.insert(id, entry);
    Response::CronAdded { id }
}

/// `FireCron`: the entry's job, submitted once for the firing due at `due_ms` (its request id
/// names the firing), and the entry moved on to `next_ms`.
fn fire_cron(state: &mut ClusterState, id: u64, due_ms: Millis, next_ms: Millis) -> Response {
    let Some(entry) = state.cron.get(&id).filter(|e| e.next_ms == due_ms) else {
        return Response::Ignored;
    };
    let (mut spec, user) = (entry.spec.clone(), entry.user.clone());
    // The job knows which entry and which firing it runs for (the time it was due, in seconds
    // since the epoch), however late it started.
    let (id_text, due_text) = (id.to_string(), (due_ms / 1000).to_string());
    let added = [("QUORUM_CRON_ID", id_text.as_str()), ("QUORUM_CRON_TIME", due_text.as_str())];
    spec.env = quorum_model::env::Env::new(spec.env.iter().chain(added));
    let answer = submit(state, spec, user, format!("cron-{id}-{due_ms}"));
    let clock = state.clock;
    let entry = state.cron.get_mut(&id).expect("looked up above");
    entry.next_ms = next_ms.max(due_ms.saturating_add(1));
    entry.fired += 1;
    entry.last_fired_ms = Some(clock);
    match answer {
        Response::Submitted { job_id, .. } => {
            (entry.last_job, entry.last_error) = (Some(job_id), None);
            Response::CronFired { id, job: Some(job_id), error: None }
        }
        Response::Rejected(r) => {
            entry.last_error = Some(r.to_string());
            Response::CronFired { id, job: None, error: Some(r.to_string()) }
        }
        other => other,
    }
}

fn reserved(made: Result<quorum_model::reservation::Reservation, Rejection>) -> Response {
    match made {
        Ok(r) => Response::Reserved { reservation: Box::new(r) },
        Err(r) => Response::Rejected(r),
    }
}

fn limit_text(limit: Option<u64>) -> String {
    limit.map_or_else(|| "UNLIMITED".to_string(), quorum_model::parse::format_duration)
}

fn advance_clock(state: &mut ClusterState, now: Millis) {
    state.clock = state.clock.max(now);
}

fn submit(state: &mut ClusterState, mut spec: JobSpec, user: String, request_id: String) -> Response {
    if !request_id.is_empty() {
        if let Some(&job_id) = state.request_ids.get(request_id.as_str()) {
            return Response::Submitted { job_id, duplicate: true };
        }
    }
    let array = spec.array.take();
    if let Some(a) = &array {
        if let Err(reason) = a.check() {
            return Response::Rejected(Rejection::InvalidSpec { field: "array".into(), reason });
        }
    }
    let (partition, account, qos) = match admit(state, &mut spec).and_then(|p| {
        let (account, qos) = admit_association(state, &spec, &user)?;
        check_partitions_access(state, &p, &spec, &account, &qos)?;
        Ok((p, account, qos))
    }) {
        Ok(admitted) => admitted,
        Err(rejection) => return Response::Rejected(rejection),
    };
    let adding = array.as_ref().map_or(1, |a| a.tasks().len() as u32);
    if let Err(rejection) = check_queue_limits(state, array.as_ref(), adding)
        .and_then(|()| check_submit_limits(state, &user, &account, &qos, adding, None))
    {
        return Response::Rejected(rejection);
    }
    let first = state.next_job_id;
    if !request_id.is_empty() {
        state.request_ids.insert(request_id.as_str().into(), first);
    }
    // One job, or one per task of the array, with consecutive ids, sharing one spec.
    let held = spec.hold;
    let spec = Shared::new(spec);
    let tasks: Vec<Option<ArrayTask>> = match &array {
        None => vec![None],
        Some(a) => {
            let ids = a.tasks();
            let (min, max) = (ids[0], ids[ids.len() - 1]);
            let count = ids.len() as u32;
            let task = |task_id| ArrayTask { array_job_id: first, task_id, count, min, max, throttle: a.throttle };
            ids.into_iter().map(|t| Some(task(t))).collect()
        }
    };
    // A heterogeneous job's components have the ids after its own (Slurm's `HetJobIdSet`).
    let components = spec.components() as u64;
    for array in tasks {
        let id = state.next_job_id;
        state.next_job_id += components;
        state.active.insert(id);
        state.active_by_user.add(&user, 1);
        let job = Job {
            id,
            spec: spec.clone(),
            user: user.clone(),
            partition: partition.clone(),
            state: JobState::Pending,
            reason: PendingReason::None,
            submit_time: state.clock,
            start_time: None,
            end_time: None,
            exit_code: None,
            signal: None,
            allocation: None,
            alloc_index: 0,
            cancel_requested: false,
            rank_outcomes: Vec::new(),
            request_id: request_id.clone(),
            held: held.then_some(HoldKind::User),
            account: account.clone(),
            qos: qos.clone(),
            requeues: 0,
            array,
            steps: Vec::new(),
            next_step: 0,
            cancelled_by: None,
            usage: None,
            step_usage: None,
            preempting: None,
            preempted_by: None,
            claim: None,
            suspended_at: None,
            suspended_ms: 0,
            resv_end: None,
            failure: None,
            shown: None,
        };
        state.jobs.insert(id, Shared::new(job));
    }
    Response::Submitted { job_id: first, duplicate: false }
}

/// What the whole cluster holds at once ([`quorum_model::QueueLimits`]): `MaxArraySize` (task
/// ids below it) and `MaxJobCount` (active jobs, each array task one), as Slurm's controller
/// refuses a submit past them.
fn check_queue_limits(
    state: &ClusterState,
    array: Option<&quorum_model::ArraySpec>,
    adding: u32,
) -> Result<(), Rejection> {
    let limits = state.policy.queue;
    if let (Some(max), Some(a)) = (limits.max_array_size, array) {
        let highest = a.tasks().last().copied().unwrap_or(0);
        if highest >= max {
            return Err(Rejection::InvalidSpec {
                field: "array".into(),
                reason: format!(
                    "task id {highest} is not below this cluster's MaxArraySize={max} (task ids 0 to {})",
                    max.saturating_sub(1)
                ),
            });
        }
    }
    if let Some(max) = limits.max_job_count {
        let have = state.active.len();
        if have.saturating_add(adding as usize) > max as usize {
            return Err(Rejection::QueueFull { have: have as u64, adding, max });
        }
    }
    Ok(())
}

/// Whether partition `name` admits jobs of `account` and `qos` (its `AllowAccounts` and the
/// others), as Slurm checks at submit and at an update.
fn check_partition_access(state: &ClusterState, name: &str, account: &str, qos: &str) -> Result<(), Rejection> {
    let Some(access) = state.partitions.get(name).map(|p| &p.access) else {
        return Ok(());
    };
    if let Some(rule) = access.refuses_account(account) {
        return Err(Rejection::AccountNotAllowed { partition: name.into(), account: account.into(), rule });
    }
    if let Some(rule) = access.refuses_qos(qos) {
        return Err(Rejection::QosNotAllowed { partition: name.into(), qos: qos.into(), rule });
    }
    Ok(())
}

/// Resolves the account and QOS a job runs under, and checks what only the state can tell:
/// that its dependencies name known jobs, and that only root raises priority with `nice`.
/// `MaxSubmitJobs` (the nearest in the account's chain: an account's limit holds for each user
/// of it and of its sub-accounts, as Slurm's user associations inherit it) and the QOS's
/// `MaxSubmitJobsPerUser`: how many jobs (array tasks each) a user may have pending or running.
/// Counting walks the active jobs (but `moving`, a job an update moves to `account` or `qos`),
/// and only when such a limit applies.
fn check_submit_limits(
    state: &ClusterState,
    user: &str,
    account: &str,
    qos: &str,
    adding: u32,
    moving: Option<JobId>,
) -> Result<(), Rejection> {
    if state.cluster_level() < crate::commands::USER_SHARES_LEVEL {
        return Ok(());
    }
    let mut chain = Some(account);
    let mut by_account = None;
    for _ in 0..64 {
        let Some(acc) = chain.and_then(|a| state.accounts.get(a)) else { break };
        if let Some(m) = acc.limits.max_submit_jobs {
            by_account = Some((acc.name.as_str(), m));
            break;
        }
        chain = acc.parent.as_deref();
    }
    let by_qos = state.qos.get(qos).and_then(|q| q.max_submit_jobs_per_user);
    if by_account.is_none() && by_qos.is_none() {
        // The cluster's default cap on each user, unless the job only moves (its user keeps
        // as many jobs).
        let Some(m) = state.policy.queue.max_submit_jobs_per_user.filter(|_| moving.is_none()) else {
            return Ok(());
        };
        let have = state.active_by_user.of(user);
        if have.saturating_add(adding) > m {
            let limit = format!("MaxSubmitJobs={m} per user of this cluster");
            return Err(Rejection::SubmitLimit { user: user.into(), limit, have });
        }
        return Ok(());
    }
    let (mut in_account, mut in_qos) = (0u32, 0u32);
    let others = state.active.iter().filter(|id| Some(**id) != moving);
    for job in others.filter_map(|id| state.jobs.get(id)).filter(|j| j.user == user) {
        in_account += u32::from(job.account == account);
        in_qos += u32::from(job.qos == qos);
    }
    if let Some((name, m)) = by_account.filter(|(_, m)| in_account.saturating_add(adding) > *m) {
        let limit = format!("MaxSubmitJobs={m} of account '{name}' (for account '{account}')");
        return Err(Rejection::SubmitLimit { user: user.into(), limit, have: in_account });
    }
    if let Some(m) = by_qos.filter(|m| in_qos.saturating_add(adding) > *m) {
        let limit = format!("MaxSubmitJobsPerUser={m} of QOS '{qos}'");
        return Err(Rejection::SubmitLimit { user: user.into(), limit, have: in_qos });
    }
    Ok(())
}

fn admit_association(state: &ClusterState, spec: &JobSpec, user: &str) -> Result<(String, String), Rejection> {
    for dep in &spec.dependencies {
        if !state.knows_job(dep.job) {
            return Err(Rejection::InvalidSpec {
                field: "dependency".into(),
                reason: format!("job {} does not exist", dep.job),
            });
        }
    }
    if spec.nice < 0 && user != "root" {
        return Err(Rejection::InvalidSpec {
            field: "nice".into(),
            reason: format!("only root may set a negative nice ({})", spec.nice),
        });
    }
    let account =
        if state.accounts.is_empty() {
            match &spec.account {
                // From level 11, as Slurm without accounting does: the name is recorded, and
                // nothing is enforced.
                Some(a) if state.cluster_level() >= NODE_CHOICE_LEVEL => a.clone(),
                Some(a) if a != DEFAULT_ACCOUNT => {
                    return Err(Rejection::InvalidAccount {
                        account: a.clone(),
                        user: user.to_string(),
                        why: "no accounts are configured".into(),
                    })
                }
                _ => DEFAULT_ACCOUNT.to_string(),
            }
        } else {
            match &spec.account {
                Some(a) => {
                    let acc = state.accounts.get(a).ok_or_else(|| Rejection::InvalidAccount {
                        account: a.clone(),
                        user: user.to_string(),
                        why: "no such account".into(),
                    })?;
                    if !acc.users.contains(user) && user != "root" {
                        return Err(Rejection::InvalidAccount {
                            account: a.clone(),
                            user: user.to_string(),
                            why: "the user is not a member".into(),
                        });
                    }
                    a.clone()
                }
                None => state.accounts.values().find(|a| a.users.contains(user)).map(|a| a.name.clone()).ok_or_else(
                    || Rejection::InvalidAccount {
                        account: String::new(),
                        user: user.to_string(),
                        why: "the user belongs to no account; ask an operator to add them".into(),
                    },
                )?,
            }
        };
    // From level 27 a job that names no QOS gets its account's default, and the default QOS
    // is there whatever QOS are defined (defining the first one no longer takes it away).
    let level_27 = state.cluster_level() >= crate::commands::QOS_ACCESS_LEVEL;
    let qos = match &spec.qos {
        Some(q) => q.clone(),
        None if level_27 => crate::qos_access::default_qos(state, &account).to_string(),
        None => DEFAULT_QOS.to_string(),
    };
    let known = state.qos.is_empty() || state.qos.contains_key(&qos) || (level_27 && qos == DEFAULT_QOS);
    if !known {
        return Err(Rejection::InvalidQos { qos, known: state.qos.keys().cloned().collect::<Vec<_>>().join(", ") });
    }
    crate::reserve::admit(state, spec, user, &account)?;
    Ok((account, qos))
}

/// Every check a submit of `spec` by `user` makes against `state`, with nothing changed: the spec
/// as the job would have it (partition, defaults, account and QOS filled in), or why it would
/// be refused (`sbatch --test-only`).
pub fn check_submit(state: &ClusterState, mut spec: JobSpec, user: &str) -> Result<JobSpec, Rejection> {
    if let Some(a) = &spec.array {
        a.check().map_err(|reason| Rejection::InvalidSpec { field: "array".into(), reason })?;
    }
    let partition = admit(state, &mut spec)?;
    let (account, qos) = admit_association(state, &spec, user)?;
    check_partitions_access(state, &partition, &spec, &account, &qos)?;
    let adding = spec.array.as_ref().map_or(1, |a| a.tasks().len() as u32);
    check_queue_limits(state, spec.array.as_ref(), adding)?;
    check_submit_limits(state, user, &account, &qos, adding, None)?;
    (spec.account, spec.qos) = (Some(account), Some(qos));
    Ok(spec)
}

/// Resolves the partition and its defaults into `spec` and checks that the job could ever run
/// there; returns the partition's name.
fn admit(state: &ClusterState, spec: &mut JobSpec) -> Result<String, Rejection> {
    let level = state.cluster_level();
    if spec.overcommit && level < HET_PARTITIONS_LEVEL {
        return Err(Rejection::InvalidSpec {
            field: "overcommit".into(),
            reason: format!("--overcommit waits until every replica runs feature level {HET_PARTITIONS_LEVEL}"),
        });
    }
    if spec.het.is_empty() {
        return admit_one(state, spec);
    }
    spec.check_het()?;
    let mut partition = None;
    for k in 0..spec.components() {
        let mut component = spec.component(k).expect("k is below components()");
        let name = admit_one(state, &mut component).map_err(|r| in_component(k, r))?;
        spec.set_component(k, &component);
        spec.time_limit_s = component.time_limit_s;
        // The job's partition is its component 0's; the others keep theirs where it differs.
        if k == 0 {
            spec.partition = component.partition.clone();
            partition = Some(name);
        }
    }
    let name = partition.expect("a heterogeneous job has components");
    if spec.spans_partitions() && level < HET_PARTITIONS_LEVEL {
        return Err(Rejection::InvalidSpec {
            field: "het".into(),
            reason: format!(
                "components in partitions of their own wait until every replica runs feature level {HET_PARTITIONS_LEVEL}"
            ),
        });
    }
    // No node holds two components: each partition needs its components' nodes together.
    let mut wanted: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for k in 0..spec.components() {
        *wanted.entry(spec.partition_of(k).unwrap_or(&name)).or_default() += u64::from(spec.node_count_of(k));
    }
    for (part, total) in wanted {
        let have = state.partitions.get(part).map_or(0, |p| state.partition_nodes(p).count());
        if have > 0 && (have as u64) < total {
            return Err(Rejection::NeverFits {
                detail: format!(
                    "the components in partition '{part}' ask for {total} nodes together (no node holds two), and it has {have}"
                ),
            });
        }
    }
    Ok(name)
}

/// [`check_partition_access`] for the job's partition and each of its components' own.
fn check_partitions_access(
    state: &ClusterState,
    name: &str,
    spec: &JobSpec,
    account: &str,
    qos: &str,
) -> Result<(), Rejection> {
    check_partition_access(state, name, account, qos)?;
    for part in spec.het.iter().filter_map(|c| c.partition.as_deref()) {
        check_partition_access(state, part, account, qos)?;
    }
    Ok(())
}

/// `rejection`, saying which component of a heterogeneous job it is about.
fn in_component(k: usize, rejection: Rejection) -> Rejection {
    match rejection {
        Rejection::InvalidSpec { field, reason } => {
            Rejection::InvalidSpec { field: format!("{field} (component {k})"), reason }
        }
        Rejection::NeverFits { detail } => Rejection::NeverFits { detail: format!("component {k}: {detail}") },
        other => other,
    }
}

/// [`admit`] for one job, or one component of a heterogeneous job.
fn admit_one(state: &ClusterState, spec: &mut JobSpec) -> Result<String, Rejection> {
    spec.check_shape()?;
    let partition = match &spec.partition {
        Some(name) => state.partitions.get(name).ok_or_else(|| Rejection::UnknownPartition {
            name: name.clone(),
            known: state.partitions.keys().cloned().collect::<Vec<_>>().join(", "),
        })?,
        None => state.default_partition().ok_or(Rejection::NoDefaultPartition)?,
    };
    if !partition.state.takes_jobs() {
        return Err(Rejection::PartitionClosed {
            partition: partition.name.clone(),
            state: partition.state.name().into(),
        });
    }
    spec.partition = Some(partition.name.clone());
    for (name, &count) in &spec.licenses {
        let reason = match state.licenses.get(name) {
            None if state.licenses.is_empty() => format!("this cluster has no licenses; '{name}' is none of them"),
            None => format!(
                "this cluster has no license '{name}' (it has {})",
                state.licenses.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
            Some(&total) if count > total => format!("{count} of license '{name}', of which the cluster has {total}"),
            Some(_) => continue,
        };
        return Err(Rejection::InvalidSpec { field: "licenses".into(), reason });
    }
    if spec.time_limit_s.is_none() {
        spec.time_limit_s = partition.default_time_s.or(partition.max_time_s);
    }
    if let (Some(limit), Some(requested)) = (partition.max_time_s, spec.time_limit_s) {
        if requested > limit {
            return Err(Rejection::TimeLimitExceedsPartition {
                partition: partition.name.clone(),
                requested: quorum_model::parse::format_duration(requested),
                limit: quorum_model::parse::format_duration(limit),
            });
        }
    }
    let cpus = spec.cpus_per_node();
    let mem = *spec.mem_per_node_mb.get_or_insert(partition.default_mem_per_cpu_mb * u64::from(cpus));
    let gpu_type = spec.gpu_type.as_deref();
    // From level 11 the nodes a job may have are those with its features, not excluded, and of
    // its node list when it has one; before, only their resources counted.
    let choosing = state.cluster_level() >= NODE_CHOICE_LEVEL;
    if choosing {
        if let Some(missing) = spec.nodelist.iter().find(|n| !partition.node_names.contains(n.as_str())) {
            return Err(Rejection::InvalidSpec {
                field: "nodelist".into(),
                reason: format!("node '{missing}' is not in partition '{}'", partition.name),
            });
        }
    }
    if !spec.nodelist.is_empty() && !spec.lists_every_node() {
        // Some nodes named, the others chosen: from level 13; before, a job listed them all.
        if state.cluster_level() < NODE_LIST_PART_LEVEL {
            return Err(Rejection::InvalidSpec {
                field: "nodelist".into(),
                reason: format!(
                    "{} nodes listed for a job of {} nodes: until every replica runs feature level {NODE_LIST_PART_LEVEL}, a job lists all of its nodes",
                    spec.nodelist.len(),
                    spec.nodes
                ),
            });
        }
        let unfit = spec.nodelist.iter().find(|name| {
            !state.nodes.get(name.as_str()).is_none_or(|n| {
                spec.may_use(&n.name, &n.features) && n.could_hold(cpus, mem, spec.gpus_per_node, gpu_type)
            })
        });
        if let Some(name) = unfit {
            return Err(Rejection::NeverFits {
                detail: format!("node '{name}' of the node list cannot hold the job (its features or size)"),
            });
        }
    }
    let chosen = |n: &Node| !choosing || spec.may_use(&n.name, &n.features);
    if spec.constraint_same && spec.constraint.len() > 1 {
        // `[a|b]`: enough nodes that could hold the job must share one of the features.
        let most = spec
            .constraint
            .iter()
            .map(|f| {
                state
                    .partition_nodes(partition)
                    .filter(|n| chosen(n) && n.features.contains(f))
                    .filter(|n| n.could_hold(cpus, mem, spec.gpus_per_node, gpu_type))
                    .take(spec.nodes as usize)
                    .count()
            })
            .max()
            .unwrap_or(0);
        if most >= spec.nodes as usize || state.partition_nodes(partition).next().is_none() {
            return Ok(partition.name.clone());
        }
        return Err(Rejection::NeverFits {
            detail: format!(
                "no one feature of {} is on {} nodes of partition '{}' that could hold the job (at most {most})",
                quorum_model::constraint_string(&spec.constraint, true, true),
                spec.nodes,
                partition.name
            ),
        });
    }
    if spec.counts_features() && state.partition_nodes(partition).next().is_some() {
        // `[a*2&b*4]`: enough nodes that could hold the job have each feature, no node
        // counted for two.
        let with: Vec<&[String]> = state
            .partition_nodes(partition)
            .filter(|n| chosen(n) && spec.constraint.iter().any(|f| n.features.contains(f)))
            .filter(|n| n.could_hold(cpus, mem, spec.gpus_per_node, gpu_type))
            .map(|n| n.features.as_slice())
            .collect();
        if quorum_model::assign_feature_counts(&spec.constraint, &spec.constraint_counts, &with).is_none() {
            let short: Vec<String> = spec
                .constraint
                .iter()
                .zip(&spec.constraint_counts)
                .map(|(f, c)| (f, c, with.iter().filter(|n| n.contains(f)).count()))
                .filter(|(_, &c, have)| *have < c as usize)
                .map(|(f, c, have)| format!("{c} with '{f}' asked, {have} have it"))
                .collect();
            return Err(Rejection::NeverFits {
                detail: format!(
                    "too few nodes of partition '{}' that could hold the job have the features {}: {}",
                    partition.name,
                    spec.constraint_text(),
                    match short.is_empty() {
                        true => "no node can be counted for two features".to_string(),
                        false => short.join(", "),
                    }
                ),
            });
        }
    }
    // Stops at the first `nodes` capable nodes: admission costs the job's size, not the cluster's.
    let capable = state
        .partition_nodes(partition)
        .filter(|n| chosen(n) && n.could_hold(cpus, mem, spec.gpus_per_node, gpu_type))
        .take(spec.nodes as usize)
        .count();
    if capable >= spec.nodes as usize {
        return Ok(partition.name.clone());
    }
    let registered: Vec<&Node> = state.partition_nodes(partition).collect();
    if registered.is_empty() {
        // No node has registered yet, so nothing can be said about fit; the job waits.
        return Ok(partition.name.clone());
    }
    let eligible: Vec<&Node> = registered.iter().copied().filter(|n| chosen(n)).collect();
    if eligible.len() < registered.len() && eligible.len() < spec.nodes as usize {
        return Err(Rejection::NeverFits {
            detail: choice_detail(&partition.name, registered.len(), eligible.len(), spec),
        });
    }
    Err(Rejection::NeverFits { detail: never_fits_detail(&partition.name, &eligible, spec, cpus, mem) })
}

/// Why too few of a partition's `registered` nodes are ones the job may have.
fn choice_detail(partition: &str, registered: usize, eligible: usize, spec: &JobSpec) -> String {
    let mut why = Vec::new();
    if !spec.constraint.is_empty() && !spec.counts_features() {
        why.push(format!("have the features {}", spec.constraint_text()));
    }
    if !spec.exclude.is_empty() {
        why.push(format!("are not excluded ({})", spec.exclude.join(",")));
    }
    if !spec.nodelist.is_empty() {
        why.push(format!("are in the node list ({})", spec.nodelist.join(",")));
    }
    format!(
        "{eligible} of the {registered} nodes of partition '{partition}' {}, fewer than the {} requested",
        why.join(" and "),
        spec.nodes
    )
}

/// Names the first resource no node (or not enough nodes) of the partition has.
fn never_fits_detail(partition: &str, nodes: &[&Node], spec: &JobSpec, cpus: u32, mem: u64) -> String {
    let gpu_type = spec.gpu_type.as_deref();
    let max_cpus = nodes.iter().map(|n| n.cpus).max().unwrap_or(0);
    let max_mem = nodes.iter().map(|n| n.mem_mb).max().unwrap_or(0);
    let max_gpus = nodes.iter().map(|n| n.gpu_count(gpu_type)).max().unwrap_or(0);
    let gpu_words = match gpu_type {
        Some(t) => format!("GPUs of type {t}"),
        None => "GPUs".to_string(),
    };
    if cpus > max_cpus {
        format!("partition '{partition}' has no node with {cpus} CPUs; the largest has {max_cpus}")
    } else if mem > max_mem {
        format!(
            "partition '{partition}' has no node with {} of memory; the largest has {}",
            quorum_model::parse::format_mem_mb(mem),
            quorum_model::parse::format_mem_mb(max_mem)
        )
    } else if spec.gpus_per_node > max_gpus {
        format!(
            "partition '{partition}' has no node with {} {gpu_words}; the largest has {max_gpus}",
            spec.gpus_per_node
        )
    } else {
        format!(
            "partition '{partition}' has {} nodes, fewer than the {} requested that can each hold {cpus} CPUs, {} and {} {gpu_words}",
            nodes.len(),
            spec.nodes,
            quorum_model::parse::format_mem_mb(mem),
            spec.gpus_per_node
        )
    }
}

fn apply_plan(
    state: &mut ClusterState,
    index: u64,
    starts: Vec<PlannedStart>,
    reasons: Vec<(JobId, PendingReason)>,
    shown: Vec<(JobId, quorum_model::ShownStart)>,
) -> Response {
    let mut shown: BTreeMap<JobId, quorum_model::ShownStart> = shown.into_iter().collect();
    let mut started = Vec::new();
    let mut dropped = Vec::new();
    for start in starts {
        match check_start(state, &start) {
            Ok(resv_end) => {
                start_job(state, index, start.job_id, start.allocation, resv_end);
                // What it was shown before this start (a requeued job's earlier ones are gone).
                if let Some(job) = state.jobs.get_mut(&start.job_id) {
                    job.shown = shown.remove(&start.job_id);
                }
                started.push(start.job_id);
            }
            Err(why) => dropped.push((start.job_id, why)),
        }
    }
    let mut invalid = Vec::new();
    for (job_id, reason) in reasons {
        if let Some(job) = state.jobs.get_mut(&job_id) {
            if job.state == JobState::Pending {
                job.reason = reason;
                if reason == PendingReason::DependencyNeverSatisfied && job.spec.kill_on_invalid_dep {
                    invalid.push(job_id);
                }
            }
        }
    }
    // `--kill-on-invalid-dep=yes`: cancelled, keeping the reason, as Slurm shows it.
    for job_id in invalid {
        finish_job(state, job_id, JobState::Cancelled, None, None);
        if let Some(job) = state.jobs.get_mut(&job_id) {
            job.reason = PendingReason::DependencyNeverSatisfied;
        }
    }
    Response::PlanApplied { started, dropped, preempted: Vec::new() }
}

/// Marks the victims of a planned preemption, and gives the preemptor their nodes: all or
/// nothing, and nothing when the plan's view is stale (the preemptor no longer pending, a
/// victim no longer running, or already stopping for another job). Returns (victim, preemptor)
/// for each victim marked.
fn preempt(state: &mut ClusterState, p: PlannedPreemption) -> Vec<(JobId, JobId)> {
    let pending = state
        .jobs
        .get(&p.job_id)
        .is_some_and(|j| j.state == JobState::Pending && !j.cancel_requested && j.held.is_none());
    let stoppable = |v: &Victim| {
        state.jobs.get(&v.job_id).is_some_and(|j| {
            j.state == JobState::Running && !j.cancel_requested && j.preempting.is_none() && j.id != p.job_id
        })
    };
    if !pending || p.victims.is_empty() || !p.victims.iter().all(stoppable) {
        return Vec::new();
    }
    let at = state.clock;
    for v in &p.victims {
        let job = state.jobs.get_mut(&v.job_id).expect("checked above");
        // An allocation cannot be requeued or suspended (its owner's command holds it, and
        // waits on it): it is ended.
        let mode = if job.spec.interactive { PreemptMode::Cancel } else { v.mode };
        let grace_s = if mode.stops() { v.grace_s } else { 0 };
        job.preempting = Some(Preempting { by: p.job_id, at, mode, grace_s });
        if mode == PreemptMode::Suspend {
            // Frozen at once (its agents are told), holding its memory and GPUs; its CPUs are
            // the preemptor's until it is resumed.
            job.state = JobState::Suspended;
            job.suspended_at = Some(at);
            job.preempted_by = Some(p.job_id);
            if let Some(allocation) = &job.allocation {
                for a in &allocation.nodes {
                    if let Some(node) = state.nodes.get_mut(&a.node) {
                        node.release_cpus(a.cpus, allocation.ways());
                    }
                }
            }
        }
    }
    let job = state.jobs.get_mut(&p.job_id).expect("checked above");
    job.claim = Some(Claim { nodes: p.nodes });
    p.victims.iter().map(|v| (v.job_id, p.job_id)).collect()
}

/// Resumes a job suspended by preemption whose CPUs are free again on every node of its
/// allocation: it takes them back and runs on, its time limit lengthened by the pause. Nothing
/// when it is no longer such a job or a CPU is still taken (the plan's view was older).
fn resume_lent(state: &mut ClusterState, job_id: JobId) {
    let Some(job) = state.jobs.get(&job_id).filter(|j| j.lends_cpus() && !j.cancel_requested) else { return };
    let Some(allocation) = &job.allocation else { return };
    let ways = allocation.ways();
    let free = allocation.nodes.iter().all(|a| state.nodes.get(&a.node).is_some_and(|n| n.cpus_fit(a.cpus, ways)));
    if !free {
        return;
    }
    for a in &allocation.nodes {
        if let Some(node) = state.nodes.get_mut(&a.node) {
            node.hold_cpus(a.cpus, ways);
        }
    }
    let clock = state.clock;
    let job = state.jobs.get_mut(&job_id).expect("found above");
    let since = job.suspended_at.take().unwrap_or(clock);
    job.suspended_ms = job.suspended_ms.saturating_add(clock.saturating_sub(since));
    job.state = JobState::Running;
    job.preempting = None;
}

/// Re-checks a planned start against the current state (the plan was made from an older view).
fn check_start(state: &ClusterState, start: &PlannedStart) -> Result<Option<Millis>, DropReason> {
    let job = state.jobs.get(&start.job_id).ok_or(DropReason::JobGone { job: start.job_id })?;
    if job.state != JobState::Pending || job.cancel_requested {
        return Err(DropReason::JobNotPending { job: job.id, state: job.state });
    }
    // Held between the plan's view and now: its hold was acknowledged, so it does not start.
    if job.held.is_some() && state.cluster_level() >= crate::commands::HOLD_FENCE_LEVEL {
        return Err(DropReason::Held { job: job.id });
    }
    let allocs = &start.allocation.nodes;
    // Each component of a heterogeneous job on as many nodes as it asks for (one for others).
    let components: Vec<JobSpec> = (0..job.spec.components()).filter_map(|k| job.spec.component(k)).collect();
    for (k, c) in components.iter().enumerate() {
        let planned = start.allocation.group(k as u32).count();
        if planned != c.nodes as usize {
            return Err(DropReason::NodeCount { job: job.id, wanted: c.nodes, planned });
        }
    }
    if allocs.len() != job.spec.total_nodes() as usize {
        return Err(DropReason::NodeCount { job: job.id, wanted: job.spec.total_nodes(), planned: allocs.len() });
    }
    let partition = state
        .partitions
        .get(&job.partition)
        .ok_or_else(|| DropReason::PartitionGone { partition: job.partition.clone() })?;
    let ways = partition.cpu_ways(&job.spec);
    for (i, a) in allocs.iter().enumerate() {
        let node = || a.node.clone();
        let spec = &components[a.het_group as usize];
        if allocs[..i].iter().any(|b| b.node == a.node) {
            return Err(DropReason::NodeTwice { node: node() });
        }
        // A component in a partition of its own runs on that partition's nodes.
        let own = match spec.partition.as_deref() {
            Some(name) if name != partition.name => {
                state.partitions.get(name).ok_or_else(|| DropReason::PartitionGone { partition: name.to_string() })?
            }
            _ => partition,
        };
        if !own.node_names.contains(&a.node) {
            return Err(DropReason::NodeNotInPartition { node: node(), partition: own.name.clone() });
        }
        let n = state.nodes.get(&a.node).ok_or_else(|| DropReason::NodeUnknown { node: node() })?;
        if !n.schedulable() {
            return Err(DropReason::NodeNotSchedulable { node: node(), state: n.state().name().to_string() });
        }
        // The no-overcommit invariant: each job's CPUs divided by the ways it shares them
        // (`OverSubscribe`), summed, within the node's CPUs; memory within its memory.
        if !n.cpus_fit(a.cpus, ways) || n.alloc_mem_mb + a.mem_mb > n.mem_mb {
            return Err(DropReason::NodeFull { node: node() });
        }
        if a.cpus < spec.cpus_per_node() || a.mem_mb < spec.mem_per_node_mb.unwrap_or(0) {
            return Err(DropReason::TooSmall { node: node() });
        }
        if a.gpus.len() < spec.gpus_per_node as usize {
            return Err(DropReason::TooFewGpus { node: node() });
        }
        for (k, idx) in a.gpus.iter().enumerate() {
            let gpu = n
                .gpus
                .iter()
                .find(|g| g.index == *idx)
                .ok_or_else(|| DropReason::NoSuchGpu { node: node(), gpu: *idx })?;
            if spec.gpu_type.as_ref().is_some_and(|t| *t != gpu.gpu_type) {
                return Err(DropReason::GpuType { node: node(), gpu: *idx, gpu_type: gpu.gpu_type.clone() });
            }
            if n.alloc_gpus.contains(idx) || a.gpus[..k].contains(idx) {
                return Err(DropReason::GpuTaken { node: node(), gpu: *idx });
            }
        }
    }
    crate::reserve::check_start(state, job, &start.allocation)
}

fn start_job(
    state: &mut ClusterState,
    index: u64,
    job_id: JobId,
    mut allocation: Allocation,
    resv_end: Option<Millis>,
) {
    // How many ways it shares its CPUs is its partition's now, whatever the plan said.
    let ways = state.jobs.get(&job_id).and_then(|j| Some(state.partitions.get(&j.partition)?.cpu_ways(&j.spec)));
    allocation.cpu_ways = ways.filter(|&w| w > 1);
    for a in &allocation.nodes {
        let node = state.nodes.get_mut(&a.node).expect("checked by check_start");
        node.hold_cpus(a.cpus, allocation.ways());
        node.alloc_mem_mb += a.mem_mb;
        node.alloc_gpus.extend(a.gpus.iter().copied());
        node.jobs.insert(job_id);
    }
    let job = state.jobs.get_mut(&job_id).expect("checked by check_start");
    job.state = JobState::Running;
    job.reason = PendingReason::None;
    job.claim = None;
    job.start_time = Some(state.clock);
    job.resv_end = resv_end;
    job.allocation = Some(allocation);
    job.alloc_index = index;
}

/// Starts a step of a running job where [`step::layout`] puts it: the step gets the job's next
/// step id and holds its CPUs (and GPUs) until [`end_step`].
/// Where `request` would start in `job` now: the step with the next id (its `start` is left at
/// 0), or why not. Apply records what this gives; the leader calls it on its applied state to
/// launch a step while the entry that records it commits (`StartStep.expect`).
pub fn plan_step(job: &Job, user: &str, request: &step::StepRequest) -> Result<step::Step, Rejection> {
    let job_id = job.id;
    if user != job.user && user != "root" {
        return Err(Rejection::NotOwner { id: job_id, user: user.to_string(), owner: job.user.clone() });
    }
    let (JobState::Running, false, Some(allocation)) = (job.state, job.cancel_requested, job.allocation.as_ref())
    else {
        return Err(Rejection::NotRunning { id: job_id, state: job.state });
    };
    if job.steps.iter().filter(|s| s.state == step::StepState::Running).count() >= step::MAX_RUNNING_STEPS {
        return Err(Rejection::StepBusy {
            id: job_id,
            reason: format!("it runs {} steps already, the most at once", step::MAX_RUNNING_STEPS),
        });
    }
    // A heterogeneous job's step runs on the nodes of the components it names (component 0's
    // when it names none); another job's on all of its nodes.
    let groups: &[u32] = if request.het_groups.is_empty() { &[0] } else { &request.het_groups };
    let het = !job.spec.het.is_empty();
    if let Some(k) = groups.iter().find(|&&k| k as usize >= job.spec.components() && (het || k > 0)) {
        return Err(Rejection::StepNeverFits {
            id: job_id,
            reason: format!("--het-group {k}: the job has {} component(s), numbered from 0", job.spec.components()),
        });
    }
    let shares: Vec<step::NodeShare> = allocation
        .nodes
        .iter()
        .filter(|n| !het || groups.contains(&n.het_group))
        .map(|n| step::NodeShare { node: &n.node, cpus: n.cpus, gpus: &n.gpus })
        .collect();
    let nodes = match step::layout(&shares, &job.steps, request) {
        Ok(nodes) => nodes,
        Err(step::StepRefusal::Never(reason)) => return Err(Rejection::StepNeverFits { id: job_id, reason }),
        Err(step::StepRefusal::Busy(reason)) => return Err(Rejection::StepBusy { id: job_id, reason }),
    };
    Ok(step::Step {
        id: job.next_step,
        name: request.name.clone(),
        ntasks: nodes.iter().map(|n| n.tasks).sum(),
        nodes,
        cpus_per_task: request.cpus_per_task.max(1),
        gpus_per_task: request.gpus_per_task,
        overlap: request.overlap,
        state: step::StepState::Running,
        start: 0,
        end: None,
        exit_code: None,
        signal: None,
        usage: None,
        cyclic: request.cyclic,
    })
}

fn start_step(
    state: &mut ClusterState,
    job_id: JobId,
    user: &str,
    request: &step::StepRequest,
    expect: Option<&step::Placement>,
) -> Response {
    let clock = state.clock;
    let Some(job) = state.jobs.get_mut(&job_id) else {
        return Response::Rejected(Rejection::UnknownJob { id: job_id });
    };
    let mut started = match plan_step(job, user, request) {
        Ok(started) => started,
        Err(r) => return Response::Rejected(r),
    };
    if let Some(expect) = expect.filter(|e| e.id != started.id || e.nodes != started.nodes) {
        // The leader launched it somewhere else than it would start now: those tasks are being
        // killed, and their id is never given to another step (their exits may still arrive).
        job.next_step = job.next_step.max(expect.id.saturating_add(1));
        return Response::Rejected(Rejection::StepBusy {
            id: job_id,
            reason: "what its allocation had free changed while it was launched".into(),
        });
    }
    started.start = clock;
    job.next_step += 1;
    job.steps.push(started.clone());
    Response::StepStarted { job_id, step: Box::new(started) }
}

/// Records a step's end (the highest exit code of its tasks); only the newest ended steps stay.
/// How a step ended, as its `EndStep` says.
struct StepEnd {
    exit_code: i32,
    signal: Option<i32>,
    cancelled: bool,
    usage: Option<quorum_model::JobUsage>,
}

fn end_step(state: &mut ClusterState, job_id: JobId, step_id: u32, end: StepEnd) -> Response {
    let StepEnd { exit_code, signal, cancelled, usage } = end;
    let clock = state.clock;
    let Some(job) = state.jobs.get_mut(&job_id) else {
        return Response::Rejected(Rejection::UnknownJob { id: job_id });
    };
    let Some(s) = job.steps.iter_mut().find(|s| s.id == step_id && s.state == step::StepState::Running) else {
        return Response::Ignored;
    };
    s.state = match (cancelled, exit_code, signal) {
        (true, _, _) => step::StepState::Cancelled,
        (false, 0, None) => step::StepState::Completed,
        _ => step::StepState::Failed,
    };
    s.end = Some(clock);
    s.exit_code = Some(exit_code);
    s.signal = signal;
    s.usage = usage;
    job.step_usage = quorum_model::JobUsage::total(job.step_usage, usage);
    trim_steps(job);
    Response::Ok
}

/// Ends an interactive allocation as its command ended: COMPLETED with 0, else FAILED.
fn end_allocation(state: &mut ClusterState, job_id: JobId, user: &str, exit_code: i32) -> Response {
    let Some(job) = state.jobs.get(&job_id) else {
        return Response::Rejected(Rejection::UnknownJob { id: job_id });
    };
    if user != job.user && user != "root" {
        return Response::Rejected(Rejection::NotOwner { id: job_id, user: user.to_string(), owner: job.user.clone() });
    }
    if !job.spec.interactive {
        return Response::Rejected(Rejection::InvalidSpec {
            field: "job".into(),
            reason: format!("job {job_id} is not an allocation of salloc or srun: cancel it instead"),
        });
    }
    if job.state != JobState::Running {
        return Response::Rejected(Rejection::NotRunning { id: job_id, state: job.state });
    }
    let final_state = if exit_code == 0 { JobState::Completed } else { JobState::Failed };
    finish_job(state, job_id, final_state, Some(exit_code), None);
    Response::JobFinished { job_id, state: final_state }
}

/// Drops the oldest ended steps beyond [`step::KEPT_ENDED_STEPS`].
fn trim_steps(job: &mut Job) {
    let ended = job.steps.iter().filter(|s| s.state != step::StepState::Running).count();
    let mut drop = ended.saturating_sub(step::KEPT_ENDED_STEPS);
    job.steps.retain(|s| {
        if drop > 0 && s.state != step::StepState::Running {
            drop -= 1;
            false
        } else {
            true
        }
    });
}

/// The steps still running when their job ends (or goes back to the queue) end with it.
fn end_running_steps(job: &mut Job, clock: Millis, state: step::StepState) {
    for s in job.steps.iter_mut().filter(|s| s.state == step::StepState::Running) {
        s.state = state;
        s.end = Some(clock);
    }
    trim_steps(job);
}

/// Frees what a job holds and records how it ended.
fn finish_job(
    state: &mut ClusterState,
    job_id: JobId,
    final_state: JobState,
    exit_code: Option<i32>,
    signal: Option<i32>,
) {
    charge_usage(state, job_id);
    record_run(state, job_id, final_state);
    if state.active.remove(&job_id) {
        if let Some(job) = state.jobs.get(&job_id) {
            state.active_by_user.remove(&job.user);
        }
    }
    let hold = state.cluster_level() >= crate::commands::COMPLETING_LEVEL;
    let Some(job) = state.jobs.get_mut(&job_id) else { return };
    let lent = job.lends_cpus();
    if let Some(since) = job.suspended_at.take() {
        job.suspended_ms = job.suspended_ms.saturating_add(state.clock.saturating_sub(since));
    }
    job.state = final_state;
    job.end_time = Some(state.clock);
    job.exit_code = exit_code;
    job.signal = signal;
    job.reason = PendingReason::None;
    // A step still running when the script ended is cut off, as Slurm cancels it.
    let steps_end = match final_state {
        JobState::Completed | JobState::Cancelled => step::StepState::Cancelled,
        _ if job.cancel_requested => step::StepState::Cancelled,
        _ => step::StepState::Failed,
    };
    end_running_steps(job, state.clock, steps_end);
    if let Some(allocation) = &job.allocation {
        free_nodes(&mut state.nodes, job, allocation, lent, hold);
    }
}

/// Gives back what an allocation holds on its nodes (its CPUs only when it holds them: not
/// `lent` by a job suspended by preemption). With `hold` (feature level 34), a node whose rank
/// has not reported its end keeps the share as [`Node::completing`] until it does: the rank
/// may still be running there, being killed.
fn free_nodes(nodes: &mut BTreeMap<String, Node>, job: &Job, allocation: &Allocation, lent: bool, hold: bool) {
    let ways = allocation.ways();
    for a in &allocation.nodes {
        let Some(node) = nodes.get_mut(&a.node) else { continue };
        node.jobs.remove(&job.id);
        if hold && !job.rank_outcomes.iter().any(|(n, _)| *n == a.node) {
            let cpus = if lent { 0 } else { a.cpus };
            let (mem_mb, gpus) = (a.mem_mb, a.gpus.clone());
            node.completing.push(Completing { job_id: job.id, token: job.alloc_index, cpus, ways, mem_mb, gpus });
            continue;
        }
        node.release(if lent { 0 } else { a.cpus }, ways, a.mem_mb, &a.gpus);
    }
}

/// A running job that lost a node goes back to the queue: its time so far is charged, every
/// node of its allocation is freed, and its next allocation gets a newer fencing token, so
/// nothing sent for the old one is obeyed again.
fn requeue_job(state: &mut ClusterState, job_id: JobId) {
    charge_usage(state, job_id);
    let hold = state.cluster_level() >= crate::commands::COMPLETING_LEVEL;
    let Some(job) = state.jobs.get_mut(&job_id) else { return };
    let lent = job.lends_cpus();
    if let Some(allocation) = job.allocation.take() {
        free_nodes(&mut state.nodes, job, &allocation, lent, hold);
    }
    job.state = JobState::Pending;
    job.reason = PendingReason::None;
    job.start_time = None;
    job.rank_outcomes.clear();
    job.preempting = None;
    job.suspended_at = None;
    job.suspended_ms = 0;
    end_running_steps(job, state.clock, step::StepState::Failed);
    job.requeues += 1;
}

/// What a running job becomes when one of its nodes is lost: back in the queue when it asked
/// for that and nobody asked to cancel it; otherwise ended (NODE_FAIL, or CANCELLED).
fn lose_node(state: &mut ClusterState, job_id: JobId) -> bool {
    let Some(job) = state.jobs.get(&job_id) else { return false };
    if job.spec.requeue && !job.cancel_requested {
        requeue_job(state, job_id);
        true
    } else {
        let final_state = if job.cancel_requested { JobState::Cancelled } else { JobState::NodeFail };
        finish_job(state, job_id, final_state, None, None);
        false
    }
}

/// Marks a node DOWN (by an operator, or found silent) and ends or requeues its jobs. A node
/// already DOWN keeps its jobs' fate; an operator's DOWN over a silent one makes it the
/// operator's (it then stays DOWN when its agent is heard).
fn node_down(state: &mut ClusterState, name: &str, reason: String, operator: bool) -> Response {
    let Some(node) = state.nodes.get_mut(name) else {
        return Response::Rejected(Rejection::UnknownNode { name: name.to_string() });
    };
    if matches!(node.admin, NodeAdminState::Down { .. }) {
        if operator {
            node.admin = NodeAdminState::Down { reason, operator };
        }
        return Response::Ignored;
    }
    node.admin = NodeAdminState::Down { reason, operator };
    let jobs: Vec<JobId> = node.jobs.iter().copied().collect();
    let (mut ended, mut requeued) = (Vec::new(), Vec::new());
    for job_id in jobs {
        if lose_node(state, job_id) {
            requeued.push(job_id);
        } else {
            ended.push(job_id);
        }
    }
    Response::NodeDowned { ended, requeued }
}

/// Creates or changes a partition ([`Command::PutPartition`]).
fn put_partition(state: &mut ClusterState, partition: Partition, previous: Option<Partition>) -> Response {
    let name = partition.name.clone();
    let refuse = |reason: &str| Response::Rejected(Rejection::Partition { name: name.clone(), reason: reason.into() });
    match (state.partitions.get(&name), &previous) {
        (Some(_), None) => return refuse("a partition of that name already exists"),
        (None, Some(_)) => return refuse("no such partition"),
        (Some(now), Some(was)) if now != was => return refuse("it changed meanwhile; try again"),
        _ => {}
    }
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == ',') {
        return refuse("a partition name must be non-empty without spaces or commas");
    }
    if let Err(reason) = partition.access.check() {
        return refuse(&reason);
    }
    if partition.default {
        for p in state.partitions.values_mut() {
            p.default = false;
        }
    }
    state.partitions.insert(name, partition);
    Response::Ok
}

/// Deletes a partition no active job is in ([`Command::DeletePartition`]).
fn delete_partition(state: &mut ClusterState, name: &str) -> Response {
    let refuse = |reason: &str| Response::Rejected(Rejection::Partition { name: name.into(), reason: reason.into() });
    if !state.partitions.contains_key(name) {
        return refuse("no such partition");
    }
    let in_use = state.active.iter().filter_map(|id| state.jobs.get(id)).find(|job| {
        job.spec.partition.as_deref() == Some(name) || job.spec.het.iter().any(|c| c.partition.as_deref() == Some(name))
    });
    if let Some(job) = in_use {
        return refuse(&format!("partition is in use (job {} is {})", job.id, job.state));
    }
    state.partitions.remove(name);
    Response::Ok
}

/// Changes nodes as an operator asks ([`Command::UpdateNodes`]): all of them, or none when one
/// is unknown.
fn update_nodes(state: &mut ClusterState, nodes: &[String], update: NodeUpdate) -> Response {
    if let Some(name) = nodes.iter().find(|n| !state.nodes.contains_key(*n)) {
        return Response::Rejected(Rejection::UnknownNode { name: name.clone() });
    }
    let (mut ended, mut requeued) = (Vec::new(), Vec::new());
    for name in nodes {
        let Some(node) = state.nodes.get_mut(name) else { continue };
        if let Some(weight) = update.weight {
            node.weight = weight;
        }
        if let Some(features) = &update.features {
            node.features_set = Some(features.clone());
            node.features.clone_from(features);
        }
        if let Some(reason) = &update.down {
            if let Response::NodeDowned { ended: e, requeued: r } = node_down(state, name, reason.clone(), true) {
                ended.extend(e);
                requeued.extend(r);
            }
        }
    }
    if update.down.is_some() {
        Response::NodeDowned { ended, requeued }
    } else {
        Response::Ok
    }
}

/// Keeps the run time of a job that ended by itself or at its limit as its user's latest, for
/// predictions: not one cancelled, preempted or lost with a node, whose time says nothing of
/// how long it needed. Time suspended does not count. From level 37, also under the time limit
/// the job asked for.
fn record_run(state: &mut ClusterState, job_id: JobId, final_state: JobState) {
    let level = state.cluster_level();
    if level < crate::commands::PREDICT_LEVEL {
        return;
    }
    let ran = matches!(final_state, JobState::Completed | JobState::Failed | JobState::Timeout | JobState::OutOfMemory);
    let Some(job) = state.jobs.get(&job_id).filter(|_| ran) else { return };
    let Some(run_ms) = ran_ms(job, state.clock) else { return };
    let run_s = run_ms / 1000;
    let previous = state.recent_runs.get(&job.user).copied();
    let (user, limit_s) = (job.user.clone(), job.spec.time_limit_s);
    if let Some(limit_s) = limit_s.filter(|_| level >= crate::commands::RUNS_BY_LIMIT_LEVEL) {
        state.runs_by_limit.entry(user.clone()).or_default().record(limit_s, run_s);
    }
    state.recent_runs.insert(user, quorum_model::predict::RecentRuns::after(previous, run_s));
}

/// How long a started job has run by `clock`, its time suspended left out.
fn ran_ms(job: &Job, clock: Millis) -> Option<Millis> {
    let suspended = job.suspended_ms + job.suspended_at.map_or(0, |since| clock.saturating_sub(since));
    Some(clock.saturating_sub(job.start_time?).saturating_sub(suspended))
}

/// Adds what a job used, in billed TRES-seconds, to its account's decayed usage.
fn charge_usage(state: &mut ClusterState, job_id: JobId) {
    let Some(job) = state.jobs.get(&job_id) else { return };
    // Time suspended is not charged.
    let (Some(ran), Some(allocation)) = (ran_ms(job, state.clock), &job.allocation) else { return };
    let seconds = ran as f64 / 1000.0;
    let cpus: u64 = allocation.nodes.iter().map(|n| u64::from(n.cpus)).sum();
    let gpus: u64 = allocation.nodes.iter().map(|n| n.gpus.len() as u64).sum();
    let billed = state.policy.billed(cpus, gpus) as f64 * seconds;
    let half_life_ms = state.policy.half_life_s * 1000;
    let clock = state.clock;
    let by_tres = state.cluster_level() >= crate::commands::USER_SHARES_LEVEL;
    let (account, user, qos) = (job.account.clone(), job.user.clone(), job.qos.clone());
    // CPU- and GPU-seconds (for GrpTRESMins) and usage by user and by QOS from level 20 on,
    // so that every replica of a cluster still below it keeps the same state.
    let (cpu_s, gpu_s) = if by_tres { (cpus as f64 * seconds, gpus as f64 * seconds) } else { (0.0, 0.0) };
    state.usage.entry(account.clone()).or_default().charge(clock, half_life_ms, true, billed, cpu_s, gpu_s);
    if by_tres {
        let users = state.user_usage.entry(account).or_default();
        users.entry(user).or_default().charge(clock, half_life_ms, true, billed, cpu_s, gpu_s);
        let decay = !state.qos.get(&qos).is_some_and(|q| q.no_decay);
        state.qos_usage.entry(qos).or_default().charge(clock, half_life_ms, decay, billed, cpu_s, gpu_s);
    }
}

fn job_ended(state: &mut ClusterState, job_id: JobId, token: u64, node: &str, outcome: RankOutcome) -> Response {
    let response = rank_ended(state, job_id, token, node, outcome);
    // An agent's report of a rank's end (not the leader's of lost contact) says its processes
    // on the node are gone: what the allocation still held there is free.
    if outcome != RankOutcome::LostContact {
        if let Some(n) = state.nodes.get_mut(node) {
            n.release_completing(job_id, token);
        }
    }
    response
}

fn rank_ended(state: &mut ClusterState, job_id: JobId, token: u64, node: &str, outcome: RankOutcome) -> Response {
    let Some(job) = state.jobs.get_mut(&job_id) else {
        return Response::Rejected(Rejection::UnknownJob { id: job_id });
    };
    // A report from an older allocation, or for a job that already ended, changes nothing.
    let on_node = job.allocation.as_ref().is_some_and(|a| a.nodes.iter().any(|n| n.node == node));
    if !job.state.is_allocated() || token != job.alloc_index || !on_node {
        return Response::Ignored;
    }
    if job.rank_outcomes.iter().any(|(n, _)| n == node) {
        return Response::Ignored;
    }
    // The node's prolog failed: the job goes back to the queue (Slurm's requeue on a prolog
    // failure; the leader drains the node in the same entry), unless it was being cancelled.
    if outcome == RankOutcome::PrologFailed {
        if job.cancel_requested {
            finish_job(state, job_id, JobState::Cancelled, None, None);
            return Response::JobFinished { job_id, state: JobState::Cancelled };
        }
        requeue_job(state, job_id);
        return Response::Requeued { job_id };
    }
    if outcome == RankOutcome::LostContact {
        return if lose_node(state, job_id) {
            Response::Requeued { job_id }
        } else {
            Response::JobFinished { job_id, state: state.jobs[&job_id].state }
        };
    }
    job.rank_outcomes.push((node.to_string(), outcome));
    // A batch step job is decided by its first node, where the script runs; the other nodes
    // only hold the allocation for its steps, and decide only when that failed to start.
    let first = job.allocation.as_ref().and_then(|a| a.nodes.first()).is_some_and(|n| n.node == node);
    if job.spec.batch_step && !job.spec.interactive && !first && outcome != RankOutcome::LaunchFailed {
        return Response::Ok;
    }
    // An interactive allocation's nodes only hold it: the first of them to end (its time
    // limit, a cancel, a failure) ends it.
    let total = if job.spec.batch_step || job.spec.interactive { 1 } else { job.spec.nodes as usize };
    // The first rank to end badly decides the job; otherwise it ends when every rank has.
    let decided = match outcome {
        RankOutcome::Exited { code: 0, signal: 0 } if job.rank_outcomes.len() < total => None,
        RankOutcome::Exited { code: 0, signal: 0 } => Some((JobState::Completed, Some(0), None)),
        RankOutcome::Exited { code, signal } => Some((JobState::Failed, Some(code), nonzero(signal))),
        RankOutcome::TimedOut { code, signal } => Some((JobState::Timeout, Some(code), nonzero(signal))),
        RankOutcome::Cancelled { code, signal } => Some((JobState::Cancelled, Some(code), nonzero(signal))),
        RankOutcome::LaunchFailed => Some((JobState::Failed, Some(127), None)),
        RankOutcome::OutOfMemory { code, signal } => Some((JobState::OutOfMemory, Some(code), nonzero(signal))),
        RankOutcome::LostContact | RankOutcome::PrologFailed => unreachable!("handled above"),
    };
    let decided = decided.map(|(st, code, sig)| {
        if job.cancel_requested && st != JobState::Completed {
            (JobState::Cancelled, code, sig)
        } else {
            (st, code, sig)
        }
    });
    // Stopped for another job: back to the queue (fenced by its next allocation's token), or
    // ended PREEMPTED. One that completed meanwhile, or was cancelled too, ends as that.
    if let (Some(p), Some((st, code, signal))) = (&job.preempting, decided) {
        if st != JobState::Completed && !job.cancel_requested && p.mode.stops() {
            let (by, mode) = (p.by, p.mode);
            job.preempted_by = Some(by);
            if mode == PreemptMode::Requeue {
                requeue_job(state, job_id);
                return Response::Requeued { job_id };
            }
            finish_job(state, job_id, JobState::Preempted, code, signal);
            return Response::JobFinished { job_id, state: JobState::Preempted };
        }
    }
    match decided {
        Some((final_state, code, signal)) => {
            finish_job(state, job_id, final_state, code, signal);
            Response::JobFinished { job_id, state: final_state }
        }
        None => Response::Ok,
    }
}

/// Adds what `job_id` used on `node` under allocation `token`, once per node (before the node's
/// end is recorded, as the leader sends it).
fn job_used(
    state: &mut ClusterState,
    job_id: JobId,
    token: u64,
    node: &str,
    usage: quorum_model::JobUsage,
) -> Response {
    let Some(job) = state.jobs.get_mut(&job_id) else { return Response::Ignored };
    let on_node = job.allocation.as_ref().is_some_and(|a| a.nodes.iter().any(|n| n.node == node));
    if job.alloc_index != token || !on_node || job.rank_outcomes.iter().any(|(n, _)| n == node) {
        return Response::Ignored;
    }
    job.usage = Some(job.usage.unwrap_or_default().and(usage));
    Response::Ok
}

fn nonzero(signal: i32) -> Option<i32> {
    (signal != 0).then_some(signal)
}

fn cancel(state: &mut ClusterState, job_id: JobId, user: &str) -> Response {
    let canceller = (state.cluster_level() >= CANCELLED_BY_LEVEL).then(|| user.to_string());
    let Some(job) = state.jobs.get_mut(&job_id) else {
        return Response::Rejected(Rejection::UnknownJob { id: job_id });
    };
    if user != job.user && user != "root" {
        return Response::Rejected(Rejection::NotOwner { id: job_id, user: user.to_string(), owner: job.user.clone() });
    }
    match job.state {
        JobState::Pending => {
            job.cancelled_by = canceller;
            finish_job(state, job_id, JobState::Cancelled, None, None);
            Response::Cancelled { job_id, was_running: false }
        }
        JobState::Running | JobState::Suspended => {
            // The agents kill it (thawed first) and report; the job ends CANCELLED then.
            job.cancel_requested = true;
            job.cancelled_by = canceller;
            Response::Cancelled { job_id, was_running: true }
        }
        st => Response::Rejected(Rejection::JobFinished { id: job_id, state: st }),
    }
}

/// Cancels every task of array `array_id` still pending or running (its tasks have the ids from
/// `array_id` on, one each). Answers as for one job: cancelled (running when any task was), or
/// the first task's rejection when none could be.
fn cancel_array(state: &mut ClusterState, array_id: JobId, user: &str) -> Response {
    let count = match state.jobs.get(&array_id).and_then(|j| j.array) {
        Some(a) if a.array_job_id == array_id => u64::from(a.count),
        _ => return cancel(state, array_id, user),
    };
    let (mut cancelled, mut running, mut rejected) = (false, false, None);
    for id in array_id..array_id + count {
        match cancel(state, id, user) {
            Response::Cancelled { was_running, .. } => {
                cancelled = true;
                running |= was_running;
            }
            other => {
                rejected.get_or_insert(other);
            }
        }
    }
    match rejected {
        Some(r) if !cancelled => r,
        _ => Response::Cancelled { job_id: array_id, was_running: running },
    }
}

/// Drains (`Some(reason)`) or resumes every node of `nodes`, or none of them when one is unknown
/// or DOWN (its own state until its agent is heard again).
fn set_drained(state: &mut ClusterState, nodes: &[String], drain: Option<String>) -> Response {
    for name in nodes {
        match state.nodes.get(name) {
            None => return Response::Rejected(Rejection::UnknownNode { name: name.clone() }),
            // An operator's DOWN is resumed as a drain is; a silent node's is its own.
            Some(Node { admin: NodeAdminState::Down { operator: true, .. }, .. }) if drain.is_none() => {}
            Some(Node { admin: NodeAdminState::Down { reason, .. }, .. }) => {
                return Response::Rejected(Rejection::NodeIsDown { name: name.clone(), reason: reason.clone() })
            }
            Some(_) => {}
        }
    }
    for name in nodes {
        let Some(node) = state.nodes.get_mut(name) else { continue };
        node.admin = match &drain {
            Some(reason) => NodeAdminState::Drain { reason: reason.clone(), auto: false },
            None => NodeAdminState::Up,
        };
    }
    Response::Ok
}

/// Drains a node that is up for `problem`, or resumes one its own health drained; an
/// operator's drain and a DOWN node are left as they are.
fn set_node_health(state: &mut ClusterState, node: &str, problem: Option<String>) -> Response {
    let Some(n) = state.nodes.get_mut(node) else {
        return Response::Rejected(Rejection::UnknownNode { name: node.to_string() });
    };
    let next = match (&n.admin, problem) {
        (NodeAdminState::Up | NodeAdminState::Drain { auto: true, .. }, Some(reason)) => {
            NodeAdminState::Drain { reason, auto: true }
        }
        (NodeAdminState::Drain { auto: true, .. }, None) => NodeAdminState::Up,
        _ => return Response::Ignored,
    };
    if n.admin == next {
        return Response::Ignored;
    }
    n.admin = next;
    Response::Ok
}

fn register_node(state: &mut ClusterState, reg: NodeRegistration) {
    let clock = state.clock;
    let node = state.nodes.entry(reg.name.clone()).or_insert_with(|| Node {
        name: reg.name.clone(),
        cpus: 0,
        mem_mb: 0,
        gpus: Vec::new(),
        features: Vec::new(),
        admin: NodeAdminState::Up,
        alloc_cpus: 0,
        shared_cpus: Default::default(),
        alloc_mem_mb: 0,
        alloc_gpus: Default::default(),
        jobs: Default::default(),
        agent_version: String::new(),
        registered_at: clock,
        weight: 1,
        features_set: None,
        completing: Vec::new(),
    });
    node.cpus = reg.cpus;
    node.mem_mb = reg.mem_mb;
    let mut gpus = reg.gpus;
    gpus.sort();
    node.gpus = gpus;
    node.features = node.features_set.clone().unwrap_or(reg.features);
    node.agent_version = reg.version;
    node.registered_at = clock;
    if matches!(node.admin, NodeAdminState::Down { operator: false, .. }) {
        node.admin = NodeAdminState::Up;
    }
}
