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
/// How long `-f` waits for a running job's output to become readable (its file made, its
/// agent connected).
const FILE_WAIT: Duration = Duration::from_secs(10);

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
    let mut waited_for_file = Duration::ZERO;
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
            .await;
        let r = match r {
            Ok(r) => r,
            // A job is RUNNING once its start is committed, a moment before its agent has made
            // its output file (or before the replica answering has applied the start), and its
            // agent may be reconnecting: while the job runs, -f waits instead of giving up.
            Err(e) if opts.follow && e.code() == tonic::Code::FailedPrecondition && offset == 0 => {
                if job_state(client, opts.job_id).await? != "RUNNING" || waited_for_file >= FILE_WAIT {
                    return Err(e);
                }
                if waited_for_file.is_zero() {
                    let _ = writeln!(
                        note,
                        "job {} runs, but its output cannot be read yet ({}); waiting",
                        opts.job_id,
                        e.message()
                    );
                }
                tokio::time::sleep(POLL).await;
                waited_for_file += POLL;
                continue;
            }
            Err(e) => return Err(e),
        };
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
