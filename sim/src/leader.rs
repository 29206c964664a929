//! What a replica does while it leads, as the controller's leader loops do, on the real pure
//! parts: the scheduler (`quorum_sched::schedule`, the plan proposed as one `ApplyPlan`), the
//! leader's rules for agents' registrations and exit reports (`quorum_control::leader::rules`),
//! node liveness (DOWN after the node timeout, a new leader giving every node a full timeout of
//! grace, judged by the agent hub's record of heartbeats), the controller's own agent hub
//! deciding what each node is sent ([`crate::session`]), and the answers to clients and agents.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::ServerState;
use quorum_jepsen::choice::{Mix, SCAVENGER, STANDBY};
use quorum_jepsen::history::{Outcome, Seen};
use quorum_model::preempt::{PreemptMode, PreemptType};
use quorum_model::{Job, JobSpec, JobState, NodeAdminState, RankOutcome, Rejection};
use quorum_state::{Command, ReplicaVersion, Response};
use tokio::sync::watch;

use crate::disk::read;
use crate::world::{Bug, Replica, World};

/// A node silent this long is DOWN.
pub const NODE_TIMEOUT: Duration = Duration::from_secs(5);
/// The lease a leader gives with each answered heartbeat: shorter than the node timeout, so a
/// node cut off has stopped its `--requeue` jobs before they are requeued.
pub const LEASE: Duration = Duration::from_secs(3);

/// What a leader keeps in memory only, beside its agent hub (which it empties when it stops
/// leading).
pub struct Lead {
    pub term: u64,
    /// When it began leading: a node not heard from since has a full timeout from then.
    since: std::time::Instant,
}

fn lead(r: &Replica) -> std::sync::MutexGuard<'_, Option<Lead>> {
    r.lead.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `r` leads (as far as it knows).
pub fn leads(r: &Replica) -> bool {
    let m = r.raft.metrics().borrow().clone();
    m.state == ServerState::Leader && m.current_leader == Some(r.id) && m.running_state.is_ok()
}

/// The replica `r` believes leads.
pub fn leader_hint(r: &Replica) -> Option<u64> {
    r.raft.metrics().borrow().current_leader
}

pub async fn write(r: &Replica, command: Command) -> Result<(u64, Response), WriteError> {
    // As the controller's `Replica::write`, by its own function: a write is given up once this
    // replica no longer leads the term it proposed in (openraft never answers one whose entry a
    // snapshot replaced).
    let term = r.raft.metrics().borrow().current_term;
    let written = tokio::select! {
        biased;
        written = r.raft.client_write(command) => written,
        () = quorum_control::replica::deposed(&r.raft, r.id, term) => {
            return Err(WriteError::Other(quorum_control::replica::DEPOSED.into()))
        }
    };
    match written {
        Ok(w) => Ok((w.log_id.index, w.data)),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(WriteError::NotLeader(f.leader_id)),
        Err(e) => Err(WriteError::Other(e.to_string())),
    }
}

#[derive(Debug)]
pub enum WriteError {
    NotLeader(Option<u64>),
    Other(String),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::NotLeader(l) => write!(f, "not the leader (leader: {l:?})"),
            WriteError::Other(e) => f.write_str(e),
        }
    }
}

/// The partitions of the agents' nodes (the state's own test builder: a day's time limit, 1 GiB
/// per CPU): the default one, and with the whole workload the scavenger and standby partitions of
/// a lower tier, whose jobs the default one's preempt and requeue or suspend (as `jepsen/`
/// configures its controllers).
pub fn partitions(world: &World) -> Vec<quorum_model::Partition> {
    let nodes = format!("a[1-{}]", world.opts.agents);
    let mut default = quorum_state::testing::partition("jepsen", &nodes, true);
    if world.opts.workload < Mix::Full {
        return vec![default];
    }
    default.priority_tier = 1;
    let mut scavenger = quorum_state::testing::partition(SCAVENGER, &nodes, false);
    scavenger.preempt_mode = Some(PreemptMode::Requeue);
    let mut standby = quorum_state::testing::partition(STANDBY, &nodes, false);
    standby.preempt_mode = Some(PreemptMode::Suspend);
    vec![default, scavenger, standby]
}

