//! The commands that go through Raft and what applying them answers.

use serde::{Deserialize, Serialize};

use quorum_model::preempt::PreemptMode;
use quorum_model::{
    Account, Gpu, JobId, JobSpec, JobState, Millis, Partition, PendingReason, PlannedStart, Policy, Qos, RankOutcome,
    Rejection,
};

/// What an agent declares about its node when it connects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRegistration {
    pub name: String,
    pub cpus: u32,
    pub mem_mb: u64,
    pub gpus: Vec<Gpu>,
    pub features: Vec<String>,
    pub version: String,
}

/// What an operator changes on nodes ([`Command::UpdateNodes`]); `None` leaves it be.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// These features, whatever the agent reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
    /// DOWN, for this reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down: Option<String>,
}

/// The feature level of the commands this release applies. Each level adds commands or fields
/// that a replica of an older release cannot apply; the leader proposes nothing above the
/// cluster's level, the lowest among the voters (DESIGN.md, "Upgrades").
///
/// 1. jobs, plans, partitions, accounts and QOS, node registration, replica versions;
/// 2. node liveness (`NodeDown`), `--requeue` jobs, digest points;
/// 3. operator drain and resume (`SetNodesDrained`), `--signal` jobs;
/// 4. jobs ending OUT_OF_MEMORY, node health (GPU failures and the health check) drains, job
///    arrays;
/// 5. several submits in one entry (`SubmitJobs`);
/// 6. several agent reports (registrations, job ends, node health) in one entry (`Batch`);
/// 7. LZ4-compressed snapshots ([`super::snapshot`]);
/// 8. roles given at run time (`SetRole`).
/// 9. batch steps (a multi-node job's script runs on its first node only) and job steps
///    (`StepStarted`, `StepEnded`).
/// 10. steps launched while their `StartStep` commits (`StartStep.expect`).
/// 11. jobs' notes (`--comment`, `--wckey`, `--mail-*`), `--open-mode=append`, `--exclude` and
///     `--nodelist`, submits refused when too few nodes have the features, names and lists a
///     job asks for, requeues on request (`RequeueJob`), and any account name accepted (and
///     recorded) while no accounts are configured.
/// 12. dependencies joined by `?` (any of them), `aftercorr`, `after:ID+MINUTES`, and
///     `--constraint` features joined by `|` (any of them), `--priority` set by operators, and
///     licenses (`SetLicenses`, `--licenses`).
/// 13. who cancelled a job, `--kill-on-invalid-dep=yes` (a job cancelled once its dependency
///     can never be met),
///     `--gid` (a job's primary group, set by root), `--constraint [a|b]` (every node with the
///     same one), and node lists naming only some of a job's nodes (`-N 4 -w n[1-2]`).
/// 14. ended jobs leaving the hot state for the job history (`PurgeJobs`), tombstones of them
///     recalled from it for a dependency (`RecallJobs`), and what a job used (`JobUsed`).
/// 15. `--constraint` node counts per feature (`[rack1*2&rack2*4]`), and the job history's
///     oldest records forgotten (`ForgetHistory`, `[accounting] purge_job_after_days`).
/// 16. what a job step's tasks used (`EndStep` with its usage), and what a job's GPUs did
///     (`JobUsed` with GPU samples, memory and energy).
/// 17. jobs changed after their submit (`UpdateJob`: `quorum update`, `scontrol update`), and
///     preemption (plans that stop running jobs for another, and jobs ending PREEMPTED).
/// 18. advance reservations (`CreateReservation`, `UpdateReservation`, `DeleteReservation`)
///     and jobs that ask for one (`--reservation`).
/// 19. recurring jobs (`AddCron`, `RemoveCron`, `FireCron`: `quorum cron`).
/// 20. fairshare down to users (user shares, usage charged by user and by QOS), and the limits
///     `MaxTRESPerJob`, `MaxTRESPerUser`, `MaxSubmitJobs`, `GrpTRESMins`, QOS `GrpTRES` and
///     `GrpJobs`.
/// 21. a job whose node's prolog failed (`JobEnded` with `PrologFailed`: back to the queue).
/// 22. partitions that admit only some accounts or QOS (`AllowAccounts`, `DenyAccounts`,
///     `AllowQos`, `DenyQos`): owners' nodes.
/// 23. preempt mode SUSPEND (partitions, QOS and the policy that name it; plans that suspend
///     jobs for another and resume them), and reservations with `Flags=FLEX`.
/// 24. partitions whose jobs share CPUs (`OverSubscribe=YES|FORCE[:N]`), jobs with
///     `--oversubscribe`, and allocations that record how many ways they share their CPUs.
/// 25. heterogeneous jobs (components after the first in a spec, allocations that name each
///     node's component, steps that name the components they run on).
/// 26. each user's last two run times, kept as jobs end, for backfill on predicted run times.
/// 27. what the cluster holds at once (`MaxJobCount`, `MaxArraySize`, a default per-user
///     `MaxSubmitJobs`, in the policy), which QOS each account may use (`QOS=`, `DefQOS=`),
///     and the default QOS `normal` that is there whatever QOS are defined.
/// 28. jobs whose batch step runs in a container (`--container-image` and pyxis's other
///     options).
/// 29. steps that run more tasks than they have CPUs (`srun --overcommit`).
/// 30. heterogeneous jobs whose components run in partitions of their own, and jobs allocated
///     as if one task ran on each node (`sbatch --overcommit`).
/// 31. steps whose tasks are numbered round-robin over their nodes (`srun -m cyclic`).
/// 32. partitions and nodes changed at run time (`SeedPartitions`, `PutPartition`,
///     `DeletePartition`, `UpdateNodes`; partition states, node weights, features set by an
///     operator, nodes an operator set DOWN).
/// 33. a planned start of a job held since the plan was made is dropped at apply.
/// 34. an ended allocation's share of a node is held until the node's agent reports its rank
///     there gone (`Node::completing`).
/// 35. the starts a job was shown while it waited (`ApplyPlan.shown`), kept with it
///     (`Job::shown`: sacct's `ForecastFirst` and `ForecastLast`).
/// 36. what each resource a job asks for adds to its priority (`Policy::tres_weights`:
///     `PriorityWeightTRES`).
/// 37. each user's last two run times per time limit asked for, kept as jobs end
///     (`ClusterState::runs_by_limit`), for predictions.
pub const FEATURE_LEVEL: u32 = 37;

