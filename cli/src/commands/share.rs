//! `quorum share`: the account tree with shares, usage and fairshare factors, like sshare.

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
    let r = ctx.send(api::SharesRequest {}, |mut c, r| async move { c.shares(r).await }).await?;
    if json {
        print_json(&display::share_json(&r))?;
    } else {
        print!("{}", display::share_table(&r));
    }
    Ok(ExitCode::SUCCESS)
}
