//! The Quorum controller.
//!
//! Data flows one way: clients and agents reach [`server`]; writes become
//! [`quorum_state::Command`]s proposed through Raft ([`replica`]); once committed,
//! [`quorum_state::apply`] changes the [`quorum_state::ClusterState`] on every replica. On the
//! leader, [`leader`] loops read that state, call the pure scheduler [`quorum_sched::schedule`],
//! propose its plan, and push launches and kills to the agents.

pub mod clock;
pub mod config;
pub mod faults;
pub mod http;
/// The domain types, from `quorum-model`.
pub use quorum_model as model;
pub mod leader;
mod node;
pub mod replica;
pub mod security;
pub mod server;
pub mod sim;
pub mod site;
pub mod wire;

pub use config::ControllerConfig;
pub use node::{run, Controller};

/// mimalloc for every replica: the submit path allocates and frees a few hundred small blocks
/// per job, and glibc's malloc and free were a sixth of its CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
