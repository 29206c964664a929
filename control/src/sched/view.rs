//! The scheduler's input: free capacity per node and the pending queue, copied out of the state.

use std::collections::BTreeMap;

use crate::model::{JobId, JobState, Millis, NodeAllocation};
use crate::state::ClusterState;

/// A node as placement sees it: what is free now.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub schedulable: bool,
    pub cpus: u32,
    pub free_cpus: u32,
    pub mem_mb: u64,
    pub free_mem_mb: u64,
    /// Free GPUs as (index, type), in index order.
    pub free_gpus: Vec<(u32, String)>,
}

impl NodeView {
    /// Removes what an allocation holds from the free capacity.
    pub fn take(&mut self, a: &NodeAllocation) {
        self.free_cpus = self.free_cpus.checked_sub(a.cpus).expect("placement checked the CPUs");
        self.free_mem_mb = self.free_mem_mb.checked_sub(a.mem_mb).expect("placement checked the memory");
        self.free_gpus.retain(|(i, _)| !a.gpus.contains(i));
    }
}

/// A pending job as placement sees it: one node's share of the request and how many nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingJob {
    pub id: JobId,
    pub partition: String,
    pub submit_time: Millis,
    pub nodes: u32,
    pub cpus_per_node: u32,
    pub mem_per_node_mb: u64,
    pub gpus_per_node: u32,
    pub gpu_type: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    pub nodes: Vec<NodeView>,
    pub node_index: BTreeMap<String, usize>,
    /// Indices into `nodes` of each partition's registered nodes, in name order.
    pub partition_nodes: BTreeMap<String, Vec<usize>>,
    pub pending: Vec<PendingJob>,
}

impl ClusterView {
    pub fn from_state(state: &ClusterState) -> Self {
        let mut view = ClusterView::default();
        for node in state.nodes.values() {
            view.node_index.insert(node.name.clone(), view.nodes.len());
            view.nodes.push(NodeView {
                name: node.name.clone(),
                schedulable: node.schedulable(),
                cpus: node.cpus,
                free_cpus: node.cpus.saturating_sub(node.alloc_cpus),
                mem_mb: node.mem_mb,
                free_mem_mb: node.mem_mb.saturating_sub(node.alloc_mem_mb),
                free_gpus: node
                    .gpus
                    .iter()
                    .filter(|g| !node.alloc_gpus.contains(&g.index))
                    .map(|g| (g.index, g.gpu_type.clone()))
                    .collect(),
            });
        }
        for p in state.partitions.values() {
            let idx = p.node_names.iter().filter_map(|n| view.node_index.get(n).copied()).collect();
            view.partition_nodes.insert(p.name.clone(), idx);
        }
        view.pending = state
            .jobs
            .values()
            .filter(|j| j.state == JobState::Pending && !j.cancel_requested)
            .map(|j| PendingJob {
                id: j.id,
                partition: j.partition.clone(),
                submit_time: j.submit_time,
                nodes: j.spec.nodes,
                cpus_per_node: j.spec.cpus_per_node(),
                mem_per_node_mb: j.spec.mem_per_node_mb.unwrap_or(0),
                gpus_per_node: j.spec.gpus_per_node,
                gpu_type: j.spec.gpu_type.clone(),
            })
            .collect();
        view
    }
}

/// The post-condition every plan must keep: no node has negative free capacity. (Free
/// capacity is unsigned and `take` panics on underflow, so this checks GPU bookkeeping.)
pub(crate) fn no_overcommit(nodes: &[NodeView]) -> bool {
    nodes.iter().all(|n| n.free_cpus <= n.cpus && n.free_mem_mb <= n.mem_mb)
}
