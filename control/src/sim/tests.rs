//! Replays of tiny traces whose schedules are known by hand.

use std::collections::BTreeMap;

use super::metrics::Report;
use super::swf::Trace;
use super::*;

/// An SWF line: number, submit, run, processors, requested time, user, group; the recorded
/// wait is -1.
fn line(number: u64, submit: u64, run: u64, procs: u64, req: i64, user: u64, group: u64) -> String {
    format!("{number} {submit} -1 {run} {procs} -1 -1 {procs} {req} -1 1 {user} {group} -1 -1 -1 -1 -1\n")
}

fn trace(header: &str, lines: &[String]) -> Trace {
    Trace::parse("test.swf", format!("{header}{}", lines.concat()).as_bytes()).unwrap()
}

fn run(t: &Trace, opts: SimOptions) -> SimResult {
    Simulation::new(t, &opts).unwrap().run(&mut |_| {})
}

fn starts(r: &SimResult) -> BTreeMap<u64, u64> {
    assert!(r.dropped.is_empty(), "apply refused planned starts: {:?}", r.dropped);
    r.jobs.iter().map(|j| (j.number, j.start_s.expect("every job starts"))).collect()
}

fn policy(p: PolicyName) -> SimOptions {
    SimOptions { policy: Some(p), ..Default::default() }
}

/// Four single-CPU nodes. 1 holds two until 100; 2 needs all four; 3 fits beside 1 and ends
/// before 100; 4 is long and would hold a node 2 needs.
fn easy_vs_fcfs() -> Trace {
    trace(
        "; MaxNodes: 4\n; MaxProcs: 4\n",
        &[
            line(1, 0, 100, 2, 100, 1, 1),
            line(2, 1, 50, 4, 50, 1, 1),
            line(3, 2, 50, 2, 50, 2, 2),
            line(4, 3, 200, 1, 200, 2, 2),
        ],
    )
}

#[test]
fn easy_backfills_where_fcfs_waits() {
    let t = easy_vs_fcfs();
    let easy = starts(&run(&t, policy(PolicyName::Easy)));
    assert_eq!(easy, BTreeMap::from([(1, 0), (2, 100), (3, 2), (4, 150)]), "3 backfills; 4 would delay 2");
    let fcfs = starts(&run(&t, policy(PolicyName::Fcfs)));
    assert_eq!(fcfs, BTreeMap::from([(1, 0), (2, 100), (3, 150), (4, 150)]), "nothing passes the blocked job");
    // EASY is the default without a config.
    assert_eq!(starts(&run(&t, SimOptions::default())), easy);
}

/// The scheduler issue's worked example on ten single-CPU nodes, with conservative backfill:
/// every job's start as the example gives it.
#[test]
fn worked_example_a_to_h() {
    let (a, b, c, d, e, f, g, h) = (1, 2, 3, 4, 5, 6, 7, 8);
    let t = trace(
        "; MaxNodes: 10\n",
        &[
            line(a, 0, 100, 4, 100, 1, 1),
            line(b, 0, 200, 3, 200, 1, 1),
            line(c, 0, 300, 2, 300, 1, 1),
            line(d, 0, 100, 10, 100, 1, 1),
            line(e, 10, 250, 1, 250, 1, 1),
            line(f, 100, 150, 4, 150, 1, 1),
            line(g, 100, 100, 5, 100, 1, 1),
            line(h, 100, 90, 3, 90, 1, 1),
        ],
    );
    let r = run(&t, policy(PolicyName::Conservative));
    let want = BTreeMap::from([(a, 0), (b, 0), (c, 0), (d, 300), (e, 10), (f, 100), (g, 400), (h, 200)]);
    assert_eq!(starts(&r), want);
    let report = Report::of(&r);
    assert_eq!(report.simulated.makespan_s, 500, "G ends last, at 400 + 100");
    // Work: 4·100 + 3·200 + 2·300 + 10·100 + 250 + 4·150 + 5·100 + 3·90 = 4220 CPU·s of 5000.
    assert!((report.simulated.utilization - 4220.0 / 5000.0).abs() < 1e-12);
    assert!(report.recorded.is_none(), "the trace records no waits");
}

