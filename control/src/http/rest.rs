//! The REST API, `/api/v1/…`: JSON over the HTTP port, for portals, exporters and the
//! dashboard. Each operation is answered by the public API's handler for the same RPC
//! ([`crate::server::Api`]), with the caller its token proves and the role that RPC's rule asks
//! for; a follower forwards to the leader as it does for gRPC. Its resources are the protocol's
//! messages as JSON (the field names of `api.proto`; a missing field is its zero value, an
//! unknown one is refused), plus the plan, the cluster and log chunks, which are this module's.
//! The OpenAPI document at `/api/v1/openapi.json` is derived from the same types.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use quorum_auth::listener::Peer;
use quorum_auth::Caller;
use quorum_proto::api::quorum_server::Quorum;
use quorum_proto::api::*;
use serde::{Deserialize, Serialize};
use tonic::Code;
use utoipa::{IntoParams, OpenApi, ToSchema};

use super::shared::Http;
use crate::model::JobState;

/// The routes of the REST API.
pub fn routes() -> Router<Arc<Http>> {
    Router::new()
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/jobs", get(list_jobs).post(submit_job))
        .route("/api/v1/jobs/{id}", get(get_job))
        .route("/api/v1/jobs/{id}/cancel", post(cancel_job))
        .route("/api/v1/jobs/{id}/hold", post(hold_job))
        .route("/api/v1/jobs/{id}/release", post(release_job))
        .route("/api/v1/jobs/{id}/requeue", post(requeue_job))
        .route("/api/v1/jobs/{id}/update", post(update_job))
        .route("/api/v1/jobs/{id}/suspend", post(suspend_job))
        .route("/api/v1/jobs/{id}/resume", post(resume_job))
        .route("/api/v1/jobs/{id}/logs", get(job_logs))
        .route("/api/v1/jobs/{id}/usage", get(job_usage))
        .route("/api/v1/accounting/jobs", get(accounting_jobs))
        .route("/api/v1/nodes", get(list_nodes))
        .route("/api/v1/partitions", get(list_partitions))
        .route("/api/v1/plan", get(plan))
        .route("/api/v1/priorities", get(priorities))
        .route("/api/v1/shares", get(shares))
        .route("/api/v1/cluster", get(cluster))
        .route("/api/v1/whoami", get(who_am_i))
        // A submit may carry a script and an environment up to the admission limits; axum's
        // default (2 MB) refused them before they were checked.
        .layer(axum::extract::DefaultBodyLimit::max(crate::model::limits::MAX_REST_BODY_BYTES))
}

/// The OpenAPI document of the REST API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Quorum REST API",
        description = "Jobs, nodes, partitions, the plan, accounting and the cluster of a Quorum batch scheduler. \
            Every operation needs `Authorization: Bearer <token>` (from `quorum token`) or a MUNGE credential \
            (`Authorization: MUNGE <credential>`); a user sees and acts on their own jobs, operators and \
            administrators on every job."
    ),
    paths(
        list_jobs,
        submit_job,
        get_job,
        cancel_job,
        hold_job,
        release_job,
        requeue_job,
        update_job,
        suspend_job,
        resume_job,
        job_logs,
        job_usage,
        accounting_jobs,
        list_nodes,
        list_partitions,
        plan,
        priorities,
        shares,
        cluster,
        who_am_i
    ),
    components(schemas(ErrorBody)),
    modifiers(&BearerAuth, &NamedValues),
    security(("bearer" = [])),
    tags(
        (name = "jobs", description = "Submit, read, change, hold, release, requeue and cancel jobs"),
        (name = "nodes", description = "Nodes, partitions and the plan"),
        (name = "accounting", description = "Ended jobs, priorities and fairshare"),
        (name = "cluster", description = "The controller replicas and the caller")
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let scheme = HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("quorum token").build();
        doc.components.get_or_insert_with(Default::default).add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// What the derive cannot say: the values parameters named `state` and `signal` may take, from
/// the names the controllers know; and that a list parameter (`state`, `ids`), when given, has
/// an item (`state=` is no list of states).
struct NamedValues;

impl utoipa::Modify for NamedValues {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
        let ids = ArrayBuilder::new()
            .items(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Int64)))
                    .minimum(Some(0)),
            )
            .min_items(Some(1))
            .build();
        for item in doc.paths.paths.values_mut() {
            let operations = [&mut item.get, &mut item.post, &mut item.put, &mut item.delete, &mut item.patch];
            for op in operations.into_iter().flatten() {
                for parameter in op.parameters.iter_mut().flatten() {
                    match parameter.name.as_str() {
                        "state" => parameter.schema = Some(Schema::Array(states_schema()).into()),
                        "ids" => parameter.schema = Some(Schema::Array(ids.clone()).into()),
                        "signal" => parameter.schema = Some(Schema::Object(signal_schema()).into()),
                        _ => {}
                    }
                }
            }
        }
    }
}

