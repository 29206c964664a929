//! Eligibility: why a pending job may not start at all now, before any placement is tried.
//! Static reasons depend on the job alone; limits count what running jobs and the starts
//! already planned this cycle hold, per user and QOS and per account up the tree.

use std::collections::BTreeMap;

use super::view::{ClusterView, DepStatus, PartitionView, PendingJob};
use quorum_model::{Millis, PendingReason, Qos, Tres};

/// What screening knows once per cycle: whether any account limits wall time or what one job
/// may ask for (so that the common tree without such limits costs no walk up the tree per
/// job), and which accounts and QOS have spent their `GrpTRESMins` budget.
#[derive(Debug, Default)]
pub struct CycleLimits<'a> {
    wall: bool,
    per_job: bool,
    spent_accounts: BTreeMap<&'a str, PendingReason>,
    spent_qos: BTreeMap<&'a str, PendingReason>,
}

impl<'a> CycleLimits<'a> {
    pub fn new(view: &'a ClusterView, now_ms: Millis, half_life_ms: u64) -> CycleLimits<'a> {
        let mut out = CycleLimits {
            wall: view.accounts.values().any(|a| a.limits.max_wall_s.is_some()),
            per_job: view.accounts.values().any(|a| !a.limits.max_tres_per_job.is_empty()),
            ..CycleLimits::default()
        };
        let budgeted = |a: &quorum_model::Account| !a.limits.grp_tres_mins.is_empty();
        if view.accounts.values().any(budgeted) || view.qos.values().any(|q| !q.grp_tres_mins.is_empty()) {
            out.spend(view, now_ms, half_life_ms);
        }
        out
    }

    /// A budget is spent by the decayed usage charged so far and what running jobs have used
    /// since they started (CPU- and GPU-seconds), up the account tree.
    fn spend(&mut self, view: &'a ClusterView, now_ms: Millis, half_life_ms: u64) {
        let mut by_account: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        let mut by_qos: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        for (a, u) in view.usage.iter() {
            let (c, g) = u.tres_at(now_ms, half_life_ms, true);
            for acc in account_chain(view, a) {
                let e = by_account.entry(acc).or_default();
                (e.0, e.1) = (e.0 + c, e.1 + g);
            }
        }
        for (q, u) in view.qos_usage.iter() {
            let decay = !view.qos.get(q).is_some_and(|q| q.no_decay);
            let (c, g) = u.tres_at(now_ms, half_life_ms, decay);
            let e = by_qos.entry(q.as_str()).or_default();
            (e.0, e.1) = (e.0 + c, e.1 + g);
        }
        let now_s = now_ms / 1000;
        for r in &view.running {
            let seconds = now_s.saturating_sub(r.start_s) as f64;
            let cpus: i64 = r.alloc.iter().map(|(_, res)| res.cpus).sum::<i64>() / r.cpu_parts.max(1);
            let gpus: i64 = r.alloc.iter().map(|(_, res)| res.gpus).sum();
            let (c, g) = (cpus as f64 * seconds, gpus as f64 * seconds);
            for acc in account_chain(view, &r.account) {
                let e = by_account.entry(acc).or_default();
                (e.0, e.1) = (e.0 + c, e.1 + g);
            }
            if let Some((name, _)) = view.qos.get_key_value(&r.qos) {
                let e = by_qos.entry(name.as_str()).or_default();
                (e.0, e.1) = (e.0 + c, e.1 + g);
            }
        }
        for (name, a) in view.accounts.iter() {
            let (c, g) = by_account.get(name.as_str()).copied().unwrap_or_default();
            match a.limits.grp_tres_mins.spent(c, g) {
                Some(Tres::Gpu) => self.spent_accounts.insert(name, PendingReason::AssocGrpGRESMinutes),
                Some(_) => self.spent_accounts.insert(name, PendingReason::AssocGrpCPUMinutesLimit),
                None => None,
            };
        }
        for (name, q) in view.qos.iter() {
            let (c, g) = by_qos.get(name.as_str()).copied().unwrap_or_default();
            match q.grp_tres_mins.spent(c, g) {
                Some(Tres::Gpu) => self.spent_qos.insert(name, PendingReason::QOSGrpGRESMinutes),
                Some(_) => self.spent_qos.insert(name, PendingReason::QOSGrpCPUMinutesLimit),
                None => None,
            };
        }
    }
}

/// The reason a job asking for more than `limit` allows one job gets.
fn per_job_reason(tres: Tres, assoc: bool) -> PendingReason {
    match (tres, assoc) {
        (Tres::Cpu, false) => PendingReason::QOSMaxCpuPerJobLimit,
        (Tres::Gpu, false) => PendingReason::QOSMaxGRESPerJob,
        (Tres::Mem, false) => PendingReason::QOSMaxMemoryPerJob,
        (Tres::Node, false) => PendingReason::QOSMaxNodePerJobLimit,
        (Tres::Cpu, true) => PendingReason::AssocMaxCpuPerJobLimit,
        (Tres::Gpu, true) => PendingReason::AssocMaxGRESPerJob,
        (Tres::Mem, true) => PendingReason::AssocMaxMemPerJob,
        (Tres::Node, true) => PendingReason::AssocMaxNodePerJobLimit,
    }
}

/// What a pending job asks for in all: CPUs, GPUs, memory (MiB) and nodes.
fn asks(job: &PendingJob) -> (i64, i64, i64, i64) {
    let nodes = i64::from(job.nodes);
    (job.total_cpus(), job.total_gpus(), job.per_node.mem.saturating_mul(nodes), nodes)
}

/// Reasons that do not depend on what else runs; `partition` and `qos` are the job's, already
/// looked up (`None` when the view has no such one).
pub fn static_reason(
    job: &PendingJob,
    view: &ClusterView,
    partition: Option<&PartitionView>,
    qos: Option<&Qos>,
    now_ms: Millis,
    cycle: &CycleLimits,
) -> Option<PendingReason> {
    if let Some(hold) = job.held {
        return Some(hold.reason());
    }
    match job.dependency {
        DepStatus::Never => return Some(PendingReason::DependencyNeverSatisfied),
        DepStatus::Waiting => return Some(PendingReason::Dependency),
        DepStatus::ArrayThrottled => return Some(PendingReason::JobArrayTaskLimit),
        DepStatus::Satisfied if job.dependency_ready_ms.is_some_and(|r| r > now_ms) => {
            return Some(PendingReason::Dependency)
        }
        DepStatus::Satisfied => {}
    }
    if job.begin_ms.is_some_and(|b| b > now_ms) {
        return Some(PendingReason::BeginTime);
    }
    let limit = job.time_limit_s.unwrap_or(u64::MAX);
    if let Some(p) = partition {
        if p.max_time_s.is_some_and(|m| limit > m) {
            return Some(PendingReason::PartitionTimeLimit);
        }
        if p.max_nodes.is_some_and(|m| job.nodes > m) {
            return Some(PendingReason::PartitionNodeLimit);
        }
        // Admitted at its submit; the partition has since closed to its account or QOS.
        if p.access.refuses_account(&job.account).is_some() {
            return Some(PendingReason::AccountNotAllowed);
        }
        if p.access.refuses_qos(&job.qos).is_some() {
            return Some(PendingReason::QOSNotAllowed);
        }
    }
    if qos.and_then(|q| q.max_wall_s).is_some_and(|m| limit > m) {
        return Some(PendingReason::QOSMaxWallDurationPerJobLimit);
    }
    if cycle.wall
        && account_chain(view, &job.account).any(|a| view.accounts[a].limits.max_wall_s.is_some_and(|m| limit > m))
    {
        return Some(PendingReason::AssocMaxWallDurationPerJobLimit);
    }
    let (cpus, gpus, mem, nodes) = asks(job);
    if let Some(tres) = qos.and_then(|q| q.max_tres_per_job.exceeded(cpus, gpus, mem, nodes)) {
        return Some(per_job_reason(tres, false));
    }
    if cycle.per_job {
        for a in account_chain(view, &job.account) {
            if let Some(tres) = view.accounts[a].limits.max_tres_per_job.exceeded(cpus, gpus, mem, nodes) {
                return Some(per_job_reason(tres, true));
            }
        }
    }
    if let Some(reason) = cycle.spent_qos.get(&*job.qos) {
        return Some(*reason);
    }
    if !cycle.spent_accounts.is_empty() {
        if let Some(reason) = account_chain(view, &job.account).find_map(|a| cycle.spent_accounts.get(a)) {
            return Some(*reason);
        }
    }
    None
}

/// The account and its ancestors that exist in the tree.
fn account_chain<'a>(view: &'a ClusterView, account: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    let mut next = view.accounts.get(account).map(|a| a.name.as_str());
    let mut hops = 0;
    std::iter::from_fn(move || {
        let current = next?;
        hops += 1;
        next = if hops > 64 {
            None
        } else {
            view.accounts[current].parent.as_deref().filter(|p| view.accounts.contains_key(*p))
        };
        Some(current)
    })
}

