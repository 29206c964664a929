//! `kill -9` of the leader's process while several clients submit: three controller replicas
//! and an agent, each its own OS process with its own RocksDB, talking real gRPC on loopback.
//! Every submit acknowledged before or after the kill is present exactly once (clients retry
//! with the same request id), the job running at the kill completes, a new job starts under the
//! new leader, and the killed replica, restarted, agrees with the others' state digest.
//!
//! The replica and agent processes are this test binary run again with [`CHILD_ENV`] set (see
//! [`child_process`]), so they run exactly the code under test.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use quorum_dev::security::DevSecurity;
use quorum_proto::api;

const T: Duration = Duration::from_secs(30);
const CHILD_ENV: &str = "QUORUM_TEST_CHILD";
/// A replica child's start, as the binary's flags say it: `restore=FILE` (`--restore FILE`) or
/// `force` (`--force-new-cluster`).
const START_ENV: &str = "QUORUM_TEST_START";
const CLIENTS: usize = 4;

/// An acknowledged submit: request id, job id, when it was sent and when it was answered.
type Acked = (String, u64, Instant, Instant);

/// Not a test: the entry point of the replica and agent processes the test below starts. It
/// is ignored in normal runs and started with `--ignored` and [`CHILD_ENV`] naming its role.
#[test]
#[ignore = "entry point of child processes"]
fn child_process() {
    let Ok(role) = std::env::var(CHILD_ENV) else { return };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_ansi(false)
        .try_init();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        match role.split_once(':') {
            Some(("controller", path)) => {
                let config = quorum_control::ControllerConfig::load(Path::new(path)).expect("config");
                let start = match std::env::var(START_ENV).as_deref() {
                    Ok("force") => quorum_control::replica::backup::Start { force_new_cluster: true, restore: None },
                    Ok(other) => quorum_control::replica::backup::Start {
                        restore: other.strip_prefix("restore=").map(PathBuf::from),
                        force_new_cluster: false,
                    },
                    Err(_) => Default::default(),
                };
                if let Some(said) = quorum_control::replica::backup::prepare(&config, &start).await.expect("prepare") {
                    println!("{said}");
                }
                let listener = tokio::net::TcpListener::bind(&config.listen).await.expect("bind");
                // SIGTERM shuts the replica down gracefully, as the real binary does.
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal");
                quorum_control::run(config, listener, async move {
                    term.recv().await;
                })
                .await
                .expect("controller");
            }
            Some(("agent", rest)) => {
                let (name, rest) = rest.split_once(':').expect("agent:NAME:SPOOL:ADDRS");
                let (spool, addrs) = rest.split_once(':').expect("agent:NAME:SPOOL:ADDRS");
                let controllers = addrs.split(',').map(str::to_string).collect();
                let mut config = quorum_agent::AgentConfig {
                    cpus: 4,
                    mem_mb: 8192,
                    kill_wait: Duration::from_secs(2),
                    switch_user: false,
                    cgroups: false,
                    ..quorum_agent::AgentConfig::new(name, controllers, PathBuf::from(spool))
                };
                // The parent's certificates (their directory in QUORUM_CERTS).
                let certs = std::env::var("QUORUM_CERTS").expect("QUORUM_CERTS");
                config.secure_with(Path::new(&certs)).expect("the agent's certificate");
                quorum_agent::run(config, Box::new(quorum_agent::gpu::SimSource::new(0)), std::future::pending()).await;
            }
            _ => panic!("unknown child role {role}"),
        }
    });
}

