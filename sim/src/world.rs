//! Everything one run holds: the hosts, their disks and clocks, the network, the history and the
//! trace; replicas started, crashed and restarted; and openraft's network over the simulated
//! one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use quorum_jepsen::history::{Event, Op, Outcome};
use quorum_jepsen::rng::Rng;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::disk::{self, LogStore, Machine, SharedApplied, SharedDisk};
use crate::net::{Host, Net};
use crate::runtime::{Raft, SimConfig};
use crate::Options;

/// The wall clock every replica starts from (2026-11-30), in milliseconds since the epoch.
const EPOCH_MS: f64 = 1_796_000_000_000.0;

/// A replica's wall clock: `base_wall` at `base` of the run's time, running at `rate`.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: Duration,
    base_wall: f64,
    rate: f64,
}

impl Clock {
    fn at(&self, elapsed: Duration) -> f64 {
        self.base_wall + (elapsed.saturating_sub(self.base).as_secs_f64() * 1000.0) * self.rate
    }
}

/// A deliberately broken build of the simulated shells, to show that the checkers catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Bug {
    /// A submit is answered with the id the replica expects its entry to get, before the entry
    /// commits (as `jepsen/bugs/early-ack.patch` does to the controller).
    EarlyAck,
    /// Linearizable reads are answered from the asked replica's applied state, without
    /// confirming that it leads (`jepsen/bugs/stale-reads.patch`).
    StaleReads,
    /// The agent does not kill a `--requeue` job when its lease runs out
    /// (`jepsen/bugs/lease-fence.patch`).
    LeaseFence,
    /// The leader ends a job on any exit report of it, whatever allocation (fencing token and
    /// node) the report is of.
    NoFence,
    /// A submit retried after no answer is sent with a new request id, so that the cluster
    /// cannot know it for the same submit.
    NoDedup,
    /// The leader answers a heartbeat with a lease while it is declaring the node DOWN, and
    /// before it applied what older terms left in its log (the controller before the fix of
    /// seed 20919, `quorum_control::leader::heard::Heard`).
    EarlyLease,
    /// The scheduler counts none of an array's running tasks against its throttle, so that each
    /// cycle starts a throttle's worth more (as `jepsen/bugs/array-throttle.patch` does to the
    /// real scheduler's view).
    NoThrottle,
    /// The leader ends a preempted job's allocation as soon as it plans the preemption, as if
    /// every rank had reported its end, instead of when its agents say its processes are gone:
    /// the job that preempted it may start beside them.
    PreemptNoWait,
    /// The leader never tells an agent to freeze a job suspended by preemption, which runs on
    /// beside the job it lent its CPUs to (the hub's suspends and resumes are dropped on the way
    /// to the agents).
    NoFreeze,
    /// The scheduler's view leaves out the advance reservations, so that any job may take a
    /// reserved node in its window.
    NoReservations,
    /// The Raft log store answers appends and votes when they are written, before they are
    /// synced (as `jepsen/bugs/log-no-sync.patch` does to the real one): a power cut of every
    /// replica loses entries a majority acknowledged, and votes.
    LogNoSync,
    /// The agent starts a `--requeue` job whose launch it read after its lease ran out (it
    /// waited on the stream of a frozen node), as the agent before 3b77c20d did: the leader may
    /// have declared the node DOWN and started the job elsewhere.
    LateLaunch,
    /// Linearizable reads are openraft's `ensure_linearizable` alone, as the controller's were
    /// before 5eefcfda: a leader restored at start-up (after a power cut) may read below entries
    /// acknowledged before it.
    RestoredRead,
    /// A replica that installs a snapshot does not mark its job history incomplete, so that it
    /// never copies the records of the jobs that left the queue in the entries the snapshot
    /// replaced (a controller without `replica::catch_up`).
    HistoryGap,
    /// The agent kills a job's script and leaves its steps' tasks running (a step's tasks
    /// outside the job's cgroup): a cancelled or requeued job's step runs on after it.
    StepsOutliveJob,
}

/// A place in the simulated shells where a replica can be made to crash, as a failpoint would:
/// armed by the nemesis, the next replica to reach it crashes there and then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Point {
    /// Entries handed to the log store, before they are synced.
    Append,
    /// Committed entries about to be applied.
    Apply,
    /// A client's command committed, before the answer is sent.
    Reply,
    /// A plan that starts jobs committed, before the launches are sent.
    Launch,
    /// A snapshot received, before it is stored and installed.
    SnapshotInstall,
    /// A snapshot built, before it is stored.
    SnapshotBuild,
    /// The records of jobs that left the queue written to the history, before the rest of the
    /// entries are applied (as the controller's `history-write` failpoint).
    HistoryWrite,
}

