//! Jobs: submit, hold and release, cancel and signal, and the job reads (`quorum show`,
//! `quorum queue`, `quorum prio`).

use quorum_proto::api::*;
use tonic::Status;
use tracing::Instrument;

use quorum_auth::{Caller, Role};

use super::api::{acting_as, read_barrier, rejection_status, write_status, Api};
use crate::model::JobState;
use crate::replica::now_ms;
use crate::wire;
use quorum_state::{Command, Response, Submit};

/// A GPU type as the nodes registered it: `H100` is `h100` when no node has a type spelled
/// `H100` and some have one that differs from it only in case (Slurm's types match in any case).
fn gpu_type_as_registered(api: &Api, asked: &str) -> String {
    let applied = api.replica.shared.read();
    let types = || applied.state.nodes.values().flat_map(|n| n.gpus.iter().map(|g| g.gpu_type.as_str()));
    if types().any(|t| t == asked) {
        return asked.to_string();
    }
    types().find(|t| t.eq_ignore_ascii_case(asked)).unwrap_or(asked).to_string()
}

/// A submitted spec checked as every submit's is (shape, feature level, limits, who may ask
/// for a priority or a group): what a submit or a cron entry records.
pub(super) async fn prepared_spec(api: &Api, caller: &Caller, spec: JobSpec) -> Result<crate::model::JobSpec, Status> {
    let mut spec = wire::spec_from_proto(spec).map_err(|e| rejection_status(&e))?;
    // A credential of the submitting shell never becomes part of a job (an older client, or a
    // REST request, may still send one).
    if spec.env.iter().any(|(k, _)| crate::model::env::is_credential(k)) {
        spec.env = crate::model::Env::new(spec.env.iter().filter(|(k, _)| !crate::model::env::is_credential(k)));
    }
    spec.check_shape().map_err(|e| rejection_status(&e))?;
    // The site's filter sees a well-formed job; what it changes is checked again.
    if let Some(filter) = &api.submit_filter {
        spec = super::filter::filter(filter, &caller.user, spec).await?;
        spec.check_shape().map_err(|e| rejection_status(&e))?;
    }
    if let Some(asked) = &spec.gpu_type {
        spec.gpu_type = Some(gpu_type_as_registered(api, asked));
    }
    // Refused here, one by one, rather than in a group commit of other users' submits.
    let (needs, what) = quorum_state::spec_level(&spec);
    let cluster = api.replica.shared.read().state.cluster_level();
    if needs > cluster {
        return Err(write_status(crate::replica::WriteError::TooNew { what, needs, cluster }));
    }
    api.limits.check(&spec).map_err(|(field, reason)| {
        rejection_status(&crate::model::Rejection::InvalidSpec { field: field.to_string(), reason })
    })?;
    if spec.priority.is_some() && !caller.at_least(quorum_auth::Role::Operator) {
        return Err(Status::permission_denied(
            "--priority is for operators and administrators; lower your own job's priority with --nice",
        ));
    }
    if let Some(group) = &spec.run_group {
        spec.run_group = Some(job_group(caller, group)?);
    }
    // Which QOS a user may name is their account's to say; operators may use any.
    if !caller.at_least(quorum_auth::Role::Operator) {
        let applied = api.replica.shared.read();
        quorum_state::qos_access::check(&applied.state, &caller.user, spec.account.as_deref(), spec.qos.as_deref())
            .map_err(|r| rejection_status(&r))?;
    }
    Ok(spec)
}

pub(super) async fn submit_job(api: &Api, caller: &Caller, r: SubmitJobRequest) -> Result<SubmitJobResponse, Status> {
    let spec = r.spec.ok_or_else(|| Status::invalid_argument("missing job spec"))?;
    let spec = prepared_spec(api, caller, spec).await?;
    let user = job_owner(caller, &r.run_as)?;
    if r.test_only {
        return test_only(api, spec, &user);
    }
    let request_id = scoped_request_id(caller, &r.request_id)?;
    if let Some(job_id) = retried_after_it_left(api, &request_id)? {
        return Ok(SubmitJobResponse { job_id, duplicate: true, ..Default::default() });
    }
    recall_dependencies(api, &spec).await?;
    // The job's trace, by the submit's request id until its id is known: it may be scheduled
    // and launched before this commit returns.
    let traceparent = quorum_proto::telemetry::traceparent(&tracing::Span::current());
    api.leader.hub.traces.remember_request(&request_id, traceparent.clone());
    let submit = Submit { spec: Box::new(spec), user, request_id: request_id.clone() };
    let commit = tracing::info_span!("raft_commit", job_id = tracing::field::Empty);
    match api.submits.write(submit).instrument(commit.clone()).await.map_err(write_status)? {
        Response::Submitted { job_id, duplicate } => {
            commit.record("job_id", job_id);
            if !duplicate {
                api.leader.hub.traces.submitted(&request_id, job_id, traceparent);
            }
            Ok(SubmitJobResponse { job_id, duplicate, ..Default::default() })
        }
        Response::Rejected(r) => Err(rejection_status(&r)),
        other => Err(Status::internal(format!("unexpected answer to a submit: {other:?}"))),
    }
}

