//! The checkers on histories written by hand: each catches the violation it exists for, and
//! passes the same history without it.

use std::collections::{BTreeMap, BTreeSet};

use quorum_jepsen::checker::{arrays, deps, jobs, linear, runs, starts, Final};
use quorum_jepsen::choice::Job;
use quorum_jepsen::history::{Array, Event, Op, Outcome, Seen};

/// Builds a history: each step is (process, time, invoke or complete).
struct H(Vec<Event>);

impl H {
    fn new() -> H {
        H(Vec::new())
    }
    fn call(mut self, process: u64, time: f64, op: Op) -> H {
        self.0.push(Event::Invoke { process, time, op });
        self
    }
    fn ret(mut self, process: u64, time: f64, outcome: Outcome) -> H {
        self.0.push(Event::Complete { process, time, outcome });
        self
    }
    /// An operation that completed before the next began.
    fn op(self, process: u64, time: f64, op: Op, outcome: Outcome) -> H {
        self.call(process, time, op).ret(process, time + 0.01, outcome)
    }
}

/// A register job's submit.
fn submit(name: &str, held: bool) -> Op {
    Job { held, ..Job::plain(name.into(), 1) }.submit(true)
}

/// A short job's submit, as `job` changes a plain one.
fn short(name: &str, job: impl FnOnce(Job) -> Job) -> Op {
    job(Job::plain(name.into(), 1)).submit(false)
}

fn read(state: &str, held: bool, cancelled: bool) -> Outcome {
    Outcome::Read { job: Seen { name: "reg".into(), state: state.into(), held, cancelled, task: None } }
}

#[test]
fn a_read_that_misses_an_acknowledged_hold_is_not_linearizable() {
    let base = H::new().op(0, 1.0, submit("reg", false), Outcome::Submitted { job: 1 }).op(
        1,
        2.0,
        Op::Hold { job: 1 },
        Outcome::Done,
    );
    // A read that began after the hold was acknowledged sees it...
    let good = H(base.0.clone()).op(2, 3.0, Op::Read { job: 1 }, read("PENDING", true, false));
    assert!(linear::check(&good.0, &[1]).is_empty());
    // ...and one answered from a replica that had not applied it does not.
    let stale = H(base.0).op(2, 3.0, Op::Read { job: 1 }, read("PENDING", false, false));
    let problems = linear::check(&stale.0, &[1]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("job 1"), "{problems:?}");
}

#[test]
fn a_read_concurrent_with_a_hold_may_see_either() {
    for held in [false, true] {
        let h = H::new()
            .op(0, 1.0, submit("reg", false), Outcome::Submitted { job: 1 })
            .call(1, 2.0, Op::Hold { job: 1 })
            .call(2, 2.1, Op::Read { job: 1 })
            .ret(2, 2.2, read("PENDING", held, false))
            .ret(1, 2.3, Outcome::Done);
        assert!(linear::check(&h.0, &[1]).is_empty(), "held={held}");
    }
}

#[test]
fn an_unanswered_hold_may_or_may_not_have_happened_but_a_job_cannot_forget_a_cancel() {
    let h = H::new()
        .op(0, 1.0, submit("reg", true), Outcome::Submitted { job: 1 })
        .call(1, 2.0, Op::Release { job: 1 })
        .ret(1, 6.0, Outcome::Unknown { error: "timeout".into() })
        .op(2, 7.0, Op::Read { job: 1 }, read("PENDING", true, false))
        .op(3, 8.0, Op::Read { job: 1 }, read("RUNNING", false, false));
    assert!(linear::check(&h.0, &[1]).is_empty(), "the release took effect between the reads");
    let undone = H::new()
        .op(0, 1.0, submit("reg", false), Outcome::Submitted { job: 1 })
        .op(1, 2.0, Op::Cancel { job: 1 }, Outcome::Cancelled { was_running: true })
        .op(2, 3.0, Op::Read { job: 1 }, read("RUNNING", false, false));
    assert_eq!(linear::check(&undone.0, &[1]).len(), 1);
    let lost = H::new().op(0, 1.0, submit("reg", false), Outcome::Submitted { job: 1 }).op(
        2,
        3.0,
        Op::Read { job: 1 },
        Outcome::Missing,
    );
    assert_eq!(linear::check(&lost.0, &[1]).len(), 1, "an acknowledged job read as missing");
}

