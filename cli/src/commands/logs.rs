//! `quorum logs`: a job's output, read on its node; -f follows it.

use std::process::ExitCode;

use quorum_client::client::JobRef;

use super::{current_user, status_error, Context};

#[derive(clap::Args)]
pub struct Args {
    /// A job id, or ARRAY_TASK such as 12_3.
    job: JobRef,
    /// Wait for a pending job to start, and follow its output until it ends.
    #[arg(long, short = 'f')]
    follow: bool,
    /// Read the file on this node of the job's allocation.
    #[arg(long)]
    node: Option<String>,
    /// The error file (--error) instead of the output.
    #[arg(long)]
    err: bool,
}

pub async fn run(ctx: &Context, Args { job, follow, node, err }: Args) -> anyhow::Result<ExitCode> {
    let job_id = job.resolve(&ctx.client).await.map_err(status_error)?;
    let opts = quorum_client::logs::LogsOptions { job_id, user: current_user(), follow, node, stderr: err };
    quorum_client::logs::logs(&ctx.client, &opts, &mut std::io::stdout(), &mut std::io::stderr())
        .await
        .map_err(status_error)?;
    Ok(ExitCode::SUCCESS)
}
