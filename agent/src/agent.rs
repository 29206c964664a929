//! The agent's state: its configuration, the jobs it knows (by job id, with their fencing
//! tokens and exits), its lease on them, and what it knows of its node's GPUs and health.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quorum_proto::agent::{ExitKind, JobExit};
use tokio::sync::{mpsc, watch};

use crate::{gpu, limits, supervisor, SimGpu};

/// The software version the agent reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The node's name, as partitions name it.
    pub name: String,
    /// Controller addresses (`host:port`); any replica will do.
    pub controllers: Vec<String>,
    pub cpus: u32,
    pub mem_mb: u64,
    pub gpus: Vec<SimGpu>,
    /// Each GPU's device file's number, by index (`/dev/nvidia<minor>`), where known: a job's
    /// cgroup refuses it the others'. Empty: GPUs are told by `CUDA_VISIBLE_DEVICES` alone.
    pub gpu_devices: Vec<crate::devices::Device>,
    pub features: Vec<String>,
    /// Where the agent keeps job scripts.
    pub spool_dir: PathBuf,
    pub heartbeat: Duration,
    /// Between SIGTERM and SIGKILL when a job is cancelled or hits its limit.
    pub kill_wait: Duration,
    /// Run each job as its submitting user (needs root); otherwise as the agent's own user.
    pub switch_user: bool,
    /// Give each job a cgroup (v2 or v1) where the node allows it; otherwise (or when off) rlimits.
    pub cgroups: bool,
    /// The operator's health check, like Slurm's HealthCheckProgram: a failing run drains the
    /// node with its output as the reason, until a run passes.
    pub health_check: Option<HealthCheck>,
    /// The site's prolog and epilog around every job on this node (Slurm's `Prolog=` and
    /// `Epilog=`).
    pub job_scripts: crate::site::JobScripts,
    /// TLS to the controllers with this node's certificate; plaintext when `None` (a cluster
    /// with `insecure = true`).
    pub tls: Option<quorum_auth::tls::ClientTls>,
    /// The cluster's launch key: every launch, signal and output read must carry a grant it
    /// verifies. `None` runs unsigned launches (insecure clusters only).
    pub launch_key: Option<quorum_auth::launch::Verifier>,
    /// How far the controllers' clocks may be from this node's.
    pub clock_skew: Duration,
    /// Where this node has the Slurm command names linked (`quorum install-slurm-commands`):
    /// first on every job's `PATH`.
    pub slurm_commands: Option<PathBuf>,
    /// Where each job gets its private temporary directory (`TMPDIR`), removed when it ends.
    pub tmp_base: PathBuf,
    /// Jobs and step tasks see the node's name as their host name (each in a UTS namespace of
    /// its own; needs root): for several agents on one host, as `quorum dev` runs them, so that
    /// `hostname` and launchers that use it tell the nodes apart.
    pub node_hostname: bool,
    /// With `node_hostname`: the file jobs and step tasks see as `/etc/hosts` (each in a mount
    /// namespace of its own), naming the cluster's nodes where no name service does, as
    /// `quorum dev` writes it.
    pub hosts_file: Option<PathBuf>,
    /// Containers (`--container-image`): whether allowed, the image cache, the registries.
    pub containers: crate::container::ContainerConfig,
}

impl AgentConfig {
    /// An agent of node `name` with one CPU, 1 GiB, no GPUs, a heartbeat a second, 30 s to stop
    /// a job, users switched (where it runs as root), cgroups where the node has them, no health
    /// check, plaintext and no launch key: each caller changes what it needs.
    pub fn new(name: impl Into<String>, controllers: Vec<String>, spool_dir: PathBuf) -> AgentConfig {
        AgentConfig {
            name: name.into(),
            controllers,
            cpus: 1,
            mem_mb: 1024,
            gpus: Vec::new(),
            gpu_devices: Vec::new(),
            features: Vec::new(),
            spool_dir,
            heartbeat: Duration::from_secs(1),
            kill_wait: Duration::from_secs(30),
            switch_user: true,
            cgroups: true,
            health_check: None,
            job_scripts: Default::default(),
            tls: None,
            launch_key: None,
            clock_skew: Duration::from_secs(30),
            slurm_commands: None,
            tmp_base: std::env::temp_dir(),
            node_hostname: false,
            hosts_file: None,
            containers: Default::default(),
        }
    }