#[test]
fn a_job_that_ended_by_itself_never_comes_back() {
    let h = H::new().op(0, 1.0, submit("reg", false), Outcome::Submitted { job: 1 }).op(
        1,
        2.0,
        Op::Read { job: 1 },
        read("NODE_FAIL", false, false),
    );
    assert!(linear::check(&h.0, &[1]).is_empty());
    let back = H(h.0).op(2, 3.0, Op::Hold { job: 1 }, Outcome::Done);
    assert_eq!(linear::check(&back.0, &[1]).len(), 1, "a hold of an ended job succeeded");
}

fn finals(jobs: &[(u64, &str, &str, bool)]) -> BTreeMap<u64, Final> {
    jobs.iter()
        .map(|(id, name, state, cancelled)| {
            (
                *id,
                Final {
                    id: *id,
                    name: name.to_string(),
                    state: state.to_string(),
                    cancelled: *cancelled,
                    task: None,
                    placed: None,
                    restarts: None,
                },
            )
        })
        .collect()
}

#[test]
fn lost_duplicated_phantom_and_unordered_jobs_are_caught() {
    let h = H::new().op(0, 1.0, submit("a", false), Outcome::Submitted { job: 1 }).op(
        0,
        2.0,
        submit("b", false),
        Outcome::Submitted { job: 2 },
    );
    let ok = finals(&[(1, "a", "COMPLETED", false), (2, "b", "COMPLETED", false)]);
    assert!(jobs::check(&h.0, &ok, &[]).is_empty());

    let lost = finals(&[(1, "a", "COMPLETED", false)]);
    assert!(jobs::check(&h.0, &lost, &[]).iter().any(|p| p.starts_with("lost: job 2")));
    let twice = finals(&[(1, "a", "COMPLETED", false), (2, "b", "COMPLETED", false), (3, "b", "COMPLETED", false)]);
    assert!(jobs::check(&h.0, &twice, &[]).iter().any(|p| p.starts_with("duplicate:")));
    let phantom = finals(&[(1, "a", "COMPLETED", false), (2, "b", "COMPLETED", false), (3, "z", "FAILED", false)]);
    assert!(jobs::check(&h.0, &phantom, &[]).iter().any(|p| p.starts_with("phantom:")));
    let open = finals(&[(1, "a", "COMPLETED", false), (2, "b", "RUNNING", false)]);
    assert!(jobs::check(&h.0, &open, &[]).iter().any(|p| p.starts_with("terminal:")));

    let backwards = H::new().op(0, 1.0, submit("a", false), Outcome::Submitted { job: 2 }).op(
        0,
        2.0,
        submit("b", false),
        Outcome::Submitted { job: 1 },
    );
    let f = finals(&[(2, "a", "COMPLETED", false), (1, "b", "COMPLETED", false)]);
    assert!(jobs::check(&backwards.0, &f, &[]).iter().any(|p| p.starts_with("ids:")));
}

fn run(job: u64, node: &str, gpus: &[u32], restarts: u32, start: f64, last: f64) -> runs::Run {
    runs::Run {
        job,
        file: format!("{job}.{}", (start * 100.0) as u64),
        node: node.into(),
        gpus: gpus.to_vec(),
        restarts,
        start,
        last,
        ended: true,
        active: vec![(start, last)],
        cron: None,
        step: None,
        sruns: Vec::new(),
    }
}

#[test]
fn a_cancel_undone_is_caught_but_a_launch_already_on_its_way_is_not() {
    let h = H::new().op(0, 1.0, submit("a", false), Outcome::Submitted { job: 1 }).op(
        1,
        5.0,
        Op::Cancel { job: 1 },
        Outcome::Cancelled { was_running: true },
    );
    let f = finals(&[(1, "a", "CANCELLED", true)]);
    // The attempt it was running started just after the cancel: its launch was on its way.
    assert!(jobs::check(&h.0, &f, &[run(1, "a1", &[], 0, 5.1, 5.2)]).is_empty());
    // A second attempt after the cancel undoes it.
    let again = [run(1, "a1", &[], 0, 5.1, 5.2), run(1, "a2", &[], 1, 8.0, 9.0)];
    assert!(jobs::check(&h.0, &f, &again).iter().any(|p| p.starts_with("cancel: job 1")));
    // A pending job cancelled never starts.
    let pending = H::new().op(0, 1.0, submit("a", false), Outcome::Submitted { job: 1 }).op(
        1,
        5.0,
        Op::Cancel { job: 1 },
        Outcome::Cancelled { was_running: false },
    );
    assert!(jobs::check(&pending.0, &f, &[run(1, "a1", &[], 0, 5.5, 6.0)]).iter().any(|p| p.starts_with("cancel:")));
    // And it ends cancelled.
    let uncancelled = finals(&[(1, "a", "COMPLETED", false)]);
    assert!(jobs::check(&h.0, &uncancelled, &[]).iter().any(|p| p.contains("uncancelled")));
}

