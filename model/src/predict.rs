//! Run-time predictions from a user's recent jobs (Tsafrir, Etsion and Feitelson, 2007): the
//! mean of the user's last two run times, capped by the job's time limit. Where the user has run
//! jobs that asked for the same time limit, the last two of those ([`RunsByLimit`]): a user's
//! jobs of one limit are mostly runs of one kind, and on the real traces this errs 18–35 % less
//! at the median (benches/RESULTS.md, "A lead for LANL"). Forecasts use the predictions; backfill
//! plans with them only when the policy says so (`Policy::predict`); jobs are still killed only
//! at their limit.

use serde::{Deserialize, Serialize};

/// A user's last two run times, in seconds, the latest first: all the predictor keeps of them,
/// so the replicated state holds two numbers per user.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecentRuns {
    pub last_s: u64,
    /// The run before the last; `None` while only one is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_s: Option<u64>,
}

impl RecentRuns {
    /// The runs after a job that ran `run_s` seconds.
    pub fn after(previous: Option<RecentRuns>, run_s: u64) -> RecentRuns {
        RecentRuns { last_s: run_s, before_s: previous.map(|p| p.last_s) }
    }

    /// The mean of the runs known, in whole seconds (rounded up), at least one.
    pub fn mean_s(&self) -> u64 {
        match self.before_s {
            Some(b) => (self.last_s / 2 + b / 2 + (self.last_s % 2 + b % 2).div_ceil(2)).max(1),
            None => self.last_s.max(1),
        }
    }
}

/// How many time limits a user's runs are kept for ([`RunsByLimit`]): the ones used last. A
/// user who asks for a new limit every time keeps no more than this; on the traces, more keep
/// the median where it is (benches/RESULTS.md).
pub const LIMITS_KEPT: usize = 8;

/// A user's last two run times for each of the time limits their latest jobs asked for, the
/// limit used last first, at most [`LIMITS_KEPT`] of them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunsByLimit(pub Vec<LimitRuns>);

/// The runs of a user's jobs that asked for one time limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitRuns {
    pub limit_s: u64,
    pub runs: RecentRuns,
}

impl RunsByLimit {
    /// The runs of the jobs that asked for `limit_s`, if one of the limits kept.
    pub fn get(&self, limit_s: u64) -> Option<&RecentRuns> {
        self.0.iter().find(|l| l.limit_s == limit_s).map(|l| &l.runs)
    }

    /// Records a job that asked for `limit_s` and ran `run_s` seconds: its limit becomes the
    /// first, and the one used longest ago is forgotten past [`LIMITS_KEPT`].
    pub fn record(&mut self, limit_s: u64, run_s: u64) {
        let previous = self.0.iter().position(|l| l.limit_s == limit_s).map(|i| self.0.remove(i).runs);
        self.0.insert(0, LimitRuns { limit_s, runs: RecentRuns::after(previous, run_s) });
        self.0.truncate(LIMITS_KEPT);
    }
}

/// The runs to predict a job from: its user's of the same time limit where there are some,
/// else its user's of any.
pub fn runs_for<'a>(
    by_user: Option<&'a RecentRuns>,
    by_limit: Option<&'a RunsByLimit>,
    limit_s: Option<u64>,
) -> Option<&'a RecentRuns> {
    limit_s.and_then(|l| by_limit?.get(l)).or(by_user)
}

/// How long to plan a job for: the prediction from its user's recent runs capped by its time
/// limit (`None`: none), or its limit when the user has no history.
pub fn predicted_s(recent: Option<&RecentRuns>, limit_s: Option<u64>) -> Option<u64> {
    match (recent.map(RecentRuns::mean_s), limit_s) {
        (Some(p), Some(l)) => Some(p.min(l).max(1)),
        (Some(p), None) => Some(p),
        (None, l) => l,
    }
}

