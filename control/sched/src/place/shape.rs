//! The shape of a request, the key of a cycle's cache of what did not fit.

use crate::view::PendingJob;

/// The shape of a request as far as fitting it now goes: a shape that did not fit for some
/// duration does not fit for a longer one within the same cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Shape<'a> {
    partition: usize,
    /// Per node: CPUs, memory, GPUs.
    per_node: (i64, i64, i64),
    nodes: u32,
    gpu_type: Option<&'a str>,
    features: &'a [String],
    features_any: bool,
    features_same: bool,
    feature_counts: &'a [u32],
    exclude: &'a [String],
    only: &'a [String],
    exclusive: bool,
}

impl<'a> Shape<'a> {
    pub(super) fn of(partition: usize, job: &'a PendingJob) -> Shape<'a> {
        Shape {
            partition,
            per_node: (job.per_node.cpus, job.per_node.mem, job.per_node.gpus),
            nodes: job.nodes,
            gpu_type: job.gpu_type.as_deref(),
            features: job.features.as_slice(),
            features_any: job.features_any,
            features_same: job.features_same,
            feature_counts: job.feature_counts.as_slice(),
            exclude: job.exclude.as_slice(),
            only: job.only.as_slice(),
            exclusive: job.exclusive,
        }
    }
}
