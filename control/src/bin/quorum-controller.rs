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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let logs = tracing_subscriber::fmt().with_env_filter(
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn".into()),
    );
    match args.log_format.as_str() {
        "json" => logs.json().init(),
        _ => logs.init(),
    }
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
