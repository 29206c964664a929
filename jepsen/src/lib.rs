//! `quorum-jepsen`: randomized faults against a real Quorum cluster, every client operation
//! recorded, and checkers that judge the whole history (see `jepsen/README.md`).

pub mod checker;
pub mod choice;
pub mod cluster;
pub mod history;
pub mod nemesis;
pub mod net;
pub mod rng;
pub mod run;
pub mod workload;
