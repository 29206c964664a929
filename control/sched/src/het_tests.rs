//! Heterogeneous jobs through the real state machine and scheduler: components allocated all
//! together or not at all, on nodes no two share, and reserved as one under backfill.

use super::tests::{fifo, node, started, Bench};
use super::*;
use quorum_model::het::HetComponent;
use quorum_model::{JobSpec, JobState};
use quorum_state::Command;
use quorum_state::Response;

/// A launcher of one 2-CPU node with feature `cpu`, and two workers of one GPU each.
fn launcher_and_workers(s: &mut JobSpec) {
    (s.cpus_per_task, s.constraint, s.batch_step) = (2, vec!["cpu".into()], true);
    s.het.push(HetComponent { nodes: 2, ntasks: 2, cpus_per_task: 1, gpus_per_node: 1, ..Default::default() });
}

/// n1 has 4 CPUs and feature `cpu`; n2 and n3 have 2 CPUs and a GPU each. A job holds n3's GPU
/// until t=50: the heterogeneous job's launcher could start on n1 now, its workers not, so
/// nothing of it starts; it is reserved from t=50 on all three nodes, jobs that end before
/// then backfill around it, one that would delay it waits, and at t=50 it starts whole.
#[test]
fn a_heterogeneous_job_starts_whole_or_not_at_all_and_is_reserved_as_one() {
    let nodes = vec![node("n1", 4, 0, "", &["cpu"]), node("n2", 2, 1, "a100", &[]), node("n3", 2, 1, "a100", &[])];
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 1));
    b.at(0);
    let gpu = b.submit_with("alice", |s| {
        (s.gpus_per_node, s.nodelist, s.time_limit_s) = (1, vec!["n3".into()], Some(50));
    });
    assert_eq!(started(&b.cycle()), vec![gpu]);
    let het = b.submit_with("alice", launcher_and_workers);
    // Its components have the ids after its own.
    assert_eq!(b.state.next_job_id, het + 2);
    let short = b.submit_with("bob", |s| (s.cpus_per_task, s.time_limit_s) = (2, Some(30)));
    let delaying =
        b.submit_with("bob", |s| (s.nodelist, s.cpus_per_task, s.time_limit_s) = (vec!["n1".into()], 4, Some(200)));
    let p = b.cycle();
    assert_eq!(started(&p), vec![short], "the short job backfills; the one that would delay the reservation waits");
    assert_eq!(b.state.jobs[&het].state, JobState::Pending);
    assert_eq!(b.state.jobs[&delaying].state, JobState::Pending);
    let e = &p.estimates[&het];
    assert_eq!((e.start_ms - 1_000_000_000) / 1000, 50);
    let mut reserved = e.nodes.clone();
    reserved.sort();
    assert_eq!(reserved, vec!["n1", "n2", "n3"]);
    // Nothing of it is held while it waits.
    assert_eq!(b.state.nodes["n2"].alloc_gpus.len(), 0);

    b.at(50);
    b.end(gpu);
    b.end(short);
    let p = b.cycle();
    assert_eq!(started(&p), vec![het]);
    let a = b.state.jobs[&het].allocation.clone().unwrap();
    let group = |k| a.group(k).map(|n| (n.node.clone(), n.cpus, n.gpus.len())).collect::<Vec<_>>();
    assert_eq!(group(0), vec![("n1".to_string(), 2, 0)], "the launcher on the node with `cpu`, first");
    let mut workers = group(1);
    workers.sort();
    assert_eq!(workers, vec![("n2".to_string(), 1, 1), ("n3".to_string(), 1, 1)]);
    assert_eq!(a.nodes[0].node, "n1", "component 0 first: its first node runs the script");
    assert_eq!(b.state.nodes["n1"].alloc_cpus, 2);

    b.at(60);
    b.end(het);
    assert_eq!(b.state.jobs[&het].state, JobState::Completed);
    for n in ["n1", "n2", "n3"] {
        assert_eq!((b.state.nodes[n].alloc_cpus, b.state.nodes[n].alloc_gpus.len()), (0, 0), "{n} freed");
    }
    assert_eq!(started(&b.cycle()), vec![delaying]);
}