/// The leader loops of one incarnation, until it stops.
pub async fn duties(world: Arc<World>, r: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            _ = r.kick.notified() => tokio::time::sleep(Duration::from_millis(20)).await,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        if *stop.borrow() {
            return;
        }
        let m = r.raft.metrics().borrow().clone();
        if let Err(e) = &m.running_state {
            // A fatal error (the disk failed): the controller exits, and is restarted when the
            // fault heals.
            world.trace(format!("r{} stopped: {e}", r.id));
            if world.replica(r.id).is_some_and(|live| Arc::ptr_eq(&live, &r)) {
                world.crash_now(r.id, "on a fatal error");
            }
            return;
        }
        if !leads(&r) {
            // No longer leading: every agent's session ends, as the controller's do.
            if lead(&r).take().is_some() {
                crate::session::close_all(&world, &r);
            }
            continue;
        }
        let fresh = lead(&r).as_ref().is_none_or(|l| l.term != m.current_term);
        if fresh {
            if lead(&r).take().is_some() {
                crate::session::close_all(&world, &r);
            }
            *lead(&r) = Some(Lead { term: m.current_term, since: quorum_control::clock::monotonic() });
            world.trace(format!("r{} leads term {}", r.id, m.current_term));
        }
        if let Err(e) = cycle(&world, &r).await {
            world.trace(format!("r{} cycle: {e}", r.id));
        }
    }
}