/// The document as served: [`ApiDoc`] with links from a submitted job's id to every operation on
/// one job, so that a client (or a tester) can follow them. They are added to the JSON because
/// utoipa 5.5 writes a link's `operationId` as `operation_id`.
fn document() -> serde_json::Value {
    let doc = ApiDoc::openapi();
    let on_a_job: Vec<String> = doc
        .paths
        .paths
        .iter()
        .filter(|(path, _)| path.contains("{id}"))
        .flat_map(|(_, item)| [&item.get, &item.post].into_iter().flatten().filter_map(|op| op.operation_id.clone()))
        .collect();
    let mut json = serde_json::to_value(doc).unwrap_or_default();
    let links: serde_json::Map<String, serde_json::Value> = on_a_job
        .into_iter()
        .map(|op| (op.clone(), serde_json::json!({"operationId": op, "parameters": {"id": "$response.body#/job_id"}})))
        .collect();
    if let Some(ok) = json.pointer_mut("/paths/~1api~1v1~1jobs/post/responses/200").and_then(|r| r.as_object_mut()) {
        ok.insert("links".into(), links.into());
    }
    json
}

async fn openapi() -> Json<serde_json::Value> {
    static DOCUMENT: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    Json(DOCUMENT.get_or_init(document).clone())
}

/// What a refused or failed request gets: the reason, and its gRPC status code's name.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What is wrong, in words
    pub error: String,
    /// NOT_FOUND, PERMISSION_DENIED, INVALID_ARGUMENT, …
    pub code: String,
}

/// The refusals every operation may answer.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only describes the responses, for the document
enum Refusals {
    /// The request is malformed: a field, parameter or value the message names
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// No credential, or one that does not prove a user
    #[response(status = 401)]
    Unauthenticated(ErrorBody),
    /// The caller may not do this (another user's job, or a role it lacks)
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// No such job or node
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// Not in a state that allows it (a job that ended, a node that is down)
    #[response(status = 409)]
    Conflict(ErrorBody),
    /// No leader now, or the cluster is too old for what was asked; ask again
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// An error answer of the REST API.
pub struct Refusal {
    status: StatusCode,
    body: ErrorBody,
}

impl Refusal {
    fn new(status: StatusCode, code: &str, error: impl Into<String>) -> Refusal {
        Refusal { status, body: ErrorBody { error: error.into(), code: code.to_string() } }
    }

    fn bad_request(error: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", error)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

/// The HTTP status and name of a gRPC status code.
fn http_status(code: Code) -> (StatusCode, &'static str) {
    match code {
        Code::InvalidArgument | Code::OutOfRange => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
        Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
        Code::PermissionDenied => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
        Code::NotFound => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => (StatusCode::CONFLICT, "FAILED_PRECONDITION"),
        Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded => {
            (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE")
        }
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
    }
}

impl From<tonic::Status> for Refusal {
    fn from(status: tonic::Status) -> Refusal {
        let (http, code) = http_status(status.code());
        Refusal::new(http, code, status.message())
    }
}

impl From<QueryRejection> for Refusal {
    fn from(r: QueryRejection) -> Refusal {
        Refusal::bad_request(r.body_text())
    }
}

impl From<PathRejection> for Refusal {
    fn from(r: PathRejection) -> Refusal {
        Refusal::bad_request(r.body_text())
    }
}

impl From<JsonRejection> for Refusal {
    fn from(r: JsonRejection) -> Refusal {
        Refusal::bad_request(r.body_text())
    }
}

type Answer<T> = Result<Json<T>, Refusal>;

/// A request to the REST API: the port's handlers, and what proves who asks.
struct Ask {
    http: Arc<Http>,
    peer: Peer,
    headers: HeaderMap,
}

impl Ask {
    /// Who asks, allowed the RPC `method` of the public API as the gRPC port would allow it.
    fn caller(&self, method: &str) -> Result<Caller, Refusal> {
        let path = format!("/quorum.api.Quorum/{method}");
        Ok(self.http.authenticator.http_check(&path, &self.headers, &self.peer)?)
    }
}

impl FromRequestParts<Arc<Http>> for Ask {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, http: &Arc<Http>) -> Result<Ask, Refusal> {
        let peer = parts.extensions.get::<Peer>().cloned().ok_or_else(|| {
            Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "a request without its connection")
        })?;
        Ok(Ask { http: http.clone(), peer, headers: parts.headers.clone() })
    }
}

/// `message` as a request of `caller`'s, as the authentication layer leaves it for a handler.
fn request<T>(caller: Caller, message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.extensions_mut().insert(caller);
    req
}

/// A comma-separated list parameter's items (none when it is absent; `a,,b` and `` have an
/// empty one, which no list parameter takes).
fn items(list: &Option<String>) -> impl Iterator<Item = &str> {
    list.as_deref().into_iter().flat_map(|l| l.split(','))
}

/// Job ids from a comma-separated list.
fn job_ids(list: &Option<String>, name: &str) -> Result<Vec<u64>, Refusal> {
    items(list)
        .map(|s| match s.parse::<i64>().ok().and_then(|id| u64::try_from(id).ok()) {
            Some(id) => Ok(id),
            None => Err(Refusal::bad_request(format!("{name}: '{s}' is not a job id"))),
        })
        .collect()
}

/// Job states by their names, from a comma-separated list.
fn state_names(list: &Option<String>) -> Result<Vec<String>, Refusal> {
    let named = |s: &str| JobState::ALL.into_iter().find(|state| state.name() == s);
    items(list)
        .map(|s| {
            named(s).map(|state| state.name().to_string()).ok_or_else(|| {
                let all: Vec<&str> = JobState::ALL.iter().map(|state| state.name()).collect();
                Refusal::bad_request(format!("state: '{s}' is not a job state (one of {})", all.join(", ")))
            })
        })
        .collect()
}

/// The document's schema of a list of job states.
fn states_schema() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
    let names = JobState::ALL.map(|state| state.name());
    let name = ObjectBuilder::new().schema_type(Type::String).enum_values(Some(names));
    ArrayBuilder::new().items(name).min_items(Some(1)).build()
}

/// The document's schema of a signal's name.
fn signal_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    let names = crate::model::SIGNALS.map(|(name, _)| name);
    ObjectBuilder::new().schema_type(Type::String).enum_values(Some(names)).build()
}

