//! The scheduler's input, copied out of the state at one applied index: nodes with their
//! capacity and what is free now, running jobs with their expected ends, pending jobs with
//! their dependencies already resolved, and the account tree.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use quorum_model::{Account, HoldKind, Job, JobId, JobSpec, JobState, Millis, Node, PendingReason, Qos, Shared, Usage};
use quorum_state::ClusterState;

/// An amount of CPUs, memory (MiB) and GPUs. Signed so that reservations can be subtracted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Res {
    pub cpus: i64,
    pub mem: i64,
    pub gpus: i64,
}

impl Res {
    pub fn fits(&self, req: &Res) -> bool {
        self.cpus >= req.cpus && self.mem >= req.mem && self.gpus >= req.gpus
    }
    pub fn plus(&self, o: &Res) -> Res {
        Res { cpus: self.cpus + o.cpus, mem: self.mem + o.mem, gpus: self.gpus + o.gpus }
    }
    pub fn minus(&self, o: &Res) -> Res {
        Res { cpus: self.cpus - o.cpus, mem: self.mem - o.mem, gpus: self.gpus - o.gpus }
    }
    pub fn min(&self, o: &Res) -> Res {
        Res { cpus: self.cpus.min(o.cpus), mem: self.mem.min(o.mem), gpus: self.gpus.min(o.gpus) }
    }
    pub fn non_negative(&self) -> bool {
        self.cpus >= 0 && self.mem >= 0 && self.gpus >= 0
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub schedulable: bool,
    /// Lower first, all else equal (Slurm's node `Weight`).
    pub weight: u32,
    pub features: Vec<String>,
    /// The switch the node hangs off, when a topology is configured.
    pub switch: Option<String>,
    /// What it has, its CPUs counted in [`ClusterView::cpu_parts`] parts each.
    pub capacity: Res,
    /// Every GPU as (index, type).
    pub gpus: Vec<(u32, String)>,
    /// Indices of the GPUs free now.
    pub free_gpus: Vec<u32>,
    /// The type of every GPU when they are all of one type (the usual case), which lets
    /// placement skip per-GPU type checks.
    pub uniform_gpu_type: Option<String>,
    /// What ended allocations still hold here while their processes are killed
    /// (`Node::completing`), CPUs in parts: not free now, planned free in a second.
    pub completing: Res,
}

impl NodeView {
    pub fn gpu_count(&self, gpu_type: Option<&str>) -> i64 {
        match (gpu_type, &self.uniform_gpu_type) {
            (None, _) => self.gpus.len() as i64,
            (Some(w), Some(u)) => {
                if w == u {
                    self.gpus.len() as i64
                } else {
                    0
                }
            }
            (Some(w), None) => self.gpus.iter().filter(|(_, t)| w == t).count() as i64,
        }
    }
}

/// The single type shared by all `gpus`, if there is one.
pub fn uniform_type(gpus: &[(u32, String)]) -> Option<String> {
    let first = &gpus.first()?.1;
    gpus.iter().all(|(_, t)| t == first).then(|| first.clone())
}

/// Where and when backfill expects a pending job to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub start_ms: Millis,
    pub nodes: Vec<String>,
    /// The start it was given when first reserved, kept while it waits
    /// ([`ClusterView::promised`]). Planned on predictions, a reservation slips when jobs
    /// outlive theirs; once it has slipped by more than the wait this promised, the cycle plans
    /// on limits (see [`ClusterView::late`]).
    pub promised_ms: Millis,
}

/// A running job: what it holds where, and when it will have ended at the latest.
#[derive(Clone, Debug, PartialEq)]
pub struct RunningJob {
    pub id: JobId,
    pub user: String,
    pub account: String,
    pub qos: String,
    /// Seconds since the epoch; `u64::MAX` when it has no time limit.
    pub end_s: u64,
    /// With predictions (`Policy::predict`): when it is predicted to end, before `end_s`. Once
    /// past, it is planned to its limit again ([`quorum_model::predict::running_s`]).
    pub predicted_end_s: Option<u64>,
    /// What it holds on each node, CPUs in the nodes' parts ([`RunningJob::cpu_parts`] per CPU).
    pub alloc: Vec<(usize, Res)>,
    /// How many of a node's CPU parts each of its CPUs takes: [`ClusterView::cpu_parts`]
    /// divided by the ways it shares them.
    pub cpu_parts: i64,
    /// GPUs held, by type.
    pub gpus_by_type: Vec<(String, i64)>,
    /// Licenses held (`--licenses`).
    pub licenses: Vec<(String, u32)>,
    pub partition: String,
    /// When it started, in seconds since the epoch.
    pub start_s: u64,
    /// Being stopped for another job: `end_s` is then at most its grace after that began.
    pub preempting: bool,
    /// Suspended by an operator: it holds its allocation with no end in sight.
    pub suspended: bool,
    /// Suspended by preemption (mode SUSPEND): `alloc` holds its memory and GPUs with no end in
    /// sight, and these are the CPUs per node it lent, which it takes back when resumed.
    pub lent_cpus: Vec<(usize, i64)>,
    /// What is left of its time limit once resumed (when it lent its CPUs); `u64::MAX`: none.
    pub left_s: u64,
    /// What it is charged for fairshare while it runs.
    pub charge: Charge,
}

/// What a running job is charged for fairshare as it runs, as Slurm charges running jobs every
/// `PriorityCalcPeriod`: the billed TRES-seconds it has run so far, which are what its account
/// and user are charged when it ends (`quorum_state`'s `charge_usage`), so that its owner's
/// fairshare falls while it runs and does not jump when it ends. From the view's `now` (the
/// leader-stamped time of the cycle), never a clock read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charge {
    /// The CPUs and GPUs of its allocation (all of them, as its end charges them).
    pub cpus: u64,
    pub gpus: u64,
    /// Its start, moved later by the time it spent suspended before, in ms.
    pub from_ms: Millis,
    /// Suspended since (its time suspended is not charged).
    pub until_ms: Option<Millis>,
    /// Its time limit: it is not counted past it (its agent kills it there).
    pub limit_ms: Option<Millis>,
}

