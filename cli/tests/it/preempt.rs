//! Preemption on a cluster with agents: a production job (partition tier 1) arrives while a
//! scavenger partition (tier 0, requeue, a 3 s grace) fills every node. The latest started
//! scavenger job gets SIGTERM, goes back to the queue, and the production job runs on its node;
//! the scavenger job then runs again, never two copies of it at once. Owners' nodes: a
//! partition of the nodes a group bought admits its account only and takes its nodes back from
//! the shared partition they lend themselves to. Sharing CPUs: partitions whose jobs share each
//! CPU (`OverSubscribe=FORCE:2`, and `YES:2` for the jobs that ask).

use crate::common;

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

/// A ready cluster whose scavenger partition (tier 0, its jobs preempted `mode`) and production
/// one (tier 1) span both nodes.
async fn scavenging(mode: &str) -> (quorum_dev::cluster::DevCluster, quorum_client::client::Client) {
    let opts = DevOptions {
        extra_partitions: vec![partition("scav", 0, Some(mode)), partition("prod", 1, None)],
        scheduler: SchedulerConfig { preempt_type: Some("partition_prio".into()), ..Default::default() },
        ..DevOptions::for_tests()
    };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    (cluster, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_job_is_requeued_and_runs_again_once_at_a_time() {
    let (cluster, c) = scavenging("requeue").await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    // Each run notes its start (and whether another copy of it holds the marker), and on
    // SIGTERM its end, within the grace.
    let scavenger = |n: usize| {
        let marker = dir.path().join(format!("running-{n}"));
        let script = format!(
            "m={m}; trap 'echo usr1 {n} >> {log}' USR1; \
             trap 'rm -f $m; echo term {n} >> {log}; exit 0' TERM; \
             [ -e $m ] && echo TWICE {n} >> {log}; touch $m; echo start {n} ${{SLURM_RESTART_COUNT:-0}} >> {log}; \
             while true; do sleep 0.1; done",
            m = marker.display(),
            log = log.display()
        );
        let mut s = spec(&["bash", "-c", &script], dir.path());
        (s.partition, s.cpus_per_task) = ("scav".into(), 8);
        // A warning long before its hour's limit: it comes now only because it is preempted.
        s.signal = "B:USR1@60".into();
        s
    };
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    // RUNNING is the controllers' word; the scripts' own lines say their traps are set (a
    // SIGTERM before that would end bash without a word, as it would under Slurm).
    let first = submit(&c, scavenger(1)).await;
    wait_state(&c, first, &["RUNNING"], T).await;
    wait_for(T, "the first scavenger job's start", || async { read().contains("start 1 0").then_some(()) }).await;
    let second = submit(&c, scavenger(2)).await;
    let latest = wait_state(&c, second, &["RUNNING"], T).await;
    let node = latest.allocation[0].node.clone();
    wait_for(T, "the latest scavenger job's start", || async { read().contains("start 2 0").then_some(()) }).await;

    let mut urgent = spec(&["bash", "-c", "sleep 1"], dir.path());
    (urgent.partition, urgent.cpus_per_task) = ("prod".into(), 8);
    let urgent = submit(&c, urgent).await;
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
    // Its --signal came first, then SIGTERM (Slurm's preempt_send_user_signal).
    let usr1 = said.find("usr1 2").expect("the preempted job got its --signal");
    assert!(usr1 < said.find("term 2").unwrap(), "{said}");
    assert!(!said.contains("usr1 1"), "{said}");
    let first_job = job(&c, first).await;
    assert_eq!((first_job.state.as_str(), first_job.requeues), ("RUNNING", 0));
    let shown = quorum(&cluster.controllers_env(), dir.path(), &["show", &second.to_string()]).success();
    assert!(shown.contains("Restarts=1") && shown.contains(&format!("PreemptedBy={urgent}")), "{shown}");
    for id in [first, second] {
        cancel(&c, id).await;
    }
    cluster.shutdown().await;
}

/// A lab bought node01. Its partition `lab` (tier 1) admits the lab's account only; the shared
/// partition (tier 0, requeue) spans both nodes, so that node01 runs anyone's jobs while the lab
/// does not need it. A lab job takes node01 back at once, preempting the shared job there and not
/// the one on node02; a job of another account is refused at the lab's partition, naming the
/// rule, and `scontrol show partition` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_partition_admits_its_account_and_takes_its_node_back_from_the_shared_one() {
    let lab =
        PartitionConfig { nodes: "node01".into(), allow_accounts: vec!["lab".into()], ..partition("lab", 1, None) };
    let opts = DevOptions {
        extra_partitions: vec![partition("shared", 0, Some("requeue")), lab],
        scheduler: SchedulerConfig { preempt_type: Some("partition_prio".into()), ..Default::default() },
        ..DevOptions::for_tests()
    };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let sleeper = |partition: &str, account: &str| {
        let mut s = spec(&["sleep", "300"], dir.path());
        (s.partition, s.account, s.cpus_per_task) = (partition.into(), account.into(), 8);
        s
    };
    let mut shared = Vec::new();
    for _ in 0..2 {
        let id = submit(&c, sleeper("shared", "physics")).await;
        shared.push(wait_state(&c, id, &["RUNNING"], T).await);
    }
    // The rules replicate once every replica has told its feature level (level 22): until then
    // the partitions are open.
    let bin = tempfile::tempdir().unwrap();
    let scontrol = |args: &[&str]| slurm_as(&cluster, bin.path(), "scontrol", "root", args).success();
    wait_for(T, "the lab's rule", || async {
        scontrol(&["show", "partition", "lab", "-o"]).contains("AllowAccounts=lab AllowQos=ALL").then_some(())
    })
    .await;
    let refused = submit_with_id(&c, sleeper("lab", "physics"), "physics-at-the-lab").await.unwrap_err();
    assert_eq!(
        refused.message(),
        "invalid account or account/partition combination specified: partition 'lab' does not admit account 'physics' (AllowAccounts=lab)"
    );
    let owner = submit(&c, sleeper("lab", "lab")).await;
    let ran = wait_state(&c, owner, &["RUNNING"], T).await;
    assert_eq!(ran.allocation[0].node, "node01");
    let on = |n: &str| shared.iter().find(|j| j.allocation[0].node == n).unwrap().id;
    let (victim, spared) = (on("node01"), on("node02"));
    let requeued = job_info_where(&c, victim, |j| j.requeues == 1).await;
    assert_eq!(requeued.state, "PENDING", "{requeued:?}");
    assert_eq!(job(&c, spared).await.state, "RUNNING", "node02 is not the lab's");
    let shown = scontrol(&["show", "partition", "lab", "-o"]);
    assert!(shown.contains("PriorityTier=1"), "{shown}");
    for id in [owner, victim, spared] {
        cancel(&c, id).await;
    }
    cluster.shutdown().await;
}

async fn job_info_where(
    c: &quorum_client::client::Client,
    id: u64,
    f: impl Fn(&quorum_proto::api::JobInfo) -> bool,
) -> quorum_proto::api::JobInfo {
    wait_for(T, "the job's change", || async {
        let j = job(c, id).await;
        f(&j).then_some(j)
    })
    .await
}

/// Preempt mode SUSPEND: the production job suspends the latest started scavenger job instead
/// of stopping it. Its processes freeze at once (its output stops, it gets no signal it could
/// see), its memory stays allocated and an operator cannot resume it; the production job runs on
/// its CPUs, and when that ends the scavenger job is thawed where it was and goes on, never
/// requeued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_preempted_suspend_freezes_and_goes_on_when_the_preemptor_ends() {
    let (cluster, c) = scavenging("suspend").await;
    let dir = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let scontrol = |args: &[&str]| slurm_as(&cluster, bin.path(), "scontrol", "root", args).success();
    // The mode replicates once every replica has told its feature level (level 23).
    wait_for(T, "the scavenger partition's mode", || async {
        scontrol(&["show", "partition", "scav", "-o"]).contains("PreemptMode=SUSPEND").then_some(())
    })
    .await;
    let ticker = |n: usize| {
        let ticks = dir.path().join(format!("ticks-{n}"));
        let script = format!(
            "trap 'echo term >> {t}; exit 0' TERM; while true; do echo tick >> {t}; sleep 0.1; done",
            t = ticks.display()
        );
        let mut s = spec(&["bash", "-c", &script], dir.path());
        (s.partition, s.cpus_per_task) = ("scav".into(), 8);
        (s, ticks)
    };
    let count = |path: &std::path::Path| std::fs::read_to_string(path).unwrap_or_default().lines().count();
    let (first, _) = ticker(1);
    let first = submit(&c, first).await;
    wait_state(&c, first, &["RUNNING"], T).await;
    let (second, ticks) = ticker(2);
    let second = submit(&c, second).await;
    let latest = wait_state(&c, second, &["RUNNING"], T).await;
    wait_for(T, "its first ticks", || async { (count(&ticks) > 3).then_some(()) }).await;

    let marker = dir.path().join("prod-ran");
    let script = format!("sleep 3; touch {}", marker.display());
    let mut urgent = spec(&["bash", "-c", &script], dir.path());
    (urgent.partition, urgent.cpus_per_task) = ("prod".into(), 8);
    let urgent = submit(&c, urgent).await;
    let suspended = wait_state(&c, second, &["SUSPENDED"], T).await;
    assert_eq!(suspended.alloc_index, latest.alloc_index, "the same allocation, not a requeue");
    let running = wait_state(&c, urgent, &["RUNNING"], T).await;
    assert_eq!(running.allocation[0].node, latest.allocation[0].node, "on its victim's CPUs");
    // Frozen while the production job runs: once the freeze has reached it (two reads 200 ms
    // apart agree), no tick in a second, and its memory still held.
    let frozen = wait_for(T, "its ticks to stop", || async {
        let before = count(&ticks);
        tokio::time::sleep(Duration::from_millis(200)).await;
        (count(&ticks) == before).then_some(before)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(count(&ticks), frozen, "the suspended job went on");
    let node = nodes(&c).await.into_iter().find(|n| n.name == latest.allocation[0].node).expect("its node");
    assert_eq!((node.alloc_cpus, node.alloc_mem_mb), (8, 2 * 8 * 1024), "the preemptor's CPUs; both jobs' memory");
    let refused = slurm_as(&cluster, bin.path(), "scontrol", "root", &["resume", &second.to_string()]);
    assert!(refused.stderr.contains("resumes by itself once its CPUs are free"), "{refused:?}");

    let ran = wait_state(&c, urgent, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(ran.state, "COMPLETED", "{ran:?}");
    assert!(marker.exists());
    let resumed = wait_state(&c, second, &["RUNNING"], T).await;
    assert_eq!((resumed.alloc_index, resumed.requeues), (latest.alloc_index, 0), "{resumed:?}");
    wait_for(T, "ticks again", || async { (count(&ticks) > frozen).then_some(()) }).await;
    let said = std::fs::read_to_string(&ticks).unwrap_or_default();
    assert!(!said.contains("term"), "it was never stopped");
    let shown = quorum(&cluster.controllers_env(), dir.path(), &["show", &second.to_string()]).success();
    assert!(shown.contains(&format!("PreemptedBy={urgent}")) && shown.contains("Restarts=0"), "{shown}");
    for id in [first, second] {
        cancel(&c, id).await;
    }
    cluster.shutdown().await;
}

/// `OverSubscribe`: `shared` (FORCE:2, both nodes) runs two 8-CPU jobs at once on each 8-CPU
/// node, and a fifth waits for room; `asked` (YES:2, node01) shares only between jobs that ask
/// with `sbatch --oversubscribe`, and one that does not ask waits for a whole node's CPUs.
/// `sinfo` and `scontrol` show the setting and count a node's shared CPUs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_share_cpus_where_their_partition_oversubscribes() {
    let shared = PartitionConfig { oversubscribe: Some("FORCE:2".into()), ..partition("shared", 0, None) };
    let asked =
        PartitionConfig { nodes: "node01".into(), oversubscribe: Some("yes:2".into()), ..partition("asked", 0, None) };
    let opts = DevOptions { extra_partitions: vec![shared, asked], ..DevOptions::for_tests() };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let slurm = |name: &str, args: &[&str]| slurm_as(&cluster, bin.path(), name, "root", args).success();
    // Sharing replicates once every replica has told its feature level (level 24).
    wait_for(T, "the shared partition's setting", || async {
        slurm("scontrol", &["show", "partition", "shared", "-o"]).contains("OverSubscribe=FORCE:2").then_some(())
    })
    .await;
    let listed = slurm("sinfo", &["-h", "-o", "%P %h"]);
    assert!(listed.lines().any(|l| l == "shared FORCE:2") && listed.lines().any(|l| l == "asked YES:2"), "{listed}");

    let sleeper = |partition: &str| {
        let mut s = spec(&["sleep", "300"], dir.path());
        (s.partition, s.cpus_per_task) = (partition.into(), 8);
        s
    };
    let mut both = Vec::new();
    for _ in 0..4 {
        both.push(submit(&c, sleeper("shared")).await);
    }
    let mut on_node01 = 0;
    for &id in &both {
        let j = wait_state(&c, id, &["RUNNING"], T).await;
        on_node01 += usize::from(j.allocation[0].node == "node01");
        assert_eq!(j.allocation[0].cpus, 8, "{j:?}");
    }
    assert_eq!(on_node01, 2, "two jobs on each node");
    let fifth = submit(&c, sleeper("shared")).await;
    let waiting = job_info_where(&c, fifth, |j| j.reason != "None").await;
    assert_eq!((waiting.state.as_str(), waiting.reason.as_str()), ("PENDING", "Resources"));
    let node = slurm("scontrol", &["show", "node", "node01", "-o"]);
    assert!(node.contains("CPUAlloc=8 CPUTot=8"), "two 8-CPU jobs shared two ways hold 8 CPUs: {node}");
    for id in both.iter().copied().chain([fifth]) {
        cancel(&c, id).await;
    }
    for &id in &both {
        wait_state(&c, id, &["CANCELLED"], T).await;
    }

    let script = |name: &str, extra: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n#SBATCH -p asked -c 8{extra}\nsleep 300\n")).unwrap();
        let out = slurm("sbatch", &[path.to_str().unwrap()]);
        out.trim().rsplit(' ').next().and_then(|w| w.parse::<u64>().ok()).unwrap_or_else(|| panic!("{out}"))
    };
    let askers = [script("a1.sh", " --oversubscribe"), script("a2.sh", "\n#SBATCH -s")];
    for id in askers {
        assert_eq!(wait_state(&c, id, &["RUNNING"], T).await.allocation[0].node, "node01");
    }
    let shown = slurm("scontrol", &["show", "job", &askers[0].to_string()]);
    assert!(shown.contains("OverSubscribe=YES"), "{shown}");
    let plain = script("plain.sh", "");
    let waiting = job_info_where(&c, plain, |j| j.reason != "None").await;
    assert_eq!((waiting.state.as_str(), waiting.reason.as_str()), ("PENDING", "Resources"));
    for id in askers.into_iter().chain([plain]) {
        cancel(&c, id).await;
    }
    cluster.shutdown().await;
}
