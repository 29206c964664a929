//! The trace-driven simulator: replays an SWF workload through the production scheduler and
//! state machine in virtual time.
//!
//! Nothing here re-implements scheduling. Every arrival is a [`Command::SubmitJob`] applied with
//! [`quorum_state::apply`]; after the arrivals and ends of each instant, one cycle runs exactly as the
//! leader's: [`ClusterView::from_state`], [`quorum_sched::schedule`] with the previous cycle's
//! reservations, and the plan applied as a [`Command::ApplyPlan`] (which re-checks every start);
//! each started job ends after its recorded run time (at its limit when it runs over) with a
//! [`Command::JobEnded`] per node, as agents would report. The clock is virtual, so the replay
//! runs as fast as the CPU allows and the same trace and options give the same result, bit for
//! bit.

pub mod metrics;
pub mod svg;
pub mod swf;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::str::FromStr;

use crate::config::ClusterSettings;
use crate::model::{Account, JobId, JobSpec, JobState, Partition, Program, RankOutcome};
use crate::model::{BackfillMode, Policy, QueueOrder};
use quorum_sched::view::ViewCache;
use quorum_sched::ClusterView;
use quorum_state::{ClusterState, Command, DropReason, NodeRegistration, Response};
use swf::{SwfJob, Trace};

/// The scheduling policies the command line offers by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyName {
    /// First come, first served, no backfill.
    Fcfs,
    /// First come, first served, with EASY backfill.
    Easy,
    /// First come, first served, with conservative backfill.
    Conservative,
    /// Multifactor priority (fairshare, age, size) with EASY backfill.
    Multifactor,
    /// Shortest time limit first, with EASY backfill.
    Sjf,
}

impl FromStr for PolicyName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "fcfs" => PolicyName::Fcfs,
            "easy" => PolicyName::Easy,
            "conservative" => PolicyName::Conservative,
            "multifactor" => PolicyName::Multifactor,
            "sjf" => PolicyName::Sjf,
            other => {
                return Err(format!("unknown policy '{other}': expected fcfs, easy, conservative, multifactor or sjf"))
            }
        })
    }
}

impl PolicyName {
    pub fn name(self) -> &'static str {
        match self {
            PolicyName::Fcfs => "fcfs",
            PolicyName::Easy => "easy",
            PolicyName::Conservative => "conservative",
            PolicyName::Multifactor => "multifactor",
            PolicyName::Sjf => "sjf",
        }
    }

    /// Sets the ordering and backfill of `policy`, keeping its weights and windows.
    pub fn apply(self, policy: &mut Policy) {
        let (ordering, backfill) = match self {
            PolicyName::Fcfs => (QueueOrder::Fifo, BackfillMode::None),
            PolicyName::Easy => (QueueOrder::Fifo, BackfillMode::Easy),
            PolicyName::Conservative => (QueueOrder::Fifo, BackfillMode::Conservative),
            PolicyName::Multifactor => (QueueOrder::Multifactor, BackfillMode::Easy),
            PolicyName::Sjf => (QueueOrder::ShortestFirst, BackfillMode::Easy),
        };
        policy.ordering = ordering;
        policy.backfill = backfill;
    }
}

