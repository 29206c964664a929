//! Node health: a GPU in FAILURE (injected into a simulated GPU with `quorum admin gpu-fault`, as
//! an operator drills it) drains its node while its jobs go on, and the node resumes by itself
//! when the GPU recovers; an operator's drain is not undone by that; WARNING is shown but does
//! not drain; a failing health check program drains the node with its output as the reason.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use quorum_dev::cluster::DevOptions;

const T: Duration = Duration::from_secs(30);
/// The agent checks its GPUs every heartbeat (1 s) and reports in the next one: two heartbeats,
/// plus room for a loaded machine to apply the drain through Raft.
const TWO_HEARTBEATS_AND_GRACE: Duration = Duration::from_secs(5);

async fn node(c: &quorum_client::client::Client, name: &str) -> quorum_proto::api::NodeInfo {
    nodes(c).await.into_iter().find(|n| n.name == name).unwrap_or_else(|| panic!("no node {name}"))
}

/// Waits until `name`'s state and reason satisfy `pred`.
async fn wait_node(
    c: &quorum_client::client::Client,
    name: &str,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&quorum_proto::api::NodeInfo) -> bool,
) -> quorum_proto::api::NodeInfo {
    let pred = &pred;
    wait_for(timeout, what, || async move { Some(node(c, name).await).filter(|n| pred(n)) }).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_gpu_drains_its_node_and_a_recovered_one_resumes_it() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let env = cluster.controllers_env();
    let dir = tempfile::tempdir().unwrap();
    let root = |args: &[&str]| quorum_as(&env, Some("root"), dir.path(), args);
    let tester = |args: &[&str]| quorum_as(&env, Some("tester"), dir.path(), args);

    // A job on one GPU that runs until told to stop.
    let release = dir.path().join("release");
    let script = format!("while [ ! -e {} ]; do sleep 0.1; done; echo done", release.display());
    let mut s = spec(&["bash", "-c", &script], dir.path());
    s.gpus_per_node = 1;
    s.gpu_type = "h100".into();
    let first = submit(&c, s.clone()).await;
    let running = wait_state(&c, first, &["RUNNING"], T).await;
    let sick = running.allocation[0].node.clone();
    let healthy = if sick == "node01" { "node02" } else { "node01" };

    // WARNING on the other node: shown, no drain.
    root(&["admin", "gpu-fault", healthy, "2", "temperature:90"]).success();
    let warned = wait_node(&c, healthy, T, "the GPU warning shown", |n| {
        n.gpu_health.iter().any(|g| g.index == 2 && g.state == "warning")
    })
    .await;
    assert_ne!(warned.state, "drain", "{warned:?}");
    assert!(warned.gpu_health.iter().any(|g| g.detail.contains("temperature 90 C")), "{warned:?}");

    // XID 79 on the busy node: drained within two heartbeats, with the reason.
    let injected = Instant::now();
    let said = root(&["admin", "gpu-fault", &sick, "0", "xid:79"]).success();
    assert!(said.contains("injected xid:79 into GPU 0"), "{said}");
    let drained =
        wait_node(&c, &sick, TWO_HEARTBEATS_AND_GRACE, "the node drained for its GPU", |n| n.state == "drain").await;
    eprintln!("drained {:?} after the fault was injected", injected.elapsed());
    assert_eq!(drained.reason, "GPU 0 failure: XID 79 (GPU has fallen off the bus)");
    let table = tester(&["nodes"]).success();
    let line = table.lines().find(|l| l.starts_with(&sick)).expect("the node in quorum nodes");
    assert!(line.contains("drain (failure)") && line.contains("XID 79"), "{table}");
    let line = table.lines().find(|l| l.starts_with(healthy)).expect("the other node");
    assert!(line.contains("(warning)"), "{table}");

    // New work goes elsewhere: four one-GPU jobs, all on the healthy node, while the first job
    // goes on where it is.
    let mut others = Vec::new();
    for _ in 0..4 {
        others.push(submit(&c, s.clone()).await);
    }
    for id in &others {
        let j = wait_state(&c, *id, &["RUNNING"], T).await;
        assert_eq!(j.allocation[0].node, healthy, "a job landed on the drained node: {j:?}");
    }
    assert_eq!(job(&c, first).await.state, "RUNNING");
    std::fs::write(&release, "").unwrap();
    let done = wait_state(&c, first, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(done.state, "COMPLETED", "{done:?}");
    for id in others {
        assert_eq!(wait_state(&c, id, &["COMPLETED", "FAILED"], T).await.state, "COMPLETED");
    }

    // The GPU recovers: the node resumes by itself.
    root(&["admin", "gpu-fault", &sick, "0", "clear"]).success();
    wait_node(&c, &sick, T, "the node resumed by itself", |n| n.state != "drain" && n.reason.is_empty()).await;

    // An operator's drain stays through a GPU failure and its recovery.
    root(&["admin", "drain", &sick, "--reason", "new fans"]).success();
    root(&["admin", "gpu-fault", &sick, "1", "ecc-uncorrectable"]).success();
    wait_node(&c, &sick, T, "the failure reported", |n| n.gpu_health.iter().any(|g| g.state == "failure")).await;
    root(&["admin", "gpu-fault", &sick, "1", "clear"]).success();
    wait_node(&c, &sick, T, "the GPU healthy again", |n| n.gpu_health.iter().all(|g| g.state == "ok")).await;
    let n = node(&c, &sick).await;
    assert_eq!((n.state.as_str(), n.reason.as_str()), ("drain", "new fans"), "{n:?}");

    // Refusals name what is wrong, and change nothing.
    let out = tester(&["admin", "gpu-fault", healthy, "0", "xid:79"]);
    assert!(out.code != 0 && out.stderr.contains("may not call InjectGpuFault: it needs the admin role"), "{out:?}");
    let out = root(&["admin", "gpu-fault", healthy, "9", "xid:79"]);
    assert!(out.stderr.contains("has no GPU 9 (4 GPUs)"), "{out:?}");
    let out = root(&["admin", "gpu-fault", healthy, "0", "melted"]);
    assert!(out.stderr.contains("unknown GPU fault 'melted'"), "{out:?}");
    // The leader refuses it too, for clients other than `quorum` (the agent would only log it).
    let req =
        quorum_proto::api::GpuFaultRequest { user: "root".into(), node: healthy.into(), gpu: 0, kind: "xid".into() };
    let refused = c.call(|mut cl| {
        let req = req.clone();
        async move { cl.inject_gpu_fault(req).await }
    });
    let status = refused.await.expect_err("a fault kind without its number is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("GPU fault 'xid' needs a number"), "{status:?}");
    let out = root(&["admin", "gpu-fault", "node99", "0", "xid:79"]);
    assert!(out.stderr.contains("there is no node node99"), "{out:?}");
    assert_ne!(node(&c, healthy).await.state, "drain");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_health_check_drains_with_its_output_until_it_passes() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("sick");
    let check = format!("if [ -e {0} ]; then cat {0}; exit 3; fi", flag.display());
    let opts = DevOptions {
        agents: 1,
        health_check: Some(quorum_agent::HealthCheck { command: check, interval: Duration::from_secs(1) }),
        ..DevOptions::for_tests()
    };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 1).await;
    assert_ne!(node(&c, "node01").await.state, "drain");

    std::fs::write(&flag, "/scratch is full\n").unwrap();
    let n = wait_node(&c, "node01", T, "the node drained by its health check", |n| n.state == "drain").await;
    assert_eq!(n.reason, "health check failed: /scratch is full (exit 3)");
    assert_eq!(n.health_check, "/scratch is full (exit 3)");
    // No job starts there meanwhile.
    let id = submit(&c, spec(&["true"], dir.path())).await;
    let pending = wait_for(T, "the job's pending reason", || {
        let c = &c;
        async move { Some(job(c, id).await).filter(|j| j.state == "PENDING" && !j.reason.is_empty()) }
    })
    .await;
    assert_eq!(pending.state, "PENDING", "{pending:?}");

    std::fs::remove_file(&flag).unwrap();
    wait_node(&c, "node01", T, "the node resumed", |n| n.state != "drain").await;
    assert_eq!(wait_state(&c, id, &["COMPLETED", "FAILED"], T).await.state, "COMPLETED");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_s_gpus_are_sampled_while_it_runs_and_sacct_reports_them() {
    let mut cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let env = cluster.controllers_env();
    let dir = tempfile::tempdir().unwrap();
    let root = |args: &[&str]| quorum_as(&env, Some("root"), dir.path(), args);
    // The simulated GPUs busy as a load would keep them: 80 % on node01, 40 % on node02.
    for gpu in 0..4 {
        root(&["admin", "gpu-fault", "node01", &gpu.to_string(), "load:80"]).success();
        root(&["admin", "gpu-fault", "node02", &gpu.to_string(), "load:40"]).success();
    }
    let mut s = spec(&["sleep", "3.5"], dir.path());
    s.gpus_per_node = 2;
    let id = submit(&c, s).await;
    let j = wait_state(&c, id, &["COMPLETED"], T).await;
    let (load, node) = match j.nodelist.as_str() {
        "node01" => (80, "node01"),
        other => (40, other),
    };
    let u = job(&c, id).await.usage.expect("what it used");
    // Two GPUs at every check (a heartbeat, 1 s) of its 3.5 s, and as it ended.
    assert!(u.gpu_samples >= 6 && u.gpu_samples % 2 == 0, "{u:?}");
    assert_eq!(u.gpu_util_sum, load * u.gpu_samples, "{u:?} on {node}");
    assert_eq!(u.gpu_mem_max_mb, 80 * 1024 * load / 100);
    // 60 W and 6 W a percent, each GPU, from its start to its end.
    let watts = 2 * (60 + 6 * load);
    let ran_s = (j.end_time_ms - j.start_time_ms) as f64 / 1000.0;
    let joules = u.gpu_energy_mj as f64 / 1000.0;
    assert!(
        joules >= watts as f64 * ran_s * 0.6 && joules <= watts as f64 * ran_s * 1.4,
        "{joules} J in {ran_s} s, {u:?}"
    );
    // A job shorter than a heartbeat: its GPUs are read as it ends, its energy from its start.
    let mut s = spec(&["sleep", "0.3"], dir.path());
    s.gpus_per_node = 2;
    s.nodelist = vec![node.into()];
    let short = submit(&c, s).await;
    wait_state(&c, short, &["COMPLETED"], T).await;
    let u = job(&c, short).await.usage.expect("what it used");
    assert!(u.gpu_samples >= 2 && u.gpu_util_sum == load * u.gpu_samples, "{u:?}");
    assert!(u.gpu_energy_mj > 0, "{u:?}");

    let out =
        quorum(&env, dir.path(), &["acct", "-j", &id.to_string(), "-X", "-P", "-n", "-o", "GPUUtil,GPUMem,GPUEnergy"])
            .success();
    assert_eq!(out.trim(), format!("{load}.0%|{}M|{:.0}J", 80 * 1024 * load / 100, joules), "{out}");
    // A job without GPUs has nothing to show there.
    let plain = submit(&c, spec(&["true"], dir.path())).await;
    wait_state(&c, plain, &["COMPLETED"], T).await;
    let out = quorum(&env, dir.path(), &["acct", "-j", &plain.to_string(), "-X", "-P", "-n", "-o", "JobID,GPUUtil"])
        .success();
    assert_eq!(out.trim(), format!("{plain}|"));
    let eff = quorum(&env, dir.path(), &["eff", &id.to_string()]).success();
    assert!(eff.contains(&format!("GPU Utilization: {load}.0% of 2 GPUs")), "{eff}");

    // The agent restarted while a job runs (an upgrade): what it measured before goes on. The
    // new agent's simulated GPUs are idle (the load was the old one's fault), so whatever use
    // is recorded was measured before the restart.
    let i = if node == "node01" { 0 } else { 1 };
    let mut s = spec(&["sleep", "5"], dir.path());
    s.gpus_per_node = 2;
    s.nodelist = vec![node.into()];
    let through = submit(&c, s).await;
    let running = wait_state(&c, through, &["RUNNING"], T).await;
    let config = cluster.agent_config(i);
    // Restarted once the job's record holds two checks of its two GPUs.
    let measured = config.spool_dir.join("jobs").join(format!("{through}.{}", running.alloc_index)).join("measured");
    wait_for(T, "two GPU checks kept in the job's record", || {
        let text = std::fs::read_to_string(&measured).unwrap_or_default();
        let samples = text.lines().find_map(|l| l.strip_prefix("gpu ")?.split_whitespace().next()?.parse::<u64>().ok());
        async move { samples.filter(|n| *n >= 4).map(|_| ()) }
    })
    .await;
    cluster.restart_agent(i, config).await;
    wait_state(&c, through, &["COMPLETED"], T).await;
    let u = job(&c, through).await.usage.expect("what it used");
    assert!(u.gpu_util_sum >= 2 * 2 * load, "two samples of two GPUs at {load} % before the restart: {u:?}");
    assert_eq!(u.gpu_mem_max_mb, 80 * 1024 * load / 100, "{u:?}");
    cluster.shutdown().await;
}