async fn cycle(world: &Arc<World>, r: &Arc<Replica>) -> Result<(), WriteError> {
    let now = world.wall_ms(r.id);
    // What every leader makes sure of first: the replicas' versions, and the partition.
    let (versions_known, partitioned, preempting) = {
        let a = read(&r.applied);
        let preempting = world.opts.workload < Mix::Full || !a.state.policy.preempt_type.is_off();
        (a.state.replica_versions.len() == world.opts.replicas, !a.state.partitions.is_empty(), preempting)
    };
    if !versions_known {
        let versions = world
            .replica_ids()
            .into_iter()
            .map(|id| (id, ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "sim".into() }))
            .collect();
        write(r, Command::SetReplicaVersions { versions, now }).await?;
    }
    if !partitioned {
        write(r, Command::SetPartitions { partitions: partitions(world), now }).await?;
    }
    if !preempting {
        let mut policy = read(&r.applied).state.policy.clone();
        policy.preempt_type = PreemptType::PartitionPrio;
        write(r, Command::SetPolicy { policy, now }).await?;
    }

    // Liveness: a node not heard from for the node timeout is DOWN; as the controller's
    // liveness loop, judged and marked in one step, no lease for it until the write is over.
    let Some(since) = lead(r).as_ref().map(|l| l.since) else { return Ok(()) };
    let silent: Vec<String> = {
        let a = read(&r.applied);
        let now = quorum_control::clock::monotonic();
        a.state
            .nodes
            .iter()
            .filter(|(_, n)| !matches!(n.admin, NodeAdminState::Down { .. }))
            .filter(|(name, _)| r.hub.silence(name, since, now) >= NODE_TIMEOUT)
            .map(|(name, _)| name.clone())
            .collect()
    };
    for node in silent {
        if r.hub.begin_down(&node, since, NODE_TIMEOUT).is_none() {
            continue;
        }
        world.trace(format!("r{} declares {node} down", r.id));
        let written = write(r, Command::NodeDown { node: node.clone(), reason: "not responding".into(), now }).await;
        r.hub.down_ended(&node);
        written?;
    }

    // The jobs held back from a node's replaced session that its new session has not reported
    // within a lease: ended as lost contact, as the controller's liveness loop ends them (the
    // hub's set has no order of the seed's: sorted).
    let mut overdue = r.hub.overdue_held(&read(&r.applied).state);
    overdue.sort();
    for (node, job_id, token) in overdue {
        let outcome = RankOutcome::LostContact;
        let (_, response) = write(r, Command::JobEnded { job_id, token, node: node.clone(), outcome, now }).await?;
        world.trace(format!(
            "r{} ends {job_id}.{token} held from {node}'s replaced session: {}",
            r.id,
            kind(&response)
        ));
    }

    // Steps whose `srun` went with a previous leader: ended after a grace, their tasks killed,
    // as the controller's liveness loop ends them.
    crate::steps::end_orphans(world, r).await?;

    // Recurring jobs: each firing due, as the controller's cron loop proposes it (apply fires
    // an entry only at the firing it waits for).
    let due = quorum_control::leader::cron::due(&read(&r.applied).state, now);
    for command in due {
        let (_, response) = write(r, command).await?;
        let what = match response {
            Response::CronFired { id, job: Some(job), .. } => format!("entry {id} submitted job {job}"),
            other => kind(&other),
        };
        world.trace(format!("r{} fires cron: {what}", r.id));
    }

    // A scheduling cycle.
    let (view, base, policy) = {
        let a = read(&r.applied);
        let mut view = quorum_sched::ClusterView::from_state(&a.state);
        if world.bug(Bug::NoThrottle) {
            unthrottled(&mut view, &a.state);
        }
        if world.bug(Bug::NoReservations) {
            view.reservations.clear();
        }
        (view, a.index(), a.state.policy.clone())
    };
    let plan = quorum_sched::schedule(&view, now, &policy);
    let reasons = plan.reasons_to_write();
    if let Some(command) = Command::apply_plan(base, now, plan.starts, reasons, plan.preemptions, plan.resumes) {
        if let (_, Response::PlanApplied { started, preempted, .. }) = write(r, command).await? {
            if !preempted.is_empty() {
                world.trace(format!("r{} preempts {preempted:?}", r.id));
                if world.bug(Bug::PreemptNoWait) {
                    end_at_once(world, r, &preempted).await?;
                }
            }
            if !started.is_empty() {
                world.trace(format!("r{} started {started:?}", r.id));
                if r.fuse.blow(crate::world::Point::Launch) {
                    return Ok(());
                }
            }
        }
    }

    dispatch(world, r);
    Ok(())
}

/// The broken build's view: of each throttled array, as many pending tasks may start as its
/// throttle, however many run.
fn unthrottled(view: &mut quorum_sched::ClusterView, state: &quorum_state::ClusterState) {
    let mut room: BTreeMap<u64, u32> = BTreeMap::new();
    for p in view.pending.iter_mut() {
        let Some(a) = state.jobs.get(&p.id).and_then(|j| j.array).filter(|a| a.throttle > 0) else { continue };
        let left = room.entry(a.array_job_id).or_insert(a.throttle);
        if *left > 0 && p.dependency == quorum_sched::view::DepStatus::ArrayThrottled {
            Arc::make_mut(p).dependency = quorum_sched::view::DepStatus::Satisfied;
        }
        *left = left.saturating_sub(1);
    }
}