impl Point {
    /// Without the job history: a run of the earlier workloads picks from these, so that its
    /// seeds replay as they ran.
    pub const ALL: &'static [Point] = Point::WITH_HISTORY.split_at(6).0;
    /// With the job history.
    pub const WITH_HISTORY: [Point; 7] = [
        Point::Append,
        Point::Apply,
        Point::Reply,
        Point::Launch,
        Point::SnapshotInstall,
        Point::SnapshotBuild,
        Point::HistoryWrite,
    ];
}

/// What the shells of one incarnation call at each [`Point`]: whether it crashed there.
#[derive(Clone)]
pub struct Fuse {
    world: std::sync::Weak<World>,
    id: u64,
    incarnation: u64,
}

impl Fuse {
    /// Whether the world runs broken build `bug`.
    pub fn bug(&self, bug: Bug) -> bool {
        self.world.upgrade().is_some_and(|w| w.bug(bug))
    }

    /// Crashes this incarnation if `point` is armed for it (and disarms it).
    pub fn blow(&self, point: Point) -> bool {
        let Some(world) = self.world.upgrade() else { return false };
        let armed = {
            let mut armed = world.armed.lock().unwrap_or_else(|p| p.into_inner());
            let hit = armed.get(&self.id) == Some(&point);
            if hit {
                armed.remove(&self.id);
            }
            hit
        };
        let live = world.replica(self.id).is_some_and(|r| r.incarnation == self.incarnation);
        if armed && live {
            world.crash_now(self.id, &format!("at {point:?}"));
        }
        armed && live
    }
}

/// One incarnation of a replica.
pub struct Replica {
    pub id: u64,
    pub incarnation: u64,
    pub fuse: Fuse,
    pub raft: Raft,
    pub applied: SharedApplied,
    pub kick: Arc<tokio::sync::Notify>,
    /// What this incarnation knows as leader (nothing while it follows).
    pub lead: Mutex<Option<crate::leader::Lead>>,
    /// The controller's agent hub: what this incarnation sends each node while it leads.
    pub hub: quorum_control::leader::hub::AgentHub,
    /// The agents' sessions with it.
    pub sessions: crate::session::Sessions,
    /// The steps it serves while it leads (the controller's routes).
    pub steps: quorum_control::leader::steps::StepRoutes,
    pub stop: watch::Sender<bool>,
}

pub struct World {
    pub opts: Options,
    pub start: Instant,
    pub net: Net,
    pub disks: BTreeMap<u64, SharedDisk>,
    pub replicas: Mutex<BTreeMap<u64, Arc<Replica>>>,
    clocks: Mutex<BTreeMap<u64, Clock>>,
    pub agents: BTreeMap<Host, Arc<crate::agent::Agent>>,
    events: Mutex<Vec<Event>>,
    trace: Mutex<Vec<String>>,
    pub rng: Mutex<Rng>,
    /// The crash point armed for each replica.
    pub armed: Mutex<BTreeMap<u64, Point>>,
    incarnations: std::sync::atomic::AtomicU64,
}

impl World {
    pub fn new(opts: Options) -> Arc<World> {
        let root = Rng::new(opts.seed);
        let net = Net::new(root.fork(1), opts.loss, opts.duplicate);
        let ids: Vec<u64> = (1..=opts.replicas as u64).collect();
        let disks = ids.iter().map(|&id| (id, SharedDisk::default())).collect();
        let clocks =
            ids.iter().map(|&id| (id, Clock { base: Duration::ZERO, base_wall: EPOCH_MS, rate: 1.0 })).collect();
        let agents = (1..=opts.agents as u64)
            .map(|i| {
                let agent = crate::agent::Agent::new(i, root.fork(100 + i), opts.bug);
                (crate::net::AGENT_BASE + i, Arc::new(agent))
            })
            .collect();
        Arc::new(World {
            start: Instant::now(),
            net,
            disks,
            replicas: Mutex::new(BTreeMap::new()),
            clocks: Mutex::new(clocks),
            agents,
            events: Mutex::new(Vec::new()),
            trace: Mutex::new(Vec::new()),
            rng: Mutex::new(root.fork(2)),
            armed: Mutex::new(BTreeMap::new()),
            incarnations: Default::default(),
            opts,
        })
    }