/// What the user asked for; everything left `None` comes from the trace's header or defaults.
#[derive(Clone, Debug, Default)]
pub struct SimOptions {
    pub nodes: Option<u32>,
    pub cpus_per_node: Option<u32>,
    /// Every job gets whole nodes (`ceil(procs / cpus_per_node)` of them) instead of just its
    /// processors.
    pub whole_nodes: bool,
    /// `None`: the config's scheduler section, or EASY without a config.
    pub policy: Option<PolicyName>,
    /// Conservative backfill: how many blocked jobs get reservations (default: all).
    pub reservations: Option<u32>,
    /// Partitions, scheduler weights, QOS, accounts and switches from a controller config.
    pub settings: Option<ClusterSettings>,
    /// Whether a job that runs past its time limit is let run its recorded time.
    pub no_kill: bool,
    /// Replay from the job with this number (or the next one after it).
    pub from: Option<u64>,
    pub count: Option<usize>,
    /// Keep the queue length and busy CPUs after every cycle (for `--plot`).
    pub samples: bool,
    /// Advance reservations made before the first job (maintenance windows, say): the
    /// trace's jobs are in none of them, so they keep off their nodes over their windows.
    pub reserve: Vec<crate::model::reservation::ResvRequest>,
    /// Backfill on run times predicted from each user's last two jobs (`Policy::predict`),
    /// whatever the config says.
    pub predict: bool,
    /// In what order backfill tries the jobs behind the reservations (`Policy::backfill_order`),
    /// whatever the config says.
    pub backfill_order: Option<crate::model::BackfillOrder>,
    /// Estimate every waiting job's start after every cycle, for the estimates' accuracy; on
    /// what ([`Estimates`]).
    pub estimates: Option<Estimates>,
}

/// What the start estimates of a replay are made on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Estimates {
    /// What the leader shows (`squeue --start`): forecasts, the same code as the leader's
    /// ([`quorum_sched::forecast`] over [`ClusterView::from_state_predicting`]), on predicted
    /// run times whatever the schedule is planned on.
    #[default]
    Forecasts,
    /// Conservative backfill's placement of each job on what the schedule is planned on
    /// (limits, or predictions with `predict`): what the leader showed before forecasts.
    Schedule,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SimError {
    #[error("the machine's size is unknown: the trace has no MaxNodes or MaxProcs header; give --nodes")]
    NoMachineSize,
    #[error("{0}")]
    Invalid(String),
}

/// The simulated machine.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Machine {
    pub nodes: u32,
    pub cpus_per_node: u32,
    pub whole_nodes: bool,
}

impl Machine {
    pub fn total_cpus(&self) -> u64 {
        u64::from(self.nodes) * u64::from(self.cpus_per_node)
    }
}

/// How one replayed job went.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    /// The job number in the trace.
    pub number: u64,
    pub id: JobId,
    pub user: String,
    pub procs: u64,
    pub submit_s: u64,
    pub start_s: Option<u64>,
    pub end_s: Option<u64>,
    /// The recorded run time.
    pub run_s: u64,
    pub limit_s: u64,
    pub killed: bool,
    /// The wait the trace recorded on the real machine.
    pub recorded_wait_s: Option<u64>,
    /// Node indices and the CPUs held on each.
    pub alloc: Vec<(u32, u32)>,
    /// How many times it was preempted (requeued, or ended PREEMPTED).
    pub preempted: u32,
    /// With `SimOptions::estimates`: its start as estimated in the cycle at its submit, and in
    /// the last cycle before it started (`None`: it started at once, or no estimate reached it).
    pub estimate_at_submit_s: Option<u64>,
    pub estimate_last_s: Option<u64>,
}

impl JobRecord {
    pub fn wait_s(&self) -> Option<u64> {
        self.start_s.map(|s| s - self.submit_s)
    }
    /// How long it ran in the simulation.
    pub fn ran_s(&self) -> Option<u64> {
        Some(self.end_s? - self.start_s?)
    }
}

/// The queue after one cycle.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub t_s: u64,
    pub pending: u32,
    pub busy_cpus: u64,
}

/// Progress of a replay, for a status line.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub t_s: u64,
    pub submitted: usize,
    pub ended: usize,
    pub total: usize,
    pub pending: usize,
    pub cycles: u64,
}

