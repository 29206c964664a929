//! Reservations that leave room: among the node sets that give a blocked job its earliest
//! start, the one that hides the fewest of the nodes idle now from backfill.

use super::tests::{estimate_s, fifo, node, started, Bench};
use super::*;

fn nodes_of(b: &Bench, job: u64) -> Vec<String> {
    b.state.jobs[&job].allocation.as_ref().unwrap().nodes.iter().map(|n| n.node.clone()).collect()
}

/// Issue 29's example on four one-CPU nodes: job 1 (2 nodes, 20 s) and job 2 (2 nodes, 100 s)
/// start at t=0; job 3 (3 nodes, 50 s) comes at t=30 and can start at t=100, when job 2 ends;
/// job 4 (1 node, 1000 s) comes at t=31. Job 3's reservation takes job 2's two nodes and one
/// of the two idle since t=20, so job 4 starts at once on the other, delaying nothing: at
/// t=100 job 3 starts on exactly the nodes it was reserved.
fn four_jobs(backfill: BackfillMode, reservations: u32) {
    let nodes = (0..4).map(|i| node(&format!("n{i}"), 1, 0, "", &[])).collect();
    let mut b = Bench::new(nodes, fifo(backfill, reservations));
    b.at(0);
    let (one, two) = (b.submit(2, 20), b.submit(2, 100));
    assert_eq!(started(&b.cycle()), vec![one, two]);
    let idle = nodes_of(&b, one);
    let busy = nodes_of(&b, two);
    b.at(20);
    b.end(one);
    assert!(started(&b.cycle()).is_empty());

    b.at(30);
    let three = b.submit(3, 50);
    let p = b.cycle();
    assert!(started(&p).is_empty());
    assert_eq!(estimate_s(&p, three), Some(100), "job 3 can start when job 2 ends");
    let reserved = p.estimates[&three].nodes.clone();
    assert!(busy.iter().all(|n| reserved.contains(n)), "job 3 is reserved job 2's nodes first: {reserved:?}");
    assert_eq!(idle.iter().filter(|n| reserved.contains(n)).count(), 1, "and one idle node: {reserved:?}");

    b.at(31);
    let four = b.submit(1, 1000);
    let p = b.cycle();
    assert_eq!(started(&p), vec![four], "job 4 starts on the idle node job 3 does not need");
    assert_eq!(estimate_s(&p, three), Some(100), "and job 3's start does not move");
    assert_eq!(p.estimates[&three].nodes, reserved, "nor do its nodes");
    let on = nodes_of(&b, four);
    assert!(on.len() == 1 && idle.contains(&on[0]) && !reserved.contains(&on[0]), "job 4 on {on:?}");

    b.at(100);
    b.end(two);
    let p = b.cycle();
    assert_eq!(started(&p), vec![three], "job 3 starts when reserved");
    let (mut got, mut want) = (nodes_of(&b, three), reserved);
    got.sort();
    want.sort();
    assert_eq!(got, want, "on the nodes it was reserved");
}

#[test]
fn easy_reserves_the_nodes_busy_now_first_and_backfills_the_idle_one() {
    four_jobs(BackfillMode::Easy, 1);
}

#[test]
fn conservative_reserves_the_nodes_busy_now_first_and_backfills_the_idle_one() {
    four_jobs(BackfillMode::Conservative, 10);
}

/// A reservation prefers the node whose GPU is busy now to the one whose GPU is idle, though
/// the idle one has fewer CPUs left over: an idle GPU hidden is capacity lost to backfill.
#[test]
fn a_reservation_hides_an_idle_gpu_last() {
    let nodes = vec![node("g1", 4, 1, "a100", &[]), node("g2", 2, 1, "a100", &[])];
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 1));
    b.at(0);
    let holder = b.submit_with("alice", |s| {
        (s.gpus_per_node, s.cpus_per_task, s.nodelist, s.time_limit_s) = (1, 1, vec!["g1".into()], Some(100));
    });
    let cpus = b.submit_with("alice", |s| {
        (s.cpus_per_task, s.nodelist, s.time_limit_s) = (2, vec!["g2".into()], Some(100));
    });
    assert_eq!(started(&b.cycle()), vec![holder, cpus]);
    // Needs a GPU and 2 CPUs until t=100 on either node: g1's GPU is busy, g2's CPUs are.
    let blocked = b.submit_with("alice", |s| {
        (s.gpus_per_node, s.cpus_per_task, s.time_limit_s) = (1, 2, Some(50));
    });
    let p = b.cycle();
    assert!(started(&p).is_empty());
    assert_eq!(estimate_s(&p, blocked), Some(100));
    assert_eq!(p.estimates[&blocked].nodes, vec!["g1".to_string()], "g2's GPU is idle now; g1's is not");
}