#[test]
fn runs_twice_at_once_over_capacity_and_shared_gpus_are_caught() {
    let known: BTreeSet<u64> = (1..=4).collect();
    let none = BTreeSet::new();
    let fine = [run(1, "a1", &[0], 0, 1.0, 3.0), run(2, "a1", &[1], 0, 2.0, 4.0), run(1, "a2", &[], 1, 3.5, 5.0)];
    assert!(runs::check(&fine, 2, &known, &none).is_empty(), "{:?}", runs::check(&fine, 2, &known, &none));

    let twice = [run(1, "a1", &[], 0, 1.0, 3.0), run(1, "a2", &[], 1, 2.0, 4.0)];
    assert!(runs::check(&twice, 2, &known, &none).iter().any(|p| p.contains("ran twice at once")));
    let crowded = [run(1, "a1", &[], 0, 1.0, 3.0), run(2, "a1", &[], 0, 1.5, 4.0), run(3, "a1", &[], 0, 2.0, 4.0)];
    assert!(runs::check(&crowded, 2, &known, &none).iter().any(|p| p.contains("3 jobs at once")));
    let gpu = [run(1, "a1", &[1], 0, 1.0, 3.0), run(2, "a1", &[1], 0, 2.0, 4.0)];
    assert!(runs::check(&gpu, 2, &known, &none).iter().any(|p| p.contains("GPU 1 of a1")));
    let stranger = [run(9, "a1", &[], 0, 1.0, 2.0)];
    assert!(runs::check(&stranger, 2, &known, &none).iter().any(|p| p.contains("no client's submit")));
    // A job of two nodes runs its one attempt on both at once; two attempts at once are twice.
    let wide: BTreeSet<u64> = [1].into();
    let one_attempt = [run(1, "a1", &[], 0, 1.0, 3.0), run(1, "a2", &[], 0, 1.0, 3.0)];
    assert!(runs::check(&one_attempt, 2, &known, &wide).is_empty());
    assert!(runs::check(&one_attempt, 2, &known, &none).iter().any(|p| p.contains("ran twice at once")));
    assert!(runs::check(&twice, 2, &known, &wide).iter().any(|p| p.contains("ran twice at once")));
}

/// A job with `afterok:X` starts only after X completed, and never when X ended otherwise.
#[test]
fn a_dependent_job_started_before_its_dependency_completed_is_caught() {
    let after = |name: &str, x: u64| short(name, |j| Job { after: Some(x), ..j });
    let h = H::new()
        .op(0, 1.0, submit("x", false), Outcome::Submitted { job: 1 })
        .op(0, 1.1, after("d", 1), Outcome::Submitted { job: 2 })
        // Never answered: known by name from the final read.
        .call(1, 1.2, after("d2", 1))
        .0;
    let done = finals(&[(1, "x", "COMPLETED", false), (2, "d", "COMPLETED", false), (3, "d2", "COMPLETED", false)]);
    let fine = [run(1, "a1", &[], 0, 2.0, 4.0), run(2, "a2", &[], 0, 4.5, 5.0), run(3, "a1", &[], 0, 4.2, 5.0)];
    assert!(deps::check(&h, &done, &fine).is_empty(), "{:?}", deps::check(&h, &done, &fine));
    let early = [run(1, "a1", &[], 0, 2.0, 4.0), run(2, "a2", &[], 0, 3.0, 5.0), run(3, "a1", &[], 0, 4.2, 5.0)];
    let found = deps::check(&h, &done, &early);
    assert!(
        found.len() == 1 && found[0].contains("job 2 (afterok:1) started at 3.00, before job 1 ended at 4.00"),
        "{found:?}"
    );
    let failed = finals(&[(1, "x", "FAILED", false), (2, "d", "COMPLETED", false), (3, "d2", "CANCELLED", true)]);
    let found = deps::check(&h, &failed, &fine);
    assert!(found.len() == 2 && found.iter().all(|p| p.contains("ended FAILED, not COMPLETED")), "{found:?}");
    // A dependent that never ran is no violation, whatever its dependency did.
    assert!(deps::check(&h, &failed, &fine[..1]).is_empty());
}