#[derive(Clone, Debug, Default)]
struct Held<'a> {
    jobs: u32,
    cpus: i64,
    gpus: i64,
    mem: i64,
    nodes: i64,
    gpus_by_type: BTreeMap<&'a str, i64>,
}

/// What one job holds, for counting.
pub struct Usage<'a> {
    pub cpus: i64,
    pub gpus: i64,
    pub mem: i64,
    pub nodes: i64,
    pub gpus_by_type: Vec<(&'a str, i64)>,
}

impl<'a> Held<'a> {
    fn add(&mut self, u: &Usage<'a>) {
        self.jobs += 1;
        self.cpus += u.cpus;
        self.gpus += u.gpus;
        self.mem += u.mem;
        self.nodes += u.nodes;
        for (t, n) in &u.gpus_by_type {
            *self.gpus_by_type.entry(t).or_default() += n;
        }
    }
}

/// What running and planned jobs hold, for the limits; keyed by names borrowed from the view.
#[derive(Debug, Default)]
pub struct Limits<'a> {
    /// Whether any QOS or account has a limit that counts; without one there is nothing to
    /// count and every check passes.
    counting: bool,
    by_user_qos: BTreeMap<(&'a str, &'a str), Held<'a>>,
    by_account: BTreeMap<&'a str, Held<'a>>,
    by_qos: BTreeMap<&'a str, Held<'a>>,
}

