//! Steps (`srun` inside a job's script, which ticks while each runs): a step's task runs on its
//! job's node while that attempt's script runs there (never before it, and never longer after the script's last record
//! than a kill takes to reach every process: a cancel, a lease that ran out, or the script's end
//! stops its steps with it); each step of an attempt runs once; and each `srun` that said its step
//! succeeded had a task of its own that ran to its end after the previous `srun` returned.

use std::collections::BTreeMap;

use super::runs::{Run, PAUSE, SLACK};

/// How long after its script's last record a step's task may still record: the agents' kill
/// wait (2 s: SIGTERM, then SIGKILL) and a tick.
const KILL_SPREAD: f64 = 2.5;

pub fn check(runs: &[Run]) -> Vec<String> {
    let (steps, scripts): (Vec<&Run>, Vec<&Run>) = runs.iter().partition(|r| r.step.is_some());
    let mut problems = Vec::new();
    let mut by_step: BTreeMap<(u64, u32, u32), Vec<&Run>> = BTreeMap::new();
    let of_script = |s: &Run, b: &Run| b.job == s.job && b.restarts == s.restarts && b.node == s.node;
    for s in &steps {
        let id = s.step.unwrap_or_default();
        by_step.entry((s.job, s.restarts, id)).or_default().push(s);
        // The script ticks while its steps run: it was alive until a tick's time after its
        // last record at least.
        let script =
            scripts.iter().find(|b| of_script(s, b) && b.start <= s.start + SLACK && s.start <= b.last + PAUSE);
        match script {
            None => problems.push(format!(
                "steps: step {}.{id} (attempt {}) ran on {} from {:.2} ({}), outside any run of its job's script there",
                s.job, s.restarts, s.node, s.start, s.file
            )),
            Some(b) if s.last > b.last + KILL_SPREAD => problems.push(format!(
                "steps: step {}.{id} ran on {} until {:.2} ({}), {:.1} s after its job's script last did ({})",
                s.job,
                s.node,
                s.last,
                s.file,
                s.last - b.last,
                b.file
            )),
            Some(_) => {}
        }
    }
    for ((job, attempt, id), rs) in &by_step {
        if rs.len() > 1 {
            let files: Vec<&str> = rs.iter().map(|r| r.file.as_str()).collect();
            problems.push(format!("steps: step {job}.{id} (attempt {attempt}) ran {} times: {files:?}", rs.len()));
        }
    }
    for b in scripts.iter().filter(|b| !b.sruns.is_empty()) {
        let mine: Vec<&&Run> = steps.iter().filter(|s| of_script(s, b)).collect();
        let mut from = b.start;
        for &(returned, rc) in &b.sruns {
            let ran = mine.iter().any(|s| s.ended && s.start >= from - SLACK && s.last <= returned + SLACK);
            if rc == 0 && !ran {
                problems.push(format!(
                    "steps: an srun of job {} returned 0 at {returned:.2} ({}), and no step's task ran to its end there since {from:.2}",
                    b.job, b.file
                ));
            }
            from = returned;
        }
    }
    problems
}
