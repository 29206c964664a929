//! `quorum`: the command-line client of a Quorum cluster.
//!
//! It links the API client only (`quorum-client`), not the controller, the agent or RocksDB,
//! because people and scripts run it thousands of times (`for i in ...; do quorum submit ...`)
//! and each run pays for what the binary loads. `quorum dev`, `quorum simulate` and `quorum
//! bench`, which embed the controller, are served by `quorum-dev`, which this process becomes.

mod args;
mod commands;
mod entry;
mod format;
mod man;
mod sacct;
mod sacct_json;
mod sacctmgr;
mod sacctmgr_change;
mod salloc;
mod sbatch;
mod sbcast;
mod scancel;
mod scontrol;
mod seff;
mod sinfo;
mod slurm;
mod sprio;
mod squeue;
mod sreport;
mod srun;
mod sshare;
mod sstat;

use std::path::PathBuf;
use std::process::ExitCode;

use args::{Cli, Command};
use clap::Parser;
use commands::Context;

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Admin { command: commands::admin::Command::Certs(args) } = cli.command {
        return commands::admin::identity::certs(args);
    }
    if let Command::InstallSlurmCommands { dir, man } = &cli.command {
        let linked = slurm::install(dir)?;
        return match man {
            Some(man) => man::write_all(man),
            None => Ok(linked),
        };
    }
    if let Command::Man { dir } = &cli.command {
        return man::write_all(dir);
    }
    let mut client = cli.controllers.client()?;
    if matches!(cli.command, Command::Admin { command: commands::admin::Command::AddReplica { .. } }) {
        // The leader answers once the new replica has caught up, which may take minutes.
        client.call_timeout = std::time::Duration::from_secs(660);
        client.deadline = std::time::Duration::from_secs(700);
    }
    let ctx = Context { client, stale: cli.stale };
    match cli.command {
        Command::Submit(args) => commands::submit::run(&ctx, args).await,
        Command::Queue(args) => commands::queue::run(&ctx, args).await,
        Command::Show(args) => commands::show::run(&ctx, args).await,
        Command::Cancel(args) => commands::cancel::run(&ctx, args).await,
        Command::Logs(args) => commands::logs::run(&ctx, args).await,
        Command::Hold(args) => commands::hold::run(&ctx, args, commands::hold::Action::Hold).await,
        Command::Release(args) => commands::hold::run(&ctx, args, commands::hold::Action::Release).await,
        Command::Requeue(args) => commands::hold::run(&ctx, args, commands::hold::Action::Requeue).await,
        Command::Update(args) => commands::update::run(&ctx, args).await,
        Command::Suspend(args) => commands::hold::run(&ctx, args, commands::hold::Action::Suspend).await,
        Command::Resume(args) => commands::hold::run(&ctx, args, commands::hold::Action::Resume).await,
        Command::Reservation(args) => commands::reservation::run(&ctx, args).await,
        Command::Cron(args) => commands::cron::run(&ctx, args).await,
        Command::Prio(args) => commands::prio::run(&ctx, args).await,
        Command::Share(args) => commands::share::run(&ctx, args).await,
        Command::Admin { command } => commands::admin::run(&ctx, command).await,
        Command::Nodes(args) => commands::nodes::run(&ctx, args).await,
        Command::Cluster(args) => commands::cluster::run(&ctx, args).await,
        Command::Token(args) => commands::token::run(&ctx, args).await,
        Command::Whoami(args) => commands::whoami::run(&ctx, args).await,
        Command::Dev { .. } | Command::Simulate { .. } | Command::Bench { .. } => {
            unreachable!("main hands these to quorum-dev")
        }
        Command::Acct { .. }
        | Command::Bcast { .. }
        | Command::Stat { .. }
        | Command::Eff { .. }
        | Command::Report { .. } => {
            unreachable!("main runs them as sacct, sbcast, sstat, seff and sreport")
        }
        Command::InstallSlurmCommands { .. } | Command::Man { .. } => unreachable!("answered above"),
    }
}

/// Becomes `quorum-dev SUBCOMMAND ARGS...` (beside this program, else on PATH); returns only
/// if that cannot be run.
fn exec_quorum_dev(subcommand: &str, args: Vec<String>, controllers: &[String]) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let here = std::env::current_exe().ok();
    let beside = here.as_ref().map(|p| p.with_file_name("quorum-dev")).filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| PathBuf::from("quorum-dev"));
    let err = std::process::Command::new(&program)
        .arg0("quorum")
        .arg(subcommand)
        .args(args)
        .env("QUORUM_CONTROLLERS", controllers.join(","))
        .exec();
    if err.kind() == std::io::ErrorKind::NotFound {
        let dir = here.as_ref().and_then(|p| p.parent()).map_or("?".into(), |d| d.display().to_string());
        return anyhow::anyhow!(
            "quorum {subcommand} is run by quorum-dev, which is neither beside this program (in {dir}) nor on PATH: \
             build it with `cargo build --release --bin quorum-dev`, or install it with `cargo install --path dev`"
        );
    }
    anyhow::anyhow!("running {}: {err}", program.display())
}

fn main() -> ExitCode {
    // Called by a Slurm command's name (a link made by `quorum install-slurm-commands`).
    let mut argv = std::env::args();
    let name = argv.next().and_then(|a| std::path::Path::new(&a).file_name().map(|n| n.to_string_lossy().into_owned()));
    if let Some(name) = name.filter(|n| slurm::names().any(|known| known == n)) {
        let args: Vec<String> = argv.collect();
        return slurm::run(&name, &args).unwrap_or(ExitCode::FAILURE);
    }
    let cli = Cli::parse();
    let slurm_named = match &cli.command {
        Command::Acct { args } => Some(("sacct", args)),
        Command::Bcast { args } => Some(("sbcast", args)),
        Command::Stat { args } => Some(("sstat", args)),
        Command::Eff { args } => Some(("seff", args)),
        Command::Report { args } => Some(("sreport", args)),
        _ => None,
    };
    if let Some((name, args)) = slurm_named {
        // The Slurm command's own options and output; the controllers as given to quorum, first
        // (sreport takes everything after its report's name as the report's own words).
        let mut args = args.clone();
        if !cli.controllers.controllers.is_empty() && !args.iter().any(|a| a.starts_with("--controllers")) {
            args.insert(0, format!("--controllers={}", cli.controllers.controllers.join(",")));
        }
        return slurm::run(name, &args).unwrap_or(ExitCode::FAILURE);
    }
    let tool = match &cli.command {
        Command::Dev { args } => Some(("dev", args)),
        Command::Simulate { args } => Some(("simulate", args)),
        Command::Bench { args } => Some(("bench", args)),
        _ => None,
    };
    if let Some((subcommand, args)) = tool {
        eprintln!("quorum: error: {:#}", exec_quorum_dev(subcommand, args.clone(), &cli.controllers.controllers));
        return ExitCode::FAILURE;
    }
    // `quorum queue | head` ends quietly when head has read enough, as other Unix tools do,
    // instead of panicking on the closed pipe. (gRPC sockets are written with MSG_NOSIGNAL, so a
    // dropped connection still comes back as an error.)
    // SAFETY: no other thread exists yet; SIG_DFL is a valid disposition for SIGPIPE.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // A client command is one request or a few: one thread runs it, with no worker threads to
    // start and wake (a third of a short command's CPU).
    quorum_client::exit_code(tokio::runtime::Builder::new_current_thread().enable_all().build(), run(cli))
}
