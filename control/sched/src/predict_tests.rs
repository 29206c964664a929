//! Backfill on predicted run times (`Policy::predict`): each user's last two run times, kept
//! by the state machine as jobs end, plan their next jobs and their running ones; a job that
//! outlives its prediction is planned to its limit; none starts where its limit would run into
//! an advance reservation it is not in.

use std::collections::BTreeMap;

use super::tests::{estimate_s, node, started, Bench};
use super::*;
use quorum_model::predict::RecentRuns;
use quorum_model::reservation::{ResvEnd, ResvFlags, ResvRequest};
use quorum_model::{JobState, QueueOrder, RankOutcome};
use quorum_state::{Command, Response};

const T0: u64 = 1_000_000_000;

/// `nodes` one-CPU nodes, FIFO, EASY, predictions on or off; every replica at this build's
/// level, so that the state keeps run times.
fn site(nodes: u32, predict: bool) -> Bench {
    let nodes = (1..=nodes).map(|i| node(&format!("n{i}"), 1, 0, "", &[])).collect();
    let mut b = Bench::new(nodes, Policy { ordering: QueueOrder::Fifo, predict, ..Policy::default() });
    let level = quorum_state::ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "test".into() };
    b.cmd(Command::SetReplicaVersions { versions: BTreeMap::from([(1, level)]), now: 0 });
    b
}

fn job(b: &mut Bench, user: &str, nodes: u32, limit_s: u64) -> u64 {
    b.submit_with(user, |s| {
        (s.nodes, s.ntasks, s.time_limit_s) = (nodes, nodes, Some(limit_s));
    })
}

/// Runs one job of `user` asking `limit_s`, for `run_s` seconds from `at`; returns when it ended.
fn one_run(b: &mut Bench, user: &str, at: u64, limit_s: u64, run_s: u64) -> u64 {
    b.at(at);
    let j = job(b, user, 1, limit_s);
    assert_eq!(started(&b.cycle()), vec![j]);
    b.at(at + run_s);
    b.end(j);
    at + run_s
}

/// Runs two jobs of `user` for `runs` seconds each (limit 100), one after the other from `at`;
/// returns when the second ended.
fn history(b: &mut Bench, user: &str, at: u64, runs: [u64; 2]) -> u64 {
    runs.into_iter().fold(at, |t, run| one_run(b, user, t, 100, run))
}

/// Two one-CPU nodes; Alice's last two jobs ran 10 s each. At `t` her 1-node job (limit 100)
/// starts and Bob's 2-node job (limit 50) waits behind it: the bench, `t`, Bob's job and the
/// cycle's plan.
fn bob_behind_alice(predict: bool) -> (Bench, u64, u64, Plan) {
    let mut b = site(2, predict);
    let t = history(&mut b, "alice", 0, [10, 10]);
    b.at(t);
    let running = job(&mut b, "alice", 1, 100);
    let wide = job(&mut b, "bob", 2, 50);
    let p = b.cycle();
    assert_eq!(started(&p), vec![running]);
    (b, t, wide, p)
}

#[test]
fn the_state_keeps_each_users_last_two_run_times_of_jobs_that_ran_their_course() {
    let mut b = site(2, true);
    assert!(b.state.recent_runs.is_empty());
    let t = history(&mut b, "alice", 0, [10, 31]);
    assert_eq!(b.state.recent_runs["alice"], RecentRuns { last_s: 31, before_s: Some(10) });
    // A failed job ran its course too; a cancelled one says nothing of how long it needed.
    b.at(t);
    let failed = job(&mut b, "alice", 1, 100);
    let cancelled = job(&mut b, "alice", 1, 100);
    assert_eq!(started(&b.cycle()), vec![failed, cancelled]);
    b.at(t + 5);
    b.end_with(failed, 1);
    assert_eq!(b.state.recent_runs["alice"], RecentRuns { last_s: 5, before_s: Some(31) });
    let now = b.now_ms;
    let r = b.cmd(Command::CancelJob { job_id: cancelled, user: "alice".into(), now, whole_array: false });
    assert!(!matches!(r, Response::Rejected(_)), "{r:?}");
    let token = b.state.jobs[&cancelled].alloc_index;
    let node = b.state.jobs[&cancelled].allocation.as_ref().unwrap().nodes[0].node.clone();
    let outcome = RankOutcome::Exited { code: 0, signal: 15 };
    b.cmd(Command::JobEnded { job_id: cancelled, token, node, outcome, now });
    assert_eq!(b.state.jobs[&cancelled].state, JobState::Cancelled);
    assert_eq!(b.state.recent_runs["alice"], RecentRuns { last_s: 5, before_s: Some(31) });
    assert!(!b.state.recent_runs.contains_key("bob"));
}