/// The job a retried submit made, when it has left the hot state and its tombstone too (the
/// replicas' dedup only knows the request ids of jobs in the state). The state is read first:
/// a job that leaves it meanwhile is in the history by the time that is read.
fn retried_after_it_left(api: &Api, request_id: &str) -> Result<Option<u64>, Status> {
    if request_id.is_empty() || api.replica.shared.read().state.request_ids.contains_key(request_id) {
        return Ok(None);
    }
    api.replica.shared.history.by_request(request_id).map_err(history_status)
}

/// A dependency on a job the state no longer knows (it left the hot state, and its tombstone
/// too) names it by what the history kept: the leader proposes its tombstone (every task's, for
/// an array) back into the state before the submit, so apply admits the dependency and the
/// scheduler judges it on how the job ended.
async fn recall_dependencies(api: &Api, spec: &crate::model::JobSpec) -> Result<(), Status> {
    let gone: Vec<u64> = {
        let state = &api.replica.shared.read().state;
        spec.dependencies.iter().map(|d| d.job).filter(|id| *id < state.next_job_id && !state.knows_job(*id)).collect()
    };
    if gone.is_empty() {
        return Ok(());
    }
    let history = &api.replica.shared.history;
    let mut recalled = Vec::new();
    for id in gone {
        let Some(job) = history.get(id).map_err(history_status)? else { continue };
        match job.array.filter(|a| a.array_job_id == id) {
            Some(a) => {
                let last = id.saturating_add(u64::from(a.count.max(1)) - 1);
                recalled.extend(history.range(id, last).map_err(history_status)?);
            }
            None => recalled.push(job),
        }
    }
    if recalled.is_empty() {
        return Ok(());
    }
    let jobs = quorum_state::tombstones(&recalled);
    api.replica.write(Command::RecallJobs { jobs, now: now_ms() }).await.map_err(write_status)?;
    Ok(())
}

/// `sbatch --test-only`: the spec as admission would leave it, and when and where the job
/// would start (Slurm's will-run test); nothing is written.
fn test_only(api: &Api, spec: crate::model::JobSpec, user: &str) -> Result<SubmitJobResponse, Status> {
    let applied = api.replica.shared.read();
    let state = &applied.state;
    let admitted = quorum_state::check_submit(state, spec, user).map_err(|e| rejection_status(&e))?;
    let now = now_ms();
    let view = quorum_sched::ClusterView::from_state(state);
    let job = quorum_sched::PendingJob::hypothetical(&view, state.next_job_id, &admitted, user, now);
    let answer = quorum_sched::will_run(&view, job, now, &state.policy);
    let mut r = SubmitJobResponse {
        would_be_id: state.next_job_id,
        admitted: Some(wire::spec_to_proto(&admitted, false)),
        ..Default::default()
    };
    match answer {
        quorum_sched::WillRun::Now(e) | quorum_sched::WillRun::Later(e) => {
            r.expected_start_ms = e.start_ms;
            r.expected_nodes = crate::model::hostlist::compress(&e.nodes);
        }
        quorum_sched::WillRun::Waiting(reason) => r.waiting_reason = reason.name().to_string(),
    }
    Ok(r)
}

/// Whose job a submit makes: the caller's, or with `sbatch --uid` (`run_as`) that user's, which
/// only root may ask for (the job's processes run as that user) and which must be in the
/// controllers' user database. The one place `--uid` is decided, for every entry point that
/// takes it: a submit (sbatch, salloc, srun, REST) and a cron entry.
pub(super) fn job_owner(caller: &Caller, run_as: &str) -> Result<String, Status> {
    if run_as.is_empty() || run_as == caller.user {
        return Ok(caller.user.clone());
    }
    if caller.uid != 0 || !caller.at_least(quorum_auth::Role::Admin) {
        return Err(Status::permission_denied(format!(
            "only root may submit a job as another user (--uid {run_as}); you are {}",
            caller.user
        )));
    }
    quorum_auth::users::check_name(run_as)
        .and_then(|()| quorum_auth::users::by_name(run_as))
        .map(|u| u.name)
        .map_err(|e| Status::invalid_argument(format!("invalid --uid '{run_as}': {e}")))
}

