//! The checkers: each reads the recorded history (and what the cluster and the jobs showed at
//! the end) and returns one line per violation it finds.

pub mod jobs;
pub mod linear;
pub mod runs;

use std::collections::BTreeMap;

use crate::history::Event;

/// A job as the final read (after the faults healed and every job ended) showed it.
#[derive(Clone, Debug)]
pub struct Final {
    pub id: u64,
    pub name: String,
    pub state: String,
    /// Cancelled, or a cancel asked of it while it ran.
    pub cancelled: bool,
}

pub fn terminal(state: &str) -> bool {
    !matches!(state, "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED" | "REQUEUED")
}

/// Everything a run leaves to judge.
pub struct Evidence<'a> {
    pub events: &'a [Event],
    pub finals: &'a BTreeMap<u64, Final>,
    pub runs: &'a [runs::Run],
    /// The jobs clients used as registers (holds, releases, cancels and reads).
    pub registers: &'a [u64],
    pub node_cpus: u32,
}

/// Every checker's findings, each line naming its checker.
pub fn check(e: &Evidence) -> Vec<String> {
    let mut problems = jobs::check(e.events, e.finals, e.runs);
    problems.extend(linear::check(e.events, e.registers));
    let known = jobs::submitted_ids(e.events, e.finals);
    problems.extend(runs::check(e.runs, e.node_cpus, &known));
    problems
}