impl Charge {
    /// The billed TRES-seconds it has run by `now` ([`Policy::billed`]).
    pub fn billed_at(&self, now: Millis, policy: &quorum_model::Policy) -> f64 {
        let end = self.until_ms.map_or(now, |until| until.min(now));
        let ran = end.saturating_sub(self.from_ms);
        let seconds = self.limit_ms.map_or(ran, |limit| ran.min(limit)) as f64 / 1000.0;
        policy.billed(self.cpus, self.gpus) as f64 * seconds
    }
}

/// How long past its grace time a preempted job is planned to hold its nodes: the SIGKILL,
/// and its end reaching the leader.
pub const PREEMPT_SLACK_S: u64 = 5;

/// Where a job's dependencies stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DepStatus {
    Satisfied,
    Waiting,
    Never,
    /// Its dependencies are met, but as many tasks of its array run (or are let start this
    /// cycle) as the array's throttle allows.
    ArrayThrottled,
}

/// A name many pending jobs carry (user, account, QOS, partition, GPU type): one shared copy
/// per distinct name instead of a string per job, as the leader keeps a million of them.
pub type Name = Arc<str>;

#[derive(Clone, Debug, PartialEq)]
pub struct PendingJob {
    pub id: JobId,
    pub user: Name,
    pub account: Name,
    pub qos: Name,
    pub partition: Name,
    pub submit_ms: Millis,
    pub begin_ms: Option<Millis>,
    pub nodes: u32,
    /// One node's share, its CPUs in the nodes' parts ([`PendingJob::cpu_parts`] per CPU).
    pub per_node: Res,
    /// How many of a node's CPU parts each of its CPUs takes (see [`RunningJob::cpu_parts`]).
    pub cpu_parts: i64,
    pub gpu_type: Option<Name>,
    pub time_limit_s: Option<u64>,
    /// With predictions (`Policy::predict`): how long it is planned to run, from its user's
    /// recent run times, less than its limit; `None`: its limit.
    pub plan_s: Option<u64>,
    pub nice: i32,
    pub exclusive: bool,
    pub features: Vec<String>,
    /// `features` joined by `|`: a node needs one of them.
    pub features_any: bool,
    /// `[a|b]`: with `features_any`, every node of the job has the same one of them.
    pub features_same: bool,
    /// `[a*2&b*4]`: when not empty, one count per feature of `features`: the job needs that
    /// many nodes with each, no node counted twice, and asks nothing of its other nodes.
    pub feature_counts: Vec<u32>,
    /// Set by an operator (`--priority`): this, not the computed priority.
    pub priority: Option<u32>,
    /// Licenses it holds while it runs (`--licenses`).
    pub licenses: Vec<(String, u32)>,
    /// Nodes it must not have (`--exclude`).
    pub exclude: Vec<String>,
    /// The nodes it must have, all of them (`--nodelist`); empty: any.
    pub only: Vec<String>,
    pub held: Option<HoldKind>,
    pub dependency: DepStatus,
    /// With `after:ID+MINUTES`: the dependencies are met, but not before this time.
    pub dependency_ready_ms: Option<Millis>,
    /// The reason the state shows now.
    pub reason: PendingReason,
    /// The nodes it preempted jobs for, held for it until it starts (empty: none).
    pub claim: Vec<String>,
    /// The advance reservation it runs in (`--reservation`).
    pub reservation: Option<Name>,
    /// A heterogeneous job's components after the first (it is component 0), each as a job of
    /// its own resources: all start together, on nodes none of the others has.
    pub het: Vec<PendingJob>,
}

/// How many jobs ahead of the one in hand a stage that walks the queue asks for a job's record
/// ([`PendingJob::prefetch`]).
const PREFETCH_AHEAD: usize = 12;

/// For a stage walking `list` in order, at `at`: asks for the record of the job a few entries
/// further on ([`PendingJob::prefetch`]); `job` finds an entry's job.
#[inline]
pub(crate) fn prefetch_ahead<'l, T>(list: &'l [T], at: usize, job: impl Fn(&'l T) -> &'l PendingJob) {
    if let Some(entry) = list.get(at + PREFETCH_AHEAD) {
        job(entry).prefetch();
    }
}

