//! Advance reservations in the replicated state: making, changing and deleting them
//! (operators), and the checks a job in one, or a job beside one, meets at submit and at start.

use quorum_model::reservation::{Reservation, ResvRequest, MAX_RESERVATIONS};
use quorum_model::{Allocation, Job, JobSpec, JobState, Millis, Rejection};

use crate::cluster::ClusterState;
use crate::commands::DropReason;

fn refused(name: &str, reason: impl Into<String>) -> Rejection {
    Rejection::Reservation { name: name.to_string(), reason: reason.into() }
}

/// Reservations over for good leave the state (a job still waiting for one then says
/// `ReservationDeleted`).
pub fn purge_expired(state: &mut ClusterState) {
    let clock = state.clock;
    state.reservations.retain(|_, r| !r.expired(clock));
}

/// Whether two reservations may not share a node at the same moment: only a maintenance one
/// may overlap another, and not another maintenance one.
fn exclusive_of(a: &Reservation, b: &Reservation) -> bool {
    a.flags.maint == b.flags.maint
}

/// When a running job gives its nodes back, as far as anyone can plan: its start plus its limit
/// (`None`: never).
fn planned_end(job: &Job) -> Option<Millis> {
    let start = job.start_time?;
    job.limit_from_start_s().map(|l| start.saturating_add(l.saturating_mul(1000)))
}

/// `CreateReservation` (`update` false) or `UpdateReservation`: the reservation as made.
pub fn reserve(
    state: &mut ClusterState,
    request: &ResvRequest,
    user: &str,
    update: bool,
) -> Result<Reservation, Rejection> {
    let name = request.name.as_str();
    if user != "root" {
        let what = if update { "change" } else { "create" };
        return Err(Rejection::OperatorOnly { what: format!("{what} a reservation ({name})") });
    }
    purge_expired(state);
    let clock = state.clock;
    let base = state.reservations.get(name);
    match (update, base) {
        (false, Some(_)) => return Err(refused(name, "a reservation of this name exists already")),
        (true, None) => return Err(refused(name, "no such reservation")),
        (false, None) if state.reservations.len() >= MAX_RESERVATIONS => {
            return Err(refused(name, format!("the cluster has {MAX_RESERVATIONS} reservations, its most")))
        }
        _ => {}
    }
    let mut r = request.merge(base, clock).map_err(|reason| refused(name, reason))?;
    let pool: Vec<&String> = match &r.partition {
        Some(p) => match state.partitions.get(p) {
            Some(p) => p.node_names.iter().collect(),
            None => {
                return Err(Rejection::UnknownPartition {
                    name: p.clone(),
                    known: state.partitions.keys().cloned().collect::<Vec<_>>().join(", "),
                })
            }
        },
        None => state.nodes.keys().collect(),
    };
    if let Some(n) = r.nodes.iter().find(|n| !state.nodes.contains_key(*n)) {
        return Err(refused(name, format!("node '{n}' is not registered")));
    }
    // The reservations it may not share a node with at any moment of its windows: compared in
    // time once, then by node.
    let clashing: Vec<&Reservation> = state
        .reservations
        .values()
        .filter(|o| o.name != r.name && exclusive_of(o, &r) && r.times_overlap(o, clock))
        .collect();
    let first_start = r.next_window(clock).map_or(r.start_ms, |(s, _)| s);
    // The running jobs that would still hold a node when it starts, but its own.
    let busy = |node: &str| -> Option<(u64, Option<Millis>)> {
        let n = state.nodes.get(node)?;
        n.jobs.iter().filter_map(|id| state.jobs.get(id)).find_map(|j| {
            let mine = j.spec.reservation.as_deref() == Some(name);
            let end = planned_end(j);
            (!mine && end.is_none_or(|e| e > first_start)).then_some((j.id, end))
        })
    };
    if let Some(count) = request.node_count {
        // The nodes free over its windows, in name order: up, in no reservation it may not
        // overlap, and (unless it ignores jobs) with no job running into it.
        let mut chosen = Vec::new();
        for node in pool {
            if chosen.len() == count as usize {
                break;
            }
            let up = state.nodes.get(node).is_some_and(|n| n.schedulable());
            let free = !clashing.iter().any(|o| o.nodes.binary_search(node).is_ok());
            if up && free && (r.flags.ignore_jobs || busy(node).is_none()) {
                chosen.push(node.clone());
            }
        }
        if chosen.len() < count as usize {
            return Err(refused(
                name,
                format!("only {} of the {count} nodes asked for are free over its window", chosen.len()),
            ));
        }
        r.nodes = chosen;
    } else if r.nodes.is_empty() {
        return Err(refused(name, "a reservation needs Nodes= or NodeCnt="));
    }
    if let Some(o) = clashing.iter().find(|o| r.nodes.iter().any(|n| o.nodes.binary_search(n).is_ok())) {
        return Err(refused(name, format!("it overlaps reservation '{}' (only a MAINT one may overlap)", o.name)));
    }
    if !r.flags.ignore_jobs {
        for node in &r.nodes {
            if let Some((job, end)) = busy(node) {
                let until = match end {
                    Some(e) => format!("until {}s after it starts", e.saturating_sub(first_start).div_ceil(1000)),
                    None => "without a time limit".to_string(),
                };
                return Err(refused(
                    name,
                    format!(
                        "node '{node}' is busy: job {job} runs there {until}; Flags=IGNORE_JOBS reserves it anyway"
                    ),
                ));
            }
        }
    }
    // Jobs running in it now end where its window now ends (a FLEX one's run on).
    let window_end = r.next_window(clock).filter(|(s, _)| *s <= clock && !r.flags.flex).and_then(|(_, e)| e);
    let running: Vec<u64> = state
        .active
        .iter()
        .filter(|id| {
            state.jobs.get(*id).is_some_and(|j| j.state.is_allocated() && j.spec.reservation.as_deref() == Some(name))
        })
        .copied()
        .collect();
    for id in running {
        if let Some(j) = state.jobs.get_mut(&id) {
            j.resv_end = window_end;
        }
    }
    state.reservations.insert(r.name.clone(), r.clone());
    Ok(r)
}

