//! The Quorum node agent.
//!
//! One stream to the leader ([`conn`]): the agent registers its node's resources, heartbeats
//! with the jobs it runs, receives launches and kills, and reports each job's exit until the
//! leader acknowledges it as committed. [`runner`] runs each job as its own process group with
//! its output files, environment and time limit. The agent finds the leader itself from a list
//! of controller addresses and follows it when it changes.

mod agent;
pub mod as_user;
pub mod conn;
pub mod container;
pub mod devices;
pub mod environment;
pub mod gpu;
pub mod grants;
pub mod identity;
mod input;
pub mod limits;
pub mod metrics;
pub mod output;
mod pmi;
pub mod pmix;
pub mod record;
pub mod resources;
pub mod runner;
pub mod site;
mod step;
pub mod supervisor;
mod usage;

use std::sync::Arc;

use tokio::sync::watch;

pub use agent::{Agent, AgentConfig, HealthCheck, VERSION};
pub(crate) use agent::{JobEntry, Order};
pub use resources::{parse_gpu_source, SimGpu};

/// How often the lease is checked.
const LEASE_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// Runs `agent` until `shutdown` turns true: takes up the jobs its spool holds, watches its lease
/// and health, and holds a stream to the leader, following it.
pub async fn serve(agent: Arc<Agent>, shutdown: watch::Receiver<bool>) {
    let exits_rx =
        agent.exits_rx.lock().unwrap_or_else(|p| p.into_inner()).take().expect("serve is called once per agent");
    if !identity::is_root() {
        // SAFETY: getuid has no failure mode.
        let uid = unsafe { libc::getuid() };
        tracing::warn!(
            uid,
            "not running as root: this agent cannot switch users, and runs the jobs of its own user (uid {uid}) only"
        );
    } else if !agent.config.switch_user {
        tracing::warn!("switching users is off: this agent runs root's jobs only, never another user's as root");
    }
    agent.limits();
    // The lease file lives there from the first answered heartbeat on, before any job; what an
    // older agent left readable is made private.
    if let Err(e) = record::prepare_spool(&agent.config.spool_dir) {
        tracing::warn!(spool = %agent.config.spool_dir.display(), error = %e, "cannot prepare the spool directory");
    }
    runner::reattach_all(&agent);
    // What containers an earlier agent left of jobs that ended meanwhile go.
    let running: Vec<u64> = agent.lock_jobs().keys().copied().collect();
    let sweeper = agent.clone();
    let _ = tokio::task::spawn_blocking(move || sweeper.containers.sweep_except(&running)).await;
    let lease = tokio::spawn(watch_lease(agent.clone(), shutdown.clone()));
    let health = tokio::spawn(watch_health(agent.clone(), shutdown.clone()));
    agent.check_gpus().await;
    let outbox =
        agent.outbox_rx.lock().unwrap_or_else(|p| p.into_inner()).take().expect("serve is called once per agent");
    conn::run(agent.clone(), exits_rx, outbox, shutdown).await;
    lease.abort();
    let _ = health.await;
    agent.stopped.send_replace(true);
    let stopping = agent.clone();
    let _ = tokio::task::spawn_blocking(move || stopping.containers.stop()).await;
}

async fn watch_lease(agent: Arc<Agent>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(LEASE_CHECK);
    loop {
        tokio::select! {
            _ = tick.tick() => agent.enforce_lease(),
            _ = shutdown.changed() => return,
        }
    }
}

/// Checks the GPUs every heartbeat, and runs the health check at its interval on a task of its
/// own (a slow check does not hold up the GPUs').
async fn watch_health(agent: Arc<Agent>, mut shutdown: watch::Receiver<bool>) {
    let checker = agent.config.health_check.clone().map(|check| {
        let agent = agent.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(check.interval);
            loop {
                every.tick().await;
                agent.run_health_check(&check).await;
            }
        })
    });
    // The first check ran as the agent started (for its first heartbeat).
    let period = agent.config.heartbeat;
    let mut gpus = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            _ = gpus.tick() => {
                agent.check_gpus().await;
                let raised = usage::sample_memory(&agent).await;
                agent.save_measured(&raised).await;
            }
            _ = shutdown.changed() => break,
        }
    }
    if let Some(c) = checker {
        c.abort();
    }
}

/// Runs an agent until `shutdown` completes.
pub async fn run(config: AgentConfig, gpus: Box<dyn gpu::GpuSource>, shutdown: impl std::future::Future<Output = ()>) {
    run_with_metrics(config, gpus, None, shutdown).await
}

/// [`run`], serving the agent's `/metrics` on `metrics` (a listener, and the address ranges
/// that may read it) when given.
pub async fn run_with_metrics(
    config: AgentConfig,
    gpus: Box<dyn gpu::GpuSource>,
    metrics: Option<(tokio::net::TcpListener, metrics::Exposure)>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let agent = Agent::with_gpu_source(config, gpus);
    if let Some((listener, exposure)) = metrics {
        let agent = agent.clone();
        tokio::spawn(async move {
            if let Err(e) = metrics::serve(agent, listener, exposure).await {
                tracing::warn!(error = %e, "serving /metrics");
            }
        });
    }
    let task = tokio::spawn(serve(agent.clone(), stop_rx));
    shutdown.await;
    let _ = stop_tx.send(true);
    let _ = task.await;
}