impl PendingJob {
    /// Asks the CPU to bring this job's record into its cache, for a stage that will read it a
    /// few jobs from now. A cycle over 100,000 pending jobs waits on memory more than it
    /// computes: each record lies apart from the last, so screening and placing stall on every
    /// job's first read unless it was asked for ahead (benches/RESULTS.md, "What a cycle keeps
    /// for the next"). A hint only: it reads nothing the program sees, and does nothing where the
    /// CPU has no such instruction.
    #[inline]
    pub(crate) fn prefetch(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let start = (self as *const PendingJob).cast::<i8>();
            for offset in (0..std::mem::size_of::<PendingJob>()).step_by(64) {
                // SAFETY: a prefetch loads nothing into the program and cannot fault, whatever
                // the address; this one is inside the job's own record.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) }
            }
        }
    }

    /// Its components: itself, then those of a heterogeneous job.
    pub fn components(&self) -> impl Iterator<Item = &PendingJob> {
        std::iter::once(self).chain(self.het.iter())
    }

    /// Since when it may start: its submit, or its begin time when that is later.
    pub fn eligible_ms(&self) -> Millis {
        self.begin_ms.unwrap_or(0).max(self.submit_ms)
    }

    /// How long to plan for: the prediction, or the time limit, or forever.
    pub fn duration_s(&self) -> u64 {
        self.plan_s.or(self.time_limit_s).unwrap_or(u64::MAX / 4).max(1)
    }
    /// How long it may run: its time limit, or forever.
    pub fn limit_s(&self) -> u64 {
        self.time_limit_s.unwrap_or(u64::MAX / 4).max(1)
    }
    /// The CPUs it asks for in all (whole CPUs, not parts).
    pub fn total_cpus(&self) -> i64 {
        self.cpus_per_node() * i64::from(self.nodes)
    }
    /// The CPUs it asks for on each node (whole CPUs, not parts).
    pub fn cpus_per_node(&self) -> i64 {
        self.per_node.cpus / self.cpu_parts.max(1)
    }
    pub fn total_gpus(&self) -> i64 {
        self.per_node.gpus * i64::from(self.nodes)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct PartitionView {
    pub name: String,
    /// Indices into `nodes`, in name order.
    pub nodes: Vec<usize>,
    pub tier: u32,
    pub max_time_s: Option<u64>,
    pub max_nodes: Option<u32>,
    pub exclusive: bool,
    /// Whether its jobs share CPUs.
    pub oversubscribe: quorum_model::oversubscribe::OverSubscribe,
    /// What becomes of its jobs when preempted (`None`: the cluster's default).
    pub preempt_mode: Option<quorum_model::preempt::PreemptMode>,
    /// Seconds between a preempted job's SIGTERM and SIGKILL.
    pub grace_s: u64,
    /// Which accounts and QOS it admits.
    pub access: quorum_model::PartitionAccess,
    /// Why its jobs may not start (it is DOWN or INACTIVE), if they may not.
    pub holds_back: Option<quorum_model::PendingReason>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    /// In name order ([`ClusterView::node_index`] searches them).
    pub nodes: Vec<Arc<NodeView>>,
    pub partitions: BTreeMap<String, PartitionView>,
    pub running: Vec<Arc<RunningJob>>,
    /// In job id order.
    pub pending: Vec<Arc<PendingJob>>,
    /// The parts each CPU is counted in on the nodes' books: the least common multiple of the
    /// ways the partitions share CPUs (`OverSubscribe`), so that a job sharing its CPUs N ways
    /// takes a whole number of parts (1/N of a CPU each) and the no-overcommit rule stays
    /// integer sums; 1 (or 0, the same) when no partition shares.
    pub cpu_parts: i64,
    /// Some partition shares CPUs (`OverSubscribe` other than NO).
    pub oversubscribed: bool,
    /// Shared with the state: taking a view copies none of these.
    pub accounts: Shared<BTreeMap<String, Account>>,
    pub qos: Shared<BTreeMap<String, Qos>>,
    pub usage: Shared<BTreeMap<String, Usage>>,
    /// Usage by account, then user; and by QOS.
    pub user_usage: Shared<BTreeMap<String, BTreeMap<String, Usage>>>,
    pub qos_usage: Shared<BTreeMap<String, Usage>>,
    /// The previous cycle's reservations. A job keeps its reserved nodes while they still hold
    /// it no later than any others, so that a reservation never moves because best fit broke a
    /// tie differently.
    pub previous: BTreeMap<JobId, Estimate>,
    /// The start each waiting job was first promised by a reservation, kept while it waits,
    /// whether it holds a reservation now or not (a job of higher priority may take the one it
    /// had): [`crate::promises`] of the previous cycle.
    pub promised: BTreeMap<JobId, Millis>,
    /// The cluster's licenses and how many of each there are.
    pub licenses: BTreeMap<String, u32>,
    /// Advance reservations, in name order.
    pub reservations: Vec<quorum_model::reservation::Reservation>,
}

/// A job's predicted run time from its user's recent runs (those of its time limit where there
/// are some: [`quorum_state::ClusterState::runs_for`]), when there are some and it is shorter
/// than its limit (otherwise the limit is what is planned).
fn shorter_prediction(recent: Option<&quorum_model::predict::RecentRuns>, limit_s: Option<u64>) -> Option<u64> {
    quorum_model::predict::predicted_s(Some(recent?), limit_s).filter(|&p| limit_s.is_none_or(|l| p < l))
}

/// Whether a pending job, or one of its components, is planned on a prediction.
fn predicted(j: &Arc<PendingJob>) -> bool {
    j.components().any(|c| c.plan_s.is_some())
}

/// FNV-1a: a fast hash for the short node names looked up while taking a view (no
/// adversary chooses them, so a keyed hash buys nothing).
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 { 0xcbf2_9ce4_8422_2325 } else { self.0 };
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0 = h;
    }
}

fn res_of(cpus: u32, mem_mb: u64, gpus: usize) -> Res {
    Res { cpus: i64::from(cpus), mem: mem_mb as i64, gpus: gpus as i64 }
}

/// Parts of the last view that the next one reuses while what they came from is unchanged:
/// nodes, running jobs (by allocation) and pending jobs. A steady cluster's view then costs a
/// comparison per node and a reference count per job instead of copies. The leader and the
/// simulator keep one across cycles; any view built with it equals one built without.
#[derive(Debug, Default)]
pub struct ViewCache {
    nodes: Vec<Arc<NodeView>>,
    running: BTreeMap<JobId, CachedRunning>,
    /// Job → (generation last used, entry, the spec it was made from): a job changed
    /// (`scontrol update`) has another spec, and gets a new entry.
    pending: BTreeMap<JobId, (u64, Arc<PendingJob>, Shared<JobSpec>)>,
    names: Names,
    generation: u64,
    /// The view's `cpu_parts` its running entries were made with.
    cpu_parts: i64,
}

/// A running job's cached view entry, and what it was made from.
#[derive(Debug)]
struct CachedRunning {
    alloc_index: u64,
    /// The generation that last used it.
    used: u64,
    entry: Arc<RunningJob>,
    spec: Shared<JobSpec>,
    /// The end of the reservation window it runs in.
    resv_end: Option<Millis>,
}

fn free_gpus(node: &Node) -> impl Iterator<Item = u32> + '_ {
    node.gpus.iter().map(|g| g.index).filter(|i| !node.alloc_gpus.contains(i))
}