/// The child processes; all killed when the test ends, however it ends.
#[derive(Default)]
struct Procs {
    controllers: Vec<Option<Child>>,
    agent: Option<Child>,
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in self.controllers.iter_mut().flatten().chain(self.agent.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The name the test harness knows test `name` of this module by (`failover::child_process`).
fn this_test(name: &str) -> String {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    format!("{module}::{name}")
}

fn spawn_child(role: &str, log: &Path) -> Child {
    spawn_child_with(role, log, None)
}

fn spawn_child_with(role: &str, log: &Path, start: Option<&str>) -> Child {
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
    Command::new(std::env::current_exe().expect("test binary"))
        .args([&this_test("child_process"), "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env(START_ENV, start.unwrap_or_default())
        .env("QUORUM_CERTS", DevSecurity::shared().certs_dir())
        .env("RUST_LOG", "info,openraft=error")
        .stdout(Stdio::from(out.try_clone().expect("log file")))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("spawning a child process")
}

/// Ports outside the ephemeral range, so that a replica killed and started again finds its port
/// free rather than taken by some client's outgoing connection.
fn free_ports(n: usize) -> Vec<u16> {
    (0..n).map(|_| quorum_dev::ports::free_port().expect("a free port")).collect()
}

/// Replica `id`'s configuration; `extra` holds top-level keys (before any table).
fn controller_config(id: usize, addrs: &[String], data: &Path, extra: &str) -> String {
    let mut text = format!(
        "id = {}\nlisten = \"{}\"\ndata_dir = \"{}\"\n{extra}",
        id + 1,
        addrs[id],
        data.join(format!("controller-{}", id + 1)).display()
    );
    for (i, a) in addrs.iter().enumerate() {
        text.push_str(&format!("[[replicas]]\nid = {}\naddr = \"{a}\"\n", i + 1));
    }
    text.push_str("[[partitions]]\nname = \"batch\"\nnodes = \"fnode1\"\ndefault = true\nmax_time = \"1:00:00\"\n");
    text.push_str(&DevSecurity::shared().controller_toml(id as u64 + 1).expect("the replica's certificate"));
    text
}

async fn leader_index(c: &quorum_client::client::Client, addrs: &[String]) -> Option<usize> {
    for (i, a) in addrs.iter().enumerate() {
        let Ok(mut r) = c.replica(a) else { continue };
        let status =
            tokio::time::timeout(Duration::from_secs(1), r.get_replica_status(api::ReplicaStatusRequest {})).await;
        if let Ok(Ok(s)) = status {
            if s.into_inner().role == "leader" {
                return Some(i);
            }
        }
    }
    None
}

/// Three replica processes and an agent process, in a temporary directory.
struct ProcCluster {
    dir: tempfile::TempDir,
    work: PathBuf,
    addrs: Vec<String>,
    configs: Vec<PathBuf>,
    procs: Procs,
}

impl ProcCluster {
    async fn start() -> ProcCluster {
        Self::start_with("").await
    }

    /// Starts the cluster with `extra` lines in every replica's configuration.
    async fn start_with(extra: &str) -> ProcCluster {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let addrs: Vec<String> = free_ports(3).into_iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let configs: Vec<PathBuf> = (0..3)
            .map(|i| {
                let path = dir.path().join(format!("controller-{}.toml", i + 1));
                std::fs::write(&path, controller_config(i, &addrs, dir.path(), extra)).unwrap();
                path
            })
            .collect();
        let mut cluster = ProcCluster { dir, work, addrs, configs, procs: Procs::default() };
        for i in 0..3 {
            let child = cluster.spawn_controller(i);
            cluster.procs.controllers.push(Some(child));
        }
        cluster.start_agent();
        let c = client(&cluster.addrs);
        wait_for(T, "a leader with the agent connected", || async {
            let nodes =
                c.call(|mut cl| async move { cl.list_nodes(api::ListNodesRequest::default()).await }).await.ok()?.nodes;
            nodes.iter().any(|n| n.connected).then_some(())
        })
        .await;
        cluster
    }

    /// Starts the agent process (again) on its spool directory.
    fn start_agent(&mut self) {
        let spool = self.dir.path().join("spool");
        let n = std::fs::read_dir(self.dir.path())
            .unwrap()
            .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().starts_with("agent-")));
        let log = self.dir.path().join(format!("agent-{}.log", n.count() + 1));
        DevSecurity::shared().ensure(&quorum_auth::pki::PeerRole::Agent("fnode1".into())).expect("agent certificate");
        let child = spawn_child(&format!("agent:fnode1:{}:{}", spool.display(), self.addrs.join(",")), &log);
        std::fs::write(self.dir.path().join("agent.pid"), child.id().to_string()).unwrap();
        self.procs.agent = Some(child);
    }

    /// Starts replica `i` and writes its pid to `controller-<id>.pid`.
    fn spawn_controller(&self, i: usize) -> Child {
        self.spawn_controller_with(i, None)
    }

    /// Starts replica `i` with `start` ([`START_ENV`]).
    fn spawn_controller_with(&self, i: usize, start: Option<&str>) -> Child {
        let log = self.dir.path().join(format!("controller-{}.log", i + 1));
        let child = spawn_child_with(&format!("controller:{}", self.configs[i].display()), &log, start);
        std::fs::write(self.dir.path().join(format!("controller-{}.pid", i + 1)), child.id().to_string()).unwrap();
        child
    }

    /// Starts again every replica and agent whose process has exited, as systemd's `Restart=always`
    /// would; how many it started.
    fn restart_exited(&mut self) -> usize {
        let mut started = 0;
        for i in 0..self.procs.controllers.len() {
            let exited = self.procs.controllers[i].as_mut().is_some_and(|c| c.try_wait().unwrap().is_some());
            if exited {
                self.restart_controller(i);
                started += 1;
            }
        }
        if self.procs.agent.as_mut().is_some_and(|c| c.try_wait().unwrap().is_some()) {
            self.start_agent();
            started += 1;
        }
        started
    }

    /// Stops replica `i`: SIGKILL, or SIGTERM and a wait for its graceful exit.
    fn stop_controller(&mut self, i: usize, graceful: bool) {
        let mut child = self.procs.controllers[i].take().expect("replica running");
        if graceful {
            // SAFETY: signalling a child process this test started and has not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let log = self.dir.path().join(format!("controller-{}.log", i + 1));
                    let text = std::fs::read_to_string(log).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(40).collect();
                    panic!(
                        "replica {} did not stop within 20 s of SIGTERM; its log ends:\n{}",
                        i + 1,
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        } else {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn restart_controller(&mut self, i: usize) {
        let child = self.spawn_controller(i);
        self.procs.controllers[i] = Some(child);
    }
}

/// Clients submitting held jobs back to back, each with its own request ids, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
    failed: Arc<Mutex<Vec<(String, String)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(addrs: &[String], work: &Path) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
        let failed: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let mut tasks = Vec::new();
        for k in 0..CLIENTS {
            let (stop, acked, failed) = (stop.clone(), acked.clone(), failed.clone());
            let c = client(addrs);
            let work = work.to_path_buf();
            tasks.push(tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let request_id = format!("client{k}-{n}");
                    let mut s = spec(&["true"], &work);
                    s.hold = true;
                    let sent = Instant::now();
                    match submit_with_id(&c, s, &request_id).await {
                        Ok(r) => acked.lock().unwrap().push((request_id, r.job_id, sent, Instant::now())),
                        Err(e) => failed.lock().unwrap().push((request_id, e.message().to_string())),
                    }
                }
            }));
        }
        Load { stop, acked, failed, tasks }
    }