/// Users' recent run times per time limit (`ClusterState::runs_by_limit`): below it, replicas
/// keep none, so that a replica of the release before keeps the same state as the others.
pub const RUNS_BY_LIMIT_LEVEL: u32 = 37;

/// The policy's TRES weights (`Policy::tres_weights`); below it the leader proposes none.
pub const TRES_WEIGHTS_LEVEL: u32 = 36;

/// The level that keeps with each job the starts it was shown while it waited; below it the
/// leader sends none.
pub const FORECAST_LEVEL: u32 = 35;

/// An ended allocation's share of each node whose rank has not reported its end is held until
/// it does (below it, the share was freed at once, and a new job could share a CPU or GPU with
/// a rank still being killed: found by the simulator).
pub const COMPLETING_LEVEL: u32 = 34;

/// A plan's start of a job that was held after the plan's view was taken is dropped at apply
/// (below it, such a job started though its hold was acknowledged: found by the simulator).
pub const HOLD_FENCE_LEVEL: u32 = 33;

/// Partitions and nodes changed at run time; the configuration seeds partitions once.
pub const LIVE_CONFIG_LEVEL: u32 = 32;

/// Steps numbered cyclic (`StepRequest::cyclic`).
pub const CYCLIC_LEVEL: u32 = 31;

/// Components in partitions of their own (`HetComponent::partition`) and jobs allocated with
/// `--overcommit` (`JobSpec::overcommit`).
pub const HET_PARTITIONS_LEVEL: u32 = 30;

/// Steps with more tasks than CPUs (`StepRequest::overcommit`).
pub const OVERCOMMIT_LEVEL: u32 = 29;

/// Jobs in containers (`JobSpec::container`).
pub const CONTAINER_LEVEL: u32 = 28;

/// The queue's limits (`Policy::queue`).
pub const QUEUE_LIMITS_LEVEL: u32 = 27;

/// Accounts' QOS lists and default QOS; `normal` always usable.
pub const QOS_ACCESS_LEVEL: u32 = 27;

/// Users' recent run times (`ClusterState::recent_runs`).
pub const PREDICT_LEVEL: u32 = 26;

/// Heterogeneous jobs (`hetjob`).
pub const HET_LEVEL: u32 = 25;

/// CPUs shared among jobs (`OverSubscribe`).
pub const OVERSUBSCRIBE_LEVEL: u32 = 24;

/// Jobs suspended, not stopped, when preempted.
pub const PREEMPT_SUSPEND_LEVEL: u32 = 23;

/// Reservations whose jobs may start before, end after, and run outside them (`FLEX`).
pub const FLEX_RESERVATION_LEVEL: u32 = 23;

/// Partitions that admit only some accounts or QOS.
pub const PARTITION_ACCESS_LEVEL: u32 = 22;

/// A node's prolog failing a job back to the queue.
pub const PROLOG_LEVEL: u32 = 21;

/// Fairshare down to users and the limits of level 20.
pub const USER_SHARES_LEVEL: u32 = 20;

/// The level that applies cron entries; below it the services refuse them.
pub const CRON_LEVEL: u32 = 19;

/// The level that applies reservations and records `--reservation`; below it the services
/// refuse both.
pub const RESERVATION_LEVEL: u32 = 18;

/// The level that applies plans with preemptions; below it the leader plans none.
pub const PREEMPTION_LEVEL: u32 = 17;

/// The level that applies [`Command::UpdateJob`].
pub const UPDATE_LEVEL: u32 = 17;

/// The level that records what a step used; below it a step's end carries none.
pub const STEP_USAGE_LEVEL: u32 = 16;

/// The level that records what a job's GPUs did; below it a job's usage carries none of it.
pub const GPU_USAGE_LEVEL: u32 = 16;

/// The level that applies [`Command::ForgetHistory`]; below it the history keeps everything.
pub const FORGET_HISTORY_LEVEL: u32 = 15;

