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

/// Among nodes all busy now, a reservation takes those that free up last before its start: a
/// node free earlier can run a job past the start in the meantime. n1..n4 run jobs until 50,
/// 90, 100 and 90; a 2-node job can start at 90 and is reserved n2 and n4, not n1; at 50 a
/// long job starts on n1.
#[test]
fn a_reservation_takes_the_nodes_that_free_up_last_before_its_start() {
    let nodes = (1..=4).map(|i| node(&format!("n{i}"), 1, 0, "", &[])).collect();
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 1));
    b.at(0);
    let running: Vec<u64> = [50, 90, 100, 90].iter().map(|&limit| b.submit(1, limit)).collect();
    assert_eq!(started(&b.cycle()), running);
    let on: Vec<String> = running.iter().map(|&j| nodes_of(&b, j)[0].clone()).collect();
    assert_eq!(on, ["n1", "n2", "n3", "n4"]);
    let wide = b.submit(2, 50);
    let p = b.cycle();
    assert_eq!(estimate_s(&p, wide), Some(90));
    let mut reserved = p.estimates[&wide].nodes.clone();
    reserved.sort();
    assert_eq!(reserved, ["n2", "n4"], "n1 frees at 50, 40 s before the start");
    b.at(50);
    b.end(running[0]);
    let long = b.submit(1, 1000);
    let p = b.cycle();
    assert_eq!(started(&p), vec![long], "n1 is not reserved: the long job starts there");
    assert_eq!(nodes_of(&b, long), ["n1"]);
    assert_eq!(estimate_s(&p, wide), Some(90));
}
