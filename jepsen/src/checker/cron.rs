//! Recurring jobs (`quorum cron`): the operator's entry submits one job per firing however the
//! leaders fail over (apply fires an entry only at the firing it waits for, so a firing proposed
//! twice, by a leader that retried or by two leaders of one moment, is one job), each firing is on
//! the entry's schedule, none comes after the entry was removed, and each of its jobs (not
//! `--requeue`) starts at most once. Each job knows its entry and firing (`QUORUM_CRON_ID`,
//! `QUORUM_CRON_TIME`) and records them when it runs.

use std::collections::{BTreeMap, BTreeSet};

use super::ended::Final;
use super::runs::Run;

/// The operator's recurring job.
#[derive(Clone, Debug, PartialEq)]
pub struct Cron {
    /// The name of the jobs it submits (no client submits one of that name).
    pub name: String,
    /// It fires every `period_s` seconds, on the minute's multiples of it.
    pub period_s: u64,
    /// A job submitted after its removal was acknowledged (the harness's probe): none of its jobs
    /// has a higher id. `None` when no removal was acknowledged.
    pub removed_before: Option<u64>,
}

/// The ids of the entry's jobs. (That it fired at all is not asked: a leader whose clock a
/// fault moved back fires nothing until its clock comes to the firing.)
pub fn jobs(cron: &Cron, finals: &BTreeMap<u64, Final>) -> BTreeSet<u64> {
    finals.values().filter(|f| f.name == cron.name).map(|f| f.id).collect()
}

pub fn check(cron: &Cron, finals: &BTreeMap<u64, Final>, runs: &[Run]) -> Vec<String> {
    let mut problems = Vec::new();
    let jobs = jobs(cron, finals);
    for f in finals.values().filter(|f| jobs.contains(&f.id) && !super::ended::terminal(&f.state)) {
        problems.push(format!("cron: job {} is still {} after the faults healed", f.id, f.state));
    }
    if let Some(probe) = cron.removed_before {
        for job in jobs.iter().filter(|j| **j > probe) {
            problems.push(format!(
                "cron: job {job} was submitted after the entry was removed (job {probe} was submitted after the removal)"
            ));
        }
    }
    let mut firings: BTreeMap<(u64, u64), BTreeSet<u64>> = BTreeMap::new();
    let mut starts: BTreeMap<u64, Vec<&Run>> = BTreeMap::new();
    for r in runs.iter().filter(|r| jobs.contains(&r.job)) {
        starts.entry(r.job).or_default().push(r);
        let Some((entry, due)) = r.cron else {
            problems.push(format!("cron: job {} ran without its entry and firing ({})", r.job, r.file));
            continue;
        };
        firings.entry((entry, due)).or_default().insert(r.job);
        if cron.period_s > 0 && due % cron.period_s != 0 {
            problems.push(format!(
                "cron: job {} ran for a firing at {due}, off its entry's schedule (every {} s)",
                r.job, cron.period_s
            ));
        }
    }
    for ((entry, due), js) in &firings {
        if js.len() > 1 {
            problems.push(format!("cron: entry {entry}'s firing due at {due} submitted {} jobs: {js:?}", js.len()));
        }
    }
    for (job, rs) in &starts {
        if rs.len() > 1 {
            let files: Vec<&str> = rs.iter().map(|r| r.file.as_str()).collect();
            problems.push(format!("cron: job {job} (without --requeue) started {} times: {files:?}", rs.len()));
        }
    }
    problems
}