    pub fn replica_ids(&self) -> Vec<u64> {
        (1..=self.opts.replicas as u64).collect()
    }

    pub fn bug(&self, bug: Bug) -> bool {
        self.opts.bug == Some(bug)
    }

    /// The run's time in seconds: what the history records.
    pub fn now_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Replica `id`'s wall clock in milliseconds, which it stamps on commands.
    pub fn wall_ms(&self, id: u64) -> u64 {
        let clocks = self.clocks.lock().unwrap_or_else(|p| p.into_inner());
        clocks.get(&id).map_or(EPOCH_MS, |c| c.at(self.start.elapsed())).max(0.0) as u64
    }

    /// Moves replica `id`'s wall clock by `offset_ms` and sets how fast it runs from now.
    pub fn set_clock(&self, id: u64, offset_ms: f64, rate: f64) {
        let elapsed = self.start.elapsed();
        let mut clocks = self.clocks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clocks.get_mut(&id) {
            let wall = c.at(elapsed) + offset_ms;
            *c = Clock { base: elapsed, base_wall: wall, rate };
        }
    }

    pub fn between(&self, lo: u64, hi: u64) -> u64 {
        self.rng.lock().unwrap_or_else(|p| p.into_inner()).between(lo, hi)
    }

    /// A line of the run's trace, stamped with the run's time in microseconds.
    pub fn trace(&self, line: impl AsRef<str>) {
        let us = self.start.elapsed().as_micros();
        let line = format!("{us:>12} {}", line.as_ref());
        if self.opts.verbose {
            println!("{line}");
        }
        self.trace.lock().unwrap_or_else(|p| p.into_inner()).push(line);
    }