#[test]
fn a_job_past_its_limit_is_killed_unless_asked_not_to() {
    // 1 asks for 50 s and runs 100; 2 needs the only node.
    let t = trace("; MaxNodes: 1\n", &[line(1, 0, 100, 1, 50, 1, 1), line(2, 0, 10, 1, 10, 1, 1)]);
    let r = run(&t, SimOptions::default());
    assert_eq!(starts(&r), BTreeMap::from([(1, 0), (2, 50)]));
    assert!(r.jobs[0].killed && !r.jobs[1].killed);
    assert_eq!(Report::of(&r).killed_at_limit, 1);
    let r = run(&t, SimOptions { no_kill: true, ..Default::default() });
    assert_eq!(starts(&r), BTreeMap::from([(1, 0), (2, 100)]), "it holds the node for its whole run");
    assert_eq!(r.jobs[0].end_s, Some(100));
}

#[test]
fn per_processor_and_whole_node_allocation() {
    // Two nodes of 4 CPUs. 1 and 2 each ask 2 processors: per processor they share a node.
    let t = trace(
        "; MaxNodes: 2\n; MaxProcs: 8\n",
        &[line(1, 0, 100, 2, 100, 1, 1), line(2, 0, 100, 2, 100, 1, 1), line(3, 0, 100, 5, 100, 1, 1)],
    );
    let r = run(&t, SimOptions::default());
    assert_eq!(r.machine, Machine { nodes: 2, cpus_per_node: 4, whole_nodes: false });
    // 3 asks for 5 processors: two nodes, 3 CPUs each, so it waits for both jobs.
    assert_eq!(starts(&r), BTreeMap::from([(1, 0), (2, 0), (3, 100)]));
    assert_eq!(r.jobs[0].alloc, r.jobs[1].alloc.iter().map(|&(n, _)| (n, 2)).collect::<Vec<_>>(), "same node");
    let r = run(&t, SimOptions { whole_nodes: true, ..Default::default() });
    assert_eq!(starts(&r), BTreeMap::from([(1, 0), (2, 0), (3, 100)]));
    assert_ne!(r.jobs[0].alloc[0].0, r.jobs[1].alloc[0].0, "whole nodes: one job per node");
    assert_eq!(r.jobs[0].alloc[0].1, 4);
    // Flags override the header.
    let r = run(&t, SimOptions { nodes: Some(4), cpus_per_node: Some(2), ..Default::default() });
    assert_eq!(r.machine, Machine { nodes: 4, cpus_per_node: 2, whole_nodes: false });
    assert_eq!(starts(&r), BTreeMap::from([(1, 0), (2, 0), (3, 100)]));
}

#[test]
fn multifactor_fairshare_is_between_groups() {
    // One node. Group 1 runs a long job first; then 2 (group 1) and 3 (group 2) arrive
    // together. FIFO runs 2 first; multifactor prefers the group that has used nothing.
    let t = trace(
        "; MaxNodes: 1\n",
        &[line(1, 0, 5000, 1, 5000, 1, 1), line(2, 10, 100, 1, 100, 1, 1), line(3, 20, 100, 1, 100, 2, 2)],
    );
    assert_eq!(starts(&run(&t, policy(PolicyName::Easy))), BTreeMap::from([(1, 0), (2, 5000), (3, 5100)]));
    assert_eq!(starts(&run(&t, policy(PolicyName::Multifactor))), BTreeMap::from([(1, 0), (3, 5000), (2, 5100)]));
}

#[test]
fn shortest_job_first_orders_by_limit() {
    let t = trace(
        "; MaxNodes: 1\n",
        &[line(1, 0, 100, 1, 100, 1, 1), line(2, 1, 300, 1, 300, 1, 1), line(3, 2, 50, 1, 50, 1, 1)],
    );
    assert_eq!(starts(&run(&t, policy(PolicyName::Sjf))), BTreeMap::from([(1, 0), (3, 100), (2, 150)]));
    assert_eq!(starts(&run(&t, policy(PolicyName::Fcfs))), BTreeMap::from([(1, 0), (2, 100), (3, 400)]));
}