/// A number parameter that may not be negative. JSON Schema's integer formats are signed, so
/// the document says int64 (or int32) from 0, and the API takes exactly those.
fn natural<S, T>(value: Option<S>, name: &str) -> Result<T, Refusal>
where
    S: Copy + std::fmt::Display,
    T: TryFrom<S> + Default,
{
    match value {
        None => Ok(T::default()),
        Some(v) => T::try_from(v).map_err(|_| Refusal::bad_request(format!("{name}: {v} is negative"))),
    }
}

/// The job id of a path.
fn path_id(id: Result<Path<i64>, PathRejection>) -> Result<u64, Refusal> {
    let Path(id) = id?;
    natural(Some(id), "id")
}

/// Which jobs a listing shows, a page at a time.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct JobsQuery {
    /// Only jobs in these states, comma-separated (PENDING,RUNNING)
    #[param(style = Form, explode = false, value_type = Option<Vec<String>>)]
    state: Option<String>,
    /// Only this user's jobs
    user: Option<String>,
    /// Only these jobs, comma-separated ids (an array's id names all its tasks)
    #[param(style = Form, explode = false, value_type = Option<Vec<u64>>)]
    ids: Option<String>,
    /// The page after this job id (the `next_after` of the previous page)
    #[param(minimum = 0)]
    after: Option<i64>,
    /// At most this many jobs (0 or absent: as many as fit one answer)
    #[param(minimum = 0)]
    limit: Option<i32>,
    /// Also the jobs that left the controllers' memory for the job history
    history: Option<bool>,
    /// Answer from the replica asked, at once, without confirming its leadership
    stale: Option<bool>,
}

/// Lists jobs: by state, user and id, a page at a time.
#[utoipa::path(get, path = "/api/v1/jobs", tag = "jobs", params(JobsQuery),
    responses((status = 200, description = "A page of jobs, oldest first; `next_after` is set when more follow", body = ListJobsResponse), Refusals))]
async fn list_jobs(ask: Ask, query: Result<Query<JobsQuery>, QueryRejection>) -> Answer<ListJobsResponse> {
    let caller = ask.caller("ListJobs")?;
    let Query(q) = query?;
    let r = ListJobsRequest {
        states: state_names(&q.state)?,
        user: q.user.unwrap_or_default(),
        job_ids: job_ids(&q.ids, "ids")?,
        after: natural(q.after, "after")?,
        limit: natural(q.limit, "limit")?,
        history: q.history.unwrap_or(false),
        stale: q.stale.unwrap_or(false),
        ..Default::default()
    };
    Ok(Json(ask.http.api.list_jobs(request(caller, r)).await?.into_inner()))
}

/// Which ended jobs an accounting query shows.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct AccountingQuery {
    /// Only this user's jobs
    user: Option<String>,
    /// Only jobs in these states, comma-separated (COMPLETED,FAILED)
    #[param(style = Form, explode = false, value_type = Option<Vec<String>>)]
    state: Option<String>,
    /// Only jobs that ended at or after this time (milliseconds since the epoch), or have not ended
    #[param(minimum = 0)]
    ended_after_ms: Option<i64>,
    /// Only jobs submitted at or before this time (milliseconds since the epoch)
    #[param(minimum = 0)]
    submitted_before_ms: Option<i64>,
    /// The page after this job id
    #[param(minimum = 0)]
    after: Option<i64>,
    /// At most this many jobs (0 or absent: as many as fit one answer)
    #[param(minimum = 0)]
    limit: Option<i32>,
}

