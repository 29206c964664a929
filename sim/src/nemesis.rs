//! Faults, chosen from the seed: one at a time, sometimes two together, each lasting 2–10 s with
//! 1–5 s between, beginning in the first 80% of the run. Every fault heals at the end of its
//! step (a crashed or stopped replica restarts then).

use std::sync::Arc;
use std::time::Duration;

use quorum_jepsen::choice::Mix;
use quorum_jepsen::rng::Rng;

use crate::disk::{self, DiskFault};
use crate::net::Host;
use crate::world::{Point, World};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Fault {
    /// A random split of all hosts (replicas and agents) in two.
    Partition,
    /// Every message from one host to another dropped, not the way back.
    OneWay,
    /// The leader cut from every other host.
    IsolateLeader,
    /// A minority of replicas crash (what their disks had not synced is lost, but for a torn
    /// part), and restart when it heals; with the whole workload, 3 times in 10 every replica
    /// at once (a power cut).
    Kill,
    /// A node frozen whole (its agent and its jobs), thawed when it heals.
    Freeze,
    /// A replica's wall clock moved 1–25 s ahead or behind.
    Clock,
    /// A replica's wall clock running at half to twice the speed.
    ClockRate,
    /// Every sync of one replica's disk, or all of them, 10–300 ms slower.
    SlowDisk,
    /// One replica's disk fails every write (EIO or ENOSPC): it stops, and restarts when it heals.
    DiskError,
    /// A replica (the leader, for the points only a leader reaches) crashes at the next pass
    /// through one of the shells' crash points (`Point`), and restarts when it heals.
    CrashPoint,
}

impl Fault {
    pub const ALL: [Fault; 10] = [
        Fault::Partition,
        Fault::OneWay,
        Fault::IsolateLeader,
        Fault::Kill,
        Fault::Freeze,
        Fault::Clock,
        Fault::ClockRate,
        Fault::SlowDisk,
        Fault::DiskError,
        Fault::CrashPoint,
    ];
}

/// One step of the schedule: faults that begin at `at` and heal `hold` later.
#[derive(Clone, Debug)]
pub struct Step {
    pub at: f64,
    pub hold: f64,
    pub faults: Vec<Fault>,
}

pub fn schedule(rng: &mut Rng, faults: &[Fault], time: f64) -> Vec<Step> {
    let mut steps = Vec::new();
    if faults.is_empty() {
        return steps;
    }
    let mut t = rng.between(1000, 3000) as f64 / 1000.0;
    while t < time * 0.8 {
        let hold = rng.between(2000, 10_000) as f64 / 1000.0;
        let mut chosen = vec![*rng.pick(faults).expect("not empty")];
        if rng.chance(0.25) {
            let other = *rng.pick(faults).expect("not empty");
            if !chosen.contains(&other) {
                chosen.push(other);
            }
        }
        steps.push(Step { at: t, hold, faults: chosen });
        t += hold + rng.between(1000, 5000) as f64 / 1000.0;
    }
    steps
}

fn hosts(world: &World) -> Vec<Host> {
    let mut all = world.replica_ids();
    all.extend(world.agents.keys().copied());
    all
}

