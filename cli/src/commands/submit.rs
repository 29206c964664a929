//! `quorum submit`: a batch script or a command, like sbatch.

use std::process::ExitCode;

use quorum_client::submit::{build_spec, Payload, SubmitOpts};
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

/// This host's name, as the kernel has it.
fn submit_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
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
    let cwd = std::env::current_dir()?;
    // Slurm tells a job where it was submitted from, whatever --export says (SLURM_* always
    // goes), and not where an enclosing job was.
    let mut env: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k != "SLURM_SUBMIT_HOST").collect();
    env.push(("SLURM_SUBMIT_HOST".into(), submit_host()));
    let spec = build_spec(*opts, payload, &cwd, env).map_err(anyhow::Error::msg)?;
    let req =
        api::SubmitJobRequest { spec: Some(spec), user: current_user(), request_id: uuid::Uuid::new_v4().to_string() };
    let r = ctx.send(req, |mut c, r| async move { c.submit_job(r).await }).await?;
    println!("Submitted job {}", r.job_id);
    Ok(ExitCode::SUCCESS)
}
