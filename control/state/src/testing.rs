//! Builders of states and commands for tests: this crate's, and (with the `testing` feature)
//! those of the crates above it.

use quorum_model::{hostlist, Gpu, JobSpec, Partition, Program};

use crate::{apply, ClusterState, Command, NodeRegistration, Response};

/// A partition of `nodes` (a hostlist) with a day's time limit and 1G per CPU.
pub fn partition(name: &str, nodes: &str, default: bool) -> Partition {
    Partition {
        name: name.into(),
        nodes: nodes.into(),
        node_names: hostlist::expand(nodes).expect("a test's hostlist is valid").into_iter().collect(),
        default,
        max_time_s: Some(86_400),
        default_time_s: None,
        default_mem_per_cpu_mb: 1024,
        priority_tier: 0,
        max_nodes: None,
        exclusive: false,
        oversubscribe: Default::default(),
        preempt_mode: None,
        grace_time_s: 0,
        access: Default::default(),
        state: Default::default(),
    }
}

pub fn spec(argv: &[&str]) -> JobSpec {
    JobSpec {
        name: "t".into(),
        partition: None,
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        mem_per_node_mb: None,
        gpus_per_node: 0,
        gpu_type: None,
        time_limit_s: None,
        program: Program::Argv(argv.iter().map(|s| s.to_string()).collect()),
        work_dir: "/tmp".into(),
        stdout: None,
        stderr: None,
        env: Default::default(),
        submit_dir: "/tmp".into(),
        ..Default::default()
    }
}

pub fn register(name: &str, cpus: u32, gpus: u32) -> Command {
    Command::RegisterNode {
        node: NodeRegistration {
            name: name.into(),
            cpus,
            mem_mb: 64 * 1024,
            gpus: (0..gpus).map(|i| Gpu { index: i, gpu_type: "h100".into() }).collect(),
            features: vec![],
            version: "test".into(),
        },
        now: 1,
    }
}

pub fn cluster() -> ClusterState {
    let mut s = ClusterState::new();
    apply(&mut s, 1, Command::SetPartitions { partitions: vec![partition("gpu", "n[1-2]", true)], now: 1 });
    apply(&mut s, 2, register("n1", 8, 4));
    apply(&mut s, 3, register("n2", 8, 4));
    s
}

/// Applies alice's submit of `spec` at `index` (stamped `1000 + index`).
pub fn submit(s: &mut ClusterState, index: u64, spec: JobSpec, request_id: &str) -> Response {
    apply(
        s,
        index,
        Command::SubmitJob {
            spec: Box::new(spec),
            user: "alice".into(),
            now: 1000 + index,
            request_id: request_id.into(),
        },
    )
}
