//! `quorum-dev`: what embeds the controller and the agent, as a library so that tests can start
//! the embedded cluster, and the `quorum-dev` binary that the `quorum` client becomes for these
//! commands:
//!
//! - [`cluster`]: three controller replicas and agents in one process on loopback (`quorum dev`);
//! - [`simulate`]: `quorum simulate`, trace replay through the production scheduler;
//! - [`bench`]: `quorum bench`, load generators against a real cluster;
//! - [`ports`]: loopback ports that a restarted replica can bind again.
//!
//! The `quorum` client itself (package `quorum-cli`) links none of this: only `quorum-client`,
//! `quorum-proto` and `quorum-model`.

pub mod bench;
pub mod cluster;
pub mod ports;
pub mod security;
pub mod simulate;
