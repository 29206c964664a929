//! Dependencies: a job submitted with `--dependency=afterok:X` starts only after X completed.
//! Every run of it begins after the end of X's last run, and it never runs at all when X ended
//! any other way (cancelled, failed, lost with its node).

use std::collections::BTreeMap;

use super::ended::Final;
use super::runs::{Run, SLACK};
use crate::history::{pairs, Event, Op, Outcome};

pub fn check(events: &[Event], finals: &BTreeMap<u64, Final>, runs: &[Run]) -> Vec<String> {
    let pairs = match pairs(events) {
        Ok(p) => p,
        Err(e) => return vec![format!("deps: malformed history: {e}")],
    };
    // Each dependent job's id (from its submit's answer, or by its name in the final read) with
    // the job it waits for.
    let by_name: BTreeMap<&str, u64> = finals.values().map(|f| (f.name.as_str(), f.id)).collect();
    let mut waits: BTreeMap<u64, u64> = BTreeMap::new();
    for p in &pairs {
        let Op::Submit { name, after: Some(x), .. } = &p.op else { continue };
        let id = match &p.completed {
            Some((_, Outcome::Submitted { job })) => Some(*job),
            _ => by_name.get(name.as_str()).copied(),
        };
        if let Some(id) = id {
            waits.insert(id, *x);
        }
    }
    let mut by_job: BTreeMap<u64, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        by_job.entry(r.job).or_default().push(r);
    }
    let mut problems = Vec::new();
    for (job, x) in waits {
        let Some(rs) = by_job.get(&job) else { continue };
        let first = rs.iter().map(|r| r.start).fold(f64::INFINITY, f64::min);
        let state = finals.get(&x).map_or("unknown", |f| f.state.as_str());
        if state != "COMPLETED" {
            problems.push(format!(
                "deps: job {job} (afterok:{x}) ran from {first:.2}, but job {x} ended {state}, not COMPLETED"
            ));
            continue;
        }
        let ended = by_job.get(&x).map(|xs| xs.iter().map(|r| r.last).fold(f64::NEG_INFINITY, f64::max));
        match ended {
            Some(end) if first < end - SLACK => problems
                .push(format!("deps: job {job} (afterok:{x}) started at {first:.2}, before job {x} ended at {end:.2}")),
            Some(_) => {}
            None => problems.push(format!("deps: job {job} (afterok:{x}) ran, but job {x} never ran")),
        }
    }
    problems
}