/// Accounting: jobs from the job history as well as those still in memory (`sacct`).
#[utoipa::path(get, path = "/api/v1/accounting/jobs", tag = "accounting", params(AccountingQuery),
    responses((status = 200, description = "A page of jobs, with what they used", body = ListJobsResponse), Refusals))]
async fn accounting_jobs(ask: Ask, query: Result<Query<AccountingQuery>, QueryRejection>) -> Answer<ListJobsResponse> {
    let caller = ask.caller("ListJobs")?;
    let Query(q) = query?;
    let r = ListJobsRequest {
        states: state_names(&q.state)?,
        user: q.user.unwrap_or_default(),
        after: natural(q.after, "after")?,
        limit: natural(q.limit, "limit")?,
        history: true,
        ended_after_ms: natural(q.ended_after_ms, "ended_after_ms")?,
        submitted_before_ms: natural(q.submitted_before_ms, "submitted_before_ms")?,
        ..Default::default()
    };
    Ok(Json(ask.http.api.list_jobs(request(caller, r)).await?.into_inner()))
}

/// Submits a job (`sbatch`): a spec as `quorum submit` sends it, except that `nodes` and
/// `cpus_per_task` left out (or 0) are 1, and `ntasks` left out is one a node. With `test_only`,
/// only checks it and says when and where it would start.
#[utoipa::path(post, path = "/api/v1/jobs", tag = "jobs",
    request_body(content = SubmitJobRequest, example = json!({
        "spec": {"name": "hello", "argv": ["sh", "-c", "echo hello; sleep 30"], "work_dir": "/tmp", "time_limit_s": 60}
    })),
    responses((status = 200, description = "The job's id (or, for test_only, the admitted spec and its expected start)", body = SubmitJobResponse), Refusals))]
async fn submit_job(ask: Ask, body: Result<Json<SubmitJobRequest>, JsonRejection>) -> Answer<SubmitJobResponse> {
    let caller = ask.caller("SubmitJob")?;
    let Json(mut r) = body?;
    if let Some(spec) = r.spec.as_mut() {
        spec.nodes = spec.nodes.max(1);
        spec.cpus_per_task = spec.cpus_per_task.max(1);
        if spec.ntasks == 0 {
            spec.ntasks = spec.nodes;
        }
    }
    Ok(Json(ask.http.api.submit_job(request(caller, r)).await?.into_inner()))
}

/// Which job of an array, and how fresh.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct JobQuery {
    /// The id is an array's: this task of it (12_3)
    #[param(minimum = 0)]
    task: Option<i32>,
    /// Answer from the replica asked, at once, without confirming its leadership
    stale: Option<bool>,
}

/// A job, with its spec, allocation, steps and usage.
#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "jobs",
    params(("id" = i64, Path, minimum = 0, description = "The job's id"), JobQuery),
    responses((status = 200, description = "The job", body = GetJobResponse), Refusals))]
async fn get_job(
    ask: Ask,
    id: Result<Path<i64>, PathRejection>,
    query: Result<Query<JobQuery>, QueryRejection>,
) -> Answer<GetJobResponse> {
    let caller = ask.caller("GetJob")?;
    let (job_id, Query(q)) = (path_id(id)?, query?);
    let array_task_id = q.task.map(|t| natural(Some(t), "task")).transpose()?;
    let r = GetJobRequest { job_id, stale: q.stale.unwrap_or(false), array_task_id };
    Ok(Json(ask.http.api.get_job(request(caller, r)).await?.into_inner()))
}

/// One job's result of a cancel, hold, release or requeue: an error status when it was refused.
fn one_result(results: Vec<CancelResult>, job_id: u64) -> Answer<CancelResult> {
    let result = results.into_iter().next().ok_or_else(|| {
        Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", format!("no result for job {job_id}"))
    })?;
    if result.ok {
        return Ok(Json(result));
    }
    let code = match result.code.as_str() {
        "NOT_FOUND" => Code::NotFound,
        "PERMISSION_DENIED" => Code::PermissionDenied,
        "INVALID_ARGUMENT" => Code::InvalidArgument,
        _ => Code::FailedPrecondition,
    };
    let (status, name) = http_status(code);
    Err(Refusal::new(status, name, result.error))
}

/// A signal instead of a cancel.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct CancelQuery {
    /// Only send this signal (its name without `SIG`: USR1, TERM, ...) to the running job's
    /// processes, as `scancel --signal` does; the job is not cancelled
    signal: Option<String>,
}