/// The level that records `--constraint` node counts; below it the services refuse jobs that
/// use them.
pub const FEATURE_COUNTS_LEVEL: u32 = 15;

/// The level that applies [`Command::PurgeJobs`] and [`Command::RecallJobs`]; below it ended
/// jobs stay in the hot state.
pub const HISTORY_LEVEL: u32 = 14;

/// The level that records who cancelled a job (`sacct`'s `CANCELLED by UID`).
pub const CANCELLED_BY_LEVEL: u32 = 13;

/// The level that cancels `--kill-on-invalid-dep=yes` jobs and takes node lists shorter than
/// the job; below it the services refuse jobs that use them.
pub const NODE_LIST_PART_LEVEL: u32 = 13;

/// The level that records the dependency and constraint forms of level 12; below it the
/// services refuse jobs that use them.
pub const DEPENDENCY_FORMS_LEVEL: u32 = 12;

/// The level that records jobs' notes, node lists and exclusions, and admits a job only if
/// enough of its partition's nodes are ones it may have; below it the services refuse jobs
/// that carry them.
pub const NODE_CHOICE_LEVEL: u32 = 11;

/// The level that applies [`Command::RequeueJob`].
pub const REQUEUE_LEVEL: u32 = 11;

/// The level that runs a multi-node job's script once, on its first node, and applies steps.
pub const STEPS_LEVEL: u32 = 9;

/// The level that applies `StartStep.expect`; below it the leader launches a step only once
/// its entry has committed.
pub const EARLY_STEP_LEVEL: u32 = 10;

/// The level that applies [`Command::SubmitJobs`]; below it the leader proposes one
/// `SubmitJob` per submit.
pub const SUBMIT_JOBS_LEVEL: u32 = 5;

/// The level that applies [`Command::Batch`]; below it the leader proposes each command alone.
pub const BATCH_LEVEL: u32 = 6;

/// The level from which replicas write compressed snapshots; below it a replica of an older
/// release could be sent one it cannot decode.
pub const COMPRESSED_SNAPSHOT_LEVEL: u32 = 7;

/// The level of a replica that reports none (a release from before levels were reported).
pub const BASE_LEVEL: u32 = 1;

/// What a replica runs, as the leader recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaVersion {
    /// The highest feature level it applies.
    pub level: u32,
    /// Its software version, for operators.
    pub version: String,
}

/// One submit of a [`Command::SubmitJobs`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Submit {
    pub spec: Box<JobSpec>,
    pub user: String,
    pub request_id: String,
}

/// The level a replica needs to apply a submit of this job, and what in the job needs it.
pub fn spec_level(spec: &JobSpec) -> (u32, &'static str) {
    if spec.overcommit {
        (HET_PARTITIONS_LEVEL, "a job with --overcommit")
    } else if spec.het.iter().any(|c| c.partition.is_some()) {
        (HET_PARTITIONS_LEVEL, "a heterogeneous job whose components name partitions of their own")
    } else if spec.container.is_some() {
        (CONTAINER_LEVEL, "a job in a container (--container-image)")
    } else if !spec.het.is_empty() {
        (HET_LEVEL, "a heterogeneous job (hetjob components)")
    } else if spec.oversubscribe {
        (OVERSUBSCRIBE_LEVEL, "a job with --oversubscribe")
    } else if spec.reservation.is_some() {
        (RESERVATION_LEVEL, "a job with --reservation")
    } else if spec.uses_level_15() {
        (FEATURE_COUNTS_LEVEL, "a job with node counts in --constraint (feature*count)")
    } else if spec.uses_level_13() {
        (
            NODE_LIST_PART_LEVEL,
            "a job with --kill-on-invalid-dep=yes, --gid or --constraint [a|b], or a --nodelist naming fewer nodes than --nodes",
        )
    } else if spec.uses_level_12() {
        (
            DEPENDENCY_FORMS_LEVEL,
            "a job with aftercorr, after:ID+MINUTES, dependencies joined by '?', features joined by '|', --priority or --licenses",
        )
    } else if spec.uses_level_11() {
        (
            NODE_CHOICE_LEVEL,
            "a job with --comment, --wckey, --mail-*, --open-mode=append, --exclude, --nodelist or script arguments",
        )
    } else if spec.interactive {
        (STEPS_LEVEL, "an allocation for salloc or srun")
    } else if spec.batch_step {
        (STEPS_LEVEL, "a multi-node job whose script runs once, on its first node (submit with --every-node meanwhile)")
    } else if spec.array.is_some() {
        (4, "a job array")
    } else if spec.warn_signal.is_some() {
        (3, "a job with --signal")
    } else if spec.requeue {
        (2, "a job with --requeue")
    } else {
        (BASE_LEVEL, "every command")
    }
}