/// The group a job runs with when `sbatch --gid` names one: only root may (the job's processes
/// get that group), and it must be in the controllers' group database; by its name.
fn job_group(caller: &Caller, group: &str) -> Result<String, Status> {
    if caller.uid != 0 || !caller.at_least(quorum_auth::Role::Admin) {
        return Err(Status::permission_denied(format!(
            "only root may run a job with another group (--gid {group}); you are {}",
            caller.user
        )));
    }
    quorum_auth::users::group(group)
        .map(|g| g.name)
        .map_err(|e| Status::invalid_argument(format!("invalid --gid '{group}': {e}")))
}

/// A request id as the replicas record it: scoped to its user, so that one user's id never
/// names another's job (`user:id`; a user name has no ':'). Empty stays empty (no retry).
fn scoped_request_id(caller: &Caller, id: &str) -> Result<String, Status> {
    use crate::model::limits::MAX_REQUEST_ID_BYTES;
    if id.len() > MAX_REQUEST_ID_BYTES {
        return Err(Status::invalid_argument(format!(
            "request id of {} bytes: at most {MAX_REQUEST_ID_BYTES}",
            id.len()
        )));
    }
    if id.is_empty() {
        return Ok(String::new());
    }
    Ok(format!("{}:{id}", caller.user))
}

pub(super) async fn hold_job(api: &Api, caller: &Caller, r: HoldJobRequest) -> Result<HoldJobResponse, Status> {
    let mut results = Vec::new();
    for job_id in r.job_ids {
        let (user, now) = (acting_as(caller), now_ms());
        let command = if r.suspend || r.resume {
            Command::SuspendJob { job_id, user, resume: r.resume, now }
        } else if r.requeue {
            Command::RequeueJob { job_id, user, now }
        } else if r.release {
            Command::ReleaseJob { job_id, user, now }
        } else {
            Command::HoldJob { job_id, user, now }
        };
        let result = match api.replica.write(command).await.map_err(write_status)?.1 {
            Response::Held { .. }
            | Response::Released { .. }
            | Response::Requeued { .. }
            | Response::Suspended { .. } => done(job_id, false),
            Response::Rejected(rej) => refused(job_id, &rej),
            other => return Err(Status::internal(format!("unexpected answer to a hold: {other:?}"))),
        };
        results.push(result);
    }
    Ok(HoldJobResponse { results })
}

