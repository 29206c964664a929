//! `quorum cluster`: each controller replica's Raft status.

use std::process::ExitCode;

use quorum_client::display;

use super::{print_json, replica_statuses, Context};

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of a table, for scripts.
    #[arg(long)]
    json: bool,
}

pub async fn run(ctx: &Context, Args { json }: Args) -> anyhow::Result<ExitCode> {
    let replicas = replica_statuses(&ctx.client).await?;
    if json {
        print_json(&replicas)?;
    } else {
        print!("{}", display::cluster_table(&replicas));
    }
    Ok(ExitCode::SUCCESS)
}
