//! Whether a job may start at all, across every fault (not only never twice at once): a job
//! without `--requeue` starts at most once, whatever happens to its node; a job submitted held
//! starts only if some client asked to release it.

use std::collections::{BTreeMap, BTreeSet};

use super::ended::Final;
use super::runs::Run;
use crate::history::{pairs, Event, Op, Outcome};

/// What its submit asked of a job.
struct Asked<'a> {
    name: &'a str,
    held: bool,
    requeue: bool,
    nodes: u32,
}

pub fn check(events: &[Event], finals: &BTreeMap<u64, Final>, runs: &[Run]) -> Vec<String> {
    let pairs = match pairs(events) {
        Ok(p) => p,
        Err(e) => return vec![format!("starts: malformed history: {e}")],
    };
    // Each submit's flags by name (names are unique in a run), and each job id's name: from the
    // submit's answer, or from the final read for a submit never answered.
    let mut by_name: BTreeMap<&str, Asked> = BTreeMap::new();
    let mut names: BTreeMap<u64, &str> = finals.values().map(|f| (f.id, f.name.as_str())).collect();
    // Jobs some client asked to release, whatever came back: an unanswered release may have
    // been applied.
    let mut released: BTreeSet<u64> = BTreeSet::new();
    for p in &pairs {
        match (&p.op, &p.completed) {
            (Op::Submit { name, held, requeue, nodes, .. }, done) => {
                by_name.insert(name, Asked { name, held: *held, requeue: *requeue, nodes: *nodes });
                if let Some((_, Outcome::Submitted { job })) = done {
                    names.insert(*job, name);
                }
            }
            (Op::Release { job }, _) => {
                released.insert(*job);
            }
            _ => {}
        }
    }
    let mut by_job: BTreeMap<u64, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        by_job.entry(r.job).or_default().push(r);
    }
    let mut problems = Vec::new();
    for (job, rs) in &by_job {
        let Some(asked) = names.get(job).and_then(|n| by_name.get(n)) else { continue };
        let files = || rs.iter().map(|r| r.file.as_str()).collect::<Vec<_>>();
        // A job of several nodes starts once on each of them: each attempt counts once.
        let starts = match asked.nodes > 1 {
            true => rs.iter().map(|r| r.restarts).collect::<BTreeSet<_>>().len(),
            false => rs.len(),
        };
        if !asked.requeue && starts > 1 {
            problems.push(format!(
                "starts: job {job} ('{}', without --requeue) started {starts} times: {:?}",
                asked.name,
                files()
            ));
        }
        if asked.held && !released.contains(job) {
            problems.push(format!(
                "starts: job {job} ('{}') was submitted held, no client released it, and it ran: {:?}",
                asked.name,
                files()
            ));
        }
    }
    problems
}