/// From level 37 the state keeps each user's runs per time limit too; a job is predicted from
/// the runs of its limit. Alice's two 100 s-limit jobs ran 10 s, then a 1000 s-limit one ran
/// 600 s: her running 100 s-limit job is predicted to run 10 s (her last two of any limit say
/// 305, past its limit, so no prediction at all), and Bob's wide job waits for 10 s, not 100.
#[test]
fn a_job_is_predicted_from_its_users_runs_of_the_same_time_limit() {
    let mut b = site(2, true);
    let t = history(&mut b, "alice", 0, [10, 10]);
    let t = one_run(&mut b, "alice", t, 1000, 600);
    assert_eq!(b.state.recent_runs["alice"], RecentRuns { last_s: 600, before_s: Some(10) });
    let by_limit = &b.state.runs_by_limit["alice"];
    assert_eq!(by_limit.get(100), Some(&RecentRuns { last_s: 10, before_s: Some(10) }));
    assert_eq!(by_limit.get(1000), Some(&RecentRuns { last_s: 600, before_s: None }));
    assert_eq!(by_limit.0[0].limit_s, 1000, "the limit used last first");
    b.at(t);
    let running = job(&mut b, "alice", 1, 100);
    let wide = job(&mut b, "bob", 2, 50);
    let p = b.cycle();
    assert_eq!(started(&p), vec![running]);
    assert_eq!(estimate_s(&p, wide), Some(t + 10));
}

/// Below level 37 (a replica of the release before among the voters) the state keeps no runs
/// per limit, as that replica does: the same state on both, and predictions from the user's.
#[test]
fn below_its_level_no_runs_are_kept_per_limit() {
    let mut b = site(2, true);
    let old = quorum_state::ReplicaVersion { level: quorum_state::RUNS_BY_LIMIT_LEVEL - 1, version: "old".into() };
    b.cmd(Command::SetReplicaVersions { versions: BTreeMap::from([(1, old)]), now: 0 });
    let t = history(&mut b, "alice", 0, [10, 10]);
    let t = one_run(&mut b, "alice", t, 1000, 600);
    assert!(b.state.runs_by_limit.is_empty());
    assert_eq!(b.state.recent_runs["alice"], RecentRuns { last_s: 600, before_s: Some(10) });
    b.at(t);
    let running = job(&mut b, "alice", 1, 100);
    let wide = job(&mut b, "bob", 2, 50);
    let p = b.cycle();
    assert_eq!(started(&p), vec![running]);
    assert_eq!(estimate_s(&p, wide), Some(t + 100), "305 s predicted, past the limit: the limit");
}

/// Alice's last two jobs ran 10 s of their 100: her running job is planned to end 10 s after
/// it started, so the 2-node job blocked behind it is reserved then, not at her limit; once
/// her job outlives its prediction, it is planned to its limit again. With predictions off,
/// the limit throughout.
#[test]
fn a_running_job_is_planned_to_its_prediction_and_then_to_its_limit() {
    for predict in [true, false] {
        let (mut b, t, wide, p) = bob_behind_alice(predict);
        let want = if predict { t + 10 } else { t + 100 };
        assert_eq!(estimate_s(&p, wide), Some(want), "predict: {predict}");
        b.at(t + 11);
        let p = b.cycle();
        assert_eq!(estimate_s(&p, wide), Some(t + 100), "past its prediction, its limit (predict: {predict})");
    }
}

