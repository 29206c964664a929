//! `quorum logs JOB [-f]`: a job's output file, read on its node through the leader, like
//! `kubectl logs`. Without `-f` it prints what the file holds now; with `-f` it waits for a
//! pending job to start, then follows the file until the job has ended and everything it wrote
//! has been printed.

use std::io::Write;
use std::time::Duration;

use quorum_proto::api;

use crate::client::Client;

/// How long `-f` waits before asking again when there was nothing new.
const POLL: Duration = Duration::from_millis(250);

pub struct LogsOptions {
    pub job_id: u64,
    pub user: String,
    pub follow: bool,
    /// The node whose file to read (default: the job's first node).
    pub node: Option<String>,
    /// The error file instead of the output.
    pub stderr: bool,
}

async fn job_state(client: &Client, job_id: u64) -> Result<String, tonic::Status> {
    let req = api::GetJobRequest { job_id, stale: false, array_task_id: None };
    let r = client.call(|mut c| async move { c.get_job(req).await }).await?;
    Ok(r.job.map(|j| j.state).unwrap_or_default())
}

/// Writes the job's output to `out` (see the module comment); `note` gets what is said about it.
pub async fn logs(
    client: &Client,
    opts: &LogsOptions,
    out: &mut (dyn Write + Send),
    note: &mut (dyn Write + Send),
) -> Result<(), tonic::Status> {
    if opts.follow {
        let mut said = false;
        while job_state(client, opts.job_id).await? == "PENDING" {
            if !said {
                let _ = writeln!(note, "job {} is pending; waiting for it to start", opts.job_id);
                said = true;
            }
            tokio::time::sleep(POLL * 2).await;
        }
    }
    let mut offset = 0u64;
    loop {
        let req = api::JobLogsRequest {
            user: opts.user.clone(),
            job_id: opts.job_id,
            node: opts.node.clone().unwrap_or_default(),
            stderr: opts.stderr,
            offset,
            max_bytes: 0,
        };
        let r = client
            .call(|mut c| {
                let req = req.clone();
                async move { c.job_logs(req).await }
            })
            .await?;
        if !r.data.is_empty() {
            out.write_all(&r.data).map_err(|e| tonic::Status::internal(format!("writing the output: {e}")))?;
            let _ = out.flush();
            offset = r.next_offset;
            continue;
        }
        if !opts.follow || r.finished {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}
