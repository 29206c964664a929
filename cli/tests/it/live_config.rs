//! Partitions and nodes changed at run time (`scontrol create|update|delete partition`,
//! `scontrol update nodename=... weight|features|state`), through Raft: no restart, and what
//! changed outlasts a leader change and a restart of every replica, whatever the replicas'
//! configuration says.

use std::path::Path;
use std::time::Duration;

use quorum_dev::cluster::{DevCluster, DevOptions};

use crate::common::*;

const T: Duration = Duration::from_secs(30);

fn scontrol(cluster: &DevCluster, bin: &Path, user: &str, args: &[&str]) -> Run {
    slurm_as(cluster, bin, "scontrol", user, args)
}

/// `scontrol ARGS` as root, which must succeed: what it printed.
fn admin(cluster: &DevCluster, bin: &Path, args: &[&str]) -> String {
    scontrol(cluster, bin, "root", args).success()
}

fn sbatch(cluster: &DevCluster, bin: &Path, args: &[&str]) -> Run {
    let args: Vec<&str> = ["--parsable"].iter().chain(args).copied().collect();
    slurm_as(cluster, bin, "sbatch", "root", &args)
}

fn sbatch_id(cluster: &DevCluster, bin: &Path, args: &[&str]) -> u64 {
    let out = sbatch(cluster, bin, args).success();
    out.trim().parse().unwrap_or_else(|_| panic!("sbatch printed {out:?}"))
}

/// The `Key=Value` of a `scontrol show ... -o` record.
fn field(record: &str, key: &str) -> String {
    record
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {record}"))
        .to_string()
}