#[test]
fn a_run_record_is_read_as_the_job_script_writes_it() {
    let r = runs::parse(7, "7.123", "start 10.50 a2 0,1 2\ntick 10.70\ntick 10.90\nend 11.00\n").unwrap();
    assert_eq!((r.node.as_str(), r.gpus.as_slice(), r.restarts), ("a2", &[0, 1][..], 2));
    assert_eq!((r.start, r.last, r.ended), (10.5, 11.0, true));
    let r = runs::parse(7, "7.124", "start 3.00 a1  0\ntick 3.20\n").unwrap();
    assert!(r.gpus.is_empty() && !r.ended && r.last == 3.2);
    assert!(runs::parse(7, "7.125", "").is_none());
    // A recurring job's firing: its entry, and when it was due.
    let r = runs::parse(
        8,
        "8.1",
        "start 4.00 a3  0 2@1764500000
end 4.20
",
    )
    .unwrap();
    assert_eq!(r.cron, Some((2, 1_764_500_000)));
    assert_eq!(runs::parse(8, "8.2", "start 4.00 a3  0 \n").unwrap().cron, None);
}

/// The recurring job's checker: one job per firing, each on the schedule, none after the entry
/// was removed, each started once and ended; and its jobs are no client's, so no other checker
/// calls them phantoms or duplicates of one another.
#[test]
fn a_cron_firing_submitted_twice_off_schedule_or_after_removal_is_caught() {
    use quorum_jepsen::checker::cron::{self, Cron};
    use quorum_jepsen::checker::{check, Evidence};
    let c = Cron { name: "cron".into(), period_s: 2, removed_before: Some(20) };
    let fired = |job: u64, due: u64, start: f64| runs::Run {
        cron: Some((1, due)),
        ..run(job, "a1", &[], 0, start, start + 0.2)
    };
    let mut all =
        finals(&[(10, "cron", "COMPLETED", false), (11, "cron", "COMPLETED", false), (12, "cron", "CANCELLED", true)]);
    let good = vec![fired(10, 100, 1.0), fired(11, 102, 3.0)];
    assert_eq!(cron::check(&c, &all, &good), Vec::<String>::new());
    let no_one = Evidence {
        events: &[],
        finals: &all,
        runs: &good,
        registers: &[],
        node_cpus: 4,
        reservations: &[],
        cron: Some(&c),
    };
    assert_eq!(check(&no_one), Vec::<String>::new(), "the entry's jobs are not phantoms or duplicates");

    let twice = vec![fired(10, 100, 1.0), fired(11, 100, 3.0)];
    assert!(cron::check(&c, &all, &twice).iter().any(|p| p.contains("due at 100 submitted 2 jobs")));
    let off = vec![fired(10, 101, 1.0)];
    assert!(cron::check(&c, &all, &off).iter().any(|p| p.contains("off its entry's schedule")));
    let again = vec![fired(10, 100, 1.0), fired(10, 100, 5.0)];
    assert!(cron::check(&c, &all, &again).iter().any(|p| p.contains("started 2 times")));
    all.insert(21, finals(&[(21, "cron", "PENDING", false)]).remove(&21).unwrap());
    let problems = cron::check(&c, &all, &good);
    assert!(problems.iter().any(|p| p.contains("job 21 was submitted after the entry was removed")), "{problems:?}");
    assert!(problems.iter().any(|p| p.contains("job 21 is still PENDING")), "{problems:?}");
}

