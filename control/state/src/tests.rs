use std::collections::BTreeMap;

use super::*;
use crate::testing::{cluster, register, spec, submit};
use quorum_model::*;

#[test]
fn submit_assigns_ids_and_dedups_retries() {
    let mut s = cluster();
    assert_eq!(submit(&mut s, 10, spec(&["true"]), "r1"), Response::Submitted { job_id: 1, duplicate: false });
    assert_eq!(submit(&mut s, 11, spec(&["true"]), "r1"), Response::Submitted { job_id: 1, duplicate: true });
    assert_eq!(submit(&mut s, 12, spec(&["true"]), "r2"), Response::Submitted { job_id: 2, duplicate: false });
    assert_eq!(s.jobs.len(), 2);
    let job = &s.jobs[&1];
    assert_eq!(job.partition, "gpu");
    assert_eq!(job.spec.mem_per_node_mb, Some(1024));
    assert_eq!(job.spec.time_limit_s, Some(86400), "the partition max is the default limit");
}

#[test]
fn bad_submits_are_rejected_and_create_nothing() {
    let mut s = cluster();
    let mut unknown = spec(&["true"]);
    unknown.partition = Some("cpu".into());
    let mut too_many_gpus = spec(&["true"]);
    too_many_gpus.gpus_per_node = 16;
    too_many_gpus.gpu_type = Some("h100".into());
    let mut wrong_type = spec(&["true"]);
    wrong_type.gpus_per_node = 1;
    wrong_type.gpu_type = Some("a100".into());
    let mut too_long = spec(&["true"]);
    too_long.time_limit_s = Some(2 * 86400);
    let mut too_many_nodes = spec(&["true"]);
    too_many_nodes.nodes = 3;
    too_many_nodes.ntasks = 3;
    let cases = [
        (unknown, "unknown partition 'cpu'"),
        (too_many_gpus, "no node with 16 GPUs of type h100; the largest has 4"),
        (wrong_type, "no node with 1 GPUs of type a100; the largest has 0"),
        (too_long, "exceeds partition 'gpu' limit of 1-00:00:00"),
        (too_many_nodes, "has 2 nodes, fewer than the 3 requested"),
        (spec(&[]), "empty command"),
    ];
    for (i, (sp, want)) in cases.into_iter().enumerate() {
        match submit(&mut s, 20 + i as u64, sp, &format!("bad{i}")) {
            Response::Rejected(r) => assert!(r.to_string().contains(want), "{r} should contain {want}"),
            other => panic!("case {i}: expected a rejection, got {other:?}"),
        }
    }
    assert!(s.jobs.is_empty());
    assert!(s.request_ids.is_empty());
    assert_eq!(s.next_job_id, 1);
}

fn start(s: &mut ClusterState, index: u64, job_id: JobId, node: &str, cpus: u32, gpus: Vec<u32>) -> Response {
    let mem_mb = s.jobs[&job_id].spec.mem_per_node_mb.unwrap();
    apply(
        s,
        index,
        Command::ApplyPlan {
            base_index: index - 1,
            now: 2000,
            starts: vec![PlannedStart {
                job_id,
                allocation: Allocation {
                    nodes: vec![quorum_model::NodeAllocation { node: node.into(), cpus, mem_mb, gpus, het_group: 0 }],
                    cpu_ways: None,
                },
            }],
            reasons: vec![],
            preemptions: vec![],
            resumes: vec![],
            shown: vec![],
        },
    )
}

/// A plan keeps with each job it starts the starts that job was shown while it waited; a
/// start dropped at apply keeps nothing, and a plan that keeps them needs level 35.
#[test]
fn a_started_job_keeps_the_starts_it_was_shown() {
    let mut s = cluster();
    let mut sp = spec(&["true"]);
    sp.cpus_per_task = 8;
    submit(&mut s, 10, sp.clone(), "a");
    submit(&mut s, 11, sp, "b");
    let mem_mb = s.jobs[&1].spec.mem_per_node_mb.unwrap();
    let on = |job_id| PlannedStart {
        job_id,
        allocation: Allocation {
            nodes: vec![quorum_model::NodeAllocation {
                node: "n1".into(),
                cpus: 8,
                mem_mb,
                gpus: vec![],
                het_group: 0,
            }],
            cpu_ways: None,
        },
    };
    let shown = |first_ms| ShownStart { first_ms, last_ms: first_ms + 500 };
    // Job 2 does not fit beside job 1 on n1: dropped, it keeps nothing.
    let plan = Command::apply_plan(11, 2000, vec![on(1), on(2)], vec![], vec![], vec![])
        .unwrap()
        .with_shown(vec![(1, shown(1500)), (2, shown(1700))]);
    assert_eq!(plan.level().0, FORECAST_LEVEL);
    match apply(&mut s, 12, plan) {
        Response::PlanApplied { started, dropped, .. } => assert_eq!((started, dropped.len()), (vec![1], 1)),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.jobs[&1].shown, Some(shown(1500)));
    assert_eq!(s.jobs[&2].shown, None);
    assert!(Command::apply_plan(11, 2000, vec![on(2)], vec![], vec![], vec![]).unwrap().level().0 < FORECAST_LEVEL);
}

