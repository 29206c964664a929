//! The site's own programs on a cluster with agents. The prolog and epilog, as Slurm's
//! `Prolog=` and `Epilog=`: a prolog that fails on a node sends the job back to the queue (it
//! never started there) and drains the node with the prolog's words; once the operator fixes the
//! node and resumes it the job runs. The epilog runs after every job with its exit code, and one
//! that fails drains the node. The submit filter, as Slurm's job_submit plugins: it refuses a
//! submit in its own words, or amends it. Device isolation, as Slurm's `ConstrainDevices=yes`: a
//! job opens its own GPUs' device files and not the others'.

use crate::common;

use std::time::Duration;

use common::*;
use quorum_agent::site::JobScripts;
use quorum_control::config::{GpuIdleConfig, PartitionConfig, SubmitFilterConfig};
use quorum_dev::cluster::DevOptions;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_prolog_requeues_the_job_and_drains_the_node_and_the_epilog_follows_every_job() {
    let site = tempfile::tempdir().unwrap();
    let dir = site.path().display().to_string();
    let prolog = format!(
        "test -e {dir}/scratch-$SLURMD_NODENAME || {{ echo no scratch on $SLURMD_NODENAME; exit 1; }}; \
         echo $SLURM_JOB_ID $SLURM_JOB_USER >> {dir}/prolog-$SLURMD_NODENAME"
    );
    let epilog = format!(
        "echo $SLURM_JOB_ID $SLURM_JOB_EXIT_CODE >> {dir}/epilog-$SLURMD_NODENAME; \
         test $SLURM_JOB_EXIT_CODE != 3 || {{ echo cleanup after exit 3 failed; exit 2; }}"
    );
    let scripts = JobScripts { prolog: Some(prolog), epilog: Some(epilog), timeout: Duration::from_secs(20) };
    let cluster = cluster(DevOptions { job_scripts: scripts, ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let env = cluster.controllers_env();
    let work = tempfile::tempdir().unwrap();
    let q = |args: &[&str]| quorum(&env, work.path(), args);
    let read = |name: &str| std::fs::read_to_string(site.path().join(name)).unwrap_or_default();
    std::fs::write(site.path().join("scratch-node02"), "").unwrap();

    // node01 has no scratch: the two-node job goes back to the queue, node01 drains with the
    // prolog's words, and node02's prolog ran for it once.
    let wide = submitted(q(&["submit", "-N", "2", "--", "true"]));
    let drained = wait_for(T, "node01 drained by its prolog", || async {
        nodes(&c).await.into_iter().find(|n| n.name == "node01" && n.state.starts_with("drain"))
    })
    .await;
    assert_eq!(drained.reason, format!("prolog failed for job {wide}: no scratch on node01 (exit 1)"));
    let pending = wait_for(T, "the job back in the queue", || async {
        let j = job(&c, wide).await;
        (j.state == "PENDING" && j.requeues == 1).then_some(j)
    })
    .await;
    assert!(pending.start_time_ms == 0, "{pending:?}");
    assert!(read("prolog-node01").is_empty());

    // A job that fits on node02 runs there; its epilog follows it with its exit code, and an
    // epilog that fails drains node02 too.
    let ok = submitted(q(&["submit", "--", "true"]));
    assert_eq!(wait_state(&c, ok, &["COMPLETED", "FAILED"], T).await.state, "COMPLETED");
    wait_for(T, "the epilog of the job", || async { read("epilog-node02").contains(&format!("{ok} 0")).then_some(()) })
        .await;
    let three = submitted(q(&["submit", "--", "sh", "-c", "exit 3"]));
    assert_eq!(wait_state(&c, three, &["COMPLETED", "FAILED"], T).await.state, "FAILED");
    let drained = wait_for(T, "node02 drained by its epilog", || async {
        nodes(&c).await.into_iter().find(|n| n.name == "node02" && n.state.starts_with("drain"))
    })
    .await;
    assert_eq!(drained.reason, format!("epilog failed for job {three}: cleanup after exit 3 failed (exit 2)"));
    assert!(read("epilog-node02").contains(&format!("{three} 3")));

    // The operator fixes node01 and resumes both: the two-node job runs, once, on both.
    std::fs::write(site.path().join("scratch-node01"), "").unwrap();
    q(&["admin", "resume", "node01,node02"]).success();
    let done = wait_state(&c, wide, &["COMPLETED", "FAILED"], T).await;
    assert_eq!((done.state.as_str(), done.requeues), ("COMPLETED", 1), "{done:?}");
    // node01's prolog passed once, for the start that ran; node02's for each start that
    // reached it (the first, unless its launch was overtaken by the requeue, and the second).
    let runs =
        |node: &str| read(&format!("prolog-{node}")).lines().filter(|l| l.starts_with(&format!("{wide} "))).count();
    assert_eq!(runs("node01"), 1);
    assert!((1..=2).contains(&runs("node02")), "{}", read("prolog-node02"));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_submit_filter_refuses_or_amends_every_submit_in_its_own_words() {
    // Every job needs a time limit; each is marked with who submitted it; sbatch's and cron's
    // submits pass it alike.
    let command = r#"input=$(cat)
case "$input" in *'"time_limit_s":null'*) echo "every job needs a --time limit" >&2; exit 1;; esac
echo "{\"comment\":\"seen for $QUORUM_SUBMIT_USER\"}""#;
    let filter = SubmitFilterConfig { command: command.into(), timeout_ms: 5_000 };
    let cluster = cluster(DevOptions { submit_filter: Some(filter), ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let env = cluster.controllers_env();
    let (work, bin) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::set_permissions(work.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let user = |args: &[&str]| quorum_as(&env, Some("filter-user"), work.path(), args);

    let bare = user(&["submit", "--", "true"]);
    assert!(
        bare.code != 0
            && bare.stderr.contains("submit refused by the site's submit filter: every job needs a --time limit"),
        "{bare:?}"
    );
    let script = work.path().join("job.sh");
    std::fs::write(&script, "#!/bin/sh\n#SBATCH --time=5\ntrue\n").unwrap();
    let out = slurm_as(&cluster, bin.path(), "sbatch", "filter-user", &[script.to_str().unwrap()]).success();
    let id: u64 = out.trim().rsplit(' ').next().and_then(|w| w.parse().ok()).unwrap_or_else(|| panic!("{out}"));
    let j = job(&c, id).await;
    assert_eq!(j.spec.map(|s| s.comment).as_deref(), Some("seen for filter-user"));
    let refused = user(&["cron", "add", "@daily", "--", "true"]);
    assert!(refused.stderr.contains("every job needs a --time limit"), "{refused:?}");
    cluster.shutdown().await;
}

/// The GPU idle policy: a job whose simulated GPU stays idle is flagged in `quorum queue`, and
/// cancelled in the partition the policy names; once its GPU works the flag goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_whose_gpus_stay_idle_are_flagged_or_cancelled_where_the_partition_says() {
    let policy = GpuIdleConfig { threshold_pct: 5, after: "0:02".into(), cancel_partitions: vec!["scratch".into()] };
    let scratch = PartitionConfig {
        name: "scratch".into(),
        nodes: "node[01-02]".into(),
        max_time: Some("1:00:00".into()),
        default_mem_per_cpu: Some("1G".into()),
        ..Default::default()
    };
    let opts = DevOptions { gpu_idle: Some(policy), extra_partitions: vec![scratch], ..DevOptions::for_tests() };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let env = cluster.controllers_env();
    let work = tempfile::tempdir().unwrap();
    let q = |args: &[&str]| quorum(&env, work.path(), args);

    let flagged = submitted(q(&["submit", "-w", "node01", "--gpus", "1", "--", "sleep", "300"]));
    let cancelled = submitted(q(&["submit", "-p", "scratch", "-w", "node02", "--gpus", "1", "--", "sleep", "300"]));
    let since = wait_for(T, "the idle job flagged", || async {
        Some(job(&c, flagged).await.gpu_idle_since_ms).filter(|s| *s > 0)
    })
    .await;
    assert!(since <= now_ms().saturating_sub(2_000), "flagged only after two idle seconds");
    let queue = q(&["queue"]).success();
    let line =
        queue.lines().find(|l| l.trim_start().starts_with(&flagged.to_string())).unwrap_or_else(|| panic!("{queue}"));
    assert!(line.contains("node01 (GPUs idle "), "{queue}");
    let ended = wait_state(&c, cancelled, &["CANCELLED", "COMPLETED", "FAILED"], T).await;
    assert_eq!((ended.state.as_str(), ended.cancelled_by.as_str()), ("CANCELLED", "root"), "{ended:?}");
    assert_eq!(job(&c, flagged).await.state, "RUNNING", "only flagged in its partition");

    // Its GPU set to work: the flag goes.
    for gpu in 0..4 {
        q(&["admin", "gpu-fault", "node01", &gpu.to_string(), "load:50"]).success();
    }
    wait_for(T, "the flag gone", || async { (job(&c, flagged).await.gpu_idle_since_ms == 0).then_some(()) }).await;
    assert_eq!(job(&c, flagged).await.state, "RUNNING");
    q(&["cancel", &flagged.to_string()]).success();
    cluster.shutdown().await;
}

/// A job may open its own GPUs' device files and not the node's others, whatever its
/// `CUDA_VISIBLE_DEVICES` says: the agent's cgroup refuses them (v1's devices controller, or an
/// eBPF filter with v2). The files are made with mknod and have no driver behind them: opening
/// one of the job's gets as far as the (absent) driver, "No such device or address"; another's is
/// refused, "Operation not permitted".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_opens_only_its_own_gpus_device_files() {
    if !quorum_agent::identity::is_root() {
        eprintln!("skipped: making device files and cgroups needs root");
        return;
    }
    // Device files need a file system mounted without `nodev` (a tmpfs /tmp often is not):
    // the build's own temporary directory where /tmp is one.
    let nodev = |path: &std::path::Path| {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statvfs fills the struct it is given; the path is NUL-terminated.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0) && st.f_flag & libc::ST_NODEV != 0
    };
    let mut dir = tempfile::tempdir().unwrap();
    if nodev(dir.path()) {
        dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    }
    assert!(!nodev(dir.path()), "{} does not allow device files", dir.path().display());
    let files: Vec<std::path::PathBuf> = (0..2).map(|i| dir.path().join(format!("nvidia{i}"))).collect();
    for (i, f) in files.iter().enumerate() {
        let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mknod reads the NUL-terminated path only.
        let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(195, 230 + i as u32)) };
        assert_eq!(made, 0, "mknod {}: {}", f.display(), std::io::Error::last_os_error());
    }
    let opts = DevOptions { cgroups: true, agents: 1, gpus_per_agent: 2, gpu_files: files, ..DevOptions::for_tests() };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 1).await;
    let limits = wait_for(T, "the node's limits", || {
        let c = &c;
        async move { nodes(c).await.first().map(|n| n.limits.clone()).filter(|l| !l.is_empty()) }
    })
    .await;
    // Root on a machine with cgroups (this project's CI has v1 with its devices controller).
    let hierarchy = ["/sys/fs/cgroup/cgroup.controllers", "/sys/fs/cgroup/devices/devices.deny"]
        .iter()
        .any(|p| std::path::Path::new(p).exists());
    if !hierarchy {
        eprintln!("skipped: no cgroup hierarchy here ({limits})");
        cluster.shutdown().await;
        return;
    }
    assert!(limits.contains("devices"), "the node does not isolate devices: {limits}");
    let d = dir.path().display();
    // Each job says, for each file, what opening it gave, and which GPUs it was told of.
    let probe = format!(
        "echo cvd=$CUDA_VISIBLE_DEVICES; unset CUDA_VISIBLE_DEVICES; \
         for i in 0 1; do echo gpu$i: $( (exec 3<{d}/nvidia$i) 2>&1 | sed 's/.*: //'); done"
    );
    let run = |gpus: u32, name: &str| {
        let mut s = spec(&["bash", "-c", &probe], dir.path());
        s.gpus_per_node = gpus;
        s.stdout = format!("{d}/{name}.out");
        s
    };
    let one = submit(&c, run(1, "one")).await;
    let none = submit(&c, run(0, "none")).await;
    for id in [one, none] {
        let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
        assert_eq!(j.state, "COMPLETED", "{j:?}");
    }
    let both = submit(&c, run(2, "both")).await;
    assert_eq!(wait_state(&c, both, &["COMPLETED", "FAILED"], T).await.state, "COMPLETED");
    let read = |name: &str| std::fs::read_to_string(dir.path().join(format!("{name}.out"))).unwrap();
    let (open, refused) = ("No such device or address", "Operation not permitted");
    let out = read("one");
    let own: u32 = out.lines().next().unwrap().trim_start_matches("cvd=").parse().unwrap();
    assert_eq!(
        out,
        format!("cvd={own}\ngpu0: {}\ngpu1: {}\n", [open, refused][own as usize], [refused, open][own as usize])
    );
    assert_eq!(read("none"), format!("cvd=\ngpu0: {refused}\ngpu1: {refused}\n"));
    assert_eq!(read("both"), format!("cvd=0,1\ngpu0: {open}\ngpu1: {open}\n"));
    cluster.shutdown().await;
}