/// A job without --requeue that started twice, even one after the other, is caught; a --requeue
/// job may; a job submitted held that nobody released must not run, and may once a release was
/// asked, answered or not.
#[test]
fn a_second_start_without_requeue_and_a_held_job_that_ran_unreleased_are_caught() {
    let requeue = |name: &str| short(name, |j| Job { requeue: true, ..j });
    let h = H::new()
        .op(0, 1.0, submit("once", false), Outcome::Submitted { job: 1 })
        .op(0, 1.1, requeue("again"), Outcome::Submitted { job: 2 })
        .op(0, 1.2, submit("held", true), Outcome::Submitted { job: 3 })
        // Never answered: its job is known by name from the final read.
        .call(1, 1.3, submit("held-unanswered", true))
        .op(0, 1.4, Op::Release { job: 5 }, Outcome::Unknown { error: "timeout".into() })
        .call(0, 1.5, submit("released", true))
        .0;
    let mut h = h;
    h.push(Event::Complete { process: 0, time: 1.6, outcome: Outcome::Submitted { job: 5 } });
    let finals = finals(&[
        (1, "once", "COMPLETED", false),
        (2, "again", "COMPLETED", false),
        (3, "held", "CANCELLED", true),
        (4, "held-unanswered", "CANCELLED", true),
        (5, "released", "COMPLETED", false),
    ]);
    // One run each where allowed; a requeued --requeue job twice, one after the other.
    let fine = vec![
        run(1, "a1", &[], 0, 2.0, 3.0),
        run(2, "a1", &[], 0, 2.0, 3.0),
        run(2, "a2", &[], 1, 4.0, 5.0),
        run(5, "a2", &[], 0, 2.0, 3.0),
    ];
    assert!(starts::check(&h, &finals, &fine).is_empty(), "{:?}", starts::check(&h, &finals, &fine));
    let mut twice = fine.clone();
    twice.push(run(1, "a2", &[], 1, 4.0, 5.0));
    let found = starts::check(&h, &finals, &twice);
    assert!(found.len() == 1 && found[0].contains("job 1 ('once', without --requeue) started 2 times"), "{found:?}");
    for held in [3, 4] {
        let mut ran = fine.clone();
        ran.push(run(held, "a1", &[], 0, 6.0, 7.0));
        let found = starts::check(&h, &finals, &ran);
        assert!(
            found.len() == 1
                && found[0].contains(&format!("job {held} ("))
                && found[0].contains("submitted held, no client released it"),
            "{found:?}"
        );
    }
}

/// An array's tasks never run more at once than its throttle, judged on what the tasks recorded;
/// an acknowledged array has every task, each once, on consecutive ids.
#[test]
fn an_array_past_its_throttle_or_missing_a_task_is_caught() {
    let array = Array { tasks: 3, throttle: 1 };
    let submit = short("arr", |j| Job { requeue: true, array: Some(array), ..j });
    let h = H::new().op(0, 1.0, submit, Outcome::Submitted { job: 4 }).0;
    let task = |id: u64, t: u32| {
        (
            id,
            Final {
                id,
                name: "arr".into(),
                state: "COMPLETED".into(),
                cancelled: false,
                task: Some(t),
                placed: None,
                restarts: None,
            },
        )
    };
    let whole: BTreeMap<u64, Final> = [task(4, 0), task(5, 1), task(6, 2)].into_iter().collect();
    // One after another, on two nodes, with a task requeued: within the throttle.
    let in_turn = [
        run(4, "a1", &[], 0, 2.0, 3.0),
        run(5, "a2", &[], 0, 3.005, 4.0),
        run(5, "a1", &[], 1, 4.5, 5.0),
        run(6, "a2", &[], 0, 5.0, 6.0),
    ];
    assert_eq!(arrays::check(&h, &whole, &in_turn), Vec::<String>::new());
    let together = [run(4, "a1", &[], 0, 2.0, 3.0), run(6, "a2", &[], 0, 2.5, 3.5)];
    let found = arrays::check(&h, &whole, &together);
    assert!(found.iter().any(|p| p.contains("ran 2 tasks at once")), "{found:?}");
    // A task lost, or made twice.
    let mut missing = whole.clone();
    missing.remove(&5);
    assert!(arrays::check(&h, &missing, &in_turn).iter().any(|p| p.contains("final read")));
    let mut twice = whole.clone();
    twice.insert(7, task(7, 2).1);
    assert!(arrays::check(&h, &twice, &in_turn).iter().any(|p| p.contains("final read")));
    // Tasks share the array's name: that is not a duplicate submit.
    assert!(jobs::check(&h, &whole, &in_turn).iter().all(|p| !p.contains("duplicate")));
}