    /// TLS and the launch key from a certificates directory (`quorum admin certs`): `ca.pem`,
    /// `agent-<node>.pem` and `.key`, and `launch.pub`.
    pub fn secure_with(&mut self, certs_dir: &std::path::Path) -> anyhow::Result<()> {
        use quorum_auth::pki::{Layout, PeerRole};
        let layout = Layout::new(certs_dir);
        let (cert, key) = layout.pair(&PeerRole::Agent(self.name.clone()));
        let files = quorum_auth::tls::TlsFiles { ca: layout.ca(), cert, key };
        self.tls = Some(files.client()?);
        self.launch_key = Some(quorum_auth::launch::Verifier::load(&layout.launch_pub())?);
        Ok(())
    }
}

#[derive(Clone, Debug)]
pub struct HealthCheck {
    /// Run with `sh -c`.
    pub command: String,
    pub interval: Duration,
}

/// What the agent asks of a running job's runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// End it, for this reason (SIGTERM, then SIGKILL after the kill wait; at once for the lease).
    Kill(ExitKind),
    /// Its time limit is now this many seconds from its start (0: none), by `scontrol update`.
    TimeLimit(u64),
    /// Preempted: SIGTERM now, SIGKILL after this many seconds (its grace time); it ends as
    /// cancelled.
    Preempt(u64),
    /// Suspended: its processes frozen, its time limit held.
    Suspend,
    /// Resumed, its time limit (from its start) this many seconds now (0: none).
    Resume(u64),
}

/// A job this agent knows, by job id.
#[derive(Debug)]
pub(crate) struct JobEntry {
    pub token: u64,
    /// Set while the job runs: asks its runner to kill it, or moves its time limit.
    pub kill: Option<mpsc::Sender<Order>>,
    /// The time limit its runner was last given, in seconds (0: none).
    pub time_limit_s: u64,
    /// Set once it ended, until the leader acknowledges the report.
    pub exit: Option<JobExit>,
    pub exit_sent: Option<Instant>,
    /// The leader acknowledged the exit as committed; the entry stays for its fencing token.
    pub acked: bool,
    pub pgid: Option<i32>,
    /// Killed by the agent itself because its lease ran out.
    pub lease_killed: bool,
    /// May be started elsewhere when this node is lost (`--requeue`): runs under the lease.
    pub leased: bool,
    /// Its record in the spool, removed once the leader acknowledged its exit.
    pub record: Option<PathBuf>,
    /// The GPUs it holds here, and what they did while it ran.
    pub gpus: Vec<u32>,
    pub gpu_use: gpu::GpuUse,
    /// Why its launch failed here, for its exit report.
    pub launch_error: Option<String>,
}

impl JobEntry {
    /// A job of allocation `token` not yet known to have ended.
    pub(crate) fn new(token: u64, kill: Option<mpsc::Sender<Order>>) -> JobEntry {
        JobEntry {
            token,
            kill,
            time_limit_s: 0,
            exit: None,
            exit_sent: None,
            acked: false,
            pgid: None,
            lease_killed: false,
            leased: false,
            record: None,
            gpus: Vec::new(),
            gpu_use: Default::default(),
            launch_error: None,
        }
    }
}

/// What the agent keeps of a running step on this node.
#[derive(Debug, Default)]
pub(crate) struct StepEntry {
    /// Each running task's process group.
    pub pgids: Vec<i32>,
    /// Task 0's stdin, when task 0 runs here.
    pub stdin: Option<crate::input::TaskInput>,
    /// Task 0's terminal (`srun --pty`), for its size.
    pub pty: Option<Arc<std::os::fd::OwnedFd>>,
    /// SIGKILL came for the step: a task not started yet is not started, one starting is killed.
    pub killed: bool,
    /// Task 0's input queue while task 0 is not started yet: what `srun` sends meanwhile waits
    /// in it, and the task's writer takes it over when the task starts.
    pub early_input: Option<crate::input::Queue>,
    /// The step's container here, until the last of its tasks here is done with it.
    pub container: Option<crate::container::StepUse>,
    /// The step's PMI here (`srun --mpi=pmi2`), from its launch on.
    pub pmi: Option<Arc<crate::pmi::StepPmi>>,
    /// The step's PMIx here (`srun --mpi=pmix`), from its launch on.
    pub pmix: Option<Arc<crate::pmix::StepPmix>>,
}