#[derive(Clone, Debug)]
pub struct SimResult {
    pub machine: Machine,
    pub policy: Policy,
    pub policy_name: String,
    /// Node names by index.
    pub node_names: Vec<String>,
    /// Replayed jobs in trace order.
    pub jobs: Vec<JobRecord>,
    /// Trace records not replayed, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Jobs the controller refused at submit: (job number, why).
    pub rejected: Vec<(u64, String)>,
    /// Planned starts that apply refused; always empty unless the scheduler and state disagree.
    pub dropped: Vec<(JobId, DropReason)>,
    pub samples: Vec<Sample>,
    pub cycles: u64,
    /// The advance reservations it replayed with (`--reserve`).
    pub reservations: Vec<crate::model::reservation::Reservation>,
    /// Whether the jobs carry start estimates (`SimOptions::estimates`).
    pub estimated: bool,
}

/// A trace ready to replay: the machine resolved, the slice chosen, the cluster set up.
pub struct Simulation {
    machine: Machine,
    policy_name: String,
    state: ClusterState,
    index: u64,
    node_names: Vec<String>,
    node_index: BTreeMap<String, u32>,
    /// Arrivals in submit order.
    arrivals: Vec<Arrival>,
    skipped: BTreeMap<String, u64>,
    samples: bool,
    no_kill: bool,
    estimates: Option<Estimates>,
    /// Partition names in config order, for the trace's partition numbers.
    partitions: Vec<String>,
}

struct Arrival {
    job: SwfJob,
    submit_s: u64,
    run_s: u64,
    procs: u64,
    limit_s: u64,
}

fn node_name(i: u32, width: usize) -> String {
    format!("n{:0width$}", i + 1)
}

