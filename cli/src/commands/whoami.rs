//! `quorum whoami`: who the cluster takes you for, with which role, and how it knows.

use std::process::ExitCode;

use quorum_proto::api;

use super::{print_json, Context};

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of a table, for scripts.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct Whoami {
    user: String,
    uid: u32,
    gid: u32,
    role: String,
    proof: String,
}

pub async fn run(ctx: &Context, Args { json }: Args) -> anyhow::Result<ExitCode> {
    let r = ctx.send(api::WhoAmIRequest {}, |mut c, r| async move { c.who_am_i(r).await }).await?;
    if json {
        print_json(&Whoami { user: r.user, uid: r.uid, gid: r.gid, role: r.role, proof: r.proof })?;
    } else {
        println!("{} (uid {}, gid {}): {}, by {}", r.user, r.uid, r.gid, r.role, r.proof);
    }
    Ok(ExitCode::SUCCESS)
}
