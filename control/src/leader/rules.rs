//! What the leader makes of what an agent says, as plain functions of the applied state: a
//! registration (propose it or not), a heartbeat (drain or resume the node for its health,
//! return it to service after DOWN) and an exit report (the `JobEnded` to propose). The agent
//! stream (`server::agents`) carries the messages and proposes what these return.

use quorum_proto::agent::{GpuHealth, GpuState};

use crate::model::{Millis, NodeAdminState, RankOutcome};
use quorum_state::{ClusterState, Command, NodeRegistration};

/// Whether a connecting agent's registration must be proposed: its node is new, changed, or
/// not in service (DOWN, or drained by its health).
pub fn needs_registration(state: &ClusterState, registration: &NodeRegistration) -> bool {
    !state.nodes.get(&registration.name).is_some_and(|n| {
        n.cpus == registration.cpus
            && n.mem_mb == registration.mem_mb
            && n.gpus == registration.gpus
            && n.features == registration.features
            && n.agent_version == registration.version
            && n.schedulable()
    })
}

/// Why a node should not take new jobs, from its heartbeat: GPUs in FAILURE, a failing health
/// check. WARNING is shown but is no reason.
pub fn health_problem(gpus: &[GpuHealth], check: &str) -> Option<String> {
    let mut parts: Vec<String> = gpus
        .iter()
        .filter(|g| g.state == GpuState::GpuFailure as i32)
        .map(|g| format!("GPU {} failure: {}", g.index, g.detail))
        .collect();
    if !check.is_empty() {
        parts.push(format!("health check failed: {check}"));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// What a heartbeat asks to propose for its node.
#[derive(Debug, Default, PartialEq)]
pub struct HeartbeatActions {
    /// Drain the node for `problem`, or resume it from its health drain (`SetNodeHealth`).
    pub health: Option<Command>,
    /// Declared DOWN while its stream survived (a long stall, a partition that healed): heard
    /// again, it returns to service as on a reconnect (`RegisterNode`).
    pub return_to_service: Option<Command>,
}

/// The commands a heartbeat of `registration`'s node with health `problem` calls for. A health
/// change waits until the cluster's feature level applies it; an operator's drain is left alone.
pub fn on_heartbeat(
    state: &ClusterState,
    registration: &NodeRegistration,
    problem: &Option<String>,
    now: Millis,
) -> HeartbeatActions {
    let node = &registration.name;
    let admin = state.nodes.get(node).map(|n| &n.admin);
    let health_changed = match (admin, problem) {
        (Some(NodeAdminState::Up), Some(_)) => true,
        (Some(NodeAdminState::Drain { auto: true, reason }), Some(p)) => reason != p,
        (Some(NodeAdminState::Drain { auto: true, .. }), None) => true,
        _ => false,
    };
    // Built only on a change: a heartbeat comes every second from every node.
    let health = health_changed
        .then(|| Command::SetNodeHealth { node: node.clone(), problem: problem.clone(), now })
        .filter(|c| c.level().0 <= state.cluster_level());
    let return_to_service = matches!(admin, Some(NodeAdminState::Down { operator: false, .. }))
        .then(|| Command::RegisterNode { node: registration.clone(), now });
    HeartbeatActions { health, return_to_service }
}

/// The `JobEnded` for an agent's exit report, after what the job used there (`JobUsed`, in the
/// same entry) where the cluster's level records it, and before the node is drained (an
/// operator's drain, until resumed) when its prolog or epilog failed (`problem`). An
/// OUT_OF_MEMORY end becomes a plain exit while the cluster's level does not apply it (a replica
/// of an older release knows no OUT_OF_MEMORY: the job is FAILED there), and a failed prolog a
/// failed launch.
#[allow(clippy::too_many_arguments)]
pub fn job_ended(
    state: &ClusterState,
    job_id: u64,
    token: u64,
    node: String,
    outcome: RankOutcome,
    usage: Option<crate::model::JobUsage>,
    problem: &str,
    now: Millis,
) -> Command {
    let ended = ended_at_level(state, job_id, token, node.clone(), outcome, now);
    let usage = usage.map(|u| if state.cluster_level() < quorum_state::GPU_USAGE_LEVEL { u.without_gpu() } else { u });
    let mut commands = Vec::new();
    if let Some(used) = usage.map(|usage| Command::JobUsed { job_id, token, node: node.clone(), usage }) {
        if used.level().0 <= state.cluster_level() {
            commands.push(used);
        }
    }
    commands.push(ended);
    // Only for the job's current allocation: a late report of an older one drains nothing.
    let current = state.jobs.get(&job_id).is_some_and(|j| j.alloc_index == token);
    if !problem.is_empty() && current {
        let reason: String = problem.chars().take(256).collect();
        commands.push(Command::SetNodesDrained { nodes: vec![node], drain: Some(reason), now });
    }
    match commands.len() {
        1 => commands.pop().expect("one"),
        _ => Command::Batch { commands },
    }
}

/// `ended` after why the job could not start, when its agent said and the cluster's level
/// records it.
pub fn with_failure(state: &ClusterState, ended: Command, exit: &quorum_proto::agent::JobExit) -> Command {
    let failed = exit.kind == quorum_proto::agent::ExitKind::LaunchFailed as i32;
    if !failed || exit.error.is_empty() || state.cluster_level() < quorum_state::CONTAINER_LEVEL {
        return ended;
    }
    // Bounded before it is replicated (apply keeps as much again).
    let why: String = exit.error.chars().take(512).collect();
    let why = Command::JobFailure { job_id: exit.job_id, token: exit.token, why };
    match ended {
        Command::Batch { mut commands } => {
            commands.insert(0, why);
            Command::Batch { commands }
        }
        one => Command::Batch { commands: vec![why, one] },
    }
}

fn ended_at_level(
    state: &ClusterState,
    job_id: u64,
    token: u64,
    node: String,
    outcome: RankOutcome,
    now: Millis,
) -> Command {
    let ended = Command::JobEnded { job_id, token, node, outcome, now };
    if ended.level().0 <= state.cluster_level() {
        return ended;
    }
    match ended {
        Command::JobEnded { outcome: RankOutcome::OutOfMemory { code, signal }, job_id, token, node, now } => {
            Command::JobEnded { job_id, token, node, outcome: RankOutcome::Exited { code, signal }, now }
        }
        Command::JobEnded { outcome: RankOutcome::PrologFailed, job_id, token, node, now } => {
            Command::JobEnded { job_id, token, node, outcome: RankOutcome::LaunchFailed, now }
        }
        ended => ended,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use quorum_state::testing::cluster;
    use quorum_state::{apply, ReplicaVersion, FEATURE_LEVEL};

    use super::*;

    fn at_level(level: u32) -> ClusterState {
        let mut s = cluster();
        let versions = BTreeMap::from([(1, ReplicaVersion { level, version: "test".into() })]);
        apply(&mut s, 10, Command::SetReplicaVersions { versions, now: 5 });
        s
    }

    fn registration(s: &ClusterState, name: &str) -> NodeRegistration {
        let n = &s.nodes[name];
        NodeRegistration {
            name: name.into(),
            cpus: n.cpus,
            mem_mb: n.mem_mb,
            gpus: n.gpus.clone(),
            features: n.features.clone(),
            version: n.agent_version.clone(),
        }
    }

    #[test]
    fn a_registration_is_proposed_only_when_the_node_is_new_changed_or_out_of_service() {
        let mut s = at_level(FEATURE_LEVEL);
        let n1 = registration(&s, "n1");
        assert!(!needs_registration(&s, &n1), "unchanged and in service");
        assert!(needs_registration(&s, &NodeRegistration { cpus: n1.cpus + 1, ..n1.clone() }));
        assert!(needs_registration(&s, &NodeRegistration { name: "n9".into(), ..n1.clone() }));
        apply(&mut s, 11, Command::NodeDown { node: "n1".into(), reason: "silent".into(), now: 6 });
        assert!(needs_registration(&s, &n1), "DOWN");
    }

    #[test]
    fn a_failed_gpu_or_health_check_drains_and_its_end_resumes() {
        let mut s = at_level(FEATURE_LEVEL);
        let n1 = registration(&s, "n1");
        let failed = GpuHealth { index: 2, state: GpuState::GpuFailure as i32, detail: "xid 79".into() };
        let problem = health_problem(&[failed], "disk full");
        assert_eq!(problem.as_deref(), Some("GPU 2 failure: xid 79; health check failed: disk full"));
        assert_eq!(health_problem(&[], ""), None);

        let drain = on_heartbeat(&s, &n1, &problem, 7).health.expect("an Up node with a problem drains");
        assert_eq!(drain, Command::SetNodeHealth { node: "n1".into(), problem: problem.clone(), now: 7 });
        apply(&mut s, 11, drain);
        assert_eq!(on_heartbeat(&s, &n1, &problem, 8), HeartbeatActions::default(), "the same problem again");
        let other = on_heartbeat(&s, &n1, &Some("health check failed: fan".into()), 8);
        assert!(other.health.is_some(), "a new reason replaces the old");
        let resume = on_heartbeat(&s, &n1, &None, 9).health.expect("healthy again resumes");
        assert_eq!(resume, Command::SetNodeHealth { node: "n1".into(), problem: None, now: 9 });

        // An operator's drain is the operator's to lift.
        apply(&mut s, 12, Command::SetNodesDrained { nodes: vec!["n2".into()], drain: Some("fan".into()), now: 10 });
        let n2 = registration(&s, "n2");
        assert_eq!(on_heartbeat(&s, &n2, &None, 11), HeartbeatActions::default());
        assert_eq!(on_heartbeat(&s, &n2, &Some("x".into()), 11).health, None);
    }

    #[test]
    fn no_health_drain_below_the_level_that_applies_it() {
        let s = at_level(3);
        let n1 = registration(&s, "n1");
        assert_eq!(on_heartbeat(&s, &n1, &Some("health check failed: x".into()), 7).health, None);
    }

    #[test]
    fn a_node_heard_after_down_returns_to_service() {
        let mut s = at_level(FEATURE_LEVEL);
        let n1 = registration(&s, "n1");
        assert_eq!(on_heartbeat(&s, &n1, &None, 7).return_to_service, None);
        apply(&mut s, 11, Command::NodeDown { node: "n1".into(), reason: "silent".into(), now: 6 });
        let back = on_heartbeat(&s, &n1, &None, 8).return_to_service;
        assert_eq!(back, Some(Command::RegisterNode { node: n1, now: 8 }));
    }

    #[test]
    fn out_of_memory_is_a_plain_exit_below_its_level() {
        let oom = RankOutcome::OutOfMemory { code: 137, signal: 9 };
        let end = |s: &ClusterState| match job_ended(s, 4, 9, "n1".into(), oom, None, "", 7) {
            Command::JobEnded { outcome, .. } => outcome,
            other => panic!("{other:?}"),
        };
        assert_eq!(end(&at_level(FEATURE_LEVEL)), oom);
        assert_eq!(end(&at_level(3)), RankOutcome::Exited { code: 137, signal: 9 });
    }

    #[test]
    fn what_a_job_used_goes_with_its_end_where_the_level_records_it() {
        let exited = RankOutcome::Exited { code: 0, signal: 0 };
        let usage = crate::model::JobUsage { cpu_user_us: 5, cpu_system_us: 1, max_rss_kb: 64, ..Default::default() };
        let ended = Command::JobEnded { job_id: 4, token: 9, node: "n1".into(), outcome: exited, now: 7 };
        let used = Command::JobUsed { job_id: 4, token: 9, node: "n1".into(), usage };
        let at = |level| job_ended(&at_level(level), 4, 9, "n1".into(), exited, Some(usage), "", 7);
        assert_eq!(at(FEATURE_LEVEL), Command::Batch { commands: vec![used.clone(), ended.clone()] });
        assert_eq!(at(quorum_state::HISTORY_LEVEL - 1), ended, "an older replica could not apply it");
        // What its GPUs did goes only where every replica records it; the rest goes anyway.
        let with_gpu = crate::model::JobUsage { gpu_samples: 4, gpu_util_sum: 200, gpu_energy_mj: 9, ..usage };
        let gpu_at = |level| job_ended(&at_level(level), 4, 9, "n1".into(), exited, Some(with_gpu), "", 7);
        let used_gpu = Command::JobUsed { job_id: 4, token: 9, node: "n1".into(), usage: with_gpu };
        assert_eq!(used_gpu.level().0, quorum_state::GPU_USAGE_LEVEL);
        assert_eq!(gpu_at(FEATURE_LEVEL), Command::Batch { commands: vec![used_gpu, ended.clone()] });
        assert_eq!(gpu_at(quorum_state::GPU_USAGE_LEVEL - 1), Command::Batch { commands: vec![used, ended] });
    }

    #[test]
    fn a_failed_prolog_or_epilog_drains_the_node_in_the_entry_of_the_jobs_end() {
        let mut s = at_level(FEATURE_LEVEL);
        let submitted = quorum_state::testing::submit(&mut s, 11, quorum_state::testing::spec(&["true"]), "p");
        assert!(matches!(submitted, quorum_state::Response::Submitted { job_id: 1, .. }));
        s.jobs.get_mut(&1).unwrap().alloc_index = 9;
        let failed = RankOutcome::PrologFailed;
        let ended = Command::JobEnded { job_id: 1, token: 9, node: "n1".into(), outcome: failed, now: 7 };
        let drain = Command::SetNodesDrained {
            nodes: vec!["n1".into()],
            drain: Some("prolog failed for job 1: no scratch (exit 1)".into()),
            now: 7,
        };
        let problem = "prolog failed for job 1: no scratch (exit 1)";
        assert_eq!(
            job_ended(&s, 1, 9, "n1".into(), failed, None, problem, 7),
            Command::Batch { commands: vec![ended, drain] }
        );
        // A report of an allocation since replaced drains nothing; without a problem, nothing.
        assert!(matches!(job_ended(&s, 1, 8, "n1".into(), failed, None, problem, 7), Command::JobEnded { .. }));
        let exited = RankOutcome::Exited { code: 0, signal: 0 };
        assert!(matches!(job_ended(&s, 1, 9, "n1".into(), exited, None, "", 7), Command::JobEnded { .. }));
        // Below the level that requeues it, a failed prolog is a failed launch.
        let below = at_level(quorum_state::PROLOG_LEVEL - 1);
        match job_ended(&below, 1, 9, "n1".into(), failed, None, "", 7) {
            Command::JobEnded { outcome, .. } => assert_eq!(outcome, RankOutcome::LaunchFailed),
            other => panic!("{other:?}"),
        }
    }
}
