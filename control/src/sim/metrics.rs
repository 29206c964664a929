//! Schedule quality: waits, bounded slowdown, makespan and utilization, for the simulated
//! schedule and for what the real machine recorded.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{JobRecord, SimResult};

/// Bounded slowdown's lower bound on the run time (s).
pub const BSLD_BOUND_S: u64 = 10;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UserMetrics {
    pub jobs: usize,
    pub wait_mean_s: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Metrics {
    pub jobs: usize,
    /// From the first submit to the last end.
    pub makespan_s: u64,
    /// Σ(run × processors) / (makespan × the machine's processors).
    pub utilization: f64,
    pub wait_mean_s: f64,
    /// Nearest-rank percentiles of the waits.
    pub wait_median_s: u64,
    pub wait_p95_s: u64,
    pub wait_p99_s: u64,
    pub wait_max_s: u64,
    /// Mean of max(1, (wait + run) / max(run, 10 s)).
    pub bsld_mean: f64,
    pub per_user: BTreeMap<String, UserMetrics>,
}

/// One job's outcome as the metrics need it.
#[derive(Clone, Debug)]
pub struct Outcome<'a> {
    pub user: &'a str,
    pub submit_s: u64,
    pub wait_s: u64,
    pub run_s: u64,
    pub procs: u64,
}

/// The nearest-rank `p`-th percentile of sorted values.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Metrics {
    pub fn of(outcomes: &[Outcome], machine_cpus: u64) -> Metrics {
        let n = outcomes.len();
        let first = outcomes.iter().map(|o| o.submit_s).min().unwrap_or(0);
        let last = outcomes.iter().map(|o| o.submit_s + o.wait_s + o.run_s).max().unwrap_or(0);
        let makespan_s = last.saturating_sub(first);
        let work: f64 = outcomes.iter().map(|o| o.run_s as f64 * o.procs as f64).sum();
        let utilization =
            if makespan_s == 0 || machine_cpus == 0 { 0.0 } else { work / (makespan_s as f64 * machine_cpus as f64) };
        let mut waits: Vec<u64> = outcomes.iter().map(|o| o.wait_s).collect();
        waits.sort_unstable();
        let mean = |sum: f64| if n == 0 { 0.0 } else { sum / n as f64 };
        let bsld = |o: &Outcome| ((o.wait_s + o.run_s) as f64 / o.run_s.max(BSLD_BOUND_S) as f64).max(1.0);
        let mut users: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
        for o in outcomes {
            let u = users.entry(o.user).or_default();
            u.0 += 1;
            u.1 += o.wait_s;
        }
        Metrics {
            jobs: n,
            makespan_s,
            utilization,
            wait_mean_s: mean(waits.iter().map(|&w| w as f64).sum()),
            wait_median_s: percentile(&waits, 50.0),
            wait_p95_s: percentile(&waits, 95.0),
            wait_p99_s: percentile(&waits, 99.0),
            wait_max_s: waits.last().copied().unwrap_or(0),
            bsld_mean: mean(outcomes.iter().map(bsld).sum()),
            per_user: users
                .into_iter()
                .map(|(u, (jobs, wait))| (u.to_string(), UserMetrics { jobs, wait_mean_s: wait as f64 / jobs as f64 }))
                .collect(),
        }
    }
}

/// The simulated schedule's metrics, and the recorded ones over the jobs whose real wait the
/// trace holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub simulated: Metrics,
    /// Jobs that never started (the replay ends when no event is left; a job that fits no
    /// node is rejected at submit instead).
    pub never_started: usize,
    /// Jobs killed at their time limit.
    pub killed_at_limit: usize,
    /// Preemptions (a job preempted twice counts twice), and the jobs they stopped.
    pub preemptions: u64,
    pub preempted_jobs: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<Metrics>,
    /// How good the start estimates were (with `SimOptions::estimates`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimates: Option<EstimateAccuracy>,
}

/// Which jobs' start estimates are judged: those that waited at least this long (the
/// leader's `/metrics` judge alike: [`quorum_sched::accuracy`]).
pub const ESTIMATED_WAIT_S: u64 = quorum_sched::accuracy::JUDGED_WAIT_S;

/// How close start estimates came to the actual starts, over the jobs that waited at least
/// [`ESTIMATED_WAIT_S`]: the estimate made when each was submitted, and the last one before it
/// started.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EstimateAccuracy {
    pub at_submit: EstimateErrors,
    pub last: EstimateErrors,
}

/// Absolute errors of start estimates against actual starts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EstimateErrors {
    /// Jobs judged (those with an estimate of this kind).
    pub jobs: usize,
    pub mean_abs_s: f64,
    pub median_abs_s: u64,
    pub p90_abs_s: u64,
    /// The share of them within ten minutes of the actual start.
    pub within_10_min: f64,
}

