//! What the jobs themselves recorded: each run of a job writes `start <uptime> <node> <gpus>
//! <restart count>`,
//! then `tick <uptime>` every 0.2 s, then `end <uptime>`, to a file of its own (job id and
//! pid). A run's recorded span lies within the span its processes really had, so two recorded
//! spans that overlap did overlap.

use std::collections::BTreeMap;
use std::path::Path;

/// Half the resolution of /proc/uptime: spans closer than this are not called overlapping.
pub(crate) const SLACK: f64 = 0.011;

#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    pub job: u64,
    pub file: String,
    pub node: String,
    pub gpus: Vec<u32>,
    /// Which attempt: how many times the job had gone back to the queue before it.
    pub restarts: u32,
    pub start: f64,
    /// The last time it wrote.
    pub last: f64,
    pub ended: bool,
}

/// Every run recorded under `dir`.
pub fn read(dir: &Path) -> anyhow::Result<Vec<Run>> {
    let mut runs = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(runs) };
    for entry in entries {
        let entry = entry?;
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(job) = file.split('.').next().and_then(|j| j.parse::<u64>().ok()) else { continue };
        let text = std::fs::read_to_string(entry.path())?;
        if let Some(run) = parse(job, &file, &text) {
            runs.push(run);
        }
    }
    runs.sort_by(|a, b| a.start.total_cmp(&b.start));
    Ok(runs)
}

/// One run's record; `None` when it did not get as far as its first line.
pub fn parse(job: u64, file: &str, text: &str) -> Option<Run> {
    let mut lines = text.lines();
    let mut first = lines.next()?.split(' ');
    (first.next()? == "start").then_some(())?;
    let start: f64 = first.next()?.parse().ok()?;
    let node = first.next().unwrap_or("").to_string();
    let gpus = first.next().unwrap_or("").split(',').filter_map(|g| g.parse().ok()).collect();
    let restarts = first.next().and_then(|r| r.parse().ok()).unwrap_or(0);
    let mut run = Run { job, file: file.to_string(), node, gpus, restarts, start, last: start, ended: false };
    for line in lines {
        let mut words = line.split(' ');
        let (Some(kind), Some(Ok(t))) = (words.next(), words.next().map(str::parse::<f64>)) else { continue };
        run.last = run.last.max(t);
        run.ended |= kind == "end";
    }
    Some(run)
}

fn overlap(a: &Run, b: &Run) -> bool {
    a.start < b.last - SLACK && b.start < a.last - SLACK
}

/// No job ran twice at once (a job of several nodes runs its one attempt on each of them: the
/// same attempt on two of its nodes is not twice); no node ran more jobs at once than it has CPUs
/// (each job asks one per node); no GPU was given to two jobs at once; every run is of a job some
/// client submitted.
pub fn check(
    runs: &[Run],
    node_cpus: u32,
    known_jobs: &std::collections::BTreeSet<u64>,
    multi_node: &std::collections::BTreeSet<u64>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut by_job: BTreeMap<u64, Vec<&Run>> = BTreeMap::new();
    let mut by_node: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        by_job.entry(r.job).or_default().push(r);
        by_node.entry(r.node.as_str()).or_default().push(r);
        if !known_jobs.contains(&r.job) {
            problems.push(format!("runs: job {} ran ({}) but no client's submit made it", r.job, r.file));
        }
    }
    for (job, rs) in &by_job {
        for (i, a) in rs.iter().enumerate() {
            for b in &rs[i + 1..] {
                let one_attempt = multi_node.contains(job) && a.restarts == b.restarts && a.node != b.node;
                if overlap(a, b) && !one_attempt {
                    problems.push(format!(
                        "runs: job {job} ran twice at once: on {} {:.2}-{:.2} ({}) and on {} {:.2}-{:.2} ({})",
                        a.node, a.start, a.last, a.file, b.node, b.start, b.last, b.file
                    ));
                }
            }
        }
    }
    for (node, rs) in &by_node {
        for (i, a) in rs.iter().enumerate() {
            // The most runs at once begin with some run's start: count those spanning it.
            let at_once: Vec<&&Run> =
                rs.iter().filter(|b| b.start <= a.start && a.start < b.last - SLACK || std::ptr::eq(**b, *a)).collect();
            if at_once.len() > node_cpus as usize {
                let files: Vec<&str> = at_once.iter().map(|r| r.file.as_str()).collect();
                problems.push(format!(
                    "runs: {node} ran {} jobs at once at {:.2}, with {node_cpus} CPUs: {files:?}",
                    at_once.len(),
                    a.start
                ));
            }
            for b in &rs[i + 1..] {
                if a.job != b.job && overlap(a, b) {
                    if let Some(g) = a.gpus.iter().find(|g| b.gpus.contains(g)) {
                        problems.push(format!(
                            "runs: GPU {g} of {node} given to jobs {} and {} at once ({}, {})",
                            a.job, b.job, a.file, b.file
                        ));
                    }
                }
            }
        }
    }
    problems
}
