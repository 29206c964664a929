//! The `quorum` command-line client, as a library so that its pieces are testable and
//! `quorum dev`'s embedded cluster can be started from tests.
//!
//! - [`client`]: finds a replica that answers, follows leader hints, retries unavailable calls;
//! - [`submit`]: turns command-line options and `#SBATCH` lines into a job spec;
//! - [`display`]: squeue/sinfo/scontrol-like tables and `--json` output;
//! - [`dev`]: three controller replicas and agents in one process on loopback;
//! - [`simulate`]: `quorum simulate`, trace replay through the production scheduler;
//! - [`digest`]: `quorum admin digest`, every replica's state digest at one log index;
//! - [`logs`]: `quorum logs [-f]`, a job's output read on its node through the leader.

pub mod bench;
pub mod client;
pub mod dev;
pub mod digest;
pub mod display;
pub mod logs;
pub mod simulate;
pub mod submit;