    pub fn trace_lines(&self) -> Vec<String> {
        self.trace.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn invoke(&self, process: u64, op: Op) {
        self.trace(format!("invoke {process} {}", serde_json::to_string(&op).unwrap_or_default()));
        let time = self.now_s();
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push(Event::Invoke { process, time, op });
    }

    pub fn complete(&self, process: u64, outcome: Outcome) {
        self.trace(format!("complete {process} {}", serde_json::to_string(&outcome).unwrap_or_default()));
        let time = self.now_s();
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push(Event::Complete { process, time, outcome });
    }

    pub fn nemesis(&self, what: String) {
        self.trace(format!("nemesis {what}"));
        let time = self.now_s();
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push(Event::Nemesis { time, what });
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The live incarnation of replica `id`.
    pub fn replica(&self, id: u64) -> Option<Arc<Replica>> {
        self.replicas.lock().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }

    pub fn alive(&self) -> Vec<Arc<Replica>> {
        self.replicas.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// The replica that says it leads with the highest term, if any.
    pub fn leader(&self) -> Option<Arc<Replica>> {
        self.alive()
            .into_iter()
            .filter(|r| {
                let m = r.raft.metrics().borrow().clone();
                m.current_leader == Some(r.id) && m.running_state.is_ok()
            })
            .max_by_key(|r| r.raft.metrics().borrow().current_term)
    }

    /// Starts replica `id` on its disk (a new cluster's first start, or after a crash).
    pub async fn start_replica(self: &Arc<Self>, id: u64, initialize: bool) -> anyhow::Result<()> {
        let disk = self.disks[&id].clone();
        let incarnation = self.incarnations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let fuse = Fuse { world: Arc::downgrade(self), id, incarnation };
        let machine = Machine::open(disk.clone(), fuse.clone())?;
        let applied = machine.applied.clone();
        let kick = machine.kick.clone();
        let config = openraft::Config {
            cluster_name: "quorum-sim".into(),
            heartbeat_interval: 100,
            election_timeout_min: 500,
            election_timeout_max: 1000,
            install_snapshot_timeout: 2000,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.opts.snapshot_every),
            max_in_snapshot_log_to_keep: 20,
            purge_batch_size: 1,
            ..Default::default()
        }
        .validate()?;
        let network = SimNetwork { world: Arc::downgrade(self), from: id };
        let raft = Raft::new(
            id,
            Arc::new(config),
            network,
            LogStore::open(disk, fuse.clone(), self.bug(Bug::LogNoSync)),
            machine,
        )
        .await?;
        if initialize {
            let members: BTreeMap<u64, BasicNode> =
                self.replica_ids().into_iter().map(|r| (r, BasicNode::new(format!("r{r}")))).collect();
            if let Err(e) = raft.initialize(members).await {
                self.trace(format!("r{id} initialize: {e}"));
            }
        }
        let (stop, stopped) = watch::channel(false);
        let replica = Arc::new(Replica {
            id,
            incarnation,
            fuse,
            raft,
            applied,
            kick,
            lead: Mutex::new(None),
            hub: crate::session::hub(),
            sessions: Mutex::new(BTreeMap::new()),
            steps: Default::default(),
            stop,
        });
        self.replicas.lock().unwrap_or_else(|p| p.into_inner()).insert(id, replica.clone());
        if self.opts.keeps_history() {
            tokio::spawn(crate::history::purge_loop(self.clone(), replica.clone(), stopped.clone()));
            tokio::spawn(crate::history::catch_up(self.clone(), replica.clone(), stopped.clone()));
        }
        tokio::spawn(crate::leader::duties(self.clone(), replica, stopped));
        self.trace(format!("r{id} started"));
        Ok(())
    }

    /// Crashes replica `id` at once: nothing reaches it any more, its disk keeps what it synced
    /// (and a torn part of the rest), and nothing it had begun completes; its tasks are stopped
    /// after.
    pub fn crash_now(&self, id: u64, why: &str) {
        let Some(replica) = self.replicas.lock().unwrap_or_else(|p| p.into_inner()).remove(&id) else { return };
        let _ = replica.stop.send(true);
        let keep = self.between(0, 2) as usize;
        let lost = disk::lock(&self.disks[&id]).crash(keep);
        self.trace(format!("r{id} crashed {why}, {lost} unsynced entries lost"));
        tokio::spawn(async move {
            let _ = replica.raft.shutdown().await;
        });
    }
}

#[derive(Debug)]
struct SimError(String);

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SimError {}

/// openraft's network: each RPC crosses the simulated network to the target's live incarnation
/// and back. A lost or cut message is a deadline missed (a network error, retried at once, as
/// the real network's is), never `Unreachable`.
pub struct SimNetwork {
    world: std::sync::Weak<World>,
    from: u64,
}

pub struct SimConnection {
    world: std::sync::Weak<World>,
    from: u64,
    to: u64,
}

impl RaftNetworkFactory<SimConfig> for SimNetwork {
    type Network = SimConnection;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Self::Network {
        SimConnection { world: self.world.clone(), from: self.from, to: target }
    }
}

impl SimConnection {
    /// Carries `request` to the target, runs `call` with it there, and carries the answer back,
    /// within `ttl`. When `duplicable`, the request is now and then delivered twice (the copy
    /// later, its answer unread). A lost or cut message is the deadline missed.
    async fn rpc<Req, T, E, F, Fut>(
        &self,
        ttl: Duration,
        request: Req,
        duplicable: bool,
        call: F,
    ) -> Result<T, RPCError<u64, BasicNode, E>>
    where
        Req: Clone + Send + 'static,
        T: Send + 'static,
        E: std::error::Error + Send + 'static,
        F: Fn(Raft, Req) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = Result<T, E>> + Send + 'static,
    {
        let lost = || {
            let e = SimError(format!("r{} -> r{}: no answer in time", self.from, self.to));
            RPCError::Network(NetworkError::new(&e))
        };
        let Some(world) = self.world.upgrade() else { return Err(lost()) };
        let (from, to) = (self.from, self.to);
        let trip = async move {
            if !world.net.hop(from, to).await {
                return futures::future::pending().await;
            }
            let Some(target) = world.replica(to) else { return futures::future::pending().await };
            if duplicable && world.net.chance(world.net.duplicate) {
                let (w, raft, copy, again) = (world.clone(), target.raft.clone(), request.clone(), call.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(w.net.delay()).await;
                    let _ = again(raft, copy).await;
                });
            }
            let answer = call(target.raft.clone(), request).await;
            if !world.net.hop(to, from).await {
                return futures::future::pending().await;
            }
            answer
        };
        match tokio::time::timeout(ttl, trip).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(RPCError::RemoteError(RemoteError::new(to, e))),
            Err(_) => Err(lost()),
        }
    }
}

impl RaftNetwork<SimConfig> for SimConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<SimConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.rpc(option.hard_ttl(), rpc, true, |raft: Raft, r| async move { raft.append_entries(r).await }).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<SimConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>> {
        self.rpc(option.hard_ttl(), rpc, false, |raft: Raft, r| async move { raft.install_snapshot(r).await }).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.rpc(option.hard_ttl(), rpc, true, |raft: Raft, r| async move { raft.vote(r).await }).await
    }
}
