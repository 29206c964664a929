//! Everything the cluster agrees on ([`ClusterState`]), and what can be read from it without
//! changing it. Only [`crate::apply`] changes it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use quorum_model::{Account, Job, JobId, JobSpec, Millis, Node, Partition, Policy, Qos, Shared, Usage};

use crate::commands::{ReplicaVersion, BASE_LEVEL};
use crate::tombstone::{Departed, Outcome};

/// The account jobs are charged to when no account tree is configured.
pub const DEFAULT_ACCOUNT: &str = "root";
/// The QOS jobs get when none is asked for.
pub const DEFAULT_QOS: &str = "normal";

/// The lowest feature level among `versions`, or the base level when none is recorded.
pub fn lowest_level(versions: &BTreeMap<u64, ReplicaVersion>) -> u32 {
    versions.values().map(|v| v.level).min().unwrap_or(BASE_LEVEL)
}

/// Everything the cluster agrees on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    /// The latest leader timestamp applied; never moves backwards.
    pub clock: Millis,
    pub next_job_id: JobId,
    pub jobs: BTreeMap<JobId, Shared<Job>>,
    /// The jobs not yet finished (pending or running), so that a scheduling cycle costs what
    /// the queue holds, not what the cluster has ever run.
    #[serde(default)]
    pub active: BTreeSet<JobId>,
    pub nodes: BTreeMap<String, Node>,
    pub partitions: BTreeMap<String, Partition>,
    /// The configuration's partitions were seeded (`SeedPartitions`): from then on they change
    /// only at run time, and the leader's configuration no longer says what they are. Level 32.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partitions_seeded: bool,
    /// Request ids of accepted submits, so that a retried submit returns the same job. Shared
    /// strings: a snapshot's copy of a million of them copies pointers, not strings.
    pub request_ids: BTreeMap<std::sync::Arc<str>, JobId>,
    #[serde(default)]
    pub policy: Policy,
    #[serde(default)]
    pub accounts: Shared<BTreeMap<String, Account>>,
    #[serde(default)]
    pub qos: Shared<BTreeMap<String, Qos>>,
    /// Fairshare usage by account.
    #[serde(default)]
    pub usage: Shared<BTreeMap<String, Usage>>,
    /// Fairshare usage by account, then by user: how an account's share is shared among its
    /// users. From feature level 20.
    #[serde(default, skip_serializing_if = "Shared::is_empty_map")]
    pub user_usage: Shared<BTreeMap<String, BTreeMap<String, Usage>>>,
    /// Usage by QOS, for its `GrpTRESMins` (not decayed where the QOS says `NoDecay`). From
    /// feature level 20.
    #[serde(default, skip_serializing_if = "Shared::is_empty_map")]
    pub qos_usage: Shared<BTreeMap<String, Usage>>,
    /// The switch of each node, when a topology is configured.
    #[serde(default)]
    pub switches: BTreeMap<String, String>,
    /// What each voter runs, as the leader last recorded it.
    #[serde(default)]
    pub replica_versions: BTreeMap<u64, ReplicaVersion>,
    /// Roles given at run time (`quorum admin role`), over those of the configuration.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub roles: BTreeMap<String, quorum_model::Role>,
    /// The cluster's licenses (`--licenses`) and how many of each there are, from the leader's
    /// configuration. From feature level 12.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub licenses: BTreeMap<String, u32>,
    /// What is kept of jobs that left the hot state for the job history (`PurgeJobs`): a
    /// tombstone each, for `min_job_age` and while a pending job depends on it. From level 14.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub departed: BTreeMap<JobId, Departed>,
    /// Advance reservations by name (`scontrol create reservation`). From feature level 18.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reservations: BTreeMap<String, quorum_model::reservation::Reservation>,
    /// Recurring jobs by id (`quorum cron`). From feature level 19.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cron: BTreeMap<u64, quorum_model::cron::CronEntry>,
    /// The id the next cron entry gets (from 1).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_cron_id: u64,
    /// Each user's last two run times, of the jobs that ended by themselves or at their limit:
    /// what backfill on predicted run times plans with. From feature level 26.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub recent_runs: BTreeMap<String, quorum_model::predict::RecentRuns>,
    /// Each user's last two run times for each of the time limits their latest jobs asked for
    /// (the same jobs as `recent_runs`): what a job of that limit is predicted from. From
    /// feature level 37.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub runs_by_limit: BTreeMap<String, quorum_model::predict::RunsByLimit>,
    /// How many active jobs each user has: derived from `jobs` and `active`, never stored
    /// (rebuilt when a snapshot is decoded), so that the per-user submit limit costs a lookup,
    /// not a walk of the queue.
    #[serde(skip)]
    pub active_by_user: ActiveByUser,
}