/// No node holds two components, even where one could hold both: two 1-CPU components take two
/// nodes, and a cluster of one node refuses the job at submit, naming why.
#[test]
fn no_node_holds_two_components() {
    let two = |s: &mut JobSpec| {
        s.batch_step = true;
        s.het.push(HetComponent { nodes: 1, ntasks: 1, cpus_per_task: 1, ..Default::default() });
    };
    let mut b = Bench::new(vec![node("n1", 8, 0, "", &[]), node("n2", 8, 0, "", &[])], fifo(BackfillMode::Easy, 1));
    b.at(0);
    let het = b.submit_with("alice", two);
    assert_eq!(started(&b.cycle()), vec![het]);
    let a = b.state.jobs[&het].allocation.clone().unwrap();
    assert_eq!(a.nodes.iter().map(|n| (n.node.as_str(), n.het_group)).collect::<Vec<_>>(), vec![("n1", 0), ("n2", 1)]);

    let mut one = Bench::new(vec![node("n1", 8, 0, "", &[])], fifo(BackfillMode::Easy, 1));
    let mut spec = JobSpec {
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        program: quorum_model::Program::Argv(vec!["true".into()]),
        ..Default::default()
    };
    two(&mut spec);
    let r =
        one.cmd(Command::SubmitJob { spec: Box::new(spec), user: "alice".into(), now: 0, request_id: String::new() });
    let Response::Rejected(why) = r else { panic!("expected a refusal, got {r:?}") };
    assert!(why.to_string().contains("no node holds two"), "{why}");
}

/// A component that can never fit is refused at submit, naming the component.
#[test]
fn a_component_that_never_fits_is_named() {
    let mut b = Bench::new(vec![node("n1", 8, 0, "", &[]), node("n2", 8, 0, "", &[])], fifo(BackfillMode::Easy, 1));
    let mut spec = JobSpec {
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        batch_step: true,
        program: quorum_model::Program::Argv(vec!["true".into()]),
        ..Default::default()
    };
    spec.het.push(HetComponent { nodes: 1, ntasks: 1, cpus_per_task: 16, ..Default::default() });
    let r = b.cmd(Command::SubmitJob { spec: Box::new(spec), user: "alice".into(), now: 0, request_id: String::new() });
    let Response::Rejected(why) = r else { panic!("expected a refusal, got {r:?}") };
    assert!(why.to_string().contains("component 1: partition 'batch' has no node with 16 CPUs"), "{why}");
}

/// Apply re-checks a plan for a heterogeneous job against each component's request (a plan
/// that puts a component on too few nodes, or too small ones, is dropped), and a step of the job
/// runs on the nodes of the components it names, component 0's when it names none.
#[test]
fn apply_checks_each_component_and_steps_run_on_the_components_they_name() {
    let nodes = vec![node("n1", 4, 0, "", &["cpu"]), node("n2", 2, 1, "a100", &[]), node("n3", 2, 1, "a100", &[])];
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 1));
    b.at(0);
    let het = b.submit_with("alice", launcher_and_workers);
    let view = ClusterView::from_state(&b.state);
    let plan = schedule(&view, b.now_ms, &b.state.policy.clone());
    assert_eq!(started(&plan), vec![het]);
    let good = plan.starts[0].clone();
    let apply_start = |b: &mut Bench, start: PlannedStart| {
        let now = b.now_ms;
        let base_index = 0;
        match b.cmd(Command::ApplyPlan {
            base_index,
            now,
            starts: vec![start],
            reasons: Vec::new(),
            preemptions: Vec::new(),
            resumes: Vec::new(),
            shown: Vec::new(),
        }) {
            Response::PlanApplied { dropped, .. } => dropped,
            other => panic!("{other:?}"),
        }
    };
    // Component 1 on one node only, then a worker node that lacks the worker's GPU.
    let mut short = good.clone();
    short.allocation.nodes.retain(|n| n.node != "n3");
    assert_eq!(apply_start(&mut b, short).len(), 1);
    let mut small = good.clone();
    small.allocation.nodes.iter_mut().filter(|n| n.het_group == 1).for_each(|n| n.gpus.clear());
    assert_eq!(apply_start(&mut b, small).len(), 1);
    assert_eq!(b.state.jobs[&het].state, JobState::Pending);
    assert!(apply_start(&mut b, good).is_empty());
    assert_eq!(b.state.jobs[&het].state, JobState::Running);

    let job = b.state.jobs[&het].clone();
    let step = |groups: Vec<u32>, ntasks| {
        let request = quorum_model::step::StepRequest { ntasks, het_groups: groups, ..Default::default() };
        quorum_state::plan_step(&job, "alice", &request)
    };
    let names = |s: quorum_model::step::Step| s.nodes.iter().map(|n| n.node.clone()).collect::<Vec<_>>();
    assert_eq!(names(step(vec![], 1).unwrap()), vec!["n1"]);
    let mut workers = names(step(vec![1], 2).unwrap());
    workers.sort();
    assert_eq!(workers, vec!["n2", "n3"]);
    assert_eq!(names(step(vec![0, 1], 3).unwrap()).len(), 3);
    // Component 0 holds one 2-CPU task: three tasks there can never fit; there is no component 2.
    assert!(step(vec![0], 3).is_err());
    let e = step(vec![2], 1).unwrap_err().to_string();
    assert!(e.contains("--het-group 2") && e.contains("2 component"), "{e}");
}

