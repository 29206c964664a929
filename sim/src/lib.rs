//! `quorum-sim`: a deterministic simulation of Quorum's control plane.
//!
//! Three (or five) replicas run real openraft over the controller's real entries: each applies
//! them with `quorum_state::apply` and snapshots with its real encoding; the leader schedules
//! with `quorum_sched::schedule` and answers agents by `quorum_control::leader::rules`. Agents,
//! their jobs, the network, the disks and the clocks are simulated. Everything runs on one
//! thread of a tokio runtime whose time is virtual (it jumps to the next timer whenever every
//! task waits), and every choice — faults, delays, losses, operations, openraft's election
//! timeouts — comes from the seed: the same seed runs the same run, and prints the same trace,
//! byte for byte. The history is `jepsen/`'s, judged by `jepsen/`'s checkers.
//!
//! See `jepsen/README.md` ("The simulator") for what is real and what is simulated.

pub mod agent;
pub mod client;
pub mod disk;
pub mod history;
pub mod leader;
pub mod nemesis;
pub mod net;
pub mod runtime;
pub mod session;
pub mod steps;
pub mod world;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorum_jepsen::checker::cron::Cron;
use quorum_jepsen::checker::ended::Placed;
use quorum_jepsen::checker::resv::Resv;
use quorum_jepsen::checker::{self, terminal, Evidence, Final};
pub use quorum_jepsen::choice::Mix;
use quorum_jepsen::history::{Event, Op, Outcome};
use quorum_jepsen::rng::Rng;
use quorum_model::cron::{CronEntry, Schedule, Zone};
use quorum_model::reservation::{ResvEnd, ResvRequest};
use quorum_model::JobState;
use quorum_state::{Command, Response};

use crate::disk::read;
use crate::leader::Request;
pub use crate::nemesis::Fault;
pub use crate::world::Bug;
use crate::world::World;

#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    /// Simulated seconds of clients and faults.
    pub time_s: f64,
    pub replicas: usize,
    pub agents: usize,
    pub clients: usize,
    pub faults: Vec<Fault>,
    pub bug: Option<Bug>,
    /// Chance that a message is lost, and that a Raft message arrives twice.
    pub loss: f64,
    pub duplicate: f64,
    pub snapshot_every: u64,
    /// A run whose clients had fewer operations answered than this per simulated second checks
    /// too little: it fails.
    pub min_ops_per_s: f64,
    /// Which workload the clients run: by default every feature it has; an earlier one replays
    /// the seeds found on it.
    pub workload: Mix,
    /// Whether ended jobs leave the queue for the job history [`history::MIN_JOB_AGE`] after
    /// they end (the default, with the whole workload); without, the seeds found before the
    /// simulator had the history replay as they ran. The earlier workloads never do.
    pub history: bool,
    /// Whether a job of steps runs them (`srun`, [`steps`]; the default, with the whole
    /// workload); without, it runs as one job as long as its steps, and the seeds found before
    /// the simulator had steps replay as they ran.
    pub steps: bool,
    /// Prints the trace as it goes.
    pub verbose: bool,
}

impl Options {
    /// Whether this run keeps a job history (see [`Options::history`]).
    pub fn keeps_history(&self) -> bool {
        self.history && self.workload >= Mix::Full
    }

    /// Whether this run's jobs of steps run them (see [`Options::steps`]).
    pub fn runs_steps(&self) -> bool {
        self.steps && self.workload >= Mix::Full
    }

    pub fn new(seed: u64) -> Options {
        Options {
            seed,
            time_s: 20.0,
            replicas: 3,
            agents: 3,
            clients: 5,
            faults: Fault::ALL.to_vec(),
            bug: None,
            loss: 0.01,
            duplicate: 0.02,
            snapshot_every: 200,
            min_ops_per_s: 2.0,
            workload: Mix::Full,
            history: true,
            steps: true,
            verbose: false,
        }
    }
}

