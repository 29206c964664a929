//! Helpers shared by the end-to-end tests: an embedded cluster on ephemeral ports, a client,
//! and waiting for conditions with deadlines (never sleeping "long enough").

#![allow(dead_code)]

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use quorum_client::client::Client;
use quorum_dev::cluster::{DevCluster, DevOptions};
use quorum_proto::api::{self, JobInfo};

pub async fn cluster(opts: DevOptions) -> DevCluster {
    DevCluster::start(opts).await.expect("start dev cluster")
}

/// A client of `addrs` as this process's user, with the certificates and munged that every
/// dev cluster of this test process shares.
/// `NAME ARGS` (a Slurm command name such as scontrol) as `user` (by a token), run through
/// the `quorum` binary linked under that name in `bin`.
pub fn slurm_as(cluster: &DevCluster, bin: &Path, name: &str, user: &str, args: &[&str]) -> Run {
    let link = bin.join(name);
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_quorum"), &link).expect("a link in a fresh directory");
    }
    program_as(&link, &cluster.controllers_env(), Some(user), bin, args)
}

/// This machine's clock, in milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

pub fn client(addrs: &[String]) -> Client {
    Client::new(addrs.to_vec(), quorum_dev::security::DevSecurity::shared().client()).expect("client")
}

/// A client of `addrs` acting as Unix user `user` (made if missing), by a token minted with the
/// cluster's key.
pub fn client_as(addrs: &[String], user: &str) -> Client {
    ensure_user(user);
    token_client(addrs, user)
}

/// A client of `addrs` with a token for `user`, who may not exist.
pub fn token_client(addrs: &[String], user: &str) -> Client {
    let shared = quorum_dev::security::DevSecurity::shared();
    let security = quorum_client::client::Security {
        tls: shared.client().tls,
        proof: quorum_client::client::Proof::Token(shared.token_for(user)),
    };
    Client::new(addrs.to_vec(), security).expect("client")
}

/// Makes Unix user `name` unless it exists (the tests run as root, as CI does).
pub fn ensure_user(name: &str) {
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    if quorum_auth::users::by_name(name).is_ok() {
        return;
    }
    let status = std::process::Command::new("useradd")
        .args(["--no-create-home", "--shell", "/bin/sh", name])
        .status()
        .expect("useradd (the tests make Unix users, as root)");
    assert!(status.success() || quorum_auth::users::by_name(name).is_ok(), "useradd {name} failed");
}

/// A second agent under node `i`'s name and certificate with a spool of its own, as a copy
/// started by mistake on another host would be.
pub struct Twin {
    pub agent: std::sync::Arc<quorum_agent::Agent>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    _spool: tempfile::TempDir,
}

impl std::ops::Deref for Twin {
    type Target = quorum_agent::Agent;
    fn deref(&self) -> &quorum_agent::Agent {
        &self.agent
    }
}

impl Twin {
    pub fn start(cluster: &DevCluster, i: usize) -> Twin {
        let spool = tempfile::tempdir().expect("a spool for the twin");
        let mut config = cluster.agent_config(i);
        config.spool_dir = spool.path().to_path_buf();
        let agent = quorum_agent::Agent::new(config);
        let (stop, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(quorum_agent::serve(agent.clone(), rx));
        Twin { agent, stop, task, _spool: spool }
    }

    /// Stops it and kills whatever it runs.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        self.agent.kill_all();
        let _ = self.task.await;
    }
}

/// Polls `f` until it returns `Some`, failing the test with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn spec(argv: &[&str], dir: &Path) -> api::JobSpec {
    api::JobSpec {
        name: "test".into(),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        work_dir: dir.display().to_string(),
        submit_dir: dir.display().to_string(),
        env: vec![api::EnvVar { name: "PATH".into(), value: std::env::var("PATH").unwrap_or_default() }],
        ..Default::default()
    }
}

pub async fn submit_with_id(
    c: &Client,
    spec: api::JobSpec,
    request_id: &str,
) -> Result<api::SubmitJobResponse, tonic::Status> {
    let req = api::SubmitJobRequest {
        spec: Some(spec),
        user: "tester".into(),
        request_id: request_id.into(),
        test_only: false,
        run_as: String::new(),
    };
    c.call(|mut cl| {
        let req = req.clone();
        async move { cl.submit_job(req).await }
    })
    .await
}