    fn acked_so_far(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Waits until `n` submits sent after `since` have been acknowledged.
    async fn wait_acked_after(&self, since: Instant, n: usize, what: &str) {
        wait_for(T, what, || async {
            (self.acked.lock().unwrap().iter().filter(|a| a.2 >= since).count() >= n).then_some(())
        })
        .await;
    }

    /// Stops the clients; what they had acknowledged, and the requests that failed.
    async fn finish(self) -> (Vec<Acked>, Vec<(String, String)>) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.unwrap();
        }
        let acked = self.acked.lock().unwrap().clone();
        let failed = self.failed.lock().unwrap().clone();
        (acked, failed)
    }
}

/// Every acknowledged submit is there, once: as many held jobs as acknowledged requests, and no
/// two requests answered with the same job.
async fn assert_each_acknowledged_job_once(c: &quorum_client::client::Client, acked: &[Acked]) {
    let jobs = all_jobs(c).await;
    let held: std::collections::BTreeSet<u64> = jobs.iter().filter(|j| !j.held.is_empty()).map(|j| j.id).collect();
    let answered: std::collections::BTreeSet<u64> = acked.iter().map(|a| a.1).collect();
    assert_eq!(answered.len(), acked.len(), "two requests were answered with the same job");
    assert_eq!(held, answered, "the held jobs are not exactly the acknowledged ones");
}

