//! The checkers: each reads the recorded history (and what the cluster and the jobs showed at
//! the end) and returns one line per violation it finds.

pub mod archive;
pub mod arrays;
pub mod deps;
pub mod ended;
pub mod jobs;
pub mod linear;
pub mod resv;
pub mod runs;
pub mod starts;

use std::collections::BTreeMap;

pub use ended::{terminal, Final};

use crate::history::Event;

/// Everything a run leaves to judge.
pub struct Evidence<'a> {
    pub events: &'a [Event],
    pub finals: &'a BTreeMap<u64, Final>,
    pub runs: &'a [runs::Run],
    /// The jobs clients used as registers (holds, releases, cancels and reads).
    pub registers: &'a [u64],
    pub node_cpus: u32,
    /// The advance reservations the run made.
    pub reservations: &'a [resv::Resv],
}

/// Every checker's findings, each line naming its checker.
pub fn check(e: &Evidence) -> Vec<String> {
    let mut problems = jobs::check(e.events, e.finals, e.runs);
    problems.extend(linear::check(e.events, e.registers));
    let known = jobs::submitted_ids(e.events, e.finals);
    problems.extend(runs::check(e.runs, e.node_cpus, &known, &jobs::multi_node(e.events, e.finals)));
    problems.extend(starts::check(e.events, e.finals, e.runs));
    problems.extend(deps::check(e.events, e.finals, e.runs));
    problems.extend(arrays::check(e.events, e.finals, e.runs));
    problems.extend(resv::check(e.reservations, e.finals));
    problems
}