/// Every change to the cluster state. Each carries the leader's wall clock as `now`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    SubmitJob {
        spec: Box<JobSpec>,
        user: String,
        now: Millis,
        request_id: String,
    },
    /// Submits that arrived together, applied in order as if each were a `SubmitJob` at `now`:
    /// the leader puts concurrent submits in one entry, so they share one round of fsyncs.
    SubmitJobs {
        submits: Vec<Submit>,
        now: Millis,
    },
    ApplyPlan {
        /// The applied index of the view the plan was made from.
        base_index: u64,
        now: Millis,
        starts: Vec<PlannedStart>,
        reasons: Vec<(JobId, PendingReason)>,
        /// Running jobs to stop so that a pending one starts on their nodes (level 17).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        preemptions: Vec<quorum_model::preempt::PlannedPreemption>,
        /// Jobs suspended by preemption to resume, their CPUs free again (level 23); applied
        /// before the starts.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        resumes: Vec<JobId>,
        /// The starts each job the plan starts was shown while it waited, kept with it for the
        /// job history (level 35).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        shown: Vec<(JobId, quorum_model::ShownStart)>,
    },
    JobEnded {
        job_id: JobId,
        token: u64,
        node: String,
        outcome: RankOutcome,
        now: Millis,
    },
    CancelJob {
        job_id: JobId,
        user: String,
        now: Millis,
        /// `job_id` is an array's id: every task of the array still active is cancelled.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        whole_array: bool,
    },
    RegisterNode {
        node: NodeRegistration,
        now: Millis,
    },
    SetPartitions {
        partitions: Vec<Partition>,
        now: Millis,
    },
    /// The partitions of a new cluster (or of one reaching level 32), from the leader's
    /// configuration: applied once; after that partitions change only at run time
    /// (`PutPartition`, `DeletePartition`). Level 32.
    SeedPartitions {
        partitions: Vec<Partition>,
        now: Millis,
    },
    /// An operator creates a partition (`previous` is `None`) or changes one (`previous` is
    /// what the change was made from: refused if the partition is no longer that, so that two
    /// changes at once do not lose one). A partition made the default makes the others not.
    /// Level 32 (`scontrol create|update partition`).
    PutPartition {
        partition: Partition,
        previous: Option<Partition>,
        now: Millis,
    },
    /// An operator deletes a partition no pending or running job is in. Level 32.
    DeletePartition {
        name: String,
        now: Millis,
    },
    /// An operator changes nodes (`scontrol update nodename=...`): their weight, the features
    /// in force, or DOWN (their jobs end NODE_FAIL or go back to the queue; the node stays
    /// DOWN until resumed). All or nothing. Level 32.
    UpdateNodes {
        nodes: Vec<String>,
        update: NodeUpdate,
        now: Millis,
    },
    SetPolicy {
        policy: Policy,
        now: Millis,
    },
    /// The cluster's licenses and their counts (level 12).
    SetLicenses {
        licenses: std::collections::BTreeMap<String, u32>,
        now: Millis,
    },
    /// The switch each node hangs off.
    SetTopology {
        switches: std::collections::BTreeMap<String, String>,
        now: Millis,
    },
    /// Seeds the account tree and QOS levels from the configuration of a new cluster.
    SeedAccounts {
        accounts: Vec<Account>,
        qos: Vec<Qos>,
        now: Millis,
    },
    /// Adds or changes one account at run time (like `sacctmgr add/modify account`).
    UpsertAccount {
        account: Account,
        now: Millis,
    },
    /// Adds or changes one QOS at run time.
    UpsertQos {
        qos: Qos,
        now: Millis,
    },
    HoldJob {
        job_id: JobId,
        user: String,
        now: Millis,
    },
    ReleaseJob {
        job_id: JobId,
        user: String,
        now: Millis,
    },
    /// `scontrol requeue`: a running job stops and goes back to the queue (its processes are
    /// killed as strays of an older allocation); a pending one stays queued.
    RequeueJob {
        job_id: JobId,
        user: String,
        now: Millis,
    },
    /// The leader heard nothing from the node's agent for `node_timeout`: the node is DOWN,
    /// and its jobs end NODE_FAIL or go back to the queue (`--requeue`).
    NodeDown {
        node: String,
        reason: String,
        now: Millis,
    },
    /// A digest point: each replica answers its state's digest where it applies this, so that
    /// replicas are compared at the same index (`quorum admin digest`). Changes nothing.
    Digest {
        now: Millis,
    },
    /// An operator drains nodes (no new job lands there; running ones go on) or resumes them
    /// (`quorum admin drain|resume`, like `scontrol update state=drain|resume`). All or nothing.
    SetNodesDrained {
        nodes: Vec<String>,
        /// `Some(reason)`: drain; `None`: resume.
        drain: Option<String>,
        now: Millis,
    },
    /// Why a job's launch failed on a node (its first reason is kept): said with its
    /// `JobEnded` (level 28).
    JobFailure {
        job_id: JobId,
        token: u64,
        why: String,
    },
    /// The leader saw a node's health change: `Some(problem)` (a GPU in FAILURE, the health
    /// check failing) drains a node that is up, `None` resumes a node its health drained.
    /// An operator's drain is left alone either way.
    SetNodeHealth {
        node: String,
        problem: Option<String>,
        now: Millis,
    },
    /// What each voter runs; the cluster's feature level is the lowest of them.
    SetReplicaVersions {
        versions: std::collections::BTreeMap<u64, ReplicaVersion>,
        now: Millis,
    },
    /// Commands that arrived together, applied in order as if each were an entry of its own at
    /// this index: the leader puts concurrent agent reports (a registration storm after a cold
    /// start, the ends of many short jobs) in one entry, so they share one round of fsyncs.
    Batch {
        commands: Vec<Command>,
    },
    /// `srun` inside a running job: a step where [`quorum_model::step::layout`] puts it, or a
    /// refusal (never fits, or wait for the job's other steps).
    StartStep {
        job_id: JobId,
        user: String,
        request: quorum_model::step::StepRequest,
        now: Millis,
        /// Where the leader already launched it (from its applied state, while this commits):
        /// apply refuses the step if it would start anywhere else, or under another id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<quorum_model::step::Placement>,
    },
    /// Every task of a step ended (or its `srun` went away): its resources are free again.
    EndStep {
        job_id: JobId,
        step_id: u32,
        /// The highest exit code of its tasks, and a signal that killed one.
        exit_code: i32,
        signal: Option<i32>,
        /// Ended by a cancel (Ctrl-C twice, the job's end), not by its tasks.
        cancelled: bool,
        now: Millis,
        /// What its tasks used, summed over them (level 16; absent when none reported it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<quorum_model::JobUsage>,
    },
    /// The command of an interactive allocation (salloc, srun from outside a job) ended with
    /// `exit_code`: the job ends COMPLETED (0) or FAILED.
    EndAllocation {
        job_id: JobId,
        user: String,
        exit_code: i32,
        now: Millis,
    },
    /// What a job used on one node, reported with (just before) that node's `JobEnded` in one
    /// entry (level 14). Counted once per node: a node whose end is already recorded adds
    /// nothing, so a report sent again is not counted twice.
    JobUsed {
        job_id: JobId,
        token: u64,
        node: String,
        usage: quorum_model::JobUsage,
    },
    /// These jobs ended `min_age` ago or more: they leave the hot state for the job history,
    /// each leaving a tombstone (level 14). See [`crate::purge`].
    PurgeJobs {
        jobs: Vec<JobId>,
        min_age: Millis,
        now: Millis,
    },
    /// Tombstones of jobs that left the state long ago, read back from the job history by the
    /// leader for a submit that depends on them (level 14).
    RecallJobs {
        jobs: Vec<(JobId, crate::tombstone::Departed)>,
        now: Millis,
    },
    /// The job history forgets up to `max` of the jobs that ended before `ended_before`, the
    /// earliest first (Slurm's `PurgeJobAfter`; level 15). Apply leaves the state as it is and
    /// hands the work to the replica's shell, which answers how many went.
    ForgetHistory {
        ended_before: Millis,
        max: u32,
    },
    /// `quorum update` / `scontrol update JobId=`: its owner or an operator (`root`) changes a
    /// job after its submit (level 17). A running job's time limit, name and comment may change;
    /// the rest only while it is pending; only operators raise a time limit.
    UpdateJob {
        job_id: JobId,
        user: String,
        update: quorum_model::update::JobUpdate,
        now: Millis,
    },
    /// `scontrol suspend` (`resume: false`) or `scontrol resume` by an operator (`root`): a
    /// running job's processes are frozen where they run and its time limit waits; it keeps its
    /// allocation (level 17).
    SuspendJob {
        job_id: JobId,
        user: String,
        resume: bool,
        now: Millis,
    },
    /// `scontrol create reservation` by an operator (`root`): nodes set aside over a window
    /// (level 18). A node count is made into nodes here, from those free over the window.
    CreateReservation {
        request: quorum_model::reservation::ResvRequest,
        user: String,
        now: Millis,
    },
    /// `scontrol update reservation`: what the request gives changes, checked as a create.
    UpdateReservation {
        request: quorum_model::reservation::ResvRequest,
        user: String,
        now: Millis,
    },
    /// `scontrol delete reservation`: refused while a job is in it, pending or running.
    DeleteReservation {
        name: String,
        user: String,
        now: Millis,
    },
    /// `quorum cron add`: a recurring job, its first firing computed by the leader (level 19).
    /// Its job is checked as a submit would be; apply gives it its id.
    AddCron {
        entry: Box<quorum_model::cron::CronEntry>,
        now: Millis,
    },
    /// `quorum cron remove`, by its owner or an operator (`root`).
    RemoveCron {
        id: u64,
        user: String,
        now: Millis,
    },
    /// The leader saw entry `id` due at `due_ms`: apply submits its job if `due_ms` is the
    /// firing the entry waits for (so a firing proposed twice submits once), and records
    /// `next_ms`, the leader's next firing after now (a missed firing runs once, late).
    FireCron {
        id: u64,
        due_ms: Millis,
        next_ms: Millis,
        now: Millis,
    },
    /// An admin gives `user` a role (`quorum admin role`); `User` takes back what was given.
    SetRole {
        user: String,
        role: quorum_model::Role,
        now: Millis,
    },
}