/// Waits until every replica answers a digest point, and asserts they agree there.
async fn assert_digests_agree(c: &quorum_client::client::Client) {
    let report = wait_for(T, "every replica to answer the digest", || async {
        let r = quorum_client::digest::collect(c).await.ok()?;
        (r.missing() == 0).then_some(r)
    })
    .await;
    assert!(report.agree(), "{}", report.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_leader_under_concurrent_submits_loses_no_acknowledged_job() {
    let mut cluster = ProcCluster::start().await;
    let (addrs, work) = (cluster.addrs.clone(), cluster.work.clone());
    let c = client(&addrs);

    // A job that is running when the leader dies.
    let long = submit(&c, spec(&["bash", "-c", "sleep 3; echo done > long.txt"], &work)).await;
    wait_state(&c, long, &["RUNNING"], T).await;

    let started = Instant::now();
    let load = Load::start(&addrs, &work);
    load.wait_acked_after(started, 100, "submits acknowledged before the kill").await;
    let leader = leader_index(&c, &addrs).await.expect("a leader");
    let before = load.acked_so_far();
    let killed_at = Instant::now();
    cluster.stop_controller(leader, false);
    load.wait_acked_after(killed_at, 100, "submits sent after the kill acknowledged").await;
    let (acked, failed) = load.finish().await;
    assert!(before > 0, "no submit was acknowledged before the kill");
    assert!(failed.is_empty(), "client requests failed across the failover: {failed:?}");
    // The first write sent after the kill: acknowledged once a new leader committed it.
    let first_after = acked.iter().filter(|a| a.2 > killed_at).map(|a| a.3 - killed_at).min();
    let first_after = first_after.expect("no submit sent after the kill was acknowledged");
    eprintln!(
        "{} submits acknowledged ({before} before the kill); the first sent after the kill was acknowledged {first_after:?} after it",
        acked.len()
    );

    assert_each_acknowledged_job_once(&c, &acked).await;
    // A survivor saw the leader's process gone and campaigned at once (the watchdog), rather
    // than waiting out openraft's lease and election timers.
    let campaigned = (0..3).filter(|i| *i != leader).any(|i| {
        let log = std::fs::read_to_string(cluster.dir.path().join(format!("controller-{}.log", i + 1)));
        log.unwrap_or_default().contains("the leader is gone: campaigning")
    });
    assert!(campaigned, "no surviving replica campaigned on finding the leader gone");

    // The job running at the kill completed and was recorded by the new leader; a new job
    // starts and completes under it.
    let j = wait_state(&c, long, &["COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    assert_eq!(std::fs::read_to_string(work.join("long.txt")).unwrap(), "done\n");
    let after = submit(&c, spec(&["bash", "-c", "echo after > after.txt"], &work)).await;
    assert_eq!(wait_state(&c, after, &["COMPLETED", "FAILED"], T).await.state, "COMPLETED");

    // The killed replica comes back, catches up (dropping whatever it had not committed) and
    // agrees with the others.
    cluster.restart_controller(leader);
    assert_digests_agree(&c).await;
}

/// `deploy/rolling-upgrade.sh` on three replica processes that start as the older release
/// (feature level 1), under continuous submits: each "upgrade" drops the emulation from the
/// replica's config and stops it with SIGTERM, and it is started again as systemd would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_of_every_replica_under_load_fails_no_request() {
    let mut cluster = ProcCluster::start_with("emulate_feature_level = 1\n").await;
    let (addrs, work) = (cluster.addrs.clone(), cluster.work.clone());
    let c = client(&addrs);
    wait_for(T, "every replica's version recorded", || async {
        let v = versions(&addrs);
        (v["replicas"].as_array()?.iter().all(|r| r["feature_level"] == 1) && v["cluster_level"] == 1).then_some(())
    })
    .await;
    // A job that runs until the whole upgrade, agent included, is over.
    let long = submit(
        &c,
        spec(
            &["bash", "-c", "echo $$ >> long.starts; until [ -e release ]; do sleep 0.05; done; echo done > long.txt"],
            &work,
        ),
    )
    .await;
    wait_state(&c, long, &["RUNNING"], T).await;

    let started = Instant::now();
    let load = Load::start(&addrs, &work);
    load.wait_acked_after(started, 50, "submits acknowledged before the upgrade").await;
    let dir = cluster.dir.path().display().to_string();
    let upgrade = format!(
        "sed -i '/^emulate_feature_level/d' {dir}/controller-{{id}}.toml && kill -TERM $(cat {dir}/controller-{{id}}.pid)"
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/rolling-upgrade.sh");
    let out = std::fs::File::create(cluster.dir.path().join("upgrade.log")).unwrap();
    let mut run = Command::new("bash")
        .arg(&script)
        .args(["--controllers", &addrs.join(","), "--replica-cmd", &upgrade, "--timeout", "60"])
        .args(["--agent-cmd", &format!("kill -TERM $(cat {dir}/agent.pid)")])
        .env("QUORUM", env!("CARGO_BIN_EXE_quorum"))
        .envs(DevSecurity::shared().env())
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("run rolling-upgrade.sh");
    let mut restarts = 0;
    let status = loop {
        restarts += cluster.restart_exited();
        if let Some(status) = run.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(240), "the upgrade script is still running after 240 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let log = std::fs::read_to_string(cluster.dir.path().join("upgrade.log")).unwrap();
    assert!(status.success(), "rolling-upgrade.sh failed:\n{log}");
    assert_eq!(restarts, 4, "each replica and the agent restarted once:\n{log}");
    assert_eq!(log.matches("is back (").count(), 3, "{log}");
    assert!(log.contains("node fnode1: agent") && log.contains("every replica and agent upgraded"), "{log}");
    std::fs::write(work.join("release"), "").unwrap();

    let upgraded = Instant::now();
    load.wait_acked_after(upgraded, 50, "submits acknowledged after the upgrade").await;
    let (acked, failed) = load.finish().await;
    assert!(failed.is_empty(), "client requests failed during the rolling upgrade: {failed:?}");
    assert!(!acked.is_empty());
    assert_each_acknowledged_job_once(&c, &acked).await;
    wait_for(T, "the cluster level to rise once every replica runs the new release", || async {
        (versions(&addrs)["cluster_level"] == quorum_state::FEATURE_LEVEL).then_some(())
    })
    .await;
    assert_digests_agree(&c).await;
    // The job that ran through it completed, started once.
    let j = wait_state(&c, long, &["COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    assert_eq!(std::fs::read_to_string(work.join("long.starts")).unwrap().lines().count(), 1);
}

/// A job that ran to its end and left the hot state for the job history (with `min_job_age_s = 1`).
async fn job_in_history(c: &quorum_client::client::Client, work: &Path) -> u64 {
    let aged = submit(c, spec(&["true"], work)).await;
    wait_state(c, aged, &["COMPLETED"], T).await;
    wait_for(T, "the job to leave the hot state", || async {
        (!all_jobs(c).await.iter().any(|j| j.id == aged)).then_some(())
    })
    .await;
    aged
}

fn membership_request(user: &str, id: u64, addr: &str) -> api::MembershipChangeRequest {
    api::MembershipChangeRequest { user: user.into(), id, addr: addr.into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_3_to_5_under_load_by_snapshot_and_shrink_back_to_3_leader_included() {
    let extra = "snapshot_every = 300\nsnapshot_keep_logs = 50\nmin_job_age_s = 1\n";
    let mut cluster = ProcCluster::start_with(extra).await;
    let (addrs, work) = (cluster.addrs.clone(), cluster.work.clone());
    let c = client(&addrs);
    // A job that runs and leaves the hot state for the job history before the new replicas
    // join: they install a snapshot without it, and must copy it from a peer's history.
    let aged = job_in_history(&c, &work).await;
    let load = Load::start(&addrs, &work);
    wait_for(Duration::from_secs(60), "two thousand acknowledged submits", || async {
        (load.acked_so_far() >= 2000).then_some(())
    })
    .await;

    // Replicas 4 and 5, started with `join = true`, are added one after the other while the
    // clients go on.
    let new_addrs: Vec<String> = free_ports(2).into_iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let all: Vec<String> = addrs.iter().chain(&new_addrs).cloned().collect();
    let joining = format!("{extra}join = true\n");
    for i in 3..5 {
        let path = cluster.dir.path().join(format!("controller-{}.toml", i + 1));
        std::fs::write(&path, controller_config(i, &all, cluster.dir.path(), &joining)).unwrap();
        cluster.configs.push(path);
        let child = cluster.spawn_controller(i);
        cluster.procs.controllers.push(Some(child));
    }
    let addr4 = new_addrs[0].clone();
    ensure_user("mallory");
    let add = |user: &'static str, id: u64, addr: String| {
        let c = client_as(c.addrs(), user);
        async move {
            let req = membership_request(user, id, &addr);
            c.call(|mut cl| {
                let req = req.clone();
                async move { cl.add_replica(req).await }
            })
            .await
        }
    };
    let denied = add("mallory", 4, addr4.clone()).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    let added = add("root", 4, addr4.clone()).await.expect("add-replica");
    let voters: Vec<u64> = added.members.iter().map(|m| m.id).collect();
    assert_eq!(voters, vec![1, 2, 3, 4]);
    let again = add("root", 4, addr4.clone()).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::AlreadyExists, "{again:?}");
    let added = add("root", 5, new_addrs[1].clone()).await.expect("add-replica 5");
    let voters: Vec<u64> = added.members.iter().map(|m| m.id).collect();
    assert_eq!(voters, vec![1, 2, 3, 4, 5]);

    // The log behind the leader's snapshot was purged, so the new replica can only have caught
    // up by installing a snapshot; its digest agrees with the others'.
    let mut r4 = c.replica(&addr4).unwrap();
    let status = r4.get_replica_status(api::ReplicaStatusRequest {}).await.unwrap().into_inner();
    assert!(status.snapshot_index > 0, "the new replica holds no snapshot: {status:?}");
    assert!(status.applied_index > 2000, "promoted before it caught up: {status:?}");
    // Its history answers for the job that left the hot state before it joined.
    let copied = wait_for(T, "the new replica's history to answer for the job", || {
        let mut r4 = r4.clone();
        async move {
            let req = api::GetJobRequest { job_id: aged, stale: true, array_task_id: None };
            r4.get_job(req).await.ok()?.into_inner().job
        }
    })
    .await;
    assert_eq!(copied.state, "COMPLETED");
    let c_all = client(&all);
    assert_digests_agree(&c_all).await;

    // Shrink back to three: a follower, then the leader itself.
    let leader = leader_index(&c_all, &all).await.expect("a leader");
    let gone = (0..5).find(|i| *i != leader).unwrap();
    let remove = |id: u64| {
        let c = &c_all;
        async move {
            let req = membership_request("root", id, "");
            c.call(|mut cl| {
                let req = req.clone();
                async move { cl.remove_replica(req).await }
            })
            .await
        }
    };
    let unknown = remove(9).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    assert!(unknown.message().contains("replica 9 is not a member"), "{unknown:?}");
    let removed = remove(gone as u64 + 1).await.expect("remove-replica");
    assert_eq!(removed.members.len(), 4);
    assert!(removed.members.iter().all(|m| m.id != gone as u64 + 1));
    cluster.stop_controller(gone, true);
    let removed = remove(leader as u64 + 1).await.expect("remove-replica of the leader");
    assert_eq!(removed.members.len(), 3);
    assert!(removed.members.iter().all(|m| m.id != leader as u64 + 1));
    cluster.stop_controller(leader, true);
    let remaining: Vec<String> = (0..5).filter(|i| *i != gone && *i != leader).map(|i| all[i].clone()).collect();
    let c_all = client(&remaining);
    let new_leader = wait_for(T, "a leader among the remaining three", || leader_index(&c_all, &remaining)).await;
    assert!(remaining[new_leader] != all[leader]);
    let after = Instant::now();
    load.wait_acked_after(after, 50, "submits acknowledged by the three remaining").await;

    let (acked, failed) = load.finish().await;
    assert!(failed.is_empty(), "client requests failed during the membership changes: {failed:?}");
    assert_each_acknowledged_job_once(&c_all, &acked).await;
    assert_digests_agree(&c_all).await;
}

/// The agent process is killed with SIGKILL while jobs run and started again: the jobs go on
/// under their supervisors, one that ended while the agent was away is reported with its real
/// exit status, one still running completes with its own, one is cancelled through the new agent,
/// and none is started twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_outlive_an_agent_killed_and_restarted() {
    let mut cluster = ProcCluster::start().await;
    let (addrs, work) = (cluster.addrs.clone(), cluster.work.clone());
    let c = client(&addrs);
    let job = |name: &str, script: &str| {
        let mut s = spec(&["bash", "-c", &format!("echo $$ >> {name}.starts; {script}")], &work);
        s.name = name.into();
        s
    };
    let away = submit(&c, job("away", "sleep 1; echo done > away.txt; exit 3")).await;
    let through = submit(&c, job("through", "sleep 4; exit 7")).await;
    let cancelled = submit(&c, job("cancelled", "sleep 600")).await;
    for id in [away, through, cancelled] {
        wait_state(&c, id, &["RUNNING"], T).await;
    }
    wait_for(T, "every job to have started", || async {
        ["away", "through", "cancelled"].iter().all(|n| work.join(format!("{n}.starts")).exists()).then_some(())
    })
    .await;

    let mut agent = cluster.procs.agent.take().expect("agent running");
    agent.kill().unwrap();
    agent.wait().unwrap();
    // One job ends while no agent runs; the others go on.
    wait_for(T, "the job to end while the agent is away", || async { work.join("away.txt").exists().then_some(()) })
        .await;
    let pgid = |name: &str| -> i32 {
        std::fs::read_to_string(work.join(format!("{name}.starts"))).unwrap().trim().parse().unwrap()
    };
    assert!(group_alive(pgid("through")) && group_alive(pgid("cancelled")), "the agent's death killed its jobs");
    assert_eq!(job_state(&c, away).await, "RUNNING", "the leader learns of the end only from the agent");

    cluster.start_agent();
    let j = wait_state(&c, away, &["COMPLETED", "FAILED"], T).await;
    assert_eq!((j.state.as_str(), j.exit_code), ("FAILED", 3), "{j:?}");
    cancel(&c, cancelled).await;
    let j = wait_state(&c, cancelled, &["CANCELLED", "COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "CANCELLED", "{j:?}");
    wait_for(T, "the cancelled job's processes to be gone", || async {
        (!group_alive(pgid("cancelled"))).then_some(())
    })
    .await;
    let j = wait_state(&c, through, &["COMPLETED", "FAILED"], T).await;
    assert_eq!((j.state.as_str(), j.exit_code), ("FAILED", 7), "{j:?}");
    for name in ["away", "through", "cancelled"] {
        let starts = std::fs::read_to_string(work.join(format!("{name}.starts"))).unwrap();
        assert_eq!(starts.lines().count(), 1, "job {name} started more than once");
    }
    // The records of acknowledged exits are cleaned up.
    wait_for(T, "the job records to be removed", || async {
        let left = std::fs::read_dir(cluster.dir.path().join("spool/jobs")).ok()?.count();
        (left == 0).then_some(())
    })
    .await;
}

async fn job_state(c: &quorum_client::client::Client, id: u64) -> String {
    job(c, id).await.state
}

/// A job's record from any replica, the job history included.
async fn any_job(c: &quorum_client::client::Client, id: u64) -> Option<api::JobInfo> {
    c.call(
        |mut cl| async move { cl.get_job(api::GetJobRequest { job_id: id, stale: true, array_task_id: None }).await },
    )
    .await
    .ok()?
    .job
}

/// `quorum admin backup` while clients submit; a new three-replica cluster restored from the
/// file (`--restore` on each replica) holds every job acknowledged before the backup began,
/// held as it was, and the job history; job ids go on from where they were; the restored
/// replicas' digests agree. A flipped byte or a cut file is refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_into_a_new_cluster() {
    let extra = "min_job_age_s = 1\n";
    let mut cluster = ProcCluster::start_with(extra).await;
    let (addrs, work) = (cluster.addrs.clone(), cluster.work.clone());
    let c = client(&addrs);
    // A job that ran and moved to the job history.
    let aged = job_in_history(&c, &work).await;

    let load = Load::start(&addrs, &work);
    wait_for(T, "a hundred acknowledged submits", || async { (load.acked_so_far() >= 100).then_some(()) }).await;
    let began = Instant::now();
    let file = cluster.dir.path().join("cluster.backup");
    let out = quorum(&addrs.join(","), &work, &["admin", "backup", file.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("backup of replica") && out.stdout.contains("history records"), "{out:?}");
    let (acked, failed) = load.finish().await;
    assert!(failed.is_empty(), "{failed:?}");
    let before: Vec<u64> = acked.iter().filter(|a| a.3 < began).map(|a| a.1).collect();
    assert!(before.len() >= 100);
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "a backup holds every job's script and environment");
    let highest = acked.iter().map(|a| a.1).max().unwrap();

    // Damaged copies are refused, and nothing is written.
    let bytes = std::fs::read(&file).unwrap();
    let level = quorum_state::FEATURE_LEVEL;
    let damaged = cluster.dir.path().join("damaged.backup");
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 1;
    std::fs::write(&damaged, &flipped).unwrap();
    let e = quorum_control::replica::backup::verify(&damaged, level).unwrap_err();
    assert!(e.contains("checksum") || e.contains("decode") || e.contains("damaged"), "{e}");
    let fresh = cluster.dir.path().join("fresh");
    let mut config = quorum_control::ControllerConfig::load(&cluster.configs[0]).unwrap();
    config.data_dir = fresh.clone();
    assert!(quorum_control::replica::backup::restore(&config, &damaged).await.is_err());
    std::fs::write(&damaged, &bytes[..bytes.len() - 100]).unwrap();
    let e = quorum_control::replica::backup::restore(&config, &damaged).await.unwrap_err().to_string();
    assert!(e.contains("cut short"), "{e}");
    assert!(!fresh.join("db").exists(), "a refused backup wrote nothing");
    assert!(quorum_control::replica::backup::verify(&file, level).is_ok());

    // The old cluster goes; a new one, on other ports and directories, starts from the file.
    for i in 0..3 {
        cluster.stop_controller(i, true);
    }
    if let Some(mut agent) = cluster.procs.agent.take() {
        let _ = agent.kill();
        let _ = agent.wait();
    }
    let new_dir = tempfile::tempdir().unwrap();
    let new_addrs: Vec<String> = free_ports(3).into_iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let configs: Vec<PathBuf> = (0..3)
        .map(|i| {
            let path = new_dir.path().join(format!("controller-{}.toml", i + 1));
            std::fs::write(&path, controller_config(i, &new_addrs, new_dir.path(), extra)).unwrap();
            path
        })
        .collect();
    let mut restored =
        ProcCluster { dir: new_dir, work: work.clone(), addrs: new_addrs.clone(), configs, procs: Procs::default() };
    let start = format!("restore={}", file.display());
    for i in 0..3 {
        let child = restored.spawn_controller_with(i, Some(&start));
        restored.procs.controllers.push(Some(child));
    }
    restored.start_agent();
    let c2 = client(&new_addrs);
    for id in &before {
        let j = wait_for(T, "an acknowledged job in the restored cluster", || async { any_job(&c2, *id).await }).await;
        assert!(!j.held.is_empty() && j.state == "PENDING", "{j:?}");
    }
    let old = any_job(&c2, aged).await.expect("the job history came with the backup");
    assert_eq!(old.state, "COMPLETED");
    // Ids go on; a new job runs on the agent that joined the restored cluster.
    let next = submit(&c2, spec(&["true"], &work)).await;
    assert!(next > aged && next > before.iter().copied().max().unwrap(), "{next} after {highest}");
    wait_state(&c2, next, &["COMPLETED"], T).await;
    assert_digests_agree(&c2).await;
}

/// Two of three replicas lost with their disks: the survivor, started with
/// `--force-new-cluster`, becomes a cluster of one with everything it had (refused while another
/// old member answers), runs a new job, and grows back to three with `add-replica`; the three
/// agree, and no job it had is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_survivor_becomes_a_new_cluster_and_grows_back() {
    let mut cluster = ProcCluster::start().await;
    let (addrs, work) = (cluster.addrs.clone(), cluster.work.clone());
    let c = client(&addrs);
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(submit(&c, spec(&["true"], &work)).await);
    }
    for id in &ids {
        wait_state(&c, *id, &["COMPLETED"], T).await;
    }
    // Every replica has every entry before the majority goes.
    assert_digests_agree(&c).await;

    // While replica 2 still answers, the survivor refuses.
    let mut config1 = quorum_control::ControllerConfig::load(&cluster.configs[0]).unwrap();
    cluster.stop_controller(0, true);
    let refused = quorum_control::replica::backup::force_new_cluster(&config1).await.unwrap_err().to_string();
    assert!(refused.contains("answers at"), "{refused}");
    for i in 1..3 {
        cluster.stop_controller(i, false);
        std::fs::remove_dir_all(cluster.dir.path().join(format!("controller-{}", i + 1))).unwrap();
    }
    let child = cluster.spawn_controller_with(0, Some("force"));
    cluster.procs.controllers[0] = Some(child);
    let alone = client(&addrs[..1]);
    let next = submit(&alone, spec(&["true"], &work)).await;
    wait_state(&alone, next, &["COMPLETED"], T).await;
    for id in &ids {
        let j = wait_for(T, "the survivor's jobs", || async { any_job(&alone, *id).await }).await;
        assert_eq!(j.state, "COMPLETED");
    }
    let log = std::fs::read_to_string(cluster.dir.path().join("controller-1.log")).unwrap();
    assert!(log.contains("is now a cluster of one at index"), "{log}");

    // Fresh replicas 2 and 3 join on their old addresses, with empty disks.
    for i in 1..3 {
        std::fs::write(&cluster.configs[i], controller_config(i, &addrs, cluster.dir.path(), "join = true\n")).unwrap();
        let child = cluster.spawn_controller(i);
        cluster.procs.controllers[i] = Some(child);
    }
    for (id, addr) in [(2u64, &addrs[1]), (3, &addrs[2])] {
        let req = membership_request("root", id, addr);
        alone
            .call(|mut cl| {
                let req = req.clone();
                async move { cl.add_replica(req).await }
            })
            .await
            .unwrap_or_else(|e| panic!("add-replica {id}: {e:?}"));
    }
    let c = client(&addrs);
    assert_digests_agree(&c).await;
    assert_eq!(any_job(&c, next).await.map(|j| j.state).as_deref(), Some("COMPLETED"));
    config1.data_dir = cluster.dir.path().join("controller-1");
    let kept: Vec<_> = std::fs::read_dir(&config1.data_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("db.before-recovery-"))
        .collect();
    assert_eq!(kept.len(), 1, "the old data is kept beside the new");
}
