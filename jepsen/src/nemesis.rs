//! The faults, chosen and timed from the seed before the run begins (so that a seed replays the
//! same schedule), applied to the cluster and healed. Which replica is the leader is looked up
//! when a fault aimed at it begins.

use std::collections::BTreeSet;
use std::time::Duration;

use quorum_client::client::Client;
use quorum_proto::api;

use crate::cluster::{within, Cluster, Who};
use crate::rng::Rng;

/// The kinds that `--nemesis all` leaves out: `freeze-node` finds a known bound, kept as Slurm
/// has it (a `--requeue` job whose node was frozen whole past its lease runs for an instant after
/// the thaw, before its supervisor, thawed with it, kills it, beside the copy started elsewhere;
/// `RESULTS.md`).
pub const NOT_IN_ALL: [&str; 1] = ["freeze-node"];

/// The kinds of fault `--nemesis` names.
pub const KINDS: [&str; 16] = [
    "partition",
    "one-way",
    "isolate-leader",
    "kill",
    "lose-unsynced",
    "kill-agent",
    "pause",
    "clock",
    "clock-rate",
    "freeze-node",
    "crash-point",
    "transfer",
    "all-down",
    "membership",
    "slow-disk",
    "upgrade",
];

#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// The hosts on one side (replicas and agents by host index) cut from the rest.
    Halves {
        side: Vec<usize>,
    },
    /// Each replica hears only its neighbours in a ring (agents hear all).
    Ring,
    IsolateLeader,
    /// Packets from host `from` to host `to` dropped, not the other way.
    OneWay {
        from: usize,
        to: usize,
    },
    Kill {
        who: Vec<Who>,
    },
    Pause {
        who: Vec<Who>,
    },
    PauseLeader,
    /// Replica `replica`'s wall clock moved `offset` seconds.
    Clock {
        replica: usize,
        offset: i64,
    },
    /// Replica `replica`'s wall clock running at `percent` of the true speed.
    ClockRate {
        replica: usize,
        percent: u32,
    },
    /// Agent `agent`'s whole node frozen: the agent and every job it runs (cgroup freezer).
    FreezeNode {
        agent: usize,
    },
    /// A replica restarted with one of the controller's crash points armed
    /// (`quorum_raft::CRASH_POINTS`): it aborts the first time it passes there. `replica` is
    /// `None` for the points only a leader passes: the leader then, handed its leadership back
    /// after the restart.
    CrashPoint {
        replica: Option<usize>,
        point: &'static str,
    },
    TransferLeader {
        to: usize,
    },
    AllDown,
    /// Replica `replica` removed from the cluster, its disk wiped, and added back as a new
    /// member when the fault heals.
    Replace {
        replica: usize,
    },
    /// A rolling restart of these replicas, one by one in this order (and of each agent when
    /// `agents`), onto the previous release's binaries when the run has them; back to this
    /// release when it heals.
    Upgrade {
        order: Vec<usize>,
        agents: bool,
    },
    /// These replicas killed as by a power cut (one, or all of them: the machine room's):
    /// what each wrote and had not synced is lost (`Cluster::lose_unsynced`); started again
    /// when it heals.
    LoseUnsynced {
        replicas: Vec<usize>,
    },
    /// Every sync of these replicas' disks made `ms` milliseconds slower.
    SlowDisk {
        replicas: Vec<usize>,
        ms: u64,
    },
}

#[derive(Clone, Debug)]
pub struct Step {
    /// Seconds from the start of the run.
    pub at: f64,
    /// How long the faults last.
    pub hold: f64,
    pub faults: Vec<Fault>,
}