impl Command {
    /// The entry that applies a scheduling plan made from the state at `base_index`, or `None`
    /// when it would change nothing (no start, no reason): such a plan is not worth a log entry.
    pub fn apply_plan(
        base_index: u64,
        now: Millis,
        starts: Vec<PlannedStart>,
        reasons: Vec<(JobId, PendingReason)>,
        preemptions: Vec<quorum_model::preempt::PlannedPreemption>,
        resumes: Vec<JobId>,
    ) -> Option<Command> {
        if starts.is_empty() && reasons.is_empty() && preemptions.is_empty() && resumes.is_empty() {
            return None;
        }
        Some(Command::ApplyPlan { base_index, now, starts, reasons, preemptions, resumes, shown: Vec::new() })
    }

    /// This plan, keeping with each job it starts the starts that job was shown while it waited
    /// (level 35); a command other than a plan is left as it is.
    pub fn with_shown(mut self, with: Vec<(JobId, quorum_model::ShownStart)>) -> Command {
        if let Command::ApplyPlan { shown, .. } = &mut self {
            *shown = with;
        }
        self
    }

    /// Whether applying this may let the scheduler start something.
    pub fn wakes_scheduler(&self) -> bool {
        match self {
            // A held job cannot start until it is released (which wakes it).
            Command::SubmitJob { spec, .. } => !spec.hold,
            Command::SubmitJobs { submits, .. } => submits.iter().any(|s| !s.spec.hold),
            Command::Batch { commands } => commands.iter().any(Command::wakes_scheduler),
            Command::ApplyPlan { .. }
            | Command::Digest { .. }
            | Command::SetReplicaVersions { .. }
            | Command::ForgetHistory { .. } => false,
            _ => true,
        }
    }