/// Components in partitions of their own (feature level 30): each runs on its partition's
/// nodes whatever their order, waits while that partition is full (the job starting whole
/// when it frees), and a component whose partition the cluster lacks is refused at submit.
#[test]
fn components_run_on_their_own_partitions_nodes() {
    let nodes = vec![node("n1", 2, 0, "", &[]), node("n2", 2, 0, "", &[]), node("n3", 2, 0, "", &[])];
    let mut b = Bench::new(nodes, fifo(BackfillMode::Easy, 1));
    let versions =
        BTreeMap::from([(1, quorum_state::ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "x".into() })]);
    b.cmd(Command::SetReplicaVersions { versions, now: 0 });
    let mut all = b.state.partitions["batch"].clone();
    let only = |name: &str, members: &[&str]| {
        let mut p = quorum_state::testing::partition(name, "x", false);
        p.node_names = members.iter().map(|n| n.to_string()).collect();
        p.nodes = members.join(",");
        p
    };
    all.default = true;
    b.cmd(Command::SetPartitions { partitions: vec![all, only("small", &["n1"]), only("big", &["n2", "n3"])], now: 0 });
    b.at(0);
    // A job that fills small's one node until t=40.
    let filler = b.submit_with("bob", |s| {
        (s.partition, s.cpus_per_task, s.time_limit_s) = (Some("small".into()), 2, Some(40));
    });
    assert_eq!(started(&b.cycle()), vec![filler]);
    // Component 0 in big, component 1 in small: small is full, so nothing of it starts.
    let het = b.submit_with("alice", |s| {
        (s.partition, s.batch_step, s.time_limit_s) = (Some("big".into()), true, Some(100));
        s.het.push(HetComponent {
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 1,
            partition: Some("small".into()),
            ..Default::default()
        });
    });
    let spec = &b.state.jobs[&het].spec;
    assert_eq!((spec.partition_of(0), spec.partition_of(1)), (Some("big"), Some("small")));
    let p = b.cycle();
    assert!(started(&p).is_empty(), "component 1's partition is full: {p:?}");
    assert_eq!((p.estimates[&het].start_ms - 1_000_000_000) / 1000, 40, "reserved for when small frees");
    b.at(40);
    b.end(filler);
    assert_eq!(started(&b.cycle()), vec![het]);
    let a = b.state.jobs[&het].allocation.clone().unwrap();
    let placed: Vec<(&str, u32)> = a.nodes.iter().map(|n| (n.node.as_str(), n.het_group)).collect();
    assert_eq!(placed, vec![("n2", 0), ("n1", 1)], "each component on its partition's nodes");

    // A component in the job's own partition names none of its own.
    let same = b.submit_with("alice", |s| {
        (s.partition, s.batch_step) = (Some("big".into()), true);
        s.het.push(HetComponent {
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 1,
            partition: Some("big".into()),
            ..Default::default()
        });
    });
    assert_eq!(b.state.jobs[&same].spec.het[0].partition, None);

    let mut spec = JobSpec {
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        batch_step: true,
        program: quorum_model::Program::Argv(vec!["true".into()]),
        ..Default::default()
    };
    spec.het.push(HetComponent {
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        partition: Some("nosuch".into()),
        ..Default::default()
    });
    let r = b.cmd(Command::SubmitJob { spec: Box::new(spec), user: "alice".into(), now: 0, request_id: String::new() });
    let Response::Rejected(why) = r else { panic!("expected a refusal, got {r:?}") };
    assert!(why.to_string().contains("nosuch"), "{why}");
}

/// `--overcommit` (feature level 30): a job of 8 tasks holds one task's CPUs on its node.
#[test]
fn an_overcommitted_job_holds_one_tasks_cpus_per_node() {
    let mut b = Bench::new(vec![node("n1", 2, 0, "", &[])], fifo(BackfillMode::Easy, 1));
    let versions =
        BTreeMap::from([(1, quorum_state::ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "x".into() })]);
    b.cmd(Command::SetReplicaVersions { versions, now: 0 });
    b.at(0);
    let job = b.submit_with("alice", |s| (s.ntasks, s.overcommit) = (8, true));
    assert_eq!(started(&b.cycle()), vec![job]);
    assert_eq!(b.state.nodes["n1"].alloc_cpus, 1);
    assert_eq!(b.state.jobs[&job].spec.ntasks, 8);
}