/// The agent's lease on its jobs: the send time of the newest heartbeat the leader answered,
/// and the lease the leader gave with that answer.
#[derive(Debug, Default)]
struct Lease {
    answered_sent_at: Option<Instant>,
    length: Option<Duration>,
}

/// The lease a job launched before the first answered heartbeat starts with: the shortest lease
/// a controller gives.
const FIRST_LEASE_MS: u64 = 2_000;

/// The agent's job table, shared between the stream and the runners.
pub struct Agent {
    pub config: AgentConfig,
    pub(crate) jobs: Mutex<HashMap<u64, JobEntry>>,
    pub(crate) exits_tx: mpsc::UnboundedSender<u64>,
    pub(crate) exits_rx: Mutex<Option<mpsc::UnboundedReceiver<u64>>>,
    /// The steps' tasks running here, by (job, step).
    pub(crate) steps: Mutex<HashMap<(u64, u32), StepEntry>>,
    /// Messages for the leader from the steps' tasks (output, exits), sent on whichever stream
    /// is up; a full queue holds the tasks' output back.
    pub(crate) outbox: mpsc::Sender<quorum_proto::agent::AgentMessage>,
    pub(crate) outbox_rx: Mutex<Option<mpsc::Receiver<quorum_proto::agent::AgentMessage>>>,
    /// The address of the leader this agent last reached: a job's `srun` asks it first.
    pub(crate) leader: Mutex<Option<String>>,
    lease: Mutex<Lease>,
    /// Fault injection: behave as if every packet to and from the controllers were dropped.
    isolated: AtomicBool,
    /// Turns true when the agent stops: its job watchers end, the jobs go on.
    pub(crate) stopped: watch::Sender<bool>,
    /// When this agent started, ms since the epoch; the leader shows it so that an upgrade
    /// script can tell the new process from the old.
    pub started_at_ms: u64,
    /// How jobs are limited, found when the agent starts.
    limits: std::sync::OnceLock<limits::Limits>,
    gpu_source: Arc<Mutex<Box<dyn gpu::GpuSource>>>,
    /// The newest GPU check, sent with each heartbeat.
    gpu_health: Mutex<Vec<quorum_proto::agent::GpuHealth>>,
    /// What that check read of each GPU that could be read (for `/metrics`).
    gpu_readings: Mutex<Vec<(u32, gpu::Reading)>>,
    /// The health check's output while it fails.
    health_check_failure: Mutex<String>,
    /// The most resident memory each running job's and step task's process group held
    /// together at a heartbeat's sample (KiB), from its start to its end.
    rss_peaks: Mutex<HashMap<i32, u64>>,
    /// The node's image cache and the jobs' containers.
    pub containers: crate::container::Containers,
}

impl Agent {
    /// An agent whose GPUs (if any) are simulated.
    pub fn new(config: AgentConfig) -> Arc<Agent> {
        let sim = gpu::SimSource::new(config.gpus.len());
        Agent::with_gpu_source(config, Box::new(sim))
    }