    /// The feature level a replica needs to apply this, and what needs it.
    pub fn level(&self) -> (u32, &'static str) {
        match self {
            // The highest level a command may need first: a match arm below may fit it too.
            Command::SetPolicy { policy, .. } if !policy.tres_weights.is_zero() => {
                (TRES_WEIGHTS_LEVEL, "what each resource a job asks for adds to its priority (PriorityWeightTRES)")
            }
            Command::SetPartitions { partitions, .. } if partitions.iter().any(|p| !p.oversubscribe.is_no()) => {
                (OVERSUBSCRIBE_LEVEL, "a partition whose jobs share CPUs (OverSubscribe=YES or FORCE)")
            }
            Command::ApplyPlan { shown, .. } if !shown.is_empty() => {
                (FORECAST_LEVEL, "the starts jobs were shown while they waited, kept with them")
            }
            Command::ApplyPlan { preemptions, resumes, .. }
                if !resumes.is_empty()
                    || preemptions.iter().flat_map(|p| &p.victims).any(|v| v.mode == PreemptMode::Suspend) =>
            {
                (PREEMPT_SUSPEND_LEVEL, "suspending jobs to make room for another (preempt mode SUSPEND)")
            }
            Command::SetPartitions { partitions, .. }
                if partitions.iter().any(|p| p.preempt_mode == Some(PreemptMode::Suspend)) =>
            {
                (PREEMPT_SUSPEND_LEVEL, "a partition whose jobs are suspended when preempted")
            }
            Command::SetPolicy { policy, .. } if policy.preempt_mode == PreemptMode::Suspend => {
                (PREEMPT_SUSPEND_LEVEL, "jobs suspended when preempted (preempt_mode = \"suspend\")")
            }
            Command::UpsertQos { qos, .. } if qos.preempt_mode == Some(PreemptMode::Suspend) => {
                (PREEMPT_SUSPEND_LEVEL, "a QOS whose jobs are suspended when preempted")
            }
            Command::SeedAccounts { qos, .. } if qos.iter().any(|q| q.preempt_mode == Some(PreemptMode::Suspend)) => {
                (PREEMPT_SUSPEND_LEVEL, "a QOS whose jobs are suspended when preempted")
            }
            Command::CreateReservation { request, .. } | Command::UpdateReservation { request, .. }
                if request.flags.as_ref().is_some_and(|f| f.flex) =>
            {
                (FLEX_RESERVATION_LEVEL, "a reservation whose jobs may run outside it (Flags=FLEX)")
            }
            Command::SeedPartitions { .. } | Command::PutPartition { .. } | Command::DeletePartition { .. } => {
                (LIVE_CONFIG_LEVEL, "partitions changed at run time (scontrol create|update|delete partition)")
            }
            Command::UpdateNodes { .. } => {
                (LIVE_CONFIG_LEVEL, "nodes changed at run time (scontrol update nodename=... weight|features|state=down)")
            }
            Command::NodeDown { .. } => (2, "marking a silent node DOWN"),
            Command::Digest { .. } => (2, "a digest point"),
            Command::SetNodesDrained { .. } => (3, "draining or resuming a node"),
            Command::JobEnded { outcome: RankOutcome::OutOfMemory { .. }, .. } => (4, "a job ended OUT_OF_MEMORY"),
            Command::JobEnded { outcome: RankOutcome::PrologFailed, .. } => {
                (PROLOG_LEVEL, "a job requeued because its node's prolog failed")
            }
            Command::SetLicenses { .. } => (DEPENDENCY_FORMS_LEVEL, "the cluster's licenses"),
            Command::SetPartitions { partitions, .. } if partitions.iter().any(|p| !p.access.is_open()) => {
                (PARTITION_ACCESS_LEVEL, "a partition that admits only some accounts or QOS")
            }
            Command::SetNodeHealth { .. } => (4, "draining a node for its health"),
            Command::JobFailure { .. } => (CONTAINER_LEVEL, "why a job could not start"),
            Command::CancelJob { whole_array: true, .. } => (4, "cancelling a job array"),
            Command::SubmitJob { spec, .. } => spec_level(spec),
            Command::SetRole { .. } => (8, "giving a role"),
            Command::PurgeJobs { .. } => (HISTORY_LEVEL, "ended jobs leaving the hot state for the job history"),
            Command::ForgetHistory { .. } => (FORGET_HISTORY_LEVEL, "the job history forgetting its oldest jobs"),
            Command::JobUsed { usage, .. } if usage.has_gpu() => (GPU_USAGE_LEVEL, "what a job's GPUs did"),
            Command::JobUsed { .. } => (HISTORY_LEVEL, "what a job used"),
            Command::RecallJobs { .. } => (HISTORY_LEVEL, "jobs recalled from the job history for a dependency"),
            Command::RequeueJob { .. } => (REQUEUE_LEVEL, "requeueing a job (scontrol requeue)"),
            Command::UpdateJob { update, .. } if update.reservation.is_some() => {
                (RESERVATION_LEVEL, "moving a job into or out of a reservation")
            }
            Command::UpdateJob { .. } => (UPDATE_LEVEL, "changing a job after its submit (scontrol update)"),
            Command::CreateReservation { .. }
            | Command::UpdateReservation { .. }
            | Command::DeleteReservation { .. } => (RESERVATION_LEVEL, "advance reservations"),
            Command::AddCron { .. } | Command::RemoveCron { .. } | Command::FireCron { .. } => {
                (CRON_LEVEL, "recurring jobs (quorum cron)")
            }
            Command::UpsertAccount { account, .. } if account.uses_level_27() => {
                (QOS_ACCESS_LEVEL, "an account that names the QOS its users may use (QOS=, DefaultQOS=)")
            }
            Command::SeedAccounts { accounts, .. } if accounts.iter().any(|a| a.uses_level_27()) => {
                (QOS_ACCESS_LEVEL, "accounts that name the QOS their users may use")
            }
            Command::SetPolicy { policy, .. } if !policy.queue.is_none() => {
                (QUEUE_LIMITS_LEVEL, "limits on what the cluster holds (MaxJobCount, MaxArraySize, MaxSubmitJobs)")
            }
            Command::UpsertAccount { account, .. } if account.uses_level_20() => {
                (USER_SHARES_LEVEL, "an account with user shares, MaxTRESPerJob, MaxSubmitJobs or GrpTRESMins")
            }
            Command::UpsertQos { qos, .. } if qos.uses_level_20() => {
                (USER_SHARES_LEVEL, "a QOS with MaxTRESPerJob, MaxTRESPerUser, GrpTRES, GrpJobs, GrpTRESMins, MaxSubmitJobsPerUser or NoDecay")
            }
            Command::SeedAccounts { accounts, qos, .. }
                if accounts.iter().any(|a| a.uses_level_20()) || qos.iter().any(|q| q.uses_level_20()) =>
            {
                (USER_SHARES_LEVEL, "accounts or QOS with the limits or user shares of level 20")
            }
            Command::SuspendJob { .. } => (UPDATE_LEVEL, "suspending or resuming a job (scontrol suspend|resume)"),
            Command::ApplyPlan { preemptions, .. } if !preemptions.is_empty() => {
                (PREEMPTION_LEVEL, "preempting jobs to make room for another")
            }
            Command::StartStep { request, .. } if request.cyclic => {
                (CYCLIC_LEVEL, "a job step with --distribution=cyclic")
            }
            Command::StartStep { request, .. } if request.overcommit => {
                (OVERCOMMIT_LEVEL, "a job step with --overcommit")
            }
            Command::StartStep { expect: Some(_), .. } => (EARLY_STEP_LEVEL, "a job step launched as it commits"),
            Command::EndStep { usage: Some(_), .. } => (STEP_USAGE_LEVEL, "what a job step used"),
            Command::StartStep { .. } | Command::EndStep { .. } => (STEPS_LEVEL, "a job step (srun)"),
            Command::EndAllocation { .. } => (STEPS_LEVEL, "ending an allocation (salloc, srun)"),
            // Its own level, or a submit's in it above that.
            Command::SubmitJobs { submits, .. } => submits
                .iter()
                .map(|s| spec_level(&s.spec))
                .filter(|(level, _)| *level > SUBMIT_JOBS_LEVEL)
                .max_by_key(|(level, _)| *level)
                .unwrap_or((SUBMIT_JOBS_LEVEL, "several submits in one entry")),
            Command::Batch { commands } => commands
                .iter()
                .map(Command::level)
                .filter(|(level, _)| *level > BATCH_LEVEL)
                .max_by_key(|(level, _)| *level)
                .unwrap_or((BATCH_LEVEL, "several agent reports in one entry")),
            _ => (BASE_LEVEL, "every command"),
        }
    }
}

