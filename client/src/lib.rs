//! The client side of Quorum's API: what the `quorum` command line needs to talk to a cluster,
//! without the controller, the agent or RocksDB, so that each `quorum` call starts fast.
//!
//! - [`client`]: finds a replica that answers, follows leader hints, retries unavailable calls;
//! - [`submit`]: turns command-line options and `#SBATCH` lines into a job spec;
//! - [`display`]: squeue/sinfo/scontrol-like tables and `--json` output;
//! - [`digest`]: `quorum admin digest`, every replica's state digest at one log index;
//! - [`logs`]: `quorum logs [-f]`, a job's output read on its node through the leader.

pub mod client;
pub mod digest;
pub mod display;
pub mod logs;
pub mod submit;
