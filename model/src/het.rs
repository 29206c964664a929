//! Heterogeneous jobs (Slurm's `hetjob`): one job of several components, each asking for its
//! own resources, allocated all together or not at all, on nodes no two components share (as
//! Slurm refuses a node named by two components). The job runs its batch script once, on the
//! first node of component 0; its steps run on the nodes of the components they name
//! (`srun --het-group`, component 0 when none is named).
//!
//! Component 0 is the job's own spec; the others (`JobSpec::het`) carry only what differs
//! between components: nodes, tasks, CPUs, memory, GPUs and the nodes they may have. Everything
//! else (partition, account, QOS, time limit, dependencies, name, output) is the job's.

use serde::{Deserialize, Serialize};

/// The most components a heterogeneous job may have.
pub const MAX_COMPONENTS: usize = 128;

/// What one component after the first asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HetComponent {
    pub nodes: u32,
    pub ntasks: u32,
    pub cpus_per_task: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_per_node_mb: Option<u64>,
    #[serde(default)]
    pub gpus_per_node: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraint: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub constraint_any: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub constraint_same: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraint_counts: Vec<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodelist: Vec<String>,
    /// Its own partition, when it is not the job's (component 0's); `None` in the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
}

/// A heterogeneous job's component as Slurm names it: `JOB+K`.
pub fn component_name(job: u64, k: usize) -> String {
    format!("{job}+{k}")
}

/// Reads `JOB+K` (a component of a heterogeneous job) or `JOB`: the job and the component.
pub fn parse_component(text: &str) -> Option<(u64, Option<usize>)> {
    match text.trim().split_once('+') {
        Some((job, k)) => Some((job.parse().ok()?, Some(k.parse().ok()?))),
        None => Some((text.trim().parse().ok()?, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_named_as_slurm_names_them() {
        assert_eq!(component_name(7, 1), "7+1");
        assert_eq!(parse_component("7+1"), Some((7, Some(1))));
        assert_eq!(parse_component("7"), Some((7, None)));
        assert_eq!(parse_component("7+x"), None);
    }
}