/// A pending job of a user with history is planned for its prediction: it backfills where its
/// limit would delay the reservation ahead of it. Bob, without history, is planned at his limit.
#[test]
fn a_pending_job_backfills_on_its_prediction_and_one_without_history_on_its_limit() {
    let run = |predict: bool, user: &str| {
        let mut b = site(2, predict);
        let t = history(&mut b, "alice", 0, [20, 30]);
        b.at(t);
        let long = job(&mut b, "carol", 1, 100);
        let wide = job(&mut b, "carol", 2, 50);
        let short = job(&mut b, user, 1, 150);
        let p = b.cycle();
        assert_eq!(estimate_s(&p, wide), Some(t + 100));
        let _ = long;
        started(&p).contains(&short)
    };
    assert!(run(true, "alice"), "predicted 25 s, it ends before the reservation at 100");
    assert!(!run(true, "bob"), "bob has no history: his 150 s limit would delay the reservation");
    assert!(!run(false, "alice"), "without predictions alice's limit counts");
}

/// Predicted to run 10 s, a job with a 1000 s limit still does not start on a node that an
/// advance reservation holds from t=500: it starts on the other node.
#[test]
fn a_job_never_starts_where_its_limit_would_run_into_an_advance_reservation() {
    let mut b = site(2, true);
    let t = history(&mut b, "alice", 0, [10, 10]);
    b.at(t);
    let request = ResvRequest {
        name: "maint".into(),
        start_ms: Some(T0 + (t + 500) * 1000),
        end: Some(ResvEnd::After(60)),
        nodes: Some(vec!["n1".into()]),
        users: Some(vec!["root".into()]),
        flags: Some(ResvFlags::parse("MAINT").unwrap()),
        ..ResvRequest::default()
    };
    let now = b.now_ms;
    let r = b.cmd(Command::CreateReservation { request, user: "root".into(), now });
    assert!(matches!(r, Response::Reserved { .. }), "{r:?}");
    let first = job(&mut b, "alice", 1, 1000);
    let second = job(&mut b, "alice", 1, 1000);
    let p = b.cycle();
    assert_eq!(started(&p), vec![first], "only n2 is clear for 1000 s");
    assert_eq!(b.state.jobs[&first].allocation.as_ref().unwrap().nodes[0].node, "n2");
    assert_eq!(p.reason(second), Some(PendingReason::ReservedForMaintenance));
    // A short-limit job of hers still starts on n1, before the window.
    let short = job(&mut b, "alice", 1, 400);
    assert_eq!(started(&b.cycle()), vec![short]);
}

/// `sbatch --test-only` (Slurm's will-run) answers on the same plan: with predictions on, a
/// 2-node job would start when Alice's running job is predicted to end, not at its limit.
#[test]
fn the_will_run_test_answers_on_predictions_too() {
    for predict in [true, false] {
        let mut b = site(2, predict);
        let t = history(&mut b, "alice", 0, [10, 10]);
        b.at(t);
        let running = job(&mut b, "alice", 1, 100);
        assert_eq!(started(&b.cycle()), vec![running]);
        let spec = quorum_model::JobSpec {
            nodes: 2,
            ntasks: 2,
            cpus_per_task: 1,
            time_limit_s: Some(60),
            partition: Some("batch".into()),
            ..Default::default()
        };
        let view = ClusterView::from_state(&b.state);
        let asked = PendingJob::hypothetical(&view, b.state.next_job_id, &spec, "bob", b.now_ms);
        let want = T0 + (t + if predict { 10 } else { 100 }) * 1000;
        match will_run(&view, asked, b.now_ms, &b.state.policy) {
            WillRun::Later(e) => assert_eq!(e.start_ms, want, "predict: {predict}"),
            other => panic!("{other:?}"),
        }
    }
}

/// A reservation that slips past the start it first promised by more than the wait that
/// promised turns the cycle to limits until its job starts. Alice's jobs are predicted to run
/// 10 s of their 100. Bob's 2-node job is promised t+10; once Alice's running job outlives its
/// prediction he is reserved at t+100, a slip of 90 s on a 10 s wait. Planned on predictions,
/// her next job would backfill (predicted to end at t+21); by its limit it would end at t+111,
/// after his start, so it waits, in that cycle and the next, and is estimated to start after
/// him. His promise is kept.
#[test]
fn a_reservation_late_by_more_than_its_promised_wait_is_planned_on_limits() {
    let (mut b, t, wide, p) = bob_behind_alice(true);
    assert_eq!(estimate_s(&p, wide), Some(t + 10));
    let promised_ms = T0 + (t + 10) * 1000;
    b.at(t + 11);
    let next = job(&mut b, "alice", 1, 100);
    for at in [t + 11, t + 12] {
        b.at(at);
        let p = b.cycle();
        assert_eq!(started(&p), Vec::<u64>::new(), "at {at}: on limits her job would run past t+100");
        assert_eq!(p.reason(next), Some(PendingReason::Priority));
        assert_eq!(estimate_s(&p, wide), Some(t + 100));
        assert_eq!(p.estimates[&wide].promised_ms, promised_ms, "the promise is kept");
        // Every waiting job's estimate is planned on limits too: hers after his.
        let all = estimate_all(&ClusterView::from_state(&b.state), b.now_ms, &b.state.policy, &p.estimates);
        assert!(all.starts.is_empty(), "{:?}", all.starts);
        assert_eq!(estimate_s(&all, next), Some(t + 150));
    }
}

