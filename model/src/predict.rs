//! Run-time predictions from a user's recent jobs (Tsafrir, Etsion and Feitelson, 2007): the
//! mean of the user's last two run times, capped by the job's time limit. Backfill plans with
//! predictions when the policy says so (`Policy::predict`); jobs are still killed only at their
//! limit.

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
    fn a_job_that_outlives_its_prediction_is_planned_to_its_limit() {
        assert_eq!(running_s(Some(100), Some(3600), 50), Some(100));
        assert_eq!(running_s(Some(100), Some(3600), 100), Some(3600));
        assert_eq!(running_s(Some(100), None, 200), None);
        assert_eq!(running_s(None, Some(3600), 5000), Some(3600));
    }
}
