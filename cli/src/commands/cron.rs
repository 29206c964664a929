//! `quorum cron add|list|remove`: recurring jobs, like Slurm's scrontab. An entry is a cron
//! schedule, a time zone, and a job given as to `quorum submit` (its options, then a script or
//! `-- COMMAND`); each firing submits the job as its owner, once, through leader failovers.

use std::process::ExitCode;

use quorum_client::display;
use quorum_client::submit::SubmitOpts;
use quorum_proto::api;

use super::submit::{payload_of, prepare};
use super::Context;

#[derive(clap::Subcommand)]
#[command(defer = true)] // built when invoked, as `quorum`'s own subcommands are
pub enum Args {
    /// Add an entry: `quorum cron add "*/15 * * * *" [--tz local] [submit options] (SCRIPT | --
    /// COMMAND...)`. The schedule has cron's five fields (minute hour day-of-month month
    /// day-of-week), or six with seconds first, or @hourly, @daily, @weekly, @monthly, @yearly.
    Add {
        /// When it fires: cron's five fields, six with seconds first, or @hourly, @daily, @weekly,
        /// @monthly, @yearly (quote it).
        schedule: String,
        /// UTC (the default), local (the controllers' time zone), or an offset such as +05:30.
        #[arg(long = "tz", default_value = "UTC")]
        zone: String,
        #[command(flatten)]
        opts: Box<SubmitOpts>,
        /// A batch script; its #SBATCH lines are read for options.
        script: Option<String>,
        /// The command to run, after `--`.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Your entries (every user's, for operators).
    List {
        /// Print JSON instead of a table, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Remove an entry (yours; operators: any).
    Remove {
        /// The entry's id, as `quorum cron list` shows it.
        id: u64,
    },
}

pub async fn run(ctx: &Context, args: Args) -> anyhow::Result<ExitCode> {
    match args {
        Args::Add { schedule, zone, opts, script, command } => {
            let payload = payload_of(script, command)?;
            let (spec, built) = prepare(ctx, *opts, Vec::new(), payload, Vec::new(), None).await?;
            for w in &built.warnings {
                eprintln!("quorum: warning: {w}");
            }
            let run_as = built.run_as.clone().unwrap_or_default();
            let req = api::AddCronRequest { schedule, zone, spec: Some(spec), run_as };
            let r = ctx.send(req, |mut c, r| async move { c.add_cron(r).await }).await?;
            let e = r.entry.unwrap_or_default();
            println!("Added cron entry {}: next at {} ({})", e.id, display::local_time_or(e.next_ms, "never"), e.zone);
        }
        Args::List { json } => {
            let req = api::ListCronRequest { stale: ctx.stale };
            let r = ctx.send(req, |mut c, r| async move { c.list_cron(r).await }).await?;
            if json {
                let entries: Vec<serde_json::Value> = r.entries.iter().map(entry_json).collect();
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else {
                print!("{}", table(&r.entries));
            }
        }
        Args::Remove { id } => {
            let req = api::RemoveCronRequest { id };
            ctx.send(req, |mut c, r| async move { c.remove_cron(r).await }).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What an entry runs, in a few words: its job's name, or its command.
fn what(e: &api::CronInfo) -> String {
    let Some(spec) = &e.spec else { return String::new() };
    let text = if spec.script.is_empty() { spec.argv.join(" ") } else { spec.name.clone() };
    text.chars().take(40).collect()
}

fn entry_json(e: &api::CronInfo) -> serde_json::Value {
    serde_json::json!({
        "id": e.id,
        "user": e.user,
        "schedule": e.schedule,
        "zone": e.zone,
        "next_ms": e.next_ms,
        "fired": e.fired,
        "last_fired_ms": e.last_fired_ms,
        "last_job": e.last_job,
        "last_error": e.last_error,
        "job": what(e),
    })
}

pub fn table(entries: &[api::CronInfo]) -> String {
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                e.user.clone(),
                e.schedule.clone(),
                e.zone.clone(),
                display::local_time_or(e.next_ms, "never"),
                e.fired.to_string(),
                if e.last_job == 0 { "-".into() } else { e.last_job.to_string() },
                if e.last_error.is_empty() { what(e) } else { format!("{} (last: {})", what(e), e.last_error) },
            ]
        })
        .collect();
    display::table(&["ID", "USER", "SCHEDULE", "TZ", "NEXT", "FIRED", "LAST_JOB", "JOB"], &rows)
}
