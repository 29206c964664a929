//! What the benches share: the cluster they run against (their own, or replica processes),
//! the jobs they submit, and how they report (progress lines, percentiles).

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use quorum_client::client::Client;
use quorum_proto::api;

use crate::cluster::{DevCluster, DevOptions};
use crate::security::DevSecurity;

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

pub(super) fn progress(line: &str) {
    let mut err = std::io::stderr();
    let _ = write!(err, "\r\x1b[2K{line}");
    let _ = err.flush();
}

pub(super) fn progress_done() {
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
    pub(super) fn job(&self, dir: &Path, client: usize, i: usize) -> api::JobSpec {
        let shell = if self.unique_env { format!("job{i}") } else { format!("client{client}") };
        api::JobSpec { env: shell_env(self.env_vars, &shell), ..held_job(dir) }
    }

    /// The jobs of client `client`.
    pub(super) fn for_client(self, dir: &Path, client: usize) -> ClientJobs {
        let shared = (!self.unique_env).then(|| self.job(dir, client, 0));
        ClientJobs { shape: self, dir: dir.to_path_buf(), client, shared }
    }

    pub(super) fn describe(&self) -> String {
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
pub(super) struct ClientJobs {
    pub(super) shape: JobShape,
    pub(super) dir: PathBuf,
    pub(super) client: usize,
    pub(super) shared: Option<api::JobSpec>,
}

impl ClientJobs {
    pub(super) fn job(&self, i: usize) -> Cow<'_, api::JobSpec> {
        match &self.shared {
            Some(job) => Cow::Borrowed(job),
            None => Cow::Owned(self.shape.job(&self.dir, self.client, i)),
        }
    }
}

/// A login shell's environment as `shell` would send it: `vars` variables of ~65 bytes.
pub(super) fn shell_env(vars: usize, shell: &str) -> Vec<api::EnvVar> {
    (0..vars)
        .map(|i| api::EnvVar {
            name: format!("BENCH_VARIABLE_{i:02}"),
            value: format!("/home/bench/{shell:<10}/software/module-{i:02}/lib64:/usr/local/lib"),
        })
        .collect()
}

pub(super) fn env_bytes(vars: usize) -> usize {
    shell_env(vars, "client0").iter().map(|v| v.name.len() + v.value.len()).sum()
}

/// A held job: accepted and stored, never run.
pub(super) fn held_job(dir: &Path) -> api::JobSpec {
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

pub(super) async fn submit_one(c: &Client, spec: &api::JobSpec, request_id: String) -> Result<u64, tonic::Status> {
    c.call(|mut cl| {
        let req = api::SubmitJobRequest {
            spec: Some(spec.clone()),
            user: "bench".into(),
            request_id: request_id.clone(),
            test_only: false,
            run_as: String::new(),
        };
        async move { cl.submit_job(req).await }
    })
    .await
    .map(|r| r.job_id)
}

pub(super) async fn own_cluster(agents: usize, insecure: bool) -> anyhow::Result<DevCluster> {
    let cluster = DevCluster::start(DevOptions {
        ports: vec![0, 0, 0],
        agents,
        cgroups: std::env::var_os("QUORUM_BENCH_NO_CGROUPS").is_none(),
        insecure,
        // The benches fill the queue on purpose.
        limits: quorum_control::config::AdmissionLimits::default().unbounded_queue(),
        ..DevOptions::default()
    })
    .await?;
    let c = cluster.client()?;
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

/// The controller binary: the one given, or quorum-controller next to this program.
pub(super) fn controller_bin(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    Ok(match given {
        Some(b) => b,
        None => std::env::current_exe()?.with_file_name("quorum-controller"),
    })
}

/// An agent in this process for node `bench1`, so that submits to [`Replicas`] find their node.
pub(super) struct BenchAgent {
    pub(super) agent: Arc<quorum_agent::Agent>,
    pub(super) stop: tokio::sync::watch::Sender<bool>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl BenchAgent {
    pub(super) fn start(replicas: &Replicas) -> anyhow::Result<BenchAgent> {
        let mut config = quorum_agent::AgentConfig {
            cpus: 8,
            mem_mb: 16 * 1024,
            kill_wait: Duration::from_secs(2),
            switch_user: false,
            cgroups: false,
            ..quorum_agent::AgentConfig::new("bench1", replicas.addrs.clone(), replicas.dir.path().join("spool"))
        };
        if let Some(s) = &replicas.security {
            s.secure_agent(&mut config)?;
        }
        let agent = quorum_agent::Agent::new(config);
        let (stop, rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(quorum_agent::serve(agent.clone(), rx));
        Ok(BenchAgent { agent, stop, task })
    }

    pub(super) async fn stop(self) {
        let _ = self.stop.send(true);
        self.agent.kill_all();
        let _ = self.task.await;
    }
}

/// Three `quorum-controller` processes on loopback, for the failover and memory benches.
pub(super) struct Replicas {
    pub(super) bin: PathBuf,
    pub(super) dir: tempfile::TempDir,
    pub(super) addrs: Vec<String>,
    pub(super) children: Vec<Option<Child>>,
    /// `None`: the replicas run with `insecure = true`.
    pub(super) security: Option<Arc<DevSecurity>>,
}

impl Replicas {
    /// `nodes`: the hostlist of the one partition, `batch`.
    /// `secure`: TLS and authentication, as a real cluster runs (certificates and a munged
    /// made for it); else `insecure = true`.
    pub(super) fn start(bin: PathBuf, nodes: &str, secure: bool) -> anyhow::Result<Replicas> {
        anyhow::ensure!(bin.exists(), "no controller binary at {} (build it, or give --controller-bin)", bin.display());
        let mut dir = tempfile::Builder::new().prefix("quorum-bench-").tempdir()?;
        // QUORUM_BENCH_KEEP=1 keeps the replicas' data and logs for a look afterwards.
        if std::env::var_os("QUORUM_BENCH_KEEP").is_some() {
            dir.disable_cleanup(true);
            eprintln!("bench: replicas' data and logs kept in {}", dir.path().display());
        }
        let ports: Vec<u16> = (0..3).map(|_| crate::ports::free_port()).collect::<Result<_, _>>()?;
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let security = match secure {
            true => Some(Arc::new(DevSecurity::create(&dir.path().join("security"))?)),
            false => None,
        };
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
            // The benches fill the queue on purpose (a million jobs in arrays of 100,000).
            let most = u32::MAX;
            text.push_str(&format!(
                "[limits]\nmax_job_count = {most}\nmax_array_size = {most}\nmax_submit_jobs_per_user = {most}\n"
            ));
            match &security {
                Some(s) => text.push_str(&s.controller_toml(i as u64 + 1)?),
                None => text.push_str("[security]\ninsecure = true\n"),
            }
            std::fs::write(dir.path().join(format!("controller-{}.toml", i + 1)), text)?;
        }
        let mut r = Replicas { bin, dir, addrs, children: Vec::new(), security };
        for i in 0..3 {
            let child = r.spawn(i)?;
            r.children.push(Some(child));
        }
        Ok(r)
    }

    /// A client of the replicas, as this process's user.
    pub(super) fn client(&self) -> anyhow::Result<Client> {
        let security = match &self.security {
            Some(s) => s.client(),
            None => crate::security::claimed()?,
        };
        Client::new(self.addrs.clone(), security)
    }

    pub(super) fn spawn(&self, i: usize) -> anyhow::Result<Child> {
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
