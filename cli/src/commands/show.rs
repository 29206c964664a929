//! `quorum show`: one job in detail, like scontrol show job.

use std::process::ExitCode;

use quorum_client::client::JobRef;
use quorum_client::display;
use quorum_proto::api;

use super::{note_stale, print_json, Context};

#[derive(clap::Args)]
pub struct Args {
    /// A job id, or ARRAY_TASK such as 12_3.
    job: JobRef,
    /// Print JSON instead of a table, for scripts.
    #[arg(long)]
    json: bool,
}

pub async fn run(ctx: &Context, Args { job, json }: Args) -> anyhow::Result<ExitCode> {
    let req = api::GetJobRequest { job_id: job.id, stale: ctx.stale, array_task_id: job.task };
    let r = ctx.send(req, |mut c, r| async move { c.get_job(r).await }).await?;
    note_stale(ctx.stale, r.applied_index);
    let info = r.job.ok_or_else(|| anyhow::anyhow!("empty answer"))?;
    if json {
        print_json(&display::job_json(&info))?;
    } else {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
        let priority = ctx.pending_priorities(std::slice::from_ref(&info)).await.get(&info.id).copied();
        print!("{}", display::show_job(&info, now, priority));
    }
    Ok(ExitCode::SUCCESS)
}