/// Whether a cached node view still describes `node`.
fn node_matches(v: &NodeView, node: &Node, switch: Option<&String>, parts: i64) -> bool {
    v.name == node.name
        && v.schedulable == node.schedulable()
        && v.weight == node.weight
        && v.capacity == in_parts(res_of(node.cpus, node.mem_mb, node.gpus.len()), parts)
        && v.features == node.features
        && v.switch.as_ref() == switch
        && v.gpus.len() == node.gpus.len()
        && v.gpus.iter().zip(&node.gpus).all(|((i, t), g)| *i == g.index && *t == g.gpu_type)
        && v.free_gpus.iter().copied().eq(free_gpus(node))
        && v.completing == completing(node, parts)
}

/// What ended allocations still hold on `node` ([`NodeView::completing`]), each one's CPUs
/// counted as a running job's are.
fn completing(node: &Node, parts: i64) -> Res {
    node.completing.iter().fold(Res::default(), |sum, c| {
        let held = res_of(c.cpus, c.mem_mb, c.gpus.len());
        sum.plus(&Res { cpus: held.cpus * cpu_parts_per_cpu(parts, c.ways), ..held })
    })
}

/// How many of a node's `parts` parts each CPU shared `ways` ways takes. A share the parts do
/// not divide (its partition changed since it started) is booked as not shared: more than it
/// holds, never less.
fn cpu_parts_per_cpu(parts: i64, ways: u32) -> i64 {
    let ways = i64::from(ways.max(1));
    if parts % ways == 0 {
        parts / ways
    } else {
        parts
    }
}

/// `res` with its CPUs counted in `parts` parts each.
fn in_parts(res: Res, parts: i64) -> Res {
    Res { cpus: res.cpus.saturating_mul(parts), ..res }
}

fn node_view(node: &Node, switch: Option<&String>, parts: i64) -> NodeView {
    let gpus: Vec<(u32, String)> = node.gpus.iter().map(|g| (g.index, g.gpu_type.clone())).collect();
    NodeView {
        name: node.name.clone(),
        schedulable: node.schedulable(),
        weight: node.weight,
        features: node.features.clone(),
        switch: switch.cloned(),
        capacity: in_parts(res_of(node.cpus, node.mem_mb, node.gpus.len()), parts),
        uniform_gpu_type: uniform_type(&gpus),
        gpus,
        free_gpus: free_gpus(node).collect(),
        completing: completing(node, parts),
    }
}

fn running_job(
    state: &ClusterState,
    j: &Job,
    a: &quorum_model::Allocation,
    by_name: &HashMap<&str, usize, BuildHasherDefault<Fnv>>,
    parts: i64,
    predicted_end_s: Option<u64>,
) -> RunningJob {
    let cpu_parts = cpu_parts_per_cpu(parts, a.ways());
    let start_s = j.start_time.unwrap_or(state.clock) / 1000;
    let mut end_s = match j.limit_from_start_s() {
        Some(limit) if j.state != JobState::Suspended => start_s.saturating_add(limit),
        _ => u64::MAX,
    };
    if let Some(p) = j.preempting.as_ref().filter(|p| p.mode.stops()) {
        end_s = end_s.min((p.at / 1000).saturating_add(p.grace_s).saturating_add(PREEMPT_SLACK_S));
    }
    let lends = j.lends_cpus();
    // What it ran before it was suspended (its earlier pauses do not count).
    let left_s = match (lends, j.limit_from_start_s(), j.start_time, j.suspended_at) {
        (true, Some(limit), Some(start), Some(since)) => {
            let ran_ms = since.saturating_sub(start).saturating_sub(j.suspended_ms);
            limit.saturating_sub(j.suspended_ms / 1000).saturating_sub(ran_ms / 1000).max(1)
        }
        _ => u64::MAX,
    };
    let mut gpus_by_type: Vec<(String, i64)> = Vec::new();
    for n in a.nodes.iter().filter(|n| !n.gpus.is_empty()) {
        let Some(node) = state.nodes.get(&n.node) else { continue };
        for idx in &n.gpus {
            if let Some(g) = node.gpus.iter().find(|g| g.index == *idx) {
                match gpus_by_type.iter_mut().find(|(t, _)| *t == g.gpu_type) {
                    Some((_, c)) => *c += 1,
                    None => gpus_by_type.push((g.gpu_type.clone(), 1)),
                }
            }
        }
    }
    RunningJob {
        gpus_by_type,
        licenses: j.spec.licenses.iter().map(|(n, c)| (n.clone(), *c)).collect(),
        id: j.id,
        user: j.user.clone(),
        account: j.account.clone(),
        qos: j.qos.clone(),
        partition: j.partition.clone(),
        start_s,
        preempting: j.preempting.is_some(),
        suspended: j.state == JobState::Suspended,
        end_s,
        predicted_end_s: predicted_end_s.filter(|&p| p < end_s),
        alloc: a
            .nodes
            .iter()
            .filter_map(|n| {
                let cpus = if lends { 0 } else { n.cpus };
                by_name.get(n.node.as_str()).map(|&i| (i, in_parts(res_of(cpus, n.mem_mb, n.gpus.len()), cpu_parts)))
            })
            .collect(),
        cpu_parts,
        lent_cpus: a
            .nodes
            .iter()
            .filter(|_| lends)
            .filter_map(|n| by_name.get(n.node.as_str()).map(|&i| (i, i64::from(n.cpus) * cpu_parts)))
            .collect(),
        left_s,
        charge: Charge {
            cpus: a.nodes.iter().map(|n| u64::from(n.cpus)).sum(),
            gpus: a.nodes.iter().map(|n| n.gpus.len() as u64).sum(),
            from_ms: j.start_time.unwrap_or(state.clock).saturating_add(j.suspended_ms),
            until_ms: j.suspended_at,
            limit_ms: j.limit_from_start_s().map(|s| s.saturating_mul(1000).saturating_sub(j.suspended_ms)),
        },
    }
}

/// One shared [`Name`] per distinct string.
#[derive(Debug, Default)]
struct Names(std::collections::HashSet<Name>);

