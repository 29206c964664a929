//! `quorum hold`, `quorum release` and `quorum requeue`: keep pending jobs from starting, let
//! them, or send running jobs back to the queue; `quorum suspend` and `quorum resume` (operators)
//! freeze running jobs where they run and thaw them. `scontrol hold|release|requeue|suspend|
//! resume` are the same.

use std::process::ExitCode;

use quorum_proto::api;

use super::{current_user, Context};

#[derive(clap::Args)]
pub struct Args {
    /// The jobs, by id.
    #[arg(required = true)]
    jobs: Vec<u64>,
}

/// What is done to the jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Hold,
    Release,
    Requeue,
    Suspend,
    Resume,
}

pub async fn run(ctx: &Context, Args { jobs }: Args, action: Action) -> anyhow::Result<ExitCode> {
    let errors = control(ctx, jobs, action).await?;
    for e in &errors {
        eprintln!("quorum: error: {e}");
    }
    Ok(if errors.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Does `action` to each of `jobs`; the error of each job it failed for.
pub async fn control(ctx: &Context, jobs: Vec<u64>, action: Action) -> anyhow::Result<Vec<String>> {
    let req = api::HoldJobRequest {
        job_ids: jobs,
        user: current_user(),
        release: action == Action::Release,
        requeue: action == Action::Requeue,
        suspend: action == Action::Suspend,
        resume: action == Action::Resume,
    };
    let r = ctx.send(req, |mut c, r| async move { c.hold_job(r).await }).await?;
    Ok(r.results.into_iter().filter(|r| !r.ok).map(|r| r.error).collect())
}