async fn seeded(cluster: &DevCluster) {
    wait_for(T, "the configuration's partitions seeded", || async {
        let leader = cluster.controller(cluster.leader()?)?;
        leader.replica.shared.read().state.partitions_seeded.then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_and_nodes_change_at_run_time_and_outlast_a_leader_change_and_a_restart() {
    let mut cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    seeded(&cluster).await;
    let dir = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let (d, b) = (dir.path(), bin.path());
    let wd = format!("--chdir={}", d.display());

    // A job runs on node01, in the configuration's partition, all along.
    let hold = "until [ -e release ]; do sleep 0.1; done";
    let long = sbatch_id(&cluster, b, &[&wd, "-w", "node01", "--wrap", hold]);
    wait_state(&c, long, &["RUNNING"], T).await;

    // Only an admin changes partitions.
    ensure_user("alice");
    let denied = scontrol(&cluster, b, "alice", &["create", "partition", "PartitionName=live", "Nodes=node02"]);
    assert_ne!(denied.code, 0);
    assert!(denied.stderr.to_lowercase().contains("permission") || denied.stderr.contains("admin"), "{denied:?}");
    // What Slurm refuses, this refuses by name.
    let bad = scontrol(&cluster, b, "root", &["create", "PartitionName=live", "Nodes=node02", "AllowGroups=wheel"]);
    assert!(bad.stderr.contains("not supported: AllowGroups=wheel"), "{bad:?}");
    let taken = scontrol(&cluster, b, "root", &["create", "PartitionName=gpu", "Nodes=node02"]);
    assert!(taken.stderr.contains("exists already"), "{taken:?}");

    // node02 moves out of gpu into a new partition, and a job runs there.
    admin(&cluster, b, &["update", "PartitionName=gpu", "Nodes=node01"]);
    admin(
        &cluster,
        b,
        &["create", "partition", "PartitionName=live", "Nodes=node02", "MaxTime=10:00", "PriorityTier=2"],
    );
    let shown = admin(&cluster, b, &["show", "partition", "live", "-o"]);
    assert_eq!(
        (field(&shown, "Nodes"), field(&shown, "MaxTime"), field(&shown, "State"), field(&shown, "PriorityTier")),
        ("node02".into(), "10:00".into(), "UP".into(), "2".into()),
        "{shown}"
    );
    let there = sbatch_id(&cluster, b, &[&wd, "-p", "live", "--wrap", "hostname"]);
    assert_eq!(wait_state(&c, there, &["COMPLETED"], T).await.nodelist, "node02");
    // gpu no longer has node02: a job asking for it there is refused.
    let r = sbatch(&cluster, b, &[&wd, "-p", "gpu", "-w", "node02", "--wrap", "true"]);
    assert_ne!(r.code, 0, "{r:?}");

    // Drained, it takes no new job.
    admin(&cluster, b, &["update", "PartitionName=live", "State=DRAIN"]);
    let r = sbatch(&cluster, b, &[&wd, "-p", "live", "--wrap", "true"]);
    assert!(r.stderr.contains("not available (inactive or drain)"), "{r:?}");
    let sinfo = slurm_as(&cluster, b, "sinfo", "root", &["-h", "-p", "live", "-o", "%P %a %N"]).success();
    assert_eq!(sinfo.trim(), "live drain node02");

    // A leader change and a restart of every replica keep all of it; the replicas' files still
    // say gpu has both nodes and there is no partition live.
    let old = cluster.leader().expect("a leader");
    cluster.stop_controller(old).await;
    wait_for(T, "a new leader", || async { cluster.leader().filter(|l| *l != old) }).await;
    let shown = admin(&cluster, b, &["show", "partition", "live", "-o"]);
    assert_eq!(field(&shown, "State"), "DRAIN", "{shown}");
    cluster.restart_controller(old).await.unwrap();
    for i in 0..cluster.addrs.len() {
        cluster.stop_controller(i).await;
    }
    for i in 0..cluster.addrs.len() {
        cluster.restart_controller(i).await.unwrap();
    }
    wait_ready(&cluster, &c, 2).await;
    let gpu = admin(&cluster, b, &["show", "partition", "gpu", "-o"]);
    assert_eq!(field(&gpu, "Nodes"), "node01", "{gpu}");
    let shown = admin(&cluster, b, &["show", "partition", "live", "-o"]);
    assert_eq!((field(&shown, "State"), field(&shown, "Nodes")), ("DRAIN".into(), "node02".into()), "{shown}");
    assert_eq!(job(&c, long).await.state, "RUNNING", "the job elsewhere runs on through it all");

    // quorum admin config prints the cluster's partitions as the controllers' TOML, which
    // seeds a new cluster the same.
    let printed = quorum_as(&cluster.controllers_env(), Some("root"), d, &["admin", "config"]).success();
    let site = quorum_control::config::ControllerConfig::parse_site("printed", &printed).expect("it parses");
    let live = site.partitions.iter().find(|p| p.name == "live").expect("live is printed");
    assert_eq!((live.nodes.as_str(), live.state.as_deref()), ("node02", Some("DRAIN")), "{printed}");
    let printed_partitions = site.partitions().unwrap();
    let leader = cluster.controller(cluster.leader().unwrap()).unwrap();
    let held: Vec<_> = leader.replica.shared.read().state.partitions.values().cloned().collect();
    assert_eq!(printed_partitions, held, "{printed}");

    // Deleted, and node02 back in gpu.
    admin(&cluster, b, &["delete", "PartitionName=live"]);
    let gone = scontrol(&cluster, b, "root", &["show", "partition", "live"]);
    assert_ne!(gone.code, 0, "{gone:?}");
    admin(&cluster, b, &["update", "PartitionName=gpu", "Nodes=node[01-02]"]);

    // Weights: the lighter node is allocated first, all else equal (node01, with the long job,
    // would be the best fit otherwise).
    admin(&cluster, b, &["update", "NodeName=node01", "Weight=10"]);
    let id = sbatch_id(&cluster, b, &[&wd, "--wrap", "true"]);
    assert_eq!(wait_state(&c, id, &["COMPLETED"], T).await.nodelist, "node02");
    admin(&cluster, b, &["update", "NodeName=node02", "Weight=20"]);
    let id = sbatch_id(&cluster, b, &[&wd, "--wrap", "true"]);
    assert_eq!(wait_state(&c, id, &["COMPLETED"], T).await.nodelist, "node01");
    let node = admin(&cluster, b, &["show", "node", "node02", "-o"]);
    assert_eq!(field(&node, "Weight"), "20", "{node}");

    // Features set by an operator are in force, over what the agent reports.
    admin(&cluster, b, &["update", "NodeName=node02", "Features=bigmem,ib"]);
    let id = sbatch_id(&cluster, b, &[&wd, "-C", "bigmem", "--wrap", "true"]);
    assert_eq!(wait_state(&c, id, &["COMPLETED"], T).await.nodelist, "node02");
    let node = admin(&cluster, b, &["show", "node", "node02", "-o"]);
    assert_eq!(field(&node, "AvailableFeatures"), "bigmem,ib", "{node}");

    // DOWN by an operator: it stays DOWN while its agent is heard, until resumed.
    let r = scontrol(&cluster, b, "root", &["update", "NodeName=node02", "State=DOWN"]);
    assert!(r.stderr.contains("reason"), "{r:?}");
    admin(&cluster, b, &["update", "NodeName=node02", "State=DOWN", "Reason=fan"]);
    let state = |n: String| (field(&n, "State"), n);
    tokio::time::sleep(Duration::from_secs(3)).await; // several heartbeats of its agent
    let (s, node) = state(admin(&cluster, b, &["show", "node", "node02", "-o"]));
    assert!(s.starts_with("DOWN"), "{node}");
    admin(&cluster, b, &["update", "NodeName=node02", "State=RESUME"]);
    let (s, node) = state(admin(&cluster, b, &["show", "node", "node02", "-o"]));
    assert!(s.starts_with("IDLE"), "{node}");

    std::fs::write(d.join("release"), "").unwrap();
    wait_state(&c, long, &["COMPLETED"], T).await;
    cluster.shutdown().await;
}
