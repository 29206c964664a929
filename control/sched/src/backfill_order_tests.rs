//! The order backfill tries the jobs behind the reservations (`Policy::backfill_order`): the
//! queue's, or shortest planned run time first (Tsafrir et al.'s SJBF; with predictions,
//! their EASY++). The reservations are made in the queue's order either way.

use std::collections::BTreeMap;

use super::tests::{estimate_s, fifo, node, started, Bench};
use super::*;

/// Three one-CPU nodes: a 2-node job runs until t=100, so one node is idle; a 3-node job waits
/// for all three and is reserved them at t=100. Behind it three 1-node jobs that would all end
/// before t=100 (limits 80, 60, 30), and room for one of them.
fn one_idle_node(order: BackfillOrder) -> (Bench, Plan, [u64; 4]) {
    let nodes = (1..=3).map(|i| node(&format!("n{i}"), 1, 0, "", &[])).collect();
    let mut b = Bench::new(nodes, Policy { backfill_order: order, ..fifo(BackfillMode::Easy, 1) });
    b.at(0);
    let running = b.submit(2, 100);
    assert_eq!(started(&b.cycle()), vec![running]);
    let wide = b.submit(3, 50);
    let (long, middle, short) = (b.submit(1, 80), b.submit(1, 60), b.submit(1, 30));
    let plan = b.cycle();
    assert_eq!(estimate_s(&plan, wide), Some(100), "the wide job is reserved the three nodes at t=100");
    (b, plan, [wide, long, middle, short])
}

#[test]
fn backfill_tries_the_queue_in_its_order_by_default() {
    let (_, plan, [wide, long, middle, short]) = one_idle_node(BackfillOrder::Priority);
    assert_eq!(started(&plan), vec![long], "the first that fits takes the idle node");
    let waiting: Vec<u64> = plan.reasons.iter().map(|(j, _)| *j).collect();
    assert_eq!(waiting, vec![wide, middle, short]);
}

#[test]
fn shortest_first_backfill_starts_the_shortest_and_keeps_the_reasons_in_queue_order() {
    let (mut b, plan, [wide, long, middle, short]) = one_idle_node(BackfillOrder::Shortest);
    assert_eq!(started(&plan), vec![short], "the shortest limit goes first");
    let reasons: Vec<(u64, PendingReason)> = plan.reasons.clone();
    assert_eq!(
        reasons,
        vec![(wide, PendingReason::Resources), (long, PendingReason::Priority), (middle, PendingReason::Priority)],
        "reasons in the queue's order, though middle was tried before long"
    );
    // The short job ends at t=30: the middle one (60 s, ends at 90) now fits before the
    // reservation and starts, ahead of the long one queued before it (80 s: it would end at 110).
    b.at(30);
    b.end(short);
    let plan = b.cycle();
    assert_eq!(started(&plan), vec![middle]);
    assert_eq!(estimate_s(&plan, wide), Some(100), "the reservation does not move");
}

/// A bench at t=20 where alice's two jobs (limits 100 s) each ran 10 s: her predictions are
/// 10 s from then (the history of level 26).
fn alice_ran_10_s_twice(nodes: Vec<quorum_state::NodeRegistration>, policy: Policy) -> Bench {
    let mut b = Bench::new(nodes, policy);
    let level = quorum_state::ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "test".into() };
    b.cmd(quorum_state::Command::SetReplicaVersions { versions: BTreeMap::from([(1, level)]), now: 0 });
    for t in [0, 10] {
        b.at(t);
        let j = b.submit_with("alice", |s| s.time_limit_s = Some(100));
        assert_eq!(started(&b.cycle()), vec![j]);
        b.at(t + 10);
        b.end(j);
    }
    b.at(20);
    b
}