impl EstimateErrors {
    /// Over absolute errors in seconds.
    pub fn of(errors: impl Iterator<Item = u64>) -> EstimateErrors {
        let mut errors: Vec<u64> = errors.collect();
        errors.sort_unstable();
        let n = errors.len();
        let share = |count: usize| if n == 0 { 0.0 } else { count as f64 / n as f64 };
        EstimateErrors {
            jobs: n,
            mean_abs_s: if n == 0 { 0.0 } else { errors.iter().map(|&e| e as f64).sum::<f64>() / n as f64 },
            median_abs_s: percentile(&errors, 50.0),
            p90_abs_s: percentile(&errors, 90.0),
            within_10_min: share(errors.iter().filter(|&&e| e <= 600).count()),
        }
    }
}

impl EstimateAccuracy {
    pub fn of(jobs: &[JobRecord]) -> EstimateAccuracy {
        let error = |j: &JobRecord, shown: Option<u64>| quorum_sched::accuracy::error_s(j.submit_s, j.start_s?, shown?);
        EstimateAccuracy {
            at_submit: EstimateErrors::of(jobs.iter().filter_map(|j| error(j, j.estimate_at_submit_s))),
            last: EstimateErrors::of(jobs.iter().filter_map(|j| error(j, j.estimate_last_s))),
        }
    }
}

impl Report {
    pub fn of(result: &SimResult) -> Report {
        let cpus = result.machine.total_cpus();
        let ran: Vec<&JobRecord> = result.jobs.iter().filter(|j| j.start_s.is_some()).collect();
        let simulated: Vec<Outcome> = ran
            .iter()
            .map(|j| Outcome {
                user: &j.user,
                submit_s: j.submit_s,
                wait_s: j.wait_s().unwrap_or(0),
                run_s: j.ran_s().unwrap_or(0),
                procs: j.procs,
            })
            .collect();
        let recorded: Vec<Outcome> = result
            .jobs
            .iter()
            .filter_map(|j| {
                Some(Outcome {
                    user: &j.user,
                    submit_s: j.submit_s,
                    wait_s: j.recorded_wait_s?,
                    run_s: j.run_s,
                    procs: j.procs,
                })
            })
            .collect();
        Report {
            simulated: Metrics::of(&simulated, cpus),
            never_started: result.jobs.len() - ran.len(),
            killed_at_limit: result.jobs.iter().filter(|j| j.killed).count(),
            preemptions: result.jobs.iter().map(|j| u64::from(j.preempted)).sum(),
            preempted_jobs: result.jobs.iter().filter(|j| j.preempted > 0).count(),
            recorded: (!recorded.is_empty()).then(|| Metrics::of(&recorded, cpus)),
            estimates: result.estimated.then(|| EstimateAccuracy::of(&result.jobs)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_by_hand() {
        let o = |user, submit_s, wait_s, run_s, procs| Outcome { user, submit_s, wait_s, run_s, procs };
        // Machine of 4 CPUs. a: waits 0, runs 100 on 4; b: waits 100, runs 5 on 2 (bsld bound
        // 10 s: (100+5)/10 = 10.5); c: waits 20, runs 40 on 1 ((20+40)/40 = 1.5).
        let m = Metrics::of(&[o("a", 0, 0, 100, 4), o("b", 0, 100, 5, 2), o("a", 50, 20, 40, 1)], 4);
        assert_eq!(m.jobs, 3);
        assert_eq!(m.makespan_s, 110, "first submit 0, last end 0+100+5 = 105 vs 50+20+40 = 110");
        assert!((m.utilization - (400.0 + 10.0 + 40.0) / (110.0 * 4.0)).abs() < 1e-12);
        assert!((m.wait_mean_s - 40.0).abs() < 1e-12);
        assert_eq!((m.wait_median_s, m.wait_p95_s, m.wait_max_s), (20, 100, 100));
        assert!((m.bsld_mean - (1.0 + 10.5 + 1.5) / 3.0).abs() < 1e-12);
        assert_eq!(m.per_user["a"], UserMetrics { jobs: 2, wait_mean_s: 10.0 });
        assert_eq!(m.per_user["b"], UserMetrics { jobs: 1, wait_mean_s: 100.0 });
        assert_eq!(percentile(&[1, 2, 3, 4], 50.0), 2);
        assert_eq!(percentile(&(1..=100).collect::<Vec<_>>(), 95.0), 95);
        assert_eq!(percentile(&[], 95.0), 0);
    }

    #[test]
    fn estimate_errors_by_hand() {
        // Errors 0, 300, 900 and 3600 s: mean 1200, median (nearest rank) 300, two of four
        // within ten minutes.
        let pairs = [(100u64, 100u64), (400, 100), (1000, 1900), (3700, 100)];
        let e = EstimateErrors::of(pairs.iter().map(|&(shown, start)| shown.abs_diff(start)));
        assert_eq!((e.jobs, e.median_abs_s, e.p90_abs_s), (4, 300, 3600));
        assert!((e.mean_abs_s - 1200.0).abs() < 1e-9 && (e.within_10_min - 0.5).abs() < 1e-9, "{e:?}");
        assert_eq!(EstimateErrors::of(std::iter::empty()).jobs, 0);
    }
}
