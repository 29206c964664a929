//! The checkers: each reads the recorded history (and what the cluster and the jobs showed at
//! the end) and returns one line per violation it finds.

pub mod archive;
pub mod arrays;
pub mod cron;
pub mod deps;
pub mod ended;
pub mod jobs;
pub mod linear;
pub mod resv;
pub mod runs;
pub mod starts;
pub mod steps;

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
    /// The recurring job the operator made, if any.
    pub cron: Option<&'a cron::Cron>,
}

/// Every checker's findings, each line naming its checker.
pub fn check(e: &Evidence) -> Vec<String> {
    // The recurring job's jobs are no client's: judged by its own checker, and with the others
    // for what every job owes (its runs, the reservation).
    let by_cron = e.cron.map(|c| cron::jobs(c, e.finals)).unwrap_or_default();
    let submitted: BTreeMap<u64, Final> =
        e.finals.iter().filter(|(id, _)| !by_cron.contains(id)).map(|(id, f)| (*id, f.clone())).collect();
    // Steps' tasks are judged against their jobs' scripts; every other checker sees the scripts.
    let scripts: Vec<runs::Run> = e.runs.iter().filter(|r| r.step.is_none()).cloned().collect();
    let mut problems = jobs::check(e.events, &submitted, &scripts);
    problems.extend(linear::check(e.events, e.registers));
    let mut known = jobs::submitted_ids(e.events, &submitted);
    known.extend(&by_cron);
    problems.extend(runs::check(&scripts, e.node_cpus, &known, &jobs::multi_node(e.events, &submitted)));
    problems.extend(starts::check(e.events, &submitted, &scripts));
    problems.extend(deps::check(e.events, &submitted, &scripts));
    problems.extend(arrays::check(e.events, &submitted, &scripts));
    problems.extend(resv::check(e.reservations, e.finals));
    problems.extend(runs::completed(e.finals, &scripts));
    problems.extend(steps::check(e.runs));
    if let Some(c) = e.cron {
        problems.extend(cron::check(c, e.finals, &scripts));
    }
    problems
}
