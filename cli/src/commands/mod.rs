//! One module per `quorum` command, as mini-redis has one per command: its arguments and what
//! it does. What every command shares (the client, who the user is, printing) is here.

pub mod admin;
pub mod cancel;
pub mod cluster;
pub mod cron;
pub mod hold;
pub mod logs;
pub mod nodes;
pub mod prio;
pub mod queue;
pub mod reservation;
pub mod share;
pub mod show;
pub mod submit;
pub mod token;
pub mod update;
pub mod whoami;

use std::future::Future;

use quorum_client::client::{Api, Client};
use quorum_client::display;

/// What every command runs with.
pub struct Context {
    pub client: Client,
    /// Answer reads from the first replica that answers (`--stale`).
    pub stale: bool,
}

impl Context {
    /// Sends `req` through `rpc`, retried on each replica the client tries (each try sends a
    /// copy), and turns a refusal into an error.
    pub async fn send<Req, T, F, Fut>(&self, req: Req, rpc: F) -> anyhow::Result<T>
    where
        Req: Clone,
        F: Fn(Api, Req) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.client.call(|c| rpc(c, req.clone())).await.map_err(status_error)
    }

    /// The priority of each pending job of `jobs` as the scheduler ranks it now (what `sprio`
    /// shows; a held job's is 0, as Slurm's). Empty when the cluster does not answer: a job's
    /// display goes on without it.
    pub async fn pending_priorities(
        &self,
        jobs: &[quorum_proto::api::JobInfo],
    ) -> std::collections::BTreeMap<u64, u64> {
        let pending = |j: &&quorum_proto::api::JobInfo| j.state == "PENDING";
        let mut out: std::collections::BTreeMap<u64, u64> =
            jobs.iter().filter(pending).filter(|j| !j.held.is_empty()).map(|j| (j.id, 0)).collect();
        let job_ids: Vec<u64> = jobs.iter().filter(pending).filter(|j| j.held.is_empty()).map(|j| j.id).collect();
        if job_ids.is_empty() {
            return out;
        }
        let req = quorum_proto::api::PriorityRequest { job_ids };
        if let Ok(r) = self.send(req, |mut c, r| async move { c.priorities(r).await }).await {
            out.extend(r.jobs.iter().map(|p| (p.job_id, p.total.max(0.0).round() as u64)));
        }
        out
    }

    /// Every job `req` asks for, page by page (each answer stays under a gRPC message's limit
    /// however large the queue), as one answer: the last page's index and time.
    pub async fn list_all_jobs(
        &self,
        mut req: quorum_proto::api::ListJobsRequest,
    ) -> anyhow::Result<quorum_proto::api::ListJobsResponse> {
        let mut all = self.send(req.clone(), |mut c, r| async move { c.list_jobs(r).await }).await?;
        while all.next_after != 0 {
            req.after = all.next_after;
            let page = self.send(req.clone(), |mut c, r| async move { c.list_jobs(r).await }).await?;
            all.jobs.extend(page.jobs);
            (all.next_after, all.applied_index, all.now_ms) = (page.next_after, page.applied_index, page.now_ms);
        }
        Ok(all)
    }
}

/// The user this process runs as (the real uid's name). Controllers take the caller from its
/// credential and ignore this; controllers of releases before authentication read it.
pub fn current_user() -> String {
    // SAFETY: getpwuid returns a pointer into static storage or null; read at once.
    unsafe {
        let pw = libc::getpwuid(libc::getuid());
        if !pw.is_null() && !(*pw).pw_name.is_null() {
            return std::ffi::CStr::from_ptr((*pw).pw_name).to_string_lossy().into_owned();
        }
        format!("uid{}", libc::getuid())
    }
}

pub fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub fn status_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", status.message())
}

/// Says on standard error at which log index a stale read was answered.
pub fn note_stale(stale: bool, applied_index: u64) {
    if stale {
        eprintln!("(stale read: as of log index {applied_index} on the replica that answered)");
    }
}

/// Each member of the cluster with what it says of itself (unreachable ones included).
pub async fn replica_statuses(client: &Client) -> anyhow::Result<Vec<display::ReplicaJson>> {
    display::replica_statuses(client).await.map_err(status_error)
}
