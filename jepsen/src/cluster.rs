//! The cluster under test: real `quorum-controller` and `quorum-agent` processes, each in the
//! network namespace of its host, with real RocksDB on disk, TLS and MUNGE (a CA and a munged
//! of the run's own), and a wall clock that the nemesis can move (libfaketime, monotonic clock
//! untouched).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use quorum_client::client::Client;
use quorum_dev::security::DevSecurity;
use quorum_proto::api;

use crate::choice::{SCAVENGER, STANDBY};
use crate::net::{self, Net};

pub const PORT: u16 = 7101;
/// CPUs and simulated GPUs of each agent: what the capacity checker holds runs to.
pub const AGENT_CPUS: u32 = 2;
pub const AGENT_GPUS: u32 = 2;
pub const PARTITION: &str = "jepsen";
/// The controllers' timeouts: short, so that faults of seconds cross them.
pub const NODE_TIMEOUT_MS: u64 = 5_000;
pub const AGENT_LEASE_MS: u64 = 3_000;
const FAKETIME_LIBS: [&str; 2] =
    ["/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"];

/// Where the binaries under test are.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub controller: PathBuf,
    pub agent: PathBuf,
    /// `quorum`, whose Slurm names (`srun`) the jobs' steps use: where it is built beside them.
    pub quorum: Option<PathBuf>,
}

impl Binaries {
    pub fn in_dir(dir: &Path) -> anyhow::Result<Binaries> {
        let quorum = Some(dir.join("quorum")).filter(|q| q.exists());
        let b = Binaries { controller: dir.join("quorum-controller"), agent: dir.join("quorum-agent"), quorum };
        for p in [&b.controller, &b.agent] {
            anyhow::ensure!(
                p.exists(),
                "{} is missing (build it: cargo build --release --workspace --bins)",
                p.display()
            );
        }
        Ok(b)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Replica(usize),
    Agent(usize),
}

/// One daemon: how to start it again, and the process now running, if any.
pub struct Daemon {
    pub who: Who,
    pub name: String,
    namespace: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
    /// An agent's cgroup (v2), which it starts in: its jobs' cgroups are made under it, so
    /// freezing it freezes the whole node ([`Cluster::freeze_node`]).
    cgroup: Option<PathBuf>,
}

impl Daemon {
    fn spawn(&mut self) -> anyhow::Result<()> {
        self.spawn_with(&[])
    }

