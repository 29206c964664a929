//! Preemption on a cluster with agents: a production job (partition tier 1) arrives while a
//! scavenger partition (tier 0, requeue, a 3 s grace) fills every node. The latest started
//! scavenger job gets SIGTERM, goes back to the queue, and the production job runs on its node;
//! the scavenger job then runs again, never two copies of it at once.

mod common;

use std::time::Duration;

use common::*;
use quorum_control::config::{PartitionConfig, SchedulerConfig};
use quorum_dev::cluster::DevOptions;

const T: Duration = Duration::from_secs(30);

fn partition(name: &str, tier: u32, mode: Option<&str>) -> PartitionConfig {
    PartitionConfig {
        name: name.into(),
        nodes: "node[01-02]".into(),
        priority_tier: tier,
        max_time: Some("1:00:00".into()),
        default_mem_per_cpu: Some("1G".into()),
        preempt_mode: mode.map(str::to_string),
        grace_time: mode.map(|_| 3),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_job_is_requeued_and_runs_again_once_at_a_time() {
    let opts = DevOptions {
        extra_partitions: vec![partition("scav", 0, Some("requeue")), partition("prod", 1, None)],
        scheduler: SchedulerConfig { preempt_type: Some("partition_prio".into()), ..Default::default() },
        ..DevOptions::for_tests()
    };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    // Each run notes its start (and whether another copy of it holds the marker), and on
    // SIGTERM its end, within the grace.
    let scavenger = |n: usize| {
        let marker = dir.path().join(format!("running-{n}"));
        let script = format!(
            "m={m}; [ -e $m ] && echo TWICE {n} >> {log}; touch $m; echo start {n} ${{SLURM_RESTART_COUNT:-0}} >> {log}; \
             trap 'rm -f $m; echo term {n} >> {log}; exit 0' TERM; while true; do sleep 0.1; done",
            m = marker.display(),
            log = log.display()
        );
        let mut s = spec(&["bash", "-c", &script], dir.path());
        (s.partition, s.cpus_per_task) = ("scav".into(), 8);
        s
    };
    let first = submit(&c, scavenger(1)).await;
    wait_state(&c, first, &["RUNNING"], T).await;
    let second = submit(&c, scavenger(2)).await;
    let latest = wait_state(&c, second, &["RUNNING"], T).await;
    let node = latest.allocation[0].node.clone();

    let mut urgent = spec(&["bash", "-c", "sleep 1"], dir.path());
    (urgent.partition, urgent.cpus_per_task) = ("prod".into(), 8);
    let urgent = submit(&c, urgent).await;
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for(T, "the latest scavenger job's SIGTERM", || async { read().contains("term 2").then_some(()) }).await;
    let ran = wait_state(&c, urgent, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(ran.state, "COMPLETED", "{ran:?}");
    assert_eq!(ran.allocation[0].node, node, "the production job runs where its victim ran");
    // The victim runs again (its second run), the first scavenger job never stopped.
    let again = wait_for(T, "the preempted job's second run", || async {
        let j = job(&c, second).await;
        (j.state == "RUNNING" && j.requeues == 1).then_some(j)
    })
    .await;
    assert!(again.alloc_index > latest.alloc_index, "a new allocation fences the old one");
    wait_for(T, "its second start", || async { read().contains("start 2 1").then_some(()) }).await;
    let said = read();
    assert!(!said.contains("TWICE"), "two copies ran at once:\n{said}");
    assert_eq!(said.lines().filter(|l| l.starts_with("start 1")).count(), 1, "{said}");
    assert!(!said.contains("term 1"), "{said}");
    let first_job = job(&c, first).await;
    assert_eq!((first_job.state.as_str(), first_job.requeues), ("RUNNING", 0));
    let shown = quorum(&cluster.controllers_env(), dir.path(), &["show", &second.to_string()]).success();
    assert!(shown.contains("Restarts=1") && shown.contains(&format!("PreemptedBy={urgent}")), "{shown}");
    for id in [first, second] {
        cancel(&c, id).await;
    }
    cluster.shutdown().await;
}
