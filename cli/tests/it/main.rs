//! `quorum`'s end-to-end tests, one module per area, in one test binary: each file of `tests/`
//! is a binary of its own to cargo, and each linked the whole stack again (25 links of 60-160
//! MB, the larger part of a cold build on two cores). `traces.rs` stays apart: it installs a
//! process-wide tracing subscriber.

mod cli;
mod cluster;
mod common;
mod containers;
mod cron;
mod dashboard;
mod export;
mod failover;
mod fuzz_corpus;
mod health;
mod history;
mod hostile;
mod jobs;
mod limits;
mod live_config;
mod liveness;
mod mpi;
mod observe;
mod preempt;
mod reservation;
mod rest;
mod security;
mod simulate;
mod site;
mod slurm_commands;
mod steps;
mod update;
mod upgrade;