#[test]
fn plan_is_rechecked_at_apply_and_job_end_frees_resources() {
    let mut s = cluster();
    let mut sp = spec(&["true"]);
    sp.cpus_per_task = 8;
    sp.gpus_per_node = 4;
    submit(&mut s, 10, sp.clone(), "a");
    submit(&mut s, 11, sp, "b");
    assert_eq!(
        start(&mut s, 12, 1, "n1", 8, vec![0, 1, 2, 3]),
        Response::PlanApplied { started: vec![1], dropped: vec![], preempted: vec![] }
    );
    // A stale plan placing job 2 on the same node is dropped, not applied.
    match start(&mut s, 13, 2, "n1", 8, vec![0, 1, 2, 3]) {
        Response::PlanApplied { started, dropped, .. } => {
            assert!(started.is_empty());
            assert_eq!(dropped[0].0, 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.nodes["n1"].state(), quorum_model::NodeState::Allocated);
    assert_eq!(s.jobs[&1].alloc_index, 12);
    // A report with an older token changes nothing.
    let ended = |token, code| Command::JobEnded {
        job_id: 1,
        token,
        node: "n1".into(),
        outcome: RankOutcome::Exited { code, signal: 0 },
        now: 3000,
    };
    assert_eq!(apply(&mut s, 14, ended(5, 0)), Response::Ignored);
    assert_eq!(apply(&mut s, 15, ended(12, 3)), Response::JobFinished { job_id: 1, state: JobState::Failed });
    assert_eq!(s.jobs[&1].exit_code, Some(3));
    assert_eq!(s.nodes["n1"].alloc_cpus, 0);
    assert!(s.nodes["n1"].alloc_gpus.is_empty());
    assert_eq!(s.nodes["n1"].state(), quorum_model::NodeState::Idle);
    assert_eq!(apply(&mut s, 16, ended(12, 0)), Response::Ignored, "a job ends once");
}

#[test]
fn cancel_pending_and_running() {
    let mut s = cluster();
    submit(&mut s, 10, spec(&["sleep", "1000"]), "a");
    submit(&mut s, 11, spec(&["sleep", "1000"]), "b");
    start(&mut s, 12, 1, "n1", 1, vec![]);
    let cancel = |id, user: &str| Command::CancelJob { job_id: id, user: user.into(), now: 4000, whole_array: false };
    assert!(matches!(apply(&mut s, 13, cancel(2, "mallory")), Response::Rejected(Rejection::NotOwner { .. })));
    assert_eq!(apply(&mut s, 14, cancel(2, "alice")), Response::Cancelled { job_id: 2, was_running: false });
    assert_eq!(s.jobs[&2].state, JobState::Cancelled);
    assert_eq!(apply(&mut s, 15, cancel(1, "alice")), Response::Cancelled { job_id: 1, was_running: true });
    assert_eq!(s.jobs[&1].state, JobState::Running, "running until its processes are gone");
    let r = apply(
        &mut s,
        16,
        Command::JobEnded {
            job_id: 1,
            token: 12,
            node: "n1".into(),
            outcome: RankOutcome::Cancelled { code: 0, signal: 15 },
            now: 5000,
        },
    );
    assert_eq!(r, Response::JobFinished { job_id: 1, state: JobState::Cancelled });
    assert!(matches!(apply(&mut s, 17, cancel(1, "alice")), Response::Rejected(Rejection::JobFinished { .. })));
    assert!(matches!(apply(&mut s, 18, cancel(99, "alice")), Response::Rejected(Rejection::UnknownJob { id: 99 })));
    // Who cancelled is recorded from level 13 on; below it a replica of an older release would
    // record nothing, so neither does this one.
    assert_eq!((s.jobs[&1].cancelled_by.as_deref(), s.jobs[&2].cancelled_by.as_deref()), (None, None));
    at_feature_level(&mut s, 19);
    submit(&mut s, 20, spec(&["sleep", "1000"]), "c");
    start(&mut s, 21, 3, "n1", 1, vec![]);
    submit(&mut s, 22, spec(&["sleep", "1000"]), "d");
    apply(&mut s, 23, cancel(3, "root"));
    apply(&mut s, 24, cancel(4, "alice"));
    assert_eq!(s.jobs[&3].cancelled_by.as_deref(), Some("root"), "asked while it runs");
    assert_eq!(s.jobs[&4].cancelled_by.as_deref(), Some("alice"));
}

#[test]
fn clock_never_moves_backwards_and_apply_is_deterministic() {
    let run = || {
        let mut s = cluster();
        submit(&mut s, 10, spec(&["true"]), "a");
        apply(
            &mut s,
            11,
            Command::SubmitJob { spec: Box::new(spec(&["true"])), user: "bob".into(), now: 5, request_id: "b".into() },
        );
        s
    };
    let (a, b) = (run(), run());
    assert_eq!(a.clock, 1010);
    assert_eq!(a.jobs[&2].submit_time, 1010);
    assert_eq!(digest(&a), digest(&b));
}

#[test]
fn snapshots_reproduce_the_state_bit_for_bit() {
    // Fairshare usage is a float; a snapshot that parsed it 1 ULP off would make a replica that
    // installed it disagree with the others (found by the catch-up-by-snapshot test).
    let mut s = cluster();
    for i in 1..2000u32 {
        let value = f64::from(i) * 0.001 / 7.0 + 0.1 + 0.2;
        s.usage.insert(format!("a{i}"), quorum_model::Usage { value, at: u64::from(i), ..Default::default() });
    }
    let bytes = serde_json::to_vec(&s).unwrap();
    let back: ClusterState = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(back, s);
    assert_eq!(digest(&back), digest(&s));
}

/// Starts `job_id` on both nodes, `cpus` each.
fn start_on_both(s: &mut ClusterState, index: u64, job_id: JobId, cpus: u32) -> Response {
    let mem_mb = s.jobs[&job_id].spec.mem_per_node_mb.unwrap();
    let on = |node: &str| quorum_model::NodeAllocation { node: node.into(), cpus, mem_mb, gpus: vec![0], het_group: 0 };
    apply(
        s,
        index,
        Command::ApplyPlan {
            base_index: index - 1,
            now: 2000,
            starts: vec![PlannedStart {
                job_id,
                allocation: Allocation { nodes: vec![on("n1"), on("n2")], cpu_ways: None },
            }],
            reasons: vec![],
            preemptions: vec![],
            resumes: vec![],
            shown: vec![],
        },
    )
}

#[test]
fn node_down_fails_or_requeues_its_jobs_and_frees_every_node_they_held() {
    let mut s = cluster();
    let mut wide = spec(&["sleep", "1000"]);
    wide.nodes = 2;
    wide.ntasks = 2;
    wide.gpus_per_node = 1;
    let submitted = |r| assert!(matches!(r, Response::Submitted { .. }), "{r:?}");
    submitted(submit(&mut s, 10, wide.clone(), "a")); // 1: two nodes, ends NODE_FAIL
    wide.requeue = true;
    submitted(submit(&mut s, 11, wide, "b")); // 2: two nodes, requeued
    let mut elsewhere = spec(&["sleep", "1000"]);
    elsewhere.requeue = true;
    submitted(submit(&mut s, 12, elsewhere, "c")); // 3: only on n2, untouched
    start_on_both(&mut s, 13, 1, 2);
    // The plan gives job 2 other GPUs than job 1.
    let mem_mb = s.jobs[&2].spec.mem_per_node_mb.unwrap();
    let on =
        |node: &str| quorum_model::NodeAllocation { node: node.into(), cpus: 2, mem_mb, gpus: vec![1], het_group: 0 };
    apply(
        &mut s,
        14,
        Command::ApplyPlan {
            base_index: 13,
            now: 2000,
            starts: vec![PlannedStart {
                job_id: 2,
                allocation: Allocation { nodes: vec![on("n1"), on("n2")], cpu_ways: None },
            }],
            reasons: vec![],
            preemptions: vec![],
            resumes: vec![],
            shown: vec![],
        },
    );
    start(&mut s, 15, 3, "n2", 1, vec![]);
    assert_eq!(s.nodes["n2"].alloc_cpus, 5);

    let down = |node: &str, now| Command::NodeDown { node: node.into(), reason: "not responding".into(), now };
    assert_eq!(apply(&mut s, 16, down("n1", 9000)), Response::NodeDowned { ended: vec![1], requeued: vec![2] });
    assert_eq!(s.nodes["n1"].state(), quorum_model::NodeState::Down);
    assert_eq!(s.nodes["n1"].reason(), "not responding");
    assert_eq!((s.nodes["n1"].alloc_cpus, s.nodes["n1"].alloc_gpus.len()), (0, 0));
    // What both jobs held on n2 is free too; job 3 still runs there.
    assert_eq!(s.nodes["n2"].alloc_cpus, 1);
    assert!(s.nodes["n2"].alloc_gpus.is_empty());
    assert_eq!(s.nodes["n2"].jobs.iter().copied().collect::<Vec<_>>(), vec![3]);

    let failed = &s.jobs[&1];
    assert_eq!((failed.state, failed.end_time), (JobState::NodeFail, Some(9000)));
    assert!(!s.active.contains(&1));
    let requeued = &s.jobs[&2];
    assert_eq!(requeued.state, JobState::Pending);
    assert_eq!((requeued.allocation.as_ref(), requeued.start_time, requeued.requeues), (None, None, 1));
    assert!(s.active.contains(&2));
    // Its time so far is charged (2 nodes × 2 CPUs × 7 s).
    assert!(s.usage["root"].value >= 28.0, "{:?}", s.usage);

    // A late exit from the old allocation is ignored; the next start gets a newer token.
    let old_exit = Command::JobEnded {
        job_id: 2,
        token: 14,
        node: "n2".into(),
        outcome: RankOutcome::Cancelled { code: 0, signal: 9 },
        now: 9100,
    };
    assert_eq!(apply(&mut s, 17, old_exit), Response::Ignored);
    assert!(
        matches!(start_on_both(&mut s, 18, 2, 1), Response::PlanApplied { ref dropped, .. } if dropped[0].1.to_string().contains("down"))
    );
    // Down again changes nothing; an unknown node is refused by name.
    assert_eq!(apply(&mut s, 19, down("n1", 9200)), Response::Ignored);
    assert_eq!(apply(&mut s, 20, down("n9", 9300)), Response::Rejected(Rejection::UnknownNode { name: "n9".into() }));
    // The agent registering again brings the node back.
    apply(&mut s, 21, register("n1", 8, 4));
    assert_eq!(s.nodes["n1"].state(), quorum_model::NodeState::Idle);
    assert!(
        matches!(start_on_both(&mut s, 22, 2, 1), Response::PlanApplied { ref started, .. } if started == &vec![2])
    );
    assert_eq!(s.jobs[&2].alloc_index, 22);
}

#[test]
fn an_agent_that_lost_contact_ends_or_requeues_its_job() {
    let mut s = cluster();
    let mut requeue = spec(&["sleep", "1000"]);
    requeue.requeue = true;
    submit(&mut s, 10, requeue, "a");
    submit(&mut s, 11, spec(&["sleep", "1000"]), "b");
    let mut cancelled = spec(&["sleep", "1000"]);
    cancelled.requeue = true;
    submit(&mut s, 12, cancelled, "c");
    start(&mut s, 13, 1, "n1", 1, vec![]);
    start(&mut s, 14, 2, "n1", 1, vec![]);
    start(&mut s, 15, 3, "n2", 1, vec![]);
    apply(&mut s, 16, Command::CancelJob { job_id: 3, user: "alice".into(), now: 3000, whole_array: false });
    let lost = |job_id, token, node: &str| Command::JobEnded {
        job_id,
        token,
        node: node.into(),
        outcome: RankOutcome::LostContact,
        now: 4000,
    };
    assert_eq!(apply(&mut s, 17, lost(1, 13, "n1")), Response::Requeued { job_id: 1 });
    assert_eq!((s.jobs[&1].state, s.jobs[&1].requeues), (JobState::Pending, 1));
    assert_eq!(apply(&mut s, 18, lost(2, 14, "n1")), Response::JobFinished { job_id: 2, state: JobState::NodeFail });
    // A job whose cancel was asked for is not brought back.
    assert_eq!(apply(&mut s, 19, lost(3, 15, "n2")), Response::JobFinished { job_id: 3, state: JobState::Cancelled });
    assert_eq!(s.nodes["n1"].alloc_cpus + s.nodes["n2"].alloc_cpus, 0);
    // The node itself stays up: only the leader's silence rule takes nodes down.
    assert_eq!(s.nodes["n1"].state(), quorum_model::NodeState::Idle);
}

#[test]
fn the_cluster_level_is_the_lowest_recorded_voter_and_newer_commands_say_so() {
    let mut s = cluster();
    assert_eq!(s.cluster_level(), BASE_LEVEL, "nothing recorded yet: the base level");
    let v = |level| ReplicaVersion { level, version: "x".into() };
    let versions = BTreeMap::from([(1, v(FEATURE_LEVEL)), (2, v(1)), (3, v(FEATURE_LEVEL))]);
    assert_eq!(apply(&mut s, 10, Command::SetReplicaVersions { versions, now: 2 }), Response::Ok);
    assert_eq!(s.cluster_level(), 1);
    let versions = BTreeMap::from([(1, v(FEATURE_LEVEL)), (2, v(FEATURE_LEVEL))]);
    apply(&mut s, 11, Command::SetReplicaVersions { versions, now: 3 });
    assert_eq!(s.cluster_level(), FEATURE_LEVEL);

    let mut requeue = spec(&["true"]);
    requeue.requeue = true;
    let submit =
        |spec: JobSpec| Command::SubmitJob { spec: Box::new(spec), user: "u".into(), now: 4, request_id: "r".into() };
    assert_eq!(submit(spec(&["true"])).level().0, BASE_LEVEL);
    assert_eq!(submit(requeue).level(), (2, "a job with --requeue"));
    for (text, level) in
        [("afterok:3", BASE_LEVEL), ("after:3+1", 12), ("aftercorr:3", 12), ("afterok:3?afterok:4", 12)]
    {
        let d = quorum_model::parse_dependencies(text).unwrap();
        let mut s = spec(&["true"]);
        (s.dependencies, s.dependency_any) = (d.list, d.any);
        assert_eq!(submit(s).level().0, level, "{text}");
    }
    assert_eq!(Command::NodeDown { node: "n1".into(), reason: String::new(), now: 5 }.level().0, 2);
    assert_eq!(Command::Digest { now: 5 }.level().0, 2);
}

#[test]
fn drain_and_resume_are_all_or_nothing_and_leave_down_nodes_alone() {
    let mut s = cluster();
    let drain = |nodes: &[&str], reason: Option<&str>| Command::SetNodesDrained {
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        drain: reason.map(str::to_string),
        now: 5,
    };
    let r = apply(&mut s, 10, drain(&["n1", "n9"], Some("fan")));
    assert_eq!(r, Response::Rejected(Rejection::UnknownNode { name: "n9".into() }));
    assert!(s.nodes["n1"].schedulable(), "nothing changed");
    assert_eq!(apply(&mut s, 11, drain(&["n1"], Some("fan"))), Response::Ok);
    assert_eq!((s.nodes["n1"].state(), s.nodes["n1"].reason()), (quorum_model::NodeState::Drain, "fan"));
    assert!(!s.nodes["n1"].schedulable());
    apply(&mut s, 12, Command::NodeDown { node: "n2".into(), reason: "silent".into(), now: 6 });
    let r = apply(&mut s, 13, drain(&["n1", "n2"], None));
    assert!(matches!(r, Response::Rejected(Rejection::NodeIsDown { .. })), "{r:?}");
    assert!(!s.nodes["n1"].schedulable(), "nothing changed");
    assert_eq!(apply(&mut s, 14, drain(&["n1"], None)), Response::Ok);
    assert!(s.nodes["n1"].schedulable());
}

#[test]
fn warn_signals_parse_like_slurm_and_need_level_3() {
    use quorum_model::WarnSignal;
    let w = |signal, before_s, batch_only| WarnSignal { signal, before_s, batch_only };
    assert_eq!(WarnSignal::parse("USR1@5"), Ok(w(libc::SIGUSR1, 5, false)));
    assert_eq!(WarnSignal::parse("B:SIGTERM"), Ok(w(libc::SIGTERM, 60, true)));
    assert_eq!(WarnSignal::parse("R:10@90"), Ok(w(10, 90, false)));
    assert_eq!(WarnSignal::parse("B:USR2@30").unwrap().to_spec(), "B:12@30");
    assert!(WarnSignal::parse("X:USR1").unwrap_err().contains("'X:' is not a known prefix"));
    assert!(WarnSignal::parse("USR1@soon").unwrap_err().contains("'soon' is not a number of seconds"));
    assert!(WarnSignal::parse("NOPE@5").unwrap_err().contains("unknown signal 'NOPE'"));

    let mut warned = spec(&["true"]);
    warned.warn_signal = Some(w(libc::SIGUSR1, 5, false));
    let submit = Command::SubmitJob { spec: Box::new(warned), user: "u".into(), now: 4, request_id: "r".into() };
    assert_eq!(submit.level(), (3, "a job with --signal"));
    // A job without it encodes as before (the field is left out), so older replicas agree.
    let plain = serde_json::to_string(&spec(&["true"])).unwrap();
    assert!(!plain.contains("warn_signal"), "{plain}");
}

/// The tasks of an array share one spec in memory, also after a snapshot round trip, and the
/// encoding is the same as with a copy each.
#[test]
fn array_tasks_share_one_spec_also_after_a_snapshot() {
    let mut s = cluster();
    let mut a = spec(&["true"]);
    a.array = Some(quorum_model::ArraySpec::parse("0-2").unwrap());
    submit(&mut s, 10, a, "arr");
    assert!(Shared::same(&s.jobs[&1].spec, &s.jobs[&3].spec));
    let bytes = serde_json::to_vec(&s).unwrap();
    let mut back: ClusterState = serde_json::from_slice(&bytes).unwrap();
    assert!(!Shared::same(&back.jobs[&1].spec, &back.jobs[&3].spec), "decoding copies");
    back.share_array_specs();
    assert!(
        Shared::same(&back.jobs[&1].spec, &back.jobs[&2].spec)
            && Shared::same(&back.jobs[&1].spec, &back.jobs[&3].spec)
    );
    assert_eq!(serde_json::to_vec(&back).unwrap(), bytes);
    assert_eq!(crate::digest::digest(&back), crate::digest::digest(&s));
}

#[test]
fn submits_in_one_entry_apply_as_the_same_submits_one_by_one() {
    let mut unknown = spec(&["true"]);
    unknown.partition = Some("cpu".into());
    let mut held = spec(&["sleep", "1"]);
    held.hold = true;
    // a retry of r1 within the same entry, and a rejected submit between good ones
    let submits: Vec<(JobSpec, &str)> =
        vec![(spec(&["true"]), "r1"), (unknown, "r2"), (spec(&["true"]), "r1"), (held, "r3")];

    let mut one_by_one = cluster();
    let singles: Vec<Response> = submits
        .iter()
        .map(|(sp, rid)| {
            apply(
                &mut one_by_one,
                10,
                Command::SubmitJob {
                    spec: Box::new(sp.clone()),
                    user: "alice".into(),
                    now: 1010,
                    request_id: (*rid).into(),
                },
            )
        })
        .collect();

    let mut batched = cluster();
    let command = Command::SubmitJobs {
        submits: submits
            .iter()
            .map(|(sp, rid)| Submit { spec: Box::new(sp.clone()), user: "alice".into(), request_id: (*rid).into() })
            .collect(),
        now: 1010,
    };
    assert_eq!(command.level().0, 5);
    assert!(command.wakes_scheduler(), "two of the jobs are not held");
    let answer = apply(&mut batched, 10, command);
    assert_eq!(answer, Response::SubmittedMany(singles.clone()));
    assert_eq!(singles[0], Response::Submitted { job_id: 1, duplicate: false });
    assert!(matches!(singles[1], Response::Rejected(_)));
    assert_eq!(singles[2], Response::Submitted { job_id: 1, duplicate: true });
    assert_eq!(singles[3], Response::Submitted { job_id: 2, duplicate: false });
    assert_eq!(crate::digest(&batched), crate::digest(&one_by_one));
    assert_eq!(batched.jobs.len(), 2);

    let all_held = Command::SubmitJobs {
        submits: vec![Submit {
            spec: Box::new((*batched.jobs[&2].spec).clone()),
            user: "a".into(),
            request_id: "h".into(),
        }],
        now: 1011,
    };
    assert!(!all_held.wakes_scheduler());
}

#[test]
fn a_batch_of_agent_reports_applies_like_the_same_commands_one_by_one() {
    // Two running jobs; then a node registers, both jobs end (one report a duplicate, one from
    // an old allocation) and a node is drained for its health, in one entry or in five.
    let mut base = cluster();
    for (i, id) in [(10, 1), (11, 2)] {
        assert!(matches!(submit(&mut base, i, spec(&["true"]), &format!("r{id}")), Response::Submitted { .. }));
    }
    start(&mut base, 12, 1, "n1", 1, vec![]);
    start(&mut base, 13, 2, "n2", 1, vec![0]);
    let ended = |job_id, token, node: &str, code| Command::JobEnded {
        job_id,
        token,
        node: node.into(),
        outcome: RankOutcome::Exited { code, signal: 0 },
        now: 3000,
    };
    let reports = vec![
        register("n3", 4, 0),
        ended(1, 12, "n1", 0),
        ended(1, 12, "n1", 0),
        ended(2, 99, "n2", 1),
        ended(2, 13, "n2", 1),
        Command::SetNodeHealth { node: "n2".into(), problem: Some("GPU 0 failure: XID 79".into()), now: 3001 },
    ];

    let mut one_by_one = base.clone();
    let singles: Vec<Response> = reports.iter().map(|c| apply(&mut one_by_one, 20, c.clone())).collect();
    let mut batched = base.clone();
    let batch = Command::Batch { commands: reports };
    assert_eq!(batch.level().0, BATCH_LEVEL);
    assert!(batch.wakes_scheduler());
    assert_eq!(apply(&mut batched, 20, batch), Response::Batch(singles.clone()));
    assert_eq!(singles[1], Response::JobFinished { job_id: 1, state: JobState::Completed });
    assert_eq!(singles[2], Response::Ignored, "a re-sent report is applied once");
    assert_eq!(singles[3], Response::Ignored, "a report from an older allocation changes nothing");
    assert_eq!(singles[4], Response::JobFinished { job_id: 2, state: JobState::Failed });
    assert_eq!(batched, one_by_one);
    assert_eq!(crate::digest(&batched), crate::digest(&one_by_one));
    assert!(batched.nodes.contains_key("n3"));

    // A batch needs the highest level among its commands, and never less than its own.
    let oom = Command::JobEnded {
        job_id: 1,
        token: 12,
        node: "n1".into(),
        outcome: RankOutcome::OutOfMemory { code: 137, signal: 9 },
        now: 3000,
    };
    assert_eq!(oom.level().0, 4);
    assert_eq!(Command::Batch { commands: vec![oom] }.level().0, BATCH_LEVEL);
    let held = Command::Batch { commands: vec![Command::Digest { now: 1 }] };
    assert!(!held.wakes_scheduler());
}

#[test]
fn a_compressed_snapshot_writes_each_environment_once_and_restores_the_state_and_its_sharing() {
    let mut s = cluster();
    s.replica_versions = (1..=3).map(|id| (id, ReplicaVersion { level: FEATURE_LEVEL, version: "t".into() })).collect();
    let shell = |who: &str| quorum_model::Env::new((0..40).map(|i| (format!("VAR_{i}"), format!("/home/{who}/{i}"))));
    // Two shells' jobs interleaved, as concurrent submitters' are, and one without environment.
    for i in 0..200u64 {
        let mut spec = spec(&["true"]);
        spec.env = if i == 7 { Default::default() } else { shell(if i % 2 == 0 { "alice" } else { "bob" }) };
        spec.hold = true;
        assert!(matches!(submit(&mut s, 10 + i, spec, &format!("r{i}")), Response::Submitted { .. }));
    }
    let bytes = snapshot::encode(&s).unwrap();
    assert!(bytes.starts_with(snapshot::LZ4_MAGIC));
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut lz4_flex::frame::FrameDecoder::new(&bytes[snapshot::LZ4_MAGIC.len()..]),
        &mut text,
    )
    .unwrap();
    assert_eq!(text.matches("/home/alice/39").count(), 1, "each environment once");
    assert_eq!(text.matches("/home/bob/39").count(), 1);

    let back = snapshot::decode(&bytes).unwrap();
    assert_eq!(back, s);
    assert_eq!(digest(&back), digest(&s));
    let env_of = |id: u64| back.jobs[&id].spec.env.clone();
    assert!(env_of(1).same(&env_of(3)) && !env_of(1).same(&env_of(2)), "jobs of one shell share it again");
    assert!(env_of(8).is_empty());
}

#[test]
fn roles_given_at_run_time_are_replicated_state_and_user_takes_them_back() {
    let mut s = cluster();
    let empty = crate::digest(&s);
    let set = |s: &mut ClusterState, user: &str, role: Role| {
        apply(s, 10, Command::SetRole { user: user.into(), role, now: 1 })
    };
    assert_eq!(set(&mut s, "alice", Role::Operator), Response::Ok);
    assert_eq!(s.roles.get("alice"), Some(&Role::Operator));
    assert_ne!(crate::digest(&s), empty);
    assert!(matches!(set(&mut s, "", Role::Admin), Response::Rejected(Rejection::InvalidConfig { .. })));
    assert_eq!(set(&mut s, "alice", Role::User), Response::Ok);
    assert!(s.roles.is_empty());
    // No roles given: the state serializes as before roles existed (older replicas' digests).
    assert!(!serde_json::to_string(&s).unwrap().contains("roles"));
    assert_eq!(Command::SetRole { user: "a".into(), role: Role::Admin, now: 1 }.level().0, 8);
}

/// A batch step job ends with its first node; a step is recorded where `layout` puts it, holds
/// its CPUs until it ends, and ends with its job; an interactive allocation ends as its
/// command did.
#[test]
fn steps_are_recorded_hold_their_cpus_and_end_with_their_job() {
    use quorum_model::step::{Placement, StepRequest, StepState};
    let mut s = cluster();
    let mut sp = spec(&["true"]);
    (sp.nodes, sp.ntasks, sp.batch_step) = (2, 2, true);
    submit(&mut s, 10, sp.clone(), "a");
    assert_eq!(
        Command::SubmitJob { spec: Box::new(sp.clone()), user: "alice".into(), now: 0, request_id: String::new() }
            .level()
            .0,
        9
    );
    assert!(matches!(start_on_both(&mut s, 11, 1, 1), Response::PlanApplied { .. }));
    let token = s.jobs[&1].alloc_index;
    let step = |s: &mut ClusterState, index: u64, user: &str, ntasks: u32| {
        let request = StepRequest { name: "hostname".into(), ntasks, ..Default::default() };
        apply(s, index, Command::StartStep { job_id: 1, user: user.into(), request, now: 3000, expect: None })
    };
    match step(&mut s, 12, "alice", 0) {
        Response::StepStarted { step, .. } => {
            assert_eq!((step.id, step.ntasks, step.node_names()), (0, 2, vec!["n1", "n2"]));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(step(&mut s, 13, "alice", 0), Response::Rejected(Rejection::StepBusy { .. })),
        "its CPUs are held"
    );
    assert!(matches!(step(&mut s, 14, "alice", 9), Response::Rejected(Rejection::StepNeverFits { .. })));
    assert!(matches!(step(&mut s, 15, "mallory", 1), Response::Rejected(Rejection::NotOwner { .. })));
    let end = Command::EndStep {
        job_id: 1,
        step_id: 0,
        exit_code: 3,
        signal: None,
        cancelled: false,
        now: 4000,
        usage: None,
    };
    assert_eq!(apply(&mut s, 16, end), Response::Ok);
    assert_eq!((s.jobs[&1].steps[0].state, s.jobs[&1].steps[0].exit_code), (StepState::Failed, Some(3)));
    // A step the leader launched where apply would put it is recorded so; one it launched
    // elsewhere (the state moved meanwhile) is refused, and its id is never given again.
    let one = StepRequest { name: "x".into(), ntasks: 1, ..Default::default() };
    let planned = crate::plan_step(&s.jobs[&1], "alice", &one).unwrap();
    assert_eq!((planned.id, planned.node_names()), (1, vec!["n1"]));
    let mut elsewhere = Placement { id: planned.id, nodes: planned.nodes.clone() };
    elsewhere.nodes[0].node = "n2".into();
    let early = |expect: Placement| Command::StartStep {
        job_id: 1,
        user: "alice".into(),
        request: one.clone(),
        now: 4500,
        expect: Some(expect),
    };
    assert_eq!(early(elsewhere.clone()).level().0, crate::EARLY_STEP_LEVEL);
    assert!(matches!(apply(&mut s, 17, early(elsewhere)), Response::Rejected(Rejection::StepBusy { .. })));
    assert_eq!(s.jobs[&1].next_step, 2, "the refused launch's id is spent");
    assert!(matches!(
        apply(&mut s, 18, early(Placement { id: 1, nodes: planned.nodes.clone() })),
        Response::Rejected(Rejection::StepBusy { .. })
    ));
    match apply(&mut s, 19, early(Placement { id: 2, nodes: planned.nodes.clone() })) {
        Response::StepStarted { step, .. } => assert_eq!((step.id, step.nodes, step.start), (2, planned.nodes, 4500)),
        other => panic!("{other:?}"),
    }
    // What a step used is its own, and adds to what the job's steps used (level 16).
    let used = JobUsage { cpu_user_us: 2_000_000, cpu_system_us: 100, max_rss_kb: 5000, ..Default::default() };
    let end = Command::EndStep {
        job_id: 1,
        step_id: 2,
        exit_code: 0,
        signal: None,
        cancelled: false,
        now: 4600,
        usage: Some(used),
    };
    assert_eq!(end.level().0, crate::STEP_USAGE_LEVEL);
    assert_eq!(apply(&mut s, 20, end), Response::Ok);
    let job = &s.jobs[&1];
    assert_eq!((job.steps.last().unwrap().usage, job.step_usage, job.usage), (Some(used), Some(used), None));
    // Cyclic (level 31): recorded so, the tasks numbered round-robin over the step's nodes.
    let cyclic = StepRequest { name: "x".into(), ntasks: 2, overlap: true, cyclic: true, ..Default::default() };
    let command = Command::StartStep { job_id: 1, user: "alice".into(), request: cyclic, now: 4700, expect: None };
    assert_eq!(command.level().0, crate::CYCLIC_LEVEL);
    match apply(&mut s, 21, command) {
        Response::StepStarted { step, .. } => {
            assert!(step.cyclic);
            assert_eq!(step.ranks(), vec![vec![0], vec![1]]);
        }
        other => panic!("{other:?}"),
    }
    let end = Command::EndStep {
        job_id: 1,
        step_id: 3,
        exit_code: 0,
        signal: None,
        cancelled: false,
        now: 4800,
        usage: None,
    };
    assert_eq!(apply(&mut s, 22, end), Response::Ok);
    assert!(matches!(step(&mut s, 27, "alice", 0), Response::StepStarted { .. }), "ended steps hold nothing");
    // The second node's end (its holder killed) decides nothing; the first node's does.
    let ended = |node: &str, code: i32| Command::JobEnded {
        job_id: 1,
        token,
        node: node.into(),
        outcome: RankOutcome::Exited { code, signal: 0 },
        now: 5000,
    };
    assert_eq!(apply(&mut s, 28, ended("n2", 0)), Response::Ok);
    assert_eq!(s.jobs[&1].state, JobState::Running);
    assert!(matches!(apply(&mut s, 29, ended("n1", 0)), Response::JobFinished { state: JobState::Completed, .. }));
    assert_eq!(s.jobs[&1].steps.last().unwrap().state, StepState::Cancelled, "a step still running ends with its job");
    assert!(matches!(step(&mut s, 30, "alice", 1), Response::Rejected(Rejection::NotRunning { .. })));

    // salloc: ended by its owner as its command ended.
    let mut alloc = spec(&["bash"]);
    alloc.interactive = true;
    submit(&mut s, 21, alloc, "b");
    assert!(matches!(start(&mut s, 32, 2, "n1", 1, vec![]), Response::PlanApplied { .. }));
    let end = |user: &str| Command::EndAllocation { job_id: 2, user: user.into(), exit_code: 4, now: 6000 };
    assert!(matches!(apply(&mut s, 33, end("mallory")), Response::Rejected(Rejection::NotOwner { .. })));
    assert!(matches!(apply(&mut s, 34, end("alice")), Response::JobFinished { state: JobState::Failed, .. }));
    assert_eq!(s.jobs[&2].exit_code, Some(4));
    assert!(
        matches!(
            apply(&mut s, 35, Command::EndAllocation { job_id: 1, user: "alice".into(), exit_code: 0, now: 7000 }),
            Response::Rejected(_)
        ),
        "a batch job is cancelled, not ended so"
    );
}

/// The state at the cluster's current feature level (every replica of this release).
fn at_feature_level(s: &mut ClusterState, index: u64) {
    let versions = BTreeMap::from([(1, ReplicaVersion { level: FEATURE_LEVEL, version: "x".into() })]);
    apply(s, index, Command::SetReplicaVersions { versions, now: 2 });
}

#[test]
fn a_job_is_admitted_only_if_enough_nodes_have_its_features_and_are_not_excluded_or_unlisted() {
    let mut s = cluster();
    let mut featured = spec(&["true"]);
    featured.constraint = vec!["ib".into()];
    // Below level 11 only resources count: a replica of an older release admits it.
    assert!(matches!(submit(&mut s, 4, featured.clone(), "old"), Response::Submitted { .. }));
    at_feature_level(&mut s, 5);
    let never = |r: Response| match r {
        Response::Rejected(Rejection::NeverFits { detail }) => detail,
        other => panic!("expected NeverFits, got {other:?}"),
    };
    let detail = never(submit(&mut s, 10, featured, "a"));
    assert_eq!(detail, "0 of the 2 nodes of partition 'gpu' have the features ib, fewer than the 1 requested");
    let mut both = spec(&["true"]);
    (both.nodes, both.ntasks, both.exclude) = (2, 2, vec!["n1".into()]);
    let detail = never(submit(&mut s, 11, both.clone(), "b"));
    assert!(detail.contains("1 of the 2 nodes of partition 'gpu' are not excluded (n1)"), "{detail}");
    both.exclude.clear();
    assert!(matches!(submit(&mut s, 12, both, "c"), Response::Submitted { .. }));
    let mut listed = spec(&["true"]);
    listed.nodelist = vec!["n3".into()];
    assert!(matches!(
        submit(&mut s, 13, listed.clone(), "d"),
        Response::Rejected(Rejection::InvalidSpec { field, reason }) if field == "nodelist" && reason.contains("'n3' is not in partition 'gpu'")
    ));
    listed.nodelist = vec!["n1".into(), "n2".into()];
    assert!(matches!(
        submit(&mut s, 14, listed.clone(), "e"),
        Response::Rejected(Rejection::InvalidSpec { field, .. }) if field == "nodelist"
    ));
    (listed.nodes, listed.ntasks) = (2, 2);
    assert!(matches!(submit(&mut s, 15, listed.clone(), "f"), Response::Submitted { .. }));
    // A list naming some of the job's nodes: those and others (from level 13).
    listed.nodelist = vec!["n2".into()];
    assert!(matches!(submit(&mut s, 151, listed.clone(), "f2"), Response::Submitted { .. }));
    let mut older = cluster();
    let versions = BTreeMap::from([(1, ReplicaVersion { level: NODE_LIST_PART_LEVEL - 1, version: "x".into() })]);
    apply(&mut older, 2, Command::SetReplicaVersions { versions, now: 2 });
    assert!(matches!(
        submit(&mut older, 3, listed, "f3"),
        Response::Rejected(Rejection::InvalidSpec { field, reason }) if field == "nodelist" && reason.contains("until every replica runs feature level 13")
    ));
    // Features joined by '|': a node with any one of them counts.
    let mut any = spec(&["true"]);
    (any.constraint, any.constraint_any) = (vec!["ib".into(), "opa".into()], true);
    let detail = never(submit(&mut s, 16, any, "g"));
    assert_eq!(detail, "0 of the 2 nodes of partition 'gpu' have the features ib|opa, fewer than the 1 requested");
    // Licenses: only those the cluster has, and no more of them than it has.
    let mut licensed = spec(&["true"]);
    licensed.licenses = [("matlab".to_string(), 3)].into();
    let refused = |r: Response| match r {
        Response::Rejected(Rejection::InvalidSpec { field, reason }) if field == "licenses" => reason,
        other => panic!("expected a licenses refusal, got {other:?}"),
    };
    assert_eq!(
        refused(submit(&mut s, 17, licensed.clone(), "h")),
        "this cluster has no licenses; 'matlab' is none of them"
    );
    let licenses = [("matlab".to_string(), 2), ("fluent".to_string(), 9)].into();
    assert_eq!(Command::SetLicenses { licenses: BTreeMap::new(), now: 5 }.level().0, 12);
    apply(&mut s, 18, Command::SetLicenses { licenses, now: 5 });
    assert_eq!(refused(submit(&mut s, 19, licensed.clone(), "i")), "3 of license 'matlab', of which the cluster has 2");
    licensed.licenses = [("abaqus".to_string(), 1)].into();
    assert_eq!(
        refused(submit(&mut s, 20, licensed.clone(), "j")),
        "this cluster has no license 'abaqus' (it has fluent, matlab)"
    );
    licensed.licenses = [("matlab".to_string(), 2)].into();
    assert!(matches!(submit(&mut s, 21, licensed, "k"), Response::Submitted { .. }));
}

#[test]
fn a_requeued_job_goes_back_to_the_queue_and_frees_its_node_once_its_agent_says_it_ended() {
    let mut s = cluster();
    at_feature_level(&mut s, 4);
    submit(&mut s, 10, spec(&["sleep", "100"]), "a");
    start(&mut s, 11, 1, "n1", 1, vec![]);
    let requeue = |user: &str| Command::RequeueJob { job_id: 1, user: user.into(), now: 3000 };
    assert!(matches!(apply(&mut s, 12, requeue("bob")), Response::Rejected(Rejection::NotOwner { .. })));
    assert_eq!(apply(&mut s, 13, requeue("alice")), Response::Requeued { job_id: 1 });
    let job = &s.jobs[&1];
    assert_eq!((job.state, job.requeues, job.allocation.is_none()), (JobState::Pending, 1, true));
    // Its CPU is held until the agent, told to kill it, reports its end there.
    assert_eq!((s.nodes["n1"].alloc_cpus, s.nodes["n1"].jobs.len(), s.nodes["n1"].completing.len()), (1, 0, 1));
    let killed = RankOutcome::Cancelled { code: 0, signal: 9 };
    let ended = Command::JobEnded { job_id: 1, token: 11, node: "n1".into(), outcome: killed, now: 3050 };
    assert_eq!(apply(&mut s, 13, ended), Response::Ignored);
    assert_eq!((s.nodes["n1"].alloc_cpus, s.nodes["n1"].jobs.len(), s.nodes["n1"].completing.len()), (0, 0, 0));
    // A pending job stays queued; root may requeue anyone's.
    assert_eq!(apply(&mut s, 14, requeue("root")), Response::Requeued { job_id: 1 });
    assert_eq!(s.jobs[&1].requeues, 1);
    apply(&mut s, 15, Command::CancelJob { job_id: 1, user: "alice".into(), now: 3100, whole_array: false });
    assert!(matches!(apply(&mut s, 16, requeue("alice")), Response::Rejected(Rejection::JobFinished { .. })));
    assert_eq!(requeue("alice").level().0, REQUEUE_LEVEL);
}

/// Ends `job_id` (running on n1 under `token`) with `code` at `now`.
fn end_at(s: &mut ClusterState, index: u64, job_id: JobId, token: u64, code: i32, now: Millis) -> Response {
    let ended = RankOutcome::Exited { code, signal: 0 };
    apply(s, index, Command::JobEnded { job_id, token, node: "n1".into(), outcome: ended, now })
}

fn purge(s: &mut ClusterState, index: u64, jobs: Vec<JobId>, min_age: Millis, now: Millis) -> Vec<JobId> {
    match apply(s, index, Command::PurgeJobs { jobs, min_age, now }) {
        Response::Purged { jobs } => jobs.iter().map(|j| j.id).collect(),
        other => panic!("expected Purged, got {other:?}"),
    }
}

#[test]
fn ended_jobs_leave_the_hot_state_after_their_age_and_leave_a_tombstone() {
    let mut s = cluster();
    submit(&mut s, 10, spec(&["true"]), "done");
    submit(&mut s, 11, spec(&["sleep", "1000"]), "running");
    submit(&mut s, 12, spec(&["true"]), "pending");
    start(&mut s, 13, 1, "n1", 1, vec![]);
    start(&mut s, 14, 2, "n1", 1, vec![]);
    end_at(&mut s, 15, 1, 13, 0, 10_000);
    // Too young at 10 s + 4 s; neither running nor pending jobs ever leave.
    assert!(purge(&mut s, 16, vec![1, 2, 3, 99], 5_000, 14_000).is_empty());
    assert!(s.jobs.contains_key(&1));
    assert_eq!(purge(&mut s, 17, vec![1, 2, 3, 99], 5_000, 15_000), vec![1]);
    assert!(!s.jobs.contains_key(&1) && s.jobs.contains_key(&2) && s.jobs.contains_key(&3));
    let t = &s.departed[&1];
    assert_eq!((t.state, t.end_time, t.left_at), (JobState::Completed, Some(10_000), 15_000));
    // A retried submit still gets its job back; the id is not taken again.
    assert_eq!(submit(&mut s, 18, spec(&["true"]), "done"), Response::Submitted { job_id: 1, duplicate: true });
    assert_eq!(submit(&mut s, 19, spec(&["true"]), "new"), Response::Submitted { job_id: 4, duplicate: false });
    // A dependency on it is still admitted.
    let mut dep = spec(&["true"]);
    dep.dependencies = quorum_model::parse_dependencies("afterok:1").unwrap().list;
    assert!(matches!(submit(&mut s, 20, dep.clone(), "dep"), Response::Submitted { job_id: 5, .. }));
    // Once min_age has passed since it left, the tombstone goes unless a pending job depends on
    // it; job 5 does, so it stays until job 5 is gone.
    purge(&mut s, 21, vec![], 5_000, 21_000);
    assert!(s.departed.contains_key(&1), "job 5 depends on it");
    apply(&mut s, 22, Command::CancelJob { job_id: 5, user: "alice".into(), now: 22_000, whole_array: false });
    purge(&mut s, 23, vec![], 5_000, 23_000);
    assert!(!s.departed.contains_key(&1));
    assert!(!s.request_ids.contains_key("done"), "its request id went with it");
    // Nothing names job 1 any more: a dependency on it is refused at submit (the leader recalls
    // it from the job history first).
    assert!(matches!(submit(&mut s, 24, dep, "dep2"), Response::Rejected(_)));
    // Recalled, it is known again, as it ended.
    let recalled = crate::tombstone::Departed {
        state: JobState::Failed,
        start_time: Some(9_000),
        end_time: Some(10_000),
        array: None,
        request_id: String::new(),
        left_at: 0,
    };
    let jobs = vec![(1, recalled.clone()), (999, recalled)];
    apply(&mut s, 25, Command::RecallJobs { jobs, now: 25_000 });
    assert_eq!(s.departed[&1].state, JobState::Failed);
    assert_eq!(s.departed[&1].left_at, 25_000, "kept for min_job_age from its recall");
    assert!(!s.departed.contains_key(&999), "an id never given is not recalled");
}

#[test]
fn an_array_leaves_the_hot_state_only_once_every_task_has_ended() {
    let mut s = cluster();
    let mut a = spec(&["true"]);
    a.array = Some(quorum_model::ArraySpec::parse("0-2").unwrap());
    submit(&mut s, 10, a, "array");
    start(&mut s, 11, 1, "n1", 1, vec![]);
    start(&mut s, 12, 2, "n1", 1, vec![]);
    end_at(&mut s, 13, 1, 11, 0, 10_000);
    end_at(&mut s, 14, 2, 12, 0, 10_000);
    assert!(purge(&mut s, 15, vec![1, 2], 1_000, 20_000).is_empty(), "task 2 is still pending");
    apply(&mut s, 16, Command::CancelJob { job_id: 3, user: "alice".into(), now: 20_000, whole_array: false });
    assert_eq!(purge(&mut s, 17, vec![1, 2, 3], 1_000, 21_000), vec![1, 2, 3]);
    assert!(s.jobs.is_empty());
    assert_eq!(s.departed.len(), 3);
    assert_eq!(
        s.outcomes(1..=3).map(|(id, o)| (id, o.state)).collect::<Vec<_>>(),
        vec![(1, JobState::Completed), (2, JobState::Completed), (3, JobState::Cancelled)]
    );
}

#[test]
fn outcomes_merge_the_hot_state_and_the_tombstones_in_id_order() {
    let mut s = cluster();
    for (i, r) in ["a", "b", "c", "d"].iter().enumerate() {
        submit(&mut s, 10 + i as u64, spec(&["true"]), r);
    }
    for (i, id) in [1, 3].into_iter().enumerate() {
        start(&mut s, 20 + i as u64 * 2, id, "n1", 1, vec![]);
        end_at(&mut s, 21 + i as u64 * 2, id, 20 + i as u64 * 2, 0, 5_000);
    }
    assert_eq!(purge(&mut s, 30, vec![1, 3], 1_000, 6_000), vec![1, 3]);
    let ids: Vec<JobId> = s.outcomes(1..=4).map(|(id, _)| id).collect();
    assert_eq!(ids, vec![1, 2, 3, 4]);
    assert_eq!(s.outcome(3).map(|o| o.state), Some(JobState::Completed));
    assert_eq!(s.outcome(2).map(|o| o.state), Some(JobState::Pending));
    assert_eq!(s.outcome(5), None);
    // The tombstones travel in snapshots and count in the digest.
    let bytes = crate::snapshot::encode(&s).unwrap();
    assert_eq!(crate::snapshot::decode(&bytes).unwrap(), s);
    let mut other = s.clone();
    other.departed.clear();
    assert_ne!(digest(&s), digest(&other));
}

#[test]
fn what_a_job_used_is_counted_once_per_node_and_only_for_its_allocation() {
    let mut s = cluster();
    let mut two = spec(&["true"]);
    (two.nodes, two.ntasks) = (2, 2);
    submit(&mut s, 10, two, "u");
    let both = PlannedStart {
        job_id: 1,
        allocation: Allocation {
            nodes: ["n1", "n2"]
                .iter()
                .map(|n| quorum_model::NodeAllocation {
                    node: (*n).into(),
                    cpus: 1,
                    mem_mb: 1024,
                    gpus: vec![],
                    het_group: 0,
                })
                .collect(),
            cpu_ways: None,
        },
    };
    apply(
        &mut s,
        11,
        Command::ApplyPlan {
            base_index: 10,
            now: 2000,
            starts: vec![both],
            reasons: vec![],
            preemptions: vec![],
            resumes: vec![],
            shown: vec![],
        },
    );
    let used = |node: &str, token, cpu, rss| Command::JobUsed {
        job_id: 1,
        token,
        node: node.into(),
        usage: JobUsage { cpu_user_us: cpu, cpu_system_us: 10, max_rss_kb: rss, ..Default::default() },
    };
    assert_eq!(apply(&mut s, 12, used("n1", 5, 100, 700)), Response::Ignored, "another allocation's");
    assert_eq!(apply(&mut s, 13, used("n3", 11, 100, 700)), Response::Ignored, "a node the job is not on");
    assert_eq!(apply(&mut s, 14, used("n1", 11, 100, 700)), Response::Ok);
    end_at(&mut s, 15, 1, 11, 0, 3000);
    assert_eq!(apply(&mut s, 16, used("n1", 11, 100, 700)), Response::Ignored, "n1's end is recorded: sent again");
    apply(&mut s, 17, used("n2", 11, 50, 900));
    assert_eq!(
        s.jobs[&1].usage,
        Some(JobUsage { cpu_user_us: 150, cpu_system_us: 20, max_rss_kb: 900, ..Default::default() })
    );
}

fn update(s: &mut ClusterState, index: u64, user: &str, words: &[&str]) -> Response {
    let update = quorum_model::update::JobUpdate::from_words(words.iter().copied()).unwrap();
    apply(s, index, Command::UpdateJob { job_id: 1, user: user.into(), update, now: 3000 + index })
}

fn refusal(r: Response) -> String {
    match r {
        Response::Rejected(r) => r.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_pending_job_changes_where_and_how_it_runs_as_its_submit_was_checked() {
    let mut s = cluster();
    let mut parts =
        vec![crate::testing::partition("gpu", "n[1-2]", true), crate::testing::partition("short", "n1", false)];
    parts[1].max_time_s = Some(3600);
    apply(&mut s, 4, Command::SetPartitions { partitions: parts, now: 5 });
    submit(&mut s, 10, spec(&["true"]), "a");
    assert_eq!(s.jobs[&1].spec.time_limit_s, Some(86_400));
    // The owner may not move it where its limit does not fit, nor leave anything changed.
    assert_eq!(
        refusal(update(&mut s, 11, "alice", &["Partition=short", "JobName=renamed"])),
        "time limit 1-00:00:00 exceeds partition 'short' limit of 1:00:00"
    );
    assert_eq!((s.jobs[&1].partition.as_str(), s.jobs[&1].spec.name.as_str()), ("gpu", "t"));
    let r = update(&mut s, 12, "alice", &["TimeLimit=30", "Partition=short", "Nice=100", "Comment=moved", "JobName=x"]);
    assert_eq!(r, Response::Updated { job_id: 1 });
    let job = &s.jobs[&1];
    assert_eq!((job.partition.as_str(), job.spec.partition.as_deref()), ("short", Some("short")));
    assert_eq!((job.spec.time_limit_s, job.spec.nice), (Some(1800), 100));
    assert_eq!((job.spec.notes.comment.as_str(), job.spec.name.as_str()), ("moved", "x"));
    // Raising the limit, a negative nice, a partition that does not exist: refused, by name.
    assert!(refusal(update(&mut s, 13, "alice", &["TimeLimit=+10"])).contains("only an operator may raise"));
    assert!(refusal(update(&mut s, 14, "alice", &["Nice=-5"])).contains("only an operator may set a negative nice"));
    assert!(refusal(update(&mut s, 15, "alice", &["Partition=cpu"])).contains("unknown partition 'cpu'"));
    assert!(
        refusal(update(&mut s, 16, "alice", &["NumNodes=3", "Partition=gpu"])).contains("fewer than the 3 requested")
    );
    assert!(refusal(update(&mut s, 17, "alice", &["Dependency=afterok:99"])).contains("job 99 does not exist"));
    assert!(refusal(update(&mut s, 18, "alice", &["Dependency=afterok:1"])).contains("cannot wait for itself"));
    assert!(matches!(update(&mut s, 19, "bob", &["Nice=1"]), Response::Rejected(Rejection::NotOwner { .. })));
    // An operator may raise it past the partition's limit, and lower the nice.
    assert_eq!(update(&mut s, 20, "root", &["TimeLimit=2:00:00", "Nice=-5"]), Response::Updated { job_id: 1 });
    assert_eq!((s.jobs[&1].spec.time_limit_s, s.jobs[&1].spec.nice), (Some(7200), -5));
    assert_eq!(update(&mut s, 21, "alice", &["Partition=gpu", "NumNodes=2"]), Response::Updated { job_id: 1 });
    assert_eq!((s.jobs[&1].spec.nodes, s.jobs[&1].spec.ntasks, s.jobs[&1].partition.as_str()), (2, 2, "gpu"));
    assert_eq!(
        Command::UpdateJob { job_id: 1, user: "a".into(), update: Default::default(), now: 1 }.level().0,
        UPDATE_LEVEL
    );
}

/// A partition of the nodes a group bought admits its accounts only (`AllowAccounts`), another
/// keeps a QOS out (`DenyQos`): a submit or an update that would break either is refused naming
/// the rule, and an open partition admits everyone. Such rules need level 22.
#[test]
fn a_partition_admits_only_the_accounts_and_qos_it_names() {
    let mut s = cluster();
    at_feature_level(&mut s, 4);
    let mut parts =
        vec![crate::testing::partition("gpu", "n[1-2]", true), crate::testing::partition("lab", "n1", false)];
    parts[1].access.allow_accounts = vec!["lab".into(), "ops".into()];
    parts[0].access.deny_qos = vec!["scavenger".into()];
    let set = Command::SetPartitions { partitions: parts, now: 5 };
    assert_eq!(set.level().0, PARTITION_ACCESS_LEVEL);
    apply(&mut s, 5, set);
    let job = |account: &str, partition: &str, qos: Option<&str>| {
        let mut j = spec(&["true"]);
        (j.account, j.partition, j.qos) = (Some(account.into()), Some(partition.into()), qos.map(str::to_string));
        j
    };
    assert_eq!(
        refusal(submit(&mut s, 10, job("physics", "lab", None), "a")),
        "invalid account or account/partition combination specified: partition 'lab' does not admit account 'physics' (AllowAccounts=lab,ops)"
    );
    assert_eq!(
        refusal(submit(&mut s, 11, job("physics", "gpu", Some("scavenger")), "b")),
        "invalid qos specification: partition 'gpu' does not admit QOS 'scavenger' (DenyQos=scavenger)"
    );
    assert!(crate::check_submit(&s, job("physics", "lab", None), "alice").is_err(), "--test-only says so too");
    assert!(s.jobs.is_empty(), "nothing of a refused submit is kept");
    assert!(matches!(submit(&mut s, 12, job("physics", "gpu", None), "c"), Response::Submitted { job_id: 1, .. }));
    assert!(matches!(submit(&mut s, 13, job("ops", "lab", None), "d"), Response::Submitted { job_id: 2, .. }));
    // Job 1 may not move into the owners' partition, and stays where it was.
    assert!(refusal(update(&mut s, 14, "alice", &["Partition=lab"])).contains("does not admit account 'physics'"));
    assert_eq!(s.jobs[&1].partition, "gpu");
    assert_eq!(update(&mut s, 15, "alice", &["Partition=lab", "Account=lab"]), Response::Updated { job_id: 1 });
    assert_eq!((s.jobs[&1].partition.as_str(), s.jobs[&1].account.as_str()), ("lab", "lab"));
    assert_eq!(Command::SetPartitions { partitions: vec![], now: 6 }.level().0, 1, "open partitions need nothing new");
}

#[test]
fn a_running_job_changes_only_its_limit_name_and_comment_and_an_ended_one_nothing() {
    let mut s = cluster();
    submit(&mut s, 10, spec(&["sleep", "100"]), "a");
    start(&mut s, 11, 1, "n1", 1, vec![]);
    assert_eq!(
        refusal(update(&mut s, 12, "alice", &["TimeLimit=10", "Partition=gpu"])),
        "job 1 is RUNNING: its partition can change only while it is pending"
    );
    assert_eq!(s.jobs[&1].spec.time_limit_s, Some(86_400));
    assert_eq!(update(&mut s, 13, "alice", &["TimeLimit=-23:00:00", "Comment=c"]), Response::Updated { job_id: 1 });
    assert_eq!(s.jobs[&1].spec.time_limit_s, Some(3600));
    assert!(refusal(update(&mut s, 14, "alice", &["TimeLimit=2:00:00"])).contains("job 1: 1:00:00 to 2:00:00"));
    assert_eq!(update(&mut s, 15, "root", &["TimeLimit=UNLIMITED"]), Response::Updated { job_id: 1 });
    assert_eq!(s.jobs[&1].spec.time_limit_s, None);
    end_at(&mut s, 16, 1, 11, 0, 10_000);
    assert!(refusal(update(&mut s, 17, "root", &["Comment=late"])).contains("has already finished (COMPLETED)"));
}

#[test]
fn an_operator_suspends_and_resumes_a_running_job_whose_limit_waits_meanwhile() {
    let mut s = cluster();
    submit(&mut s, 10, spec(&["sleep", "100"]), "a");
    start(&mut s, 11, 1, "n1", 2, vec![]);
    let at = |user: &str, resume: bool, now: u64| Command::SuspendJob { job_id: 1, user: user.into(), resume, now };
    assert!(refusal(apply(&mut s, 12, at("alice", false, 3000))).contains("only an operator may suspend a job (job 1)"));
    assert_eq!(apply(&mut s, 13, at("root", false, 3000)), Response::Suspended { job_id: 1, resumed: false });
    assert_eq!((s.jobs[&1].state, s.nodes["n1"].alloc_cpus), (JobState::Suspended, 2), "it keeps its allocation");
    assert!(!s.jobs[&1].state.is_finished());
    // Suspended from 3 s to 63 s: its limit, counted from its start, is a minute longer.
    assert_eq!(apply(&mut s, 14, at("root", true, 63_000)), Response::Suspended { job_id: 1, resumed: true });
    let job = &s.jobs[&1];
    assert_eq!((job.state, job.suspended_ms, job.limit_from_start_s()), (JobState::Running, 60_000, Some(86_460)));
    assert!(
        matches!(apply(&mut s, 15, at("root", true, 64_000)), Response::Suspended { .. }),
        "resuming twice is no error"
    );
    // Suspended again, it can be cancelled; it ends when its agent reports.
    apply(&mut s, 16, at("root", false, 70_000));
    apply(&mut s, 17, Command::CancelJob { job_id: 1, user: "alice".into(), now: 71_000, whole_array: false });
    assert!(s.jobs[&1].cancel_requested);
    assert!(refusal(apply(&mut s, 18, at("root", true, 72_000))).contains("has already finished (CANCELLED)"));
    let ended = RankOutcome::Cancelled { code: 0, signal: 15 };
    apply(&mut s, 19, Command::JobEnded { job_id: 1, token: 11, node: "n1".into(), outcome: ended, now: 80_000 });
    let job = &s.jobs[&1];
    assert_eq!((job.state, job.suspended_ms, s.nodes["n1"].alloc_cpus), (JobState::Cancelled, 60_000 + 10_000, 0));
    assert!(matches!(apply(&mut s, 20, at("root", false, 81_000)), Response::Rejected(Rejection::JobFinished { .. })));
    // Only time running is charged: 2 CPUs for (80 - 2 - 70) s.
    let usage = s.usage[DEFAULT_ACCOUNT].value;
    assert!((usage - 2.0 * 8.0).abs() < 1e-6, "{usage}");
}

/// A cron entry fires once per firing it waits for: the same firing proposed again (a leader
/// failover) submits nothing; a firing whose job is refused records why and moves on; only its
/// owner or an operator removes it.
#[test]
fn cron_entries_fire_once_per_firing_and_record_what_they_did() {
    use quorum_model::cron::CronEntry;
    let mut s = cluster();
    let entry = |spec: JobSpec, user: &str| CronEntry {
        id: 0,
        user: user.into(),
        schedule: "*/10 * * * * *".into(),
        zone: "UTC".into(),
        spec,
        next_ms: 10_000,
        added_ms: 0,
        fired: 0,
        last_fired_ms: None,
        last_job: None,
        last_error: None,
    };
    let add = |s: &mut ClusterState, e: CronEntry| apply(s, 1, Command::AddCron { entry: Box::new(e), now: 1_000 });
    assert_eq!(add(&mut s, entry(spec(&["true"]), "alice")), Response::CronAdded { id: 1 });
    // A job that could never be submitted is refused with the entry.
    let mut bad = spec(&["true"]);
    bad.partition = Some("nowhere".into());
    assert!(matches!(add(&mut s, entry(bad, "alice")), Response::Rejected(Rejection::UnknownPartition { .. })));
    let fire =
        |s: &mut ClusterState, due_ms, next_ms, now| apply(s, 2, Command::FireCron { id: 1, due_ms, next_ms, now });
    let job = match fire(&mut s, 10_000, 20_000, 10_050) {
        Response::CronFired { id: 1, job: Some(job), error: None } => job,
        other => panic!("{other:?}"),
    };
    let j = &s.jobs[&job];
    assert_eq!(
        (j.user.as_str(), j.spec.env.get("QUORUM_CRON_TIME"), j.spec.env.get("QUORUM_CRON_ID")),
        ("alice", Some("10"), Some("1"))
    );
    // Proposed again by the next leader: nothing more.
    assert_eq!(fire(&mut s, 10_000, 20_000, 10_400), Response::Ignored);
    assert_eq!(s.jobs.len(), 1);
    let e = &s.cron[&1];
    assert_eq!((e.next_ms, e.fired, e.last_job), (20_000, 1, Some(job)));
    // Its partition gone, a firing submits nothing and says why; the entry goes on.
    s.partitions.clear();
    assert!(matches!(fire(&mut s, 20_000, 30_000, 20_010), Response::CronFired { job: None, error: Some(_), .. }));
    assert_eq!((s.cron[&1].next_ms, s.cron[&1].fired), (30_000, 2));
    assert!(s.cron[&1].last_error.as_deref().is_some_and(|e| e.contains("partition")));
    let remove =
        |s: &mut ClusterState, user: &str| apply(s, 3, Command::RemoveCron { id: 1, user: user.into(), now: 30_000 });
    assert!(matches!(remove(&mut s, "bob"), Response::Rejected(Rejection::Cron { id: 1, .. })));
    assert_eq!(remove(&mut s, "alice"), Response::Ok);
    assert_eq!(fire(&mut s, 30_000, 40_000, 30_010), Response::Ignored);
}

/// A node's prolog failed: the job goes back to the queue whole (every node it held freed,
/// counted as a restart), even without `--requeue`; a late report of the same failure, or one
/// for an allocation since replaced, changes nothing; a job being cancelled ends CANCELLED.
#[test]
fn a_failed_prolog_requeues_the_job_and_frees_its_nodes() {
    let mut s = cluster();
    let mut wide = spec(&["sleep", "1000"]);
    (wide.nodes, wide.ntasks, wide.gpus_per_node) = (2, 2, 1);
    assert!(matches!(submit(&mut s, 10, wide.clone(), "a"), Response::Submitted { job_id: 1, .. }));
    start_on_both(&mut s, 11, 1, 2);
    let token = s.jobs[&1].alloc_index;
    let failed = |node: &str, token| Command::JobEnded {
        job_id: 1,
        token,
        node: node.into(),
        outcome: RankOutcome::PrologFailed,
        now: 2100,
    };
    assert_eq!(failed("n1", token).level().0, crate::PROLOG_LEVEL);
    assert_eq!(apply(&mut s, 12, failed("n1", token)), Response::Requeued { job_id: 1 });
    let job = &s.jobs[&1];
    assert_eq!((job.state, job.requeues, job.allocation.is_none()), (JobState::Pending, 1, true));
    assert!(s.nodes.values().all(|n| n.alloc_cpus == 0 && n.alloc_gpus.is_empty()), "both nodes freed");
    assert_eq!(apply(&mut s, 13, failed("n2", token)), Response::Ignored, "the same failure from the other node");
    // Started again; a prolog failure while it is being cancelled ends it CANCELLED.
    start_on_both(&mut s, 14, 1, 2);
    let token = s.jobs[&1].alloc_index;
    let cancel = Command::CancelJob { job_id: 1, user: "alice".into(), now: 2200, whole_array: false };
    apply(&mut s, 15, cancel);
    assert_eq!(apply(&mut s, 16, failed("n2", token)), Response::JobFinished { job_id: 1, state: JobState::Cancelled });
}

/// Everything that makes a preempted job suspended rather than stopped needs level 23, even
/// where another rule of a lower level fits the same command: the partitions, policy and QOS
/// that name the mode, and the plans that suspend or resume.
#[test]
fn suspending_preempted_jobs_needs_level_23() {
    use quorum_model::preempt::{PlannedPreemption, PreemptMode, Victim};
    let mut parts = vec![crate::testing::partition("scav", "n1", true)];
    parts[0].access.deny_qos = vec!["x".into()];
    assert_eq!(Command::SetPartitions { partitions: parts.clone(), now: 1 }.level().0, PARTITION_ACCESS_LEVEL);
    parts[0].preempt_mode = Some(PreemptMode::Suspend);
    assert_eq!(Command::SetPartitions { partitions: parts, now: 1 }.level().0, PREEMPT_SUSPEND_LEVEL);
    let policy = Policy { preempt_mode: PreemptMode::Suspend, ..Policy::default() };
    assert_eq!(Command::SetPolicy { policy, now: 1 }.level().0, PREEMPT_SUSPEND_LEVEL);
    let qos = Qos { name: "low".into(), preempt_mode: Some(PreemptMode::Suspend), ..Default::default() };
    assert_eq!(Command::UpsertQos { qos: qos.clone(), now: 1 }.level().0, PREEMPT_SUSPEND_LEVEL);
    assert_eq!(Command::SeedAccounts { accounts: vec![], qos: vec![qos], now: 1 }.level().0, PREEMPT_SUSPEND_LEVEL);
    let plan = |mode| {
        let victims = vec![Victim { job_id: 1, mode, grace_s: 0 }];
        let preemptions = vec![PlannedPreemption { job_id: 2, nodes: vec!["n1".into()], victims }];
        Command::apply_plan(1, 1, vec![], vec![], preemptions, vec![]).unwrap()
    };
    assert_eq!(plan(PreemptMode::Requeue).level().0, PREEMPTION_LEVEL);
    assert_eq!(plan(PreemptMode::Suspend).level().0, PREEMPT_SUSPEND_LEVEL);
    assert_eq!(Command::apply_plan(1, 1, vec![], vec![], vec![], vec![7]).unwrap().level().0, PREEMPT_SUSPEND_LEVEL);
}

/// TRES weights in the policy need level 36 (an older replica would drop them and hold another
/// policy); a policy without them needs no more than before.
#[test]
fn tres_weights_need_level_36() {
    let weights = quorum_model::TresWeights { gpu: 3000, ..Default::default() };
    let policy = Policy { tres_weights: weights, ..Policy::default() };
    assert_eq!(Command::SetPolicy { policy, now: 1 }.level().0, crate::TRES_WEIGHTS_LEVEL);
    assert_eq!(Command::SetPolicy { policy: Policy::default(), now: 1 }.level().0, crate::BASE_LEVEL);
}

/// A FLEX reservation needs level 23: an older replica would hold its jobs to it.
#[test]
fn a_flex_reservation_needs_level_23() {
    use quorum_model::reservation::{ResvFlags, ResvRequest};
    let with = |flags: &str| ResvRequest {
        name: "r".into(),
        flags: Some(ResvFlags::parse(flags).unwrap()),
        ..ResvRequest::default()
    };
    let create = |flags: &str| Command::CreateReservation { request: with(flags), user: "root".into(), now: 1 };
    assert_eq!(create("MAINT").level().0, RESERVATION_LEVEL);
    assert_eq!(create("FLEX").level().0, FLEX_RESERVATION_LEVEL);
    let update = Command::UpdateReservation { request: with("FLEX,DAILY"), user: "root".into(), now: 1 };
    assert_eq!(update.level().0, FLEX_RESERVATION_LEVEL);
}

/// CPUs shared among jobs (`OverSubscribe`) need level 24, and apply holds every node to the
/// no-overcommit rule restated for them: the sum of each job's CPUs divided by the ways it
/// shares them stays within the node's CPUs; memory and GPUs are never shared.
#[test]
fn shared_cpus_count_a_part_of_a_cpu_each_and_need_level_24() {
    use quorum_model::oversubscribe::OverSubscribe;
    let started = |r: Response| match r {
        Response::PlanApplied { started, .. } => started,
        other => panic!("{other:?}"),
    };
    let mut forced = crate::testing::partition("shared", "n[1-2]", false);
    forced.oversubscribe = OverSubscribe::Force(2);
    let open = crate::testing::partition("gpu", "n[1-2]", true);
    let set = Command::SetPartitions { partitions: vec![open.clone(), forced.clone()], now: 1 };
    assert_eq!(set.level().0, OVERSUBSCRIBE_LEVEL);
    assert!(Command::SetPartitions { partitions: vec![open], now: 1 }.level().0 < OVERSUBSCRIBE_LEVEL);
    let mut asking = spec(&["true"]);
    asking.oversubscribe = true;
    assert_eq!(spec_level(&asking).0, OVERSUBSCRIBE_LEVEL);

    let mut s = cluster();
    apply(&mut s, 4, set);
    let mut shared = spec(&["true"]);
    shared.partition = Some("shared".into());
    shared.cpus_per_task = 4;
    shared.mem_per_node_mb = Some(10 * 1024);
    for (i, id) in (10..15).zip(1..=5) {
        assert_eq!(
            submit(&mut s, i, shared.clone(), &format!("s{id}")),
            Response::Submitted { job_id: id, duplicate: false }
        );
    }
    let mut whole = spec(&["true"]);
    whole.cpus_per_task = 1;
    submit(&mut s, 15, whole, "w");
    // Four jobs of 4 CPUs shared two ways fill n1's 8 CPUs; the fifth, and a job that does
    // not share, find no room.
    for (i, id) in (20..24).zip(1..=4) {
        assert_eq!(started(start(&mut s, i, id, "n1", 4, vec![])), vec![id]);
        assert_eq!(s.jobs[&id].allocation.as_ref().unwrap().cpu_ways, Some(2));
    }
    assert_eq!((s.nodes["n1"].alloc_cpus, s.nodes["n1"].shared_cpus.clone()), (0, BTreeMap::from([(2, 16)])));
    assert_eq!(s.nodes["n1"].cpus_in_use(), 8);
    assert_eq!(s.nodes["n1"].state(), NodeState::Allocated);
    for (i, id) in [(24, 5), (25, 6)] {
        match start(&mut s, i, id, "n1", if id == 5 { 4 } else { 1 }, vec![]) {
            Response::PlanApplied { started, dropped, .. } => {
                assert!(started.is_empty());
                assert_eq!(dropped, vec![(id, DropReason::NodeFull { node: "n1".into() })]);
            }
            other => panic!("{other:?}"),
        }
    }
    // One shared job ends: two CPUs' worth is free again, and the job that does not share
    // takes one of them.
    let ended = Command::JobEnded {
        job_id: 1,
        token: 20,
        node: "n1".into(),
        outcome: RankOutcome::Exited { code: 0, signal: 0 },
        now: 3000,
    };
    apply(&mut s, 26, ended);
    assert_eq!(started(start(&mut s, 27, 6, "n1", 1, vec![])), vec![6]);
    assert_eq!((s.nodes["n1"].alloc_cpus, s.nodes["n1"].cpus_in_use()), (1, 7));
    assert_eq!(s.jobs[&6].allocation.as_ref().unwrap().cpu_ways, None);
    // Memory is never shared: n2 has 64 GiB; jobs of 40 GiB do not share it.
    shared.mem_per_node_mb = Some(40 * 1024);
    shared.cpus_per_task = 1;
    submit(&mut s, 28, shared.clone(), "m1");
    submit(&mut s, 29, shared, "m2");
    assert_eq!(started(start(&mut s, 30, 7, "n2", 1, vec![])), vec![7]);
    assert!(started(start(&mut s, 31, 8, "n2", 1, vec![])).is_empty());
}

#[test]
fn partitions_and_nodes_change_at_run_time_and_the_configuration_seeds_partitions_once() {
    use crate::testing::partition;
    let mut s = cluster();
    at_feature_level(&mut s, 4);
    // The configuration seeds once; a second seed (another leader's file) changes nothing.
    let seed = |parts| Command::SeedPartitions { partitions: parts, now: 5 };
    assert_eq!(seed(vec![]).level().0, LIVE_CONFIG_LEVEL);
    assert_eq!(apply(&mut s, 5, seed(vec![partition("gpu", "n[1-2]", true)])), Response::Ok);
    assert!(s.partitions_seeded);
    assert_eq!(apply(&mut s, 6, seed(vec![partition("other", "n1", true)])), Response::Ignored);
    assert_eq!(s.partitions.keys().collect::<Vec<_>>(), ["gpu"]);
    // Create: a name taken is refused; the new default takes over from the old one.
    let mut live = partition("live", "n2", true);
    let put = |p: &quorum_model::Partition, previous: Option<quorum_model::Partition>| Command::PutPartition {
        partition: p.clone(),
        previous,
        now: 7,
    };
    assert!(matches!(
        apply(&mut s, 7, put(&live, Some(live.clone()))),
        Response::Rejected(Rejection::Partition { .. })
    ));
    assert_eq!(apply(&mut s, 8, put(&live, None)), Response::Ok);
    assert!(matches!(apply(&mut s, 9, put(&live, None)), Response::Rejected(Rejection::Partition { .. })));
    assert_eq!(s.default_partition().map(|p| p.name.as_str()), Some("live"));
    assert!(!s.partitions["gpu"].default);
    // A change made from what the partition no longer is, is refused (two changes at once).
    let stale = live.clone();
    live.state = PartitionState::Drain;
    assert_eq!(apply(&mut s, 10, put(&live, Some(stale.clone()))), Response::Ok);
    let r = apply(&mut s, 11, put(&partition("live", "n1", false), Some(stale)));
    assert!(
        matches!(&r, Response::Rejected(Rejection::Partition { reason, .. }) if reason.contains("meanwhile")),
        "{r:?}"
    );
    // DRAIN takes no new job; DOWN takes them, and the scheduler holds them back.
    let mut sp = spec(&["true"]);
    sp.partition = Some("live".into());
    let r = submit(&mut s, 12, sp.clone(), "drained");
    assert!(matches!(r, Response::Rejected(Rejection::PartitionClosed { .. })), "{r:?}");
    let was = live.clone();
    live.state = PartitionState::Down;
    assert_eq!(apply(&mut s, 13, put(&live, Some(was))), Response::Ok);
    let Response::Submitted { job_id, .. } = submit(&mut s, 14, sp, "down") else {
        panic!("a DOWN partition takes jobs")
    };
    // A partition a pending job is in is not deleted; one none is in is.
    let delete = |name: &str| Command::DeletePartition { name: name.into(), now: 15 };
    let r = apply(&mut s, 15, delete("live"));
    assert!(
        matches!(&r, Response::Rejected(Rejection::Partition { reason, .. }) if reason.contains("in use")),
        "{r:?}"
    );
    apply(&mut s, 16, Command::CancelJob { job_id, user: "alice".into(), now: 16, whole_array: false });
    assert_eq!(apply(&mut s, 17, delete("live")), Response::Ok);
    assert!(matches!(apply(&mut s, 18, delete("live")), Response::Rejected(Rejection::Partition { .. })));
    // Nodes: weight and features stay over what the agent reports when it registers again;
    // an operator's DOWN stays DOWN until resumed.
    let update = |nodes: &[&str], update: NodeUpdate| Command::UpdateNodes {
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        update,
        now: 19,
    };
    let weigh = NodeUpdate { weight: Some(5), features: Some(vec!["fast".into()]), down: None };
    assert!(matches!(
        apply(&mut s, 19, update(&["n1", "nx"], weigh.clone())),
        Response::Rejected(Rejection::UnknownNode { .. })
    ));
    assert_eq!(s.nodes["n1"].weight, 1, "all or nothing");
    assert_eq!(apply(&mut s, 20, update(&["n1"], weigh)), Response::Ok);
    apply(&mut s, 21, register("n1", 8, 4));
    assert_eq!((s.nodes["n1"].weight, s.nodes["n1"].features.clone()), (5, vec!["fast".to_string()]));
    let down = NodeUpdate { down: Some("bad fan".into()), ..Default::default() };
    assert!(matches!(apply(&mut s, 22, update(&["n2"], down)), Response::NodeDowned { .. }));
    apply(&mut s, 23, register("n2", 8, 4));
    assert_eq!(s.nodes["n2"].state(), NodeState::Down, "an operator's DOWN outlasts the agent's return");
    assert_eq!(s.nodes["n2"].reason(), "bad fan");
    let resume = Command::SetNodesDrained { nodes: vec!["n2".into()], drain: None, now: 24 };
    assert_eq!(apply(&mut s, 24, resume), Response::Ok);
    assert_eq!(s.nodes["n2"].state(), NodeState::Idle);
    // Every replica agrees on all of it: a snapshot reproduces it.
    let copy: ClusterState = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
    assert_eq!(digest(&copy), digest(&s));
}