    /// Starts it, if it is not running, with `extra` added to its environment this once.
    fn spawn_with(&mut self, extra: &[(String, String)]) -> anyhow::Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .envs(self.env.iter().chain(extra).map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        let mut enter = net::enter(&self.namespace)?;
        let procs = match &self.cgroup {
            Some(dir) => {
                std::fs::create_dir_all(dir).with_context(|| format!("cgroup {}", dir.display()))?;
                Some(std::fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?)
            }
            None => None,
        };
        let pre_exec = move || {
            enter()?;
            if let Some(f) = &procs {
                use std::os::fd::AsRawFd;
                // SAFETY: write(2) of a static buffer to a descriptor the closure owns.
                if unsafe { libc::write(f.as_raw_fd(), b"0".as_ptr().cast(), 1) } != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        };
        // SAFETY: the closure only calls setns(2) and write(2), both async-signal-safe.
        unsafe { std::os::unix::process::CommandExt::pre_exec(&mut command, pre_exec) };
        self.child = Some(command.spawn().with_context(|| format!("starting {}", self.program.display()))?);
        self.paused = false;
        Ok(())
    }

    /// Whether its process ended by itself (reaped then): a crash, as a crash point makes one.
    pub fn crashed(&mut self) -> bool {
        let ended = self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_some());
        if ended {
            self.child = None;
        }
        ended
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn paused(&self) -> bool {
        self.paused
    }

    fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// `kill -9`, and reaped.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.paused = false;
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        self.signal(libc::SIGCONT);
        self.signal(libc::SIGTERM);
        let start = std::time::Instant::now();
        while let Some(c) = self.child.as_mut() {
            if c.try_wait().ok().flatten().is_some() || start.elapsed() > grace {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill();
    }

    pub fn pause(&mut self) {
        if self.child.is_some() {
            self.signal(libc::SIGSTOP);
            self.paused = true;
        }
    }

    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.paused = false;
    }
}

pub struct Cluster {
    pub dir: PathBuf,
    pub net: Net,
    pub security: Arc<DevSecurity>,
    pub replicas: Vec<Daemon>,
    pub agents: Vec<Daemon>,
    /// Each replica's address, as clients and agents dial it.
    pub addrs: Vec<String>,
    /// Whether replicas' wall clocks can be moved (libfaketime is installed).
    pub clocks: bool,
    /// Where each agent's cgroup is made, when the host has cgroup v2 (alone, or beside v1 at
    /// /sys/fs/cgroup/unified): a node can then be frozen whole, agent and jobs.
    pub cgroups: Option<PathBuf>,
    pub bins: Binaries,
    /// The previous release's binaries, for the upgrade nemesis.
    pub old: Option<Binaries>,
}

impl Cluster {
    pub fn start(
        dir: &Path,
        bins: &Binaries,
        old: Option<&Binaries>,
        replicas: usize,
        agents: usize,
    ) -> anyhow::Result<Cluster> {
        let names: Vec<String> =
            (1..=replicas).map(|i| format!("r{i}")).chain((1..=agents).map(|i| format!("a{i}"))).collect();
        let net = Net::create(&names)?;
        let security = Arc::new(DevSecurity::create(&dir.join("security"))?);
        let addrs: Vec<String> = net.hosts[..replicas].iter().map(|h| format!("{}:{PORT}", h.ip)).collect();
        let faketime = FAKETIME_LIBS.iter().map(Path::new).find(|p| p.exists());
        let slurm_commands = match &bins.quorum {
            Some(quorum) => quorum_dev::cluster::link_slurm_commands(quorum, &dir.join("slurm"))?,
            None => PathBuf::from("/nonexistent"),
        };
        let slowdisk = build_slowdisk(dir)?;
        let mut cluster = Cluster {
            dir: dir.to_path_buf(),
            net,
            security: security.clone(),
            replicas: Vec::new(),
            agents: Vec::new(),
            addrs: addrs.clone(),
            clocks: faketime.is_some(),
            cgroups: node_cgroups(dir),
            bins: bins.clone(),
            old: old.cloned(),
        };
        let mut preload = vec![slowdisk.display().to_string()];
        preload.extend(faketime.map(|p| p.display().to_string()));
        for i in 0..replicas {
            let id = i as u64 + 1;
            let config = dir.join(format!("r{id}.toml"));
            std::fs::write(&config, controller_toml(dir, id, &addrs, agents, &security.controller_toml(id)?, false))?;
            let disk = cluster.disk_file(i);
            std::fs::write(&disk, "0\n")?;
            let mut env = vec![
                ("RUST_LOG".to_string(), "info,openraft=warn".to_string()),
                ("LD_PRELOAD".into(), preload.join(":")),
                ("QUORUM_SLOWDISK_FILE".into(), disk.display().to_string()),
                ("QUORUM_SYNCED_FILE".into(), cluster.synced_file(i).display().to_string()),
            ];
            if faketime.is_some() {
                let clock = cluster.clock_file(i);
                std::fs::write(&clock, "+0\n")?;
                env.extend([
                    ("FAKETIME_TIMESTAMP_FILE".into(), clock.display().to_string()),
                    ("FAKETIME_CACHE_DURATION".into(), "1".into()),
                    // Faking the monotonic clock hangs tokio's timers.
                    ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
                ]);
            }
            cluster.replicas.push(Daemon {
                who: Who::Replica(i),
                name: format!("r{id}"),
                namespace: cluster.net.hosts[i].namespace(),
                program: bins.controller.clone(),
                args: vec!["--config".into(), config.display().to_string()],
                env,
                log: dir.join(format!("r{id}.log")),
                child: None,
                paused: false,
                cgroup: None,
            });
        }
        for i in 0..agents {
            let name = format!("a{}", i + 1);
            security.ensure(&quorum_auth::pki::PeerRole::Agent(name.clone()))?;
            let home = dir.join(&name);
            std::fs::create_dir_all(home.join("tmp"))?;
            let args = vec![
                format!("--name={name}"),
                format!("--controllers={}", addrs.join(",")),
                format!("--cpus={AGENT_CPUS}"),
                "--mem=4G".into(),
                format!("--gpus=sim:h100x{AGENT_GPUS}"),
                format!("--spool={}", home.join("spool").display()),
                format!("--tmp-base={}", home.join("tmp").display()),
                "--kill-wait=2".into(),
                format!("--certs={}", security.certs_dir().display()),
                format!("--slurm-commands={}", slurm_commands.display()),
            ];
            cluster.agents.push(Daemon {
                who: Who::Agent(i),
                name: name.clone(),
                namespace: cluster.net.hosts[replicas + i].namespace(),
                program: bins.agent.clone(),
                args,
                env: vec![("RUST_LOG".into(), "info".into())],
                log: dir.join(format!("{name}.log")),
                child: None,
                paused: false,
                cgroup: cluster.cgroups.as_ref().map(|c| c.join(&name)),
            });
        }
        for d in cluster.replicas.iter_mut().chain(cluster.agents.iter_mut()) {
            d.spawn()?;
        }
        Ok(cluster)
    }