/// The run's faults over `time` seconds: one at a time, sometimes two together, beginning in
/// the first 80% of it; the last lasts to the end, so that the run measures how soon the
/// cluster serves again once it heals.
pub fn schedule(rng: &mut Rng, kinds: &[String], time: f64, replicas: usize, agents: usize) -> Vec<Step> {
    let active = time * 0.8;
    let mut steps = Vec::new();
    let mut at = 2.0 + rng.below(2000) as f64 / 1000.0;
    let hosts = replicas + agents;
    while at < active && !kinds.is_empty() {
        let count = if rng.chance(0.25) { 2 } else { 1 };
        let mut faults = Vec::new();
        let mut hold = 2.0 + rng.below(8000) as f64 / 1000.0;
        for _ in 0..count {
            let kind = rng.pick(kinds).expect("kinds is not empty").as_str();
            let fault = match kind {
                "partition" => match rng.chance(0.3) && replicas >= 5 {
                    true => Fault::Ring,
                    false => {
                        let k = rng.between(1, (hosts as u64 - 1).max(1)) as usize;
                        Fault::Halves { side: rng.subset(hosts, k) }
                    }
                },
                "one-way" => {
                    let pair = rng.subset(hosts, 2);
                    match rng.chance(0.5) {
                        true => Fault::OneWay { from: pair[0], to: pair[1] },
                        false => Fault::OneWay { from: pair[1], to: pair[0] },
                    }
                }
                "isolate-leader" => Fault::IsolateLeader,
                "kill" => {
                    let k = rng.between(1, ((replicas - 1) / 2).max(1) as u64) as usize;
                    Fault::Kill { who: rng.subset(replicas, k).into_iter().map(Who::Replica).collect() }
                }
                "kill-agent" => Fault::Kill { who: vec![Who::Agent(rng.below(agents as u64) as usize)] },
                "lose-unsynced" => {
                    let k = if rng.chance(0.3) { replicas } else { 1 };
                    Fault::LoseUnsynced { replicas: rng.subset(replicas, k) }
                }
                "pause" => match rng.below(3) {
                    0 => Fault::PauseLeader,
                    1 => Fault::Pause { who: vec![Who::Replica(rng.below(replicas as u64) as usize)] },
                    _ => Fault::Pause { who: vec![Who::Agent(rng.below(agents as u64) as usize)] },
                },
                "clock" => {
                    let offset = rng.between(1, 25) as i64;
                    let offset = if rng.chance(0.5) { offset } else { -offset };
                    Fault::Clock { replica: rng.below(replicas as u64) as usize, offset }
                }
                "clock-rate" => {
                    let percent = if rng.chance(0.5) { rng.between(50, 90) } else { rng.between(120, 200) } as u32;
                    Fault::ClockRate { replica: rng.below(replicas as u64) as usize, percent }
                }
                "freeze-node" => Fault::FreezeNode { agent: rng.below(agents as u64) as usize },
                "crash-point" => {
                    let point = *rng.pick(&quorum_raft::CRASH_POINTS).expect("crash points");
                    let replica = (!LEADER_POINTS.contains(&point)).then(|| rng.below(replicas as u64) as usize);
                    Fault::CrashPoint { replica, point }
                }
                "transfer" => Fault::TransferLeader { to: rng.below(replicas as u64) as usize },
                "membership" => Fault::Replace { replica: rng.below(replicas as u64) as usize },
                "upgrade" => {
                    // Some replicas, or all, in a random order: a mixed cluster while it lasts.
                    let k = rng.between(1, replicas as u64) as usize;
                    let mut order = rng.subset(replicas, k);
                    order.rotate_left(rng.below(k as u64) as usize);
                    if rng.chance(0.5) {
                        order.reverse();
                    }
                    Fault::Upgrade { order, agents: rng.chance(0.5) }
                }
                "slow-disk" => {
                    let k = if rng.chance(0.3) { replicas } else { 1 };
                    Fault::SlowDisk { replicas: rng.subset(replicas, k), ms: rng.between(10, 300) }
                }
                "all-down" => {
                    // Longer runs hold every replica down for minutes.
                    let longest = (active * 0.4).clamp(15.0, 180.0);
                    hold = 5.0 + rng.below(((longest - 5.0) * 1000.0) as u64) as f64 / 1000.0;
                    Fault::AllDown
                }
                other => unreachable!("unknown nemesis {other} (checked when parsing)"),
            };
            if !faults.contains(&fault) {
                faults.push(fault);
            }
        }
        steps.push(Step { at, hold, faults });
        at += hold + 1.0 + rng.below(4000) as f64 / 1000.0;
    }
    if let Some(last) = steps.last_mut() {
        last.hold = last.hold.max(time - last.at);
    }
    steps
}

