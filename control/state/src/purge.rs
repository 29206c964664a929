//! Jobs leaving the hot state. A job that ended stays in [`ClusterState::jobs`] for
//! `min_job_age` (Slurm's `MinJobAge`); then the leader proposes [`Command::PurgeJobs`] and apply
//! takes it out, handing it whole to the replica's shell in [`Response::Purged`], which writes it
//! into the job history (storage outside the state). What the state still needs of a job that
//! left is small and bounded: a [`Departed`] tombstone (its end state and times, its array, its
//! request id) kept for `min_job_age` after it left, so that a retried submit or a dependency
//! racing the purge still finds it, and for as long as a pending job depends on it. A submit
//! whose dependency names a job whose tombstone is gone brings it back from the history first
//! ([`Command::RecallJobs`], proposed by the leader with what the history holds).
//!
//! [`Command::PurgeJobs`]: crate::Command::PurgeJobs
//! [`Command::RecallJobs`]: crate::Command::RecallJobs
//! [`Response::Purged`]: crate::Response::Purged

use std::collections::BTreeSet;

use quorum_model::{Job, JobId, JobState, Millis, Shared};

use crate::cluster::ClusterState;
use crate::commands::Response;
use crate::tombstone::Departed;

/// Whether `job` ended at least `min_age` before `now`.
pub fn aged(job: &Job, now: Millis, min_age: Millis) -> bool {
    job.state.is_finished() && job.end_time.is_some_and(|end| end.saturating_add(min_age) <= now)
}

/// `PurgeJobs`: each named job that ended `min_age` ago leaves the hot state, unless a task of
/// its array is still pending or running (an array leaves once all of it has ended: its first
/// task holds what the others are read by). Then the tombstones nobody needs any more go.
pub(crate) fn purge(state: &mut ClusterState, jobs: Vec<JobId>, min_age: Millis) -> Response {
    let mut gone: Vec<Shared<Job>> = Vec::new();
    for id in jobs {
        let Some(job) = state.jobs.get(&id) else { continue };
        if !aged(job, state.clock, min_age) {
            continue;
        }
        if let Some(a) = job.array {
            let last = a.array_job_id.saturating_add(u64::from(a.count.max(1)) - 1);
            if state.active.range(a.array_job_id..=last).next().is_some() {
                continue;
            }
        }
        let Some(job) = state.jobs.remove(&id) else { continue };
        state.departed.insert(id, Departed::of(&job, state.clock));
        gone.push(job);
    }
    sweep(state, min_age);
    Response::Purged { jobs: gone }
}

/// `RecallJobs`: tombstones brought back from the history for a submit that depends on those
/// jobs. A job the state still knows is left as it is.
pub(crate) fn recall(state: &mut ClusterState, jobs: Vec<(JobId, Departed)>) -> Response {
    for (id, mut d) in jobs {
        if id >= state.next_job_id || state.knows_job(id) {
            continue;
        }
        d.left_at = state.clock;
        state.departed.insert(id, d);
    }
    Response::Ok
}

/// Drops the tombstones older than `min_age` that no pending job depends on, and the request
/// ids they held.
fn sweep(state: &mut ClusterState, min_age: Millis) {
    let cutoff = state.clock.saturating_sub(min_age);
    if !state.departed.values().any(|d| d.left_at <= cutoff) {
        return;
    }
    let needed = depended_on(state);
    let stale: Vec<JobId> = state
        .departed
        .iter()
        .filter(|(id, d)| d.left_at <= cutoff && !needed.contains(id))
        .map(|(id, _)| *id)
        .collect();
    for id in stale {
        let Some(d) = state.departed.remove(&id) else { continue };
        if !d.request_id.is_empty() && state.request_ids.get(d.request_id.as_str()) == Some(&id) {
            state.request_ids.remove(d.request_id.as_str());
        }
    }
}

/// The tombstones a pending job's dependencies name: the job itself, or every task of an array
/// named by its id. (A running job's dependencies were met when it started.)
fn depended_on(state: &ClusterState) -> BTreeSet<JobId> {
    let mut needed = BTreeSet::new();
    for id in &state.active {
        let Some(job) = state.jobs.get(id).filter(|j| j.state == JobState::Pending) else { continue };
        for dep in &job.spec.dependencies {
            let Some(d) = state.departed.get(&dep.job) else { continue };
            match d.array.filter(|a| a.array_job_id == dep.job) {
                Some(a) => {
                    let last = dep.job.saturating_add(u64::from(a.count.max(1)) - 1);
                    needed.extend(state.departed.range(dep.job..=last).map(|(id, _)| *id));
                }
                None => {
                    needed.insert(dep.job);
                }
            }
        }
    }
    needed
}

/// The tombstones of `ids`' jobs for [`Command::RecallJobs`], from job records (as the history
/// keeps them).
///
/// [`Command::RecallJobs`]: crate::Command::RecallJobs
pub fn tombstones<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> Vec<(JobId, Departed)> {
    jobs.into_iter().map(|j| (j.id, Departed::of(j, 0))).collect()
}
