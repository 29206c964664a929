//! `quorum submit`: a batch script or a command, like sbatch.

use std::process::ExitCode;

use quorum_client::submit::{build_spec, submit_environment, Payload, SubmitOpts};
use quorum_proto::api;

use super::{current_user, Context};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    opts: Box<SubmitOpts>,
    /// A batch script; its #SBATCH lines are read for options.
    script: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true)]
    command: Vec<String>,
}

pub async fn run(ctx: &Context, Args { opts, script, command }: Args) -> anyhow::Result<ExitCode> {
    let payload = match (script, command.is_empty()) {
        (Some(_), false) => anyhow::bail!("give a script or -- COMMAND, not both"),
        (Some(path), true) => {
            let text =
                std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("cannot read script '{path}': {e}"))?;
            Payload::Script { path, text }
        }
        (None, false) => Payload::Command(command),
        (None, true) => anyhow::bail!("nothing to run: give a script or -- COMMAND [ARGS...]"),
    };
    let job_id = submit(ctx, *opts, payload).await?;
    println!("Submitted job {job_id}");
    Ok(ExitCode::SUCCESS)
}

/// Submits `payload` with `opts` as this user, from this directory and environment; the job's id.
pub async fn submit(ctx: &Context, opts: SubmitOpts, payload: Payload) -> anyhow::Result<u64> {
    let cwd = std::env::current_dir()?;
    let spec = build_spec(opts, payload, &cwd, submit_environment()).map_err(anyhow::Error::msg)?;
    let req =
        api::SubmitJobRequest { spec: Some(spec), user: current_user(), request_id: uuid::Uuid::new_v4().to_string() };
    Ok(ctx.send(req, |mut c, r| async move { c.submit_job(r).await }).await?.job_id)
}
