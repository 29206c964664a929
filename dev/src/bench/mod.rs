//! `quorum bench`: load generators against a real cluster. By default each starts its own:
//! `submit` and `dispatch` an embedded 3-replica cluster with an agent (real RocksDB, real gRPC
//! on loopback), `failover` three `quorum-controller` processes, so that the leader can be
//! killed with SIGKILL, and `memory` measures such processes. Each prints a progress line while
//! it runs, then a table or `--json`.

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use quorum_proto::api;

mod agents;
mod memory;

use crate::cluster::{DevCluster, DevOptions};
use quorum_client::client::Client;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchCommand,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Concurrent clients submitting held jobs: throughput and latency of acknowledged (committed
    /// and durable) submits.
    Submit {
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Submits in all.
        #[arg(long, default_value_t = 20_000)]
        jobs: usize,
        #[command(flatten)]
        shape: JobShape,
        /// Load the running cluster at --controllers (QUORUM_CONTROLLERS) instead of starting one.
        #[arg(long)]
        external: bool,
        #[arg(long)]
        json: bool,
    },
    /// On an idle cluster, the time from sending a submit to the job's process starting (the job
    /// records its own start time), one job at a time.
    Dispatch {
        #[arg(long, default_value_t = 200)]
        jobs: usize,
        #[arg(long)]
        json: bool,
    },
    /// N simulated agents (real gRPC streams, one per node) registering and heartbeating every
    /// second to three quorum-controller processes: heartbeat round trips, the leader's CPU,
    /// and whether any node was falsely declared DOWN.
    Agents {
        #[arg(long, default_value_t = 10_000)]
        agents: usize,
        /// Seconds of steady heartbeats measured once every agent is registered.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// The controller binary (default: quorum-controller next to this program).
        #[arg(long)]
        controller_bin: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// The resident memory of each replica (three quorum-controller processes) holding this
    /// many pending (held) jobs, submitted one by one (or as job arrays, --arrays).
    Memory {
        #[arg(long, default_value_t = 1_000_000)]
        jobs: usize,
        #[command(flatten)]
        shape: JobShape,
        /// Submit the jobs as job arrays of up to 100,000 tasks (which share one spec) instead
        /// of one by one.
        #[arg(long)]
        arrays: bool,
        /// Concurrent clients submitting one by one.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// The controller binary (default: quorum-controller next to this program).
        #[arg(long)]
        controller_bin: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Kills the leader's process with SIGKILL under submit load, run after run: the time from
    /// the kill to the first acknowledged submit sent after it.
    Failover {
        #[arg(long, default_value_t = 10)]
        runs: usize,
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// The controller binary (default: quorum-controller next to this program).
        #[arg(long)]
        controller_bin: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

/// `controllers`: the global --controllers, used with `submit --external`.
pub async fn run(args: BenchArgs, controllers: Vec<String>) -> anyhow::Result<()> {
    match args.what {
        BenchCommand::Submit { clients, jobs, shape, external, json } => {
            submit(clients, jobs, shape, external.then_some(controllers), json).await
        }
        BenchCommand::Dispatch { jobs, json } => dispatch(jobs, json).await,
        BenchCommand::Memory { jobs, shape, arrays, clients, controller_bin, json } => {
            memory::run(memory::Load { jobs, shape, arrays, clients }, controller_bin, json).await
        }
        BenchCommand::Agents { agents, seconds, controller_bin, json } => {
            agents::run(agents, seconds, controller_bin, json).await
        }
        BenchCommand::Failover { runs, clients, controller_bin, json } => {
            failover(runs, clients, controller_bin, json).await
        }
    }
}

/// Percentiles of a set of durations, in milliseconds.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Spread {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub min_ms: f64,
}

pub fn spread(samples: &mut [Duration]) -> Spread {
    samples.sort_unstable();
    let at = |q: f64| -> f64 {
        if samples.is_empty() {
            return 0.0;
        }
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1000.0
    };
    Spread {
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: at(1.0),
        min_ms: samples.first().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
    }
}

fn progress(line: &str) {
    let mut err = std::io::stderr();
    let _ = write!(err, "\r\x1b[2K{line}");
    let _ = err.flush();
}

fn progress_done() {
    eprintln!();
}

/// What each submitted job carries besides a command.
#[derive(Args, Debug, Clone, Copy)]
pub struct JobShape {
    /// Environment variables in each job, as `quorum submit` sends its shell's under
    /// --export=ALL (a login shell's 40 of ~65 bytes make 2.6 KB); 0 for none.
    #[arg(long, default_value_t = 40)]
    pub env_vars: usize,
    /// Give every job a different environment; by default the jobs of one client share one, as
    /// the jobs submitted from one shell do.
    #[arg(long)]
    pub unique_env: bool,
}

impl JobShape {
    /// The `i`th job of client `client`: held, with its environment.
    fn job(&self, dir: &Path, client: usize, i: usize) -> api::JobSpec {
        let shell = if self.unique_env { format!("job{i}") } else { format!("client{client}") };
        api::JobSpec { env: shell_env(self.env_vars, &shell), ..held_job(dir) }
    }

    /// The jobs of client `client`.
    fn for_client(self, dir: &Path, client: usize) -> ClientJobs {
        let shared = (!self.unique_env).then(|| self.job(dir, client, 0));
        ClientJobs { shape: self, dir: dir.to_path_buf(), client, shared }
    }

    fn describe(&self) -> String {
        match (self.env_vars, self.unique_env) {
            (0, _) => "no environment".into(),
            (n, false) => format!("{n} environment variables ({} B), one environment per client", env_bytes(n)),
            (n, true) => format!("{n} environment variables ({} B), a different one per job", env_bytes(n)),
        }
    }
}

/// The jobs one client submits. Jobs sharing the client's environment are one job built once,
/// as a program submitting from one shell holds its environment once: the load generator's own
/// work per job stays small beside the cluster's on the same cores.
struct ClientJobs {
    shape: JobShape,
    dir: PathBuf,
    client: usize,
    shared: Option<api::JobSpec>,
}

impl ClientJobs {
    fn job(&self, i: usize) -> Cow<'_, api::JobSpec> {
        match &self.shared {
            Some(job) => Cow::Borrowed(job),
            None => Cow::Owned(self.shape.job(&self.dir, self.client, i)),
        }
    }
}

/// A login shell's environment as `shell` would send it: `vars` variables of ~65 bytes.
fn shell_env(vars: usize, shell: &str) -> Vec<api::EnvVar> {
    (0..vars)
        .map(|i| api::EnvVar {
            name: format!("BENCH_VARIABLE_{i:02}"),
            value: format!("/home/bench/{shell:<10}/software/module-{i:02}/lib64:/usr/local/lib"),
        })
        .collect()
}

fn env_bytes(vars: usize) -> usize {
    shell_env(vars, "client0").iter().map(|v| v.name.len() + v.value.len()).sum()
}

/// A held job: accepted and stored, never run.
fn held_job(dir: &Path) -> api::JobSpec {
    api::JobSpec {
        name: "bench".into(),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        argv: vec!["true".into()],
        work_dir: dir.display().to_string(),
        submit_dir: dir.display().to_string(),
        hold: true,
        ..Default::default()
    }
}

async fn submit_one(c: &Client, spec: &api::JobSpec, request_id: String) -> Result<u64, tonic::Status> {
    c.call(|mut cl| {
        let req =
            api::SubmitJobRequest { spec: Some(spec.clone()), user: "bench".into(), request_id: request_id.clone() };
        async move { cl.submit_job(req).await }
    })
    .await
    .map(|r| r.job_id)
}

async fn own_cluster(agents: usize) -> anyhow::Result<DevCluster> {
    let cluster = DevCluster::start(DevOptions {
        ports: vec![0, 0, 0],
        agents,
        cgroups: std::env::var_os("QUORUM_BENCH_NO_CGROUPS").is_none(),
        ..DevOptions::default()
    })
    .await?;
    let c = Client::new(cluster.addrs.clone())?;
    let started = Instant::now();
    loop {
        let nodes = c.call(|mut cl| async move { cl.list_nodes(api::ListNodesRequest::default()).await }).await;
        if nodes.is_ok_and(|n| n.nodes.iter().filter(|n| n.connected).count() == agents) {
            return Ok(cluster);
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "the cluster did not become ready in 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn submit(
    clients: usize,
    jobs: usize,
    shape: JobShape,
    external: Option<Vec<String>>,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(clients > 0 && jobs > 0, "--clients and --jobs must be above 0");
    let (own, addrs) = match external {
        Some(addrs) => (None, addrs),
        None => {
            let cluster = own_cluster(1).await?;
            let addrs = cluster.addrs.clone();
            (Some(cluster), addrs)
        }
    };
    let dir = tempfile::tempdir()?;
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let run_id = uuid::Uuid::new_v4();
    // Each client first connects and learns the leader with one submit not counted, so that
    // connection set-up is not counted as submit latency; then all start together.
    let ready = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for k in 0..clients {
        let c = Client::new(addrs.clone())?;
        let (next, done, errors, ready) = (next.clone(), done.clone(), errors.clone(), ready.clone());
        let jobs_of_client = shape.for_client(dir.path(), k);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let warm = submit_one(&c, &jobs_of_client.job(jobs + k), format!("bench-{run_id}-warm-{k}")).await;
            if let Err(e) = warm {
                errors.lock().unwrap_or_else(|p| p.into_inner()).push(e.message().to_string());
            }
            ready.wait().await;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return latencies;
                }
                let spec = jobs_of_client.job(i);
                let sent = Instant::now();
                match submit_one(&c, &spec, format!("bench-{run_id}-{i}")).await {
                    Ok(_) => latencies.push(sent.elapsed()),
                    Err(e) => errors.lock().unwrap_or_else(|p| p.into_inner()).push(e.message().to_string()),
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    ready.wait().await;
    let started = Instant::now();
    let mut all = Vec::new();
    let reporter = {
        let done = done.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let n = done.load(Ordering::Relaxed);
                let secs = started.elapsed().as_secs_f64();
                progress(&format!("submit: {n}/{jobs} answered, {:.0}/s", n as f64 / secs));
            }
        })
    };
    for t in tasks {
        all.extend(t.await?);
    }
    reporter.abort();
    progress_done();
    let elapsed = started.elapsed();
    let errors = errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let acked = all.len();
    let s = spread(&mut all);
    let per_second = acked as f64 / elapsed.as_secs_f64();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "submit", "clients": clients, "jobs": jobs, "acknowledged": acked,
                "env_vars": shape.env_vars, "unique_env": shape.unique_env,
                "errors": errors.len(), "seconds": elapsed.as_secs_f64(), "per_second": per_second,
                "latency": s,
            })
        );
    } else {
        println!("submit: {clients} clients, {acked} of {jobs} submits acknowledged in {:.2} s", elapsed.as_secs_f64());
        println!("  each job     {}", shape.describe());
        println!("  throughput   {per_second:.0} jobs/s");
        println!("  latency p50  {:.1} ms", s.p50_ms);
        println!("          p99  {:.1} ms", s.p99_ms);
        println!("          max  {:.1} ms", s.max_ms);
        println!("  errors       {}", errors.len());
        if let Some(first) = errors.first() {
            println!("  first error  {first}");
        }
    }
    if let Some(c) = own {
        c.shutdown().await;
    }
    Ok(())
}

