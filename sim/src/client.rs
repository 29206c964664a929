//! The clients: `jepsen/`'s workload, chosen by its own `choice` module (short jobs, some with
//! `--requeue` or a GPU, some on two nodes, some waiting on another with `afterok`, job arrays
//! with a throttle (not in `--workload single-node` or `multi-node`); register jobs
//! whose holds, releases, cancels and reads the linearizability checker judges; stale reads),
//! each client bound to one replica, which forwards to the leader as a controller does. A
//! submit that gets no answer is sent again with the same request id within the operation's
//! deadline, as `quorum` does; an operation without an answer in 4 s is unknown, and its
//! client continues as a new process.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorum_jepsen::choice::{Job, Pool, TICK_S};
use quorum_jepsen::history::{Op, Outcome};
use quorum_jepsen::rng::Rng;
use quorum_model::het::HetComponent;
use quorum_model::reservation::ResvRequest;
use quorum_model::{ArraySpec, Dependency, DependencyKind, JobSpec, Program, TaskRange};
use tokio::sync::watch;

use crate::leader::{self, Request};
use crate::net::{Host, CLIENT_BASE};
use crate::world::{Bug, World};

const OP_TIMEOUT: Duration = Duration::from_secs(4);
/// A submit's job as the simulated cluster runs it: `sleep` for its ticks, or a script that
/// runs its steps one after another, each for its ticks (`steps`: without, a job of steps runs
/// as one job as long as its steps, as before the simulator had steps).
pub fn spec_of(job: &Job, steps: bool) -> JobSpec {
    let ticks = job.ticks * u64::from(job.steps.max(1));
    let mut spec = spec(&job.name, ticks as f64 * TICK_S, job.held, job.requeue, job.gpus);
    if steps && job.steps > 0 {
        spec.program = Program::Argv(crate::steps::script(job.ticks as f64 * TICK_S, job.steps));
    }
    spec.nodes = job.nodes;
    spec.ntasks = job.nodes;
    if job.het {
        // Its first component on one node, the second on another, with a GPU; the script runs
        // once, on the first node (the batch step), as a heterogeneous job's must.
        (spec.nodes, spec.ntasks) = (1, 1);
        spec.batch_step = true;
        let mut second = HetComponent::of(&spec);
        second.gpus_per_node = 1;
        spec.het = vec![second];
    }
    if let Some(after) = job.after {
        spec.dependencies = vec![Dependency { kind: DependencyKind::AfterOk, job: after, delay_min: 0 }];
        spec.kill_on_invalid_dep = job.kill_on_invalid_dep;
    }
    spec.partition = job.partition.clone();
    spec.reservation = job.reservation.clone();
    spec.array = job.array.map(|a| ArraySpec {
        ranges: vec![TaskRange { first: 0, last: a.tasks.saturating_sub(1), step: 1 }],
        throttle: a.throttle,
    });
    spec
}

pub fn spec(name: &str, secs: f64, held: bool, requeue: bool, gpus: u32) -> JobSpec {
    JobSpec {
        name: name.into(),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        gpus_per_node: gpus,
        program: Program::Argv(vec!["sleep".into(), format!("{secs:.1}")]),
        work_dir: "/tmp".into(),
        submit_dir: "/tmp".into(),
        hold: held,
        requeue,
        ..Default::default()
    }
}

pub async fn worker(world: Arc<World>, w: usize, mut rng: Rng, pool: Arc<Mutex<Pool>>, stop: watch::Receiver<bool>) {
    let workers = world.opts.clients as u64;
    let bound = (w as u64 % world.opts.replicas as u64) + 1;
    let host = CLIENT_BASE + w as u64;
    let mut process = w as u64;
    let mut submits = 0u64;
    while !*stop.borrow() {
        let chosen = pool.lock().unwrap_or_else(|p| p.into_inner()).choose(&mut rng, w, world.opts.workload);
        let Some((op, job)) = chosen else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        world.invoke(process, op.clone());
        submits += 1;
        let request_id = format!("sim-{process}-{submits}");
        let outcome =
            perform(&world, host, bound, &op, job.as_ref().map(|j| spec_of(j, world.opts.runs_steps())), request_id)
                .await;
        world.complete(process, outcome.clone());
        pool.lock().unwrap_or_else(|p| p.into_inner()).learn(&op, &outcome);
        if matches!(outcome, Outcome::Unknown { .. }) {
            process += workers;
        }
        tokio::time::sleep(Duration::from_millis(rng.between(20, 200))).await;
    }
}

