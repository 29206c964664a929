//! What only a leader keeps, in memory, beside its replica.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::grants::Grants;
use super::hub::AgentHub;
use crate::config::Liveness;
use crate::model::JobId;
use quorum_sched::Estimate;
use quorum_state::DropReason;

/// What the leader keeps in memory only: its agents' streams, the latest plan's reservations,
/// and the timeouts it judges agents by. Kept (empty) on followers, so that the services can
/// answer "no agent connected" without asking who leads.
pub struct LeaderState {
    pub hub: AgentHub,
    /// The steps whose `srun` this leader serves.
    pub steps: super::steps::StepRoutes,
    /// The latest plan's reservations, for `quorum queue --start`.
    estimates: Mutex<BTreeMap<JobId, Estimate>>,
    /// The latest forecast of every pending job's start ([`super::forecast`]).
    forecasts: Mutex<std::sync::Arc<Forecasts>>,
    /// The start each waiting job was first promised ([`quorum_sched::promises`]).
    promised: Mutex<BTreeMap<JobId, quorum_model::Millis>>,
    /// The first start each waiting job was shown (a reservation or a forecast), kept with it
    /// when it starts ([`LeaderState::shown_at_start`]).
    first_shown: Mutex<BTreeMap<JobId, quorum_model::Millis>>,
    pub liveness: Liveness,
    /// Planned starts that apply dropped, by kind of reason, since this replica started.
    dropped: Mutex<BTreeMap<&'static str, u64>>,
    /// The config's `mail_program`: while leading, jobs' mail is sent through it.
    pub mail_program: Option<std::path::PathBuf>,
    /// What the loops measure, for `/metrics`.
    pub stats: super::Stats,
    /// The config's `[gpu_idle]`: while leading, jobs whose GPUs stay idle are flagged (and
    /// cancelled where it says so).
    pub gpu_idle: Option<super::gpu_idle::GpuIdlePolicy>,
    pub idle_gpus: super::gpu_idle::IdleGpus,
    /// The config's `mpi_default`: what a step gets when its `srun` names no `--mpi`.
    pub mpi_default: crate::model::mpi::Mpi,
}

/// The latest forecast of every pending job's start, and when it was made.
#[derive(Clone, Debug, Default)]
pub struct Forecasts {
    pub at_ms: quorum_model::Millis,
    pub jobs: BTreeMap<JobId, Estimate>,
}

impl Forecasts {
    /// Where and when `job` is expected to start: `reserved` (the plan's reservation) when it
    /// has one, else this forecast of it.
    pub fn expected(&self, job: JobId, reserved: Option<&Estimate>) -> Option<Expected> {
        let (e, forecast) = match reserved {
            Some(e) => (e, false),
            None => (self.jobs.get(&job)?, true),
        };
        let at_ms = if forecast { self.at_ms } else { 0 };
        Some(Expected { start_ms: e.start_ms, nodes: e.nodes.clone(), forecast, at_ms })
    }
}

/// Where and when a pending job is expected to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub start_ms: quorum_model::Millis,
    pub nodes: Vec<String>,
    /// A forecast (on predicted run times), not the plan's reservation.
    pub forecast: bool,
    /// When the forecast was made (0 for a reservation).
    pub at_ms: quorum_model::Millis,
}

impl LeaderState {
    pub fn new(liveness: Liveness, grants: Grants) -> LeaderState {
        let stats = super::Stats::default();
        LeaderState {
            hub: AgentHub::new(grants, liveness.agent_lease, stats.dispatch_seconds.clone()),
            steps: Default::default(),
            estimates: Mutex::default(),
            forecasts: Mutex::default(),
            promised: Mutex::default(),
            first_shown: Mutex::default(),
            liveness,
            dropped: Mutex::default(),
            mail_program: None,
            stats,
            gpu_idle: None,
            idle_gpus: Default::default(),
            mpi_default: crate::model::mpi::Mpi::None,
        }
    }

    /// Steps whose `srun` names no `--mpi` get `mpi`.
    pub fn mpi_default(mut self, mpi: crate::model::mpi::Mpi) -> LeaderState {
        self.mpi_default = mpi;
        self
    }

    /// Watches jobs' GPUs for idleness by `policy` while leading.
    pub fn watch_gpu_idle(mut self, policy: Option<super::gpu_idle::GpuIdlePolicy>) -> LeaderState {
        self.gpu_idle = policy;
        self
    }

    /// Since when `job`'s GPUs have been idle, once for as long as the policy says.
    pub fn gpu_idle_since(
        &self,
        job: &crate::model::Job,
        now_ms: crate::model::Millis,
    ) -> Option<crate::model::Millis> {
        self.idle_gpus.flagged_since(self.gpu_idle.as_ref()?, job, now_ms)
    }

    /// Mails jobs' changes through `program` while leading.
    pub fn mail_through(mut self, program: Option<std::path::PathBuf>) -> LeaderState {
        self.mail_program = program;
        self
    }

