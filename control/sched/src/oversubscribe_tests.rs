//! Partitions whose jobs share CPUs (`OverSubscribe=YES|FORCE[:N]`), through the real state
//! machine and scheduler: a worked example with two ways of sharing on one cluster.

use super::tests::{fifo, node, started, Bench};
use super::*;
use quorum_model::oversubscribe::OverSubscribe;
use quorum_model::{JobState, Partition};
use quorum_state::Command;

fn partition(name: &str, nodes: &[&str], default: bool, oversubscribe: OverSubscribe) -> Partition {
    let mut p = quorum_state::testing::partition(name, "x", default);
    p.node_names = nodes.iter().map(|n| n.to_string()).collect();
    p.nodes = nodes.join(",");
    p.oversubscribe = oversubscribe;
    p
}

/// n1 and n2 have two CPUs each, n1 a GPU. `shared` (n1) shares every job's CPUs two ways,
/// `opt` (n2) three ways for the jobs that ask (`--oversubscribe`), and `batch` (both) not at
/// all: the nodes' books count sixths of a CPU.
#[test]
fn jobs_share_cpus_as_their_partition_says_and_never_memory_or_gpus() {
    let mut b = Bench::new(vec![node("n1", 2, 1, "a100", &[]), node("n2", 2, 0, "", &[])], fifo(BackfillMode::Easy, 5));
    let partitions = vec![
        partition("batch", &["n1", "n2"], true, OverSubscribe::No),
        partition("shared", &["n1"], false, OverSubscribe::Force(2)),
        partition("opt", &["n2"], false, OverSubscribe::Yes(3)),
    ];
    b.cmd(Command::SetPartitions { partitions, now: 0 });
    b.at(0);
    let job = |b: &mut Bench, part: &str, asks: bool| {
        let part = part.to_string();
        b.submit_with("alice", move |s| {
            s.partition = Some(part);
            s.oversubscribe = asks;
        })
    };
    let shared: Vec<u64> = (0..5).map(|_| job(&mut b, "shared", false)).collect();
    let plain = job(&mut b, "batch", false);
    let asking: Vec<u64> = (0..4).map(|_| job(&mut b, "opt", true)).collect();
    let not_asking = job(&mut b, "opt", false);
    let p = b.cycle();
    assert_eq!(ClusterView::from_state(&b.state).cpu_parts, 6);
    // Four 1-CPU jobs shared two ways fill n1; the job that does not share goes to n2, where
    // three that ask share its other CPU three ways. The fifth of each, and a job of `opt`
    // that does not ask (it needs a whole CPU), wait.
    let mut want: Vec<u64> = shared[..4].to_vec();
    want.push(plain);
    want.extend(&asking[..3]);
    assert_eq!(started(&p), want);
    let ways = |b: &Bench, j: u64| b.state.jobs[&j].allocation.as_ref().map(|a| (a.nodes[0].node.clone(), a.ways()));
    assert!(shared[..4].iter().all(|&j| ways(&b, j) == Some(("n1".into(), 2))));
    assert_eq!(ways(&b, plain), Some(("n2".into(), 1)));
    assert!(asking[..3].iter().all(|&j| ways(&b, j) == Some(("n2".into(), 3))));
    for j in [shared[4], asking[3], not_asking] {
        assert_eq!(b.state.jobs[&j].state, JobState::Pending);
    }
    assert_eq!((b.state.nodes["n1"].cpus_in_use(), b.state.nodes["n2"].cpus_in_use()), (2, 2));
    assert_eq!(b.state.jobs[&shared[4]].reason, quorum_model::PendingReason::Resources);

    // Two shared jobs end, freeing a CPU's worth of n1: the fifth takes half of it.
    b.at(10);
    b.end(shared[0]);
    b.end(shared[1]);
    assert_eq!(started(&b.cycle()), vec![shared[4]]);
    // The job that does not share ends, freeing a CPU of n2: the `opt` job that asks takes a
    // third of it (it is first in the queue); the one that does not ask needs the whole CPU
    // and waits on.
    b.at(20);
    b.end(plain);
    assert_eq!(started(&b.cycle()), vec![asking[3]]);
    assert_eq!(b.state.jobs[&not_asking].state, JobState::Pending);
    assert_eq!(b.state.nodes["n2"].cpus_in_use(), 2, "four thirds, rounded up");

    // GPUs are never shared, and `FORCE` shares a job's CPUs even when it asks for whole
    // nodes (the partition's setting wins).
    b.at(30);
    for j in [shared[2], shared[3], shared[4]] {
        b.end(j);
    }
    let gpu = |b: &mut Bench| {
        b.submit_with("alice", |s| {
            s.partition = Some("shared".into());
            s.gpus_per_node = 1;
        })
    };
    let (g1, g2) = (gpu(&mut b), gpu(&mut b));
    let whole = b.submit_with("alice", |s| {
        s.partition = Some("shared".into());
        s.exclusive = true;
    });
    let p = b.cycle();
    assert_eq!(started(&p), vec![g1, whole]);
    assert_eq!(b.state.jobs[&g2].state, JobState::Pending);
    let held = &b.state.jobs[&whole].allocation.as_ref().unwrap().nodes[0];
    assert_eq!((held.node.as_str(), held.cpus, held.gpus.len()), ("n1", 1, 0));
    assert_eq!(b.state.nodes["n1"].cpus_in_use(), 1, "two 1-CPU jobs shared two ways: one CPU");
}