#[test]
fn records_skips_rejections_recorded_waits_and_slices() {
    let lines = [
        "1 0 5 100 2 -1 -1 2 100 -1 1 1 1 -1 -1 -1 -1 -1\n".to_string(),
        "2 0 -1 -1 2 -1 -1 2 100 -1 1 1 1 -1 -1 -1 -1 -1\n".to_string(), // run time unknown
        "3 0 -1 10 -1 -1 -1 -1 100 -1 1 1 1 -1 -1 -1 -1 -1\n".to_string(), // processors unknown
        "4 0 0 10 9 -1 -1 9 100 -1 1 1 1 -1 -1 -1 -1 -1\n".to_string(),  // larger than the machine
        "5 30 70 10 2 -1 -1 -1 -1 -1 1 2 2 -1 -1 -1 -1 -1\n".to_string(), // requested time unknown
    ];
    let t = trace("; MaxNodes: 2\n; MaxProcs: 2\n", &lines);
    let r = run(&t, SimOptions::default());
    assert_eq!(r.skipped, BTreeMap::from([("unknown processor count".into(), 1), ("unknown run time".into(), 1)]));
    assert_eq!(r.rejected.len(), 1);
    assert_eq!(r.rejected[0].0, 4);
    assert!(r.rejected[0].1.contains("nodes"), "the rejection says why: {}", r.rejected[0].1);
    assert_eq!(starts(&r), BTreeMap::from([(1, 0), (5, 100)]));
    assert_eq!(r.jobs[1].limit_s, 10, "without a request the run time is the limit");
    let report = Report::of(&r);
    let rec = report.recorded.expect("the trace records waits");
    assert_eq!((rec.jobs, rec.wait_mean_s, rec.makespan_s), (2, 37.5, 110));
    assert_eq!(report.simulated.per_user["u2"].wait_mean_s, 70.0);

    let slice = run(&t, SimOptions { from: Some(4), count: Some(2), ..Default::default() });
    assert_eq!(slice.jobs.iter().map(|j| j.number).collect::<Vec<_>>(), vec![5]);
    assert_eq!(slice.rejected.len(), 1);
    assert_eq!(starts(&slice), BTreeMap::from([(5, 30)]), "the slice starts on an empty machine");
}

#[test]
fn bad_options_are_named() {
    let t = easy_vs_fcfs();
    let err = |o: SimOptions| Simulation::new(&t, &o).err().map(|e| e.to_string()).unwrap();
    assert!(err(SimOptions { from: Some(99), ..Default::default() }).contains("no job numbered 99"));
    assert!(err(SimOptions { count: Some(0), ..Default::default() }).contains("--count"));
    assert!(err(SimOptions { nodes: Some(0), ..Default::default() }).contains("--nodes"));
    assert!(err(SimOptions { cpus_per_node: Some(0), ..Default::default() }).contains("--cpus-per-node"));
    let bare = trace("", &[line(1, 0, 1, 1, 1, 1, 1)]);
    assert_eq!(Simulation::new(&bare, &SimOptions::default()).err(), Some(SimError::NoMachineSize));
    assert_eq!(
        "lifo".parse::<PolicyName>().unwrap_err(),
        "unknown policy 'lifo': expected fcfs, easy, conservative, multifactor or sjf"
    );
}

/// A pseudo-random workload (a fixed LCG, so the trace itself is the same every time).
pub(crate) fn synthetic(jobs: u64, nodes: u64) -> Trace {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |m: u64| {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % m
    };
    let mut submit = 0;
    let lines: Vec<String> = (1..=jobs)
        .map(|n| {
            submit += next(240);
            let procs = 1 + next(nodes) / (1 + next(4));
            let run = 1 + next(3000);
            let req = run + next(3000);
            line(n, submit, run, procs, req as i64, next(20), next(5))
        })
        .collect();
    trace(&format!("; MaxNodes: {nodes}\n; MaxProcs: {}\n", nodes * 4), &lines)
}