    /// A copy of the latest plan's reservations.
    pub fn estimates(&self) -> BTreeMap<JobId, Estimate> {
        self.estimates.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Where backfill expects one pending job to start, if it placed it.
    pub fn estimate(&self, job: JobId) -> Option<Estimate> {
        self.estimates.lock().unwrap_or_else(|p| p.into_inner()).get(&job).cloned()
    }

    /// Where and when `job` is expected to start, if it waits: the plan's reservation when it
    /// has one (`forecast` false), else the latest forecast (`forecast` true, made at `at_ms`).
    pub fn expected(&self, job: JobId) -> Option<Expected> {
        let forecasts = self.forecasts.lock().unwrap_or_else(|p| p.into_inner()).clone();
        forecasts.expected(job, self.estimate(job).as_ref())
    }

    /// A copy of what [`LeaderState::expected`] reads for every job, for a listing: the
    /// reservations, and the latest forecasts with when they were made.
    pub fn expected_all(&self) -> (BTreeMap<JobId, Estimate>, std::sync::Arc<Forecasts>) {
        let forecasts = self.forecasts.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (self.estimates(), forecasts)
    }

    pub(super) fn set_forecasts(&self, forecasts: Forecasts) {
        self.first_shown_of(&forecasts.jobs);
        *self.forecasts.lock().unwrap_or_else(|p| p.into_inner()) = std::sync::Arc::new(forecasts);
    }

    /// Keeps the start each of `shown` shows as its job's first, where it has none.
    fn first_shown_of(&self, shown: &BTreeMap<JobId, Estimate>) {
        let mut first = self.first_shown.lock().unwrap_or_else(|p| p.into_inner());
        for (&job, e) in shown {
            first.entry(job).or_insert(e.start_ms);
        }
    }

    /// Forgets the first start shown of every job but those `waiting` says still wait.
    pub(super) fn retain_shown(&self, waiting: impl Fn(JobId) -> bool) {
        self.first_shown.lock().unwrap_or_else(|p| p.into_inner()).retain(|&job, _| waiting(job));
    }

    /// The starts `job` was shown while it waited, as it starts now: the first, and the one in
    /// force (`None` for a job that was never shown one).
    pub fn shown_at_start(&self, job: JobId) -> Option<quorum_model::ShownStart> {
        let first_ms = *self.first_shown.lock().unwrap_or_else(|p| p.into_inner()).get(&job)?;
        let last_ms = self.expected(job).map_or(first_ms, |e| e.start_ms);
        Some(quorum_model::ShownStart { first_ms, last_ms })
    }

    /// The start each waiting job was first promised, as the last cycle left them.
    pub(super) fn promised(&self) -> BTreeMap<JobId, quorum_model::Millis> {
        self.promised.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn set_promised(&self, promised: BTreeMap<JobId, quorum_model::Millis>) {
        *self.promised.lock().unwrap_or_else(|p| p.into_inner()) = promised;
    }

    pub(super) fn set_estimates(&self, estimates: BTreeMap<JobId, Estimate>) {
        self.first_shown_of(&estimates);
        *self.estimates.lock().unwrap_or_else(|p| p.into_inner()) = estimates;
    }

    /// Counts a planned start that apply dropped; returns how many of its kind so far.
    pub fn count_dropped(&self, why: &DropReason) -> u64 {
        let mut dropped = self.dropped.lock().unwrap_or_else(|p| p.into_inner());
        let n = dropped.entry(why.kind()).or_default();
        *n += 1;
        *n
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn leader() -> LeaderState {
        LeaderState::new(
            Liveness { node_timeout: Duration::from_secs(30), agent_lease: Duration::from_secs(20) },
            super::Grants::new(None),
        )
    }

    #[test]
    fn dropped_starts_are_counted_by_kind() {
        let leader = leader();
        let full = |node: &str| DropReason::NodeFull { node: node.into() };
        assert_eq!(leader.count_dropped(&full("n1")), 1);
        assert_eq!(leader.count_dropped(&DropReason::JobGone { job: 4 }), 1);
        assert_eq!(leader.count_dropped(&full("n2")), 2, "the same kind on another node adds up");
    }

    #[test]
    fn a_job_keeps_the_first_start_it_was_shown_and_the_one_in_force() {
        let leader = leader();
        let at = |start_ms| Estimate { start_ms, nodes: vec!["n1".into()], promised_ms: start_ms };
        assert_eq!(leader.shown_at_start(1), None, "never shown");
        // Job 1 is forecast first, then reserved for; job 2 only ever forecast.
        leader.set_forecasts(Forecasts { at_ms: 5, jobs: BTreeMap::from([(1, at(9_000)), (2, at(7_000))]) });
        leader.set_estimates(BTreeMap::from([(1, at(8_000))]));
        leader.set_forecasts(Forecasts { at_ms: 6, jobs: BTreeMap::from([(1, at(9_500)), (2, at(6_000))]) });
        let shown = |first_ms, last_ms| Some(quorum_model::ShownStart { first_ms, last_ms });
        assert_eq!(leader.shown_at_start(1), shown(9_000, 8_000), "its reservation is what it was shown last");
        assert_eq!(leader.shown_at_start(2), shown(7_000, 6_000), "the latest forecast");
        // Once a job no longer waits its first is forgotten: shown again, it is a new first.
        leader.retain_shown(|job| job != 2);
        leader.set_forecasts(Forecasts { at_ms: 7, jobs: BTreeMap::from([(2, at(5_000))]) });
        assert_eq!(leader.shown_at_start(2), shown(5_000, 5_000));
        assert_eq!(leader.shown_at_start(1), shown(9_000, 8_000), "kept while it waits");
    }
}