/// `scontrol update`: the changes read once, then applied to each job (each task of an array
/// named by its id) in its own entry, each answered on its own.
pub(super) async fn update_job(api: &Api, caller: &Caller, r: UpdateJobRequest) -> Result<UpdateJobResponse, Status> {
    if r.job_ids.is_empty() {
        return Err(Status::invalid_argument("no job to update"));
    }
    if r.job_ids.len() > MAX_UPDATE_JOBS {
        return Err(Status::invalid_argument(format!(
            "{} jobs in one update: at most {MAX_UPDATE_JOBS}",
            r.job_ids.len()
        )));
    }
    // In the order of their keys, so that the same request reads the same whatever the map's.
    let mut changes: Vec<(&String, &String)> = r.changes.iter().collect();
    changes.sort();
    let update =
        quorum_model::update::JobUpdate::from_pairs(changes.into_iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(Status::invalid_argument)?;
    let targets: Vec<u64> = {
        let applied = api.replica.shared.read();
        let state = &applied.state;
        let mut targets = Vec::new();
        for &id in &r.job_ids {
            let array = state.jobs.get(&id).and_then(|j| j.array).filter(|a| a.array_job_id == id);
            match array {
                // Its tasks have consecutive ids from the array's; those not yet ended.
                Some(a) => targets.extend(
                    state
                        .active
                        .range(id..id.saturating_add(u64::from(a.count)))
                        .filter(|t| state.jobs.get(t).and_then(|j| j.array).is_some_and(|ta| ta.array_job_id == id)),
                ),
                None => targets.push(id),
            }
        }
        targets
    };
    let mut results = Vec::new();
    for job_id in targets {
        // A user moves their job only to a QOS their account allows (operators: any).
        if (update.qos.is_some() || update.account.is_some()) && !caller.at_least(quorum_auth::Role::Operator) {
            let allowed = {
                let applied = api.replica.shared.read();
                let state = &applied.state;
                state.jobs.get(&job_id).map_or(Ok(()), |job| {
                    let account = update.account.as_deref().unwrap_or(&job.account);
                    let qos = update.qos.as_deref().unwrap_or(&job.qos);
                    quorum_state::qos_access::check(state, &job.user, Some(account), Some(qos))
                })
            };
            if let Err(rej) = allowed {
                results.push(refused(job_id, &rej));
                continue;
            }
        }
        let command = Command::UpdateJob { job_id, user: acting_as(caller), update: update.clone(), now: now_ms() };
        let result = match api.replica.write(command).await.map_err(write_status)?.1 {
            Response::Updated { .. } => done(job_id, false),
            Response::Rejected(rej) => refused(job_id, &rej),
            other => return Err(Status::internal(format!("unexpected answer to an update: {other:?}"))),
        };
        results.push(result);
    }
    Ok(UpdateJobResponse { results })
}

/// The most jobs one update names (an array's tasks count once, by its id).
const MAX_UPDATE_JOBS: usize = 10_000;

pub(super) async fn cancel_job(api: &Api, caller: &Caller, r: CancelJobRequest) -> Result<CancelJobResponse, Status> {
    if !r.signal.is_empty() {
        return signal_jobs(api, caller, r).await;
    }
    if r.complete {
        let mut results = Vec::new();
        for job_id in r.job_ids {
            let command =
                Command::EndAllocation { job_id, user: acting_as(caller), exit_code: r.exit_code, now: now_ms() };
            let result = match api.replica.write(command).await.map_err(write_status)?.1 {
                Response::JobFinished { .. } => done(job_id, false),
                Response::Rejected(rej) => refused(job_id, &rej),
                other => return Err(Status::internal(format!("unexpected answer to ending an allocation: {other:?}"))),
            };
            results.push(result);
        }
        return Ok(CancelJobResponse { results });
    }
    let mut results = Vec::new();
    let targets = {
        let applied = api.replica.shared.read();
        let is_array =
            |id: u64| applied.state.jobs.get(&id).and_then(|j| j.array).is_some_and(|a| a.array_job_id == id);
        let whole = r.job_ids.iter().map(|&id| (id, is_array(id)));
        whole.chain(r.task_job_ids.iter().map(|&id| (id, false))).collect::<Vec<_>>()
    };
    for (job_id, whole_array) in targets {
        let command = Command::CancelJob { job_id, user: acting_as(caller), now: now_ms(), whole_array };
        let result = match api.replica.write(command).await.map_err(write_status)?.1 {
            Response::Cancelled { was_running, .. } => done(job_id, was_running),
            Response::Rejected(rej) => refused(job_id, &rej),
            other => return Err(Status::internal(format!("unexpected answer to a cancel: {other:?}"))),
        };
        results.push(result);
    }
    Ok(CancelJobResponse { results })
}

/// A hold's, release's or cancel's result for a job it acted on.
fn done(job_id: u64, was_running: bool) -> CancelResult {
    CancelResult { job_id, ok: true, was_running, ..Default::default() }
}

/// A job's result when apply refused to act on it.
fn refused(job_id: u64, rejection: &crate::model::Rejection) -> CancelResult {
    let code = code_name(rejection_status(rejection).code());
    CancelResult { job_id, ok: false, error: rejection.to_string(), code: code.to_string(), was_running: false }
}

/// A job's result when it could not be signalled, with the status code of the refusal.
fn not_signalled(job_id: u64, code: tonic::Code, error: String) -> CancelResult {
    CancelResult { job_id, ok: false, error, code: code_name(code).to_string(), was_running: false }
}

/// A status code as gRPC names it.
fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        _ => "UNKNOWN",
    }
}

/// Whether `caller` sees all of `job`: its own, or any as an operator. Others' scripts and
/// environments are never shown; with `private_data = ["jobs"]` nor are their jobs.
fn sees_all_of(caller: &Caller, job: &crate::model::Job) -> bool {
    caller.may_act_on(&job.user)
}

/// A job as `caller` may see it: without its script, arguments and environment when it is
/// someone else's.
fn job_for(caller: &Caller, job: &crate::model::Job, with_spec: bool) -> JobInfo {
    redacted(caller, wire::job_to_proto(job, with_spec))
}

/// `info` as `caller` may see it (see [`job_for`]).
fn redacted(caller: &Caller, mut info: JobInfo) -> JobInfo {
    if !caller.may_act_on(&info.user) {
        if let Some(spec) = info.spec.as_mut() {
            spec.script.clear();
            spec.argv.clear();
            spec.env.clear();
        }
    }
    info
}

