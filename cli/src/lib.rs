//! What `quorum-dev` runs, as a library so that tests can start the embedded cluster:
//!
//! - [`dev`]: three controller replicas and agents in one process on loopback (`quorum dev`);
//! - [`simulate`]: `quorum simulate`, trace replay through the production scheduler;
//! - [`bench`]: `quorum bench`, load generators against a real cluster.
//!
//! The client side of the API, which the `quorum` binary uses alone, is `quorum-client`.

pub mod bench;
pub mod dev;
pub mod simulate;
