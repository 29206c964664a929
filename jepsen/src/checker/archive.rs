//! The job history: jobs that ended `min_job_age` ago leave the queue for it (Slurm's accounting
//! is what `sacct` reads). At the end of a run every replica's history is read: a job it holds is
//! judged with the rest (as the final read shows the queue), every replica holds the same records,
//! and no job is in the history unended, or still in the queue when it is read after the history
//! (a job only ever leaves the queue for the history, so one the history had is gone from it).

use std::collections::{BTreeMap, BTreeSet};

use super::ended::{terminal, Final, Placed};

/// A job as a history record keeps it (the JSON of the controller's job), as the checkers see
/// jobs; `None` when the record cannot be read.
pub fn final_of(record: &[u8]) -> Option<Final> {
    let v: serde_json::Value = serde_json::from_slice(record).ok()?;
    let id = v.get("id")?.as_u64()?;
    let spec = v.get("spec")?;
    let name = spec.get("name")?.as_str()?.to_string();
    let state = state_name(v.get("state")?.as_str()?);
    let cancelled = state == "CANCELLED"
        || v.get("cancel_requested").and_then(|c| c.as_bool()).unwrap_or(false)
        || v.get("cancelled_by").is_some_and(|c| !c.is_null());
    let task = v.get("array").and_then(|a| a.get("task_id")).and_then(|t| t.as_u64()).map(|t| t as u32);
    let nodes = v
        .get("allocation")
        .and_then(|a| a.get("nodes"))
        .and_then(|n| n.as_array())
        .map(|ns| ns.iter().filter_map(|n| n.get("node")?.as_str().map(String::from)).collect())
        .unwrap_or_default();
    let placed = Placed {
        reservation: spec.get("reservation").and_then(|r| r.as_str()).map(String::from),
        start_ms: v.get("start_time").and_then(|t| t.as_u64()).unwrap_or(0),
        end_ms: v.get("end_time").and_then(|t| t.as_u64()).unwrap_or(0),
        nodes,
    };
    let restarts = v.get("requeues").and_then(|r| r.as_u64()).map(|r| r as u32);
    Some(Final { id, name, state, cancelled, task, placed: Some(placed), restarts })
}

/// `NodeFail` as Slurm names it: `NODE_FAIL`.
fn state_name(variant: &str) -> String {
    let mut out = String::new();
    for (i, c) in variant.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// What the replicas' histories and the queue read after them say together.
pub struct Judged {
    pub problems: Vec<String>,
    /// Every job of the history, as the first replica that could be read holds it.
    pub jobs: Vec<Final>,
    /// Every replica read holds the same jobs.
    pub agree: bool,
}

pub fn check(histories: &[(String, Vec<Vec<u8>>)], queue_after: &BTreeSet<u64>) -> Judged {
    let mut problems = Vec::new();
    let mut agree = true;
    let mut first: Option<(&str, BTreeMap<u64, Final>)> = None;
    for (replica, records) in histories {
        let mut jobs = BTreeMap::new();
        for r in records {
            match final_of(r) {
                Some(f) => {
                    jobs.insert(f.id, f);
                }
                None => problems.push(format!("history: {replica} holds a record that is not a job")),
            }
        }
        match &first {
            None => first = Some((replica, jobs)),
            Some((other, theirs)) => {
                let (a, b): (BTreeSet<&u64>, BTreeSet<&u64>) = (theirs.keys().collect(), jobs.keys().collect());
                if a != b {
                    agree = false;
                    let only_a: Vec<&&u64> = a.difference(&b).collect();
                    let only_b: Vec<&&u64> = b.difference(&a).collect();
                    problems.push(format!(
                        "history: {other} and {replica} hold other jobs (only in {other}: {only_a:?}; only in {replica}: {only_b:?})"
                    ));
                }
            }
        }
    }
    let jobs: Vec<Final> = first.map(|(_, j)| j.into_values().collect()).unwrap_or_default();
    for f in &jobs {
        if queue_after.contains(&f.id) {
            problems.push(format!("history: job {} ('{}') was in the history, then in the queue", f.id, f.name));
        }
        if !terminal(&f.state) {
            problems.push(format!("history: job {} ('{}') is in the history {}", f.id, f.name, f.state));
        }
    }
    Judged { problems, jobs, agree }
}
