//! `quorum-controller --config FILE`: one controller replica.

use std::path::PathBuf;

use clap::Parser;
use quorum_control::ControllerConfig;

#[derive(Parser)]
#[command(name = "quorum-controller", version, about = "A Quorum controller replica")]
struct Args {
    /// The replica's TOML configuration file.
    #[arg(long, short, env = "QUORUM_CONFIG")]
    config: PathBuf,
    /// `text` for people, `json` (one object a line, with every field) for log collectors.
    #[arg(long, env = "QUORUM_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// Export spans to this OTLP (gRPC) endpoint, e.g. `http://collector:4317`.
    #[arg(long, env = quorum_proto::telemetry::OTLP_ENDPOINT_ENV)]
    otlp_endpoint: Option<String>,
    /// Start this replica of a new cluster (the config's replicas) from a backup that `quorum
    /// admin backup` wrote, checked whole first; its data directory must be empty. Restore the
    /// same file on every replica of the new cluster, then start them as usual.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["verify_backup", "force_new_cluster"])]
    restore: Option<PathBuf>,
    /// Check a backup (its checksum, that it is whole, that this release can restore it), say
    /// what it holds, and exit.
    #[arg(long, value_name = "FILE")]
    verify_backup: Option<PathBuf>,
    /// After losing a majority of replicas for good: make this replica, its disk intact, a new
    /// cluster of one with everything in its log, then serve. Refused while another replica of
    /// the config answers. Add fresh replicas afterwards with `quorum admin add-replica`.
    #[arg(long)]
    force_new_cluster: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The data directory holds every job's script and environment: what the replica creates
    // (RocksDB's files, snapshots) is its own alone.
    quorum_auth::private::restrict_umask();
    let args = Args::parse();
    let _telemetry = quorum_proto::telemetry::init(quorum_proto::telemetry::Logging {
        service: "quorum-controller",
        format: &args.log_format,
        default_filter: "info,openraft=warn",
        stderr: false,
        otlp_endpoint: args.otlp_endpoint.as_deref(),
    })
    .map_err(|e| anyhow::anyhow!(e))?;
    // Tests' builds only (the `failpoints` feature): FAILPOINTS arms crash points.
    quorum_raft::arm_crash_points();
    let config = ControllerConfig::load(&args.config)?;
    if let Some(file) = &args.verify_backup {
        let s = quorum_control::replica::backup::verify(file, config.feature_level())
            .map_err(|e| anyhow::anyhow!("{} is refused: {e}", file.display()))?;
        println!("{}: {}", file.display(), s.describe());
        return Ok(());
    }
    let start = quorum_control::replica::backup::Start {
        restore: args.restore.clone(),
        force_new_cluster: args.force_new_cluster,
    };
    if let Some(said) = quorum_control::replica::backup::prepare(&config, &start).await? {
        println!("{said}");
    }
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("binding {}: {e}", config.listen))?;
    quorum_control::run(config, listener, shutdown_signal()?).await
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed here, before the controller starts,
/// not when the future is first polled: a SIGTERM in between (a service manager stopping it as
/// it comes up) would otherwise kill it without its shutdown.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| anyhow::anyhow!("installing a SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| anyhow::anyhow!("installing a SIGINT handler: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
    })
}
