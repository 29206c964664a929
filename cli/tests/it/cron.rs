//! Recurring jobs on a cluster with agents: an entry that fires every three seconds keeps firing
//! on time through a leader failover, each firing's job runs once (each writes the firing it
//! ran for), and an entry removed fires no more.

use crate::common;

use std::time::Duration;

use common::*;
use quorum_dev::cluster::DevOptions;
use quorum_proto::api;

const T: Duration = Duration::from_secs(30);

async fn entries(c: &quorum_client::client::Client) -> Vec<api::CronInfo> {
    let req = api::ListCronRequest::default();
    c.call(|mut cl| async move { cl.list_cron(req).await }).await.map(|r| r.entries).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_entry_fires_on_time_through_a_leader_failover_and_never_twice() {
    ensure_user("cron-user");
    let mut cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let env = cluster.controllers_env();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let log = dir.path().join("fired");
    let user = |args: &[&str]| quorum_as(&env, Some("cron-user"), dir.path(), args);

    let bad = user(&["cron", "add", "61 * * * *", "--", "true"]);
    assert!(bad.stderr.contains("invalid minute field '61'"), "{bad:?}");
    let never = user(&["cron", "add", "0 0 30 2 *", "--", "true"]);
    assert!(never.stderr.contains("never fires"), "{never:?}");
    let script = format!("echo $QUORUM_CRON_ID $QUORUM_CRON_TIME $SLURM_JOB_ID >> {}", log.display());
    let added = user(&["cron", "add", "*/3 * * * * *", "-J", "tick", "--", "sh", "-c", &script]).success();
    assert!(added.starts_with("Added cron entry 1: next at "), "{added}");
    let listed = user(&["cron", "list"]).success();
    assert!(listed.lines().nth(1).is_some_and(|l| l.starts_with("1 ") && l.contains("*/3 * * * * *")), "{listed}");

    // Two firings under the first leader, then it goes; three more under the next.
    wait_for(T, "two firings", || async { entries(&c).await.first().filter(|e| e.fired >= 2).map(|_| ()) }).await;
    let first = cluster.leader().expect("a leader");
    cluster.stop_controller(first).await;
    let survivors: Vec<String> =
        cluster.addrs.iter().enumerate().filter(|(i, _)| *i != first).map(|(_, a)| a.clone()).collect();
    let c = client(&survivors);
    let before = wait_for(T, "a new leader's answer", || async { entries(&c).await.first().map(|e| e.fired) }).await;
    let fired = wait_for(T, "three more firings", || async {
        entries(&c).await.first().filter(|e| e.fired >= before + 3).map(|e| e.fired)
    })
    .await;
    user(&["cron", "remove", "1"]).success();
    let removed_at = now_ms();

    // Every firing's job ran, once, each for a firing of its own, three seconds apart.
    let lines = wait_for(T, "every firing's job to write", || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<(u64, u64, u64)> = text
            .lines()
            .map(|l| {
                let f: Vec<u64> = l.split_whitespace().map(|w| w.parse().unwrap()).collect();
                (f[0], f[1], f[2])
            })
            .collect();
        (lines.len() as u64 >= fired).then_some(lines)
    })
    .await;
    let mut times: Vec<u64> = lines
        .iter()
        .map(|(id, t, _)| {
            assert_eq!(*id, 1);
            *t
        })
        .collect();
    times.sort_unstable();
    let distinct = times.windows(2).all(|w| w[1] > w[0]);
    assert!(distinct, "a firing ran twice: {lines:?}");
    assert!(times.iter().all(|t| t.is_multiple_of(3)), "each on the schedule: {times:?}");
    let jobs: std::collections::BTreeSet<u64> = lines.iter().map(|(_, _, j)| *j).collect();
    assert_eq!(jobs.len(), lines.len(), "one job per firing: {lines:?}");
    // Removed, it fires no more.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    let late: Vec<&str> = text
        .lines()
        .filter(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1000 > removed_at + 500)
        .collect();
    assert!(late.is_empty(), "fired after its removal: {late:?}");
    assert!(user(&["cron", "list"]).success().lines().count() <= 1, "the entry is gone");
    cluster.shutdown().await;
}
