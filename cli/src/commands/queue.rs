//! `quorum queue`: the job queue, like squeue.

use std::process::ExitCode;

use quorum_client::display;
use quorum_proto::api;

use super::{note_stale, print_json, Context};

#[derive(clap::Args)]
pub struct Args {
    /// Include finished jobs.
    #[arg(long, short)]
    all: bool,
    /// Pending jobs with their expected start times, like squeue --start.
    #[arg(long)]
    start: bool,
    /// Only this user's jobs.
    #[arg(long, short)]
    user: Option<String>,
    /// Print JSON instead of a table, for scripts.
    #[arg(long)]
    json: bool,
}

pub async fn run(ctx: &Context, Args { all, start, user, json }: Args) -> anyhow::Result<ExitCode> {
    let stale = ctx.stale;
    let req = api::ListJobsRequest {
        states: if start {
            vec!["PENDING".into()]
        } else if all {
            vec![]
        } else {
            vec!["PENDING".into(), "RUNNING".into(), "SUSPENDED".into()]
        },
        user: user.unwrap_or_default(),
        stale,
        ..Default::default()
    };
    let r = ctx.list_all_jobs(req).await?;
    note_stale(ctx.stale, r.applied_index);
    if json {
        print_json(&r.jobs.iter().map(display::job_json).collect::<Vec<_>>())?;
    } else if start {
        print!("{}", display::start_table(&r.jobs));
        // The advance reservations, which the expected starts keep clear of.
        let resvs = super::reservation::list(ctx).await.map_err(anyhow::Error::msg)?.reservations;
        if !resvs.is_empty() {
            println!("\nAdvance reservations (jobs outside them keep off their nodes):");
            print!("{}", super::reservation::table(&resvs));
        }
    } else {
        print!("{}", display::queue_table(&r.jobs, r.now_ms));
    }
    Ok(ExitCode::SUCCESS)
}