/// Why apply dropped a start the scheduler planned: the state it met is no longer the one the
/// plan was made from (a job cancelled, a node drained, resources taken meanwhile). Each kind is
/// counted and logged by the leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum DropReason {
    #[error("job {job} does not exist")]
    JobGone { job: JobId },
    #[error("job {job} is {state}")]
    JobNotPending { job: JobId, state: JobState },
    #[error("job {job} was held after the plan was made")]
    Held { job: JobId },
    #[error("job {job} needs {wanted} nodes, plan gave {planned}")]
    NodeCount { job: JobId, wanted: u32, planned: usize },
    #[error("partition {partition} no longer exists")]
    PartitionGone { partition: String },
    #[error("job {job}: {reason}")]
    Reservation { job: JobId, reason: String },
    #[error("node {node} appears twice")]
    NodeTwice { node: String },
    #[error("node {node} is not in partition {partition}")]
    NodeNotInPartition { node: String, partition: String },
    #[error("node {node} is unknown")]
    NodeUnknown { node: String },
    #[error("node {node} is {state}")]
    NodeNotSchedulable { node: String, state: String },
    #[error("node {node} lacks the CPUs or memory now")]
    NodeFull { node: String },
    #[error("allocation on {node} is smaller than the request")]
    TooSmall { node: String },
    #[error("allocation on {node} has too few GPUs")]
    TooFewGpus { node: String },
    #[error("node {node} has no GPU {gpu}")]
    NoSuchGpu { node: String, gpu: u32 },
    #[error("GPU {gpu} on {node} is not of type {gpu_type}")]
    GpuType { node: String, gpu: u32, gpu_type: String },
    #[error("GPU {gpu} on {node} is taken")]
    GpuTaken { node: String, gpu: u32 },
}

