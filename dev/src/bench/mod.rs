//! `quorum bench`: load generators against a real cluster. By default each starts its own:
//! `submit` and `dispatch` an embedded 3-replica cluster with an agent (real RocksDB, real gRPC
//! on loopback), `failover` three `quorum-controller` processes, so that the leader can be
//! killed with SIGKILL, and `memory` measures such processes. Each prints a progress line while
//! it runs, then a table or `--json`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

mod agents;
mod dispatch;
mod failover;
mod harness;
mod memory;
mod submit;

pub use harness::JobShape;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchCommand,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Concurrent clients submitting held jobs: throughput and latency of acknowledged (committed
    /// and durable) submits.
    Submit {
        /// Concurrent clients, each submitting one job at a time.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Submits in all.
        #[arg(long, default_value_t = 20_000)]
        jobs: usize,
        #[command(flatten)]
        shape: JobShape,
        /// Load the running cluster at --controllers (QUORUM_CONTROLLERS) instead of starting one.
        #[arg(long)]
        external: bool,
        /// Start the cluster without TLS and authentication (`insecure = true`, names taken at
        /// their word), to measure what security costs.
        #[arg(long)]
        insecure: bool,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
    },
    /// On an idle cluster, the time from sending a submit to the job's process starting (the job
    /// records its own start time), one job at a time.
    Dispatch {
        /// Jobs, one after another.
        #[arg(long, default_value_t = 200)]
        jobs: usize,
        /// Start the cluster without TLS, authentication and signed launches.
        #[arg(long)]
        insecure: bool,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
    },
    /// N simulated agents (real gRPC streams, one per node) registering and heartbeating every
    /// second to three quorum-controller processes: heartbeat round trips, the leader's CPU,
    /// and whether any node was falsely declared DOWN.
    Agents {
        /// Simulated agents (nodes).
        #[arg(long, default_value_t = 10_000)]
        agents: usize,
        /// Seconds of steady heartbeats measured once every agent is registered.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// The controller binary (default: quorum-controller next to this program).
        #[arg(long)]
        controller_bin: Option<PathBuf>,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The resident memory of each replica (three quorum-controller processes) holding this
    /// many pending (held) jobs, submitted one by one (or as job arrays, --arrays).
    Memory {
        /// Held jobs to submit and hold.
        #[arg(long, default_value_t = 1_000_000)]
        jobs: usize,
        #[command(flatten)]
        shape: JobShape,
        /// Submit the jobs as job arrays of up to 100,000 tasks (which share one spec) instead
        /// of one by one.
        #[arg(long)]
        arrays: bool,
        /// Concurrent clients submitting one by one.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// The controller binary (default: quorum-controller next to this program).
        #[arg(long)]
        controller_bin: Option<PathBuf>,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Kills the leader's process with SIGKILL under submit load, run after run: the time from
    /// the kill to the first acknowledged submit sent after it.
    Failover {
        /// Kills of the leader, one after another.
        #[arg(long, default_value_t = 10)]
        runs: usize,
        /// Concurrent clients submitting while the leader is killed.
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// The controller binary (default: quorum-controller next to this program).
        #[arg(long)]
        controller_bin: Option<PathBuf>,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `controllers`: the global --controllers (and how to reach them), used with `submit --external`.
pub async fn run(args: BenchArgs, controllers: &quorum_client::client::ControllersArg) -> anyhow::Result<()> {
    match args.what {
        BenchCommand::Submit { clients, jobs, shape, external, insecure, json } => {
            let external = match external {
                true => Some((controllers.controllers.clone(), controllers.security()?)),
                false => None,
            };
            submit::submit(clients, jobs, shape, external, insecure, json).await
        }
        BenchCommand::Dispatch { jobs, insecure, json } => dispatch::dispatch(jobs, insecure, json).await,
        BenchCommand::Memory { jobs, shape, arrays, clients, controller_bin, json } => {
            memory::run(memory::Load { jobs, shape, arrays, clients }, controller_bin, json).await
        }
        BenchCommand::Agents { agents, seconds, controller_bin, json } => {
            agents::run(agents, seconds, controller_bin, json).await
        }
        BenchCommand::Failover { runs, clients, controller_bin, json } => {
            failover::failover(runs, clients, controller_bin, json).await
        }
    }
}
