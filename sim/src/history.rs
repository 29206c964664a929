//! The job history in the simulation, as the controller keeps it: jobs that ended
//! [`MIN_JOB_AGE`] ago leave the state for each replica's history.
//!
//! - The leader proposes `PurgeJobs` for the jobs due, found by the controller's own rule
//!   ([`quorum_control::leader::purge::due_in`]), at the controller's pace (a tenth of the
//!   age); apply (the real `quorum_state::apply`) hands them to the simulated disk's history
//!   ([`crate::disk`]), durable once synced: a snapshot stored syncs it first, and a crash loses
//!   the rest, which the entries after the snapshot write again when applied again.
//! - A replica that installed a snapshot has an incomplete history: it copies every record from a
//!   peer whose own is complete and has applied as far as the snapshot ([`catch_up`], as the
//!   controller's `replica::catch_up` does over the peers' API), then takes the mark away.
//! - A read of a job the state no longer holds is answered from the history, as `quorum show`
//!   is; the end of a run reads every replica's history and judges it with `jepsen/`'s checker
//!   (`checker::archive`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use quorum_state::{Command, Response};
use tokio::sync::watch;

use crate::disk::{lock, read};
use crate::leader::{leads, write};
use crate::world::{Replica, World};

/// How long an ended job stays in the queue (`min_job_age_s`, as `jepsen/` configures its
/// controllers).
pub const MIN_JOB_AGE: Duration = Duration::from_secs(10);

/// How often a replica with an incomplete history tries again to copy it.
const RETRY: Duration = Duration::from_secs(2);

/// The leader's purge loop of one incarnation, until it stops.
pub async fn purge_loop(world: Arc<World>, r: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    let every = quorum_control::leader::purge::period(MIN_JOB_AGE);
    let min_age = MIN_JOB_AGE.as_millis() as u64;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        // One entry after another while more are due, as the controller's loop drains them.
        while !*stop.borrow() && leads(&r) {
            let now = world.wall_ms(r.id);
            let (jobs, tombstones) = quorum_control::leader::purge::due_in(&read(&r.applied).state, now, min_age);
            if jobs.is_empty() && !tombstones {
                break;
            }
            let asked = jobs.len();
            match write(&r, Command::PurgeJobs { jobs, min_age, now }).await {
                Ok((_, Response::Purged { jobs })) => {
                    let ids: Vec<u64> = jobs.iter().map(|j| j.id).collect();
                    world.trace(format!("r{} moves {} of {asked} jobs to the history: {ids:?}", r.id, ids.len()));
                    if asked < quorum_control::leader::purge::MAX_PER_ENTRY || ids.is_empty() {
                        break;
                    }
                }
                Ok((_, other)) => {
                    world.trace(format!("r{} purge answered {other:?}", r.id));
                    break;
                }
                Err(e) => {
                    world.trace(format!("r{} purge: {e}", r.id));
                    break;
                }
            }
        }
    }
}

/// Completes the history of replica `r` whenever an installed snapshot left it incomplete: every
/// record of a peer whose history is complete and has applied at least as far as the snapshot,
/// each request and answer crossing the simulated network (the leader asked first, then the
/// others by id).
pub async fn catch_up(world: Arc<World>, r: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = stop.changed() => return,
        }
        let Some(gap) = lock(&world.disks[&r.id]).history_gap() else { continue };
        let leader = r.raft.metrics().borrow().current_leader;
        let mut peers: Vec<u64> = world.replica_ids().into_iter().filter(|&p| p != r.id).collect();
        peers.sort_by_key(|&p| (Some(p) != leader, p));
        for p in peers {
            let Some(peer) = world.replica(p) else { continue };
            if !world.net.hop(r.id, p).await {
                continue;
            }
            let (records, complete, applied) = {
                let disk = lock(&world.disks[&p]);
                let applied = read(&peer.applied).last_applied.map_or(0, |l| l.index);
                (disk.history(), disk.history_gap().is_none(), applied)
            };
            if !complete || applied < gap || !world.net.hop(p, r.id).await {
                continue;
            }
            // A crashed incarnation writes nothing more.
            if *stop.borrow() || !world.replica(r.id).is_some_and(|live| Arc::ptr_eq(&live, &r)) {
                return;
            }
            let count = records.len();
            let closed = lock(&world.disks[&r.id]).history_copied(records, gap);
            world.trace(format!(
                "r{} copies {count} history records from r{p} (snapshot at {gap}, closed {closed})",
                r.id
            ));
            break;
        }
    }
}

/// Job `job` as replica `id`'s history holds it: `Some(None)` when it holds no such job,
/// `None` when it cannot say (its history is incomplete and lacks it).
pub fn job(world: &World, id: u64, job: u64) -> Option<Option<quorum_model::Job>> {
    let disk = lock(&world.disks[&id]);
    let found = disk.history_record(job).and_then(|r| serde_json::from_slice(r).ok());
    match (found, disk.history_gap()) {
        (Some(j), _) => Some(Some(j)),
        (None, None) => Some(None),
        (None, Some(_)) => None,
    }
}

/// Every live replica's whole history, as `jepsen/` reads each with `FollowHistory` (a replica
/// still copying its history answers UNAVAILABLE, and is not read).
pub fn histories(world: &World) -> Vec<(String, Vec<Vec<u8>>)> {
    world
        .alive()
        .iter()
        .filter_map(|r| {
            let disk = lock(&world.disks[&r.id]);
            disk.history_gap().is_none().then(|| (format!("r{}", r.id), disk.history().into_values().collect()))
        })
        .collect()
}

/// The history judged with the queue read after it, read again (up to five times, 2 s apart
/// and more) while the replicas' differ, as `jepsen/` does.
pub async fn judged(world: &World) -> quorum_jepsen::checker::archive::Judged {
    let mut attempt = 0;
    loop {
        let histories = histories(world);
        let queue: std::collections::BTreeSet<u64> =
            world.leader().map(|l| read(&l.applied).state.jobs.keys().copied().collect()).unwrap_or_default();
        let judged = quorum_jepsen::checker::archive::check(&histories, &queue);
        attempt += 1;
        if (judged.agree && !histories.is_empty()) || attempt == 5 {
            return judged;
        }
        tokio::time::sleep(Duration::from_secs(2 * attempt)).await;
    }
}

/// How many times each job in the history was requeued, as the live replicas whose histories
/// are complete hold it.
pub fn requeues(world: &World) -> BTreeMap<u64, u32> {
    // Every replica's: a job the leader has just moved is in the histories of those that applied
    // the move, and no longer in its state (seed 139282: the first replica's history lacked two
    // jobs the leader had moved after the final reads, and each was judged by attempt 0).
    let mut requeues = BTreeMap::new();
    for (_, records) in histories(world) {
        for j in records.iter().filter_map(|r| serde_json::from_slice::<quorum_model::Job>(r).ok()) {
            requeues.entry(j.id).or_insert(j.requeues);
        }
    }
    requeues
}

/// How many records each live replica's history holds (for the trace).
pub fn counts(world: &World) -> BTreeMap<u64, usize> {
    world.alive().iter().map(|r| (r.id, lock(&world.disks[&r.id]).history().len())).collect()
}
