use super::*;
use crate::state::tests::{cluster, spec};
use crate::state::{apply, Command};

fn submit(s: &mut crate::state::ClusterState, cpus: u32, gpus: u32, nodes: u32) {
    let mut sp = spec(&["true"]);
    sp.cpus_per_task = cpus;
    sp.gpus_per_node = gpus;
    sp.nodes = nodes;
    sp.ntasks = nodes;
    let index = 100 + s.jobs.len() as u64;
    apply(
        s,
        index,
        Command::SubmitJob { spec: Box::new(sp), user: "u".into(), now: index, request_id: format!("r{index}") },
    );
}

#[test]
fn first_fit_in_submit_order_with_reasons() {
    let mut s = cluster(); // two nodes of 8 CPUs and 4 GPUs
    submit(&mut s, 6, 2, 1); // 1 -> n1
    submit(&mut s, 6, 2, 1); // 2 -> n2
    submit(&mut s, 4, 0, 1); // 3: no node has 4 CPUs left -> Resources
    submit(&mut s, 2, 2, 2); // 4: 2 CPUs + 2 GPUs on both nodes -> starts
    submit(&mut s, 4, 0, 1); // 5: behind 3 -> Priority
    let view = ClusterView::from_state(&s);
    let plan = schedule(&view, 0, &Policy::default());
    let started: Vec<_> = plan.starts.iter().map(|p| p.job_id).collect();
    assert_eq!(started, vec![1, 2, 4]);
    assert_eq!(plan.reasons[&3], PendingReason::Resources);
    assert_eq!(plan.reasons[&5], PendingReason::Priority);
    let four = &plan.starts[2].allocation;
    assert_eq!(four.nodelist(), "n[1-2]");
    assert_eq!(four.nodes[0].gpus, vec![2, 3], "GPUs 0 and 1 went to job 1");
    // The plan applies cleanly, and nothing is overcommitted.
    let r = apply(
        &mut s,
        500,
        Command::ApplyPlan {
            base_index: 499,
            now: 1,
            starts: plan.starts.clone(),
            reasons: plan.reasons.into_iter().collect(),
        },
    );
    assert_eq!(r, crate::state::Response::PlanApplied { started: vec![1, 2, 4], dropped: vec![] });
    for n in s.nodes.values() {
        assert!(n.alloc_cpus <= n.cpus && n.alloc_gpus.len() <= n.gpus.len());
    }
    // Same input, same plan.
    let view = ClusterView::from_state(&s);
    assert_eq!(schedule(&view, 0, &Policy::default()), schedule(&view, 0, &Policy::default()));
}

#[test]
fn best_fit_prefers_the_fuller_node() {
    let mut s = cluster();
    submit(&mut s, 4, 0, 1);
    let plan = schedule(&ClusterView::from_state(&s), 0, &Policy::default());
    apply(&mut s, 500, Command::ApplyPlan { base_index: 0, now: 1, starts: plan.starts, reasons: vec![] });
    submit(&mut s, 2, 0, 1);
    let plan = schedule(&ClusterView::from_state(&s), 0, &Policy::default());
    assert_eq!(plan.starts[0].allocation.nodes[0].node, "n1", "n1 is half full; the job fits it best");
}
