//! `quorum prio`: each pending job's priority and its factors, like sprio.

use std::process::ExitCode;

use quorum_client::display;
use quorum_proto::api;

use super::{print_json, Context};

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of a table, for scripts.
    #[arg(long)]
    json: bool,
}

pub async fn run(ctx: &Context, Args { json }: Args) -> anyhow::Result<ExitCode> {
    let r = ctx.send(api::PriorityRequest::default(), |mut c, r| async move { c.priorities(r).await }).await?;
    if json {
        print_json(&display::prio_json(&r))?;
    } else {
        print!("{}", display::prio_table(&r));
    }
    Ok(ExitCode::SUCCESS)
}