#[test]
fn the_same_run_twice_is_identical() {
    let t = synthetic(1500, 32);
    let orders = [crate::model::BackfillOrder::Priority, crate::model::BackfillOrder::Shortest];
    for (p, order) in
        [PolicyName::Multifactor, PolicyName::Conservative].into_iter().flat_map(|p| orders.map(|o| (p, o)))
    {
        let opts = SimOptions { policy: Some(p), samples: true, backfill_order: Some(order), ..Default::default() };
        let (a, b) = (run(&t, opts.clone()), run(&t, opts));
        assert!(a.dropped.is_empty());
        assert_eq!(a.jobs, b.jobs);
        assert_eq!(a.samples, b.samples);
        let (ra, rb) = (Report::of(&a), Report::of(&b));
        assert_eq!(serde_json::to_string(&ra).unwrap(), serde_json::to_string(&rb).unwrap());
        assert_eq!(svg::gantt(&a, 0, 86_400), svg::gantt(&b, 0, 86_400));
        // Sanity of the schedule: never more CPUs busy than the machine has.
        assert!(a.samples.iter().all(|s| s.busy_cpus <= a.machine.total_cpus()));
        assert_eq!(ra.never_started, 0);
        if order == crate::model::BackfillOrder::Priority {
            assert!(a.samples.iter().map(|s| s.pending).max() > Some(20), "the workload queues, so backfill matters");
        }
    }
}

/// An SWF line of partition `partition` (its number in the config, from 1).
fn line_in(number: u64, submit: u64, run: u64, procs: u64, partition: u64) -> String {
    format!("{number} {submit} -1 {run} {procs} -1 -1 {procs} {run} -1 1 1 1 -1 -1 {partition} -1 -1\n")
}

/// Two single-CPU nodes, a scavenger partition (tier 0, preempted `mode`, 10 s grace) and a
/// production one (tier 1).
fn preemption_config(mode: &str) -> String {
    format!(
        r#"
        [scheduler]
        ordering = "fifo"
        preempt_type = "partition_prio"
        [[partitions]]
        name = "scav"
        nodes = "n[1-2]"
        default = true
        preempt_mode = "{mode}"
        grace_time = 10
        [[partitions]]
        name = "prod"
        nodes = "n[1-2]"
        priority_tier = 1
    "#
    )
}

/// Scavenger jobs 1 (from 0) and 2 (from 5) of 1000 s; production job 3 (100 s) at 20.
fn preemption_trace() -> Trace {
    trace("; MaxNodes: 2\n", &[line_in(1, 0, 1000, 1, 1), line_in(2, 5, 1000, 1, 1), line_in(3, 20, 100, 1, 2)])
}

/// Two single-CPU nodes, a scavenger partition (tier 0, requeued after a 10 s grace) and a
/// production one (tier 1). Scavenger jobs 1 (from 0) and 2 (from 5) fill both; production job
/// 3 arrives at 20 and preempts 2, the latest started, which ends at 30 (its grace) and runs
/// again, whole, when 3 ends at 130.
#[test]
fn a_config_with_preemption_replays_its_preemptions() {
    let config = preemption_config("requeue");
    let settings = crate::config::ClusterSettings::parse("test.toml", &config).unwrap();
    let t = preemption_trace();
    let opts = SimOptions { settings: Some(settings), nodes: Some(2), cpus_per_node: Some(1), ..Default::default() };
    let r = run(&t, opts);
    let by = |n: u64| r.jobs.iter().find(|j| j.number == n).unwrap();
    assert_eq!((by(1).start_s, by(1).end_s, by(1).preempted), (Some(0), Some(1000), 0));
    assert_eq!((by(3).start_s, by(3).end_s), (Some(30), Some(130)), "3 starts when 2's grace is over");
    assert_eq!((by(2).start_s, by(2).end_s, by(2).preempted), (Some(130), Some(1130), 1), "2 runs again, whole");
    let report = Report::of(&r);
    assert_eq!((report.preemptions, report.preempted_jobs), (1, 1));
    // Without preemption, 3 waits for a scavenger job to end.
    let plain = crate::config::ClusterSettings::parse("test.toml", &config.replace("partition_prio", "none")).unwrap();
    let opts = SimOptions { settings: Some(plain), nodes: Some(2), cpus_per_node: Some(1), ..Default::default() };
    let r = run(&t, opts);
    assert_eq!(r.jobs.iter().find(|j| j.number == 3).unwrap().start_s, Some(1000));
}