pub(super) async fn get_job(api: &Api, caller: &Caller, r: GetJobRequest) -> Result<GetJobResponse, Status> {
    let GetJobRequest { job_id, stale, array_task_id } = r;
    read_barrier(api, stale).await?;
    let (hot, applied_index) = {
        let applied = api.replica.shared.read();
        let hot = match array_task_id {
            None => applied.state.jobs.get(&job_id).map(|j| Ok((**j).clone())),
            Some(task) if applied.state.jobs.contains_key(&job_id) => {
                Some(array_task(&applied.state, job_id, task).cloned())
            }
            Some(_) => None,
        };
        (hot.transpose()?, applied.applied_index())
    };
    // Read after the hot state: a job that left it meanwhile is in the history by then.
    let job = match hot {
        Some(job) => job,
        None => from_history(api, job_id, array_task_id)?,
    };
    if api.security.config.private("jobs") && !sees_all_of(caller, &job) {
        return Err(Status::not_found(format!("job {job_id} does not exist")));
    }
    let mut info = job_for(caller, &job, true);
    info.gpu_idle_since_ms = api.leader.gpu_idle_since(&job, crate::replica::now_ms()).unwrap_or(0);
    waiting_on(api, &job, &mut info);
    if let Some(e) = api.leader.expected(job.id).filter(|_| job.state == JobState::Pending) {
        show_expected(&mut info, &e);
    }
    Ok(GetJobResponse { job: Some(info), applied_index })
}

/// A pending job's expected start and nodes: its reservation, or its forecast, marked.
fn show_expected(info: &mut JobInfo, e: &crate::leader::Expected) {
    info.expected_start_ms = e.start_ms;
    info.expected_nodes = crate::model::hostlist::compress(&e.nodes);
    (info.expected_forecast, info.forecast_at_ms) = (e.forecast, e.at_ms);
}

/// A running job whose start waits on a node (its image pulled): CONFIGURING, as Slurm shows a
/// job whose nodes are not ready yet, with what it waits for as its reason; a step's pull shows
/// in the reason alone.
fn waiting_on(api: &Api, job: &crate::model::Job, info: &mut JobInfo) {
    if job.state != JobState::Running {
        return;
    }
    if let Some(p) = api.leader.hub.progress_of(job.id, job.alloc_index) {
        info.reason = format!("{} on {}", p.text, p.node);
        if p.launch {
            info.state = "CONFIGURING".into();
        }
    }
}

/// A job (or task `task` of the array `job_id`) from the job history.
fn from_history(api: &Api, job_id: u64, task: Option<u32>) -> Result<crate::model::Job, Status> {
    let history = &api.replica.shared.history;
    let missing = || Status::not_found(format!("job {job_id} does not exist"));
    let job = history.get(job_id).map_err(history_status)?.ok_or_else(missing)?;
    let Some(task) = task else { return Ok(job) };
    let Some(a) = job.array.filter(|a| a.array_job_id == job_id) else {
        return Err(Status::not_found(format!("job {job_id} is not a job array, so it has no task {task}")));
    };
    let last = job_id.saturating_add(u64::from(a.count.max(1)) - 1);
    let tasks = history.range(job_id, last).map_err(history_status)?;
    tasks.into_iter().find(|j| j.array.is_some_and(|t| t.task_id == task)).ok_or_else(|| {
        Status::not_found(format!("array {job_id} has no task {task} (its tasks are {}-{})", a.min, a.max))
    })
}

pub(super) fn history_status(e: crate::replica::history::HistoryError) -> Status {
    match e {
        crate::replica::history::HistoryError::Incomplete(_) => Status::unavailable(e.to_string()),
        crate::replica::history::HistoryError::Failed(_) => Status::internal(e.to_string()),
    }
}