impl Names {
    fn get(&mut self, s: &str) -> Name {
        if let Some(n) = self.0.get(s) {
            return n.clone();
        }
        let n: Name = s.into();
        self.0.insert(n.clone());
        n
    }
}

fn pending_job(
    j: &Job,
    (dependency, dependency_ready_ms): (DepStatus, Option<Millis>),
    names: &mut Names,
    (cpu_parts, exclusive): (i64, bool),
    honours: bool,
) -> PendingJob {
    let job = requested(&j.spec, names);
    let mut job = PendingJob {
        per_node: in_parts(job.per_node, cpu_parts),
        cpu_parts,
        exclusive,
        id: j.id,
        user: names.get(&j.user),
        account: names.get(&j.account),
        qos: names.get(&j.qos),
        partition: names.get(&j.partition),
        submit_ms: j.submit_time,
        held: j.held,
        dependency,
        dependency_ready_ms,
        reason: j.reason,
        claim: j.claim.as_ref().map(|c| c.nodes.clone()).unwrap_or_default(),
        ..job
    };
    job.het = booked(&job, cpu_parts, honours);
    job
}

/// A heterogeneous job's other components, booked as the job is: CPUs in the same parts, and
/// whole nodes where they ask for them and the partition `honours` `--exclusive`; each the
/// job's (its id, user, account, QOS), so that limits count what it holds as the job's.
fn booked(job: &PendingJob, cpu_parts: i64, honours: bool) -> Vec<PendingJob> {
    job.het
        .iter()
        .map(|c| PendingJob {
            per_node: in_parts(c.per_node, cpu_parts),
            cpu_parts,
            exclusive: c.exclusive && honours,
            id: job.id,
            user: job.user.clone(),
            account: job.account.clone(),
            qos: job.qos.clone(),
            // Its own partition (the job's unless it names another).
            submit_ms: job.submit_ms,
            ..c.clone()
        })
        .collect()
}

/// What a spec asks of the scheduler; who and when are left to the caller.
fn requested(spec: &JobSpec, names: &mut Names) -> PendingJob {
    let het = (1..spec.components()).filter_map(|k| spec.component(k)).map(|c| requested(&c, names)).collect();
    PendingJob {
        het,
        id: 0,
        user: names.get(""),
        account: names.get(spec.account.as_deref().unwrap_or_default()),
        qos: names.get(spec.qos.as_deref().unwrap_or_default()),
        partition: names.get(spec.partition.as_deref().unwrap_or_default()),
        submit_ms: 0,
        begin_ms: spec.begin_time,
        nodes: spec.nodes,
        per_node: res_of(spec.cpus_per_node(), spec.mem_per_node_mb.unwrap_or(0), spec.gpus_per_node as usize),
        cpu_parts: 1,
        gpu_type: spec.gpu_type.as_deref().map(|g| names.get(g)),
        time_limit_s: spec.time_limit_s,
        plan_s: None,
        nice: spec.nice,
        exclusive: spec.exclusive,
        features: spec.constraint.clone(),
        features_any: spec.constraint_any,
        features_same: spec.constraint_same,
        // One node with one counted feature is that feature on its node.
        feature_counts: match spec.nodes {
            1 => Vec::new(),
            _ => spec.constraint_counts.clone(),
        },
        priority: spec.priority,
        licenses: spec.licenses.iter().map(|(n, c)| (n.clone(), *c)).collect(),
        exclude: spec.exclude.clone(),
        only: spec.nodelist.clone(),
        held: None,
        dependency: DepStatus::Satisfied,
        dependency_ready_ms: None,
        reason: PendingReason::None,
        claim: Vec::new(),
        reservation: spec.reservation.as_deref().map(|r| names.get(r)),
    }
}

impl PendingJob {
    /// A job that is not submitted, as the scheduler would see it in `view` were it submitted
    /// by `user` at `now_ms` and given `id` (`sbatch --test-only`): `spec` as admission leaves
    /// it, its partition, account and QOS resolved; no hold and no dependency.
    pub fn hypothetical(view: &ClusterView, id: JobId, spec: &JobSpec, user: &str, now_ms: Millis) -> PendingJob {
        let mut names = Names::default();
        let job = requested(spec, &mut names);
        let (cpu_parts, exclusive) =
            view.cpu_booking(spec.partition.as_deref().unwrap_or_default(), spec.oversubscribe, spec.exclusive);
        let honours = view.cpu_booking(spec.partition.as_deref().unwrap_or_default(), spec.oversubscribe, true).1;
        let mut job = PendingJob {
            id,
            user: names.get(user),
            submit_ms: now_ms,
            per_node: in_parts(job.per_node, cpu_parts),
            cpu_parts,
            exclusive,
            ..job
        };
        job.het = booked(&job, cpu_parts, honours);
        job
    }
}

impl ClusterView {
    /// Whether one of `estimates` has slipped later than the start it first promised by more
    /// than the wait that promised: its job will have waited over twice as long as it was told.
    /// Planned on predictions, a reservation slips whenever a job outlives its prediction, and
    /// the nodes that frees go to jobs backfilled on their predictions; a job needing many nodes
    /// can so wait for ever (44 days on RICC). [`crate::schedule`] then plans the cycle on
    /// limits ([`ClusterView::on_limits`]): only what already runs can push that job later,
    /// and only to its limits, as in EASY on limits. The cycles after it are planned on limits
    /// too while the last one's reservations are late ([`ClusterView::previous`]): until that
    /// job starts, or until limits no longer put it that late. Going back to predictions sooner
    /// lets the jobs backfilled on them push it later again. Slips of a few minutes are common,
    /// so a smaller one keeps the predictions.
    pub fn late(&self, estimates: &BTreeMap<JobId, Estimate>) -> bool {
        estimates.iter().any(|(&id, e)| self.late_one(id, e))
    }

