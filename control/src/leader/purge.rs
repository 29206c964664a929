//! Ended jobs leave the hot state: every few seconds the leader proposes `PurgeJobs` for the
//! jobs that ended `min_job_age` ago (at most [`MAX_PER_ENTRY`] an entry), and apply moves them
//! into each replica's job history. An entry is proposed too when only tombstones are due to go,
//! so that the state also sheds those. Nothing is proposed below the history's feature level,
//! or with a `min_job_age` of zero (ended jobs stay, as Slurm's `MinJobAge=0` keeps them).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::model::{JobId, Millis};
use crate::replica::{now_ms, Replica};
use quorum_state::{Command, Response, FORGET_HISTORY_LEVEL, HISTORY_LEVEL};

/// The most jobs one entry moves: a few MB of log however many are due at once.
pub const MAX_PER_ENTRY: usize = 2_000;

/// How often the leader looks: a tenth of the age, between 1 and 30 seconds.
pub fn period(min_age: Duration) -> Duration {
    (min_age / 10).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// The jobs of `state` due to leave at `now`, oldest ids first (at most [`MAX_PER_ENTRY`]), and
/// whether a tombstone is due to go. The simulator's leader proposes by it too.
pub fn due_in(state: &quorum_state::ClusterState, now: Millis, min_age: Millis) -> (Vec<JobId>, bool) {
    let jobs = state
        .jobs
        .iter()
        .filter(|(id, j)| !state.active.contains(id) && quorum_state::aged(j, now, min_age))
        .map(|(id, _)| *id)
        .take(MAX_PER_ENTRY)
        .collect();
    let cutoff = now.saturating_sub(min_age);
    (jobs, state.departed.values().any(|d| d.left_at <= cutoff))
}

pub async fn purge_loop(replica: Arc<Replica>, min_age: Duration, mut stop: watch::Receiver<bool>) {
    if min_age.is_zero() {
        return;
    }
    let min_age_ms = u64::try_from(min_age.as_millis()).unwrap_or(u64::MAX);
    // One entry after another while a backlog is due (a cluster just upgraded, or one that ran
    // many short jobs), each at most MAX_PER_ENTRY jobs.
    let r = &replica;
    drain_every(r, period(min_age), HISTORY_LEVEL, &mut stop, move || async move {
        let now = now_ms();
        let (jobs, tombstones) = due_in(&r.shared.read().state, now, min_age_ms);
        if jobs.is_empty() && !tombstones {
            return false;
        }
        let asked = jobs.len();
        match r.write(Command::PurgeJobs { jobs, min_age: min_age_ms, now }).await {
            Ok((_, Response::Purged { jobs })) => {
                tracing::debug!(asked, moved = jobs.len(), "ended jobs moved to the job history");
                asked >= MAX_PER_ENTRY && !jobs.is_empty()
            }
            Ok((_, other)) => {
                tracing::warn!(?other, "unexpected answer to a purge");
                false
            }
            Err(e) => {
                tracing::debug!(error = %e, "purging ended jobs");
                false
            }
        }
    })
    .await
}

/// The most jobs one `ForgetHistory` entry forgets: a replica's apply holds the state while its
/// history forgets them.
const MAX_FORGOTTEN_PER_ENTRY: u32 = 2_000;

/// Jobs that ended `after` ago leave the job history (`[accounting] purge_job_after_s`, Slurm's
/// `PurgeJobAfter`): the leader proposes `ForgetHistory` every tenth of that (between 1 second
/// and an hour), one entry after another while more are due. Nothing below the level that
/// applies it, nor with `after` zero (the history keeps every job).
pub async fn forget_loop(replica: Arc<Replica>, after: Duration, mut stop: watch::Receiver<bool>) {
    if after.is_zero() {
        return;
    }
    let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
    let every = (after / 10).clamp(Duration::from_secs(1), Duration::from_secs(3600));
    let r = &replica;
    drain_every(r, every, FORGET_HISTORY_LEVEL, &mut stop, move || async move {
        let ended_before = now_ms().saturating_sub(after_ms);
        let command = Command::ForgetHistory { ended_before, max: MAX_FORGOTTEN_PER_ENTRY };
        match r.write(command).await {
            Ok((_, Response::Forgotten { count, more })) => {
                if count > 0 {
                    tracing::info!(count, "the job history forgot jobs that ended before the purge age");
                }
                more
            }
            Ok((_, other)) => {
                tracing::warn!(?other, "unexpected answer to forgetting history");
                false
            }
            Err(e) => {
                tracing::debug!(error = %e, "forgetting old history");
                false
            }
        }
    })
    .await
}

/// Every `every` until `stop`, while the cluster's level is `level` or above: `round` again and
/// again while it says more is due (each round one entry).
async fn drain_every<F, Fut>(
    replica: &Replica,
    every: Duration,
    level: u32,
    stop: &mut watch::Receiver<bool>,
    mut round: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        if replica.shared.read().state.cluster_level() < level {
            continue;
        }
        while round().await {
            if *stop.borrow() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_looks_every_tenth_of_the_age_within_bounds() {
        assert_eq!(period(Duration::from_secs(300)), Duration::from_secs(30));
        assert_eq!(period(Duration::from_secs(100)), Duration::from_secs(10));
        assert_eq!(period(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(period(Duration::from_secs(86_400)), Duration::from_secs(30));
    }
}