/// The signal a cancel names: exactly one of the names the document lists (the command line
/// takes `SIGUSR1`, `usr1` and numbers too; the API takes what it documents, and an empty
/// `signal=` is a mistake, not a cancel).
fn signal_name(signal: Option<String>) -> Result<String, Refusal> {
    match signal {
        None => Ok(String::new()),
        Some(name) if crate::model::SIGNALS.iter().any(|(known, _)| *known == name) => Ok(name),
        Some(name) => {
            let names: Vec<&str> = crate::model::SIGNALS.iter().map(|(known, _)| *known).collect();
            Err(Refusal::bad_request(format!("signal: '{name}' is not one of {}", names.join(", "))))
        }
    }
}

/// Cancels a job (`scancel`): an array's id cancels every task of it. The job stays, CANCELLED,
/// as every ended job does.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/cancel", tag = "jobs",
    params(("id" = i64, Path, minimum = 0, description = "The job's id"), CancelQuery),
    responses((status = 200, description = "Cancelled (`was_running`: it ends once its processes are stopped), or signalled", body = CancelResult), Refusals))]
async fn cancel_job(
    ask: Ask,
    id: Result<Path<i64>, PathRejection>,
    query: Result<Query<CancelQuery>, QueryRejection>,
) -> Answer<CancelResult> {
    let caller = ask.caller("CancelJob")?;
    let (job_id, Query(q)) = (path_id(id)?, query?);
    let r = CancelJobRequest { job_ids: vec![job_id], signal: signal_name(q.signal)?, ..Default::default() };
    one_result(ask.http.api.cancel_job(request(caller, r)).await?.into_inner().results, job_id)
}

/// Holds, releases or requeues one job.
async fn hold(ask: &Ask, id: Result<Path<i64>, PathRejection>, r: HoldJobRequest) -> Answer<CancelResult> {
    let caller = ask.caller("HoldJob")?;
    let job_id = path_id(id)?;
    let r = HoldJobRequest { job_ids: vec![job_id], ..r };
    one_result(ask.http.api.hold_job(request(caller, r)).await?.into_inner().results, job_id)
}

/// Holds a pending job (`scontrol hold`): it is not scheduled until released.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/hold", tag = "jobs",
    params(("id" = i64, Path, minimum = 0, description = "The job's id")),
    responses((status = 200, description = "Held", body = CancelResult), Refusals))]
async fn hold_job(ask: Ask, id: Result<Path<i64>, PathRejection>) -> Answer<CancelResult> {
    hold(&ask, id, HoldJobRequest::default()).await
}

/// Releases a held job (`scontrol release`).
#[utoipa::path(post, path = "/api/v1/jobs/{id}/release", tag = "jobs",
    params(("id" = i64, Path, minimum = 0, description = "The job's id")),
    responses((status = 200, description = "Released", body = CancelResult), Refusals))]
async fn release_job(ask: Ask, id: Result<Path<i64>, PathRejection>) -> Answer<CancelResult> {
    hold(&ask, id, HoldJobRequest { release: true, ..Default::default() }).await
}

/// Requeues a job (`scontrol requeue`): a running job is stopped and goes back to the queue.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/requeue", tag = "jobs",
    params(("id" = i64, Path, minimum = 0, description = "The job's id")),
    responses((status = 200, description = "Requeued", body = CancelResult), Refusals))]
async fn requeue_job(ask: Ask, id: Result<Path<i64>, PathRejection>) -> Answer<CancelResult> {
    hold(&ask, id, HoldJobRequest { requeue: true, ..Default::default() }).await
}

/// Suspends a running job (`scontrol suspend`; operators): its processes are frozen where they
/// run, it keeps its nodes, and its time limit waits until it is resumed.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/suspend", tag = "jobs",
    params(("id" = i64, Path, minimum = 0, description = "The job's id")),
    responses((status = 200, description = "Suspended", body = CancelResult), Refusals))]
async fn suspend_job(ask: Ask, id: Result<Path<i64>, PathRejection>) -> Answer<CancelResult> {
    hold(&ask, id, HoldJobRequest { suspend: true, ..Default::default() }).await
}

/// Resumes a suspended job (`scontrol resume`; operators).
#[utoipa::path(post, path = "/api/v1/jobs/{id}/resume", tag = "jobs",
    params(("id" = i64, Path, minimum = 0, description = "The job's id")),
    responses((status = 200, description = "Resumed", body = CancelResult), Refusals))]
async fn resume_job(ask: Ask, id: Result<Path<i64>, PathRejection>) -> Answer<CancelResult> {
    hold(&ask, id, HoldJobRequest { resume: true, ..Default::default() }).await
}