/// With predictions the order is by predicted run time: alice's two past jobs ran 10 s, so her
/// job with a 90 s limit is planned for 10 s and goes before bob's 30 s job, which has no
/// history; ordered by limits, bob's goes first; in queue order, bob's too (it came first).
#[test]
fn with_predictions_the_shortest_predicted_run_time_goes_first() {
    let run = |predict: bool, order: BackfillOrder| {
        let nodes = (1..=3).map(|i| node(&format!("n{i}"), 1, 0, "", &[])).collect();
        let policy = Policy { predict, backfill_order: order, ..fifo(BackfillMode::Easy, 1) };
        let mut b = alice_ran_10_s_twice(nodes, policy);
        let running = b.submit_with("carol", |s| (s.nodes, s.ntasks, s.time_limit_s) = (2, 2, Some(100)));
        assert_eq!(started(&b.cycle()), vec![running]);
        let wide = b.submit_with("carol", |s| (s.nodes, s.ntasks, s.time_limit_s) = (3, 3, Some(50)));
        let bob = b.submit_with("bob", |s| s.time_limit_s = Some(30));
        let alice = b.submit_with("alice", |s| s.time_limit_s = Some(90));
        let plan = b.cycle();
        assert_eq!(estimate_s(&plan, wide), Some(120));
        let first = started(&plan);
        assert_eq!(first.len(), 1, "{first:?}");
        if first[0] == alice {
            "alice"
        } else {
            assert_eq!(first[0], bob);
            "bob"
        }
    };
    assert_eq!(run(true, BackfillOrder::Shortest), "alice", "planned 10 s against 30 s");
    assert_eq!(run(false, BackfillOrder::Shortest), "bob", "30 s limit against 90 s");
    assert_eq!(run(true, BackfillOrder::Priority), "bob", "queue order");
}

/// Every waiting job's estimate (`estimate_all`, what the simulator measures) follows the order
/// the policy serves them. One node, busy until t=100; A (20 s) is reserved from then by the
/// cycle; C (50 s) and D (10 s) wait behind it. In queue order C follows A at 120 and D at
/// 170; with shortest-first backfill D is tried first, at 120, and C at 130. A job holding a
/// reservation keeps it first either way.
#[test]
fn every_waiting_jobs_estimate_follows_the_order_backfill_tries_them() {
    for (order, want) in [(BackfillOrder::Priority, [100, 120, 170]), (BackfillOrder::Shortest, [100, 130, 120])] {
        let policy = Policy { ordering: QueueOrder::Fifo, backfill_order: order, ..Policy::default() };
        let mut b = Bench::new(vec![node("n1", 1, 0, "", &[])], policy);
        b.at(0);
        let running = b.submit(1, 100);
        assert_eq!(started(&b.cycle()), vec![running]);
        let [a, c, d] = [20, 50, 10].map(|limit| b.submit(1, limit));
        let reserved = b.cycle().estimates;
        assert_eq!(reserved.keys().copied().collect::<Vec<_>>(), vec![a], "EASY reserves the head only");
        let view = ClusterView::from_state(&b.state);
        let all = estimate_all(&view, b.now_ms, &b.state.policy, &reserved);
        let at = |j: u64| (all.estimates[&j].start_ms - 1_000_000_000) / 1000;
        assert_eq!([at(a), at(c), at(d)], want, "{order:?}");
        assert!(all.starts.is_empty());
    }
}

/// Forecasts are made on predictions while the schedule stays on limits, and follow the
/// schedule's order: with shortest-first backfill, the shortest *limit* first, as the schedule
/// tries them, not the shortest prediction. One node, busy until t=120; A (20 s) is reserved
/// from then; bob (30 s, no history) and alice (90 s, whose past jobs ran 10 s: planned 10 s)
/// wait behind it. By limit bob goes first (140) and alice after him (170); by prediction alice
/// would take 140.
#[test]
fn forecasts_follow_the_schedules_order_by_limits() {
    let policy = Policy { ordering: QueueOrder::Fifo, backfill_order: BackfillOrder::Shortest, ..Policy::default() };
    let mut b = alice_ran_10_s_twice(vec![node("n1", 1, 0, "", &[])], policy);
    let running = b.submit_with("carol", |s| s.time_limit_s = Some(100));
    assert_eq!(started(&b.cycle()), vec![running]);
    let a = b.submit_with("carol", |s| s.time_limit_s = Some(20));
    let bob = b.submit_with("bob", |s| s.time_limit_s = Some(30));
    let alice = b.submit_with("alice", |s| s.time_limit_s = Some(90));
    let reserved = b.cycle().estimates;
    assert_eq!(reserved.keys().copied().collect::<Vec<_>>(), vec![a]);
    let view = ClusterView::from_state_predicting(&b.state, &mut view::ViewCache::default());
    let forecast = forecast(&view, b.now_ms, &b.state.policy, &reserved);
    let at = |j: u64| (forecast[&j].start_ms - 1_000_000_000) / 1000;
    assert_eq!([at(a), at(bob), at(alice)], [120, 140, 170]);
}
