//! What the jobs themselves recorded: each run of a job (or of a step's task, `step=<id>`) writes
//! `start <uptime> <node> <gpus> <restart count> [<cron entry>@<firing> | step=<id>]`,
//! then `tick <uptime>` every 0.2 s, then `end <uptime>`, to a file of its own (job id and
//! pid). A run's recorded span lies within the span its processes really had, so two recorded
//! spans that overlap did overlap.

use std::collections::BTreeMap;
use std::path::Path;

/// Half the resolution of /proc/uptime: spans closer than this are not called overlapping.
pub(crate) const SLACK: f64 = 0.011;
/// A run's ticks 0.2 s apart; a longer silence than this between two of them is a pause (a job
/// suspended by preemption lends its CPUs meanwhile). Shorter than the shortest run of a job
/// that could have had the CPUs in between (two ticks), so that such a run always falls in a
/// pause; a silence from a loaded machine only makes the check weaker, never wrong.
pub(crate) const PAUSE: f64 = 0.35;

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
    /// When it ran, between pauses (see [`PAUSE`]): from `start` to `last` unless it was
    /// suspended.
    pub active: Vec<(f64, f64)>,
    /// A recurring job's entry and the firing (in seconds since the epoch) it ran for.
    pub cron: Option<(u64, u64)>,
    /// A step's task: the step's id (the others are the job's script).
    pub step: Option<u32>,
    /// When each `srun` the script ran returned, and its exit status.
    pub sruns: Vec<(f64, i32)>,
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
    let last = first.next().unwrap_or("");
    let step = last.strip_prefix("step=").and_then(|s| s.parse().ok());
    let cron = last.split_once('@').and_then(|(e, t)| Some((e.parse().ok()?, t.parse().ok()?)));
    let active = vec![(start, start)];
    let file = file.to_string();
    let mut run = Run {
        job,
        file,
        node,
        gpus,
        restarts,
        start,
        last: start,
        ended: false,
        active,
        cron,
        step,
        sruns: Vec::new(),
    };
    for line in lines {
        let mut words = line.split(' ');
        let (Some(kind), Some(Ok(t))) = (words.next(), words.next().map(str::parse::<f64>)) else { continue };
        run.ended |= kind == "end";
        if kind == "srun" {
            run.sruns.push((t, words.next().and_then(|rc| rc.parse().ok()).unwrap_or(-1)));
        }
        run.seen_at(t);
    }
    Some(run)
}

/// Every job the cluster says COMPLETED ran its last attempt to its end (a script writes `end`
/// only then): an exit report of an earlier attempt, or of another node, taken for the last
/// one's ends it COMPLETED while it runs on, or before it ran at all.
pub fn completed(finals: &BTreeMap<u64, super::Final>, runs: &[Run]) -> Vec<String> {
    let mut problems = Vec::new();
    for f in finals.values().filter(|f| f.state == "COMPLETED") {
        let Some(last) = f.restarts else { continue };
        if !runs.iter().any(|r| r.job == f.id && r.restarts == last && r.ended) {
            problems.push(format!(
                "outcome: job {} ('{}') is COMPLETED, but no run of its last attempt (restart {last}) ran to its end",
                f.id, f.name
            ));
        }
    }
    problems
}

impl Run {
    /// It wrote at `t`: its span, and the stretch of it running that `t` is in, reach `t`.
    pub fn seen_at(&mut self, t: f64) {
        match self.active.last_mut() {
            Some(span) if t - span.1 <= PAUSE => span.1 = span.1.max(t),
            _ => self.active.push((t, t)),
        }
        self.last = self.last.max(t);
    }

    /// Whether it was running (not paused) at `t`.
    fn running_at(&self, t: f64) -> bool {
        self.active.iter().any(|(from, to)| *from <= t && t < to - SLACK)
    }
}

fn overlap(a: &Run, b: &Run) -> bool {
    a.start < b.last - SLACK && b.start < a.last - SLACK
}

/// No job ran twice at once (a job of several nodes runs its one attempt on each of them: the
/// same attempt on two of its nodes is not twice); no node ran more jobs at once than it has CPUs
/// (each job asks one per node; a job suspended by preemption lends its CPU, and is counted only
/// while it runs); no GPU was given to two jobs at once (a suspended job keeps its GPUs); every
/// run is of a job some client submitted.
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
            // The most runs at once begin where some run begins to run: count those running
            // there (one line for each run that begins so).
            // (A run counts at its own start however short it was; a stretch after a pause only
            // if it ran at all: resumed and suspended again at once is no stretch.)
            let stretches = a.active.iter().enumerate().filter(|(k, (from, to))| *k == 0 || to - from > SLACK);
            for (k, &(t, _)) in stretches {
                let at_once: Vec<&&Run> =
                    rs.iter().filter(|b| b.running_at(t) || k == 0 && std::ptr::eq(**b, *a)).collect();
                if at_once.len() > node_cpus as usize {
                    let files: Vec<&str> = at_once.iter().map(|r| r.file.as_str()).collect();
                    problems.push(format!(
                        "runs: {node} ran {} jobs at once at {t:.2}, with {node_cpus} CPUs: {files:?}",
                        at_once.len(),
                    ));
                    break;
                }
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

/// The spans a node's agent had each job frozen (suspended by preemption), from its log, on the
/// boot-time clock (`offset`: the realtime clock less the boot-time one): (job, from, to). A
/// span runs from the line saying the agent suspends the job (it freezes it after) to 50 ms past
/// the line saying it resumes it (it thaws it after), or on without end: longer than the job was
/// really frozen, never shorter, so that a run is never called running while it was frozen.
pub fn pauses(log: &str, offset: f64) -> Vec<(u64, f64, f64)> {
    let mut open: BTreeMap<u64, f64> = BTreeMap::new();
    let mut spans = Vec::new();
    for line in log.lines() {
        let line = without_colours(line);
        let suspend = line.contains("suspending the job");
        if !suspend && !line.contains("resuming the job") {
            continue;
        }
        let Some(at) = line.split_whitespace().next().and_then(epoch_s) else { continue };
        let Some(job) = line.rsplit("job=").next().and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next()) else {
            continue;
        };
        let Ok(job) = job.parse::<u64>() else { continue };
        let at = at - offset;
        match suspend {
            true => {
                open.entry(job).or_insert(at);
            }
            false => {
                if let Some(from) = open.remove(&job) {
                    spans.push((job, from, at + 0.05));
                }
            }
        }
    }
    spans.extend(open.into_iter().map(|(job, from)| (job, from, f64::INFINITY)));
    spans
}

/// Takes each span of `pauses` out of the stretches the runs of its job on `node` were running.
pub fn apply_pauses(runs: &mut [Run], node: &str, pauses: &[(u64, f64, f64)]) {
    for run in runs.iter_mut().filter(|r| r.node == node) {
        for &(_, from, to) in pauses.iter().filter(|(job, ..)| *job == run.job) {
            run.active = run
                .active
                .iter()
                .flat_map(|&(a, b)| {
                    let before = (a < from).then(|| (a, b.min(from)));
                    let after = (b > to).then(|| (a.max(to), b));
                    before.into_iter().chain(after)
                })
                .collect();
        }
    }
}

/// A log line without its terminal colours.
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Seconds since the Unix epoch of a UTC timestamp as the logs write it
/// (`2026-11-30T06:57:25.253821Z`).
fn epoch_s(stamp: &str) -> Option<f64> {
    let (date, time) = stamp.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':').map(str::parse::<f64>);
    let (h, min, s) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    // Days since 1970-01-01 of a proleptic Gregorian date (the civil-from-days inverse).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + s)
}