/// What to change in a job, as `scontrol update` names it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct JobChanges {
    /// Keys (in any case) and values: `TimeLimit` (`MINUTES`, `[D-]H:M:S`, `UNLIMITED`, or
    /// `+TIME` / `-TIME` to move it), `Partition`, `QOS`, `Account`, `Nice`, `Dependency`,
    /// `JobName` (or `Name`), `Comment`, `NumNodes`
    #[schema(example = json!({"TimeLimit": "30", "Comment": "shorter"}))]
    changes: std::collections::HashMap<String, String>,
}

/// Changes a job after its submit (`scontrol update JobId=`): a running job its time limit
/// (only operators raise it), name and comment; a pending one also its partition, QOS,
/// account, nice, dependencies and node count. An array's id changes each task not yet ended.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/update", tag = "jobs",
    params(("id" = i64, Path, minimum = 0, description = "The job's id")),
    request_body(content = JobChanges, example = json!({"changes": {"TimeLimit": "30", "Comment": "shorter"}})),
    responses((status = 200, description = "Changed: each job's result (one, or each task of an array)", body = UpdateJobResponse), Refusals))]
async fn update_job(
    ask: Ask,
    id: Result<Path<i64>, PathRejection>,
    body: Result<Json<JobChanges>, JsonRejection>,
) -> Answer<UpdateJobResponse> {
    let caller = ask.caller("UpdateJob")?;
    let (job_id, Json(body)) = (path_id(id)?, body?);
    let r = UpdateJobRequest { job_ids: vec![job_id], changes: body.changes };
    let answer = ask.http.api.update_job(request(caller, r)).await?.into_inner();
    // The first refusal, as its status; every result when none was refused.
    match answer.results.iter().find(|r| !r.ok).cloned() {
        Some(refused) => one_result(vec![refused], job_id).map(|_| Json(answer)),
        None => Ok(Json(answer)),
    }
}

/// Which part of a job's output.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct LogsQuery {
    /// The error file (--error) instead of the output
    stderr: Option<bool>,
    /// From this byte on (the `next_offset` of the previous chunk)
    #[param(minimum = 0)]
    offset: Option<i64>,
    /// At most this many bytes (the controller caps it)
    #[param(minimum = 0)]
    max_bytes: Option<i32>,
    /// The node whose file to read (absent: the job's first node)
    node: Option<String>,
}

/// A piece of a job's output file.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct LogChunk {
    /// The bytes read, as UTF-8 (a byte that is not is shown as U+FFFD)
    pub text: String,
    /// The file's path on its node
    pub path: String,
    pub node: String,
    /// The job is no longer running: what the file holds now is all there will be
    pub finished: bool,
    /// Where the next read starts
    pub next_offset: u64,
}

/// A piece of a running or ended job's output (`quorum logs`), read on its node.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/logs", tag = "jobs",
    params(("id" = i64, Path, minimum = 0, description = "The job's id"), LogsQuery),
    responses((status = 200, description = "The bytes from `offset` on", body = LogChunk), Refusals))]
async fn job_logs(
    ask: Ask,
    id: Result<Path<i64>, PathRejection>,
    query: Result<Query<LogsQuery>, QueryRejection>,
) -> Answer<LogChunk> {
    let caller = ask.caller("JobLogs")?;
    let (job_id, Query(q)) = (path_id(id)?, query?);
    let r = JobLogsRequest {
        job_id,
        node: q.node.unwrap_or_default(),
        stderr: q.stderr.unwrap_or(false),
        offset: natural(q.offset, "offset")?,
        max_bytes: natural(q.max_bytes, "max_bytes")?,
        ..Default::default()
    };
    let chunk = ask.http.api.job_logs(request(caller, r)).await?.into_inner();
    Ok(Json(LogChunk {
        text: String::from_utf8_lossy(&chunk.data).into_owned(),
        path: chunk.path,
        node: chunk.node,
        finished: chunk.finished,
        next_offset: chunk.next_offset,
    }))
}

/// What a running job uses now, node by node (`sstat`).
#[utoipa::path(get, path = "/api/v1/jobs/{id}/usage", tag = "jobs",
    params(("id" = i64, Path, minimum = 0, description = "The job's id")),
    responses((status = 200, description = "Its usage on each of its nodes", body = JobUsageResponse), Refusals))]
async fn job_usage(ask: Ask, id: Result<Path<i64>, PathRejection>) -> Answer<JobUsageResponse> {
    let caller = ask.caller("JobUsage")?;
    let job_id = path_id(id)?;
    Ok(Json(ask.http.api.job_usage(request(caller, JobUsageRequest { job_id })).await?.into_inner()))
}

/// How fresh a read is.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ReadQuery {
    /// Answer from the replica asked, at once, without confirming its leadership
    stale: Option<bool>,
}

