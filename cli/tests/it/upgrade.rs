//! Mixed versions during a rolling upgrade: while one replica runs the older release (emulated:
//! it reports feature level 1 and refuses to apply anything above it, as the older binary
//! would), the cluster's level is 1, commands of level 2 are refused with a clear error and never
//! proposed, and that replica keeps applying everything. Once it runs this release, the level
//! rises and the newer commands work.

use crate::common;

use std::time::Duration;

use common::*;
use quorum_dev::cluster::DevOptions;
use quorum_proto::api;
use quorum_state::FEATURE_LEVEL;

const T: Duration = Duration::from_secs(30);
const NODE_TIMEOUT: Duration = Duration::from_secs(3);

async fn digest(c: &quorum_client::client::Client) -> Result<api::DigestResponse, tonic::Status> {
    c.call(|mut cl| async move { cl.digest(api::DigestRequest {}).await }).await
}

/// Every running replica has applied what the leader has, and their states agree.
async fn assert_replicas_agree(cluster: &quorum_dev::cluster::DevCluster) {
    wait_for(T, "every replica to apply what the leader has, with equal digests", || async {
        let leader = cluster.controller(cluster.leader()?)?;
        let (index, digest) = {
            let l = leader.replica.shared.read();
            (l.applied_index(), quorum_state::digest(&l.state))
        };
        for i in 0..cluster.addrs.len() {
            let r = cluster.controller(i)?;
            let a = r.replica.shared.read();
            if a.applied_index() != index {
                return None;
            }
            assert_eq!(quorum_state::digest(&a.state), digest, "replica {} disagrees at {index}", i + 1);
        }
        Some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_of_the_older_release_never_receives_a_command_it_cannot_apply() {
    if std::env::var("TEST_LOG").is_ok() {
        let _ = tracing_subscriber::fmt().with_env_filter("info,openraft=warn").with_test_writer().try_init();
    }
    let old = 2;
    let opts = DevOptions {
        node_timeout: NODE_TIMEOUT,
        agent_lease: Duration::from_secs(2),
        emulate_levels: vec![(old, 1)],
        ..DevOptions::for_tests()
    };
    let mut cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();

    let v = versions(&cluster.addrs);
    assert_eq!(v["cluster_level"], 1, "{v}");
    let levels: Vec<u64> =
        v["replicas"].as_array().unwrap().iter().map(|r| r["feature_level"].as_u64().unwrap()).collect();
    assert_eq!(levels, [FEATURE_LEVEL as u64, FEATURE_LEVEL as u64, 1], "{v}");

    // Level-2 commands are refused before they reach the log, saying why.
    let mut requeue = spec(&["true"], dir.path());
    requeue.requeue = true;
    let refused = submit_with_id(&c, requeue.clone(), "requeue-1").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("--requeue")
            && refused.message().contains("level 2")
            && refused.message().contains("quorum admin versions"),
        "{refused:?}"
    );
    let refused = digest(&c).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");

    // Everything of level 1 works: jobs run and complete.
    let id = submit(&c, spec(&["bash", "-c", "echo mixed > mixed.txt"], dir.path())).await;
    wait_state(&c, id, &["COMPLETED"], T).await;
    assert_eq!(std::fs::read_to_string(dir.path().join("mixed.txt")).unwrap(), "mixed\n");

    // A silent node cannot be marked DOWN at level 1: the leader waits rather than propose it.
    cluster.isolate_agent(0, true);
    tokio::time::sleep(NODE_TIMEOUT + Duration::from_secs(2)).await;
    let node = nodes(&c).await.into_iter().find(|n| n.name == "node01").unwrap();
    assert_ne!(node.state, "down", "{node:?}");
    cluster.isolate_agent(0, false);

    // The old replica applied every entry: none was above its level.
    assert_replicas_agree(&cluster).await;
    let v = versions(&cluster.addrs);
    let role = &v["replicas"][old]["role"];
    assert!(role == "follower" || role == "leader", "the old replica stopped applying: {v}");

    // Upgrade it: the level rises once the leader has asked it, and the newer commands work.
    cluster.stop_controller(old).await;
    cluster.set_emulated_level(old, None);
    cluster.restart_controller(old).await.unwrap();
    wait_for(T, "the cluster level to rise", || async {
        (versions(&cluster.addrs)["cluster_level"] == FEATURE_LEVEL).then_some(())
    })
    .await;
    let d = digest(&c).await.expect("digest after the upgrade");
    assert!(d.index > 0);
    let id = submit_with_id(&c, requeue, "requeue-2").await.expect("a --requeue job after the upgrade").job_id;
    wait_state(&c, id, &["COMPLETED"], T).await;
    assert_replicas_agree(&cluster).await;
    cluster.shutdown().await;
}

/// Waits until restarted replica `i` has applied what the leader had applied when asked.
async fn caught_up(cluster: &quorum_dev::cluster::DevCluster, i: usize) {
    let target = wait_for(T, "a leader", || async {
        cluster.controller(cluster.leader()?).map(|l| l.replica.shared.read().applied_index())
    })
    .await;
    wait_for(T, "the restarted replica to catch up", || async {
        (cluster.controller(i)?.replica.shared.read().applied_index() >= target).then_some(())
    })
    .await;
}

/// Submits held jobs through `c` one after another until stopped; returns the ids acknowledged
/// and every error.
fn submit_load(
    c: quorum_client::client::Client,
    dir: std::path::PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<(Vec<u64>, Vec<String>)> {
    tokio::spawn(async move {
        let (mut ids, mut errors) = (Vec::new(), Vec::new());
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let mut s = spec(&["true"], &dir);
            s.hold = true;
            match submit_with_id(&c, s, &uuid::Uuid::new_v4().to_string()).await {
                Ok(r) => ids.push(r.job_id),
                Err(e) => errors.push(e.message().to_string()),
            }
        }
        (ids, errors)
    })
}

/// A cluster without TLS moves to TLS one replica at a time while clients submit, as README's
/// "Upgrading" says: each replica restarted with `transitional = "accept"`, then each with
/// `"dial-tls"`, the agents and clients switched to TLS, then each replica with TLS only. No
/// request fails, and the replicas agree at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_cluster_moves_to_tls_one_replica_at_a_time_under_load() {
    use quorum_control::config::Transitional;
    if std::env::var("TEST_LOG").is_ok() {
        let _ = tracing_subscriber::fmt().with_env_filter("info,openraft=warn").with_test_writer().try_init();
    }
    let shared = quorum_dev::security::DevSecurity::shared();
    let mut cluster =
        cluster(DevOptions { insecure: true, security: Some(shared.clone()), ..DevOptions::for_tests() }).await;
    let munge = quorum_client::client::Proof::Munge(
        quorum_auth::munge::Munge::new(Some(shared.munge_socket()))
            .restrict_to(quorum_dev::security::controllers_uid()),
    );
    let plaintext = quorum_client::client::Security { tls: None, proof: munge.clone() };
    let c = quorum_client::client::Client::new(cluster.addrs.clone(), plaintext.clone()).unwrap();
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = submit_load(
        quorum_client::client::Client::new(cluster.addrs.clone(), plaintext).unwrap(),
        dir.path().to_path_buf(),
        stop.clone(),
    );

    let restart = |cluster: &mut quorum_dev::cluster::DevCluster, i: usize, step: Option<Transitional>| {
        let mut secure = shared.controller(i as u64 + 1).unwrap();
        secure.transitional = step;
        *cluster.security_config(i) = secure;
    };
    for step in [Some(Transitional::Accept), Some(Transitional::DialTls)] {
        for i in 0..3 {
            cluster.stop_controller(i).await;
            restart(&mut cluster, i, step);
            cluster.restart_controller(i).await.unwrap();
            caught_up(&cluster, i).await;
        }
        if step == Some(Transitional::DialTls) {
            // Every replica takes TLS now: the agents move to it, proving their nodes.
            for i in 0..2 {
                let mut config = cluster.agent_config(i);
                shared.secure_agent(&mut config).unwrap();
                cluster.restart_agent(i, config).await;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (before, errors) = load.await.unwrap();
    assert!(errors.is_empty(), "requests failed while replicas accepted both: {errors:?}");

    // The clients move to TLS, then the replicas refuse plaintext, one at a time.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tls = shared.client();
    let load = submit_load(
        quorum_client::client::Client::new(cluster.addrs.clone(), tls.clone()).unwrap(),
        dir.path().to_path_buf(),
        stop.clone(),
    );
    for i in 0..3 {
        cluster.stop_controller(i).await;
        restart(&mut cluster, i, None);
        cluster.restart_controller(i).await.unwrap();
        caught_up(&cluster, i).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (after, errors) = load.await.unwrap();
    assert!(errors.is_empty(), "requests failed while replicas moved to TLS only: {errors:?}");
    assert_replicas_agree(&cluster).await;
    assert!(!before.is_empty() && !after.is_empty());

    // Plaintext is refused now; over TLS every acknowledged job is there, and a job runs on an
    // agent that verifies its signed launch.
    let old = quorum_client::client::Client::new(
        cluster.addrs.clone(),
        quorum_client::client::Security { tls: None, proof: munge },
    )
    .unwrap();
    let mut quick = old;
    quick.deadline = Duration::from_secs(1);
    assert!(quick.call(|mut cl| async move { cl.who_am_i(api::WhoAmIRequest {}).await }).await.is_err());
    let c = quorum_client::client::Client::new(cluster.addrs.clone(), tls).unwrap();
    let listed: std::collections::BTreeSet<u64> = all_jobs(&c).await.into_iter().map(|j| j.id).collect();
    for id in before.iter().chain(&after) {
        assert!(listed.contains(id), "acknowledged job {id} is missing");
    }
    let id = submit(&c, spec(&["bash", "-c", "echo tls > tls.txt"], dir.path())).await;
    wait_state(&c, id, &["COMPLETED"], T).await;
    assert_eq!(std::fs::read_to_string(dir.path().join("tls.txt")).unwrap(), "tls\n");
    cluster.shutdown().await;
}
