//! Property test of the state machine: random command sequences, applied once straight through
//! and once with a snapshot taken, encoded, decoded and installed at a random point, at every
//! feature level this release supports. The two runs answer the same to every command and end
//! in equal states with equal digests; the snapshot is plain JSON below the compressed level
//! and LZ4 from it.

use proptest::prelude::*;

use crate::testing::{cluster, register, spec};
use crate::{apply, digest, snapshot, ClusterState, Command, ReplicaVersion, Submit};
use crate::{BASE_LEVEL, COMPRESSED_SNAPSHOT_LEVEL, FEATURE_LEVEL};
use quorum_model::{Allocation, JobState, NodeAllocation, PlannedStart, RankOutcome};

const USERS: [&str; 3] = ["alice", "bob", "carol"];
const NODES: [&str; 2] = ["n1", "n2"];

#[derive(Clone, Debug)]
enum Op {
    Submit { nodes: u32, cpus: u32, requeue: bool, hold: bool, user: usize, request: Option<u8> },
    SubmitTwo { cpus: u32, user: usize },
    Start { pick: usize },
    End { pick: usize, code: i32 },
    Lost { pick: usize },
    Cancel { pick: usize, user: usize },
    Hold { pick: usize, release: bool },
    Down { node: usize },
    Register { node: usize },
    Drain { node: usize, on: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u32..=2, 1u32..=8, any::<bool>(), proptest::bool::weighted(0.2), 0usize..3, proptest::option::of(0u8..4))
            .prop_map(|(nodes, cpus, requeue, hold, user, request)| Op::Submit { nodes, cpus, requeue, hold, user, request }),
        1 => (1u32..=4, 0usize..3).prop_map(|(cpus, user)| Op::SubmitTwo { cpus, user }),
        4 => any::<usize>().prop_map(|pick| Op::Start { pick }),
        3 => (any::<usize>(), 0i32..3).prop_map(|(pick, code)| Op::End { pick, code }),
        1 => any::<usize>().prop_map(|pick| Op::Lost { pick }),
        1 => (any::<usize>(), 0usize..3).prop_map(|(pick, user)| Op::Cancel { pick, user }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, release)| Op::Hold { pick, release }),
        1 => (0usize..2).prop_map(|node| Op::Down { node }),
        1 => (0usize..2).prop_map(|node| Op::Register { node }),
        1 => (0usize..2, any::<bool>()).prop_map(|(node, on)| Op::Drain { node, on }),
    ]
}

fn pick(ids: &[u64], i: usize) -> Option<u64> {
    (!ids.is_empty()).then(|| ids[i % ids.len()])
}

fn jobs_in(s: &ClusterState, state: JobState) -> Vec<u64> {
    s.jobs.values().filter(|j| j.state == state).map(|j| j.id).collect()
}