async fn nodes_of(
    http: &Http,
    caller: Caller,
    query: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<ListNodesResponse, Refusal> {
    let Query(q) = query?;
    let r = ListNodesRequest { stale: q.stale.unwrap_or(false) };
    Ok(http.api.list_nodes(request(caller, r)).await?.into_inner())
}

/// The nodes (state, drain reason, CPUs, memory, GPUs and their health), the partitions and the
/// licenses (`sinfo`, `scontrol show node`).
#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", params(ReadQuery),
    responses((status = 200, description = "Every node, partition and license", body = ListNodesResponse), Refusals))]
async fn list_nodes(ask: Ask, query: Result<Query<ReadQuery>, QueryRejection>) -> Answer<ListNodesResponse> {
    let caller = ask.caller("ListNodes")?;
    Ok(Json(nodes_of(&ask.http, caller, query).await?))
}

/// The partitions as configured.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Partitions {
    pub partitions: Vec<PartitionInfo>,
}

/// The partitions (`scontrol show partition`).
#[utoipa::path(get, path = "/api/v1/partitions", tag = "nodes", params(ReadQuery),
    responses((status = 200, description = "Every partition", body = Partitions), Refusals))]
async fn list_partitions(ask: Ask, query: Result<Query<ReadQuery>, QueryRejection>) -> Answer<Partitions> {
    let caller = ask.caller("ListNodes")?;
    Ok(Json(Partitions { partitions: nodes_of(&ask.http, caller, query).await?.partitions }))
}

/// The plan: every node, and the jobs that hold or will hold them, in time.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Plan {
    /// The leader's clock when it answered, in milliseconds since the epoch
    pub now_ms: u64,
    pub nodes: Vec<PlanNode>,
    /// Running jobs, then pending ones (those with a place reserved have `nodes`)
    pub jobs: Vec<PlanJob>,
    /// Advance reservations: their nodes over their window now in force or next
    pub reservations: Vec<PlanReservation>,
}

/// An advance reservation in the plan: its nodes, kept from the jobs outside it over its window.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct PlanReservation {
    pub name: String,
    pub nodes: Vec<String>,
    pub start_ms: u64,
    /// 0: it never ends
    pub end_ms: u64,
    /// MAINT, IGNORE_JOBS, DAILY, WEEKLY
    pub flags: Vec<String>,
    /// Who may use it
    pub users: Vec<String>,
    pub accounts: Vec<String>,
}

#[derive(Serialize, Deserialize, ToSchema)]
pub struct PlanNode {
    pub name: String,
    /// IDLE, MIXED, ALLOCATED, DRAINED, DOWN, …
    pub state: String,
    /// Why it is drained or down
    pub reason: String,
    pub cpus: u32,
    pub alloc_cpus: u32,
    pub gpus: u32,
}

/// A job in the plan: a rectangle over its nodes, from its start to its time limit.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct PlanJob {
    pub id: u64,
    pub name: String,
    pub user: String,
    pub partition: String,
    /// RUNNING or PENDING
    pub state: String,
    /// Why a pending job waits
    pub reason: String,
    pub priority_held: bool,
    /// Its start and nodes are a forecast (on predicted run times), not backfill's reservation
    pub forecast: bool,
    /// Its nodes: a running job's, or where backfill reserved a pending one's (empty: no place
    /// reserved for it yet)
    pub nodes: Vec<String>,
    /// When it started, or is expected to (0: not estimated)
    pub start_ms: u64,
    /// When its time limit ends it (0: not estimated)
    pub end_ms: u64,
}

impl PlanJob {
    fn of(job: JobInfo) -> PlanJob {
        let running = job.state == "RUNNING";
        let (start_ms, nodes) =
            if running { (job.start_time_ms, &job.nodelist) } else { (job.expected_start_ms, &job.expected_nodes) };
        // A malformed list (never from the controllers) leaves the job without nodes.
        let nodes = crate::model::hostlist::expand(nodes).unwrap_or_default();
        let end_ms = if start_ms == 0 { 0 } else { start_ms.saturating_add(job.time_limit_s.saturating_mul(1000)) };
        PlanJob {
            id: job.id,
            name: job.name,
            user: job.user,
            partition: job.partition,
            state: job.state,
            reason: job.reason,
            priority_held: !job.held.is_empty(),
            forecast: !running && job.expected_forecast,
            nodes,
            start_ms,
            end_ms,
        }
    }
}

/// The plan (nodes × time): running jobs from their start to their time limit, and the pending
/// jobs where and when backfill expects to start them; a user sees others' jobs unless the
/// cluster keeps jobs private.
#[utoipa::path(get, path = "/api/v1/plan", tag = "nodes",
    responses((status = 200, description = "Nodes and the jobs on them in time", body = Plan), Refusals))]
