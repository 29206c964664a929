//! The trunk end to end: three replicas with RocksDB in temporary directories, agents running
//! real processes, real gRPC on loopback.

use crate::common;

use std::time::Duration;

use common::*;
use quorum_dev::cluster::DevOptions;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_complete_fail_and_record_exit_codes() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();

    let ok = submit(
        &c,
        spec(&["bash", "-c", "echo hello > result.txt; echo \"id=$QUORUM_JOB_ID slurm=$SLURM_JOB_ID\""], dir.path()),
    )
    .await;
    let j = wait_state(&c, ok, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    assert!(j.has_exit_code);
    assert_eq!(j.exit_code, 0);
    assert_eq!(j.reason, "", "a completed job shows no reason (Reason=None)");
    assert_eq!(std::fs::read_to_string(dir.path().join("result.txt")).unwrap(), "hello\n");
    let out = std::fs::read_to_string(dir.path().join(format!("quorum-{ok}.out"))).unwrap();
    assert_eq!(out, format!("id={ok} slurm={ok}\n"));

    let mut failing = spec(&["bash", "-c", "echo oops >&2; exit 3"], dir.path());
    failing.name = "fails".into();
    failing.stdout = "%x-%j.log".into();
    let bad = submit(&c, failing).await;
    let j = wait_state(&c, bad, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "FAILED");
    assert_eq!(j.exit_code, 3);
    // Why it ended, as Slurm's controller says it.
    assert_eq!(j.reason, "NonZeroExitCode");
    let log = std::fs::read_to_string(dir.path().join(format!("fails-{bad}.log"))).unwrap();
    assert_eq!(log, "oops\n");

    let missing = submit(&c, spec(&["/no/such/program"], dir.path())).await;
    let j = wait_state(&c, missing, &["COMPLETED", "FAILED"], T).await;
    assert_eq!((j.state.as_str(), j.reason.as_str()), ("FAILED", "JobLaunchFailure"));
    let out = std::fs::read_to_string(dir.path().join(format!("quorum-{missing}.out"))).unwrap();
    assert!(out.contains("cannot run '/no/such/program'"), "{out}");

    // Resources are free again.
    let nodes = nodes(&c).await;
    assert!(nodes.iter().all(|n| n.alloc_cpus == 0 && n.state == "idle"), "{nodes:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_every_process_of_the_job() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    // A shell that ignores SIGTERM with two children: only the group kill gets them all.
    let script = "trap '' TERM; echo $$ > pgid; sleep 1000 & sleep 1000 & wait";
    let id = submit(&c, spec(&["bash", "-c", script], dir.path())).await;
    wait_state(&c, id, &["RUNNING"], T).await;
    let pgid: i32 = wait_for(T, "the job to write its pgid", || async {
        std::fs::read_to_string(dir.path().join("pgid")).ok()?.trim().parse().ok()
    })
    .await;
    assert!(group_alive(pgid));
    let r = cancel(&c, id).await;
    assert!(r.results[0].ok && r.results[0].was_running, "{:?}", r.results);
    let j = wait_state(&c, id, &["CANCELLED", "COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "CANCELLED");
    wait_for(Duration::from_secs(5), "every process of the job to be gone", || async {
        (!group_alive(pgid)).then_some(())
    })
    .await;

    // Cancelling it again is refused with the reason.
    let r = cancel(&c, id).await;
    assert!(!r.results[0].ok && r.results[0].error.contains("already finished"), "{:?}", r.results);

    // A pending job's cancel says it was not running: it is CANCELLED at once.
    let mut held = spec(&["true"], dir.path());
    held.hold = true;
    let pending = submit(&c, held).await;
    let r = cancel(&c, pending).await;
    assert!(r.results[0].ok && !r.results[0].was_running, "{:?}", r.results);
    assert_eq!(job(&c, pending).await.state, "CANCELLED");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_its_time_limit_ends_timeout() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(&["sleep", "600"], dir.path());
    s.time_limit_s = 2;
    let id = submit(&c, s).await;
    let j = wait_state(&c, id, &["TIMEOUT", "COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!((j.state.as_str(), j.reason.as_str()), ("TIMEOUT", "TimeLimit"));
    let ran = (j.end_time_ms - j.start_time_ms) as f64 / 1000.0;
    assert!(ran >= 2.0, "ended after {ran}s, before its 2s limit");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_stop_loses_nothing_and_a_new_leader_runs_jobs() {
    let mut cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(submit(&c, spec(&["bash", "-c", &format!("echo {i}")], dir.path())).await);
    }
    let old = cluster.leader().expect("a leader");
    cluster.stop_controller(old).await;
    wait_for(T, "a new leader", || async { cluster.leader().filter(|l| *l != old) }).await;
    for id in &ids {
        let j = job(&c, *id).await;
        assert_eq!(j.id, *id);
    }
    let after = submit(&c, spec(&["bash", "-c", "echo after > after.txt"], dir.path())).await;
    assert!(after > *ids.last().unwrap());
    let j = wait_state(&c, after, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "COMPLETED");
    assert_eq!(std::fs::read_to_string(dir.path().join("after.txt")).unwrap(), "after\n");
    for id in &ids {
        wait_state(&c, *id, &["COMPLETED"], T).await;
    }
    assert_eq!(all_jobs(&c).await.len(), 11, "no job lost, none doubled");
    cluster.shutdown().await;
}

/// Waits until replica `i` has applied what the leader has, then compares state digests.
async fn assert_caught_up(cluster: &quorum_dev::cluster::DevCluster, i: usize) {
    let (idx, digest) = wait_for(T, "the replica to catch up", || async {
        let leader = cluster.controller(cluster.leader()?)?;
        let follower = cluster.controller(i)?;
        let l = leader.replica.shared.read();
        let f = follower.replica.shared.read();
        (l.applied_index() == f.applied_index())
            .then(|| (l.applied_index(), (quorum_state::digest(&l.state), quorum_state::digest(&f.state))))
    })
    .await;
    assert_eq!(digest.0, digest.1, "replicas at applied index {idx} disagree");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_follower_catches_up_by_log_and_by_snapshot() {
    let opts = DevOptions { snapshot_every: 20, snapshot_keep_logs: 0, ..DevOptions::for_tests() };
    let mut cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let leader = cluster.leader().unwrap();
    let follower = (leader + 1) % 3;

    // Behind by a few entries: caught up from the log.
    cluster.stop_controller(follower).await;
    let first = submit(&c, spec(&["true"], dir.path())).await;
    cluster.restart_controller(follower).await.unwrap();
    assert_caught_up(&cluster, follower).await;

    // Behind by more than a snapshot with the log purged behind it: caught up by snapshot.
    cluster.stop_controller(follower).await;
    let mut last = first;
    for _ in 0..40 {
        last = submit(&c, spec(&["true"], dir.path())).await;
    }
    wait_state(&c, last, &["COMPLETED"], T).await;
    let leader_snap = cluster.controller(cluster.leader().unwrap()).unwrap().replica.raft.metrics().borrow().snapshot;
    let leader_snap = leader_snap.expect("the leader has built a snapshot");
    cluster.restart_controller(follower).await.unwrap();
    assert_caught_up(&cluster, follower).await;
    let f = cluster.controller(follower).unwrap();
    assert!(f.replica.shared.read().state.jobs.contains_key(&last));
    // The leader kept no log behind its snapshot, so the follower can only have caught up by
    // installing it (its own snapshots stopped where it was stopped).
    let installed = f.replica.raft.metrics().borrow().snapshot.expect("a snapshot on the follower");
    assert!(installed.index >= leader_snap.index, "follower snapshot {installed:?} < leader's {leader_snap:?}");

    // `quorum admin digest` while submits go on: every replica, the one that installed the
    // snapshot included, has the same state at the digest point. (With a snapshot every 20
    // entries and no log kept behind it, a replica may install a snapshot past a digest point
    // and say so instead of answering; the operator runs it again, and so does this test.)
    let load = {
        let c = client(&cluster.addrs);
        let dir = dir.path().to_path_buf();
        tokio::spawn(async move {
            for _ in 0..20 {
                submit(&c, spec(&["true"], &dir)).await;
            }
        })
    };
    let answered_by = |n: usize| {
        let c = &c;
        move || async move {
            let report = quorum_client::digest::collect(c).await.expect("digest");
            assert!(report.agree(), "{}", report.table());
            assert_eq!(report.replicas.len(), 3, "{}", report.table());
            (report.replicas.len() - report.missing() == n).then_some(report)
        }
    };
    for _ in 0..3 {
        wait_for(T, "every replica to answer a digest point", answered_by(3)).await;
    }
    load.await.unwrap();
    // With a replica down, the others still answer and the missing one is named.
    cluster.stop_controller(follower).await;
    let report = wait_for(T, "the two running replicas to answer", answered_by(2)).await;
    let missing = report.replicas.iter().find(|r| r.digest.is_none()).unwrap();
    assert_eq!(missing.address, cluster.addrs[follower], "{}", report.table());
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submits_to_a_follower_work_and_retries_make_one_job() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let leader = cluster.leader().unwrap();
    let follower = (leader + 1) % 3;
    let only_follower = client(&[cluster.addrs[follower].clone()]);
    let first = submit_with_id(&only_follower, spec(&["true"], dir.path()), "req-1").await.unwrap();
    assert!(!first.duplicate);
    let again = submit_with_id(&only_follower, spec(&["true"], dir.path()), "req-1").await.unwrap();
    assert_eq!(again.job_id, first.job_id);
    assert!(again.duplicate);
    let via_leader = submit_with_id(&c, spec(&["true"], dir.path()), "req-1").await.unwrap();
    assert_eq!(via_leader.job_id, first.job_id);
    assert_eq!(all_jobs(&c).await.len(), 1);
    let j = wait_state(&only_follower, first.job_id, &["COMPLETED"], T).await;
    assert_eq!(j.exit_code, 0);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_default_reads_refuse_and_stale_reads_answer_with_their_index() {
    let mut cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let id = submit(&c, spec(&["true"], dir.path())).await;
    wait_state(&c, id, &["COMPLETED"], T).await;
    // Let every replica apply it, then take the two followers away: no quorum is left, and the
    // survivor is the leader itself, which has the job and answers without forwarding.
    let survivor = cluster.leader().unwrap();
    assert_caught_up(&cluster, survivor).await;
    for i in (0..3).filter(|i| *i != survivor) {
        cluster.stop_controller(i).await;
    }
    let mut alone = client(&[cluster.addrs[survivor].clone()]);
    alone.deadline = Duration::from_secs(2);

    // A default read cannot confirm that nothing newer was committed elsewhere: refused.
    let refused = alone
        .call(|mut cl| async move {
            cl.get_job(quorum_proto::api::GetJobRequest { job_id: id, stale: false, array_task_id: None }).await
        })
        .await;
    let refused = refused.expect_err("a linearizable read answered without a quorum");
    assert_ne!(refused.code(), tonic::Code::NotFound, "{refused:?}");
    // A stale read answers from the survivor, saying how far it had applied.
    let stale = alone
        .call(|mut cl| async move {
            cl.get_job(quorum_proto::api::GetJobRequest { job_id: id, stale: true, array_task_id: None }).await
        })
        .await
        .expect("stale read");
    assert_eq!(stale.job.unwrap().state, "COMPLETED");
    let applied = cluster.controller(survivor).unwrap().replica.shared.read().applied_index();
    assert_eq!(stale.applied_index, applied);
    let nodes = alone
        .call(|mut cl| async move { cl.list_nodes(quorum_proto::api::ListNodesRequest { stale: true }).await })
        .await
        .expect("stale node list");
    assert_eq!(nodes.nodes.len(), 2);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_is_handed_over_on_request_and_when_the_leader_stops() {
    let mut cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let transfer = |user: &'static str, to: u64| {
        let c = client_as(c.addrs(), user);
        async move {
            let req = quorum_proto::api::TransferLeaderRequest { user: user.into(), to };
            c.call(|mut cl| {
                let req = req.clone();
                async move { cl.transfer_leader(req).await }
            })
            .await
        }
    };
    let leader = cluster.leader().unwrap();
    let target = (leader + 1) % 3;
    let denied = transfer("alice", target as u64 + 1).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    let to_self = transfer("root", leader as u64 + 1).await.unwrap_err();
    assert!(to_self.message().contains("already leads"), "{to_self:?}");
    let unknown = transfer("root", 7).await.unwrap_err();
    assert!(unknown.message().contains("replica 7 is not a voter"), "{unknown:?}");

    let r = transfer("root", target as u64 + 1).await.expect("transfer");
    assert_eq!(r.leader, target as u64 + 1);
    wait_for(T, "the target to lead", || async { (cluster.leader() == Some(target)).then_some(()) }).await;
    let id = submit(&c, spec(&["true"], dir.path())).await;
    wait_state(&c, id, &["COMPLETED"], T).await;

    // A leader that stops hands over first: another replica leads by the time it is gone.
    cluster.stop_controller(target).await;
    let next = cluster.leader();
    assert!(next.is_some_and(|l| l != target), "no leader right after the old one stopped");
    let id = submit(&c, spec(&["true"], dir.path())).await;
    wait_state(&c, id, &["COMPLETED"], T).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_commits_nothing_serves_no_stale_read_and_follows_after_healing() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let before = submit(&c, spec(&["true"], dir.path())).await;
    let old = cluster.leader().unwrap();
    let majority: Vec<String> = (0..3).filter(|i| *i != old).map(|i| cluster.addrs[i].clone()).collect();
    let mut via_old = client(&[cluster.addrs[old].clone()]);
    via_old.deadline = Duration::from_secs(2);
    let via_majority = client(&majority);

    cluster.isolate_controller(old, true);
    // The majority elects a new leader and goes on accepting writes.
    let new = wait_for(T, "a new leader among the majority", || async {
        (0..3).filter(|i| *i != old).find(|i| cluster.controller(*i).is_some_and(|c| c.replica.is_leader()))
    })
    .await;
    let during = submit(&via_majority, spec(&["true"], dir.path())).await;
    // The isolated replica cannot commit: a write sent only to it is never acknowledged.
    let stuck = submit_with_id(&via_old, spec(&["true"], dir.path()), "sent-to-the-isolated-leader").await;
    assert!(stuck.is_err(), "the isolated leader acknowledged a write: {stuck:?}");
    // Nor can it answer a default read with state older than an acknowledged write: asked for
    // the job it has, it would answer PENDING, or whatever it last knew.
    let read = via_old
        .call(|mut cl| async move {
            cl.get_job(quorum_proto::api::GetJobRequest { job_id: before, stale: false, array_task_id: None }).await
        })
        .await;
    // (It cannot confirm its leadership, so it answers nothing rather than its old state.)
    let read = read.expect_err("the isolated replica answered a linearizable read");
    assert_ne!(read.code(), tonic::Code::NotFound, "{read:?}");
    // The agents leave it: it answers no heartbeat (which would extend their leases while the
    // majority's leader counts their nodes silent), and they find the new leader.
    wait_for(T, "both agents connected to the new leader", || async {
        let nodes = via_majority
            .call(|mut cl| async move { cl.list_nodes(quorum_proto::api::ListNodesRequest::default()).await })
            .await
            .ok()?
            .nodes;
        (nodes.len() == 2 && nodes.iter().all(|n| n.connected)).then_some(())
    })
    .await;

    // Healed, the old leader follows the new one and has every acknowledged job.
    cluster.isolate_controller(old, false);
    wait_for(T, "the old leader to follow and catch up", || async {
        let o = cluster.controller(old)?;
        let n = cluster.controller(new)?;
        let following = o.replica.raft.metrics().borrow().current_leader == Some(new as u64 + 1);
        let applied = o.replica.shared.read().applied_index() >= n.replica.shared.read().applied_index();
        (following && applied).then_some(())
    })
    .await;
    let jobs = all_jobs(&c).await;
    for id in [before, during] {
        assert_eq!(jobs.iter().filter(|j| j.id == id).count(), 1, "job {id} lost or doubled");
    }
    let report = wait_for(T, "every replica to answer the digest", || async {
        let r = quorum_client::digest::collect(&c).await.ok()?;
        (r.missing() == 0).then_some(r)
    })
    .await;
    assert!(report.agree(), "{}", report.table());
    cluster.shutdown().await;
}

async fn set_drained(
    c: &quorum_client::client::Client,
    user: &str,
    nodes: &[&str],
    reason: Option<&str>,
) -> Result<quorum_proto::api::AdminResponse, tonic::Status> {
    let req = quorum_proto::api::SetNodesDrainedRequest {
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        drain: reason.is_some(),
        reason: reason.unwrap_or_default().into(),
        user: user.into(),
    };
    let c = client_as(c.addrs(), user);
    c.call(|mut cl| {
        let req = req.clone();
        async move { cl.set_nodes_drained(req).await }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_keeps_its_jobs_and_gets_no_new_one_until_resumed() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let running = submit(&c, spec(&["bash", "-c", "until [ -e release ]; do sleep 0.05; done"], dir.path())).await;
    let busy = wait_state(&c, running, &["RUNNING"], T).await.nodelist;
    let other = if busy == "node01" { "node02" } else { "node01" };

    // Refusals change nothing: not root, no reason, and all or nothing with an unknown node.
    let e = set_drained(&c, "alice", &[&busy], Some("fan")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let e = set_drained(&c, "root", &[&busy], Some(" ")).await.unwrap_err();
    assert!(e.message().contains("needs a reason"), "{e:?}");
    let e = set_drained(&c, "root", &[other, "nosuch"], Some("fan")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(e.message().contains("node 'nosuch' is not registered"), "{e:?}");
    let state_of = |nodes: &[quorum_proto::api::NodeInfo], name: &str| {
        nodes.iter().find(|n| n.name == name).map(|n| (n.state.clone(), n.reason.clone())).unwrap()
    };
    assert_ne!(state_of(&nodes(&c).await, other).0, "drain");

    set_drained(&c, "root", &[&busy], Some("fan failure on the GPU tray")).await.expect("drain");
    assert_eq!(state_of(&nodes(&c).await, &busy), ("drain".to_string(), "fan failure on the GPU tray".to_string()));
    // A new job goes to the other node; the running one goes on.
    for _ in 0..3 {
        let id = submit(&c, spec(&["true"], dir.path())).await;
        assert_eq!(wait_state(&c, id, &["COMPLETED"], T).await.nodelist, other);
    }
    assert_eq!(job(&c, running).await.state, "RUNNING");
    std::fs::write(dir.path().join("release"), "").unwrap();
    wait_state(&c, running, &["COMPLETED"], T).await;

    // Resumed, and with the other node drained, the next job lands on it.
    set_drained(&c, "root", &[&busy], None).await.expect("resume");
    set_drained(&c, "root", &[other], Some("maintenance")).await.expect("drain the other");
    let id = submit(&c, spec(&["true"], dir.path())).await;
    assert_eq!(wait_state(&c, id, &["COMPLETED"], T).await.nodelist, busy);
    cluster.shutdown().await;
}

async fn signal(
    c: &quorum_client::client::Client,
    user: &str,
    id: u64,
    signal: &str,
) -> Result<quorum_proto::api::CancelJobResponse, tonic::Status> {
    let req = quorum_proto::api::CancelJobRequest {
        job_ids: vec![id],
        user: user.into(),
        signal: signal.into(),
        ..Default::default()
    };
    // The caller is who the token names: the request's user field is not believed.
    let c = client_as(c.addrs(), user);
    c.call(|mut cl| {
        let req = req.clone();
        async move { cl.cancel_job(req).await }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_with_a_signal_only_signals_the_running_job() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let script =
        "trap 'echo got > usr1.txt' USR1; echo up > up.txt; while [ ! -e usr1.txt ]; do sleep 0.05; done; exit 0";
    let id = submit(&c, spec(&["bash", "-c", script], dir.path())).await;
    wait_state(&c, id, &["RUNNING"], T).await;
    wait_for(T, "the job to set its trap", || async { dir.path().join("up.txt").exists().then_some(()) }).await;

    let e = signal(&c, "root", id, "BOGUS").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("unknown signal 'BOGUS'"), "{e:?}");
    ensure_user("mallory");
    let r = signal(&c, "mallory", id, "USR1").await.unwrap();
    assert!(!r.results[0].ok && r.results[0].error.contains("may not signal"), "{r:?}");
    let r = signal(&c, "root", 999, "USR1").await.unwrap();
    assert!(r.results[0].error.contains("job 999 does not exist"), "{r:?}");
    assert!(!dir.path().join("usr1.txt").exists(), "a refused signal was delivered");

    let r = signal(&c, "root", id, "SIGUSR1").await.unwrap();
    assert!(r.results[0].ok, "{r:?}");
    // The trap ran and the job ended by itself: completed, not cancelled.
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    assert_eq!(std::fs::read_to_string(dir.path().join("usr1.txt")).unwrap(), "got\n");
    let r = signal(&c, "root", id, "USR1").await.unwrap();
    assert!(r.results[0].error.contains("is not running (COMPLETED)"), "{r:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_warned_by_its_signal_before_its_time_limit() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(
        &["bash", "-c", "trap 'echo warned > warn.txt' USR1; while [ ! -e warn.txt ]; do sleep 0.05; done; exit 0"],
        dir.path(),
    );
    s.time_limit_s = 7;
    s.signal = "USR1@5".into();
    let id = submit(&c, s.clone()).await;
    // The warning comes 2 s in, well before the limit: the job saves and ends by itself.
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "TIMEOUT"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    assert_eq!(std::fs::read_to_string(dir.path().join("warn.txt")).unwrap(), "warned\n");
    assert!(j.end_time_ms - j.start_time_ms >= 1_500, "warned too early: {j:?}");

    s.signal = "USR1@soon".into();
    let e = submit_with_id(&c, s, "bad-signal").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("'soon' is not a number of seconds"), "{e:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submits_share_raft_entries_and_each_makes_its_own_job() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = std::sync::Arc::new(client(&cluster.addrs));
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let applied_index = |c: std::sync::Arc<quorum_client::client::Client>| async move {
        c.call(|mut cl| async move { cl.list_jobs(quorum_proto::api::ListJobsRequest::default()).await })
            .await
            .unwrap()
            .applied_index
    };
    let before = applied_index(c.clone()).await;
    const N: u64 = 48;
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let (c, mut held) = (c.clone(), spec(&["true"], dir.path()));
            held.hold = true;
            tokio::spawn(async move { submit_with_id(&c, held, &format!("together-{i}")).await.unwrap() })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for t in tasks {
        let answer = t.await.unwrap();
        assert!(!answer.duplicate);
        ids.insert(answer.job_id);
    }
    assert_eq!(ids.len() as u64, N, "each submit made its own job");
    assert_eq!(all_jobs(&c).await.len() as u64, N);
    // One entry per submit would take N entries (plus any plan); submits that arrive while
    // others are being committed go in together.
    let entries = applied_index(c.clone()).await - before;
    assert!(entries < N, "{N} concurrent submits took {entries} log entries");
    cluster.shutdown().await;
}

/// After a cold start or a leader change every agent registers at once; their registrations go
/// into shared Raft entries (`Command::Batch`) instead of one entry and one round of fsyncs each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_registering_at_once_share_raft_entries() {
    use quorum_proto::agent::agent_service_client::AgentServiceClient;
    use quorum_proto::agent::{agent_message, AgentMessage, Register};

    let cluster = cluster(DevOptions::for_tests()).await;
    let c = std::sync::Arc::new(client(&cluster.addrs));
    wait_ready(&cluster, &c, 2).await;
    let leader = wait_for(Duration::from_secs(10), "a leader", || async {
        let replicas = quorum_client::display::replica_statuses(&c).await.ok()?;
        replicas.into_iter().find(|r| r.role == "leader").map(|r| r.address)
    })
    .await;
    let applied_index = || async {
        c.call(|mut cl| async move { cl.list_jobs(quorum_proto::api::ListJobsRequest::default()).await })
            .await
            .unwrap()
            .applied_index
    };
    let before = applied_index().await;
    const N: usize = 48;
    // Each agent proves its node with its own certificate, on its own connection, made (TLS
    // handshake and all) before any registers: then they register at once, as agents do when
    // a new leader comes, however slowly this machine makes the connections.
    let shared = quorum_dev::security::DevSecurity::shared();
    let layout = quorum_auth::pki::Layout::new(shared.certs_dir());
    let mut channels = Vec::new();
    for i in 0..N {
        let role = quorum_auth::pki::PeerRole::Agent(format!("storm{i:02}"));
        shared.ensure(&role).unwrap();
        let (cert, key) = layout.pair(&role);
        let tls = quorum_auth::tls::TlsFiles { ca: layout.ca(), cert, key }.client().unwrap();
        channels.push(quorum_auth::tls::endpoint(&leader, Some(&tls)).unwrap().connect().await.expect("connect"));
    }
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(N));
    let sessions: Vec<_> = channels
        .into_iter()
        .enumerate()
        .map(|(i, channel)| {
            let mut agent = AgentServiceClient::new(channel);
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                let (tx, rx) = tokio::sync::mpsc::channel(4);
                let register = Register {
                    node: format!("storm{i:02}"),
                    cpus: 4,
                    mem_mb: 8192,
                    version: quorum_agent::VERSION.into(),
                    ..Default::default()
                };
                tx.send(AgentMessage { msg: Some(agent_message::Msg::Register(register)) }).await.unwrap();
                // The leader answers the stream once the registration is committed.
                let stream = agent.session(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap();
                (tx, stream)
            })
        })
        .collect();
    let mut open = Vec::new();
    for s in sessions {
        open.push(s.await.unwrap());
    }
    let nodes = c
        .call(|mut cl| async move { cl.list_nodes(quorum_proto::api::ListNodesRequest::default()).await })
        .await
        .unwrap()
        .nodes;
    let registered = nodes.iter().filter(|n| n.name.starts_with("storm")).count();
    assert_eq!(registered, N, "every agent's node is registered");
    let entries = applied_index().await - before;
    assert!(entries < N as u64, "{N} registrations at once took {entries} log entries");
    drop(open);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_installs_a_snapshot_copies_the_job_history_it_skipped() {
    let opts = DevOptions {
        snapshot_every: 20,
        snapshot_keep_logs: 0,
        min_job_age: Duration::from_secs(1),
        ..DevOptions::for_tests()
    };
    let mut cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let leader = cluster.leader().unwrap();
    let follower = (leader + 1) % 3;
    cluster.stop_controller(follower).await;
    let mut jobs = Vec::new();
    for _ in 0..10 {
        jobs.push(submit(&c, spec(&["true"], dir.path())).await);
    }
    for &j in &jobs {
        wait_state(&c, j, &["COMPLETED"], T).await;
    }
    // They leave the hot state for the history (a second after they end)...
    let left_at = wait_for(T, "the jobs to leave the hot state", || async {
        let l = cluster.controller(cluster.leader()?)?;
        let applied = l.replica.shared.read();
        jobs.iter().all(|j| !applied.state.jobs.contains_key(j)).then(|| applied.applied_index())
    })
    .await;
    // ...and the leader's snapshot passes that, its log behind it purged: the stopped replica
    // can only catch up by installing the snapshot, which holds none of them.
    wait_for(T, "a leader snapshot past the purge", || async {
        submit(&c, spec(&["true"], dir.path())).await;
        let l = cluster.controller(cluster.leader()?)?;
        let snap = l.replica.raft.metrics().borrow().snapshot?;
        (snap.index > left_at).then_some(())
    })
    .await;
    cluster.restart_controller(follower).await.unwrap();
    let f = cluster.controller(follower).unwrap();
    wait_for(T, "the follower to install the snapshot", || async {
        (f.replica.raft.metrics().borrow().snapshot?.index > left_at).then_some(())
    })
    .await;
    // Its history has them all, copied from a peer, and answers again.
    let history = f.replica.shared.history.clone();
    wait_for(T, "the follower's history to hold the jobs", || async {
        (history.gap().is_none() && jobs.iter().all(|j| history.get(*j).ok().flatten().is_some())).then_some(())
    })
    .await;
    let copied = history.get(jobs[0]).unwrap().unwrap();
    assert_eq!((copied.id, copied.state), (jobs[0], quorum_model::JobState::Completed));
    cluster.shutdown().await;
}
