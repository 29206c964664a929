//! The replicated state machine.
//!
//! [`apply`] is the only writer of [`ClusterState`]. Every replica applies the same log and must
//! reach the same state byte for byte, so apply reads no clock (commands carry the leader's
//! timestamp; `state.clock` only moves forward), uses no randomness and iterates only ordered
//! maps. Business rejections are returned as data in [`Response`], never as errors.

mod apply;
mod cluster;
mod commands;
mod digest;
mod purge;
pub mod qos_access;
mod reserve;
pub mod snapshot;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tombstone;

pub use apply::{apply, check_submit, plan_step};
pub use cluster::{lowest_level, ClusterState, DEFAULT_ACCOUNT, DEFAULT_QOS};
pub use commands::{
    spec_level, Command, DropReason, NodeRegistration, NodeUpdate, ReplicaVersion, Response, Submit, BASE_LEVEL,
    BATCH_LEVEL, CANCELLED_BY_LEVEL, COMPLETING_LEVEL, COMPRESSED_SNAPSHOT_LEVEL, CONTAINER_LEVEL, CRON_LEVEL,
    CYCLIC_LEVEL, DEPENDENCY_FORMS_LEVEL, EARLY_STEP_LEVEL, FEATURE_LEVEL, FLEX_RESERVATION_LEVEL, FORECAST_LEVEL,
    FORGET_HISTORY_LEVEL, GPU_USAGE_LEVEL, HET_LEVEL, HET_PARTITIONS_LEVEL, HISTORY_LEVEL, HOLD_FENCE_LEVEL,
    LIVE_CONFIG_LEVEL, NODE_CHOICE_LEVEL, NODE_LIST_PART_LEVEL, OVERCOMMIT_LEVEL, OVERSUBSCRIBE_LEVEL,
    PARTITION_ACCESS_LEVEL, PREDICT_LEVEL, PREEMPTION_LEVEL, PREEMPT_SUSPEND_LEVEL, PROLOG_LEVEL, QOS_ACCESS_LEVEL,
    QUEUE_LIMITS_LEVEL, REQUEUE_LEVEL, RESERVATION_LEVEL, RUNS_BY_LIMIT_LEVEL, STEP_USAGE_LEVEL, SUBMIT_JOBS_LEVEL,
    TRES_WEIGHTS_LEVEL, UPDATE_LEVEL, USER_SHARES_LEVEL,
};
pub use digest::digest;
pub use purge::{aged, tombstones};
pub use tombstone::{Departed, Outcome};

#[cfg(test)]
mod props;
#[cfg(test)]
mod queue_tests;
#[cfg(test)]
mod tests;