/// A job suspended by preemption lends its CPU: the run that had it meanwhile is not an
/// overcommit, judged on the pause in the suspended job's ticks; one that ran while the other
/// still ticked is. Its GPU stays its own while suspended.
#[test]
fn a_suspended_job_lends_its_cpu_but_not_its_gpu() {
    let record = |text: &str| runs::parse(1, "1.1", text).expect("a record");
    let ticks = |from: f64, to: f64| {
        let mut t = from;
        let mut s = String::new();
        while t <= to + 1e-9 {
            s.push_str(&format!("tick {t:.2}\n"));
            t += 0.2;
        }
        s
    };
    // Suspended from 2.0 to 5.0: two stretches of running.
    let suspended = record(&format!("start 1.00 a1 0 0\n{}{}end 6.00\n", ticks(1.2, 2.0), ticks(5.2, 6.0)));
    assert_eq!(suspended.active.len(), 2, "{:?}", suspended.active);
    assert!((suspended.active[0].1 - 2.0).abs() < 1e-6 && (suspended.active[1].0 - 5.2).abs() < 1e-6);
    let other = |job: u64, start: f64, last: f64, gpus: &[u32]| {
        let mut r = run(job, "a1", gpus, 0, start, last);
        r.file = format!("{job}.x");
        r
    };
    let known: BTreeSet<u64> = [1, 2, 3].into();
    let none = BTreeSet::new();
    // One CPU: the preemptor ran in the pause.
    let fine = [suspended.clone(), other(2, 2.5, 4.5, &[])];
    assert_eq!(runs::check(&fine, 1, &known, &none), Vec::<String>::new());
    let during = [suspended.clone(), other(2, 1.5, 4.5, &[])];
    assert!(runs::check(&during, 1, &known, &none).iter().any(|p| p.contains("2 jobs at once")));
    // Its GPU is still its own in the pause.
    let mut gpu = suspended.clone();
    gpu.gpus = vec![0];
    let shared = [gpu, other(3, 2.5, 4.5, &[0])];
    assert!(runs::check(&shared, 2, &known, &none).iter().any(|p| p.contains("GPU 0")));
}

/// When a job was frozen comes from its agent's log, colours and all: the run counts as running
/// around the pause, not in it; a suspend never resumed lasts to the end.
#[test]
fn an_agents_log_says_when_a_job_was_frozen() {
    let line = |at: &str, what: &str, job: u64| {
        format!(
            "\x1b[2m{at}\x1b[0m \x1b[32m INFO\x1b[0m \x1b[1mjob\x1b[0m\x1b[1m{{\x1b[0m\x1b[3mjob_id\x1b[0m\x1b[2m=\x1b[0m{job} \x1b[3mnode\x1b[0m\x1b[2m=\x1b[0ma1 \x1b[3mrank\x1b[0m\x1b[2m=\x1b[0m0\x1b[1m}}\x1b[0m\x1b[2m:\x1b[0m \x1b[2mquorum_agent::runner\x1b[0m\x1b[2m:\x1b[0m {what} the job \x1b[3mjob\x1b[0m\x1b[2m=\x1b[0m{job}\n"
        )
    };
    let log = [
        line("1970-01-02T00:00:10.000000Z", "suspending", 7),
        line("1970-01-02T00:00:11.000000Z", "suspending", 8),
        line("1970-01-02T00:00:12.500000Z", "resuming", 7),
    ]
    .concat();
    let spans = runs::pauses(&log, 86_400.0);
    assert_eq!(spans.len(), 2, "{spans:?}");
    assert_eq!((spans[0].0, spans[0].1), (7, 10.0));
    assert!((spans[0].2 - 12.55).abs() < 1e-6, "{spans:?}");
    assert_eq!((spans[1].0, spans[1].1, spans[1].2), (8, 11.0, f64::INFINITY));
    let mut rs = [run(7, "a1", &[], 0, 9.0, 14.0), run(8, "a1", &[], 0, 9.0, 14.0), run(7, "a2", &[], 1, 9.0, 14.0)];
    runs::apply_pauses(&mut rs, "a1", &spans);
    assert_eq!(rs[0].active.len(), 2);
    assert_eq!(rs[0].active[0], (9.0, 10.0));
    assert!((rs[0].active[1].0 - 12.55).abs() < 1e-6 && rs[0].active[1].1 == 14.0);
    assert_eq!(rs[1].active, vec![(9.0, 11.0)]);
    assert_eq!(rs[2].active, vec![(9.0, 14.0)], "another node's run of the job is not paused");
}