/// `DeleteReservation`: refused while a job is in it, as Slurm's "in use".
pub fn delete(state: &mut ClusterState, name: &str, user: &str) -> Result<(), Rejection> {
    if user != "root" {
        return Err(Rejection::OperatorOnly { what: format!("delete a reservation ({name})") });
    }
    purge_expired(state);
    if !state.reservations.contains_key(name) {
        return Err(refused(name, "no such reservation"));
    }
    let user_of = state.active.iter().filter_map(|id| state.jobs.get(id)).find(|j| {
        j.spec.reservation.as_deref() == Some(name) && (j.state == JobState::Pending || j.state.is_allocated())
    });
    if let Some(j) = user_of {
        return Err(refused(name, format!("it is in use by job {} ({})", j.id, j.state.name())));
    }
    state.reservations.remove(name);
    Ok(())
}

/// At submit (and update): the reservation a job asks for exists, lets its user or account in,
/// and has enough of the job's partition's nodes.
pub fn admit(state: &ClusterState, spec: &JobSpec, user: &str, account: &str) -> Result<(), Rejection> {
    let Some(name) = &spec.reservation else { return Ok(()) };
    let r = state
        .reservations
        .get(name)
        .filter(|r| !r.expired(state.clock))
        .ok_or_else(|| refused(name, "no such reservation (scontrol show reservation lists them)"))?;
    if !r.allows(user, account) {
        return Err(refused(name, format!("access denied: neither user '{user}' nor account '{account}' may use it")));
    }
    let partition = spec.partition.as_deref().and_then(|p| state.partitions.get(p));
    // A FLEX reservation's jobs may use the partition's other nodes too.
    let inside = match partition {
        Some(p) if r.flags.flex => p.node_names.len(),
        Some(p) => r.nodes.iter().filter(|n| p.node_names.contains(*n)).count(),
        None => 0,
    };
    if inside < spec.nodes as usize {
        return Err(Rejection::NeverFits {
            detail: format!(
                "reservation '{name}' has {inside} node(s) in partition '{}', the job asks for {}",
                spec.partition.as_deref().unwrap_or(""),
                spec.nodes
            ),
        });
    }
    Ok(())
}

/// At start: a job in a reservation starts on its nodes while it is in force (in a FLEX one,
/// also before it and on other nodes); no job starts on a node of a reservation in force that
/// it is not in (a maintenance one keeps every other out). Returns where the job must stop: the
/// end of its reservation's window (none for a FLEX one).
pub fn check_start(state: &ClusterState, job: &Job, allocation: &Allocation) -> Result<Option<Millis>, DropReason> {
    let clock = state.clock;
    let drop = |reason: String| DropReason::Reservation { job: job.id, reason };
    let mine = match &job.spec.reservation {
        Some(name) => {
            let r = state.reservations.get(name).filter(|r| !r.expired(clock));
            let r = r.ok_or_else(|| drop(format!("reservation '{name}' no longer exists")))?;
            if !r.active(clock) && !r.flags.flex {
                return Err(drop(format!("reservation '{name}' is not in force")));
            }
            let outside = allocation.nodes.iter().find(|a| r.nodes.binary_search(&a.node).is_err());
            if let Some(a) = outside.filter(|_| !r.flags.flex) {
                return Err(drop(format!("node {} is not in reservation '{name}'", a.node)));
            }
            Some(r)
        }
        None => None,
    };
    for r in state.reservations.values().filter(|r| r.active(clock)) {
        let own = mine.is_some_and(|m| m.name == r.name);
        // A maintenance reservation keeps the jobs of another out; the other keeps no job of
        // the maintenance one out.
        let in_maint = mine.is_some_and(|m| m.flags.maint);
        let keeps_out = !own && (r.flags.maint || !in_maint);
        if keeps_out {
            if let Some(a) = allocation.nodes.iter().find(|a| r.nodes.binary_search(&a.node).is_ok()) {
                return Err(drop(format!("node {} is in reservation '{}'", a.node, r.name)));
            }
        }
    }
    Ok(mine.filter(|m| !m.flags.flex).and_then(|m| m.next_window(clock)).and_then(|(_, e)| e))
}