/// As above with `preempt_mode = "suspend"`: 2 is suspended at 20 having run 15 s, 3 starts at
/// once on its CPU, and 2 resumes when 3 ends at 120, ending 985 s later.
#[test]
fn a_config_that_suspends_preempted_jobs_replays_their_pauses() {
    let settings = crate::config::ClusterSettings::parse("test.toml", &preemption_config("suspend")).unwrap();
    let t = preemption_trace();
    let opts = SimOptions { settings: Some(settings), nodes: Some(2), cpus_per_node: Some(1), ..Default::default() };
    let r = run(&t, opts);
    let by = |n: u64| r.jobs.iter().find(|j| j.number == n).unwrap();
    assert_eq!((by(1).start_s, by(1).end_s, by(1).preempted), (Some(0), Some(1000), 0));
    assert_eq!((by(3).start_s, by(3).end_s), (Some(20), Some(120)), "3 starts at once on 2's CPU");
    assert_eq!((by(2).start_s, by(2).end_s, by(2).preempted), (Some(5), Some(1105), 1), "2 resumes where it was");
    assert_eq!(Report::of(&r).preemptions, 1);
}

/// A maintenance window on one of two nodes: the trace's jobs keep off it over the window, and a
/// weekly one comes back. Without it, the same trace runs through.
#[test]
fn reservations_keep_the_traces_jobs_off_their_nodes_over_their_windows() {
    let t = easy_vs_fcfs();
    let maint = |flags: &str| crate::model::reservation::ResvRequest {
        name: "maint".into(),
        start_ms: Some(20_000),
        end: Some(crate::model::reservation::ResvEnd::After(200)),
        node_count: Some(2),
        users: Some(vec!["root".into()]),
        flags: Some(crate::model::reservation::ResvFlags::parse(flags).unwrap()),
        ..Default::default()
    };
    let opts = SimOptions { reserve: vec![maint("MAINT")], ..policy(PolicyName::Easy) };
    // Two of the four nodes (the first two) are held over [20, 220): 1 starts at 0 on the other
    // two; 2 needs all four, after the window; 3 (50 s) would cross it on the held nodes and
    // starts when 1 ends; 4 (200 s) would delay 2 wherever it ran, and goes after it.
    assert_eq!(starts(&run(&t, opts)), BTreeMap::from([(1, 0), (2, 220), (3, 100), (4, 270)]));
    // Daily, the window comes back at 86,420: a job there keeps off it as well.
    let daily = SimOptions { reserve: vec![maint("MAINT,DAILY")], ..policy(PolicyName::Easy) };
    assert_eq!(starts(&run(&t, daily)), BTreeMap::from([(1, 0), (2, 220), (3, 100), (4, 270)]));
    // A reservation that cannot be made is named.
    let busy = SimOptions { reserve: vec![maint("MAINT"), maint("MAINT")], ..policy(PolicyName::Easy) };
    let e = Simulation::new(&t, &busy).err().expect("a second reservation of the same name is refused");
    assert!(e.to_string().contains("--reserve: reservation 'maint': a reservation of this name exists already"), "{e}");
}

/// Issue 29's example on four single-CPU nodes: 3 is reserved job 2's two nodes and one of the
/// two idle since 20, so 4 starts at once on the other, under EASY and conservative alike.
#[test]
fn a_reservation_leaves_the_node_it_does_not_need_to_backfill() {
    let t = trace(
        "; MaxNodes: 4\n",
        &[
            line(1, 0, 20, 2, 20, 1, 1),
            line(2, 0, 100, 2, 100, 1, 1),
            line(3, 30, 50, 3, 50, 1, 1),
            line(4, 31, 1000, 1, 1000, 1, 1),
        ],
    );
    for p in [PolicyName::Easy, PolicyName::Conservative] {
        let r = run(&t, policy(p));
        assert_eq!(starts(&r), BTreeMap::from([(1, 0), (2, 0), (3, 100), (4, 31)]), "{p:?}");
    }
}

/// User 1's jobs run 10 s of the 1000 they ask. With predictions, once two have ended, the next
/// is planned for 10 s and backfills beside user 2's job; on limits it would delay the 2-node
/// job reserved at 540, and waits for it. The 2-node job starts when reserved either way.
#[test]
fn predicted_run_times_backfill_what_limits_would_not() {
    let t = trace(
        "; MaxNodes: 2\n",
        &[
            line(1, 0, 10, 1, 1000, 1, 1),
            line(2, 20, 10, 1, 1000, 1, 1),
            line(3, 40, 500, 1, 500, 2, 2),
            line(4, 41, 100, 2, 100, 2, 2),
            line(5, 42, 10, 1, 1000, 1, 1),
        ],
    );
    let limits = starts(&run(&t, policy(PolicyName::Easy)));
    assert_eq!(limits, BTreeMap::from([(1, 0), (2, 20), (3, 40), (4, 540), (5, 640)]));
    let predicted = run(&t, SimOptions { predict: true, ..policy(PolicyName::Easy) });
    assert!(predicted.policy.predict);
    assert_eq!(starts(&predicted), BTreeMap::from([(1, 0), (2, 20), (3, 40), (4, 540), (5, 42)]));
}

