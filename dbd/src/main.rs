//! `quorum-dbd`: follows a Quorum cluster's job history into PostgreSQL.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use quorum_client::client::ControllersArg;

/// Follows a Quorum cluster's job history and writes every job that left its hot state to
/// PostgreSQL (tables quorum_jobs, quorum_steps and quorum_export; see schema.sql), resuming
/// where it stopped after a restart or a failover. It asks as an operator: run it as root or as
/// a user given the operator role.
#[derive(Parser, Debug)]
#[command(name = "quorum-dbd", version)]
struct Args {
    #[command(flatten)]
    controllers: ControllersArg,
    /// PostgreSQL's connection string, e.g. "host=/var/run/postgresql dbname=quorum" (a Unix
    /// socket) or "host=db.example user=quorum dbname=quorum".
    #[arg(long, env = "QUORUM_DBD_POSTGRES")]
    postgres: String,
    /// The cluster's name in the tables (several clusters may share one database).
    #[arg(long, env = "QUORUM_DBD_CLUSTER", default_value = "quorum")]
    cluster: String,
    /// Jobs written per transaction.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=5000))]
    batch: u32,
    /// Seconds between asks once every job is written.
    #[arg(long, default_value_t = 5.0)]
    interval_s: f64,
    /// Write what the history holds now, then stop (for cron, or a first export).
    #[arg(long)]
    once: bool,
    /// The certificate authority (PEM) that signed PostgreSQL's certificate: every connection
    /// over TCP is then TLS, and the certificate must name the host the connection string gives.
    #[arg(long, env = "QUORUM_DBD_POSTGRES_CA", value_name = "PEM")]
    postgres_ca: Option<std::path::PathBuf>,
    /// Speak to a PostgreSQL across the network in plaintext (without --postgres-ca, quorum-dbd
    /// refuses a database that is neither a Unix socket nor on this host).
    #[arg(long, conflicts_with = "postgres_ca")]
    postgres_plaintext: bool,
    /// A fault for tests: hold each transaction open this many milliseconds before committing.
    #[arg(long, hide = true, default_value_t = 0)]
    fault_stall_ms: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "quorum_dbd=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if !(args.interval_s.is_finite() && (0.0..=86_400.0).contains(&args.interval_s)) {
        eprintln!("quorum-dbd: --interval-s must be between 0 and 86400 seconds, not {}", args.interval_s);
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("quorum-dbd: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let client = args.controllers.client()?;
        let opts = quorum_dbd::Options {
            postgres: args.postgres.clone(),
            cluster: args.cluster.clone(),
            batch: args.batch,
            interval: Duration::from_secs_f64(args.interval_s),
            once: args.once,
            stall: Duration::from_millis(args.fault_stall_ms),
            ca: args.postgres_ca.clone(),
            plaintext: args.postgres_plaintext,
        };
        tokio::select! {
            r = quorum_dbd::run(client, opts) => r,
            _ = tokio::signal::ctrl_c() => Ok(0),
        }
    });
    match result {
        Ok(n) => {
            tracing::info!(jobs = n, "stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("quorum-dbd: {e:#}");
            ExitCode::FAILURE
        }
    }
}
