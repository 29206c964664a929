//! `quorum cancel`: cancel jobs, or signal them, like scancel.

use std::process::ExitCode;

use quorum_client::client::JobRef;
use quorum_proto::api;

use super::{current_user, status_error, Context};

#[derive(clap::Args)]
pub struct Args {
    /// Job ids; an array's id cancels the whole array, ARRAY_TASK (12_3) one task.
    #[arg(required = true)]
    jobs: Vec<JobRef>,
    /// Only send this signal (USR1, SIGUSR1, 10) to the running jobs' processes on every
    /// node, like scancel --signal; the jobs are not cancelled.
    #[arg(long, short = 's')]
    signal: Option<String>,
}

pub async fn run(ctx: &Context, Args { jobs, signal }: Args) -> anyhow::Result<ExitCode> {
    let signalling = signal.is_some();
    let (mut job_ids, mut task_job_ids) = (Vec::new(), Vec::new());
    for j in jobs {
        match j.task {
            None => job_ids.push(j.id),
            Some(_) => task_job_ids.push(j.resolve(&ctx.client).await.map_err(status_error)?),
        }
    }
    let req = api::CancelJobRequest {
        job_ids,
        user: current_user(),
        signal: signal.unwrap_or_default(),
        task_job_ids,
        ..Default::default()
    };
    let r = ctx.send(req, |mut c, r| async move { c.cancel_job(r).await }).await?;
    let mut failed = false;
    for res in r.results {
        if !res.ok {
            eprintln!("quorum: error: {}", res.error);
            failed = true;
        } else if signalling {
            println!("signalled job {}", res.job_id);
        }
    }
    if failed {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
