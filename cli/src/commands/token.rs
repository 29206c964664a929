//! `quorum token`: a token that proves who you are where MUNGE cannot (off the cluster, the
//! HTTP API), like `scontrol token`. Use it as `QUORUM_TOKEN=...` or `--token`.

use std::process::ExitCode;

use quorum_model::parse::parse_time_limit;
use quorum_proto::api;

use super::Context;

#[derive(clap::Args)]
pub struct Args {
    /// How long it is valid, as a time limit: `1-00:00:00`, `12:00:00`, `90` (minutes).
    #[arg(long, default_value = "1-00:00:00")]
    lifespan: String,
    /// For another user (an admin only).
    #[arg(long)]
    user: Option<String>,
}

pub async fn run(ctx: &Context, Args { lifespan, user }: Args) -> anyhow::Result<ExitCode> {
    let lifespan_s = parse_time_limit(&lifespan)
        .map_err(|e| anyhow::anyhow!("--lifespan: {e}"))?
        .ok_or_else(|| anyhow::anyhow!("--lifespan: a token needs an end"))?;
    let req = api::IssueTokenRequest { user: user.unwrap_or_default(), lifespan_s };
    let r = ctx.send(req, |mut c, r| async move { c.issue_token(r).await }).await?;
    println!("QUORUM_TOKEN={}", r.token);
    Ok(ExitCode::SUCCESS)
}