/// The broken build: each preempted job's end on each of its nodes, committed now, as its
/// agents would report it once they had stopped it.
async fn end_at_once(world: &World, r: &Replica, preempted: &[(u64, u64)]) -> Result<(), WriteError> {
    let now = world.wall_ms(r.id);
    let ends: Vec<Command> = {
        let a = read(&r.applied);
        preempted
            .iter()
            .filter_map(|(victim, _)| a.state.jobs.get(victim))
            .flat_map(|j| {
                let nodes = j.allocation.iter().flat_map(|al| al.nodes.iter().map(|n| n.node.clone()));
                let state = &a.state;
                nodes
                    .map(|node| {
                        let outcome = RankOutcome::Cancelled { code: 0, signal: 15 };
                        quorum_control::leader::rules::job_ended(
                            state,
                            j.id,
                            j.alloc_index,
                            node,
                            outcome,
                            None,
                            "",
                            now,
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    for command in ends {
        write(r, command).await?;
    }
    Ok(())
}

/// What each connected node lacks to match the state, sent by the controller's agent hub (as
/// its dispatch loop does after every applied change).
fn dispatch(world: &Arc<World>, r: &Arc<Replica>) {
    r.hub.reconcile(&read(&r.applied).state, None);
    crate::session::pump(world, r);
}

/// An agent's report that a run ended: committed as the leader's rules say.
pub async fn exit(world: &World, r: &Replica, job: u64, token: u64, node: &str, outcome: RankOutcome) -> bool {
    if !leads(r) {
        return false;
    }
    let now = world.wall_ms(r.id);
    let command = {
        let a = read(&r.applied);
        // The broken build: the report ends whatever allocation the job now has, wherever it is.
        let current = a.state.jobs.get(&job).filter(|_| world.bug(Bug::NoFence));
        let (token, node) = match current.and_then(|j| Some((j.alloc_index, j.allocation.as_ref()?.nodes.first()?))) {
            Some((token, first)) => (token, first.node.clone()),
            None => (token, node.to_string()),
        };
        quorum_control::leader::rules::job_ended(&a.state, job, token, node, outcome, None, "", now)
    };
    match write(r, command).await {
        Ok((_, response)) => {
            world.trace(format!("r{} exit of {job}.{token} on {node}: {}", r.id, kind(&response)));
            true
        }
        Err(_) => false,
    }
}

fn kind(response: &Response) -> String {
    match response {
        Response::JobFinished { state, .. } => state.name().to_string(),
        Response::Batch(all) => all.iter().map(kind).collect::<Vec<_>>().join(","),
        other => format!("{other:?}").chars().take(40).collect(),
    }
}

/// A client's request, as a replica receives it.
#[derive(Clone, Debug)]
pub enum Request {
    Submit {
        spec: Box<JobSpec>,
        request_id: String,
    },
    Hold {
        job: u64,
    },
    Release {
        job: u64,
    },
    Cancel {
        job: u64,
    },
    Read {
        job: u64,
    },
    /// An operator's new advance reservation.
    Reserve {
        request: Box<quorum_model::reservation::ResvRequest>,
    },
    /// An operator's new recurring job.
    AddCron {
        entry: Box<quorum_model::cron::CronEntry>,
    },
    /// An operator removes a recurring job.
    RemoveCron {
        id: u64,
    },
}

pub fn seen(job: &Job) -> Seen {
    Seen {
        name: job.spec.name.clone(),
        state: job.state.name().to_string(),
        held: job.held.is_some(),
        cancelled: job.state == JobState::Cancelled || job.cancel_requested || job.cancelled_by.is_some(),
        task: job.array.as_ref().map(|a| a.task_id),
    }
}

fn refused(rejection: &Rejection) -> Outcome {
    match rejection {
        Rejection::UnknownJob { .. } => Outcome::Missing,
        other => Outcome::Refused { reason: other.to_string() },
    }
}

fn unknown(e: WriteError) -> Outcome {
    Outcome::Unknown { error: e.to_string() }
}

/// Serves a client's request at the leader `r` (which may crash between committing a change and
/// answering: the [`crate::world::Point::Reply`] crash point).
pub async fn serve(world: &World, r: &Replica, request: Request) -> Outcome {
    let changes = !matches!(request, Request::Read { .. });
    let outcome = answer(world, r, request).await;
    if changes && r.fuse.blow(crate::world::Point::Reply) {
        return futures::future::pending().await;
    }
    outcome
}

async fn answer(world: &World, r: &Replica, request: Request) -> Outcome {
    let now = world.wall_ms(r.id);
    let user = "alice".to_string();
    match request {
        Request::Submit { spec, request_id } => {
            let command = Command::SubmitJob { spec, user, now, request_id };
            if world.bug(Bug::EarlyAck) {
                // The broken build: the id the entry is expected to get, before it commits.
                let expected = read(&r.applied).state.next_job_id;
                let raft = r.raft.clone();
                tokio::spawn(async move {
                    let _ = raft.client_write(command).await;
                });
                return Outcome::Submitted { job: expected };
            }
            match write(r, command).await {
                Ok((_, Response::Submitted { job_id, .. })) => Outcome::Submitted { job: job_id },
                Ok((_, Response::Rejected(why))) => Outcome::Failed { error: why.to_string() },
                Ok((_, other)) => Outcome::Unknown { error: format!("{other:?}") },
                Err(e) => unknown(e),
            }
        }
        Request::Hold { job } | Request::Release { job } => {
            let hold = matches!(request, Request::Hold { .. });
            let command = match hold {
                true => Command::HoldJob { job_id: job, user, now },
                false => Command::ReleaseJob { job_id: job, user, now },
            };
            match write(r, command).await {
                Ok((_, Response::Held { .. } | Response::Released { .. })) => Outcome::Done,
                Ok((_, Response::Rejected(why))) => refused(&why),
                Ok((_, other)) => Outcome::Refused { reason: format!("{other:?}") },
                Err(e) => unknown(e),
            }
        }
        Request::Cancel { job } => {
            match write(r, Command::CancelJob { job_id: job, user, now, whole_array: false }).await {
                Ok((_, Response::Cancelled { was_running, .. })) => Outcome::Cancelled { was_running },
                Ok((_, Response::Rejected(why))) => refused(&why),
                Ok((_, other)) => Outcome::Refused { reason: format!("{other:?}") },
                Err(e) => unknown(e),
            }
        }
        Request::Reserve { request } => {
            match write(r, Command::CreateReservation { request: *request, user: "root".into(), now }).await {
                Ok((_, Response::Rejected(why))) => Outcome::Refused { reason: why.to_string() },
                Ok(_) => Outcome::Done,
                Err(e) => unknown(e),
            }
        }
        Request::AddCron { mut entry } => {
            entry.added_ms = now;
            match write(r, Command::AddCron { entry, now }).await {
                Ok((_, Response::CronAdded { .. })) => Outcome::Done,
                Ok((_, Response::Rejected(why))) => Outcome::Refused { reason: why.to_string() },
                Ok((_, other)) => Outcome::Refused { reason: format!("{other:?}") },
                Err(e) => unknown(e),
            }
        }
        Request::RemoveCron { id } => match write(r, Command::RemoveCron { id, user: "root".into(), now }).await {
            Ok((_, Response::Rejected(why))) => refused(&why),
            Ok(_) => Outcome::Done,
            Err(e) => unknown(e),
        },
        Request::Read { job } => {
            if world.bug(Bug::RestoredRead) {
                if let Err(e) = r.raft.ensure_linearizable().await {
                    return Outcome::Unknown { error: e.to_string() };
                }
            } else if !world.bug(Bug::StaleReads) {
                if let Err(e) = quorum_control::replica::linearizable_read(&r.raft).await {
                    return Outcome::Unknown { error: e.to_string() };
                }
            }
            read_local(world, r, job)
        }
    }
}

/// A read from what `r` has applied, and of a job that left the state, from its history (as
/// `quorum show` reads it); one its history cannot say (still being copied) is not answered.
pub fn read_local(world: &World, r: &Replica, job: u64) -> Outcome {
    if let Some(j) = read(&r.applied).state.jobs.get(&job) {
        return Outcome::Read { job: seen(j) };
    }
    match crate::history::job(world, r.id, job) {
        Some(Some(j)) => Outcome::Read { job: seen(&j) },
        Some(None) => Outcome::Missing,
        None => Outcome::Unknown { error: format!("r{}'s job history is still being copied", r.id) },
    }
}
