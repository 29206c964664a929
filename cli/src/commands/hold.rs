//! `quorum hold` and `quorum release`: keep pending jobs from starting, or let them.

use std::process::ExitCode;

use quorum_proto::api;

use super::{current_user, Context};

#[derive(clap::Args)]
pub struct Args {
    #[arg(required = true)]
    jobs: Vec<u64>,
}

pub async fn run(ctx: &Context, Args { jobs }: Args, release: bool) -> anyhow::Result<ExitCode> {
    let req = api::HoldJobRequest { job_ids: jobs, user: current_user(), release };
    let r = ctx.send(req, |mut c, r| async move { c.hold_job(r).await }).await?;
    let failed: Vec<_> = r.results.iter().filter(|r| !r.ok).collect();
    for f in &failed {
        eprintln!("quorum: error: {}", f.error);
    }
    if !failed.is_empty() {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
