//! The client side of Quorum's API: what the `quorum` command line needs to talk to a cluster,
//! without the controller, the agent or RocksDB, so that each `quorum` call starts fast.
//!
//! - [`client`]: finds a replica that answers, follows leader hints, retries unavailable calls;
//! - [`submit`]: turns command-line options and `#SBATCH` lines into a job spec;
//! - [`display`]: squeue/sinfo/scontrol-like tables and `--json` output;
//! - [`digest`]: `quorum admin digest`, every replica's state digest at one log index;
//! - [`logs`]: `quorum logs [-f]`, a job's output read on its node through the leader;
//! - [`manual`]: man pages generated from the parsers, and the checks that keep the manual true.

pub mod client;
pub mod container;
pub mod digest;
pub mod display;
pub mod logs;
pub mod manual;
pub mod submit;

/// Runs a command's future on `runtime` and turns its outcome into the process's exit code,
/// printing an error as `quorum: error: ...` (both `quorum` and `quorum-dev` end this way).
pub fn exit_code(
    runtime: std::io::Result<tokio::runtime::Runtime>,
    command: impl std::future::Future<Output = anyhow::Result<std::process::ExitCode>>,
) -> std::process::ExitCode {
    let result = match runtime {
        Ok(rt) => rt.block_on(command),
        Err(e) => Err(anyhow::anyhow!("starting the async runtime: {e}")),
    };
    result.unwrap_or_else(|e| {
        eprintln!("quorum: error: {e:#}");
        std::process::ExitCode::FAILURE
    })
}