/// What a running job that started `ran_s` seconds ago is planned to run in all: its prediction
/// while it has not outlived it; once it has, its limit (the prediction was wrong, and the
/// limit is the one bound the job keeps). `None`: no bound.
pub fn running_s(predicted: Option<u64>, limit_s: Option<u64>, ran_s: u64) -> Option<u64> {
    match predicted {
        Some(p) if p > ran_s => Some(p),
        _ => limit_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_without_history_is_planned_at_the_limit() {
        assert_eq!(predicted_s(None, Some(3600)), Some(3600));
        assert_eq!(predicted_s(None, None), None);
    }

    #[test]
    fn one_run_predicts_itself_and_two_their_mean_capped_by_the_limit() {
        let one = RecentRuns::after(None, 100);
        assert_eq!(predicted_s(Some(&one), Some(3600)), Some(100));
        let two = RecentRuns::after(Some(one), 301);
        assert_eq!(two, RecentRuns { last_s: 301, before_s: Some(100) });
        assert_eq!(predicted_s(Some(&two), Some(3600)), Some(201), "(100 + 301) / 2, rounded up");
        assert_eq!(predicted_s(Some(&two), Some(60)), Some(60), "never past the limit");
        assert_eq!(predicted_s(Some(&two), None), Some(201));
        let three = RecentRuns::after(Some(two), 7);
        assert_eq!(three.mean_s(), 154, "only the last two count");
        assert_eq!(RecentRuns::after(None, 0).mean_s(), 1, "at least a second");
        let huge = RecentRuns { last_s: u64::MAX, before_s: Some(u64::MAX) };
        assert_eq!(huge.mean_s(), u64::MAX, "no overflow");
    }

    #[test]
    fn runs_are_kept_per_limit_the_latest_limits_first_and_a_bounded_number_of_them() {
        let mut r = RunsByLimit::default();
        r.record(600, 100);
        r.record(3600, 2000);
        r.record(600, 300);
        assert_eq!(r.0.len(), 2);
        assert_eq!(r.0[0], LimitRuns { limit_s: 600, runs: RecentRuns { last_s: 300, before_s: Some(100) } });
        assert_eq!(r.get(3600), Some(&RecentRuns { last_s: 2000, before_s: None }));
        assert_eq!(r.get(60), None);
        for limit in 1..=20 {
            r.record(limit, limit);
        }
        assert_eq!(r.0.len(), LIMITS_KEPT, "a user who asks a new limit each time keeps no more");
        assert_eq!(r.0[0].limit_s, 20);
        assert_eq!(r.get(600), None, "the limit used longest ago is forgotten");
    }

    #[test]
    fn a_job_is_predicted_from_its_limits_runs_else_its_users() {
        let user = RecentRuns { last_s: 50, before_s: Some(70) };
        let mut by_limit = RunsByLimit::default();
        by_limit.record(3600, 3000);
        assert_eq!(runs_for(Some(&user), Some(&by_limit), Some(3600)), by_limit.get(3600));
        assert_eq!(runs_for(Some(&user), Some(&by_limit), Some(600)), Some(&user), "no run of that limit");
        assert_eq!(runs_for(Some(&user), Some(&by_limit), None), Some(&user), "no limit");
        assert_eq!(runs_for(Some(&user), None, Some(3600)), Some(&user));
        assert_eq!(runs_for(None, None, Some(3600)), None);
        assert_eq!(predicted_s(runs_for(Some(&user), Some(&by_limit), Some(3600)), Some(3600)), Some(3000));
    }

    #[test]
    fn a_job_that_outlives_its_prediction_is_planned_to_its_limit() {
        assert_eq!(running_s(Some(100), Some(3600), 50), Some(100));
        assert_eq!(running_s(Some(100), Some(3600), 100), Some(3600));
        assert_eq!(running_s(Some(100), None, 200), None);
        assert_eq!(running_s(None, Some(3600), 5000), Some(3600));
    }
}
