//! `quorum-controller --config FILE`: one controller replica.

use std::path::PathBuf;

use clap::Parser;
use quorum_control::ControllerConfig;

#[derive(Parser)]
#[command(version, about = "A Quorum controller replica")]
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = quorum_proto::telemetry::init(quorum_proto::telemetry::Logging {
        service: "quorum-controller",
        format: &args.log_format,
        default_filter: "info,openraft=warn",
        stderr: false,
        otlp_endpoint: args.otlp_endpoint.as_deref(),
    })
    .map_err(|e| anyhow::anyhow!(e))?;
    let config = ControllerConfig::load(&args.config)?;
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("binding {}: {e}", config.listen))?;
    quorum_control::run(config, listener, shutdown_signal()).await
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler cannot fail in a normal process");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
