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
    #[arg(long)]
    json: bool,
}

pub async fn run(ctx: &Context, Args { all, start, user, json }: Args) -> anyhow::Result<ExitCode> {
    let stale = ctx.stale;
    let mut req = api::ListJobsRequest {
        states: if start {
            vec!["PENDING".into()]
        } else if all {
            vec![]
        } else {
            vec!["PENDING".into(), "RUNNING".into()]
        },
        user: user.unwrap_or_default(),
        stale,
        ..Default::default()
    };
    // Page by page: each answer stays under a gRPC message's limit however large the queue.
    let mut r = ctx.send(req.clone(), |mut c, r| async move { c.list_jobs(r).await }).await?;
    while r.next_after != 0 {
        req.after = r.next_after;
        let page = ctx.send(req.clone(), |mut c, r| async move { c.list_jobs(r).await }).await?;
        r.jobs.extend(page.jobs);
        (r.next_after, r.applied_index, r.now_ms) = (page.next_after, page.applied_index, page.now_ms);
    }
    note_stale(ctx.stale, r.applied_index);
    if json {
        print_json(&r.jobs.iter().map(display::job_json).collect::<Vec<_>>())?;
    } else if start {
        print!("{}", display::start_table(&r.jobs));
    } else {
        print!("{}", display::queue_table(&r.jobs, r.now_ms));
    }
    Ok(ExitCode::SUCCESS)
}
