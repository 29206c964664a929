//! Node failure end to end: an agent cut off from the controllers (as by a network partition)
//! has its `--requeue` jobs killed when its lease runs out, the leader declares its node DOWN after
//! `node_timeout`, a `--requeue` job starts again elsewhere only after its first copy is dead,
//! and the node comes back when its agent reconnects. A new leader does not mark nodes down.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use quorum_dev::cluster::{node_name, DevOptions};

const T: Duration = Duration::from_secs(30);
const NODE_TIMEOUT: Duration = Duration::from_secs(3);
const LEASE: Duration = Duration::from_secs(2);

/// A job that, on every node it runs on (`--every-node`), records its process group and then appends
/// "<node> <nanoseconds>" to `ticks` every 20 ms until killed (or for ten minutes, should a
/// failed test leave it behind).
fn ticking(dir: &Path, name: &str, nodes: u32, requeue: bool) -> quorum_proto::api::JobSpec {
    let script = format!(
        "n=$SLURMD_NODENAME; echo $$ > {name}-pgid-$n; while [ $SECONDS -lt 600 ]; do echo \"$n $(date +%s%N)\" >> {name}-ticks; sleep 0.02; done"
    );
    let mut s = spec(&["bash", "-c", &script], dir);
    s.name = name.into();
    s.nodes = nodes;
    s.ntasks = nodes;
    s.every_node = true;
    s.requeue = requeue;
    s
}

/// Each node's first and last tick, in nanoseconds since the epoch.
fn tick_spans(path: &Path) -> BTreeMap<String, (u128, u128)> {
    let mut spans = BTreeMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let mut parts = line.split_whitespace();
        let (Some(node), Some(Ok(t))) = (parts.next(), parts.next().map(str::parse::<u128>)) else { continue };
        let span = spans.entry(node.to_string()).or_insert((t, t));
        span.0 = span.0.min(t);
        span.1 = span.1.max(t);
    }
    spans
}

fn pgid(dir: &Path, name: &str, node: &str) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!("{name}-pgid-{node}"))).ok()?.trim().parse().ok()
}