pub(super) async fn list_jobs(api: &Api, caller: &Caller, r: ListJobsRequest) -> Result<ListJobsResponse, Status> {
    let private = api.security.config.private("jobs") && !caller.at_least(Role::Operator);
    let mut states = Vec::new();
    for s in &r.states {
        states
            .push(JobState::from_name(s).ok_or_else(|| Status::invalid_argument(format!("unknown job state '{s}'")))?);
    }
    if r.job_ids.len() > MAX_LISTED_IDS {
        return Err(Status::invalid_argument(format!(
            "{} job ids in one listing: at most {MAX_LISTED_IDS}",
            r.job_ids.len()
        )));
    }
    read_barrier(api, r.stale).await?;
    let (estimates, forecasts) = api.leader.expected_all();
    let now = crate::replica::now_ms();
    let submitted_before = if r.submitted_before_ms == 0 { u64::MAX } else { r.submitted_before_ms };
    // A set: a listing may name thousands of jobs, checked against every job while the state
    // is locked.
    let named: std::collections::BTreeSet<u64> = r.job_ids.iter().copied().collect();
    let wanted = |j: &crate::model::Job| {
        (states.is_empty() || states.contains(&j.state))
            && (r.user.is_empty() || j.user == r.user)
            && (!private || j.user == caller.user)
            && (named.is_empty() || named.contains(&j.id) || j.array.is_some_and(|a| named.contains(&a.array_job_id)))
            && (!r.history || j.end_time.is_none_or(|end| end >= r.ended_after_ms))
            && (!r.history || j.submit_time <= submitted_before)
    };
    let limit = if r.limit == 0 { usize::MAX } else { r.limit as usize };
    let after = r.after.checked_add(1).map_or(std::ops::Bound::Excluded(u64::MAX), std::ops::Bound::Included);
    let (mut jobs, mut bytes, mut next_after) = (Vec::new(), 0usize, 0);
    // The hot state first, then the history: a job that leaves the state in between is then
    // read twice (and listed once), never missed.
    let (hot, applied_index): (Vec<JobInfo>, u64) = {
        let applied = api.replica.shared.read();
        let listed_hot =
            applied.state.jobs.range((after, std::ops::Bound::Unbounded)).map(|(_, j)| j).filter(|j| wanted(j)).map(
                |j| {
                    let mut info = wire::listed(job_for(caller, j, false));
                    info.gpu_idle_since_ms = api.leader.gpu_idle_since(j, now).unwrap_or(0);
                    waiting_on(api, j, &mut info);
                    if let Some(e) =
                        forecasts.expected(j.id, estimates.get(&j.id)).filter(|_| j.state == JobState::Pending)
                    {
                        show_expected(&mut info, &e);
                    }
                    info
                },
            );
        // Without the history the page ends where it is full, as before: no need to copy more.
        let taken =
            if r.history { listed_hot.collect() } else { page_of(listed_hot, limit, &mut bytes, &mut next_after) };
        (taken, applied.applied_index())
    };
    if !r.history {
        return Ok(ListJobsResponse { jobs: hot, applied_index, now_ms: now_ms(), next_after });
    }
    let (gone, read_up_to) = history_jobs(api, &r, caller, private, &wanted)?;
    let mut merged: std::collections::BTreeMap<u64, JobInfo> = gone
        .into_iter()
        .filter(|info| states.is_empty() || states.iter().any(|s| s.name() == info.state))
        .map(|info| (info.id, info))
        .collect();
    merged.extend(hot.into_iter().map(|info| (info.id, info)));
    // When the history had more than one read takes, this page ends at the last id read.
    if let Some(cut) = read_up_to {
        merged.retain(|id, _| *id <= cut);
    }
    jobs.extend(page_of(merged.into_values(), limit, &mut bytes, &mut next_after));
    if next_after == 0 {
        next_after = read_up_to.unwrap_or(0);
    }
    Ok(ListJobsResponse { jobs, applied_index, now_ms: now_ms(), next_after })
}

/// The most job ids one listing names.
const MAX_LISTED_IDS: usize = 10_000;

/// The listings' page: jobs in id order until `limit` or [`MAX_PAGE_BYTES`]; `next_after` is
/// set to the last id when more follow.
fn page_of(
    infos: impl Iterator<Item = JobInfo>,
    limit: usize,
    bytes: &mut usize,
    next_after: &mut u64,
) -> Vec<JobInfo> {
    let mut page = Vec::new();
    for info in infos {
        let size = prost::Message::encoded_len(&info) + 8;
        if page.len() == limit || (!page.is_empty() && *bytes + size > MAX_PAGE_BYTES) {
            *next_after = page.last().map_or(0, |i: &JobInfo| i.id);
            break;
        }
        *bytes += size;
        page.push(info);
    }
    page
}