/// An operator's `scontrol create reservation` from `host` through replica `bound`: `None` when
/// it had no answer within the operation's deadline.
pub async fn reserve(world: &Arc<World>, host: Host, bound: u64, request: ResvRequest) -> Option<Outcome> {
    operator(world, host, bound, Request::Reserve { request: Box::new(request) }).await
}

/// An operator's request (sent once) from `host` through replica `bound`: `None` when it had no
/// answer within the operation's deadline.
pub async fn operator(world: &Arc<World>, host: Host, bound: u64, request: Request) -> Option<Outcome> {
    tokio::time::timeout(OP_TIMEOUT, once(world, host, bound, request, false, OP_TIMEOUT)).await.ok().flatten()
}

/// One operation from client `host` through replica `bound`, within the deadline.
pub async fn perform(
    world: &Arc<World>,
    host: Host,
    bound: u64,
    op: &Op,
    spec: Option<JobSpec>,
    request_id: String,
) -> Outcome {
    let request = match (op, spec) {
        (Op::Submit { .. }, Some(spec)) => Request::Submit { spec: Box::new(spec), request_id },
        (Op::Hold { job }, _) => Request::Hold { job: *job },
        (Op::Release { job }, _) => Request::Release { job: *job },
        (Op::Cancel { job }, _) => Request::Cancel { job: *job },
        (Op::Read { job } | Op::StaleRead { job }, _) => Request::Read { job: *job },
        (Op::Submit { .. }, None) => return Outcome::Failed { error: "a submit without a job".into() },
    };
    let stale = matches!(op, Op::StaleRead { .. });
    let deadline = tokio::time::Instant::now() + OP_TIMEOUT;
    let mut request = request;
    loop {
        // A submit is tried again after a second and a half without an answer; others wait.
        let patience = match request {
            Request::Submit { .. } => Duration::from_millis(1500),
            _ => OP_TIMEOUT,
        };
        let attempt =
            tokio::time::timeout_at(deadline, once(world, host, bound, request.clone(), stale, patience)).await;
        match attempt {
            Ok(Some(outcome)) => return outcome,
            // No answer to a submit: sent again while the deadline allows, with its request id
            // (or, in the broken build, a new one).
            Ok(None) if matches!(request, Request::Submit { .. }) => {
                if let Request::Submit { request_id, .. } = &mut request {
                    if world.bug(Bug::NoDedup) {
                        request_id.push('+');
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(None) => {
                tokio::time::sleep_until(deadline).await;
                return Outcome::Unknown { error: format!("no answer within {OP_TIMEOUT:?}") };
            }
            Err(_) => return Outcome::Unknown { error: format!("no answer within {OP_TIMEOUT:?}") },
        }
    }
}

/// One attempt: `None` when it was not answered within `patience` (lost on the way, or the
/// replica asked knows no leader), `Some` with what came back.
async fn once(
    world: &Arc<World>,
    host: Host,
    bound: u64,
    request: Request,
    stale: bool,
    patience: Duration,
) -> Option<Outcome> {
    let trip = async {
        if !world.net.hop(host, bound).await {
            return futures::future::pending().await;
        }
        let Some(r) = world.replica(bound) else {
            return Some(Outcome::Failed { error: "connection refused".into() });
        };
        let outcome = if stale {
            let Request::Read { job } = request else { unreachable!("a stale read is a read") };
            Some(leader::read_local(world, &r, job))
        } else if leader::leads(&r) || (world.bug(Bug::StaleReads) && matches!(request, Request::Read { .. })) {
            Some(leader::serve(world, &r, request).await)
        } else {
            match leader::leader_hint(&r).filter(|l| *l != r.id) {
                // Forwarded to the leader the replica knows.
                Some(l) => {
                    if !world.net.hop(r.id, l).await {
                        return futures::future::pending().await;
                    }
                    let Some(leader) = world.replica(l) else { return futures::future::pending().await };
                    let outcome = match leader::leads(&leader) {
                        true => Some(leader::serve(world, &leader, request).await),
                        false => None,
                    };
                    if !world.net.hop(l, r.id).await {
                        return futures::future::pending().await;
                    }
                    outcome
                }
                None => None,
            }
        };
        if !world.net.hop(bound, host).await {
            return futures::future::pending().await;
        }
        outcome
    };
    match tokio::time::timeout(patience, trip).await {
        Ok(Some(outcome)) => Some(outcome),
        Ok(None) => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            None
        }
        Err(_) => None,
    }
}