/// `quorum dev --config FILE`: a site's controller config (the example in deploy/examples/dev)
/// gives the dev cluster its partitions, QOS, accounts and licenses, while the replicas keep
/// their own addresses and data; a file that names nodes the dev cluster lacks, or a key no
/// controller reads, is refused before anything starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dev_cluster_runs_with_a_sites_controller_config() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples/dev/site.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let site = quorum_control::ControllerConfig::parse_site(path, &text).unwrap();
    let cluster = cluster(DevOptions { site: Some(site.clone()), ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let env = cluster.controllers_env();
    let work = tempfile::tempdir().unwrap();
    let q = |args: &[&str]| quorum(&env, work.path(), args);

    // The file's default partition, on the node it names.
    let id = submitted(q(&["submit", "--", "true"]));
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    assert_eq!((j.state.as_str(), j.partition.as_str(), j.nodelist.as_str()), ("COMPLETED", "debug", "node01"));
    // Its limit: an hour is more than debug's 30 minutes.
    let long = q(&["submit", "-t", "1:00:00", "--", "true"]);
    assert!(long.code != 0 && long.stderr.contains("debug"), "{long:?}");
    // Both nodes in scavenger.
    let id = submitted(q(&["submit", "-p", "scavenger", "-N", "2", "--", "true"]));
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    assert_eq!((j.state.as_str(), j.allocation.len()), ("COMPLETED", 2));
    // The file's licenses: 3 of 2 can never be had.
    let greedy = q(&["submit", "-L", "matlab:3", "--", "true"]);
    assert_ne!(greedy.code, 0, "{greedy:?}");
    assert!(greedy.stderr.contains("matlab"), "{greedy:?}");
    // Its QOS and accounts.
    let bin = tempfile::tempdir().unwrap();
    let qos = slurm_as(&cluster, bin.path(), "sacctmgr", "root", &["-P", "-n", "show", "qos", "format=name,priority"]);
    assert!(qos.stdout.lines().any(|l| l == "short|100"), "{qos:?}");
    let accounts =
        slurm_as(&cluster, bin.path(), "sacctmgr", "root", &["-P", "-n", "show", "account", "format=account"]);
    assert!(accounts.stdout.lines().any(|l| l == "vision"), "{accounts:?}");
    cluster.shutdown().await;

    // Nodes the dev cluster does not have.
    let mut elsewhere = site.clone();
    elsewhere.partitions[0].nodes = "node[01-07]".into();
    let refused =
        quorum_dev::cluster::DevCluster::start(DevOptions { site: Some(elsewhere), ..DevOptions::for_tests() })
            .await
            .err()
            .expect("a partition of nodes the dev cluster lacks is refused");
    let message = refused.to_string();
    assert!(message.contains("partition scavenger names node node03") && message.contains("node[01-02]"), "{message}");
    // A key no controller reads, through the command itself.
    let bad = work.path().join("bad.toml");
    std::fs::write(&bad, format!("bogus_key = 1\n{text}")).unwrap();
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_quorum")).args(["dev", "--config"]).arg(&bad).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("bogus_key"), "{stderr}");
}