    /// Whether job `id`'s reservation `e` is late ([`ClusterView::late`]).
    pub(crate) fn late_one(&self, id: JobId, e: &Estimate) -> bool {
        let Ok(k) = self.pending.binary_search_by_key(&id, |j| j.id) else {
            return false;
        };
        let promised_wait = e.promised_ms.saturating_sub(self.pending[k].eligible_ms());
        e.start_ms > e.promised_ms.saturating_add(promised_wait)
    }

    /// Whether some job, running or pending, is planned on a prediction rather than its limit.
    pub fn predicts(&self) -> bool {
        self.running.iter().any(|r| r.predicted_end_s.is_some())
            || self.pending.iter().enumerate().any(|(k, j)| {
                prefetch_ahead(&self.pending, k, |j| j);
                predicted(j)
            })
    }

    /// The same view planned on time limits: every running job to its limit, every pending
    /// job for its limit; `None` when no job is planned on a prediction.
    pub fn on_limits(&self) -> Option<ClusterView> {
        self.predicts().then(|| self.without_predictions())
    }

    /// [`ClusterView::on_limits`] for a view known to plan some job on a prediction.
    pub(crate) fn without_predictions(&self) -> ClusterView {
        let mut view = self.clone();
        for r in view.running.iter_mut().filter(|r| r.predicted_end_s.is_some()) {
            *r = Arc::new(RunningJob { predicted_end_s: None, ..(**r).clone() });
        }
        for j in view.pending.iter_mut().filter(|j| predicted(j)) {
            let het = j.het.iter().map(|c| PendingJob { plan_s: None, ..c.clone() }).collect();
            *j = Arc::new(PendingJob { plan_s: None, het, ..(**j).clone() });
        }
        view
    }

    pub fn from_state(state: &ClusterState) -> Self {
        Self::from_state_cached(state, &mut ViewCache::default())
    }

    /// The same view as [`ClusterView::from_state`], reusing what `cache` kept from the last one.
    pub fn from_state_cached(state: &ClusterState, cache: &mut ViewCache) -> Self {
        Self::build(state, cache, state.policy.predict)
    }

    /// A view whose jobs are planned on predicted run times (each user's recent runs, capped by
    /// the limits) whatever the policy says: what forecasts are made on ([`crate::forecast`])
    /// while the schedule stays on limits. Its own `cache`, not the schedule's.
    pub fn from_state_predicting(state: &ClusterState, cache: &mut ViewCache) -> Self {
        Self::build(state, cache, true)
    }