/// No job outside a reservation uses its nodes in its window (by the cluster's clock), and a job
/// in it runs only there and then.
#[test]
fn a_reservations_nodes_used_by_another_job_in_its_window_are_caught() {
    use quorum_jepsen::checker::ended::Placed;
    use quorum_jepsen::checker::resv::{self, Resv};
    let r = Resv { name: "r".into(), nodes: vec!["a2".into()], start_ms: 1000, end_ms: 2000 };
    let job = |id: u64, resv: Option<&str>, node: &str, start_ms: u64, end_ms: u64| {
        let placed = Placed { reservation: resv.map(String::from), start_ms, end_ms, nodes: vec![node.into()] };
        let name = format!("j{id}");
        (
            id,
            Final {
                id,
                name,
                state: "COMPLETED".into(),
                cancelled: false,
                task: None,
                placed: Some(placed),
                restarts: None,
            },
        )
    };
    let fine: BTreeMap<u64, Final> = [
        job(2, None, "a2", 2500, 2600),
        job(3, Some("r"), "a2", 1200, 1300),
        job(5, None, "a1", 1500, 1600),
        job(7, None, "a2", 500, 900),
    ]
    .into_iter()
    .collect();
    assert_eq!(resv::check(std::slice::from_ref(&r), &fine), Vec::<String>::new());
    for (bad, why) in [
        (job(1, None, "a2", 1500, 1600), "not in 'r'"),
        (job(6, None, "a2", 500, 1100), "not in 'r'"),
        (job(8, None, "a2", 1900, 0), "not in 'r'"),
        (job(4, Some("r"), "a2", 900, 1100), "not in its window"),
        (job(9, Some("r"), "a1", 1200, 1300), "not in its window"),
    ] {
        let mut finals = fine.clone();
        let id = bad.0;
        finals.insert(bad.0, bad.1);
        let found = resv::check(std::slice::from_ref(&r), &finals);
        assert!(found.len() == 1 && found[0].contains(why), "job {id}: {found:?}");
    }
}

/// A history record is read as the checkers see jobs; the replicas' histories must hold the same
/// jobs, none still in the queue, none unended.
#[test]
fn the_replicas_histories_agree_and_hold_only_ended_jobs_out_of_the_queue() {
    use quorum_jepsen::checker::archive;
    let record = |id: u64, state: &str| {
        format!(
            r#"{{"id":{id},"spec":{{"name":"j{id}","reservation":"r"}},"state":"{state}","cancel_requested":false,"cancelled_by":null,"array":{{"task_id":2}},"allocation":{{"nodes":[{{"node":"a2"}}]}},"start_time":1000,"end_time":2000,"archived":7}}"#
        )
        .into_bytes()
    };
    let f = archive::final_of(&record(5, "NodeFail")).expect("a job");
    assert_eq!((f.id, f.name.as_str(), f.state.as_str(), f.cancelled, f.task), (5, "j5", "NODE_FAIL", false, Some(2)));
    let placed = f.placed.expect("placed");
    assert_eq!((placed.reservation.as_deref(), placed.start_ms, placed.end_ms), (Some("r"), 1000, 2000));
    assert_eq!(placed.nodes, vec!["a2".to_string()]);

    let queue: BTreeSet<u64> = [9].into();
    let same = vec![("r1".to_string(), vec![record(5, "Completed")]), ("r2".to_string(), vec![record(5, "Completed")])];
    let judged = archive::check(&same, &queue);
    assert!(judged.problems.is_empty() && judged.agree, "{:?}", judged.problems);
    assert_eq!(judged.jobs.len(), 1);
    let other =
        vec![("r1".to_string(), vec![record(5, "Completed")]), ("r2".to_string(), vec![record(6, "Completed")])];
    let judged = archive::check(&other, &queue);
    assert!(!judged.agree && judged.problems.iter().any(|p| p.contains("hold other jobs")));
    let twice = vec![("r1".to_string(), vec![record(9, "Completed")])];
    assert!(archive::check(&twice, &queue)
        .problems
        .iter()
        .any(|p| p.contains("was in the history, then in the queue")));
    let unended = vec![("r1".to_string(), vec![record(7, "Running")])];
    assert!(archive::check(&unended, &queue).problems.iter().any(|p| p.contains("in the history RUNNING")));
}