/// Once late, the cycles after it stay on limits while the last one's reservation is late,
/// even where predictions alone would no longer put it late. Bob's 2-node job is promised
/// t+30, when Dave's running job is predicted to end (his limit: t+1000). At t+11 Alice's job
/// outlives its prediction: Bob's start moves to t+100, late, and the cycle is planned on
/// limits (t+1000). At t+12 her job ends; on predictions he would be reserved at t+30 again,
/// but on limits he stays at t+1000 until Dave's job ends, and then starts.
#[test]
fn the_cycles_after_a_late_one_stay_on_limits_while_it_is_late() {
    let mut b = site(2, true);
    let t = history(&mut b, "alice", 0, [10, 10]);
    let t = history(&mut b, "dave", t, [30, 30]);
    b.at(t);
    let short = job(&mut b, "alice", 1, 100);
    let long = job(&mut b, "dave", 1, 1000);
    let wide = job(&mut b, "bob", 2, 50);
    let p = b.cycle();
    assert_eq!(started(&p), vec![short, long]);
    assert_eq!(estimate_s(&p, wide), Some(t + 30));
    b.at(t + 11);
    assert_eq!(estimate_s(&b.cycle(), wide), Some(t + 1000), "late: planned on limits");
    b.at(t + 12);
    b.end(short);
    assert_eq!(estimate_s(&b.cycle(), wide), Some(t + 1000), "still on limits");
    b.at(t + 40);
    b.end(long);
    assert_eq!(started(&b.cycle()), vec![wide]);
}

/// A slip within the wait promised keeps the predictions: Carol's 3-node job is promised t+60,
/// when Bob's running job is predicted to end (its limit: t+1000); when Alice's job outlives
/// its 10 s prediction her start moves to t+100, within twice the 60 s she was told, and stays
/// planned on predictions (on limits it would be t+1000).
#[test]
fn a_slip_within_the_promised_wait_keeps_the_predictions() {
    let mut b = site(3, true);
    let t = history(&mut b, "alice", 0, [10, 10]);
    let t = history(&mut b, "bob", t, [60, 60]);
    b.at(t);
    let long = job(&mut b, "bob", 1, 1000);
    let short = job(&mut b, "alice", 1, 100);
    let wide = job(&mut b, "carol", 3, 50);
    assert_eq!(started(&b.cycle()), vec![long, short]);
    b.at(t + 11);
    assert_eq!(estimate_s(&b.cycle(), wide), Some(t + 100));
}

/// A job's first promise is kept while it waits, whether a reservation holds it this cycle or
/// not (one of higher priority may have taken it), and dropped once it starts or leaves.
#[test]
fn a_promise_is_kept_while_its_job_waits() {
    let (b, _, wide, p) = bob_behind_alice(true);
    let mut view = ClusterView::from_state(&b.state);
    assert_eq!(promises(&view, &p), BTreeMap::from([(wide, p.estimates[&wide].start_ms)]), "first reserved");
    let gone = wide + 100;
    view.promised = BTreeMap::from([(wide, 7), (gone, 8)]);
    assert_eq!(promises(&view, &Plan::default()), BTreeMap::from([(wide, 7)]), "kept without a reservation");
    assert_eq!(promises(&view, &p)[&wide], 7, "the first promise, not this cycle's");
    let start = PlannedStart { job_id: wide, allocation: Allocation::default() };
    assert!(promises(&view, &Plan { starts: vec![start], ..Plan::default() }).is_empty(), "started");
}
