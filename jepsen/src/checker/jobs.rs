//! What a user is promised about jobs: an acknowledged submit is never lost and is queued once;
//! ids are unique and grow in real-time order; an acknowledged cancel is never undone; every job
//! ends once the faults heal; reads show each job as it was submitted.

use std::collections::{BTreeMap, BTreeSet};

use super::ended::{terminal, Final};
use super::runs::Run;
use crate::history::{pairs, Event, Op, Outcome};

/// Ids of every job some submit may have made: those acknowledged, and those of the final read
/// whose name an unanswered submit used.
pub fn submitted_ids(events: &[Event], finals: &BTreeMap<u64, Final>) -> BTreeSet<u64> {
    let names: BTreeSet<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::Invoke { op: Op::Submit { name, .. }, .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    let mut ids: BTreeSet<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Complete { outcome: Outcome::Submitted { job }, .. } => Some(*job),
            _ => None,
        })
        .collect();
    ids.extend(finals.values().filter(|f| names.contains(&f.name)).map(|f| f.id));
    ids
}

/// Ids of the jobs whose submit asked for more than one node (answered, or found by name in the
/// final read).
pub fn multi_node(events: &[Event], finals: &BTreeMap<u64, Final>) -> BTreeSet<u64> {
    let Ok(pairs) = pairs(events) else { return BTreeSet::new() };
    let by_name: BTreeMap<&str, u64> = finals.values().map(|f| (f.name.as_str(), f.id)).collect();
    pairs
        .iter()
        .filter_map(|p| match (&p.op, &p.completed) {
            (Op::Submit { nodes, .. }, Some((_, Outcome::Submitted { job }))) if *nodes > 1 => Some(*job),
            (Op::Submit { nodes, name, .. }, _) if *nodes > 1 => by_name.get(name.as_str()).copied(),
            _ => None,
        })
        .collect()
}

pub fn check(events: &[Event], finals: &BTreeMap<u64, Final>, runs: &[Run]) -> Vec<String> {
    let mut problems = Vec::new();
    let pairs = match pairs(events) {
        Ok(p) => p,
        Err(e) => return vec![format!("jobs: malformed history: {e}")],
    };
    let mut names: BTreeSet<&str> = BTreeSet::new();
    let mut by_id: BTreeMap<u64, &str> = BTreeMap::new();
    for p in &pairs {
        let Op::Submit { name, .. } = &p.op else { continue };
        let id = match &p.completed {
            Some((_, Outcome::Submitted { job })) => Some(*job),
            _ => None,
        };
        names.insert(name);
        let Some(id) = id else { continue };
        if let Some(other) = by_id.insert(id, name) {
            problems.push(format!("ids: submits '{other}' and '{name}' were both answered job {id}"));
        }
        match finals.get(&id) {
            None => problems.push(format!("lost: job {id} ('{name}') was acknowledged and is gone")),
            Some(f) if f.name != *name => {
                problems.push(format!("lost: job {id} was acknowledged as '{name}' and is now '{}'", f.name))
            }
            Some(_) => {}
        }
    }
    // Ids grow in real-time order: a submit that began after another was answered gets a
    // higher id.
    let submit_at: BTreeMap<usize, u64> = pairs
        .iter()
        .filter_map(|p| match (&p.op, &p.completed) {
            (Op::Submit { .. }, Some((_, Outcome::Submitted { job }))) => Some((p.invoke_at, *job)),
            _ => None,
        })
        .collect();
    let mut answered_max: Option<(u64, usize)> = None;
    for (at, e) in events.iter().enumerate() {
        match e {
            Event::Invoke { .. } => {
                if let (Some(id), Some((max, when))) = (submit_at.get(&at), answered_max) {
                    if *id <= max {
                        problems.push(format!(
                            "ids: job {id} was submitted (event {at}) after job {max} was acknowledged (event {when}), and got no higher id"
                        ));
                    }
                }
            }
            Event::Complete { outcome: Outcome::Submitted { job }, .. }
                if answered_max.is_none_or(|(m, _)| *job > m) =>
            {
                answered_max = Some((*job, at));
            }
            _ => {}
        }
    }
    // Each submit made one job at most (an array one per task), and every job was some client's.
    let mut seen_names: BTreeMap<(&str, Option<u32>), u64> = BTreeMap::new();
    for f in finals.values() {
        if !names.contains(f.name.as_str()) {
            problems.push(format!("phantom: job {} ('{}') was never submitted", f.id, f.name));
        }
        if let Some(other) = seen_names.insert((&f.name, f.task), f.id) {
            problems.push(format!(
                "duplicate: '{}' was submitted once and queued twice, as jobs {other} and {}",
                f.name, f.id
            ));
        }
        if !terminal(&f.state) {
            problems
                .push(format!("terminal: job {} ('{}') is still {} after the faults healed", f.id, f.name, f.state));
        }
    }
    // An acknowledged cancel stays: the job ends cancelled, and it never runs again. A job
    // pending when cancelled never starts; of one running, only the attempt it was running (its
    // launch may still be on its way) may start after the cancel.
    for p in &pairs {
        let (Op::Cancel { job }, Some((acked, Outcome::Cancelled { was_running }))) = (&p.op, &p.completed) else {
            continue;
        };
        match finals.get(job) {
            Some(f) if !f.cancelled => problems
                .push(format!("cancel: job {job} was cancelled at {acked:.2} and ended {} uncancelled", f.state)),
            _ => {}
        }
        let (before, after): (Vec<&Run>, Vec<&Run>) =
            runs.iter().filter(|r| r.job == *job).partition(|r| r.start <= acked + 0.011);
        let attempts: BTreeSet<u32> = after.iter().map(|r| r.restarts).collect();
        let latest_before = before.iter().map(|r| r.restarts).max();
        let undone = match was_running {
            false => after.first(),
            true => after.iter().find(|r| attempts.len() > 1 || latest_before.is_some_and(|b| r.restarts < b)),
        };
        if let Some(r) = undone {
            problems.push(format!(
                "cancel: job {job} was cancelled ({}) at {acked:.2} and started again at {:.2} on {} (attempt {}, {})",
                if *was_running { "running" } else { "pending" },
                r.start,
                r.node,
                r.restarts,
                r.file
            ));
        }
    }
    // Every read shows a job as its submit made it.
    for p in &pairs {
        let Some((_, Outcome::Read { job: seen })) = &p.completed else { continue };
        let Some(id) = p.op.job() else { continue };
        if let Some(name) = by_id.get(&id) {
            if seen.name != *name {
                problems.push(format!("read: job {id} ('{name}') was read as '{}'", seen.name));
            }
        }
    }
    problems
}