/// A job that ended may leave the queue for the history: a hold, release or cancel then finds no
/// such job while a read still finds it ended; a job still pending and held cannot be gone so.
#[test]
fn a_job_gone_to_the_history_is_missing_to_changes_but_not_to_reads() {
    let gone = H::new()
        .op(0, 1.0, submit("reg", false), Outcome::Submitted { job: 1 })
        .op(1, 2.0, Op::Cancel { job: 1 }, Outcome::Cancelled { was_running: false })
        .op(2, 13.0, Op::Hold { job: 1 }, Outcome::Missing)
        .op(3, 14.0, Op::Read { job: 1 }, read("CANCELLED", false, true))
        .op(2, 15.0, Op::Cancel { job: 1 }, Outcome::Missing);
    assert_eq!(linear::check(&gone.0, &[1]), Vec::<String>::new());
    let held = H::new().op(0, 1.0, submit("reg", true), Outcome::Submitted { job: 1 }).op(
        2,
        13.0,
        Op::Release { job: 1 },
        Outcome::Missing,
    );
    assert_eq!(linear::check(&held.0, &[1]).len(), 1, "a held job never ends by itself");
    let read_lost = H::new()
        .op(0, 1.0, submit("reg", false), Outcome::Submitted { job: 1 })
        .op(1, 2.0, Op::Cancel { job: 1 }, Outcome::Cancelled { was_running: false })
        .op(3, 14.0, Op::Read { job: 1 }, Outcome::Missing);
    assert_eq!(linear::check(&read_lost.0, &[1]).len(), 1, "a read finds it in the history");
}

/// Steps: a step's task inside its job's script on its node, each step once, each srun that
/// said success backed by a task that ran to its end; a step before or long after its script,
/// one run twice, or a success with no task behind it are caught.
#[test]
fn a_step_outside_its_job_run_twice_or_claimed_without_a_task_is_caught() {
    use quorum_jepsen::checker::steps;
    let script = |sruns: &[(f64, i32)]| runs::Run { sruns: sruns.to_vec(), ..run(5, "a1", &[], 0, 10.0, 14.0) };
    let step = |id: u32, start: f64, last: f64| runs::Run {
        step: Some(id),
        file: format!("5.s{id}.{}", (start * 100.0) as u64),
        ..run(5, "a1", &[], 0, start, last)
    };
    let good = vec![script(&[(11.5, 0), (13.5, 0)]), step(0, 10.2, 11.4), step(1, 11.6, 13.4)];
    assert_eq!(steps::check(&good), Vec::<String>::new());
    // The records as the scripts write them.
    let s = runs::parse(5, "5.1", "start 10.00 a1  0 \nsrun 11.50 0\nsrun 13.50 1\nend 14.00\n").unwrap();
    assert_eq!((s.sruns.clone(), s.step, s.ended), (vec![(11.5, 0), (13.5, 1)], None, true));
    assert_eq!(runs::parse(5, "5.s1.9", "start 11.60 a1  0 step=1\nend 13.4\n").unwrap().step, Some(1));

    let elsewhere = vec![script(&[]), runs::Run { node: "a2".into(), ..step(0, 10.2, 11.4) }];
    assert!(steps::check(&elsewhere).iter().any(|p| p.contains("outside any run of its job's script")));
    let outlived = vec![script(&[]), step(0, 10.2, 20.0)];
    assert!(steps::check(&outlived).iter().any(|p| p.contains("after its job's script last did")));
    let twice = vec![script(&[]), step(0, 10.2, 11.0), step(0, 11.2, 12.0)];
    assert!(steps::check(&twice).iter().any(|p| p.contains("ran 2 times")));
    let claimed = vec![script(&[(11.5, 0), (13.5, 0)]), step(0, 10.2, 11.4)];
    assert!(steps::check(&claimed).iter().any(|p| p.contains("returned 0 at 13.50")));
    // A failed srun claims nothing.
    let failed = vec![script(&[(11.5, 0), (13.5, 1)]), step(0, 10.2, 11.4)];
    assert_eq!(steps::check(&failed), Vec::<String>::new());
}

/// A job the cluster says COMPLETED ran its last attempt to its end; one whose last attempt was
/// cut short (an earlier attempt's exit report taken for it) is caught.
#[test]
fn a_completed_job_whose_last_attempt_did_not_run_to_its_end_is_caught() {
    let mut all = finals(&[(3, "job-1", "COMPLETED", false)]);
    all.get_mut(&3).unwrap().restarts = Some(1);
    let first = run(3, "a1", &[], 0, 1.0, 2.0);
    let second = run(3, "a2", &[], 1, 3.0, 4.0);
    assert_eq!(runs::completed(&all, &[first.clone(), second.clone()]), Vec::<String>::new());
    let cut = runs::Run { ended: false, ..second };
    let problems = runs::completed(&all, &[first, cut]);
    assert!(problems.iter().any(|p| p.contains("job 3 ('job-1') is COMPLETED")), "{problems:?}");
}