pub async fn submit(c: &Client, spec: api::JobSpec) -> u64 {
    submit_with_id(c, spec, &uuid::Uuid::new_v4().to_string()).await.expect("submit").job_id
}

pub async fn job(c: &Client, id: u64) -> JobInfo {
    c.call(
        |mut cl| async move { cl.get_job(api::GetJobRequest { job_id: id, stale: false, array_task_id: None }).await },
    )
    .await
    .expect("get job")
    .job
    .expect("job in answer")
}

/// Every job, page by page.
pub async fn all_jobs(c: &Client) -> Vec<JobInfo> {
    let mut jobs = Vec::new();
    let mut after = 0;
    loop {
        let req = api::ListJobsRequest { after, ..Default::default() };
        let page = c
            .call(|mut cl| {
                let req = req.clone();
                async move { cl.list_jobs(req).await }
            })
            .await
            .expect("list jobs");
        jobs.extend(page.jobs);
        if page.next_after == 0 {
            return jobs;
        }
        after = page.next_after;
    }
}

pub async fn cancel(c: &Client, id: u64) -> api::CancelJobResponse {
    c.call(|mut cl| async move {
        cl.cancel_job(api::CancelJobRequest { job_ids: vec![id], user: "tester".into(), ..Default::default() }).await
    })
    .await
    .expect("cancel")
}

pub async fn nodes(c: &Client) -> Vec<api::NodeInfo> {
    c.call(|mut cl| async move { cl.list_nodes(api::ListNodesRequest::default()).await })
        .await
        .expect("list nodes")
        .nodes
}

