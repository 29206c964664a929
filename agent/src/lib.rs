//! The Quorum node agent.
//!
//! One stream to the leader ([`conn`]): the agent registers its node's resources, heartbeats
//! with the jobs it runs, receives launches and kills, and reports each job's exit until the
//! leader acknowledges it as committed. [`runner`] runs each job as its own process group with
//! its output files, environment and time limit. The agent finds the leader itself from a list
//! of controller addresses and follows it when it changes.

pub mod conn;
pub mod resources;
pub mod runner;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quorum_proto::agent::{ExitKind, JobExit};
use tokio::sync::{mpsc, watch};

pub use resources::{parse_gpu_source, SimGpu};

/// The software version the agent reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The node's name, as partitions name it.
    pub name: String,
    /// Controller addresses (`host:port`); any replica will do.
    pub controllers: Vec<String>,
    pub cpus: u32,
    pub mem_mb: u64,
    pub gpus: Vec<SimGpu>,
    pub features: Vec<String>,
    /// Where the agent keeps job scripts.
    pub spool_dir: PathBuf,
    pub heartbeat: Duration,
    /// Between SIGTERM and SIGKILL when a job is cancelled or hits its limit.
    pub kill_wait: Duration,
}

/// A job this agent knows, by job id.
#[derive(Debug)]
pub(crate) struct JobEntry {
    pub token: u64,
    /// Set while the job runs: asks its runner to kill it.
    pub kill: Option<mpsc::Sender<ExitKind>>,
    /// Set once it ended, until the leader acknowledges the report.
    pub exit: Option<JobExit>,
    pub exit_sent: Option<Instant>,
    /// The leader acknowledged the exit as committed; the entry stays for its fencing token.
    pub acked: bool,
    pub pgid: Option<i32>,
}

/// The agent's job table, shared between the stream and the runners.
pub struct Agent {
    pub config: AgentConfig,
    pub(crate) jobs: Mutex<HashMap<u64, JobEntry>>,
    pub(crate) exits_tx: mpsc::UnboundedSender<u64>,
    exits_rx: Mutex<Option<mpsc::UnboundedReceiver<u64>>>,
}

impl Agent {
    pub fn new(config: AgentConfig) -> Arc<Agent> {
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        Arc::new(Agent { config, jobs: Mutex::new(HashMap::new()), exits_tx, exits_rx: Mutex::new(Some(exits_rx)) })
    }

    pub(crate) fn lock_jobs(&self) -> std::sync::MutexGuard<'_, HashMap<u64, JobEntry>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Jobs running now, as (job id, token).
    pub fn running(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<_> =
            self.lock_jobs().iter().filter(|(_, e)| e.exit.is_none()).map(|(id, e)| (*id, e.token)).collect();
        v.sort_unstable();
        v
    }

    /// Kills every job's process group at once (used when a dev cluster shuts down).
    pub fn kill_all(&self) {
        for entry in self.lock_jobs().values() {
            if let (Some(pgid), None) = (entry.pgid, &entry.exit) {
                runner::signal_group(pgid, libc::SIGKILL);
            }
        }
    }

    /// Runs until `shutdown` turns true, connecting to the leader and following it.
    pub async fn run(self: Arc<Self>, shutdown: watch::Receiver<bool>) {
        let exits_rx =
            self.exits_rx.lock().unwrap_or_else(|p| p.into_inner()).take().expect("Agent::run is called once");
        conn::run(self, exits_rx, shutdown).await;
    }
}

/// Runs an agent until `shutdown` completes.
pub async fn run(config: AgentConfig, shutdown: impl std::future::Future<Output = ()>) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let agent = Agent::new(config);
    let task = tokio::spawn(agent.clone().run(stop_rx));
    shutdown.await;
    let _ = stop_tx.send(true);
    let _ = task.await;
}