    fn clock_file(&self, replica: usize) -> PathBuf {
        self.dir.join(format!("clock-r{}", replica + 1))
    }

    fn disk_file(&self, replica: usize) -> PathBuf {
        self.dir.join(format!("disk-r{}", replica + 1))
    }

    /// Where replica `replica`'s syncs are journaled (`slowdisk.c`): device, inode and size.
    fn synced_file(&self, replica: usize) -> PathBuf {
        self.dir.join(format!("synced-r{}", replica + 1))
    }

    /// Replica `i` killed as by a power cut: its process killed, then each file of its data cut
    /// back to the size its last sync began with, and a file never synced emptied (what the page
    /// cache held is lost). Optimistic where the journal cannot tell: a rename or a new name is
    /// kept whether its directory was synced or not. Returns the names of the files cut back and
    /// the bytes lost.
    pub fn lose_unsynced(&mut self, i: usize) -> anyhow::Result<(Vec<String>, u64)> {
        use std::os::unix::fs::MetadataExt;
        self.replicas[i].kill();
        let journal = self.synced_file(i);
        let text = std::fs::read_to_string(&journal).unwrap_or_default();
        let mut synced: std::collections::HashMap<(u64, u64), u64> = Default::default();
        for line in text.lines() {
            let mut w = line.split(' ').map(str::parse::<u64>);
            if let (Some(Ok(dev)), Some(Ok(ino)), Some(Ok(size))) = (w.next(), w.next(), w.next()) {
                synced.insert((dev, ino), size);
            }
        }
        let (mut files, mut lost) = (Vec::new(), 0);
        let mut kept = String::new();
        let mut dirs = vec![self.dir.join(format!("r{}", i + 1))];
        while let Some(d) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else { continue };
            for entry in entries.flatten() {
                let meta = entry.metadata()?;
                if meta.is_dir() {
                    dirs.push(entry.path());
                    continue;
                }
                if !meta.is_file() {
                    continue;
                }
                let keep = synced.get(&(meta.dev(), meta.ino())).copied().unwrap_or(0).min(meta.len());
                if keep < meta.len() {
                    std::fs::OpenOptions::new().write(true).open(entry.path())?.set_len(keep)?;
                    files.push(format!(
                        "{} ({} of {} bytes kept)",
                        entry.file_name().to_string_lossy(),
                        keep,
                        meta.len()
                    ));
                    lost += meta.len() - keep;
                }
                // What survived is on the disk now, whatever a new file takes its inode later.
                kept.push_str(&format!("{} {} {keep}\n", meta.dev(), meta.ino()));
            }
        }
        std::fs::write(&journal, kept)?;
        Ok((files, lost))
    }

    /// Makes every sync of replica `i`'s disk take `ms` milliseconds longer (0: as fast as it is).
    pub fn set_disk_delay(&self, i: usize, ms: u64) -> anyhow::Result<()> {
        std::fs::write(self.disk_file(i), format!("{ms}\n"))?;
        Ok(())
    }