/// The history's jobs a listing may show, ids above `r.after`, as `caller` may see them (their
/// state not yet filtered): those named, or those that ended in its window (of its user, or the
/// caller's own when jobs are private), found through the history's end-time indexes. With the
/// last id read when more were left for the next page.
fn history_jobs(
    api: &Api,
    r: &ListJobsRequest,
    caller: &Caller,
    private: bool,
    wanted: &dyn Fn(&crate::model::Job) -> bool,
) -> Result<(Vec<JobInfo>, Option<u64>), Status> {
    let history = &api.replica.shared.history;
    // A page holds at most this many; the rest are read for the next page.
    let limit = if r.limit == 0 { MAX_HISTORY_PAGE } else { (r.limit as usize).min(MAX_HISTORY_PAGE) };
    let before = if r.submitted_before_ms == 0 { u64::MAX } else { r.submitted_before_ms };
    let user = if private { Some(caller.user.as_str()) } else { Some(r.user.as_str()).filter(|u| !u.is_empty()) };
    if let (true, Some(user)) = (r.job_ids.is_empty(), user) {
        // A user's window: the listings its index holds, in one read.
        if !r.user.is_empty() && r.user != user {
            return Ok((Vec::new(), None));
        }
        let (page, read_up_to) = history
            .listed_since(user, r.ended_after_ms, before, r.after, limit, MAX_PAGE_BYTES)
            .map_err(history_status)?;
        let mut infos = Vec::with_capacity(page.len());
        for (id, bytes) in page {
            let info = <JobInfo as prost::Message>::decode(&bytes[..])
                .map_err(|e| Status::internal(format!("job history: the listing of job {id}: {e}")))?;
            infos.push(redacted(caller, info));
        }
        return Ok((infos, read_up_to));
    }
    let mut ids: Vec<u64> = if r.job_ids.is_empty() {
        history.ended_since(None, r.ended_after_ms, before).map_err(history_status)?
    } else {
        let mut ids = Vec::new();
        for &id in &r.job_ids {
            let Some(job) = history.get(id).map_err(history_status)? else { continue };
            match job.array.filter(|a| a.array_job_id == id) {
                Some(a) => ids.extend(id..=id.saturating_add(u64::from(a.count.max(1)) - 1)),
                None => ids.push(id),
            }
        }
        ids
    };
    ids.retain(|id| *id > r.after);
    ids.sort_unstable();
    ids.dedup();
    let read_up_to = (ids.len() > limit).then(|| ids[limit - 1]);
    ids.truncate(limit);
    let jobs = history.get_many(&ids).map_err(history_status)?;
    Ok((jobs.iter().filter(|j| wanted(j)).map(|j| wire::listed(job_for(caller, j, false))).collect(), read_up_to))
}

/// The most history records one page reads.
const MAX_HISTORY_PAGE: usize = 20_000;

/// The most a page of a listing carries, under the 4 MiB a gRPC client accepts by default.
const MAX_PAGE_BYTES: usize = 2 << 20;

pub(super) async fn priorities(api: &Api, caller: &Caller, r: PriorityRequest) -> Result<PriorityResponse, Status> {
    let private = api.security.config.private("jobs") && !caller.at_least(Role::Operator);
    api.replica.linearizable().await.map_err(write_status)?;
    let (view, policy) = {
        let applied = api.replica.shared.read();
        (quorum_sched::ClusterView::from_state(&applied.state), applied.state.policy.clone())
    };
    let factors = quorum_sched::priority::breakdown(&view, now_ms(), &policy);
    // A set: a request may name thousands of jobs, each checked against every pending job.
    let named: std::collections::BTreeSet<u64> = r.job_ids.iter().copied().collect();
    let jobs = view
        .pending
        .iter()
        .filter(|j| !private || *j.user == *caller.user)
        .filter(|j| named.is_empty() || named.contains(&j.id))
        .map(|j| {
            let f = &factors[&j.id];
            JobPriority {
                job_id: j.id,
                user: j.user.to_string(),
                account: j.account.to_string(),
                partition: j.partition.to_string(),
                total: f.total,
                age: f.age,
                fairshare: f.fairshare,
                job_size: f.job_size,
                partition_factor: f.partition,
                qos: f.qos,
                nice: f.nice,
                tres: f.tres.to_vec(),
            }
        })
        .collect();
    let w = policy.weights;
    Ok(PriorityResponse {
        jobs,
        weight_age: w.age,
        weight_fairshare: w.fairshare,
        weight_job_size: w.job_size,
        weight_partition: w.partition,
        weight_qos: w.qos,
        tres_names: quorum_model::TresWeights::NAMES.iter().map(|n| n.to_string()).collect(),
        weight_tres: policy.tres_weights.each().to_vec(),
    })
}

