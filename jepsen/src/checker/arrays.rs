//! Job arrays: one submit makes every task at once (an acknowledged array has all its tasks, each
//! once), and no more tasks of an array run at once than its throttle (`--array=...%K`) allows,
//! judged on the spans the tasks' processes recorded, not on what the cluster said.

use std::collections::{BTreeMap, BTreeSet};

use super::ended::Final;
use super::runs::{Run, SLACK};
use crate::history::{pairs, Array, Event, Op, Outcome};

pub fn check(events: &[Event], finals: &BTreeMap<u64, Final>, runs: &[Run]) -> Vec<String> {
    let pairs = match pairs(events) {
        Ok(p) => p,
        Err(e) => return vec![format!("arrays: malformed history: {e}")],
    };
    let mut problems = Vec::new();
    for p in &pairs {
        let Op::Submit { name, array: Some(array), .. } = &p.op else { continue };
        // Its tasks, as the final read shows them: every job of the submit's (unique) name.
        let tasks: BTreeMap<u64, Option<u32>> =
            finals.values().filter(|f| f.name == *name).map(|f| (f.id, f.task)).collect();
        let acked = match &p.completed {
            Some((_, Outcome::Submitted { job })) => Some(*job),
            _ => None,
        };
        problems.extend(whole(name, *array, acked, &tasks));
        let ids: BTreeSet<u64> = tasks.keys().copied().collect();
        problems.extend(throttled(name, *array, &ids, runs));
    }
    problems
}

/// An array exists whole or not at all: task ids 0 to N-1, once each, on consecutive job ids
/// from the array's id (the one its submit was answered).
fn whole(name: &str, array: Array, acked: Option<u64>, tasks: &BTreeMap<u64, Option<u32>>) -> Vec<String> {
    if tasks.is_empty() && acked.is_none() {
        return Vec::new();
    }
    let first = acked.or_else(|| tasks.keys().next().copied()).unwrap_or_default();
    let expected: BTreeMap<u64, Option<u32>> = (0..array.tasks).map(|t| (first + u64::from(t), Some(t))).collect();
    if *tasks == expected {
        return Vec::new();
    }
    vec![format!(
        "arrays: '{name}' (--array={}, answered {acked:?}) should be jobs {first}..{} with tasks 0..{}, and the final read has {tasks:?}",
        array.arg(),
        first + u64::from(array.tasks),
        array.tasks
    )]
}

/// At no instant did more of the array's tasks run than its throttle: the most runs at once begin
/// with some run's start, so counting the distinct tasks whose recorded span holds each start is
/// enough.
fn throttled(name: &str, array: Array, ids: &BTreeSet<u64>, runs: &[Run]) -> Vec<String> {
    let mine: Vec<&Run> = runs.iter().filter(|r| ids.contains(&r.job)).collect();
    let mut problems = Vec::new();
    for a in &mine {
        let at_once: BTreeSet<u64> = mine
            .iter()
            .filter(|b| b.start <= a.start && a.start < b.last - SLACK)
            .map(|b| b.job)
            .chain([a.job])
            .collect();
        if at_once.len() > array.throttle as usize {
            problems.push(format!(
                "arrays: '{name}' (--array={}) ran {} tasks at once at {:.2} (jobs {at_once:?}), its throttle is {}",
                array.arg(),
                at_once.len(),
                a.start,
                array.throttle
            ));
            // One line per array is enough to say it.
            break;
        }
    }
    problems
}
