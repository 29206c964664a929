//! `quorum logs`: a piece of a job's output file, read on its node; and `sstat`: what a running
//! job's processes use now, read on each of its nodes. The leader finds the job and
//! the node, asks that node's agent over its stream (the agent expands the job's output pattern
//! as it did when it started the rank), and answers with the bytes and the offset to read from
//! next. `quorum logs -f` follows a running job by asking again from that offset.

use std::time::Duration;

use quorum_proto::api::{JobLogsRequest, JobLogsResponse, JobUsageRequest, JobUsageResponse, NodeUsage};
use tonic::Status;

use quorum_auth::Caller;

use super::api::Api;
use crate::model::JobState;

/// The most one answer carries.
pub const MAX_CHUNK: u32 = 256 << 10;
const DEFAULT_CHUNK: u32 = 64 << 10;
/// How long the agent has to answer.
const AGENT_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) async fn job_logs(api: &Api, caller: &Caller, r: JobLogsRequest) -> Result<JobLogsResponse, Status> {
    let (launch, node, finished) = {
        let applied = api.replica.shared.read();
        let state = &applied.state;
        let job =
            state.jobs.get(&r.job_id).ok_or_else(|| Status::not_found(format!("there is no job {}", r.job_id)))?;
        if !caller.may_act_on(&job.user) {
            return Err(Status::permission_denied(format!(
                "job {} is another user's: only its owner or an operator may read its output",
                r.job_id
            )));
        }
        let Some(allocation) = job.allocation.as_ref() else {
            return Err(Status::failed_precondition(format!(
                "job {} has not started, so it has no output yet (it is {})",
                r.job_id,
                job.state.name()
            )));
        };
        let node = if r.node.is_empty() {
            allocation.nodes[0].node.clone()
        } else if job.spec.batch_step && allocation.nodes[0].node != r.node {
            return Err(Status::not_found(format!(
                "job {}'s script runs on its first node, {}, only; its steps' output goes to their srun",
                r.job_id, allocation.nodes[0].node
            )));
        } else if allocation.nodes.iter().any(|a| a.node == r.node) {
            r.node.clone()
        } else {
            return Err(Status::not_found(format!(
                "job {} did not run on {}; it ran on {}",
                r.job_id,
                r.node,
                allocation.nodelist()
            )));
        };
        let launch = api.leader.hub.launch_for(state, r.job_id, &node).expect("the node is in the job's allocation");
        (launch, node, !job.state.is_allocated())
    };
    let max = if r.max_bytes == 0 { DEFAULT_CHUNK } else { r.max_bytes.min(MAX_CHUNK) };
    let (request_id, answer) = api.leader.hub.read_output(&node, launch, r.stderr, r.offset, max).ok_or_else(|| {
        Status::failed_precondition(format!("node {node} has no agent connected: the output there cannot be read now"))
    })?;
    let chunk = agent_answer(api, &node, request_id, answer).await?;
    if !chunk.error.is_empty() {
        return Err(Status::failed_precondition(format!("on {node}: {}", chunk.error)));
    }
    let next_offset = r.offset + chunk.data.len() as u64;
    Ok(JobLogsResponse { data: chunk.data, path: chunk.path, node, finished, next_offset })
}

/// `sstat`: each node's agent says what the job's processes there use now.
pub(super) async fn job_usage(api: &Api, caller: &Caller, r: JobUsageRequest) -> Result<JobUsageResponse, Status> {
    let nodes: Vec<String> = {
        let applied = api.replica.shared.read();
        let job = applied
            .state
            .jobs
            .get(&r.job_id)
            .ok_or_else(|| Status::not_found(format!("there is no job {}", r.job_id)))?;
        if !caller.may_act_on(&job.user) {
            return Err(Status::permission_denied(format!(
                "job {} is another user's: only its owner or an operator may see what it uses",
                r.job_id
            )));
        }
        match (&job.allocation, job.state) {
            (Some(a), JobState::Running | JobState::Suspended) => a.nodes.iter().map(|n| n.node.clone()).collect(),
            _ => {
                return Err(Status::failed_precondition(format!(
                    "job {} is not running (it is {}): sacct has what it used",
                    r.job_id,
                    job.state.name()
                )))
            }
        }
    };
    let mut answers = Vec::new();
    for node in nodes {
        let (request_id, answer) = api.leader.hub.read_usage(&node, r.job_id).ok_or_else(|| {
            Status::unavailable(format!("node {node} has no agent connected: its usage cannot be read now"))
        })?;
        answers.push((node, request_id, answer));
    }
    let mut out = Vec::new();
    for (node, request_id, answer) in answers {
        let sample = agent_answer(api, &node, request_id, answer).await?;
        if !sample.error.is_empty() {
            return Err(Status::failed_precondition(format!("on {node}: {}", sample.error)));
        }
        out.push(NodeUsage { node, usage: sample.usage, rss_kb: sample.rss_kb, processes: sample.processes });
    }
    Ok(JobUsageResponse { job_id: r.job_id, nodes: out })
}

/// An agent's answer to a read of the leader's, within [`AGENT_TIMEOUT`]; the read is forgotten
/// when none comes.
async fn agent_answer<T>(
    api: &Api,
    node: &str,
    request_id: u64,
    answer: tokio::sync::oneshot::Receiver<T>,
) -> Result<T, Status> {
    match tokio::time::timeout(AGENT_TIMEOUT, answer).await {
        Ok(Ok(answer)) => Ok(answer),
        _ => {
            api.leader.hub.forget_read(request_id);
            Err(Status::deadline_exceeded(format!(
                "the agent of {node} did not answer within {}s",
                AGENT_TIMEOUT.as_secs()
            )))
        }
    }
}