/// `quorum cancel --signal`: signals each running job on every node of its allocation, after
/// a linearizable read; per-job results like a cancel.
async fn signal_jobs(api: &Api, caller: &Caller, r: CancelJobRequest) -> Result<CancelJobResponse, Status> {
    let signal = crate::model::parse_signal(&r.signal).map_err(Status::invalid_argument)?;
    api.replica.linearizable().await.map_err(write_status)?;
    let mut results = Vec::new();
    for job_id in r.job_ids.iter().chain(&r.task_job_ids).copied() {
        let target = {
            let applied = api.replica.shared.read();
            match applied.state.jobs.get(&job_id) {
                None => Err((tonic::Code::NotFound, format!("job {job_id} does not exist"))),
                Some(j) if !caller.may_act_on(&j.user) => Err((
                    tonic::Code::PermissionDenied,
                    format!("user '{}' may not signal job {job_id}: it is another user's", caller.user),
                )),
                Some(j) if j.state != crate::model::JobState::Running => {
                    Err((tonic::Code::FailedPrecondition, format!("job {job_id} is not running ({})", j.state.name())))
                }
                Some(j) => Ok((
                    j.alloc_index,
                    j.allocation.as_ref().map(|a| a.nodes.iter().map(|n| n.node.clone()).collect::<Vec<_>>()),
                )),
            }
        };
        let result = match target {
            Ok((token, Some(nodes))) => {
                let missed: Vec<String> = {
                    let applied = api.replica.shared.read();
                    nodes
                        .into_iter()
                        .filter(|n| !api.leader.hub.signal(&applied.state, n, job_id, token, signal))
                        .collect()
                };
                if missed.is_empty() {
                    done(job_id, false)
                } else {
                    let error = format!("no agent connected on {}", missed.join(","));
                    not_signalled(job_id, tonic::Code::FailedPrecondition, error)
                }
            }
            Ok((_, None)) => {
                not_signalled(job_id, tonic::Code::FailedPrecondition, format!("job {job_id} has no allocation"))
            }
            Err((code, error)) => not_signalled(job_id, code, error),
        };
        results.push(result);
    }
    Ok(CancelJobResponse { results })
}

/// Task `task` of the array whose id is `array_id` (its tasks have the ids from `array_id` on).
fn array_task(state: &quorum_state::ClusterState, array_id: u64, task: u32) -> Result<&crate::model::Job, Status> {
    let first = state.jobs.get(&array_id).ok_or_else(|| Status::not_found(format!("job {array_id} does not exist")))?;
    let Some(a) = first.array.filter(|a| a.array_job_id == array_id) else {
        return Err(Status::not_found(format!("job {array_id} is not a job array, so it has no task {task}")));
    };
    state
        .jobs
        .range(array_id..array_id + u64::from(a.count))
        .map(|(_, j)| &**j)
        .find(|j| j.array.is_some_and(|t| t.task_id == task))
        .ok_or_else(|| {
            Status::not_found(format!("array {array_id} has no task {task} (its tasks are {}-{})", a.min, a.max))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorum_auth::{Proof, Role};

    fn caller(user: &str, uid: u32, role: Role) -> Caller {
        Caller { user: user.into(), uid, gid: uid, role, proof: Proof::Munge }
    }

    /// Every request that names whose job it makes (`run_as`, from `--uid`) is one this table
    /// knows, and [`job_owner`] decides it alike for all: a new one fails here until it is added.
    #[test]
    fn every_request_that_takes_a_uid_is_decided_by_job_owner() {
        let text = include_str!("../../../proto/proto/api.proto");
        let mut message = "";
        let mut taking = Vec::new();
        for line in text.lines().map(str::trim) {
            if let Some(m) = line.strip_prefix("message ") {
                message = m.trim_end_matches('{').trim();
            }
            if line.starts_with("string run_as = ") {
                taking.push(message);
            }
        }
        // SubmitJob: sbatch, quorum submit, salloc, srun, the REST API; AddCron: quorum cron add.
        assert_eq!(taking, ["SubmitJobRequest", "AddCronRequest"], "a request takes a uid: decide it with job_owner");
        let root = caller("root", 0, Role::Admin);
        let admin = caller("boss", 1000, Role::Admin);
        let operator = caller("qop", 1001, Role::Operator);
        let user = caller("mallory", 1002, Role::User);
        for c in [&root, &admin, &operator, &user] {
            assert_eq!(job_owner(c, "").unwrap(), c.user, "no --uid: the caller's own");
            assert_eq!(job_owner(c, &c.user).unwrap(), c.user);
        }
        for c in [&admin, &operator, &user] {
            let e = job_owner(c, "root").unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
            assert!(e.message().contains("only root may submit a job as another user"), "{e:?}");
        }
        assert_eq!(job_owner(&root, "root").unwrap(), "root");
        let e = job_owner(&root, "no-such-user-here").unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    }
}