    fn build(state: &ClusterState, cache: &mut ViewCache, predict: bool) -> Self {
        cache.generation += 1;
        let generation = cache.generation;
        let common = state
            .partitions
            .values()
            .try_fold(1, |l, p| quorum_model::oversubscribe::common_ways(l, u64::from(p.oversubscribe.max_ways())));
        let parts = common.map_or(1, |l| l as i64);
        if cache.cpu_parts != parts {
            cache.running.clear();
            cache.cpu_parts = parts;
        }
        let mut view = ClusterView {
            cpu_parts: parts,
            oversubscribed: state.partitions.values().any(|p| !p.oversubscribe.is_no()),
            licenses: state.licenses.clone(),
            reservations: state.reservations.values().cloned().collect(),
            accounts: state.accounts.clone(),
            qos: state.qos.clone(),
            usage: state.usage.clone(),
            user_usage: state.user_usage.clone(),
            qos_usage: state.qos_usage.clone(),
            ..ClusterView::default()
        };
        // Node indices change when the set of nodes does; cached running jobs hold indices.
        let same_nodes = cache.nodes.len() == state.nodes.len()
            && cache.nodes.iter().zip(state.nodes.values()).all(|(v, n)| v.name == n.name);
        if !same_nodes {
            cache.running.clear();
        }
        cache.nodes.resize_with(state.nodes.len(), || Arc::new(NodeView::default()));
        for (cached, node) in cache.nodes.iter_mut().zip(state.nodes.values()) {
            let switch = state.switches.get(&node.name);
            if !node_matches(cached, node, switch, parts) {
                *cached = Arc::new(node_view(node, switch, parts));
            }
        }
        view.nodes = cache.nodes.clone();
        for p in state.partitions.values() {
            // Both are in name order: a merge, not a lookup per node.
            let mut idx = Vec::with_capacity(p.node_names.len());
            let mut nodes = view.nodes.iter().enumerate().peekable();
            for name in &p.node_names {
                while nodes.next_if(|(_, n)| n.name < *name).is_some() {}
                if let Some((i, _)) = nodes.next_if(|(_, n)| n.name == *name) {
                    idx.push(i);
                }
            }
            view.partitions.insert(
                p.name.clone(),
                PartitionView {
                    name: p.name.clone(),
                    nodes: idx,
                    tier: p.priority_tier,
                    max_time_s: p.max_time_s,
                    max_nodes: p.max_nodes,
                    exclusive: p.exclusive,
                    oversubscribe: p.oversubscribe,
                    preempt_mode: p.preempt_mode,
                    grace_s: p.grace_time_s,
                    access: p.access.clone(),
                    holds_back: p.state.holds_back(),
                },
            );
        }
        // Singleton: a job waits while another of the same name and user runs or was
        // submitted before it and is still pending.
        let mut first_active: BTreeMap<(&str, &str), JobId> = BTreeMap::new();
        let active = active_jobs(state);
        if active.iter().any(|j| j.spec.singleton) {
            for j in &active {
                first_active.entry((j.user.as_str(), j.spec.name.as_str())).or_insert(j.id);
            }
        }
        // Array throttles: how many more tasks of each throttled array may start, the first
        // pending ones (in id order) taking them.
        let mut array_room: BTreeMap<JobId, u32> = BTreeMap::new();
        for j in active.iter().filter_map(|j| j.array.filter(|a| a.throttle > 0).map(|a| (j, a))) {
            let room = array_room.entry(j.1.array_job_id).or_insert(j.1.throttle);
            if j.0.state.is_allocated() {
                *room = room.saturating_sub(1);
            }
        }
        // Running jobs name their nodes; a hash of the names finds each in a few nanoseconds.
        let mut by_name: Option<HashMap<&str, usize, BuildHasherDefault<Fnv>>> = None;
        for j in active {
            match j.state {
                JobState::Running | JobState::Suspended => {
                    let Some(a) = &j.allocation else { continue };
                    let predicted_end = match (predict, j.start_time, j.state) {
                        (true, Some(start), JobState::Running) => {
                            shorter_prediction(state.runs_for(&j.user, j.spec.time_limit_s), j.limit_from_start_s())
                                .map(|p| (start / 1000).saturating_add(p))
                        }
                        _ => None,
                    };
                    match cache.running.get_mut(&j.id) {
                        Some(c)
                            if c.alloc_index == j.alloc_index
                                && j.start_time.is_some()
                                && Shared::same(&c.spec, &j.spec)
                                && c.resv_end == j.resv_end
                                && c.entry.preempting == j.preempting.is_some()
                                && c.entry.suspended == (j.state == JobState::Suspended)
                                && c.entry.predicted_end_s == predicted_end.filter(|&p| p < c.entry.end_s) =>
                        {
                            c.used = generation;
                            view.running.push(c.entry.clone());
                        }
                        _ => {
                            let by_name = by_name.get_or_insert_with(|| {
                                view.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect()
                            });
                            let entry = Arc::new(running_job(state, j, a, by_name, parts, predicted_end));
                            let cached = CachedRunning {
                                alloc_index: j.alloc_index,
                                used: generation,
                                entry: entry.clone(),
                                spec: j.spec.clone(),
                                resv_end: j.resv_end,
                            };
                            cache.running.insert(j.id, cached);
                            view.running.push(entry);
                        }
                    }
                }
                JobState::Pending if !j.cancel_requested => {
                    let (mut dependency, ready_ms) = dependency_status(state, j);
                    if j.spec.singleton
                        && dependency == DepStatus::Satisfied
                        && first_active.get(&(j.user.as_str(), j.spec.name.as_str())) != Some(&j.id)
                    {
                        dependency = DepStatus::Waiting;
                    }
                    if let Some(a) = j.array.filter(|a| a.throttle > 0) {
                        if dependency == DepStatus::Satisfied && j.held.is_none() {
                            match array_room.get_mut(&a.array_job_id) {
                                Some(room) if *room > 0 => *room -= 1,
                                _ => dependency = DepStatus::ArrayThrottled,
                            }
                        }
                    }
                    let booking = view.cpu_booking(&j.partition, j.spec.oversubscribe, j.spec.exclusive);
                    // Whether the partition gives whole nodes to the components that ask.
                    let honours =
                        !j.spec.het.is_empty() && view.cpu_booking(&j.partition, j.spec.oversubscribe, true).1;
                    let fresh =
                        |names: &mut Names| Arc::new(pending_job(j, (dependency, ready_ms), names, booking, honours));
                    let (used, entry, _) = match cache.pending.entry(j.id) {
                        std::collections::btree_map::Entry::Occupied(o) => {
                            let cached = o.into_mut();
                            if !Shared::same(&cached.2, &j.spec) || (cached.1.cpu_parts, cached.1.exclusive) != booking
                            {
                                *cached = (generation, fresh(&mut cache.names), j.spec.clone());
                            }
                            cached
                        }
                        std::collections::btree_map::Entry::Vacant(v) => {
                            v.insert((generation, fresh(&mut cache.names), j.spec.clone()))
                        }
                    };
                    *used = generation;
                    // What may change while a job waits.
                    let claim = j.claim.as_ref().map(|c| c.nodes.as_slice()).unwrap_or_default();
                    let plan = predict
                        .then(|| shorter_prediction(state.runs_for(&j.user, j.spec.time_limit_s), j.spec.time_limit_s))
                        .flatten();
                    if entry.held != j.held
                        || entry.dependency != dependency
                        || entry.dependency_ready_ms != ready_ms
                        || entry.reason != j.reason
                        || entry.claim != claim
                        || entry.plan_s != plan
                    {
                        let e = Arc::make_mut(entry);
                        e.held = j.held;
                        e.dependency = dependency;
                        e.dependency_ready_ms = ready_ms;
                        e.reason = j.reason;
                        e.claim = claim.to_vec();
                        e.plan_s = plan;
                        for c in &mut e.het {
                            c.plan_s = plan;
                        }
                    }
                    view.pending.push(entry.clone());
                }
                _ => {}
            }
        }
        cache.running.retain(|_, c| c.used == generation);
        cache.pending.retain(|_, (used, _, _)| *used == generation);
        view
    }

    /// The index of the node of this name: `nodes` are in name order.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes.binary_search_by(|n| n.name.as_str().cmp(name)).ok()
    }

    /// CPUs (whole ones), memory and GPUs of all schedulable nodes.
    pub fn total_capacity(&self) -> Res {
        let all = self.nodes.iter().filter(|n| n.schedulable).fold(Res::default(), |acc, n| acc.plus(&n.capacity));
        Res { cpus: all.cpus / self.cpu_parts.max(1), ..all }
    }

    /// How a job of `partition` takes CPUs on the nodes' books, and whether it gets whole
    /// nodes: each of its CPUs is [`ClusterView::cpu_parts`] divided by the ways it shares
    /// them (its partition's `OverSubscribe`, with `--oversubscribe` for `YES`); `--exclusive`
    /// holds unless the partition says `FORCE`.
    pub fn cpu_booking(&self, partition: &str, oversubscribe: bool, exclusive: bool) -> (i64, bool) {
        let parts = self.cpu_parts.max(1);
        if !self.oversubscribed {
            return (parts, exclusive);
        }
        let Some(p) = self.partitions.get(partition) else { return (parts, exclusive) };
        let ways = i64::from(p.oversubscribe.ways(oversubscribe, exclusive).max(1));
        let exclusive = exclusive && p.oversubscribe.honours_exclusive();
        // Whole-node partitions never share; parts the ways do not divide book the job whole.
        let ways = if p.exclusive || parts % ways != 0 { 1 } else { ways };
        (parts / ways, exclusive)
    }
}

