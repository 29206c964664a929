//! Advance reservations: no job outside a reservation used its nodes in its window, and a job in
//! one ran only on its nodes, in its window. Judged on the cluster's own times (a job's start and
//! end as its final read shows them, the window as the reservation has it): the clock faults move
//! the controllers' clocks, and the reservation keeps theirs. A job's earlier attempts (before a
//! requeue) are not in its final read, and are not judged here.

use std::collections::BTreeMap;

use super::ended::Final;

/// A reservation as the cluster had it: its nodes, and its window in the cluster's milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Resv {
    pub name: String,
    pub nodes: Vec<String>,
    pub start_ms: u64,
    pub end_ms: u64,
}

pub fn check(reservations: &[Resv], finals: &BTreeMap<u64, Final>) -> Vec<String> {
    let mut problems = Vec::new();
    for r in reservations {
        for f in finals.values() {
            let Some(p) = f.placed.as_ref().filter(|p| p.start_ms > 0) else { continue };
            let end = if p.end_ms == 0 { u64::MAX } else { p.end_ms };
            let mine = p.reservation.as_deref() == Some(r.name.as_str());
            let shared: Vec<&String> = p.nodes.iter().filter(|n| r.nodes.contains(n)).collect();
            if !mine && !shared.is_empty() && p.start_ms < r.end_ms && end > r.start_ms {
                problems.push(format!(
                    "reservations: job {} ('{}', not in '{}') ran on {shared:?} from {} to {end}, in its window {}..{}",
                    f.id, f.name, r.name, p.start_ms, r.start_ms, r.end_ms
                ));
            }
            if mine && (p.start_ms < r.start_ms || p.start_ms >= r.end_ms || shared.len() < p.nodes.len()) {
                problems.push(format!(
                    "reservations: job {} ('{}', in '{}') started at {} on {:?}, not in its window {}..{} on {:?}",
                    f.id, f.name, r.name, p.start_ms, p.nodes, r.start_ms, r.end_ms, r.nodes
                ));
            }
        }
    }
    problems
}