/// Begins a fault, saying what it did.
pub async fn begin(world: &Arc<World>, fault: Fault, rng: &mut Rng) -> String {
    let ids = world.replica_ids();
    let n = ids.len();
    match fault {
        Fault::Partition => {
            let all = hosts(world);
            let k = rng.between(1, all.len() as u64 - 1) as usize;
            let side: Vec<Host> = rng.subset(all.len(), k).into_iter().map(|i| all[i]).collect();
            let other: Vec<Host> = all.iter().copied().filter(|h| !side.contains(h)).collect();
            let pairs: Vec<(Host, Host)> =
                side.iter().flat_map(|a| other.iter().flat_map(move |b| [(*a, *b), (*b, *a)])).collect();
            world.net.cut(pairs);
            format!("partition {side:?} | {other:?}")
        }
        Fault::OneWay => {
            let all = hosts(world);
            let a = *rng.pick(&all).expect("hosts");
            let others: Vec<Host> = all.iter().copied().filter(|h| *h != a).collect();
            let b = *rng.pick(&others).expect("hosts");
            world.net.cut([(a, b)]);
            format!("one-way {a} -/-> {b}")
        }
        Fault::IsolateLeader => match world.leader() {
            Some(l) => {
                let pairs: Vec<(Host, Host)> =
                    hosts(world).into_iter().filter(|h| *h != l.id).flat_map(|h| [(l.id, h), (h, l.id)]).collect();
                world.net.cut(pairs);
                format!("isolate-leader r{}", l.id)
            }
            None => "isolate-leader: no leader".into(),
        },
        Fault::Kill => {
            // With the whole workload, 3 in 10 a power cut: every replica at once.
            let k = match world.opts.workload >= Mix::Full && rng.chance(0.3) {
                true => n,
                false => rng.between(1, ((n - 1) / 2) as u64) as usize,
            };
            let victims: Vec<u64> = rng.subset(n, k).into_iter().map(|i| ids[i]).collect();
            for id in &victims {
                world.crash_now(*id, "(killed)");
            }
            format!("kill {victims:?}")
        }
        Fault::Freeze => {
            let agents: Vec<Host> = world.agents.keys().copied().collect();
            let a = *rng.pick(&agents).expect("agents");
            world.agents[&a].freeze(true);
            format!("freeze {}", world.agents[&a].name)
        }
        Fault::Clock => {
            let id = *rng.pick(&ids).expect("replicas");
            let secs = rng.between(1, 25) as f64 * if rng.chance(0.5) { 1.0 } else { -1.0 };
            world.set_clock(id, secs * 1000.0, 1.0);
            format!("clock r{id} {secs:+} s")
        }
        Fault::ClockRate => {
            let id = *rng.pick(&ids).expect("replicas");
            let rate = rng.between(50, 200) as f64 / 100.0;
            world.set_clock(id, 0.0, rate);
            format!("clock-rate r{id} x{rate}")
        }
        Fault::SlowDisk => {
            let ms = rng.between(10, 300);
            let which: Vec<u64> = match rng.chance(0.5) {
                true => ids.clone(),
                false => vec![*rng.pick(&ids).expect("replicas")],
            };
            for id in &which {
                disk::lock(&world.disks[id]).latency = Duration::from_millis(ms);
            }
            format!("slow-disk {which:?} +{ms} ms")
        }
        Fault::DiskError => {
            let id = *rng.pick(&ids).expect("replicas");
            let fault = if rng.chance(0.5) { DiskFault::Eio } else { DiskFault::Enospc };
            disk::lock(&world.disks[&id]).fault = Some(fault);
            format!("disk-error r{id} {fault:?}")
        }
        Fault::CrashPoint => {
            let points: &[Point] = if world.opts.keeps_history() { &Point::WITH_HISTORY } else { Point::ALL };
            let point = *rng.pick(points).expect("points");
            let leader = world.leader().map(|l| l.id);
            let id = match (point, leader) {
                (Point::Reply | Point::Launch | Point::SnapshotBuild, Some(l)) => l,
                _ => *rng.pick(&ids).expect("replicas"),
            };
            world.armed.lock().unwrap_or_else(|p| p.into_inner()).insert(id, point);
            format!("crash-point r{id} {point:?}")
        }
    }
}

/// Heals every fault: the network whole, frozen nodes thawed, disks sound and fast, clocks at
/// their rate, and every replica that is down started again.
pub async fn heal(world: &Arc<World>) -> String {
    world.net.heal();
    world.armed.lock().unwrap_or_else(|p| p.into_inner()).clear();
    for agent in world.agents.values() {
        agent.freeze(false);
    }
    for id in world.replica_ids() {
        {
            let mut d = disk::lock(&world.disks[&id]);
            d.latency = Duration::from_millis(1);
            d.fault = None;
        }
        world.set_clock(id, 0.0, 1.0);
    }
    let mut restarted = Vec::new();
    for id in world.replica_ids() {
        if world.replica(id).is_none() {
            if let Err(e) = world.start_replica(id, false).await {
                world.trace(format!("r{id} failed to restart: {e}"));
            }
            restarted.push(id);
        }
    }
    format!("heal (restarted {restarted:?})")
}

/// Runs the schedule against the world, from its start.
pub async fn run(world: Arc<World>, steps: Vec<Step>, mut rng: Rng, time: f64) {
    for step in steps {
        sleep_until(&world, step.at).await;
        for fault in &step.faults {
            let what = begin(&world, *fault, &mut rng).await;
            world.nemesis(what);
        }
        let end = (step.at + step.hold).min(time);
        sleep_until(&world, end).await;
        let what = heal(&world).await;
        world.nemesis(what);
    }
}

async fn sleep_until(world: &World, at: f64) {
    tokio::time::sleep_until(world.start + Duration::from_secs_f64(at)).await;
}
