//! How close the start shown to a waiting job came to when it started, judged one way by the
//! leader (`/metrics`' `scheduler_start_error_seconds`) and by the simulator (`quorum simulate
//! --estimates`).

/// Jobs that waited less than this are not judged: one that starts at once is shown no start,
/// or one that can hardly be wrong.
pub const JUDGED_WAIT_S: u64 = 60;

/// How far the start shown (`shown_s`) was from the start (`start_s`) of a job submitted at
/// `submit_s`, all in seconds; `None` for a job that waited less than [`JUDGED_WAIT_S`].
pub fn error_s(submit_s: u64, start_s: u64, shown_s: u64) -> Option<u64> {
    (start_s.saturating_sub(submit_s) >= JUDGED_WAIT_S).then(|| shown_s.abs_diff(start_s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_jobs_that_waited_are_judged_either_side_of_their_start() {
        assert_eq!(error_s(100, 159, 100), None, "waited 59 s");
        assert_eq!(error_s(100, 160, 100), Some(60), "shown too early");
        assert_eq!(error_s(100, 160, 400), Some(240), "shown too late");
        assert_eq!(error_s(200, 100, 0), None, "a start before the submit is not a wait");
    }
}
