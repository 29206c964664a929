//! Placement: which nodes can hold a job now, and exactly what each gives it.

use crate::model::{Allocation, NodeAllocation};

use super::view::{NodeView, PendingJob};

/// Chooses `job.nodes` nodes among `candidates` (indices into `nodes`) that can each hold one
/// node's share now, preferring the best fit (the node left with the fewest free CPUs), and
/// names the GPU indices taken on each. All or nothing: `None` when too few nodes fit.
pub fn place(job: &PendingJob, candidates: &[usize], nodes: &[NodeView]) -> Option<Allocation> {
    let gpu_type = job.gpu_type.as_deref();
    let mut fitting: Vec<&NodeView> = candidates
        .iter()
        .map(|&i| &nodes[i])
        .filter(|n| {
            n.schedulable
                && n.free_cpus >= job.cpus_per_node
                && n.free_mem_mb >= job.mem_per_node_mb
                && n.free_gpus.iter().filter(|(_, t)| gpu_type.is_none_or(|w| w == t)).count()
                    >= job.gpus_per_node as usize
        })
        .collect();
    if fitting.len() < job.nodes as usize {
        return None;
    }
    // Best fit; ties by name order (candidates are in name order and the sort is stable).
    fitting.sort_by_key(|n| n.free_cpus - job.cpus_per_node);
    let allocation = fitting[..job.nodes as usize]
        .iter()
        .map(|n| NodeAllocation {
            node: n.name.clone(),
            cpus: job.cpus_per_node,
            mem_mb: job.mem_per_node_mb,
            gpus: n
                .free_gpus
                .iter()
                .filter(|(_, t)| gpu_type.is_none_or(|w| w == t))
                .take(job.gpus_per_node as usize)
                .map(|(i, _)| *i)
                .collect(),
        })
        .collect();
    Some(Allocation { nodes: allocation })
}