/// Whether any QOS or account limits what running jobs may hold together.
fn any_counted_limit(view: &ClusterView) -> bool {
    view.qos.values().any(|q| {
        q.max_jobs_per_user.is_some()
            || q.max_gpus_per_user.is_some()
            || !q.max_tres_per_user.is_empty()
            || !q.grp_tres.is_empty()
            || q.grp_jobs.is_some()
    }) || view.accounts.values().any(|a| {
        let l = &a.limits;
        l.max_jobs.is_some()
            || l.grp_gpus.is_some()
            || l.grp_cpus.is_some()
            || l.grp_mem_mb.is_some()
            || l.grp_nodes.is_some()
            || !l.grp_gpus_by_type.is_empty()
    })
}

impl<'a> Limits<'a> {
    pub fn from_running(view: &'a ClusterView) -> Limits<'a> {
        let mut limits = Limits { counting: any_counted_limit(view), ..Limits::default() };
        if !limits.counting {
            return limits;
        }
        for r in &view.running {
            let usage = Usage {
                cpus: r.alloc.iter().map(|(_, res)| res.cpus).sum::<i64>() / r.cpu_parts.max(1),
                gpus: r.alloc.iter().map(|(_, res)| res.gpus).sum(),
                mem: r.alloc.iter().map(|(_, res)| res.mem).sum(),
                nodes: r.alloc.len() as i64,
                gpus_by_type: r.gpus_by_type.iter().map(|(t, n)| (t.as_str(), *n)).collect(),
            };
            limits.add(view, &r.user, &r.qos, &r.account, &usage);
        }
        limits
    }

    fn add(&mut self, view: &'a ClusterView, user: &'a str, qos: &'a str, account: &'a str, usage: &Usage<'a>) {
        if !self.counting {
            return;
        }
        self.by_user_qos.entry((user, qos)).or_default().add(usage);
        self.by_qos.entry(qos).or_default().add(usage);
        for a in account_chain(view, account) {
            self.by_account.entry(a).or_default().add(usage);
        }
    }

    /// Counts a start planned this cycle.
    pub fn add_job(&mut self, view: &'a ClusterView, job: &'a PendingJob, usage: &Usage<'a>) {
        self.add(view, &job.user, &job.qos, &job.account, usage);
    }

    /// The first limit the job would exceed if it started now.
    pub fn check(&self, view: &ClusterView, job: &PendingJob) -> Option<PendingReason> {
        if !self.counting {
            return None;
        }
        let none = Held::default();
        if let Some(q) = view.qos.get(&*job.qos) {
            let h = self.by_user_qos.get(&(&*job.user, &*job.qos)).unwrap_or(&none);
            if q.max_jobs_per_user.is_some_and(|m| h.jobs + 1 > m) {
                return Some(PendingReason::QOSMaxJobsPerUserLimit);
            }
            if q.max_gpus_per_user.is_some_and(|m| h.gpus + job.total_gpus() > i64::from(m)) {
                return Some(PendingReason::QOSMaxGRESPerUser);
            }
            let (cpus, gpus, mem, nodes) = asks(job);
            let per_user = q.max_tres_per_user.exceeded(h.cpus + cpus, h.gpus + gpus, h.mem + mem, h.nodes + nodes);
            if let Some(tres) = per_user {
                return Some(match tres {
                    Tres::Cpu => PendingReason::QOSMaxCpuPerUserLimit,
                    Tres::Gpu => PendingReason::QOSMaxGRESPerUser,
                    Tres::Mem => PendingReason::QOSMaxMemoryPerUser,
                    Tres::Node => PendingReason::QOSMaxNodePerUserLimit,
                });
            }
            let g = self.by_qos.get(&*job.qos).unwrap_or(&none);
            if q.grp_jobs.is_some_and(|m| g.jobs + 1 > m) {
                return Some(PendingReason::QOSGrpJobsLimit);
            }
            if let Some(tres) = q.grp_tres.exceeded(g.cpus + cpus, g.gpus + gpus, g.mem + mem, g.nodes + nodes) {
                return Some(match tres {
                    Tres::Cpu => PendingReason::QOSGrpCpuLimit,
                    Tres::Gpu => PendingReason::QOSGrpGRES,
                    Tres::Mem => PendingReason::QOSGrpMemLimit,
                    Tres::Node => PendingReason::QOSGrpNodeLimit,
                });
            }
        }
        for a in account_chain(view, &job.account) {
            let limits = &view.accounts[a].limits;
            let h = self.by_account.get(a).unwrap_or(&none);
            if limits.max_jobs.is_some_and(|m| h.jobs + 1 > m) {
                return Some(PendingReason::AssocMaxJobsLimit);
            }
            if limits.grp_gpus.is_some_and(|m| h.gpus + job.total_gpus() > i64::from(m)) {
                return Some(PendingReason::AssocGrpGRES);
            }
            if let Some(t) = job.gpu_type.as_deref() {
                let held = h.gpus_by_type.get(t).copied().unwrap_or(0);
                if limits.grp_gpus_by_type.get(t).is_some_and(|m| held + job.total_gpus() > i64::from(*m)) {
                    return Some(PendingReason::AssocGrpGRES);
                }
            }
            if limits.grp_cpus.is_some_and(|m| h.cpus + job.total_cpus() > i64::from(m)) {
                return Some(PendingReason::AssocGrpCpuLimit);
            }
            if limits.grp_mem_mb.is_some_and(|m| h.mem + job.per_node.mem * i64::from(job.nodes) > m as i64) {
                return Some(PendingReason::AssocGrpMemLimit);
            }
            if limits.grp_nodes.is_some_and(|m| h.nodes + i64::from(job.nodes) > i64::from(m)) {
                return Some(PendingReason::AssocGrpNodeLimit);
            }
        }
        None
    }
}