/// What one run found.
pub struct Report {
    pub seed: u64,
    pub problems: Vec<String>,
    /// FNV-1a of the trace: equal for two runs of one seed.
    pub trace_digest: u64,
    pub trace: Vec<String>,
    pub ops: usize,
    pub ok: usize,
    pub unknown: usize,
    pub jobs: usize,
    pub simulated: Duration,
}

impl Report {
    pub fn valid(&self) -> bool {
        self.problems.is_empty()
    }

    /// One line: the seed, the verdict and the trace's digest.
    pub fn line(&self) -> String {
        let verdict = if self.valid() { "VALID".to_string() } else { format!("INVALID ({})", self.problems.len()) };
        format!(
            "seed {} {verdict} trace {:016x} ops {} ok {} unknown {} jobs {} simulated {:.1} s",
            self.seed,
            self.trace_digest,
            self.ops,
            self.ok,
            self.unknown,
            self.jobs,
            self.simulated.as_secs_f64()
        )
    }
}

fn fnv1a(lines: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for line in lines {
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Runs one seed to its verdict.
pub fn run(opts: Options) -> anyhow::Result<Report> {
    runtime::seed(opts.seed);
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build()?;
    let report = rt.block_on(simulate(opts));
    rt.shutdown_background();
    report
}

async fn simulate(opts: Options) -> anyhow::Result<Report> {
    let world = World::new(opts.clone());
    let root = Rng::new(opts.seed);
    for id in world.replica_ids() {
        world.start_replica(id, true).await?;
    }
    for agent in world.agents.values() {
        agent::start(&world, agent.clone());
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let pool = Arc::new(Mutex::new(quorum_jepsen::choice::Pool::default()));
    let made = match opts.workload >= Mix::Full {
        true => operate(&world, &pool).await,
        false => None,
    };
    let workers: Vec<_> = (0..opts.clients)
        .map(|w| {
            tokio::spawn(client::worker(world.clone(), w, root.fork(1000 + w as u64), pool.clone(), stopped.clone()))
        })
        .collect();
    let mut nemesis_rng = root.fork(3);
    let steps = nemesis::schedule(&mut nemesis_rng, &opts.faults, opts.time_s);
    let faults = tokio::spawn(nemesis::run(world.clone(), steps, nemesis_rng, opts.time_s));

    tokio::time::sleep(Duration::from_secs_f64(opts.time_s)).await;
    let _ = stop.send(true);
    for w in workers {
        let _ = w.await;
    }
    faults.abort();
    let _ = faults.await;

    let what = nemesis::heal(&world).await;
    world.nemesis(format!("final {what}"));

    let mut problems = Vec::new();
    let cron_removed = opts.workload >= Mix::Full && remove_cron(&world).await;
    let mut finals = settle(&world, &mut problems).await;
    // The history: jobs that left the queue, judged with those still in it; every replica's the
    // same.
    if opts.keeps_history() {
        let archived = history::judged(&world).await;
        world.trace(format!(
            "{} jobs in the history; records per replica {:?}",
            archived.jobs.len(),
            history::counts(&world)
        ));
        problems.extend(archived.problems);
        finals.extend(archived.jobs.into_iter().map(|f| (f.id, f)));
    }
    // Every probe was submitted after the removal was done: none of the entry's jobs comes after
    // the first.
    let first_probe = finals.values().filter(|f| f.name.starts_with("probe-")).map(|f| f.id).min();
    let cron = Cron { name: CRON.into(), period_s: CRON_EVERY_S, removed_before: first_probe.filter(|_| cron_removed) };
    let mut reservations = placements(&world, &mut finals);
    // An expired reservation leaves the state (with the first purge after it): it is judged as
    // the cluster had it when it was made.
    if let Some(made) = made.filter(|m| !reservations.iter().any(|r| r.name == m.name)) {
        reservations.push(made);
    }

    // Every replica's digest at one index.
    digests(&world, &mut problems).await;

    // Nothing the cluster says has ended still runs.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let finished = world.now_s() - 6.0;
    let runs: Vec<_> = world.agents.values().flat_map(|a| a.runs()).collect();
    for r in runs.iter().filter(|r| !r.ended) {
        problems.push(format!(
            "runs: job {} still ran on {} (allocation {}) 6 s after the cluster said every job had ended at {finished:.2}",
            r.job, r.node, r.file
        ));
    }
    // Every job the cluster says COMPLETED ran its last attempt to its end somewhere (not an
    // earlier attempt's end taken for the last one's).
    let finished: std::collections::BTreeSet<(u64, u32)> = world.agents.values().flat_map(|a| a.finished()).collect();
    let mut attempts: BTreeMap<u64, u32> = world
        .leader()
        .map(|l| read(&l.applied).state.jobs.values().map(|j| (j.id, j.requeues)).collect())
        .unwrap_or_default();
    // Those of jobs in the history, as it keeps them (some left the queue since it was read).
    if opts.keeps_history() {
        for (id, requeues) in history::requeues(&world) {
            attempts.entry(id).or_insert(requeues);
        }
    }
    for f in finals.values().filter(|f| f.state == JobState::Completed.name()) {
        let last = attempts.get(&f.id).copied().unwrap_or(0);
        if !finished.contains(&(f.id, last)) {
            problems.push(format!(
                "outcome: job {} ({}) is COMPLETED, but its last attempt (restart {last}) did not run to its end",
                f.id, f.name
            ));
        }
    }

    let events = world.events();
    let registers = pool.lock().unwrap_or_else(|p| p.into_inner()).registers();
    problems.extend(checker::check(&Evidence {
        events: &events,
        finals: &finals,
        runs: &runs,
        registers: &registers,
        node_cpus: agent::CPUS,
        reservations: &reservations,
        cron: (opts.workload >= Mix::Full).then_some(&cron),
    }));
    let (mut ops, mut ok, mut unknown) = (0, 0, 0);
    for e in &events {
        if let Event::Complete { outcome, .. } = e {
            ops += 1;
            match outcome {
                Outcome::Unknown { .. } => unknown += 1,
                Outcome::Failed { .. } => {}
                _ => ok += 1,
            }
        }
    }
    let min_ops = (opts.min_ops_per_s * opts.time_s) as usize;
    if ok < min_ops {
        problems.push(format!("workload: only {ok} operations were answered (at least {min_ops} expected)"));
    }
    for r in world.alive() {
        let _ = r.stop.send(true);
        let _ = r.raft.shutdown().await;
    }
    let trace = world.trace_lines();
    Ok(Report {
        seed: opts.seed,
        problems,
        trace_digest: fnv1a(&trace),
        trace,
        ops,
        ok,
        unknown,
        jobs: finals.len(),
        simulated: world.start.elapsed(),
    })
}

fn finals_of(jobs: &BTreeMap<u64, quorum_jepsen::history::Seen>) -> BTreeMap<u64, Final> {
    jobs.iter()
        .map(|(id, s)| {
            (
                *id,
                Final {
                    id: *id,
                    name: s.name.clone(),
                    state: s.state.clone(),
                    cancelled: s.cancelled,
                    task: s.task,
                    placed: None,
                    // (The simulator judges this itself: its runs end when killed, too.)
                    restarts: None,
                },
            )
        })
        .collect()
}

const RECOVERY_BOUND: Duration = Duration::from_secs(30);
const SETTLE_BOUND: Duration = Duration::from_secs(60);
/// ... and a second more for each job open when the clients stopped, past 60 of them: the harness
/// cancels them one at a time, and a cancel whose request or answer is lost (1% of messages, four
/// hops through a follower) costs it 4 s (seed 82135: 171 jobs open, 15 cancels unanswered).
const SETTLE_PER_JOB: Duration = Duration::from_secs(1);

/// The harness's probe: a short job named `name`, submitted by `process` through replica 1
/// (its name is its request id), recorded as any operation is.
async fn submit_probe(world: &Arc<World>, process: u64, name: String) -> Outcome {
    let spec = client::spec(&name, 0.5, false, false, 0);
    let op = Op::probe(name.clone());
    world.invoke(process, op.clone());
    let outcome = client::perform(world, PROBE_HOST, 1, &op, Some(spec), name).await;
    world.complete(process, outcome.clone());
    outcome
}

/// Where the harness's own requests come from.
const PROBE_HOST: net::Host = net::CLIENT_BASE + 99;
/// Where the operator's come from.
const OPERATOR_HOST: net::Host = net::CLIENT_BASE + 98;
/// The operator's advance reservation.
const RESV: &str = "resv";

/// The operator, before the clients begin: an advance reservation of one node for the clients'
/// user, its window from 4 s to 12 s after it is asked for (by replica 1's clock, which the
/// operator's is), asked for until it is made (a leader, and the nodes registered) or 10 s
/// passed; the clients then submit some jobs into it.
async fn operate(world: &Arc<World>, pool: &Mutex<quorum_jepsen::choice::Pool>) -> Option<Resv> {
    let began = tokio::time::Instant::now();
    loop {
        if began.elapsed() > Duration::from_secs(10) {
            world.trace("operator: no reservation");
            return None;
        }
        let request = ResvRequest {
            name: RESV.into(),
            start_ms: Some(world.wall_ms(1) + 4000),
            end: Some(ResvEnd::After(8)),
            node_count: Some(1),
            users: Some(vec!["alice".into()]),
            ..Default::default()
        };
        let outcome = client::reserve(world, OPERATOR_HOST, 1, request).await;
        world.trace(format!("operator reserves: {outcome:?}"));
        match outcome {
            Some(Outcome::Done) => break,
            // Made by an attempt whose answer was lost.
            Some(Outcome::Refused { reason }) if reason.contains("exists already") => break,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    pool.lock().unwrap_or_else(|p| p.into_inner()).reservation = Some(RESV.into());
    // As the cluster has it (the leader answered once it applied it).
    let made = world.leader().and_then(|l| {
        let a = read(&l.applied);
        let r = a.state.reservations.values().find(|r| r.name == RESV)?;
        let end_ms = r.end_ms.unwrap_or(u64::MAX);
        Some(Resv { name: r.name.clone(), nodes: r.nodes.clone(), start_ms: r.start_ms, end_ms })
    });
    add_cron(world).await;
    made
}

/// The name of the operator's recurring job.
const CRON: &str = "cron";

/// The operator's recurring job: a job of 0.2 s every two seconds (`*/2 * * * * *`, UTC), for
/// the clients' user, asked for until the cluster has it (the operator looks, as `quorum cron
/// list` would, before asking again) or 10 s passed.
async fn add_cron(world: &Arc<World>) {
    let schedule = format!("*/{} * * * * *", CRON_EVERY_S);
    let began = tokio::time::Instant::now();
    while began.elapsed() < Duration::from_secs(10) {
        if !cron_ids(world).is_empty() {
            return;
        }
        let now = world.wall_ms(1);
        let Ok(parsed) = Schedule::parse(&schedule) else { return };
        let entry = CronEntry {
            id: 0,
            user: "alice".into(),
            schedule: schedule.clone(),
            zone: "UTC".into(),
            spec: client::spec(CRON, 0.2, false, false, 0),
            next_ms: parsed.next_after(now, Zone::Utc).unwrap_or(u64::MAX),
            added_ms: now,
            fired: 0,
            last_fired_ms: None,
            last_job: None,
            last_error: None,
        };
        let outcome = client::operator(world, OPERATOR_HOST, 1, Request::AddCron { entry: Box::new(entry) }).await;
        world.trace(format!("operator adds a cron entry: {outcome:?}"));
        if outcome.is_none() {
            continue;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    world.trace("operator: no cron entry");
}

/// The recurring job fires every this many seconds.
const CRON_EVERY_S: u64 = 2;

/// The cron entries the cluster has (as its leader knows them).
fn cron_ids(world: &World) -> Vec<u64> {
    world.leader().map(|l| read(&l.applied).state.cron.keys().copied().collect()).unwrap_or_default()
}

/// The operator removes every cron entry once the faults heal, until none is left or the
/// recovery bound passed; whether it was done.
async fn remove_cron(world: &Arc<World>) -> bool {
    let began = tokio::time::Instant::now();
    while began.elapsed() < RECOVERY_BOUND {
        let ids = cron_ids(world);
        if ids.is_empty() && world.leader().is_some() {
            return true;
        }
        for id in ids {
            let outcome = client::operator(world, OPERATOR_HOST, 1, Request::RemoveCron { id }).await;
            world.trace(format!("operator removes cron entry {id}: {outcome:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// The reservations the cluster has, and where and when each job's last attempt ran, by its
/// clock (for the reservations checker).
fn placements(world: &World, finals: &mut BTreeMap<u64, Final>) -> Vec<Resv> {
    let Some(l) = world.leader() else { return Vec::new() };
    let a = read(&l.applied);
    for (id, f) in finals.iter_mut() {
        let Some(j) = a.state.jobs.get(id) else { continue };
        f.placed = Some(Placed {
            reservation: j.spec.reservation.clone(),
            start_ms: j.start_time.unwrap_or(0),
            end_ms: j.end_time.unwrap_or(0),
            nodes: j.allocation.iter().flat_map(|al| al.nodes.iter().map(|n| n.node.clone())).collect(),
        });
    }
    a.state
        .reservations
        .values()
        .map(|r| Resv {
            name: r.name.clone(),
            nodes: r.nodes.clone(),
            start_ms: r.start_ms,
            end_ms: r.end_ms.unwrap_or(u64::MAX),
        })
        .collect()
}

/// As `jepsen/` ends a run: a probe submitted until one is acknowledged (the cluster serves
/// again), then whatever is still open cancelled until every job has ended. The final state of
/// every job, as the leader has it.
async fn settle(world: &Arc<World>, problems: &mut Vec<String>) -> BTreeMap<u64, Final> {
    let healed = tokio::time::Instant::now();
    let mut process = 10_000_000;
    let probe = loop {
        if let Outcome::Submitted { job } = submit_probe(world, process, format!("probe-{process}")).await {
            break Some(job);
        }
        process += 1;
        if healed.elapsed() > RECOVERY_BOUND {
            problems.push(format!("recovery: no submit was acknowledged within {RECOVERY_BOUND:?} of the last heal"));
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let settle = tokio::time::Instant::now();
    let mut process = 20_000_000;
    let mut cancelled = std::collections::BTreeSet::new();
    let mut probe = probe;
    let mut probes = 1;
    let mut bound = SETTLE_BOUND;
    loop {
        // A probe lost with a node that was declared DOWN only after the heal (one silent through
        // the faults) proves nothing either way: another is submitted, up to five.
        let lost = probe.filter(|p| {
            world.leader().is_some_and(|l| {
                read(&l.applied)
                    .state
                    .jobs
                    .get(p)
                    .is_some_and(|j| j.state.is_finished() && j.state != JobState::Completed)
            })
        });
        if lost.is_some() && probes < 5 {
            probes += 1;
            let reprobe = submit_probe(world, 15_000_000 + probes, format!("reprobe-{probes}")).await;
            if let Outcome::Submitted { job } = reprobe {
                probe = Some(job);
            }
        }
        let jobs = world
            .leader()
            .map(|l| read(&l.applied).state.jobs.values().map(|j| (j.id, leader::seen(j))).collect::<BTreeMap<_, _>>());
        if let Some(jobs) = &jobs {
            let open: Vec<u64> = jobs.iter().filter(|(_, s)| !terminal(&s.state)).map(|(id, _)| *id).collect();
            let probe_done = probe.is_none_or(|p| jobs.get(&p).is_some_and(|s| terminal(&s.state)));
            if open.is_empty() {
                let finals = finals_of(jobs);
                if let Some(p) = probe {
                    // It may have left the queue for the history already.
                    let kept = finals.get(&p).map(|f| f.state.clone()).or_else(|| {
                        let left = world.alive().iter().find_map(|r| history::job(world, r.id, p).flatten());
                        left.map(|j| j.state.name().to_string())
                    });
                    if kept.as_deref() != Some("COMPLETED") {
                        problems.push(format!("recovery: the probe job {p} did not complete: {kept:?}"));
                    }
                }
                return finals;
            }
            // The bound is kept within a pass too: a cluster that answers no cancel (a broken
            // build's, say) costs each open job the operation's deadline.
            let pass_bound = bound.max(SETTLE_PER_JOB * open.len() as u32);
            for id in open {
                if settle.elapsed() > pass_bound {
                    break;
                }
                if Some(id) == probe && !probe_done || cancelled.contains(&id) {
                    continue;
                }
                let op = Op::Cancel { job: id };
                world.invoke(process, op.clone());
                let outcome = client::perform(world, PROBE_HOST, 1, &op, None, String::new()).await;
                world.complete(process, outcome.clone());
                if !matches!(outcome, Outcome::Unknown { .. }) {
                    cancelled.insert(id);
                }
                process += 1;
            }
        }
        if let Some(jobs) = &jobs {
            let open = jobs.values().filter(|s| !terminal(&s.state)).count() as u32;
            bound = bound.max(SETTLE_PER_JOB * open);
        }
        if settle.elapsed() > bound {
            let open: Vec<String> = jobs
                .as_ref()
                .map(|js| {
                    js.iter().filter(|(_, s)| !terminal(&s.state)).map(|(id, s)| format!("{id}: {s:?}")).collect()
                })
                .unwrap_or_default();
            problems.push(format!("terminal: jobs were still open {bound:?} after the cluster served again: {open:?}"));
            for r in world.alive() {
                let m = r.raft.metrics().borrow().clone();
                problems.push(format!(
                    "replica r{}: {:?} term {} vote {} last log {:?} applied {:?} leader {:?} {:?}",
                    r.id,
                    m.state,
                    m.current_term,
                    m.vote,
                    m.last_log_index,
                    m.last_applied,
                    m.current_leader,
                    m.running_state
                ));
            }
            return jobs.map(|js| finals_of(&js)).unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A digest point committed, and every replica's digest where it applied it compared. A
/// replica that reached the point by a snapshot has no digest of it: another point is committed.
async fn digests(world: &Arc<World>, problems: &mut Vec<String>) {
    let began = tokio::time::Instant::now();
    let mut last = String::new();
    while began.elapsed() < Duration::from_secs(30) {
        let Some(l) = world.leader() else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let now = world.wall_ms(l.id);
        // (A leader that cannot commit, as a broken build's may not, is given up after a while.)
        let written = tokio::time::timeout(Duration::from_secs(5), leader::write(&l, Command::Digest { now })).await;
        let Ok(Ok((index, Response::Digest { .. }))) = written else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let point = tokio::time::Instant::now();
        while point.elapsed() < Duration::from_secs(10) {
            let mut passed = false;
            let seen: BTreeMap<u64, Option<u64>> = world
                .replica_ids()
                .into_iter()
                .map(|id| {
                    let applied = world.replica(id).map(|r| read(&r.applied).clone());
                    passed |= applied.as_ref().is_some_and(|a| a.index() >= index && !a.digests.contains_key(&index));
                    (id, applied.and_then(|a| a.digests.get(&index).copied()))
                })
                .collect();
            if passed {
                break;
            }
            if seen.values().all(Option::is_some) {
                let distinct: std::collections::BTreeSet<u64> = seen.values().flatten().copied().collect();
                if distinct.len() > 1 {
                    problems.push(format!("digest: replicas differ at index {index}: {seen:?}"));
                }
                return;
            }
            last = format!("at index {index}: {seen:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    problems.push(format!("digest: not every replica applied one digest point within 30 s ({last})"));
}