/// The active jobs in id order. They cluster among the newest ids, so each is found by stepping
/// the job map's iterator forward from the previous one, and only a far jump costs a search.
fn active_jobs(state: &ClusterState) -> Vec<&Job> {
    const STEPS: usize = 8;
    let mut out = Vec::with_capacity(state.active.len());
    let mut cursor = state.jobs.range(..);
    for id in &state.active {
        let mut found = None;
        for _ in 0..STEPS {
            match cursor.next() {
                Some((k, j)) if k == id => {
                    found = Some(j);
                    break;
                }
                Some((k, _)) if k < id => {}
                _ => break,
            }
        }
        if found.is_none() {
            cursor = state.jobs.range(id..);
            found = cursor.next().filter(|(k, _)| *k == id).map(|(_, j)| j);
        }
        out.extend(found.map(|j| &**j));
    }
    out
}

/// Whether `job`'s dependencies are met, and with `after:ID+MINUTES` from when.
fn dependency_status(state: &ClusterState, job: &Job) -> (DepStatus, Option<Millis>) {
    let spec = &job.spec;
    if spec.dependencies.is_empty() {
        return (DepStatus::Satisfied, None);
    }
    let each = spec.dependencies.iter().map(|d| one_dependency(state, job, d));
    if spec.dependency_any {
        // Any one met is enough, from the earliest time one is; never only when none can be.
        let (mut met, mut met_now, mut earliest, mut waiting) = (false, false, None::<Millis>, false);
        for (status, ready) in each {
            match status {
                DepStatus::Satisfied => {
                    met = true;
                    match ready {
                        None => met_now = true,
                        Some(r) => earliest = Some(earliest.map_or(r, |e| e.min(r))),
                    }
                }
                DepStatus::Never => {}
                DepStatus::Waiting | DepStatus::ArrayThrottled => waiting = true,
            }
        }
        return match (met, waiting) {
            (true, _) => (DepStatus::Satisfied, if met_now { None } else { earliest }),
            (false, true) => (DepStatus::Waiting, None),
            (false, false) => (DepStatus::Never, None),
        };
    }
    let (mut status, mut latest) = (DepStatus::Satisfied, None::<Millis>);
    for (this, ready) in each {
        match this {
            DepStatus::Never => return (DepStatus::Never, None),
            DepStatus::Waiting | DepStatus::ArrayThrottled => status = DepStatus::Waiting,
            DepStatus::Satisfied => latest = latest.max(ready),
        }
    }
    (status, latest.filter(|_| status == DepStatus::Satisfied))
}

/// One dependency of `job`: met, waiting or never, and with a delay from when it is met. The
/// jobs it names are read from the hot state and from the tombstones of jobs that left it.
fn one_dependency(state: &ClusterState, job: &Job, d: &quorum_model::Dependency) -> (DepStatus, Option<Millis>) {
    use quorum_model::DependencyKind::*;
    // A job known neither way left the job history too (`purge_after`): treat it as satisfied,
    // as Slurm treats a job it no longer knows.
    let Some(other) = state.outcome(d.job) else { return (DepStatus::Satisfied, None) };
    // The array's id (its first task's) stands for every task of the array, as on Slurm:
    // the tasks are the jobs with the next ids that name it as theirs.
    let array = other.array.filter(|a| a.array_job_id == d.job);
    let mut first = d.job;
    let mut last = match array {
        Some(a) => d.job.saturating_add(u64::from(a.count.max(1)) - 1),
        None => d.job,
    };
    // aftercorr: the task of the other array with this task's id, when there is one.
    if d.kind == AfterCorr {
        if let (Some(mine), Some(_)) = (job.array, array) {
            if let Some(id) = task_with_id(state, d.job, last, mine.task_id) {
                (first, last) = (id, id);
            }
        }
    }
    let (mut all_started, mut all_finished, mut all_ok, mut any_failed) = (true, true, true, false);
    let mut latest_start: Millis = 0;
    for (_, other) in state.outcomes(first..=last) {
        if array.is_some() && other.array.is_none_or(|a| a.array_job_id != d.job) {
            continue;
        }
        let finished = other.state.is_finished();
        let ok = other.state == JobState::Completed;
        all_started &= other.start_time.is_some() || finished;
        all_finished &= finished;
        all_ok &= ok;
        any_failed |= finished && !ok;
        // A job cancelled before it started counts from its end.
        latest_start = latest_start.max(other.start_time.or(other.end_time).unwrap_or(0));
    }
    let status = match d.kind {
        After if all_started => DepStatus::Satisfied,
        AfterAny if all_finished => DepStatus::Satisfied,
        AfterOk | AfterCorr if all_ok => DepStatus::Satisfied,
        AfterOk | AfterCorr if any_failed => DepStatus::Never,
        AfterNotOk if all_finished && any_failed => DepStatus::Satisfied,
        AfterNotOk if all_finished => DepStatus::Never,
        _ => DepStatus::Waiting,
    };
    let ready = (d.kind == After && d.delay_min > 0 && status == DepStatus::Satisfied)
        .then(|| latest_start.saturating_add(u64::from(d.delay_min) * 60_000));
    (status, ready)
}

/// The job id of task `task_id` of the array whose tasks are jobs `first..=last`, by bisection:
/// an array's tasks take consecutive ids in the order of their task ids.
fn task_with_id(state: &ClusterState, first: JobId, last: JobId, task_id: u32) -> Option<JobId> {
    let (mut lo, mut hi) = (first, last);
    while lo <= hi {
        let mid = lo + (hi - lo) / 2;
        let t = state.outcome(mid).and_then(|j| j.array.filter(|a| a.array_job_id == first))?.task_id;
        match t.cmp(&task_id) {
            std::cmp::Ordering::Equal => return Some(mid),
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid.checked_sub(1)?,
        }
    }
    None
}