/// Active jobs by user ([`ClusterState::active_by_user`]). A cache of what `jobs` says, so it
/// takes no part in comparing states: two states with the same jobs are equal whatever it holds.
#[derive(Clone, Debug, Default)]
pub struct ActiveByUser(BTreeMap<String, u32>);

impl PartialEq for ActiveByUser {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl ActiveByUser {
    /// The active jobs of `user`.
    pub fn of(&self, user: &str) -> u32 {
        self.0.get(user).copied().unwrap_or(0)
    }

    pub(crate) fn add(&mut self, user: &str, n: u32) {
        match self.0.get_mut(user) {
            Some(count) => *count = count.saturating_add(n),
            None => {
                self.0.insert(user.to_string(), n);
            }
        }
    }

    pub(crate) fn remove(&mut self, user: &str) {
        if let Some(count) = self.0.get_mut(user) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.0.remove(user);
            }
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ClusterState {
    /// The tasks of an array share one spec in memory, as they did when submitted; a decoded
    /// snapshot gives each its own copy, which this undoes (only where it is the same).
    /// Counts the active jobs of each user again ([`ClusterState::active_by_user`]).
    pub fn count_active_by_user(&mut self) {
        let mut counts = ActiveByUser::default();
        for job in self.active.iter().filter_map(|id| self.jobs.get(id)) {
            counts.add(&job.user, 1);
        }
        self.active_by_user = counts;
    }

    pub fn share_array_specs(&mut self) {
        let mut shared: Vec<(JobId, Shared<JobSpec>)> = Vec::new();
        for j in self.jobs.values() {
            let Some(a) = j.array.filter(|a| a.array_job_id != j.id) else { continue };
            if let Some(first) = self.jobs.get(&a.array_job_id) {
                if !Shared::same(&first.spec, &j.spec) && *first.spec == *j.spec {
                    shared.push((j.id, first.spec.clone()));
                }
            }
        }
        for (id, spec) in shared {
            if let Some(j) = self.jobs.get_mut(&id) {
                j.spec = spec;
            }
        }
    }

    pub fn new() -> Self {
        Self { next_job_id: 1, ..Self::default() }
    }

    /// The cluster's feature level: the lowest among the recorded voters, and the base level
    /// until the leader has recorded them.
    pub fn cluster_level(&self) -> u32 {
        lowest_level(&self.replica_versions)
    }

    /// The runs a job of `user` asking for `limit_s` is predicted from
    /// ([`quorum_model::predict::runs_for`]).
    pub fn runs_for(&self, user: &str, limit_s: Option<u64>) -> Option<&quorum_model::predict::RecentRuns> {
        quorum_model::predict::runs_for(self.recent_runs.get(user), self.runs_by_limit.get(user), limit_s)
    }

    pub fn default_partition(&self) -> Option<&Partition> {
        self.partitions.values().find(|p| p.default)
    }

    /// Registered nodes of a partition, in name order.
    pub fn partition_nodes<'a>(&'a self, partition: &'a Partition) -> impl Iterator<Item = &'a Node> + 'a {
        partition.node_names.iter().filter_map(|n| self.nodes.get(n))
    }

    /// The partitions a node belongs to.
    pub fn partitions_of(&self, node: &str) -> Vec<String> {
        self.partitions.values().filter(|p| p.node_names.contains(node)).map(|p| p.name.clone()).collect()
    }
}

impl ClusterState {
    /// A job's outcome, from the hot state or its tombstone; `None` when neither knows it.
    pub fn outcome(&self, id: JobId) -> Option<Outcome> {
        match self.jobs.get(&id) {
            Some(j) => Some(Outcome::from(&**j)),
            None => self.departed.get(&id).map(Outcome::from),
        }
    }

    /// The outcomes of the jobs with ids in `ids`, in id order, from the hot state and the
    /// tombstones together (a job is in one or the other, never both).
    pub fn outcomes(&self, ids: std::ops::RangeInclusive<JobId>) -> impl Iterator<Item = (JobId, Outcome)> + '_ {
        let mut hot = self.jobs.range(ids.clone()).map(|(id, j)| (*id, Outcome::from(&**j))).peekable();
        let mut gone = self.departed.range(ids).map(|(id, d)| (*id, Outcome::from(d))).peekable();
        std::iter::from_fn(move || match (hot.peek(), gone.peek()) {
            (Some(h), Some(g)) if g.0 < h.0 => gone.next(),
            (Some(_), _) => hot.next(),
            (None, _) => gone.next(),
        })
    }

    /// Whether `id` names a job the cluster knows, in the hot state or as a tombstone.
    pub fn knows_job(&self, id: JobId) -> bool {
        self.jobs.contains_key(&id) || self.departed.contains_key(&id)
    }
}