impl Simulation {
    pub fn new(trace: &Trace, opts: &SimOptions) -> Result<Simulation, SimError> {
        let h = &trace.header;
        let settings = opts.settings.as_ref();
        let config_nodes: BTreeSet<String> =
            settings.into_iter().flat_map(|s| s.partitions.iter().flat_map(|p| p.node_names.iter().cloned())).collect();
        let nodes = match (opts.nodes, config_nodes.len(), h.max_nodes, h.max_procs) {
            (Some(n), c, _, _) if c > 0 && c as u64 != u64::from(n) => {
                return Err(SimError::Invalid(format!(
                    "--nodes {n} disagrees with the config, whose partitions name {c} nodes"
                )))
            }
            (Some(n), ..) => n,
            (None, c, ..) if c > 0 => c as u32,
            (None, _, Some(n), _) => n as u32,
            (None, _, None, Some(p)) => match opts.cpus_per_node {
                Some(c) => p.div_ceil(u64::from(c)) as u32,
                None => p as u32,
            },
            (None, _, None, None) => return Err(SimError::NoMachineSize),
        };
        if nodes == 0 {
            return Err(SimError::Invalid("--nodes must be at least 1".into()));
        }
        let cpus_per_node = match (opts.cpus_per_node, h.max_procs, h.max_nodes) {
            (Some(0), ..) => return Err(SimError::Invalid("--cpus-per-node must be at least 1".into())),
            (Some(c), ..) => c,
            // The header's machine, when the node count is the header's too.
            (None, Some(p), Some(n)) if opts.nodes.is_none_or(|o| u64::from(o) == n) && p >= n => (p / n) as u32,
            _ => 1,
        };
        let machine = Machine { nodes, cpus_per_node, whole_nodes: opts.whole_nodes };

        // Without a config, a controller's defaults (shortest-first backfill among them).
        let mut policy = match settings {
            Some(s) => s.policy.clone(),
            None => crate::config::SchedulerConfig::default().to_policy().expect("the defaults are valid"),
        };
        // A trace's queue is what it was: no submit of it is refused for the queue's size.
        policy.queue = Default::default();
        let name = match (opts.policy, settings) {
            (Some(p), _) => {
                p.apply(&mut policy);
                p.name().to_string()
            }
            (None, Some(_)) => "config".to_string(),
            (None, None) => {
                PolicyName::Easy.apply(&mut policy);
                PolicyName::Easy.name().to_string()
            }
        };
        if opts.predict {
            policy.predict = true;
        }
        if let Some(order) = opts.backfill_order {
            policy.backfill_order = order;
        }
        if policy.backfill == BackfillMode::Conservative {
            // Textbook conservative backfill gives every blocked job a reservation.
            policy.reservations =
                opts.reservations.unwrap_or(if opts.policy.is_some() { u32::MAX } else { policy.reservations });
        }

        // The slice.
        let start = match opts.from {
            Some(from) => trace.jobs.iter().position(|j| j.number >= from).ok_or_else(|| {
                SimError::Invalid(format!("--from {from}: the trace has no job numbered {from} or later"))
            })?,
            None => 0,
        };
        if opts.count == Some(0) {
            return Err(SimError::Invalid("--count must be at least 1".into()));
        }
        let end = opts.count.map_or(trace.jobs.len(), |c| (start + c).min(trace.jobs.len()));
        let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
        let mut arrivals = Vec::new();
        for job in &trace.jobs[start..end] {
            let mut skip = |why: &str| *skipped.entry(why.to_string()).or_default() += 1;
            let Some(submit_s) = job.submit_s else {
                skip("unknown submit time");
                continue;
            };
            let Some(run_s) = job.run_s else {
                skip("unknown run time");
                continue;
            };
            let Some(procs) = job.procs() else {
                skip("unknown processor count");
                continue;
            };
            let limit_s = job.requested_time_s.filter(|&t| t > 0).unwrap_or(run_s).max(1);
            arrivals.push(Arrival { job: job.clone(), submit_s, run_s, procs, limit_s });
        }
        // Traces are in submit order almost always; a stable sort keeps ties in trace order.
        arrivals.sort_by_key(|a| a.submit_s);

        // Without a configured window, reservations reach as far as the longest limit so that
        // backfill is the textbook algorithm (the controller's default window is a day).
        let longest = arrivals.iter().map(|a| a.limit_s).max().unwrap_or(0);
        if settings.is_none_or(|s| s.policy.bf_window_s == Policy::default().bf_window_s) {
            policy.bf_window_s = policy.bf_window_s.max(longest);
        }

        let width = nodes.to_string().len().max(4);
        let node_names: Vec<String> = if config_nodes.is_empty() {
            (0..nodes).map(|i| node_name(i, width)).collect()
        } else {
            config_nodes.iter().cloned().collect()
        };
        let node_index = node_names.iter().enumerate().map(|(i, n)| (n.clone(), i as u32)).collect();

        let mut sim = Simulation {
            machine,
            policy_name: name,
            state: ClusterState::new(),
            index: 0,
            node_names,
            node_index,
            arrivals,
            skipped,
            samples: opts.samples,
            no_kill: opts.no_kill,
            estimates: opts.estimates,
            partitions: Vec::new(),
        };
        // Second 0 of the trace is virtual time 0; the setup commands come before any arrival.
        let base = 0;
        let partitions = match settings {
            Some(s) if !s.partitions.is_empty() => s.partitions.clone(),
            _ => vec![Partition {
                name: "batch".into(),
                nodes: crate::model::hostlist::compress(&sim.node_names),
                node_names: sim.node_names.iter().cloned().collect(),
                default: true,
                max_time_s: None,
                default_time_s: None,
                default_mem_per_cpu_mb: 0,
                priority_tier: 0,
                max_nodes: None,
                exclusive: false,
                oversubscribe: Default::default(),
                preempt_mode: None,
                grace_time_s: 0,
                access: Default::default(),
                state: Default::default(),
            }],
        };
        sim.partitions = partitions.iter().map(|p| p.name.clone()).collect();
        let accounts = match settings {
            Some(s) if !s.accounts.is_empty() => s.accounts.clone(),
            _ => sim.group_accounts(),
        };
        let qos = settings.map(|s| s.qos.clone()).unwrap_or_default();
        let switches = settings.map(|s| s.switches.clone()).unwrap_or_default();
        // The simulated cluster runs this build on every replica: what is gated on the
        // cluster's feature level (user fairshare, submit limits) behaves as on a real one.
        let level = quorum_state::ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "simulated".into() };
        sim.cmd(Command::SetReplicaVersions { versions: BTreeMap::from([(1, level)]), now: base });
        sim.cmd(Command::SetPartitions { partitions, now: base });
        sim.cmd(Command::SetPolicy { policy, now: base });
        sim.cmd(Command::SetTopology { switches, now: base });
        sim.cmd(Command::SeedAccounts { accounts, qos, now: base });
        for name in sim.node_names.clone() {
            sim.cmd(Command::RegisterNode {
                node: NodeRegistration {
                    name,
                    cpus: cpus_per_node,
                    mem_mb: u64::from(cpus_per_node) * 1024,
                    gpus: Vec::new(),
                    features: Vec::new(),
                    version: env!("CARGO_PKG_VERSION").into(),
                },
                now: base,
            });
        }
        for request in &opts.reserve {
            let command = Command::CreateReservation { request: request.clone(), user: "root".into(), now: base };
            if let Response::Rejected(r) = sim.cmd(command) {
                return Err(SimError::Invalid(format!("--reserve: {r}")));
            }
        }
        Ok(sim)
    }

    /// Without configured accounts: one account per SWF group under `root`, equal shares, each
    /// with the users seen submitting under that group, so that fairshare is between groups.
    fn group_accounts(&self) -> Vec<Account> {
        let mut groups: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for a in &self.arrivals {
            groups.entry(group_name(&a.job)).or_default().insert(user_name(&a.job));
        }
        let mut accounts = vec![Account { name: "root".into(), parent: None, shares: 1, ..Default::default() }];
        accounts.extend(groups.into_iter().map(|(name, users)| Account {
            name,
            parent: Some("root".into()),
            shares: 1,
            users,
            ..Default::default()
        }));
        accounts
    }

    /// The first opening or closing of a reservation's window after `after_s`, in seconds.
    fn next_boundary(&self, after_s: u64) -> Option<u64> {
        let after_ms = after_s.saturating_mul(1000);
        self.state
            .reservations
            .values()
            .flat_map(|r| r.windows(after_ms, 2))
            .flat_map(|(s, e)| [Some(s / 1000), e.map(|e| e.div_ceil(1000))])
            .flatten()
            .filter(|&t| t > after_s)
            .min()
    }

    fn cmd(&mut self, c: Command) -> Response {
        self.index += 1;
        quorum_state::apply(&mut self.state, self.index, c)
    }

    fn spec(&self, a: &Arrival) -> JobSpec {
        let c = u64::from(self.machine.cpus_per_node);
        let nodes = a.procs.div_ceil(c).min(u64::from(u32::MAX)) as u32;
        let (ntasks, cpus_per_task) = if self.machine.whole_nodes {
            (nodes, self.machine.cpus_per_node)
        } else {
            (a.procs.min(u64::from(u32::MAX)) as u32, 1)
        };
        // SWF partition numbers pick the config's partitions in file order; others go to the
        // default partition.
        let partition = a.job.partition.and_then(|p| self.partitions.get((p as usize).checked_sub(1)?)).cloned();
        JobSpec {
            name: format!("swf{}", a.job.number),
            partition: if self.partitions.len() > 1 { partition } else { None },
            nodes,
            ntasks,
            cpus_per_task,
            mem_per_node_mb: Some(0),
            time_limit_s: Some(a.limit_s),
            program: Program::Argv(vec!["true".into()]),
            work_dir: "/".into(),
            submit_dir: "/".into(),
            account: Some(group_name(&a.job)).filter(|g| self.state.accounts.contains_key(g)),
            ..Default::default()
        }
    }

    /// When each waiting job is estimated to start ([`Estimates`]), as conservative backfill
    /// would place every one of them behind what runs, in the order the policy serves them
    /// ([`quorum_sched::forecast`]), `reserved` being the last cycle's reservations. Outside
    /// the cycle, so it changes nothing.
    fn estimate_starts(
        &self,
        cache: &mut ViewCache,
        now_ms: u64,
        reserved: &BTreeMap<JobId, quorum_sched::Estimate>,
    ) -> Vec<(JobId, u64)> {
        let view = match self.estimates {
            Some(Estimates::Schedule) => ClusterView::from_state_cached(&self.state, cache),
            _ => ClusterView::from_state_predicting(&self.state, cache),
        };
        let forecast = quorum_sched::forecast(&view, now_ms, &self.state.policy, reserved);
        forecast.into_iter().map(|(id, e)| (id, e.start_ms / 1000)).collect()
    }

    /// Replays the whole slice; `progress` is called after every cycle.
    pub fn run(mut self, progress: &mut dyn FnMut(&Progress)) -> SimResult {
        let total = self.arrivals.len();
        let mut records: Vec<JobRecord> = Vec::with_capacity(total);
        let mut by_id: BTreeMap<JobId, usize> = BTreeMap::new();
        let mut rejected = Vec::new();
        let mut dropped = Vec::new();
        let mut samples = Vec::new();
        // (time, job, allocation): an end of an allocation the job no longer runs is stale.
        let mut ends: BinaryHeap<Reverse<(u64, JobId, u64)>> = BinaryHeap::new();
        // Allocations stopped by a preemption: they end when their grace is over.
        let mut preempted_ends: std::collections::BTreeSet<(JobId, u64)> = Default::default();
        // When each running allocation is due to end: an end in `ends` at another time is stale
        // (its job was suspended by a preemption, and resumed since). And the seconds it still
        // had to run, for each suspended one.
        let mut due: BTreeMap<(JobId, u64), u64> = BTreeMap::new();
        let mut paused: BTreeMap<JobId, u64> = BTreeMap::new();
        // Jobs running now (`ends` may also hold stale ends).
        let mut running = 0usize;
        let mut previous: BTreeMap<JobId, quorum_sched::Estimate> = BTreeMap::new();
        let mut promised: BTreeMap<JobId, u64> = BTreeMap::new();
        let mut cache = ViewCache::default();
        // What each cycle keeps for the next, as the leader's.
        let mut kept = quorum_sched::CycleCache::default();
        // The estimates' views apart: forecasts' are planned otherwise than the schedule's.
        let mut estimates_cache = ViewCache::default();
        let mut next = 0usize;
        let mut cycles = 0u64;
        let mut ended = 0usize;
        let mut busy_cpus = 0u64;
        let arrivals = std::mem::take(&mut self.arrivals);
        // When a reservation's window opens or closes, waiting jobs may start: a cycle then too,
        // though nothing arrives or ends. Cycles so woken that start nothing, in a row.
        let (mut last_t, mut idle_wakes) = (0u64, 0u32);
        loop {
            let event = [arrivals.get(next).map(|a| a.submit_s), ends.peek().map(|Reverse((t, _, _))| *t)]
                .into_iter()
                .flatten()
                .min();
            let waiting = self.state.active.len() > running;
            let wake = if waiting && idle_wakes < MAX_IDLE_WAKES { self.next_boundary(last_t) } else { None };
            let Some(t) = [event, wake].into_iter().flatten().min() else { break };
            let woken = event.is_none_or(|e| t < e);
            last_t = t;
            let now = t * 1000;
            // Ends first, as agents report them, then arrivals, then one cycle.
            while let Some(&Reverse((e, id, token))) = ends.peek() {
                if e > t {
                    break;
                }
                ends.pop();
                let rec = &mut records[by_id[&id]];
                let job = &self.state.jobs[&id];
                if job.state != JobState::Running || job.alloc_index != token || due.get(&(id, token)) != Some(&e) {
                    continue;
                }
                due.remove(&(id, token));
                let nodes: Vec<String> =
                    job.allocation.iter().flat_map(|a| a.nodes.iter().map(|n| n.node.clone())).collect();
                let outcome = if preempted_ends.remove(&(id, token)) {
                    RankOutcome::Cancelled { code: 0, signal: SIGTERM }
                } else if rec.killed {
                    RankOutcome::TimedOut { code: 0, signal: SIGTERM }
                } else {
                    RankOutcome::Exited { code: 0, signal: 0 }
                };
                busy_cpus -= rec.alloc.iter().map(|(_, c)| u64::from(*c)).sum::<u64>();
                running -= 1;
                for node in nodes {
                    self.cmd(Command::JobEnded { job_id: id, token, node, outcome, now });
                }
                if self.state.jobs[&id].state == JobState::Pending {
                    // Requeued by a preemption: it runs again, from the start, later.
                    (rec.start_s, rec.alloc) = (None, Vec::new());
                    continue;
                }
                rec.end_s = Some(t);
                ended += 1;
            }
            while let Some(a) = arrivals.get(next).filter(|a| a.submit_s <= t) {
                next += 1;
                let spec = self.spec(a);
                match self.cmd(Command::SubmitJob {
                    spec: Box::new(spec),
                    user: user_name(&a.job),
                    now,
                    request_id: String::new(),
                }) {
                    Response::Submitted { job_id, .. } => {
                        by_id.insert(job_id, records.len());
                        records.push(JobRecord {
                            number: a.job.number,
                            id: job_id,
                            user: user_name(&a.job),
                            procs: a.procs,
                            submit_s: a.submit_s,
                            start_s: None,
                            end_s: None,
                            run_s: a.run_s,
                            limit_s: a.limit_s,
                            killed: false,
                            recorded_wait_s: a.job.wait_s,
                            alloc: Vec::new(),
                            preempted: 0,
                            estimate_at_submit_s: None,
                            estimate_last_s: None,
                        });
                    }
                    Response::Rejected(r) => {
                        ended += 1;
                        rejected.push((a.job.number, r.to_string()));
                    }
                    other => unreachable!("a submit answers Submitted or Rejected, not {other:?}"),
                }
            }
            // One cycle, as the leader runs it; with nothing waiting a cycle changes nothing.
            if self.state.active.len() == running && paused.is_empty() {
                previous.clear();
                promised.clear();
            } else {
                let mut view = ClusterView::from_state_cached(&self.state, &mut cache);
                view.previous = std::mem::take(&mut previous);
                view.promised = std::mem::take(&mut promised);
                let policy = self.state.policy.clone();
                let plan = quorum_sched::schedule_with(&view, now, &policy, &mut kept);
                cycles += 1;
                previous = plan.estimates.clone();
                promised = quorum_sched::promises(&view, &plan);
                let reasons = plan.reasons_to_write();
                let resumes = plan.resumes.clone();
                if let Some(command) =
                    Command::apply_plan(self.index, now, plan.starts, reasons, plan.preemptions, plan.resumes)
                {
                    match self.cmd(command) {
                        Response::PlanApplied { started, dropped: d, preempted } => {
                            dropped.extend(d);
                            // A suspended one resumes where it was; the others stop when their
                            // grace is over (SIGTERM, then SIGKILL).
                            for id in resumes {
                                let job = &self.state.jobs[&id];
                                if job.state == JobState::Running {
                                    let left = paused.remove(&id).unwrap_or(0);
                                    due.insert((id, job.alloc_index), t + left);
                                    ends.push(Reverse((t + left, id, job.alloc_index)));
                                    busy_cpus +=
                                        records[by_id[&id]].alloc.iter().map(|(_, c)| u64::from(*c)).sum::<u64>();
                                }
                            }
                            for (victim, _) in preempted {
                                let job = &self.state.jobs[&victim];
                                let rec = &mut records[by_id[&victim]];
                                rec.preempted += 1;
                                if job.lends_cpus() {
                                    let end = due.remove(&(victim, job.alloc_index)).unwrap_or(t);
                                    paused.insert(victim, end.saturating_sub(t));
                                    busy_cpus -= rec.alloc.iter().map(|(_, c)| u64::from(*c)).sum::<u64>();
                                    // Its CPUs are free now: another cycle at once (a stale end
                                    // wakes one), where the preemptor starts on them.
                                    ends.push(Reverse((t, victim, job.alloc_index)));
                                    continue;
                                }
                                let grace = job.preempting.as_ref().map_or(0, |p| p.grace_s);
                                preempted_ends.insert((victim, job.alloc_index));
                                let end = due.get(&(victim, job.alloc_index)).copied().unwrap_or(u64::MAX);
                                if t + grace < end {
                                    due.insert((victim, job.alloc_index), t + grace);
                                    ends.push(Reverse((t + grace, victim, job.alloc_index)));
                                }
                            }
                            idle_wakes = if woken && started.is_empty() { idle_wakes + 1 } else { 0 };
                            running += started.len();
                            for id in started {
                                let job = &self.state.jobs[&id];
                                let rec = &mut records[by_id[&id]];
                                let alloc: Vec<(u32, u32)> = job
                                    .allocation
                                    .iter()
                                    .flat_map(|a| a.nodes.iter().map(|n| (self.node_index[&n.node], n.cpus)))
                                    .collect();
                                busy_cpus += alloc.iter().map(|(_, c)| u64::from(*c)).sum::<u64>();
                                rec.alloc = alloc;
                                rec.start_s = Some(t);
                                let limit = job.limit_from_start_s().unwrap_or(u64::MAX);
                                rec.killed = !self.no_kill && rec.run_s > limit;
                                let ran = if rec.killed { limit } else { rec.run_s };
                                due.insert((id, job.alloc_index), t + ran);
                                ends.push(Reverse((t + ran, id, job.alloc_index)));
                            }
                        }
                        other => unreachable!("a plan answers PlanApplied, not {other:?}"),
                    }
                }
            }
            // Every active job without an end coming is still waiting.
            let pending = self.state.active.len() - running;
            if self.estimates.is_some() && pending > 0 {
                for (id, start_s) in self.estimate_starts(&mut estimates_cache, now, &previous) {
                    let Some(rec) = by_id.get(&id).map(|&i| &mut records[i]) else { continue };
                    if rec.submit_s == t {
                        rec.estimate_at_submit_s = Some(start_s);
                    }
                    rec.estimate_last_s = Some(start_s);
                }
            }
            if self.samples {
                samples.push(Sample { t_s: t, pending: pending as u32, busy_cpus });
            }
            progress(&Progress { t_s: t, submitted: next, ended, total, pending, cycles });
        }
        SimResult {
            machine: self.machine,
            policy: self.state.policy.clone(),
            policy_name: self.policy_name,
            node_names: self.node_names,
            jobs: records,
            skipped: self.skipped,
            rejected,
            dropped,
            samples,
            cycles,
            reservations: self.state.reservations.values().cloned().collect(),
            estimated: self.estimates.is_some(),
        }
    }
}

/// The signal a job killed at its limit ends with.
const SIGTERM: i32 = 15;

/// How many cycles in a row a reservation's window may wake that start nothing: jobs that can
/// never start (a recurring window that always comes back first) end the replay.
const MAX_IDLE_WAKES: u32 = 64;

/// The user a trace job runs as.
pub fn user_name(job: &SwfJob) -> String {
    match job.user {
        Some(u) => format!("u{u}"),
        None => "unknown".into(),
    }
}

/// The account a trace job is charged to.
pub fn group_name(job: &SwfJob) -> String {
    match job.group {
        Some(g) => format!("g{g}"),
        None => "g-unknown".into(),
    }
}

#[cfg(test)]
mod tests;