impl DropReason {
    /// The kind of reason, for counting.
    pub fn kind(&self) -> &'static str {
        match self {
            DropReason::JobGone { .. } => "job_gone",
            DropReason::JobNotPending { .. } => "job_not_pending",
            DropReason::Held { .. } => "held",
            DropReason::NodeCount { .. } => "node_count",
            DropReason::PartitionGone { .. } => "partition_gone",
            DropReason::Reservation { .. } => "reservation",
            DropReason::NodeTwice { .. } => "node_twice",
            DropReason::NodeNotInPartition { .. } => "node_not_in_partition",
            DropReason::NodeUnknown { .. } => "node_unknown",
            DropReason::NodeNotSchedulable { .. } => "node_not_schedulable",
            DropReason::NodeFull { .. } => "node_full",
            DropReason::TooSmall { .. } => "too_small",
            DropReason::TooFewGpus { .. } => "too_few_gpus",
            DropReason::NoSuchGpu { .. } => "no_such_gpu",
            DropReason::GpuType { .. } => "gpu_type",
            DropReason::GpuTaken { .. } => "gpu_taken",
        }
    }
}

/// What applying a command answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Ok,
    /// The command referred to an older allocation or an already-finished job.
    Ignored,
    Rejected(Rejection),
    Submitted {
        job_id: JobId,
        duplicate: bool,
    },
    Cancelled {
        job_id: JobId,
        was_running: bool,
    },
    Held {
        job_id: JobId,
    },
    Released {
        job_id: JobId,
    },
    PlanApplied {
        started: Vec<JobId>,
        dropped: Vec<(JobId, DropReason)>,
        /// The jobs told to stop for another (preempted), with the job each makes room for.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        preempted: Vec<(JobId, JobId)>,
    },
    JobFinished {
        job_id: JobId,
        state: JobState,
    },
    /// The job lost a node and went back to the queue.
    Requeued {
        job_id: JobId,
    },
    /// An `UpdateJob` changed the job.
    Updated {
        job_id: JobId,
    },
    /// An `AddCron` made this entry.
    CronAdded {
        id: u64,
    },
    /// A `FireCron` fired: the job it submitted, or why it submitted none.
    CronFired {
        id: u64,
        job: Option<JobId>,
        error: Option<String>,
    },
    /// A reservation was made or changed: as it is now.
    Reserved {
        reservation: Box<quorum_model::reservation::Reservation>,
    },
    /// A `SuspendJob` suspended or resumed it.
    Suspended {
        job_id: JobId,
        resumed: bool,
    },
    Digest {
        digest: u64,
    },
    NodeDowned {
        /// Jobs that ended NODE_FAIL (or CANCELLED, when a cancel was already asked for).
        ended: Vec<JobId>,
        requeued: Vec<JobId>,
    },
    /// The answers to a `SubmitJobs`, in its order: each `Submitted` or `Rejected`.
    SubmittedMany(Vec<Response>),
    /// The answers to a `Batch`, in its order.
    Batch(Vec<Response>),
    StepStarted {
        job_id: JobId,
        step: Box<quorum_model::step::Step>,
    },
    /// The jobs a `PurgeJobs` took out of the hot state, whole, for the replica's shell to write
    /// into the job history.
    Purged {
        jobs: Vec<quorum_model::Shared<quorum_model::Job>>,
    },
    /// What a `ForgetHistory` asks of the replica's shell: to forget up to `max` of the jobs
    /// that ended before `ended_before`. The shell answers [`Response::Forgotten`] instead.
    ForgetHistory {
        ended_before: Millis,
        max: u32,
    },
    /// How many jobs the history forgot, and whether more ended before the time asked.
    Forgotten {
        count: u32,
        more: bool,
    },
}