fn epoch_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

async fn dispatch(jobs: usize, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(jobs > 0, "--jobs must be above 0");
    let cluster = own_cluster(1).await?;
    let c = Client::new(cluster.addrs.clone())?;
    let dir = tempfile::tempdir()?;
    let path = std::env::var("PATH").unwrap_or_default();
    let mut latencies = Vec::new();
    for i in 0..jobs {
        let out = dir.path().join(format!("start-{i}"));
        let spec = api::JobSpec {
            name: "dispatch".into(),
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 1,
            argv: vec!["date".into(), "+%s%N".into()],
            stdout: out.display().to_string(),
            work_dir: dir.path().display().to_string(),
            submit_dir: dir.path().display().to_string(),
            env: vec![api::EnvVar { name: "PATH".into(), value: path.clone() }],
            ..Default::default()
        };
        let sent = epoch_ns();
        let id = submit_one(&c, &spec, uuid::Uuid::new_v4().to_string()).await?;
        let waited = Instant::now();
        let started_ns = loop {
            if let Some(ns) = std::fs::read_to_string(&out).ok().and_then(|t| t.trim().parse::<u128>().ok()) {
                break ns;
            }
            anyhow::ensure!(waited.elapsed() < Duration::from_secs(30), "job {id} did not start within 30 s");
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        latencies.push(Duration::from_nanos(started_ns.saturating_sub(sent) as u64));
        // Idle again before the next: the job has ended and its end is committed.
        loop {
            let j = c
                .call(|mut cl| async move {
                    cl.get_job(api::GetJobRequest { job_id: id, stale: false, array_task_id: None }).await
                })
                .await?;
            if j.job.is_some_and(|j| j.state != "RUNNING" && j.state != "PENDING") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        progress(&format!(
            "dispatch: {}/{jobs} jobs, last {:.1} ms",
            i + 1,
            latencies.last().map_or(0.0, |d| d.as_secs_f64() * 1e3)
        ));
    }
    progress_done();
    let s = spread(&mut latencies);
    if json {
        println!("{}", serde_json::json!({ "bench": "dispatch", "jobs": jobs, "latency": s }));
    } else {
        println!("dispatch: {jobs} jobs, one at a time on an idle cluster, submit sent -> job process running");
        println!("  p50  {:.1} ms", s.p50_ms);
        println!("  p99  {:.1} ms", s.p99_ms);
        println!("  min  {:.1} ms   max {:.1} ms", s.min_ms, s.max_ms);
    }
    cluster.shutdown().await;
    Ok(())
}

/// The controller binary: the one given, or quorum-controller next to this program.
fn controller_bin(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    Ok(match given {
        Some(b) => b,
        None => std::env::current_exe()?.with_file_name("quorum-controller"),
    })
}

/// An agent in this process for node `bench1`, so that submits to [`Replicas`] find their node.
struct BenchAgent {
    agent: Arc<quorum_agent::Agent>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl BenchAgent {
    fn start(replicas: &Replicas) -> BenchAgent {
        let agent = quorum_agent::Agent::new(quorum_agent::AgentConfig {
            name: "bench1".into(),
            controllers: replicas.addrs.clone(),
            cpus: 8,
            mem_mb: 16 * 1024,
            gpus: vec![],
            features: vec![],
            spool_dir: replicas.dir.path().join("spool"),
            heartbeat: Duration::from_secs(1),
            kill_wait: Duration::from_secs(2),
            switch_user: false,
            cgroups: false,
            health_check: None,
        });
        let (stop, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(agent.clone().run(rx));
        BenchAgent { agent, stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.agent.kill_all();
        let _ = self.task.await;
    }
}

/// Three `quorum-controller` processes on loopback, for the failover and memory benches.
struct Replicas {
    bin: PathBuf,
    dir: tempfile::TempDir,
    addrs: Vec<String>,
    children: Vec<Option<Child>>,
}

impl Replicas {
    /// `nodes`: the hostlist of the one partition, `batch`.
    fn start(bin: PathBuf, nodes: &str) -> anyhow::Result<Replicas> {
        anyhow::ensure!(bin.exists(), "no controller binary at {} (build it, or give --controller-bin)", bin.display());
        let mut dir = tempfile::Builder::new().prefix("quorum-bench-").tempdir()?;
        // QUORUM_BENCH_KEEP=1 keeps the replicas' data and logs for a look afterwards.
        if std::env::var_os("QUORUM_BENCH_KEEP").is_some() {
            dir.disable_cleanup(true);
            eprintln!("bench: replicas' data and logs kept in {}", dir.path().display());
        }
        let ports: Vec<u16> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").map(|l| l.local_addr().map(|a| a.port())))
            .collect::<Result<Result<_, _>, _>>()??;
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        for i in 0..3 {
            let mut text = format!(
                "id = {}\nlisten = \"{}\"\ndata_dir = \"{}\"\n",
                i + 1,
                addrs[i],
                dir.path().join(format!("controller-{}", i + 1)).display()
            );
            for (j, a) in addrs.iter().enumerate() {
                text.push_str(&format!("[[replicas]]\nid = {}\naddr = \"{a}\"\n", j + 1));
            }
            text.push_str(&format!(
                "[[partitions]]\nname = \"batch\"\nnodes = \"{nodes}\"\ndefault = true\nmax_time = \"1:00:00\"\n"
            ));
            std::fs::write(dir.path().join(format!("controller-{}.toml", i + 1)), text)?;
        }
        let mut r = Replicas { bin, dir, addrs, children: Vec::new() };
        for i in 0..3 {
            let child = r.spawn(i)?;
            r.children.push(Some(child));
        }
        Ok(r)
    }

    fn spawn(&self, i: usize) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("controller-{}.log", i + 1)))?;
        Ok(Command::new(&self.bin)
            .arg("--config")
            .arg(self.dir.path().join(format!("controller-{}.toml", i + 1)))
            .env("RUST_LOG", std::env::var("QUORUM_BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()?)
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(serde::Serialize)]
struct FailoverRun {
    killed: u64,
    new_leader: u64,
    /// Kill to the first acknowledged submit sent after the kill.
    next_write_ms: f64,
    /// Kill to the new leader being known to a replica.
    leader_known_ms: f64,
}

async fn failover(runs: usize, clients: usize, bin: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0 && clients > 0, "--runs and --clients must be above 0");
    let mut replicas = Replicas::start(controller_bin(bin)?, "bench1")?;
    let addrs = replicas.addrs.clone();
    let c = Client::new(addrs.clone())?;
    let agent = BenchAgent::start(&replicas);

    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let work = replicas.dir.path().to_path_buf();
    let run_id = uuid::Uuid::new_v4();
    let mut tasks = Vec::new();
    for k in 0..clients {
        let (stop, acked) = (stop.clone(), acked.clone());
        let c = Client::new(addrs.clone())?;
        let spec = held_job(&work);
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let sent = Instant::now();
                if submit_one(&c, &spec, format!("failover-{run_id}-{k}-{n}")).await.is_ok() {
                    acked.lock().unwrap_or_else(|p| p.into_inner()).push((sent, Instant::now()));
                } else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }));
    }

    let mut results = Vec::new();
    for run in 0..runs {
        // Steady: every replica answers, one leads, and submits flow.
        let steady = Instant::now();
        let leader = loop {
            let s = quorum_client::display::replica_statuses(&c).await.unwrap_or_default();
            let leader = s.iter().find(|s| s.role == "leader").map(|s| s.id);
            if let Some(leader) = leader.filter(|_| s.len() == 3 && s.iter().all(|r| r.reachable)) {
                if steady.elapsed() > Duration::from_secs(2) {
                    break leader;
                }
            }
            anyhow::ensure!(steady.elapsed() < Duration::from_secs(60), "the cluster did not settle within 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let i = (leader - 1) as usize;
        let killed_at = Instant::now();
        if let Some(mut child) = replicas.children[i].take() {
            child.kill()?;
            child.wait()?;
        }
        let mut leader_known = None;
        let mut new_leader = 0;
        let next_write = loop {
            if leader_known.is_none() {
                let s = quorum_client::display::replica_statuses(&c).await.unwrap_or_default();
                if let Some(l) = s.iter().find(|s| s.role == "leader" && s.id != leader) {
                    leader_known = Some(killed_at.elapsed());
                    new_leader = l.id;
                }
            }
            let first = acked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(sent, _)| *sent >= killed_at)
                .map(|(_, a)| *a)
                .min();
            if let Some(at) = first {
                break at - killed_at;
            }
            anyhow::ensure!(
                killed_at.elapsed() < Duration::from_secs(30),
                "no submit acknowledged within 30 s of the kill"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let r = FailoverRun {
            killed: leader,
            new_leader,
            next_write_ms: next_write.as_secs_f64() * 1000.0,
            leader_known_ms: leader_known.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0),
        };
        progress(&format!(
            "failover: run {}/{runs}: killed {} -> next write {:.0} ms",
            run + 1,
            r.killed,
            r.next_write_ms
        ));
        results.push(r);
        replicas.children[i] = Some(replicas.spawn(i)?);
    }
    progress_done();
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        let _ = t.await;
    }
    agent.stop().await;

    let mut times: Vec<Duration> = results.iter().map(|r| Duration::from_secs_f64(r.next_write_ms / 1000.0)).collect();
    let s = spread(&mut times);
    let over = results.iter().filter(|r| r.next_write_ms >= 1000.0).count();
    if json {
        println!(
            "{}",
            serde_json::json!({ "bench": "failover", "clients": clients, "runs": results, "next_write": s, "over_1s": over })
        );
    } else {
        println!("failover: leader killed with SIGKILL under {clients} submitting clients, {runs} runs");
        println!("  RUN  KILLED  NEW  LEADER_KNOWN  NEXT_WRITE");
        for (n, r) in results.iter().enumerate() {
            println!(
                "  {:<4} {:<7} {:<4} {:>9.0} ms  {:>7.0} ms",
                n + 1,
                r.killed,
                r.new_leader,
                r.leader_known_ms,
                r.next_write_ms
            );
        }
        println!(
            "  next write: min {:.0} ms, median {:.0} ms, p99 {:.0} ms, max {:.0} ms; {over} of {runs} at 1 s or more",
            s.min_ms, s.p50_ms, s.p99_ms, s.max_ms
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let s = spread(&mut v);
        assert_eq!((s.min_ms, s.p50_ms, s.p99_ms, s.max_ms), (1.0, 50.0, 99.0, 100.0));
        let s = spread(&mut []);
        assert_eq!(s.max_ms, 0.0);
    }
}