    pub fn daemon(&mut self, who: Who) -> &mut Daemon {
        match who {
            Who::Replica(i) => &mut self.replicas[i],
            Who::Agent(i) => &mut self.agents[i],
        }
    }

    /// The host index (in `net.hosts`) of a daemon.
    pub fn host(&self, who: Who) -> usize {
        match who {
            Who::Replica(i) => i,
            Who::Agent(i) => self.replicas.len() + i,
        }
    }

    pub fn restart(&mut self, who: Who) -> anyhow::Result<()> {
        self.daemon(who).spawn()
    }

    /// Kills replica `i` and starts it again with crash point `point` armed once
    /// (`FAILPOINTS=point=1*return`, read by a controller built with quorum-raft's `failpoints`,
    /// as every test build is): it aborts the first time it passes there.
    pub fn arm_crash(&mut self, i: usize, point: &str) -> anyhow::Result<()> {
        let d = self.daemon(Who::Replica(i));
        d.kill();
        d.spawn_with(&[("FAILPOINTS".into(), format!("{point}=1*return"))])
    }

    /// Stops `who` (SIGTERM, as an operator's upgrade does) and starts it again with the
    /// previous release's binary (`old`) or this one; a replica is waited for until it answers
    /// again (20 s at most). Says what it did.
    pub async fn swap(&mut self, who: Who, old: bool) -> anyhow::Result<String> {
        let bins = match (old, &self.old) {
            (true, Some(o)) => o.clone(),
            _ => self.bins.clone(),
        };
        let program = match who {
            Who::Replica(_) => bins.controller,
            Who::Agent(_) => bins.agent,
        };
        let d = self.daemon(who);
        d.stop(Duration::from_secs(5)).await;
        d.program = program;
        d.spawn()?;
        let what = format!("{} runs {}", d.name, d.program.display());
        if let Who::Replica(i) = who {
            let began = std::time::Instant::now();
            while self.statuses().await[i].is_none() {
                anyhow::ensure!(began.elapsed() < Duration::from_secs(20), "{what}, and does not answer within 20 s");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(what)
    }

    /// Whether `who` runs the previous release.
    pub fn runs_old(&self, who: Who) -> bool {
        let d = match who {
            Who::Replica(i) => &self.replicas[i],
            Who::Agent(i) => &self.agents[i],
        };
        self.old.as_ref().is_some_and(|o| d.program == o.controller || d.program == o.agent)
    }

    /// Replica `i` as a new machine in its place: its process killed, its disk wiped, and
    /// started again with `join = true`, to be added with `AddReplica`.
    pub fn replace_disk(&mut self, i: usize) -> anyhow::Result<()> {
        let id = i as u64 + 1;
        self.replicas[i].kill();
        let data = self.dir.join(format!("r{id}"));
        if data.exists() {
            std::fs::remove_dir_all(&data)?;
        }
        let _ = std::fs::remove_file(self.synced_file(i));
        let agents = self.agents.len();
        let toml = controller_toml(&self.dir, id, &self.addrs, agents, &self.security.controller_toml(id)?, true);
        std::fs::write(self.dir.join(format!("r{id}.toml")), toml)?;
        self.replicas[i].spawn()
    }

    /// Moves replica `i`'s wall clock `offset` seconds from the host's (read within a second).
    pub fn set_clock(&self, i: usize, offset: i64) -> anyhow::Result<()> {
        anyhow::ensure!(self.clocks, "libfaketime is not installed (apt install faketime)");
        std::fs::write(self.clock_file(i), format!("{offset:+}\n"))?;
        Ok(())
    }

    /// Sets how fast replica `i`'s wall clock runs, `percent` of the host's (libfaketime's
    /// speed; 100 is true). The switch may move it too (libfaketime counts the speed from the
    /// process's start); healing puts it back at the host's time and speed.
    pub fn set_clock_rate(&self, i: usize, percent: u32) -> anyhow::Result<()> {
        anyhow::ensure!(self.clocks, "libfaketime is not installed (apt install faketime)");
        std::fs::write(self.clock_file(i), format!("+0 x{:.2}\n", f64::from(percent) / 100.0))?;
        Ok(())
    }

    /// Freezes agent `i`'s whole node, the agent and every job it runs (cgroup v2's
    /// `cgroup.freeze`), or thaws it; waits until the kernel says it is done (at most 5 s).
    pub fn freeze_node(&self, i: usize, frozen: bool) -> anyhow::Result<()> {
        let dir = self.agents[i].cgroup.as_ref().context("no cgroup v2 here to freeze a node with")?;
        std::fs::write(dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })?;
        let want = format!("frozen {}", u8::from(frozen));
        let began = std::time::Instant::now();
        while began.elapsed() < Duration::from_secs(5) {
            if std::fs::read_to_string(dir.join("cgroup.events"))?.lines().any(|l| l == want) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        anyhow::bail!("{}: not {want} after 5 s", dir.display())
    }

    /// A client of every replica, as the harness's user (root, by MUNGE).
    pub fn client(&self) -> anyhow::Result<Client> {
        Client::new(self.addrs.clone(), self.security.client())
    }

    /// Each replica's status, `None` where it does not answer within a second.
    pub async fn statuses(&self) -> Vec<Option<api::ReplicaStatus>> {
        let mut out = Vec::new();
        // A fresh connection each time: a replica that restarted refuses a credential its
        // munged has seen, which an older connection would present again.
        for addr in &self.addrs {
            let fresh = Client::new(vec![addr.clone()], self.security.client());
            let status = match fresh.and_then(|c| c.replica(addr)) {
                Ok(mut api) => tokio::time::timeout(
                    Duration::from_secs(1),
                    api.get_replica_status(api::ReplicaStatusRequest::default()),
                )
                .await
                .ok()
                .and_then(|r| r.ok())
                .map(|r| r.into_inner()),
                Err(_) => None,
            };
            out.push(status);
        }
        out
    }

    /// The replica that says it leads, with the highest term among those that answer.
    pub async fn leader(&self) -> Option<usize> {
        self.statuses()
            .await
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().filter(|s| s.role == "leader").map(|s| (s.term, i)))
            .max()
            .map(|(_, i)| i)
    }

    /// Waits until a replica leads and every agent is connected to it.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let start = std::time::Instant::now();
        loop {
            // Asked of each replica in turn (the leader knows which agents are connected).
            for addr in &self.addrs {
                let fresh = Client::new(vec![addr.clone()], self.security.client());
                let Ok(mut api) = fresh.and_then(|c| c.replica(addr)) else { continue };
                let nodes =
                    tokio::time::timeout(Duration::from_secs(2), api.list_nodes(api::ListNodesRequest::default()))
                        .await;
                if let Ok(Ok(n)) = nodes {
                    if n.into_inner().nodes.iter().filter(|n| n.connected).count() == self.agents.len() {
                        return Ok(());
                    }
                }
            }
            anyhow::ensure!(
                start.elapsed() < timeout,
                "the cluster was not ready (a leader, every agent connected) within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Every daemon stopped; the namespaces go with `net`.
    pub fn kill_all(&mut self) {
        for i in 0..self.agents.len() {
            if self.agents[i].cgroup.is_some() {
                let _ = self.freeze_node(i, false);
            }
        }
        for d in self.replicas.iter_mut().chain(self.agents.iter_mut()) {
            d.resume();
            d.kill();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_all();
        // Whatever the agents' jobs left running goes with their nodes' cgroups.
        if let Some(base) = &self.cgroups {
            remove_cgroup(base);
        }
    }
}

/// Where this run's agents' cgroups go: under cgroup v2's root (alone, or at
/// /sys/fs/cgroup/unified beside v1), named after the run's directory; `None` without v2.
fn node_cgroups(dir: &Path) -> Option<PathBuf> {
    let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|r| r.join("cgroup.controllers").exists() && r.join("cgroup.procs").exists())?;
    let run = dir.file_name()?.to_string_lossy().replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_");
    let base = root.join(format!("quorum-jepsen-{run}"));
    // A run of this directory before this one (or one killed midway) leaves nothing behind.
    remove_cgroup(&base);
    std::fs::create_dir_all(&base).ok()?;
    // The controllers the root hands down, handed on to the agents' cgroups (with v2 alone, an
    // agent makes its jobs' cgroups with them; beside v1 there are none here).
    let controllers = std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
    for c in controllers.split_whitespace() {
        let _ = std::fs::write(base.join("cgroup.subtree_control"), format!("+{c}"));
    }
    base.join("cgroup.freeze").exists().then_some(base)
}

/// Kills everything in cgroup `dir` and below (`cgroup.kill`), then removes it, deepest first.
fn remove_cgroup(dir: &Path) {
    if !dir.exists() {
        return;
    }
    let _ = std::fs::write(dir.join("cgroup.freeze"), "0");
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    for _ in 0..50 {
        if remove_tree(dir) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn remove_tree(dir: &Path) -> bool {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    std::fs::remove_dir(dir).is_ok() || !dir.exists()
}

/// Compiles the slow-disk shim (`jepsen/slowdisk.c`, preloaded into each controller) into `dir`.
fn build_slowdisk(dir: &Path) -> anyhow::Result<PathBuf> {
    let source = dir.join("slowdisk.c");
    let lib = dir.join("libslowdisk.so");
    std::fs::write(&source, include_str!("../slowdisk.c"))?;
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&source)
        .arg("-ldl")
        .output()
        .context("running cc to build the slow-disk shim (a C compiler, as cargo needs)")?;
    anyhow::ensure!(out.status.success(), "building the slow-disk shim: {}", String::from_utf8_lossy(&out.stderr));
    Ok(lib)
}

/// Calls `f` through `client` (following the leader), giving up after `limit`; the error is
/// the replica's message, or that none answered in time.
pub async fn within<T, F, Fut>(client: &Client, limit: Duration, f: F) -> Result<T, String>
where
    F: FnMut(quorum_client::client::Api) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    match tokio::time::timeout(limit, client.call(f)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(s)) => Err(s.message().to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

impl Cluster {
    /// What a job's `srun` needs to reach this cluster, as a user's environment would give it
    /// (the agents put the Slurm names first on its `PATH`); `None` without `quorum`.
    pub fn step_env(&self) -> Option<Vec<(String, String)>> {
        self.bins.quorum.as_ref()?;
        let mut env = vec![
            ("PATH".to_string(), "/usr/local/bin:/usr/bin:/bin".to_string()),
            ("QUORUM_CONTROLLERS".to_string(), self.addrs.join(",")),
        ];
        env.extend(self.security.env().into_iter().map(|(k, v)| (k.to_string(), v)));
        Some(env)
    }
}

fn controller_toml(dir: &Path, id: u64, addrs: &[String], agents: usize, security: &str, join: bool) -> String {
    let mut text = format!(
        "id = {id}\nlisten = \"{addr}\"\ndata_dir = \"{data}\"\njoin = {join}\n\
         node_timeout_ms = {NODE_TIMEOUT_MS}\nagent_lease_ms = {AGENT_LEASE_MS}\n\
         # jobs leave the queue for the history 10 s after they end: the final reads read both\n\
         min_job_age_s = 10\n",
        addr = addrs[id as usize - 1],
        data = dir.join(format!("r{id}")).display(),
    );
    for (j, a) in addrs.iter().enumerate() {
        text.push_str(&format!("[[replicas]]\nid = {}\naddr = \"{a}\"\n", j + 1));
    }
    // The default partition's jobs preempt the scavenger's and the standby's (the same nodes, a
    // lower tier): the first go back to the queue, the others are suspended until the CPUs they
    // lent are free again.
    text.push_str(&format!(
        "[[partitions]]\nname = \"{PARTITION}\"\nnodes = \"a[1-{agents}]\"\ndefault = true\nmax_time = \"1:00:00\"\n\
         priority_tier = 1\n\
         [[partitions]]\nname = \"{SCAVENGER}\"\nnodes = \"a[1-{agents}]\"\nmax_time = \"1:00:00\"\n\
         priority_tier = 0\npreempt_mode = \"requeue\"\n\
         [[partitions]]\nname = \"{STANDBY}\"\nnodes = \"a[1-{agents}]\"\nmax_time = \"1:00:00\"\n\
         priority_tier = 0\npreempt_mode = \"suspend\"\n\
         [scheduler]\npreempt_type = \"partition_prio\"\n"
    ));
    text.push_str(security);
    text
}