/// The crash points only a leader passes: armed on the leader.
const LEADER_POINTS: [&str; 3] = ["write-before-reply", "plan-before-launch", "membership-change"];

/// What is in force now, so that healing undoes exactly it.
#[derive(Default)]
pub struct Active {
    cut: BTreeSet<(usize, usize)>,
    killed: Vec<Who>,
    paused: Vec<Who>,
    clocks: Vec<usize>,
    frozen: Vec<usize>,
    /// Replicas restarted with a crash point armed, and the point.
    armed: Vec<(usize, &'static str)>,
    /// Replicas removed, to be added back.
    removed: Vec<usize>,
    slow: Vec<usize>,
    upgraded: Vec<Who>,
}

async fn leader(cluster: &Cluster) -> Option<usize> {
    for _ in 0..10 {
        if let Some(l) = cluster.leader().await {
            return Some(l);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Applies `fault`; says what it did.
pub async fn apply(
    cluster: &mut Cluster,
    client: &Client,
    fault: &Fault,
    active: &mut Active,
) -> anyhow::Result<String> {
    let hosts = cluster.net.hosts.len();
    let replicas = cluster.replicas.len();
    let both_ways = |a: &[usize], b: &[usize], cut: &mut BTreeSet<(usize, usize)>| {
        for &x in a {
            for &y in b {
                cut.insert((x, y));
                cut.insert((y, x));
            }
        }
    };
    let what = match fault {
        Fault::Halves { side } => {
            let other: Vec<usize> = (0..hosts).filter(|h| !side.contains(h)).collect();
            both_ways(side, &other, &mut active.cut);
            cluster.net.block(&active.cut)?;
            format!("partition {:?} | {:?}", names(cluster, side), names(cluster, &other))
        }
        Fault::Ring => {
            for a in 0..replicas {
                for b in 0..replicas {
                    let d = (a + replicas - b) % replicas;
                    if a != b && d != 1 && d != replicas - 1 {
                        active.cut.insert((a, b));
                    }
                }
            }
            cluster.net.block(&active.cut)?;
            "partition: replicas in a ring, each hearing its neighbours".into()
        }
        Fault::IsolateLeader => {
            let Some(l) = leader(cluster).await else { return Ok("isolate-leader: no leader".into()) };
            let rest: Vec<usize> = (0..hosts).filter(|h| *h != l).collect();
            both_ways(&[l], &rest, &mut active.cut);
            cluster.net.block(&active.cut)?;
            format!("isolate leader r{}", l + 1)
        }
        Fault::OneWay { from, to } => {
            active.cut.insert((*from, *to));
            cluster.net.block(&active.cut)?;
            format!("one-way: drop {} -> {}", cluster.net.hosts[*from].name, cluster.net.hosts[*to].name)
        }
        Fault::Kill { who } => {
            for w in who {
                cluster.daemon(*w).kill();
                active.killed.push(*w);
            }
            format!("kill -9 {:?}", who.iter().map(|w| cluster.daemon(*w).name.clone()).collect::<Vec<_>>())
        }
        Fault::LoseUnsynced { replicas } => {
            let mut cut = Vec::new();
            for r in replicas {
                let (files, bytes) = cluster.lose_unsynced(*r)?;
                active.killed.push(Who::Replica(*r));
                cut.push(format!("r{}: {bytes} bytes not synced lost, files cut back: {}", r + 1, files.join(", ")));
            }
            format!("power cut {}", cut.join("; "))
        }
        Fault::AllDown => {
            for i in 0..replicas {
                cluster.daemon(Who::Replica(i)).kill();
                active.killed.push(Who::Replica(i));
            }
            "all replicas down (kill -9)".into()
        }
        Fault::Pause { who } => {
            for w in who {
                cluster.daemon(*w).pause();
                active.paused.push(*w);
            }
            format!("SIGSTOP {:?}", who.iter().map(|w| cluster.daemon(*w).name.clone()).collect::<Vec<_>>())
        }
        Fault::PauseLeader => {
            let Some(l) = leader(cluster).await else { return Ok("pause-leader: no leader".into()) };
            cluster.daemon(Who::Replica(l)).pause();
            active.paused.push(Who::Replica(l));
            format!("SIGSTOP leader r{}", l + 1)
        }
        Fault::Clock { replica, offset } => {
            if !cluster.clocks {
                return Ok("clock: libfaketime is not installed; skipped".into());
            }
            cluster.set_clock(*replica, *offset)?;
            active.clocks.push(*replica);
            format!("clock of r{} moved {offset:+}s", replica + 1)
        }
        Fault::ClockRate { replica, percent } => {
            if !cluster.clocks {
                return Ok("clock-rate: libfaketime is not installed; skipped".into());
            }
            cluster.set_clock_rate(*replica, *percent)?;
            active.clocks.push(*replica);
            format!("clock of r{} runs at {percent}%", replica + 1)
        }
        Fault::FreezeNode { agent } => {
            if cluster.cgroups.is_none() {
                return Ok("freeze-node: no cgroup v2 here; skipped".into());
            }
            if active.frozen.contains(agent) {
                return Ok(format!("freeze-node: a{} is frozen already", agent + 1));
            }
            cluster.freeze_node(*agent, true)?;
            active.frozen.push(*agent);
            format!("node a{} frozen whole (agent and jobs)", agent + 1)
        }
        Fault::CrashPoint { replica, point } => {
            let r = match replica {
                Some(r) => *r,
                None => match leader(cluster).await {
                    Some(l) => l,
                    None => return Ok(format!("crash-point {point}: no leader")),
                },
            };
            if active.armed.iter().any(|(a, _)| *a == r) || active.killed.contains(&Who::Replica(r)) {
                return Ok(format!("crash-point {point}: r{} is armed or down already", r + 1));
            }
            cluster.arm_crash(r, point)?;
            active.armed.push((r, point));
            let mut what = format!("r{} restarted with crash point {point} armed", r + 1);
            if replica.is_none() {
                what.push_str(&match lead_again(cluster, client, r).await {
                    Ok(()) => ", leading again".to_string(),
                    Err(e) => format!(", not leading again ({e})"),
                });
            }
            what
        }
        Fault::Replace { replica } => {
            let id = *replica as u64 + 1;
            let req = api::MembershipChangeRequest { id, ..Default::default() };
            let removed = within(client, Duration::from_secs(10), |mut cl| {
                let req = req.clone();
                async move { cl.remove_replica(req).await }
            })
            .await;
            match removed {
                Ok(_) => {
                    cluster.replace_disk(*replica)?;
                    active.removed.push(*replica);
                    format!("membership: r{id} removed, its disk wiped, started to join again")
                }
                Err(e) => format!("membership: removing r{id} refused: {e}"),
            }
        }
        Fault::Upgrade { order, agents } => {
            let mut done = Vec::new();
            let whos = order.iter().map(|r| Who::Replica(*r));
            let whos: Vec<Who> = match agents {
                true => whos.chain((0..cluster.agents.len()).map(Who::Agent)).collect(),
                false => whos.collect(),
            };
            for who in whos {
                done.push(cluster.swap(who, true).await?);
                if cluster.runs_old(who) {
                    active.upgraded.push(who);
                }
            }
            let kind = if cluster.old.is_some() { "rolling downgrade" } else { "rolling restart" };
            format!("{kind}: {}", done.join(", "))
        }
        Fault::SlowDisk { replicas, ms } => {
            for r in replicas {
                cluster.set_disk_delay(*r, *ms)?;
                active.slow.push(*r);
            }
            format!(
                "slow disk: each sync of {:?} {ms} ms slower",
                replicas.iter().map(|r| format!("r{}", r + 1)).collect::<Vec<_>>()
            )
        }
        Fault::TransferLeader { to } => match transfer(client, *to).await {
            Ok(r) => format!("leadership to r{}: r{} leads", to + 1, r.leader),
            Err(e) => format!("leadership to r{}: {e}", to + 1),
        },
    };
    Ok(what)
}

/// Asks the cluster to hand its leadership to replica `to` (an index), waiting 5 s at most.
async fn transfer(client: &Client, to: usize) -> Result<api::TransferLeaderResponse, String> {
    let req = api::TransferLeaderRequest { to: to as u64 + 1, ..Default::default() };
    within(client, Duration::from_secs(5), |mut cl| {
        let req = req.clone();
        async move { cl.transfer_leader(req).await }
    })
    .await
}

/// Gives replica `r`, just restarted, its leadership back, so that it passes the leader's crash
/// points: tried for 15 s, until it has started and caught up (a transfer to a replica behind is
/// refused), unless it already won the election itself.
async fn lead_again(cluster: &Cluster, client: &Client, r: usize) -> Result<(), String> {
    let began = std::time::Instant::now();
    loop {
        if cluster.leader().await == Some(r) {
            return Ok(());
        }
        match transfer(client, r).await {
            Ok(_) => return Ok(()),
            Err(e) if began.elapsed() > Duration::from_secs(15) => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Undoes everything in force: the network whole, the dead restarted, the paused resumed,
/// every clock true, removed replicas added back (tried for up to a minute each).
pub async fn heal(cluster: &mut Cluster, client: &Client, active: &mut Active) -> anyhow::Result<String> {
    let mut done = Vec::new();
    if !active.cut.is_empty() {
        active.cut.clear();
        cluster.net.block(&active.cut)?;
        done.push("network healed".to_string());
    }
    for (r, point) in std::mem::take(&mut active.armed) {
        let d = cluster.daemon(Who::Replica(r));
        let crashed = d.crashed();
        // Disarmed: started again without FAILPOINTS.
        d.kill();
        cluster.restart(Who::Replica(r))?;
        done.push(match crashed {
            true => format!("r{} crashed at {point}, restarted", r + 1),
            false => format!("r{} did not pass {point}, restarted unarmed", r + 1),
        });
    }
    for a in active.frozen.drain(..) {
        cluster.freeze_node(a, false)?;
        done.push(format!("node a{} thawed", a + 1));
    }
    for w in active.paused.drain(..) {
        cluster.daemon(w).resume();
        done.push(format!("SIGCONT {}", cluster.daemon(w).name));
    }
    for w in active.killed.drain(..) {
        cluster.restart(w)?;
        done.push(format!("restarted {}", cluster.daemon(w).name));
    }
    for r in active.clocks.drain(..) {
        // True time at true speed (libfaketime keeps a speed that a later line does not name).
        cluster.set_clock_rate(r, 100)?;
        done.push(format!("clock of r{} true", r + 1));
    }
    // Back to this release, one at a time, as a rolling upgrade.
    for who in std::mem::take(&mut active.upgraded) {
        done.push(cluster.swap(who, false).await?);
    }
    for r in active.slow.drain(..) {
        cluster.set_disk_delay(r, 0)?;
        done.push(format!("disk of r{} fast", r + 1));
    }
    for r in std::mem::take(&mut active.removed) {
        let (id, addr) = (r as u64 + 1, cluster.addrs[r].clone());
        let began = std::time::Instant::now();
        let req = api::MembershipChangeRequest { id, addr, ..Default::default() };
        let outcome = loop {
            let added = within(client, Duration::from_secs(30), |mut cl| {
                let req = req.clone();
                async move { cl.add_replica(req).await }
            })
            .await;
            match added {
                Ok(_) => break format!("r{id} added back after {:.1}s", began.elapsed().as_secs_f64()),
                Err(e) if began.elapsed() > Duration::from_secs(60) => {
                    anyhow::bail!("membership: r{id} could not be added back within a minute: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        };
        done.push(outcome);
    }
    Ok(done.join(", "))
}

fn names(cluster: &Cluster, hosts: &[usize]) -> Vec<String> {
    hosts.iter().map(|h| cluster.net.hosts[*h].name.clone()).collect()
}