    /// An agent whose GPU health comes from `source` (NVML on a real GPU node).
    pub fn with_gpu_source(config: AgentConfig, source: Box<dyn gpu::GpuSource>) -> Arc<Agent> {
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        let (outbox, outbox_rx) = mpsc::channel(1024);
        let containers = crate::container::Containers::new(config.containers.clone(), &config.spool_dir);
        Arc::new(Agent {
            containers,
            config,
            jobs: Mutex::new(HashMap::new()),
            exits_tx,
            exits_rx: Mutex::new(Some(exits_rx)),
            steps: Mutex::new(HashMap::new()),
            outbox,
            outbox_rx: Mutex::new(Some(outbox_rx)),
            leader: Mutex::new(None),
            lease: Mutex::new(Lease::default()),
            isolated: AtomicBool::new(false),
            stopped: watch::Sender::new(false),
            started_at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            limits: std::sync::OnceLock::new(),
            gpu_source: Arc::new(Mutex::new(source)),
            gpu_health: Mutex::new(Vec::new()),
            gpu_readings: Mutex::new(Vec::new()),
            health_check_failure: Mutex::new(String::new()),
            rss_peaks: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn gpu_health(&self) -> Vec<quorum_proto::agent::GpuHealth> {
        self.gpu_health.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What the newest GPU check read of each GPU that could be read.
    pub(crate) fn gpu_readings(&self) -> Vec<(u32, gpu::Reading)> {
        self.gpu_readings.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn health_check_failure(&self) -> String {
        self.health_check_failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `quorum admin gpu-fault`, delivered by the leader.
    pub fn inject_gpu_fault(&self, gpu: u32, kind: &str) {
        let result = quorum_model::gpu_fault::parse_fault(kind)
            .and_then(|f| self.gpu_source.lock().unwrap_or_else(|p| p.into_inner()).inject(gpu, f));
        match result {
            Ok(()) => tracing::warn!(gpu, kind, "GPU fault injected"),
            Err(e) => tracing::warn!(gpu, kind, "GPU fault not injected: {e}"),
        }
    }

    /// Checks every GPU now and keeps the result for the next heartbeat; state changes are
    /// logged.
    pub(crate) async fn check_gpus(&self) {
        let Some((health, readings)) = self.read_gpus().await else { return };
        for entry in self.lock_jobs().values_mut().filter(|e| e.exit.is_none() && !e.gpus.is_empty()) {
            entry.gpu_use.sample(&readings, &entry.gpus);
        }
        *self.gpu_readings.lock().unwrap_or_else(|p| p.into_inner()) = readings;
        let mut current = self.gpu_health.lock().unwrap_or_else(|p| p.into_inner());
        for g in &health {
            let before = current.iter().find(|c| c.index == g.index).map(|c| (c.state, c.detail.clone()));
            if before.as_ref().is_none_or(|(s, d)| *s != g.state || *d != g.detail)
                && (before.is_some() || g.state != quorum_proto::agent::GpuState::GpuOk as i32)
            {
                let state = quorum_proto::agent::GpuState::try_from(g.state).map(|s| s.as_str_name()).unwrap_or("?");
                tracing::warn!(gpu = g.index, state, detail = %g.detail, "GPU health changed");
            }
        }
        *current = health;
    }

    /// Samples process group `pgid` (a job's or a step task's, started now) at every heartbeat
    /// until [`Agent::take_rss_peak`].
    pub(crate) fn track_rss(&self, pgid: i32) {
        self.rss_peaks.lock().unwrap_or_else(|p| p.into_inner()).insert(pgid, 0);
    }

    /// The most resident memory process group `pgid` held together at any sample (KiB); it is
    /// sampled no more.
    pub(crate) fn take_rss_peak(&self, pgid: i32) -> u64 {
        self.rss_peaks.lock().unwrap_or_else(|p| p.into_inner()).remove(&pgid).unwrap_or(0)
    }

    /// Keeps in each running job's record what was measured of it so far (its GPUs' use, its
    /// processes' peak memory together), so that an agent restarted while it runs goes on from
    /// there ([`Agent::resume_measured`]). Only what changed is written: a job with GPUs (sampled
    /// at every check), or one whose process group's peak rose (`raised`).
    pub(crate) async fn save_measured(&self, raised: &std::collections::BTreeSet<i32>) {
        let peaks = self.rss_peaks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let saves: Vec<(PathBuf, String)> = self
            .lock_jobs()
            .values()
            .filter(|e| e.exit.is_none() && (!e.gpus.is_empty() || e.pgid.is_some_and(|g| raised.contains(&g))))
            .filter_map(|e| {
                let rss = e.pgid.and_then(|g| peaks.get(&g)).copied().unwrap_or(0);
                Some((e.record.clone()?, format!("rss {rss}\ngpu {}\n", e.gpu_use.encode())))
            })
            .collect();
        if saves.is_empty() {
            return;
        }
        let _ = tokio::task::spawn_blocking(move || {
            for (record, text) in saves {
                if let Err(e) = crate::record::write_measured(&record, &text) {
                    tracing::debug!(record = %record.display(), error = %e, "cannot keep what was measured of the job");
                }
            }
        })
        .await;
    }

    /// Goes on from what an earlier agent measured of a job it finds still running: its GPUs'
    /// use into `entry`, its peak memory into the samples of process group `pgid`.
    pub(crate) fn resume_measured(&self, entry: &mut JobEntry, pgid: i32, text: &str) {
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("rss", kb)) => {
                    let kb = kb.trim().parse().unwrap_or(0);
                    self.raise_rss_peaks([(pgid, kb)].into());
                }
                Some(("gpu", used)) => {
                    if let Some(used) = gpu::GpuUse::decode(used) {
                        entry.gpu_use = used;
                    }
                }
                _ => {}
            }
        }
    }

    /// The process groups whose memory is sampled.
    pub(crate) fn rss_tracked(&self) -> std::collections::BTreeSet<i32> {
        self.rss_peaks.lock().unwrap_or_else(|p| p.into_inner()).keys().copied().collect()
    }

    /// Raises each tracked group's peak to its sample in `rss`; a group that ended meanwhile
    /// (no longer tracked) is not taken up again. The groups whose peak rose.
    pub(crate) fn raise_rss_peaks(&self, rss: std::collections::BTreeMap<i32, u64>) -> std::collections::BTreeSet<i32> {
        let mut peaks = self.rss_peaks.lock().unwrap_or_else(|p| p.into_inner());
        let mut raised = std::collections::BTreeSet::new();
        for (pgid, kb) in rss {
            if let Some(peak) = peaks.get_mut(&pgid).filter(|peak| kb > **peak) {
                *peak = kb;
                raised.insert(pgid);
            }
        }
        raised
    }

    /// Every GPU's health and readings now (off the runtime's threads: NVML may block).
    async fn read_gpus(&self) -> Option<gpu::Checked> {
        let source = self.gpu_source.clone();
        tokio::task::spawn_blocking(move || {
            let mut source = source.lock().unwrap_or_else(|p| p.into_inner());
            gpu::check(source.as_mut())
        })
        .await
        .ok()
    }

    /// Reads the GPUs of job `job_id` (allocation `token`) once, as it starts (`at_start`: the
    /// energy counters it draws from) or as it ends (a sample of its use, so that a job shorter
    /// than the GPU checks between heartbeats has one too).
    pub(crate) async fn read_job_gpus(&self, job_id: u64, token: u64, at_start: bool) {
        let Some((_, readings)) = self.read_gpus().await else { return };
        let mut jobs = self.lock_jobs();
        let Some(entry) = jobs.get_mut(&job_id).filter(|e| e.token == token && e.exit.is_none()) else { return };
        let gpus = entry.gpus.clone();
        if at_start {
            entry.gpu_use.start(&readings, &gpus);
        } else {
            entry.gpu_use.sample(&readings, &gpus);
        }
    }

    /// Runs the operator's health check once and keeps its verdict.
    pub(crate) async fn run_health_check(&self, check: &HealthCheck) {
        // It sees the agent's own environment, as it always has.
        let failure =
            crate::site::run(&check.command, None, crate::site::HEALTH_CHECK_TIMEOUT).await.err().unwrap_or_default();
        let mut current = self.health_check_failure.lock().unwrap_or_else(|p| p.into_inner());
        if *current != failure {
            if failure.is_empty() {
                tracing::info!("the health check passes again");
            } else {
                tracing::warn!(output = %failure, "the health check failed");
            }
            *current = failure;
        }
    }

    /// How this agent limits its jobs (detected on first use).
    pub fn limits(&self) -> &limits::Limits {
        self.limits.get_or_init(|| {
            let scope = limits::scope(&self.config.name, &self.config.spool_dir);
            let l = limits::Limits::detect(&scope, self.config.cgroups);
            match &l {
                limits::Limits::Cgroup(_) => {
                    tracing::info!(node = %self.config.name, limits = %l.describe(), "job limits")
                }
                limits::Limits::Rlimits(_) => {
                    tracing::warn!(node = %self.config.name, limits = %l.describe(), "no cgroups for jobs")
                }
            }
            l
        })
    }

    /// The leader answered a heartbeat sent at `sent_at`, granting `length` (none when zero).
    /// The supervisors of `--requeue` jobs see the new deadline in the lease file.
    pub(crate) fn heartbeat_answered(&self, sent_at: Instant, length: Duration) {
        let mut lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        if lease.answered_sent_at.is_none_or(|t| t < sent_at) {
            lease.answered_sent_at = Some(sent_at);
        }
        lease.length = (!length.is_zero()).then_some(length);
        if let Err(e) = crate::record::write_lease(&self.config.spool_dir, Self::deadline_of(&lease)) {
            tracing::warn!(error = %e, "cannot renew the lease file; leased jobs stop when it runs out");
        }
    }

    /// When the lease ends on the monotonic clock (ms); `None` when the leader gives none.
    fn deadline_of(lease: &Lease) -> Option<u64> {
        let (sent, length) = (lease.answered_sent_at?, lease.length?);
        let sent_ms = crate::supervisor::monotonic_ms().saturating_sub(sent.elapsed().as_millis() as u64);
        Some(sent_ms.saturating_add(length.as_millis() as u64))
    }

    /// The deadline a `--requeue` job launched now starts with (its supervisor then follows the
    /// lease file): the current lease, or a first short one before any heartbeat was answered;
    /// `None` when the leader gives no lease.
    pub(crate) fn launch_deadline_ms(&self) -> Option<u64> {
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        match lease.answered_sent_at {
            None => Some(crate::supervisor::monotonic_ms() + FIRST_LEASE_MS),
            Some(_) => Self::deadline_of(&lease),
        }
    }

    /// How long since the newest answered heartbeat was sent, when that exceeds the lease.
    fn lease_overrun(&self) -> Option<Duration> {
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        let since = lease.answered_sent_at?.elapsed();
        (since > lease.length?).then_some(since)
    }

    /// Fault injection for tests and drills: while on, the agent behaves as if the network to
    /// every controller were cut (nothing sent, nothing received, no new connection).
    pub fn set_isolated(&self, on: bool) {
        self.isolated.store(on, Ordering::SeqCst);
    }

    pub fn isolated(&self) -> bool {
        self.isolated.load(Ordering::SeqCst)
    }

    /// Kills every running `--requeue` job whose kill has not been asked for yet, once the lease
    /// ran out: the leader may already have declared this node DOWN and started the jobs
    /// elsewhere. (Their supervisors kill them too, should this agent be paused or gone.) Every
    /// other job runs on through any outage, to be reconciled when a leader is reached again.
    pub(crate) fn enforce_lease(&self) {
        let Some(silent) = self.lease_overrun() else { return };
        let mut killed = Vec::new();
        for (id, entry) in self.lock_jobs().iter_mut() {
            if entry.leased && entry.exit.is_none() && !entry.lease_killed {
                if let Some(kill) = &entry.kill {
                    entry.lease_killed = true;
                    let _ = kill.try_send(Order::Kill(ExitKind::LeaseExpired));
                    killed.push(*id);
                }
            }
        }
        if !killed.is_empty() {
            tracing::warn!(
                silent_ms = silent.as_millis() as u64,
                jobs = ?killed,
                "no heartbeat answered within the lease: killing this node's --requeue jobs"
            );
        }
    }

    pub(crate) fn lock_jobs(&self) -> std::sync::MutexGuard<'_, HashMap<u64, JobEntry>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The running jobs as a heartbeat reports them: each with the highest utilization of its
    /// GPUs here at the last check (for the leader's GPU idle policy).
    pub(crate) fn running_reports(&self) -> Vec<quorum_proto::agent::RunningJob> {
        let mut v: Vec<_> = self
            .lock_jobs()
            .iter()
            .filter(|(_, e)| e.exit.is_none())
            .map(|(id, e)| quorum_proto::agent::RunningJob {
                job_id: *id,
                token: e.token,
                gpu_util_pct: e.gpu_use.last_util_pct.filter(|_| !e.gpus.is_empty()),
            })
            .collect();
        v.sort_unstable_by_key(|r| r.job_id);
        v
    }

    /// Jobs running now, as (job id, token).
    pub fn running(&self) -> Vec<(u64, u64)> {
        self.running_reports().into_iter().map(|r| (r.job_id, r.token)).collect()
    }

    /// Kills every job's process group at once (used when a dev cluster shuts down).
    pub fn kill_all(&self) {
        for entry in self.lock_jobs().values() {
            if let (Some(pgid), None) = (entry.pgid, &entry.exit) {
                supervisor::signal_group(pgid, libc::SIGKILL);
            }
        }
        for e in self.lock_steps().values() {
            for &pgid in &e.pgids {
                supervisor::signal_group(pgid, libc::SIGKILL);
            }
        }
    }
}

impl Agent {
    /// Sets `QUORUM_LEADER` in a job's or a task's environment to the leader this agent reached
    /// last, so that the client commands run there (`srun` above all) ask it first rather than
    /// finding it through a follower; a stale one only costs that.
    pub(crate) fn tell_leader(&self, env: &mut Vec<(String, String)>) {
        if let Some(addr) = self.leader.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            env.retain(|(k, _)| k != quorum_proto::LEADER_ENV);
            env.push((quorum_proto::LEADER_ENV.into(), addr));
        }
    }

    pub(crate) fn lock_steps(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<(u64, u32), StepEntry>> {
        self.steps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Kills every task of `job_id`'s steps here (its end; with a cgroup, the cgroup's end
    /// already did).
    pub(crate) fn kill_steps(&self, job_id: u64) {
        for (_, e) in self.lock_steps().iter().filter(|((j, _), _)| *j == job_id) {
            for &pgid in &e.pgids {
                supervisor::signal_group(pgid, libc::SIGKILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::sync::mpsc;

    use super::{Agent, AgentConfig, JobEntry, Order};
    use quorum_proto::agent::ExitKind;

    /// The agent's own lease check, apart from the supervisors': once no heartbeat was answered
    /// within the lease, each running `--requeue` job is told to die, once; the other jobs run
    /// on, and nothing is killed while the lease holds or when the leader gives none.
    #[test]
    fn the_agent_kills_only_its_leased_jobs_and_only_once_its_lease_ran_out() {
        let spool = tempfile::tempdir().unwrap();
        let agent = Agent::new(AgentConfig {
            switch_user: false,
            cgroups: false,
            ..AgentConfig::new("node01", vec!["127.0.0.1:1".into()], spool.path().to_path_buf())
        });
        let (leased_tx, mut leased) = mpsc::channel(4);
        let (plain_tx, mut plain) = mpsc::channel(4);
        {
            let mut jobs = agent.lock_jobs();
            let mut entry = JobEntry::new(1, Some(leased_tx));
            entry.leased = true;
            jobs.insert(1, entry);
            jobs.insert(2, JobEntry::new(1, Some(plain_tx)));
        }
        let five_ago = Instant::now().checked_sub(Duration::from_secs(5)).expect("a monotonic clock past 5 s");
        // Answered 5 s ago with a 10 s lease: it holds.
        agent.heartbeat_answered(five_ago, Duration::from_secs(10));
        agent.enforce_lease();
        assert!(leased.try_recv().is_err() && plain.try_recv().is_err(), "nothing killed while the lease holds");
        // The leader gives none: nothing is killed however long the silence.
        agent.heartbeat_answered(five_ago, Duration::ZERO);
        agent.enforce_lease();
        assert!(leased.try_recv().is_err(), "no lease, no kill");
        // A 1 s lease, 5 s of silence: the --requeue job is killed, the other runs on.
        agent.heartbeat_answered(five_ago, Duration::from_secs(1));
        agent.enforce_lease();
        assert_eq!(leased.try_recv().ok(), Some(Order::Kill(ExitKind::LeaseExpired)));
        assert!(plain.try_recv().is_err(), "a job without --requeue runs through the outage");
        assert!(agent.lock_jobs()[&1].lease_killed);
        // Asked once: the next checks do not ask again.
        agent.enforce_lease();
        assert!(leased.try_recv().is_err());
        // The lease file the supervisors follow says the lease ran out 4 s ago.
        let text = std::fs::read_to_string(crate::record::lease_file(spool.path())).expect("a lease file");
        let deadline: u64 = text.trim().parse().expect("a deadline in ms");
        let now = crate::supervisor::monotonic_ms();
        assert!(deadline < now && now - deadline >= 3_000, "{deadline} at {now}");
    }
}