/// The command `op` makes against state `s` at `now`, if it can make one.
fn command(s: &ClusterState, index: u64, op: &Op) -> Option<Command> {
    let now = 1000 + index;
    let job_spec = |nodes: u32, cpus: u32, requeue: bool, hold: bool| {
        let mut j = spec(&["true"]);
        (j.nodes, j.ntasks, j.cpus_per_task, j.requeue, j.hold) = (nodes, nodes, cpus, requeue, hold);
        j
    };
    Some(match op {
        Op::Submit { nodes, cpus, requeue, hold, user, request } => Command::SubmitJob {
            spec: Box::new(job_spec(*nodes, *cpus, *requeue, *hold)),
            user: USERS[*user].into(),
            now,
            request_id: request.map(|r| format!("{}:r{r}", USERS[*user])).unwrap_or_default(),
        },
        Op::SubmitTwo { cpus, user } => Command::SubmitJobs {
            submits: (0..2)
                .map(|_| Submit {
                    spec: Box::new(job_spec(1, *cpus, false, false)),
                    user: USERS[*user].into(),
                    request_id: String::new(),
                })
                .collect(),
            now,
        },
        Op::Start { pick: p } => {
            let job = &s.jobs[&pick(&jobs_in(s, JobState::Pending), *p)?];
            let per_node = job.spec.ntasks.div_ceil(job.spec.nodes) * job.spec.cpus_per_task;
            let mem_mb = job.spec.mem_per_node_mb.unwrap_or(1024);
            let nodes = NODES[..job.spec.nodes as usize]
                .iter()
                .map(|n| NodeAllocation { node: n.to_string(), cpus: per_node, mem_mb, gpus: vec![], het_group: 0 })
                .collect();
            Command::ApplyPlan {
                base_index: index - 1,
                now,
                starts: vec![PlannedStart { job_id: job.id, allocation: Allocation { nodes, cpu_ways: None } }],
                reasons: vec![],
                preemptions: vec![],
                resumes: vec![],
                shown: vec![],
            }
        }
        Op::End { pick: p, .. } | Op::Lost { pick: p } => {
            let job = &s.jobs[&pick(&jobs_in(s, JobState::Running), *p)?];
            let node = job.allocation.as_ref()?.nodes.first()?.node.clone();
            let outcome = match op {
                Op::End { code, .. } => RankOutcome::Exited { code: *code, signal: 0 },
                _ => RankOutcome::LostContact,
            };
            Command::JobEnded { job_id: job.id, token: job.alloc_index, node, outcome, now }
        }
        Op::Cancel { pick: p, user } => Command::CancelJob {
            job_id: pick(&s.jobs.keys().copied().collect::<Vec<_>>(), *p)?,
            user: USERS[*user].into(),
            now,
            whole_array: false,
        },
        Op::Hold { pick: p, release } => {
            let job_id = pick(&s.jobs.keys().copied().collect::<Vec<_>>(), *p)?;
            let user = s.jobs[&job_id].user.clone();
            if *release {
                Command::ReleaseJob { job_id, user, now }
            } else {
                Command::HoldJob { job_id, user, now }
            }
        }
        Op::Down { node } => Command::NodeDown { node: NODES[*node].into(), reason: "silent".into(), now },
        Op::Register { node } => register(NODES[*node], 8, 4),
        Op::Drain { node, on } => Command::SetNodesDrained {
            nodes: vec![NODES[*node].into()],
            drain: on.then(|| "maintenance".to_string()),
            now,
        },
    })
}

/// A cluster whose replicas all run feature level `level`.
fn at_level(level: u32) -> ClusterState {
    let mut s = cluster();
    for id in 1..=3 {
        s.replica_versions.insert(id, ReplicaVersion { level, version: "test".into() });
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_snapshot_installed_anywhere_changes_nothing_at_any_level(
        ops in proptest::collection::vec(op(), 1..80),
        cut in any::<prop::sample::Index>(),
    ) {
        let cut = cut.index(ops.len());
        for level in BASE_LEVEL..=FEATURE_LEVEL {
            let (mut straight, mut restored) = (at_level(level), at_level(level));
            let mut index = 10;
            for (i, op) in ops.iter().enumerate() {
                if i == cut {
                    let bytes = snapshot::encode(&restored).unwrap();
                    let compressed = bytes.starts_with(snapshot::LZ4_MAGIC);
                    prop_assert_eq!(compressed, level >= COMPRESSED_SNAPSHOT_LEVEL, "level {}", level);
                    let installed = snapshot::decode(&bytes).unwrap();
                    prop_assert_eq!(digest(&installed), digest(&restored), "level {}", level);
                    prop_assert!(installed == restored, "level {}: the installed snapshot differs", level);
                    restored = installed;
                }
                index += 1;
                // The leader proposes nothing above the cluster's level.
                let Some(command) = command(&straight, index, op).filter(|c| c.level().0 <= level) else { continue };
                let a = apply(&mut straight, index, command.clone());
                let b = apply(&mut restored, index, command);
                prop_assert_eq!(a, b, "level {}: the answers differ at entry {}", level, index);
            }
            prop_assert!(straight == restored, "level {}: the states differ", level);
            prop_assert_eq!(digest(&straight), digest(&restored));
            // And once more through a snapshot at the end, as a restarted replica reads it.
            let back = snapshot::decode(&snapshot::encode(&straight).unwrap()).unwrap();
            prop_assert_eq!(digest(&back), digest(&straight));
        }
    }
}