/// Waits until the job is in one of `states` and returns it.
pub async fn wait_state(c: &Client, id: u64, states: &[&str], timeout: Duration) -> JobInfo {
    let start = Instant::now();
    loop {
        let j = job(c, id).await;
        if states.contains(&j.state.as_str()) {
            return j;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for job {id} to be one of {states:?}; it is {j:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until some replica leads, has recorded what every replica runs (so the cluster's
/// feature level is the lowest of theirs) and every agent is connected to it.
pub async fn wait_ready(cluster: &DevCluster, c: &Client, agents: usize) {
    let level = (0..cluster.addrs.len()).filter_map(|i| cluster.controller(i)).map(|r| r.replica.feature_level).min();
    wait_for(Duration::from_secs(20), "a leader with all agents connected", || async {
        let leader = cluster.controller(cluster.leader()?)?;
        (Some(leader.replica.shared.read().state.cluster_level()) == level).then_some(())?;
        let nodes =
            c.call(|mut cl| async move { cl.list_nodes(api::ListNodesRequest::default()).await }).await.ok()?.nodes;
        (nodes.iter().filter(|n| n.connected).count() == agents).then_some(())
    })
    .await
}

/// Whether any process of process group `pgid` still runs. Zombies do not count: a killed
/// job's orphans wait for whatever init this machine has to reap them.
pub fn group_alive(pgid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        // SAFETY: signal 0 checks existence only.
        return unsafe { libc::kill(-pgid, 0) == 0 };
    };
    dir.filter_map(Result::ok).any(|entry| {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { return false };
        // pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return false };
        let mut fields = rest.split_whitespace();
        let (state, _ppid, pgrp) = (fields.next(), fields.next(), fields.next());
        state != Some("Z") && pgrp.and_then(|p| p.parse::<i32>().ok()) == Some(pgid)
    })
}

/// `quorum admin versions --json`, run as an operator would.
pub fn versions(addrs: &[String]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quorum"))
        .args(["admin", "versions", "--json"])
        .env("QUORUM_CONTROLLERS", addrs.join(","))
        .envs(quorum_dev::security::DevSecurity::shared().env())
        .output()
        .expect("run quorum");
    assert!(out.status.success(), "quorum admin versions: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}

/// A Python that has `package` at `version` from PyPI (`module` imports), made by
/// `scripts/pypi-venv.sh` on first use.
pub fn pypi_python(package: &str, version: &str, module: &str) -> String {
    pypi_python_with(package, version, module, &[])
}

/// [`pypi_python`] with further requirements (`name==version`) in the same environment.
pub fn pypi_python_with(package: &str, version: &str, module: &str, extra: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pypi-venv.sh");
    let out = std::process::Command::new(script)
        .args([package, version, module])
        .args(extra)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("running scripts/pypi-venv.sh");
    assert!(out.status.success(), "scripts/pypi-venv.sh: a Python with {package} is needed (python3-venv, and PyPI)");
    String::from_utf8(out.stdout).expect("a path the script printed is UTF-8").trim().to_string()
}

/// `quorum-agent`, built beside `quorum` by `cargo test --workspace` (the README's command).
pub fn agent_binary() -> std::path::PathBuf {
    sibling_binary("quorum-agent")
}

/// A binary of another crate of the workspace (`quorum-agent`, `quorum-dbd`), built beside
/// `quorum` by `cargo test --workspace`.
pub fn sibling_binary(name: &str) -> std::path::PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_quorum")).with_file_name(name);
    assert!(path.exists(), "{} is missing: run the tests with `cargo test --workspace`", path.display());
    path
}

/// Gives each of `nodes` an address of its own on the loopback network (127.0.1.N) in
/// `/etc/hosts`, so that a job using its first node's name as a head address reaches it, as on
/// a cluster. Lines already there are kept; each missing one is appended in one write.
pub fn resolvable_nodes(nodes: &[&str]) {
    use std::io::Write;
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    let known: Vec<&str> = hosts.lines().flat_map(|l| l.split_whitespace().skip(1)).collect();
    for (i, node) in nodes.iter().enumerate() {
        if !known.contains(node) {
            let mut f =
                std::fs::OpenOptions::new().append(true).open("/etc/hosts").expect("/etc/hosts is writable (root)");
            f.write_all(format!("127.0.1.{} {node}\n", i + 1).as_bytes()).unwrap();
        }
    }
}

/// What a run of the `quorum` binary printed and how it ended.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Its output, failing the test when it did not succeed.
    pub fn success(self) -> String {
        assert_eq!(self.code, 0, "quorum failed: {}", self.stderr);
        self.stdout
    }
}

/// The job id of a `quorum submit` that succeeded ("Submitted job N").
pub fn submitted(run: Run) -> u64 {
    let out = run.success();
    out.trim().strip_prefix("Submitted job ").and_then(|id| id.parse().ok()).unwrap_or_else(|| panic!("{out}"))
}

/// `quorum ARGS` in `dir`, run as a user would (as whoever runs the tests).
pub fn quorum(controllers: &str, dir: &Path, args: &[&str]) -> Run {
    quorum_as(controllers, None, dir, args)
}

/// `quorum ARGS` in `dir` as `user` (by a token; this process's user, by MUNGE, without one).
pub fn quorum_as(controllers: &str, user: Option<&str>, dir: &Path, args: &[&str]) -> Run {
    program_as(Path::new(env!("CARGO_BIN_EXE_quorum")), controllers, user, dir, args)
}

/// `program ARGS` in `dir` as `user`, as [`quorum_as`] runs `quorum` (the program may be a link
/// to it under a Slurm command's name).
pub fn program_as(program: &Path, controllers: &str, user: Option<&str>, dir: &Path, args: &[&str]) -> Run {
    let shared = quorum_dev::security::DevSecurity::shared();
    let mut command = std::process::Command::new(program);
    command.args(args).env("QUORUM_CONTROLLERS", controllers).envs(shared.env()).current_dir(dir);
    if let Some(u) = user {
        ensure_user(u);
        command.env("QUORUM_TOKEN", shared.token_for(u));
    }
    let out = command.output().expect("run quorum");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `curl` of `url` with `args`: the HTTP status and the body (and what curl said on stderr).
pub fn curl(url: &str, args: &[&str]) -> (u16, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl (the tests need it: scripts/install-build-deps.sh)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    let status = status.trim().parse().unwrap_or(0);
    (status, format!("{body}{}", String::from_utf8_lossy(&out.stderr)))
}

/// The `quorum` binary where every user may run it (the build's is under root's home), with
/// `srun`, `sbatch`, `salloc`, `squeue`, `sbcast` and `sacct` linked beside it.
pub fn quorum_bin() -> &'static Path {
    use std::os::unix::fs::PermissionsExt;
    static BIN: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> = std::sync::OnceLock::new();
    &BIN.get_or_init(|| {
        let dir = tempfile::Builder::new().prefix("quorum-bin-").tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.path().join("quorum");
        std::fs::copy(env!("CARGO_BIN_EXE_quorum"), &bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        for name in ["srun", "sbatch", "salloc", "squeue", "sbcast", "sacct"] {
            std::os::unix::fs::symlink("quorum", dir.path().join(name)).unwrap();
        }
        (dir, bin)
    })
    .1
}
