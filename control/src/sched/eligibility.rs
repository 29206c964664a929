//! Eligibility: why a pending job may not start at all now, before any placement is tried.
//! Static reasons depend on the job alone; limits count what running jobs and the starts
//! already planned this cycle hold, per user and QOS and per account up the tree.

use std::collections::BTreeMap;

use super::view::{ClusterView, DepStatus, PendingJob};
use crate::model::{HoldKind, Millis, PendingReason};

/// Reasons that do not depend on what else runs.
pub fn static_reason(job: &PendingJob, view: &ClusterView, now_ms: Millis) -> Option<PendingReason> {
    match job.held {
        Some(HoldKind::Admin) => return Some(PendingReason::JobHeldAdmin),
        Some(HoldKind::User) => return Some(PendingReason::JobHeldUser),
        None => {}
    }
    match job.dependency {
        DepStatus::Never => return Some(PendingReason::DependencyNeverSatisfied),
        DepStatus::Waiting => return Some(PendingReason::Dependency),
        DepStatus::Satisfied => {}
    }
    if job.begin_ms.is_some_and(|b| b > now_ms) {
        return Some(PendingReason::BeginTime);
    }
    let limit = job.time_limit_s.unwrap_or(u64::MAX);
    if let Some(p) = view.partitions.get(&job.partition) {
        if p.max_time_s.is_some_and(|m| limit > m) {
            return Some(PendingReason::PartitionTimeLimit);
        }
        if p.max_nodes.is_some_and(|m| job.nodes > m) {
            return Some(PendingReason::PartitionNodeLimit);
        }
    }
    if view.qos.get(&job.qos).and_then(|q| q.max_wall_s).is_some_and(|m| limit > m) {
        return Some(PendingReason::QOSMaxWallDurationPerJobLimit);
    }
    if account_chain(view, &job.account).any(|a| view.accounts[a].limits.max_wall_s.is_some_and(|m| limit > m)) {
        return Some(PendingReason::AssocMaxWallDurationPerJobLimit);
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

#[derive(Clone, Copy, Debug, Default)]
struct Held {
    jobs: u32,
    cpus: i64,
    gpus: i64,
}

/// What running and planned jobs hold, for the limits.
#[derive(Debug, Default)]
pub struct Limits {
    by_user_qos: BTreeMap<(String, String), Held>,
    by_account: BTreeMap<String, Held>,
}

impl Limits {
    pub fn from_running(view: &ClusterView) -> Limits {
        let mut limits = Limits::default();
        for r in &view.running {
            let cpus = r.alloc.iter().map(|(_, res)| res.cpus).sum();
            let gpus = r.alloc.iter().map(|(_, res)| res.gpus).sum();
            limits.add(view, &r.user, &r.qos, &r.account, cpus, gpus);
        }
        limits
    }

    fn add(&mut self, view: &ClusterView, user: &str, qos: &str, account: &str, cpus: i64, gpus: i64) {
        let h = self.by_user_qos.entry((user.to_string(), qos.to_string())).or_default();
        h.jobs += 1;
        h.cpus += cpus;
        h.gpus += gpus;
        for a in account_chain(view, account) {
            let h = self.by_account.entry(a.to_string()).or_default();
            h.jobs += 1;
            h.cpus += cpus;
            h.gpus += gpus;
        }
    }

    /// Counts a start planned this cycle.
    pub fn add_job(&mut self, view: &ClusterView, job: &PendingJob, cpus: i64, gpus: i64) {
        self.add(view, &job.user, &job.qos, &job.account, cpus, gpus);
    }

    /// The first limit the job would exceed if it started now.
    pub fn check(&self, view: &ClusterView, job: &PendingJob) -> Option<PendingReason> {
        if let Some(q) = view.qos.get(&job.qos) {
            let h = self.by_user_qos.get(&(job.user.clone(), job.qos.clone())).copied().unwrap_or_default();
            if q.max_jobs_per_user.is_some_and(|m| h.jobs + 1 > m) {
                return Some(PendingReason::QOSMaxJobsPerUserLimit);
            }
            if q.max_gpus_per_user.is_some_and(|m| h.gpus + job.total_gpus() > i64::from(m)) {
                return Some(PendingReason::QOSMaxGRESPerUser);
            }
        }
        for a in account_chain(view, &job.account) {
            let limits = &view.accounts[a].limits;
            let h = self.by_account.get(a).copied().unwrap_or_default();
            if limits.max_jobs.is_some_and(|m| h.jobs + 1 > m) {
                return Some(PendingReason::AssocMaxJobsLimit);
            }
            if limits.grp_gpus.is_some_and(|m| h.gpus + job.total_gpus() > i64::from(m)) {
                return Some(PendingReason::AssocGrpGRES);
            }
            if limits.grp_cpus.is_some_and(|m| h.cpus + job.total_cpus() > i64::from(m)) {
                return Some(PendingReason::AssocGrpCpuLimit);
            }
        }
        None
    }
}