fn now_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_goes_down_its_requeued_job_restarts_elsewhere_after_the_lease_killed_it() {
    if std::env::var("TEST_LOG").is_ok() {
        let _ = tracing_subscriber::fmt().with_env_filter("info,openraft=error").with_test_writer().try_init();
    }
    let opts = DevOptions { node_timeout: NODE_TIMEOUT, agent_lease: LEASE, ..DevOptions::for_tests() };
    let mut cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();

    // A 2-node job without --requeue, then a 1-node job with it.
    let wide = submit(&c, ticking(dir.path(), "wide", 2, false)).await;
    wait_state(&c, wide, &["RUNNING"], T).await;
    let one = submit(&c, ticking(dir.path(), "one", 1, true)).await;
    let first = wait_state(&c, one, &["RUNNING"], T).await;
    let victim = first.nodelist.clone();
    let (vi, other) = if victim == node_name(0) { (0, node_name(1)) } else { (1, node_name(0)) };
    let old_group =
        wait_for(T, "the first copy to record its process group", || async { pgid(dir.path(), "one", &victim) }).await;
    let wide_group =
        wait_for(T, "the wide job's rank on the healthy node", || async { pgid(dir.path(), "wide", &other) }).await;

    let cut_ns = now_ns();
    let cut = Instant::now();
    cluster.isolate_agent(vi, true);

    // The node is declared DOWN, no sooner than node_timeout after the last heartbeat it sent
    // (one heartbeat period before the cut at most).
    let down = wait_for(T, "the silent node to go DOWN", || async {
        nodes(&c).await.into_iter().find(|n| n.name == victim && n.state == "down")
    })
    .await;
    let down_after = cut.elapsed();
    assert!(down_after >= NODE_TIMEOUT - Duration::from_secs(1), "DOWN after {down_after:?}");
    assert!(down.reason.contains("not responding"), "{down:?}");

    // The wide job ends NODE_FAIL, and its rank on the healthy node is killed.
    wait_state(&c, wide, &["NODE_FAIL"], T).await;
    wait_for(T, "the wide job's rank on the healthy node to be killed", || async {
        (!group_alive(wide_group)).then_some(())
    })
    .await;

    // The requeued job runs again, on the other node, as its first restart.
    let again = wait_for(T, "the requeued job to run on the other node", || async {
        let j = job(&c, one).await;
        (j.state == "RUNNING" && j.nodelist == other).then_some(j)
    })
    .await;
    assert_eq!(again.requeues, 1, "{again:?}");
    assert!(again.alloc_index > first.alloc_index, "a newer fencing token: {again:?} {first:?}");

    // The first copy was killed by the lease, before the second started: the intervals of
    // ticks on the two nodes do not overlap.
    assert!(
        !group_alive(old_group),
        "the first copy still runs {:?} after the cut; ticks {:?}",
        cut.elapsed(),
        tick_spans(&dir.path().join("one-ticks"))
    );
    wait_for(T, "the second copy to tick", || async { tick_spans(&dir.path().join("one-ticks")).get(&other).copied() })
        .await;
    let spans = tick_spans(&dir.path().join("one-ticks"));
    let (old, new) = (spans[&victim], spans[&other]);
    assert!(old.1 < new.0, "the copies overlapped: first {old:?}, second {new:?}");
    assert!(old.1 > cut_ns, "the first copy ran on after the cut until its lease ran out");
    let lease_ns = LEASE.as_nanos() + Duration::from_millis(1500).as_nanos();
    assert!(old.1 - cut_ns < lease_ns, "the first copy outlived its lease by far: {}", old.1 - cut_ns);

    // The agent comes back: its node is up again and nothing of the old job runs there.
    cluster.isolate_agent(vi, false);
    wait_for(T, "the node to come back", || async {
        nodes(&c).await.into_iter().find(|n| n.name == victim && n.state != "down" && n.connected)
    })
    .await;
    assert_eq!(job(&c, one).await.nodelist, other, "the requeued job was not moved again");

    // A new leader gives every node a full node_timeout of grace: killing the leader marks
    // no node DOWN and no job lost.
    cancel(&c, one).await;
    wait_state(&c, one, &["CANCELLED"], T).await;
    let leader = cluster.leader().expect("a leader");
    cluster.stop_controller(leader).await;
    let c2 = client(&cluster.addrs);
    wait_for(T, "a new leader", || async { cluster.leader() }).await;
    let until = Instant::now() + NODE_TIMEOUT * 2;
    while Instant::now() < until {
        if let Ok(r) =
            c2.call(|mut cl| async move { cl.list_nodes(quorum_proto::api::ListNodesRequest::default()).await }).await
        {
            assert!(r.nodes.iter().all(|n| n.state != "down"), "a failover marked a node down: {:?}", r.nodes);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.shutdown().await;
}

/// The node timeout and lease of the tests with real agent processes, short unless
/// `QUORUM_TEST_NODE_TIMEOUT_MS` and `QUORUM_TEST_LEASE_MS` say (`benches/RESULTS.md` has a run
/// with the defaults, 30 s and 20 s), and how long to wait for each step.
fn timeouts() -> (Duration, Duration, Duration) {
    let ms = |var: &str, default: Duration| {
        std::env::var(var).ok().and_then(|v| v.parse().ok()).map_or(default, Duration::from_millis)
    };
    let node_timeout = ms("QUORUM_TEST_NODE_TIMEOUT_MS", NODE_TIMEOUT);
    (node_timeout, ms("QUORUM_TEST_LEASE_MS", LEASE), T.max(node_timeout * 3))
}

/// The last tick anywhere in `path`, in nanoseconds since the epoch.
fn last_tick(path: &Path) -> Option<u128> {
    tick_spans(path).values().map(|s| s.1).max()
}

/// The first case, with real agent processes: the agent running a `--requeue` job is
/// stopped (SIGSTOP) past node_timeout. The job's supervisor kills it when the lease runs out,
/// though the agent never runs again meanwhile, so the copy the leader then starts elsewhere
/// never overlaps it. A job that may not run elsewhere keeps running on the paused node until
/// the agent reconnects and learns its node went DOWN, when it is killed, as Slurm does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_agents_requeue_job_is_stopped_by_its_supervisor_and_never_runs_twice() {
    let (node_timeout, lease, t) = timeouts();
    let opts =
        DevOptions { node_timeout, agent_lease: lease, agent_binary: Some(agent_binary()), ..DevOptions::for_tests() };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();

    let wide = submit(&c, ticking(dir.path(), "wide", 2, false)).await;
    wait_state(&c, wide, &["RUNNING"], t).await;
    let one = submit(&c, ticking(dir.path(), "one", 1, true)).await;
    let first = wait_state(&c, one, &["RUNNING"], t).await;
    let victim = first.nodelist.clone();
    let (vi, other) = if victim == node_name(0) { (0, node_name(1)) } else { (1, node_name(0)) };
    let old_group =
        wait_for(t, "the first copy to record its process group", || async { pgid(dir.path(), "one", &victim) }).await;
    let wide_here =
        wait_for(t, "the wide job's rank on the paused node", || async { pgid(dir.path(), "wide", &victim) }).await;

    let cut_ns = now_ns();
    let cut = Instant::now();
    cluster.pause_agent(vi, true);

    // With the agent stopped, the supervisor alone kills the --requeue job when the lease ends.
    wait_for(t, "the supervisor to kill the --requeue job", || async { (!group_alive(old_group)).then_some(()) }).await;
    let killed_after = cut.elapsed();
    assert!(killed_after < lease + Duration::from_millis(1500), "killed {killed_after:?} after the pause");

    // The node goes DOWN; the job runs again on the other node, after the first copy ended.
    wait_for(t, "the paused node to go DOWN", || async {
        nodes(&c).await.into_iter().find(|n| n.name == victim && n.state == "down")
    })
    .await;
    let again = wait_for(t, "the requeued job to run on the other node", || async {
        let j = job(&c, one).await;
        (j.state == "RUNNING" && j.nodelist == other).then_some(j)
    })
    .await;
    assert_eq!(again.requeues, 1, "{again:?}");
    wait_for(t, "the second copy to tick", || async { tick_spans(&dir.path().join("one-ticks")).get(&other).copied() })
        .await;
    let spans = tick_spans(&dir.path().join("one-ticks"));
    let (old, new) = (spans[&victim], spans[&other]);
    assert!(old.1 < new.0, "the copies overlapped: first {old:?}, second {new:?}");
    assert!(old.1 > cut_ns, "the first copy ran on after the pause until its lease ran out");
    eprintln!(
        "paused agent: the first copy's last tick {:.2}s after the pause, the second's first {:.2}s after; overlap 0 s",
        (old.1 - cut_ns) as f64 / 1e9,
        (new.0 - cut_ns) as f64 / 1e9
    );

    // The wide job (no --requeue) ended NODE_FAIL with its node, but its rank on the paused
    // node is not leased: it runs until the agent is back and is told to kill it.
    wait_state(&c, wide, &["NODE_FAIL"], t).await;
    assert!(group_alive(wide_here), "a job without --requeue was killed by the lease");
    cluster.pause_agent(vi, false);
    wait_for(t, "the DOWN node's stray rank to be killed on reconnection", || async {
        (!group_alive(wide_here)).then_some(())
    })
    .await;
    assert_eq!(job(&c, one).await.nodelist, other, "the requeued job was not moved again");
    cluster.shutdown().await;
}

/// The second case: every controller is down for two minutes, far past the lease and
/// node_timeout. Jobs that may not run elsewhere go on, and are recorded as they really ended
/// (still running; exited with their code meanwhile); the `--requeue` job stopped by its lease
/// runs again. No node is marked DOWN when the controllers come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_that_may_not_run_elsewhere_survive_every_controller_down_for_two_minutes() {
    let (node_timeout, lease, t) = timeouts();
    let outage =
        Duration::from_secs(std::env::var("QUORUM_TEST_OUTAGE_S").ok().and_then(|s| s.parse().ok()).unwrap_or(120));
    let opts =
        DevOptions { node_timeout, agent_lease: lease, agent_binary: Some(agent_binary()), ..DevOptions::for_tests() };
    let mut cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();

    let stay = submit(&c, ticking(dir.path(), "stay", 2, false)).await;
    let mut ends = spec(&["bash", "-c", "sleep 5; exit 3"], dir.path());
    ends.name = "ends".into();
    let leased = submit(&c, ticking(dir.path(), "leased", 1, true)).await;
    let before = wait_state(&c, stay, &["RUNNING"], t).await;
    let leased_first = wait_state(&c, leased, &["RUNNING"], t).await;
    let ends = submit(&c, ends).await;
    wait_state(&c, ends, &["RUNNING"], t).await;
    let stay_groups: Vec<i32> = rank_groups(dir.path(), "stay", &[node_name(0), node_name(1)]).await;
    let leased_group = wait_for(t, "the --requeue job's process group", || async {
        pgid(dir.path(), "leased", &leased_first.nodelist)
    })
    .await;

    let cut = Instant::now();
    for i in 0..3 {
        cluster.stop_controller(i).await;
    }
    // The --requeue job stops with its lease; the others run on, and one ends meanwhile.
    wait_for(t, "the --requeue job to stop with its lease", || async { (!group_alive(leased_group)).then_some(()) })
        .await;
    while cut.elapsed() < outage {
        for g in &stay_groups {
            assert!(group_alive(*g), "a job without --requeue died {:?} into the outage", cut.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ticking_at_end = last_tick(&dir.path().join("stay-ticks")).unwrap();
    assert!(now_ns() - ticking_at_end < 1_000_000_000, "the job stopped ticking during the outage");

    for i in 0..3 {
        cluster.restart_controller(i).await.unwrap();
    }
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    // Reconciled as they really ended: still running, with the same allocation; exited 3.
    let after = wait_state(&c, stay, &["RUNNING"], t).await;
    assert_eq!((after.alloc_index, after.requeues), (before.alloc_index, 0), "{after:?}");
    let ended = wait_state(&c, ends, &["FAILED"], t).await;
    assert_eq!(ended.exit_code, 3, "{ended:?}");
    let again = wait_for(t, "the --requeue job to run again", || async {
        let j = job(&c, leased).await;
        (j.state == "RUNNING" && j.requeues == 1).then_some(j)
    })
    .await;
    assert!(again.alloc_index > leased_first.alloc_index);
    for g in &stay_groups {
        assert!(group_alive(*g), "a job without --requeue was killed when the controllers came back");
    }
    assert!(nodes(&c).await.iter().all(|n| n.state != "down"), "a node was marked DOWN after the outage");
    eprintln!(
        "controllers down {:.0}s: {} job ranks without --requeue alive throughout, 1 exited meanwhile and recorded FAILED (exit 3), the --requeue job stopped by its lease and ran again",
        outage.as_secs_f64(),
        stay_groups.len()
    );
    cluster.shutdown().await;
}

/// The process groups of job `name`'s ranks on `nodes`, once each has recorded its own.
async fn rank_groups(dir: &Path, name: &str, nodes: &[String]) -> Vec<i32> {
    let mut groups = Vec::new();
    for node in nodes {
        groups.push(wait_for(T, "a rank's process group", || async { pgid(dir, name, node) }).await);
    }
    groups
}

/// A restarted agent takes the lease over for the `--requeue` jobs it finds again: their
/// supervisors read the deadline it renews, so the job runs on far past the lease the old
/// agent last gave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_renews_the_lease_of_the_requeue_jobs_it_finds_again() {
    // Longer than the other tests': two agent restarts must fit in one lease and within the node
    // timeout on a loaded machine, or the job is rightly killed and requeued. What is tested is
    // that it lives on past any deadline the old agent gave it, which two leases prove.
    let (lease, node_timeout) = (Duration::from_secs(4), Duration::from_secs(8));
    let opts = DevOptions { node_timeout, agent_lease: lease, ..DevOptions::for_tests() };
    let mut cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let one = submit(&c, ticking(dir.path(), "one", 1, true)).await;
    let first = wait_state(&c, one, &["RUNNING"], T).await;
    let node = first.nodelist.clone();
    let i = if node == node_name(0) { 0 } else { 1 };
    let group = wait_for(T, "the job's process group", || async { pgid(dir.path(), "one", &node) }).await;
    for _ in 0..2 {
        let config = cluster.agent_config(i);
        cluster.restart_agent(i, config).await;
    }
    tokio::time::sleep(lease * 2).await;
    assert!(group_alive(group), "the job died after its agent restarted: its lease was not renewed");
    let j = job(&c, one).await;
    assert_eq!((j.state.as_str(), j.requeues, j.alloc_index), ("RUNNING", 0, first.alloc_index), "{j:?}");
    let last = last_tick(&dir.path().join("one-ticks")).unwrap();
    assert!(now_ns() - last < 2_000_000_000, "the job stopped ticking");
    cluster.shutdown().await;
}

/// A second agent under the node's name (a copy started by mistake elsewhere) takes the session
/// while the first is cut off: the jobs the first runs are never launched on the second. A lease
/// later, the one without `--requeue` ends NODE_FAIL (its first copy runs on, cut off, and is
/// killed when its agent comes back); the `--requeue` one, which its supervisor stopped with the
/// lease, runs again, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_a_replaced_session_are_ended_not_launched_twice() {
    let opts = DevOptions { agents: 1, node_timeout: NODE_TIMEOUT, agent_lease: LEASE, ..DevOptions::for_tests() };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let stay = submit(&c, ticking(dir.path(), "stay", 1, false)).await;
    let again = submit(&c, ticking(dir.path(), "again", 1, true)).await;
    let first = wait_state(&c, again, &["RUNNING"], T).await;
    wait_state(&c, stay, &["RUNNING"], T).await;
    let node = node_name(0);
    let stay_group = wait_for(T, "the job's process group", || async { pgid(dir.path(), "stay", &node) }).await;
    let again_group = wait_for(T, "the job's process group", || async { pgid(dir.path(), "again", &node) }).await;

    cluster.isolate_agent(0, true);
    let twin = Twin::start(&cluster, 0);

    let ended = wait_state(&c, stay, &["NODE_FAIL"], T).await;
    assert!(group_alive(stay_group), "the job without --requeue was killed on its cut-off agent");
    let rerun = wait_for(T, "the --requeue job to run again", || async {
        let j = job(&c, again).await;
        (j.state == "RUNNING" && j.requeues == 1).then_some(j)
    })
    .await;
    assert!(rerun.alloc_index > first.alloc_index);
    assert!(!group_alive(again_group), "the first copy of the --requeue job still runs");
    assert!(
        twin.running().iter().all(|(id, token)| *id == again && *token == rerun.alloc_index),
        "the twin was sent a job of the replaced session: {:?} ({ended:?})",
        twin.running()
    );

    // The first agent comes back: what it still runs of the ended job is killed.
    twin.stop().await;
    cluster.isolate_agent(0, false);
    wait_for(T, "the ended job's process to be killed", || async { (!group_alive(stay_group)).then_some(()) }).await;
    cluster.shutdown().await;
}