/// Three nodes: 1 holds two until 100; 2 needs all three, reserved at 100; 3 (80 s) and 4
/// (30 s) both fit before it on the one idle node, one at a time. In queue order 3 goes first
/// and 4 then no longer fits before the reservation; shortest first, 4 goes first and 3 waits.
#[test]
fn shortest_first_backfill_reorders_the_jobs_behind_the_reservation() {
    let t = trace(
        "; MaxNodes: 3\n",
        &[
            line(1, 0, 100, 2, 100, 1, 1),
            line(2, 1, 50, 3, 50, 1, 1),
            line(3, 2, 80, 1, 80, 1, 1),
            line(4, 2, 30, 1, 30, 1, 1),
        ],
    );
    let order = Some(crate::model::BackfillOrder::Priority);
    let queue = run(&t, SimOptions { backfill_order: order, ..policy(PolicyName::Easy) });
    assert_eq!(starts(&queue), BTreeMap::from([(1, 0), (2, 100), (3, 2), (4, 150)]));
    // Shortest first is what a controller does unless configured otherwise.
    let shortest = run(&t, policy(PolicyName::Easy));
    assert_eq!(shortest.policy.backfill_order, crate::model::BackfillOrder::Shortest);
    assert_eq!(starts(&shortest), BTreeMap::from([(1, 0), (2, 100), (3, 150), (4, 2)]));
}

/// Five jobs of one user on one node, each running 100 s of the 1000 it asks. On limits every
/// last estimate before a start is 900 s late; with predictions, from the second job on (once
/// one has ended) the last estimates are exact. The estimates at submit come before any job
/// ended, so they are the limits' in both. Forecasts (the leader's default) are made on
/// predictions while the schedule stays on limits: the schedule's starts, the predictions'
/// accuracy.
#[test]
fn start_estimates_are_measured_at_submit_and_before_the_start() {
    let lines: Vec<String> = (0..5).map(|k| line(k + 1, k, 100, 1, 1000, 2, 2)).collect();
    let t = trace("; MaxNodes: 1\n", &lines);
    let run_with = |predict, on| {
        let r = run(&t, SimOptions { predict, estimates: Some(on), ..policy(PolicyName::Easy) });
        assert_eq!(starts(&r), BTreeMap::from([(1, 0), (2, 100), (3, 200), (4, 300), (5, 400)]));
        Report::of(&r).estimates.expect("estimated")
    };
    let limits = run_with(false, Estimates::Schedule);
    assert_eq!((limits.last.jobs, limits.last.median_abs_s), (4, 900));
    assert!((limits.last.mean_abs_s - 900.0).abs() < 1e-9 && limits.last.within_10_min == 0.0, "{limits:?}");
    let predicted = run_with(true, Estimates::Schedule);
    assert_eq!((predicted.last.jobs, predicted.last.median_abs_s), (4, 0), "{predicted:?}");
    assert!((predicted.last.mean_abs_s - 225.0).abs() < 1e-9, "{predicted:?}");
    assert!((predicted.last.within_10_min - 0.75).abs() < 1e-9, "{predicted:?}");
    assert_eq!(predicted.at_submit, limits.at_submit);
    assert_eq!(limits.at_submit.jobs, 4);
    assert_eq!(limits.at_submit.median_abs_s, 1800, "900, 1800, 2700 and 3600 s late");
    assert_eq!(run_with(false, Estimates::Forecasts), predicted, "forecasts on a schedule on limits");
    assert_eq!(run_with(true, Estimates::Forecasts), predicted);
    // Without asking, no estimates are made.
    let r = run(&t, policy(PolicyName::Easy));
    assert!(Report::of(&r).estimates.is_none() && r.jobs.iter().all(|j| j.estimate_last_s.is_none()));
}