async fn plan(ask: Ask) -> Answer<Plan> {
    let caller = ask.caller("ListJobs")?;
    let listed = ask.http.api.list_nodes(request(caller.clone(), ListNodesRequest::default())).await?.into_inner();
    let reservations = listed
        .reservations
        .into_iter()
        .map(|r| PlanReservation {
            nodes: crate::model::hostlist::expand(&r.nodes).unwrap_or_default(),
            name: r.name,
            start_ms: r.start_ms,
            end_ms: r.end_ms,
            flags: r.flags,
            users: r.users,
            accounts: r.accounts,
        })
        .collect();
    let nodes = listed
        .nodes
        .into_iter()
        .map(|n| PlanNode {
            gpus: n.gpus,
            name: n.name,
            state: n.state,
            reason: n.reason,
            cpus: n.cpus,
            alloc_cpus: n.alloc_cpus,
        })
        .collect();
    let (mut jobs, mut after, mut now_ms) = (Vec::new(), 0, 0);
    loop {
        let r = ListJobsRequest { states: vec!["RUNNING".into(), "PENDING".into()], after, ..Default::default() };
        let page = ask.http.api.list_jobs(request(caller.clone(), r)).await?.into_inner();
        now_ms = now_ms.max(page.now_ms);
        jobs.extend(page.jobs.into_iter().map(PlanJob::of));
        if page.next_after == 0 {
            break;
        }
        after = page.next_after;
    }
    jobs.sort_by_key(|j| (j.state != "RUNNING", j.id));
    Ok(Json(Plan { now_ms, nodes, jobs, reservations }))
}

/// Which jobs' priorities.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct PrioritiesQuery {
    /// Only these jobs, comma-separated ids (absent: every pending job)
    #[param(style = Form, explode = false, value_type = Option<Vec<u64>>)]
    ids: Option<String>,
}

/// Pending jobs' priorities, factor by factor (`sprio`).
#[utoipa::path(get, path = "/api/v1/priorities", tag = "accounting", params(PrioritiesQuery),
    responses((status = 200, description = "Each job's priority and its factors, and the weights", body = PriorityResponse), Refusals))]
async fn priorities(ask: Ask, query: Result<Query<PrioritiesQuery>, QueryRejection>) -> Answer<PriorityResponse> {
    let caller = ask.caller("Priorities")?;
    let Query(q) = query?;
    let r = PriorityRequest { job_ids: job_ids(&q.ids, "ids")? };
    Ok(Json(ask.http.api.priorities(request(caller, r)).await?.into_inner()))
}

/// Accounts' shares and usage (`sshare`).
#[utoipa::path(get, path = "/api/v1/shares", tag = "accounting",
    responses((status = 200, description = "Every account's shares, usage and fairshare factor", body = SharesResponse), Refusals))]
async fn shares(ask: Ask) -> Answer<SharesResponse> {
    let caller = ask.caller("Shares")?;
    Ok(Json(ask.http.api.shares(request(caller, SharesRequest {})).await?.into_inner()))
}

/// The controller replicas as each says it stands.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Cluster {
    /// The replica that answered
    pub answered_by: u64,
    pub members: Vec<Member>,
}

/// A member of the cluster's membership.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct Member {
    pub id: u64,
    pub address: String,
    /// What it says of itself (absent when it did not answer)
    pub status: Option<ReplicaStatus>,
    /// Why it did not answer
    pub error: String,
}

/// The replicas: each one's role, term, log indexes, version and feature level (`quorum status`).
#[utoipa::path(get, path = "/api/v1/cluster", tag = "cluster",
    responses((status = 200, description = "Every member, asked within a second", body = Cluster), Refusals))]
async fn cluster(ask: Ask) -> Answer<Cluster> {
    let caller = ask.caller("GetReplicaStatus")?;
    let here = ask.http.api.get_replica_status(request(caller.clone(), ReplicaStatusRequest {})).await?.into_inner();
    let listed = ask.http.api.cluster_members(request(caller, ClusterStatusRequest {})).await?.into_inner();
    let asked = listed.members.into_iter().map(|m| {
        let here = (m.id == here.id).then(|| here.clone());
        let api = ask.http.api.clone();
        async move {
            let answer = match here {
                Some(status) => Ok(status),
                None => api.replica_status_of(&m.address).await,
            };
            let (status, error) = match answer {
                Ok(status) => (Some(status), String::new()),
                Err(e) => (None, e),
            };
            Member { id: m.id, address: m.address, status, error }
        }
    });
    let members = futures::future::join_all(asked).await;
    Ok(Json(Cluster { answered_by: here.id, members }))
}

/// Who the controllers take the caller for, and how they know.
#[utoipa::path(get, path = "/api/v1/whoami", tag = "cluster",
    responses((status = 200, description = "The caller's user, ids and role", body = WhoAmIResponse), Refusals))]
async fn who_am_i(ask: Ask) -> Answer<WhoAmIResponse> {
    let caller = ask.caller("WhoAmI")?;
    Ok(Json(ask.http.api.who_am_i(request(caller, WhoAmIRequest {})).await?.into_inner()))
}
