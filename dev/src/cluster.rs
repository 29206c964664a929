//! `quorum dev`: a whole cluster in one process — three controller replicas with their own
//! RocksDB directories and real gRPC on loopback, and agents with simulated GPUs that run real
//! processes. The integration tests start the same cluster on ephemeral ports.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quorum_agent::{Agent, AgentConfig, SimGpu};
use quorum_client::client::Client;
use quorum_control::config::{
    AccountingConfig, ControllerConfig, HttpConfig, PartitionConfig, ReplicaConfig, SecurityConfig,
};
use quorum_control::Controller;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::security::DevSecurity;

#[derive(Clone, Debug)]
pub struct DevOptions {
    /// Where the replicas keep their data; a temporary directory when `None`.
    pub data_dir: Option<PathBuf>,
    /// Controller ports; 0 picks a free one.
    pub ports: Vec<u16>,
    pub agents: usize,
    pub cpus_per_agent: u32,
    pub mem_mb_per_agent: u64,
    pub gpus_per_agent: u32,
    pub gpu_type: String,
    /// The agents' GPUs' device files by index (`quorum-agent --gpu-files`), where jobs are to
    /// be kept from the GPUs not theirs; the agents of one host share them.
    pub gpu_files: Vec<PathBuf>,
    pub kill_wait: Duration,
    pub snapshot_every: u64,
    pub snapshot_keep_logs: u64,
    /// A silent node is DOWN after this long.
    pub node_timeout: Duration,
    /// An agent cut off from the leader for this long has its `--requeue` jobs killed.
    pub agent_lease: Duration,
    /// Replicas (by index) that behave as an older release at this feature level.
    pub emulate_levels: Vec<(usize, u32)>,
    /// The agents run each job as its submitting user (when root). Off by default: a dev
    /// cluster runs every job as whoever runs it.
    pub switch_user: bool,
    /// The agents give jobs cgroups where the node allows (with cgroup v2 they move this process
    /// into a leaf cgroup of its own to do so), as real agents do. Off in tests, which start
    /// many clusters in one process: rlimits.
    pub cgroups: bool,
    /// The agents' health check program (`sh -c`), like Slurm's HealthCheckProgram.
    pub health_check: Option<quorum_agent::HealthCheck>,
    /// The agents' prolog and epilog around every job (`sh -c`), like Slurm's.
    pub job_scripts: quorum_agent::site::JobScripts,
    /// Certificates and munged: made in the data directory when `None` (`quorum dev`); the
    /// tests share one per process.
    pub security: Option<Arc<DevSecurity>>,
    /// Plaintext gRPC and unsigned launches (`insecure = true`), to measure what security costs.
    pub insecure: bool,
    /// `[security]` roles and private data of the replicas.
    pub admins: Vec<String>,
    pub operators: Vec<String>,
    pub private_data: Vec<String>,
    /// Run the agents as `quorum-agent` processes of this binary instead of in this process, so
    /// that one can be paused (SIGSTOP) or killed as a real one can.
    pub agent_binary: Option<PathBuf>,
    /// The `quorum` program: when set, `quorum install-slurm-commands` links the Slurm command
    /// names in `<data>/slurm`, which the agents put first on their jobs' PATH, as a node with
    /// them installed does.
    pub quorum_program: Option<PathBuf>,
    /// The replicas' `mail_program` (Slurm's MailProg).
    pub mail_program: Option<PathBuf>,
    /// The replicas' `mpi_default` (Slurm's MpiDefault): what steps get without `srun --mpi`.
    pub mpi_default: quorum_control::model::mpi::Mpi,
    /// The replicas' submit filter (`[submit_filter]`).
    pub submit_filter: Option<quorum_control::server::filter::SubmitFilterConfig>,
    /// The replicas' GPU idle policy (`[gpu_idle]`).
    pub gpu_idle: Option<quorum_control::config::GpuIdleConfig>,
    /// The cluster's licenses (`[licenses]`).
    pub licenses: std::collections::BTreeMap<String, u32>,
    /// How long an ended job stays in the hot state before it moves to the job history
    /// (`min_job_age_s`; zero: for good).
    pub min_job_age: Duration,
    /// How long after it ended the job history forgets a job (`[accounting]
    /// purge_job_after_s`; zero: never).
    pub purge_job_after: Duration,
    /// Node features by agent: the i-th agent has the i-th list (none past the end).
    pub node_features: Vec<Vec<String>>,
    /// `[http] metrics_allow`: address ranges that scrape `/metrics` without a token.
    pub metrics_allow: Vec<String>,
    /// Partitions besides `gpu` (every node, the default), as a site configures them.
    pub extra_partitions: Vec<PartitionConfig>,
    /// `[scheduler]`: the policy (preemption among it).
    pub scheduler: quorum_control::config::SchedulerConfig,
    /// `[[qos]]`.
    pub qos: Vec<quorum_control::config::QosConfig>,
    /// `[limits]`: what one submit may carry and what the cluster holds at once.
    pub limits: quorum_control::config::AdmissionLimits,
    /// The agents' containers: allowed or not, registries, their CAs, the image cache's bound.
    pub containers: quorum_agent::container::ContainerConfig,
    /// A controller config file's cluster-wide sections (`quorum dev --config`): partitions,
    /// scheduler and preemption, QOS, accounts, switches, licenses, limits, the submit filter,
    /// `[gpu_idle]`, mail, `mpi_default`, accounting, roles and private data, `min_job_age_s`,
    /// node timeouts and `[http] metrics_allow` replace this cluster's own; the replica's own
    /// fields (id, addresses, data directory, certificates, Raft timings) stay the dev
    /// cluster's. Its partitions and switches name the dev cluster's nodes, node01, node02, ...
    pub site: Option<ControllerConfig>,
}

impl Default for DevOptions {
    fn default() -> Self {
        Self {
            data_dir: None,
            ports: vec![7101, 7102, 7103],
            agents: 2,
            cpus_per_agent: 8,
            mem_mb_per_agent: 32 * 1024,
            gpus_per_agent: 4,
            gpu_type: "h100".into(),
            gpu_files: Vec::new(),
            kill_wait: Duration::from_secs(5),
            snapshot_every: 10_000,
            snapshot_keep_logs: 1_000,
            node_timeout: Duration::from_secs(30),
            agent_lease: Duration::from_secs(20),
            emulate_levels: Vec::new(),
            // A dev cluster run by root runs each job as its user, as a real agent does, never
            // someone else's job as root.
            switch_user: quorum_agent::identity::is_root(),
            cgroups: true,
            health_check: None,
            job_scripts: Default::default(),
            security: None,
            insecure: false,
            admins: Vec::new(),
            operators: Vec::new(),
            private_data: Vec::new(),
            agent_binary: None,
            quorum_program: None,
            mail_program: None,
            mpi_default: Default::default(),
            submit_filter: None,
            gpu_idle: None,
            licenses: Default::default(),
            min_job_age: Duration::from_secs(300),
            metrics_allow: Vec::new(),
            purge_job_after: Duration::ZERO,
            containers: Default::default(),
            site: None,
            node_features: Vec::new(),
            extra_partitions: Vec::new(),
            scheduler: Default::default(),
            qos: Vec::new(),
            limits: Default::default(),
        }
    }
}

impl DevOptions {
    /// Ephemeral ports and short timeouts, for tests.
    pub fn for_tests() -> Self {
        Self {
            ports: vec![0, 0, 0],
            kill_wait: Duration::from_secs(2),
            cgroups: false,
            security: Some(DevSecurity::shared()),
            ..Self::default()
        }
    }
}

enum DevAgent {
    InProcess {
        agent: Arc<Agent>,
        stop: watch::Sender<bool>,
        task: JoinHandle<()>,
    },
    /// A `quorum-agent` process; `spool` is where its jobs' records are.
    Process {
        child: tokio::process::Child,
        spool: PathBuf,
    },
}

impl DevAgent {
    /// Stops the agent; its jobs go on under their supervisors unless `kill_jobs`.
    async fn stop(self, kill_jobs: bool) {
        match self {
            DevAgent::InProcess { agent, stop, task } => {
                if kill_jobs {
                    agent.kill_all();
                }
                let _ = stop.send(true);
                let _ = task.await;
            }
            DevAgent::Process { mut child, spool } => {
                if let Some(pid) = child.id() {
                    // A paused agent would not see its SIGTERM; SIGKILL ends it either way.
                    // SAFETY: kill(2) on this process's own child; no memory is touched.
                    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
                }
                let _ = child.kill().await;
                if kill_jobs {
                    for found in quorum_agent::record::scan(&spool) {
                        if let Some(pids) = found.pids {
                            quorum_agent::supervisor::signal_group(pids.pgid, libc::SIGKILL);
                        }
                    }
                }
            }
        }
    }
}

/// A running embedded cluster.
pub struct DevCluster {
    pub addrs: Vec<String>,
    configs: Vec<ControllerConfig>,
    controllers: Vec<Option<Controller>>,
    agents: Vec<Option<DevAgent>>,
    agent_configs: Vec<AgentConfig>,
    agent_binary: Option<PathBuf>,
    gpu_files: Vec<PathBuf>,
    pub data_dir: PathBuf,
    /// `None` when insecure.
    pub security: Option<Arc<DevSecurity>>,
    _tmp: Option<tempfile::TempDir>,
    /// Where this cluster's jobs get their TMPDIRs.
    _job_tmp: tempfile::TempDir,
}

/// Links the Slurm command names in `dir` to `quorum`, with `quorum install-slurm-commands`.
pub fn link_slurm_commands(quorum: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let out = std::process::Command::new(quorum)
        .arg("install-slurm-commands")
        .arg(dir)
        .output()
        .map_err(|e| anyhow::anyhow!("running {} install-slurm-commands: {e}", quorum.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} install-slurm-commands: {}",
        quorum.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(dir.to_path_buf())
}

/// Node names of the dev agents: node01, node02, ...
pub fn node_name(i: usize) -> String {
    format!("node{:02}", i + 1)
}

/// `config` (a dev replica's) with `site`'s cluster-wide sections in place of its own.
fn with_site(config: ControllerConfig, site: Option<&ControllerConfig>) -> ControllerConfig {
    let Some(site) = site else { return config };
    let mut security = config.security;
    security.admins = site.security.admins.clone();
    security.operators = site.security.operators.clone();
    security.private_data = site.security.private_data.clone();
    security.clock_skew_s = site.security.clock_skew_s;
    ControllerConfig {
        partitions: if site.partitions.is_empty() { config.partitions } else { site.partitions.clone() },
        scheduler: site.scheduler.clone(),
        qos: site.qos.clone(),
        accounts: site.accounts.clone(),
        switches: site.switches.clone(),
        licenses: site.licenses.clone(),
        security,
        limits: site.limits.clone(),
        submit_filter: site.submit_filter.clone(),
        gpu_idle: site.gpu_idle.clone(),
        mail_program: site.mail_program.clone(),
        min_job_age_s: site.min_job_age_s,
        mpi_default: site.mpi_default,
        accounting: site.accounting.clone(),
        node_timeout_ms: site.node_timeout_ms,
        agent_lease_ms: site.agent_lease_ms,
        http: HttpConfig { listen: config.http.listen, metrics_allow: site.http.metrics_allow.clone() },
        ..config
    }
}

/// That every node `site`'s partitions and switches name is one of the `agents` nodes of the
/// dev cluster: a partition of nodes that never come would hold its jobs for ever.
fn check_site_nodes(site: &ControllerConfig, agents: usize) -> anyhow::Result<()> {
    let ours: Vec<String> = (0..agents.max(1)).map(node_name).collect();
    let named = site
        .partitions
        .iter()
        .map(|p| (format!("partition {}", p.name), &p.nodes))
        .chain(site.switches.iter().map(|s| (format!("switch {}", s.name), &s.nodes)));
    for (what, nodes) in named {
        let names = quorum_control::model::hostlist::expand(nodes)
            .map_err(|e| anyhow::anyhow!("{what}: nodes = \"{nodes}\": {e}"))?;
        if let Some(other) = names.iter().find(|n| !ours.contains(n)) {
            anyhow::bail!(
                "{what} names node {other}, which this dev cluster does not have: its nodes are {} (--agents {agents}); name them in the file",
                quorum_control::model::hostlist::compress(&ours.iter().map(String::as_str).collect::<Vec<_>>())
            );
        }
    }
    Ok(())
}

/// The loopback address node `i` of a dev cluster has in its jobs' `/etc/hosts`: 127.0.1.1,
/// 127.0.1.2, ... (every 127.x.y.z reaches this host).
pub fn node_address(i: usize) -> std::net::Ipv4Addr {
    let i = i as u32;
    std::net::Ipv4Addr::new(127, (i / 254 / 254 % 254) as u8, (1 + i / 254 % 254) as u8, (1 + i % 254) as u8)
}

/// The `/etc/hosts` the jobs of a dev cluster of `agents` nodes see: this host's, its lines for
/// the nodes' names left out, and one line for each node.
fn write_hosts_file(data_dir: &std::path::Path, agents: usize) -> anyhow::Result<std::path::PathBuf> {
    let names: Vec<String> = (0..agents).map(node_name).collect();
    let host = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    let mut text = String::new();
    for line in host.lines() {
        let named =
            line.split('#').next().unwrap_or("").split_whitespace().skip(1).any(|n| names.iter().any(|m| m == n));
        if !named {
            text.push_str(line);
            text.push('\n');
        }
    }
    text.push_str("# quorum dev: this cluster's nodes\n");
    for (i, name) in names.iter().enumerate() {
        text.push_str(&format!("{}\t{name}\n", node_address(i)));
    }
    let path = data_dir.join("hosts");
    std::fs::write(&path, text)?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    Ok(path)
}

impl DevCluster {
    pub async fn start(opts: DevOptions) -> anyhow::Result<DevCluster> {
        let (tmp, data_dir) = match &opts.data_dir {
            Some(d) => (None, d.clone()),
            None => {
                let t = tempfile::Builder::new().prefix("quorum-dev-").tempdir()?;
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        };
        // Other users pass through it (not list it) to the CA, the munged socket and their jobs'
        // scripts; the replicas' directories and the agents' records in it are private.
        std::fs::create_dir_all(&data_dir)?;
        std::fs::set_permissions(&data_dir, std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
        let security = match (&opts.security, opts.insecure) {
            (_, true) => None,
            (Some(s), false) => Some(s.clone()),
            (None, false) => Some(Arc::new(DevSecurity::create(&data_dir.join("security"))?)),
        };
        let security_config = |id: u64| -> anyhow::Result<SecurityConfig> {
            let mut c = match (&security, &opts.security) {
                (Some(s), _) => s.controller(id)?,
                // Insecure: plaintext; users still prove who they are to a munged, when given one.
                (None, given) => SecurityConfig {
                    insecure: true,
                    munge_socket: given.as_ref().map(|s| s.munge_socket().to_path_buf()),
                    ..SecurityConfig::default()
                },
            };
            c.admins = opts.admins.clone();
            c.operators = opts.operators.clone();
            c.private_data = opts.private_data.clone();
            Ok(c)
        };
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for port in &opts.ports {
            let l = match port {
                // A port outside the ephemeral range, so that a replica restarted on it never finds
                // it taken by an outgoing connection.
                0 => {
                    let l = crate::ports::listener()?;
                    l.set_nonblocking(true)?;
                    TcpListener::from_std(l)?
                }
                port => TcpListener::bind(("127.0.0.1", *port))
                    .await
                    .map_err(|e| anyhow::anyhow!("binding 127.0.0.1:{port}: {e} (is another quorum dev running?)"))?,
            };
            addrs.push(l.local_addr()?.to_string());
            listeners.push(l);
        }
        let replicas: Vec<ReplicaConfig> =
            addrs.iter().enumerate().map(|(i, a)| ReplicaConfig { id: i as u64 + 1, addr: a.clone() }).collect();
        let nodes = if opts.agents == 0 { "node01".to_string() } else { format!("node[01-{:02}]", opts.agents) };
        if let Some(site) = &opts.site {
            check_site_nodes(site, opts.agents)?;
        }
        let configs: Vec<ControllerConfig> = replicas
            .iter()
            .enumerate()
            .map(|(i, r)| -> anyhow::Result<ControllerConfig> {
                Ok(ControllerConfig {
                    id: r.id,
                    listen: r.addr.clone(),
                    advertise: None,
                    data_dir: data_dir.join(format!("controller-{}", r.id)),
                    replicas: replicas.clone(),
                    partitions: std::iter::once(PartitionConfig {
                        name: "gpu".into(),
                        nodes: nodes.clone(),
                        default: true,
                        max_time: Some("7-00:00:00".into()),
                        default_time: Some("1:00:00".into()),
                        default_mem_per_cpu: Some("1G".into()),
                        ..Default::default()
                    })
                    .chain(opts.extra_partitions.iter().cloned())
                    .collect(),
                    raft_heartbeat_ms: 50,
                    election_timeout_min_ms: 150,
                    election_timeout_max_ms: 300,
                    raft_max_payload_entries: 32,
                    snapshot_every: opts.snapshot_every,
                    snapshot_keep_logs: opts.snapshot_keep_logs,
                    node_timeout_ms: opts.node_timeout.as_millis() as u64,
                    agent_lease_ms: opts.agent_lease.as_millis() as u64,
                    join: false,
                    scheduler: opts.scheduler.clone(),
                    qos: opts.qos.clone(),
                    accounts: vec![],
                    switches: vec![],
                    licenses: opts.licenses.clone(),
                    emulate_feature_level: opts.emulate_levels.iter().find(|(at, _)| *at == i).map(|(_, l)| *l),
                    security: security_config(r.id)?,
                    limits: opts.limits.clone(),
                    submit_filter: opts.submit_filter.clone(),
                    gpu_idle: opts.gpu_idle.clone(),
                    mail_program: opts.mail_program.clone(),
                    min_job_age_s: opts.min_job_age.as_secs(),
                    mpi_default: opts.mpi_default,
                    accounting: AccountingConfig {
                        purge_job_after_s: opts.purge_job_after.as_secs(),
                        ..Default::default()
                    },
                    // Each replica's HTTP port, on a port of the system's choosing.
                    http: HttpConfig { listen: Some("127.0.0.1:0".into()), metrics_allow: opts.metrics_allow.clone() },
                })
            })
            .map(|c| c.map(|c| with_site(c, opts.site.as_ref())))
            .collect::<anyhow::Result<_>>()?;
        let mut controllers = Vec::new();
        for (config, listener) in configs.iter().zip(listeners) {
            controllers.push(Some(Controller::start(config.clone(), listener).await?));
        }
        let slurm_commands = match &opts.quorum_program {
            Some(quorum) => Some(link_slurm_commands(quorum, &data_dir.join("slurm"))?),
            None => None,
        };
        // The jobs' TMPDIRs in a directory of this cluster's own: two clusters on one host (tests
        // side by side) number their jobs and nodes alike, and would share `/tmp/quorum-1.8.node01`.
        // Jobs of other users reach theirs through it (0711).
        let job_tmp = tempfile::Builder::new().prefix("quorum-dev-jobs-").tempdir()?;
        std::fs::set_permissions(job_tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711))?;
        let gpu_devices = match opts.gpu_files.is_empty() {
            true => Vec::new(),
            false => quorum_agent::devices::resolve(&opts.gpu_files, opts.gpus_per_agent as usize)
                .map_err(anyhow::Error::msg)?,
        };
        // Several nodes on one host: each job sees its own node's name (as root), and every
        // node's name resolves inside jobs (MASTER_ADDR, mpirun's and hydra's daemons).
        let node_hostname = opts.switch_user && is_root();
        let hosts_file = match node_hostname {
            true => Some(write_hosts_file(&data_dir, opts.agents)?),
            false => None,
        };
        let mut agent_configs: Vec<AgentConfig> = (0..opts.agents)
            .map(|i| AgentConfig {
                cpus: opts.cpus_per_agent,
                mem_mb: opts.mem_mb_per_agent,
                gpus: (0..opts.gpus_per_agent).map(|g| SimGpu { index: g, gpu_type: opts.gpu_type.clone() }).collect(),
                gpu_devices: gpu_devices.clone(),
                kill_wait: opts.kill_wait,
                switch_user: opts.switch_user,
                cgroups: opts.cgroups,
                health_check: opts.health_check.clone(),
                job_scripts: opts.job_scripts.clone(),
                slurm_commands: slurm_commands.clone(),
                node_hostname,
                hosts_file: hosts_file.clone(),
                tmp_base: job_tmp.path().to_path_buf(),
                features: opts.node_features.get(i).cloned().unwrap_or_default(),
                containers: opts.containers.clone(),
                ..AgentConfig::new(node_name(i), addrs.clone(), data_dir.join(format!("agent-{}", node_name(i))))
            })
            .collect();
        if let Some(s) = &security {
            for config in &mut agent_configs {
                s.secure_agent(config)?;
            }
        }
        let mut cluster = DevCluster {
            addrs,
            configs,
            controllers,
            agents: Vec::new(),
            agent_configs,
            agent_binary: opts.agent_binary.clone(),
            gpu_files: opts.gpu_files.clone(),
            data_dir,
            security,
            _tmp: tmp,
            _job_tmp: job_tmp,
        };
        for i in 0..opts.agents {
            let a = cluster.spawn_agent(i);
            cluster.agents.push(Some(a));
        }
        Ok(cluster)
    }

    /// Agent `i`'s configuration (its node's name and certificate included).
    pub fn agent_config(&self, i: usize) -> AgentConfig {
        self.agent_configs[i].clone()
    }

    fn spawn_agent(&self, i: usize) -> DevAgent {
        let config = &self.agent_configs[i];
        match &self.agent_binary {
            None => {
                let agent = Agent::new(config.clone());
                let (stop, rx) = watch::channel(false);
                let task = tokio::spawn(quorum_agent::serve(agent.clone(), rx));
                DevAgent::InProcess { agent, stop, task }
            }
            Some(binary) => {
                let mut command = tokio::process::Command::new(binary);
                command
                    .arg("--name")
                    .arg(&config.name)
                    .arg("--controllers")
                    .arg(config.controllers.join(","))
                    .arg("--cpus")
                    .arg(config.cpus.to_string())
                    .arg("--mem")
                    .arg(format!("{}M", config.mem_mb))
                    .arg("--spool")
                    .arg(&config.spool_dir)
                    .arg("--kill-wait")
                    .arg(config.kill_wait.as_secs().to_string())
                    .env("RUST_LOG", std::env::var("QUORUM_AGENT_LOG").unwrap_or_else(|_| "warn".into()))
                    .kill_on_drop(true);
                if let Some(g) = config.gpus.first() {
                    command.arg("--gpus").arg(format!("sim:{}x{}", g.gpu_type, config.gpus.len()));
                }
                if !self.gpu_files.is_empty() {
                    let files: Vec<String> = self.gpu_files.iter().map(|f| f.display().to_string()).collect();
                    command.arg("--gpu-files").arg(files.join(","));
                }
                if !config.switch_user {
                    command.arg("--no-switch-user");
                }
                if let Some(dir) = &config.slurm_commands {
                    command.arg("--slurm-commands").arg(dir);
                }
                if !config.cgroups {
                    command.arg("--no-cgroups");
                }
                command.arg("--tmp-base").arg(&config.tmp_base);
                if !config.features.is_empty() {
                    command.arg("--features").arg(config.features.join(","));
                }
                if config.node_hostname {
                    command.arg("--node-hostname");
                    if let Some(f) = &config.hosts_file {
                        command.arg("--hosts-file").arg(f);
                    }
                }
                let c = &config.containers;
                if !c.enabled {
                    command.arg("--no-containers");
                }
                for (flag, list) in [("--registries", &c.registries), ("--http-registries", &c.http_registries)] {
                    if !list.is_empty() {
                        command.arg(flag).arg(list.join(","));
                    }
                }
                for ca in &c.registry_ca {
                    command.arg("--registry-ca").arg(ca);
                }
                command.arg("--image-cache-size").arg(format!("{}M", c.cache_bytes >> 20));
                let scripts = &config.job_scripts;
                for (flag, program) in [("--prolog", &scripts.prolog), ("--epilog", &scripts.epilog)] {
                    if let Some(p) = program {
                        command.arg(flag).arg(p);
                    }
                }
                command.arg("--prolog-epilog-timeout").arg(scripts.timeout.as_secs().max(1).to_string());
                match &self.security {
                    Some(s) => command.arg("--certs").arg(s.certs_dir()),
                    None => command.arg("--insecure"),
                };
                // SAFETY: prctl is async-signal-safe; the agent dies with the thread that started it
                // (a test that panicked), not later by itself. Its jobs' supervisors, forked after
                // the exec, do not inherit this.
                unsafe {
                    command.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                command.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
                let child = command.spawn().unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
                DevAgent::Process { child, spool: config.spool_dir.clone() }
            }
        }
    }

    /// `host:port,host:port,...` for QUORUM_CONTROLLERS.
    pub fn controllers_env(&self) -> String {
        self.addrs.join(",")
    }

    /// How a client of this process's user reaches this cluster.
    pub fn client_security(&self) -> quorum_client::client::Security {
        match &self.security {
            Some(s) => s.client(),
            // Insecure: no munged of its own; the caller's name is taken at its word.
            None => crate::security::claimed().expect("this process's user"),
        }
    }

    /// A client of every replica.
    pub fn client(&self) -> anyhow::Result<Client> {
        Client::new(self.addrs.clone(), self.client_security())
    }

    /// What a `quorum` command needs in its environment to use this cluster.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("QUORUM_CONTROLLERS", self.controllers_env())];
        match &self.security {
            Some(s) => env.extend(s.env()),
            None => env.push(("QUORUM_INSECURE", "true".into())),
        }
        env
    }

    /// The `i`-th agent, when it runs in this process.
    pub fn agent(&self, i: usize) -> Option<Arc<Agent>> {
        match self.agents.get(i)? {
            Some(DevAgent::InProcess { agent, .. }) => Some(agent.clone()),
            _ => None,
        }
    }

    pub fn controller(&self, i: usize) -> Option<&Controller> {
        self.controllers[i].as_ref()
    }

    /// Each running replica's `/metrics` (https unless the cluster is insecure).
    pub fn metrics_urls(&self) -> Vec<String> {
        self.http_urls().into_iter().map(|u| format!("{u}/metrics")).collect()
    }

    /// The running replicas' HTTP ports (`https://127.0.0.1:PORT`): the REST API under
    /// `/api/v1`, the dashboard at `/`.
    pub fn http_urls(&self) -> Vec<String> {
        let scheme = if self.security.is_some() { "https" } else { "http" };
        let addrs = self.controllers.iter().flatten().filter_map(|c| c.http_addr);
        addrs.map(|a| format!("{scheme}://{a}")).collect()
    }

    /// Index of the replica that currently leads, if one does and is running here.
    pub fn leader(&self) -> Option<usize> {
        self.controllers.iter().position(|c| c.as_ref().is_some_and(|c| c.replica.is_leader()))
    }

    /// Stops replica `i` (its data directory stays).
    pub async fn stop_controller(&mut self, i: usize) {
        if let Some(c) = self.controllers[i].take() {
            c.shutdown().await;
        }
    }

    /// Replica `i`'s `[security]`, which its next start uses.
    pub fn security_config(&mut self, i: usize) -> &mut SecurityConfig {
        &mut self.configs[i].security
    }

    /// Stops agent `i` (its jobs go on; its spool stays) and starts it again with `config`.
    pub async fn restart_agent(&mut self, i: usize, config: AgentConfig) {
        if let Some(a) = self.agents[i].take() {
            a.stop(false).await;
        }
        self.agent_configs[i] = config;
        self.agents[i] = Some(self.spawn_agent(i));
    }

    /// Pauses agent `i`'s process (SIGSTOP) or lets it go on (SIGCONT), as memory pressure, a
    /// hung file system or a debugger would; only agents run as processes (`agent_binary`).
    pub fn pause_agent(&self, i: usize, on: bool) {
        let Some(DevAgent::Process { child, .. }) = &self.agents[i] else {
            panic!("agent {i} is not a process: set DevOptions::agent_binary to pause it")
        };
        if let Some(pid) = child.id() {
            // SAFETY: kill(2) on this process's own child; no memory is touched.
            unsafe { libc::kill(pid as i32, if on { libc::SIGSTOP } else { libc::SIGCONT }) };
        }
    }

    /// The process id of agent `i`, when it runs as a process (`agent_binary`).
    pub fn agent_pid(&self, i: usize) -> Option<u32> {
        match &self.agents[i] {
            Some(DevAgent::Process { child, .. }) => child.id(),
            _ => None,
        }
    }

    /// Makes replica `i`, from its next start, behave as the release of feature `level`
    /// (`None`: this release), as swapping its binary would.
    pub fn set_emulated_level(&mut self, i: usize, level: Option<u32>) {
        self.configs[i].emulate_feature_level = level;
    }

    /// Starts replica `i` again from its data directory on its old address.
    pub async fn restart_controller(&mut self, i: usize) -> anyhow::Result<()> {
        anyhow::ensure!(self.controllers[i].is_none(), "replica {} is running", i + 1);
        let listener = crate::ports::bind_again(&self.addrs[i], Duration::from_secs(5)).await?;
        self.controllers[i] = Some(Controller::start(self.configs[i].clone(), listener).await?);
        Ok(())
    }

    /// Cuts replica `i`'s Raft traffic both ways (or restores it), as a network partition would;
    /// it still serves clients and agents.
    pub fn isolate_controller(&self, i: usize, on: bool) {
        if let Some(c) = &self.controllers[i] {
            c.faults().isolate_raft(on);
        }
    }

    /// Cuts agent `i` off from every controller (or reconnects it), as a network partition
    /// would: its `--requeue` jobs go on until its lease runs out, the others go on.
    pub fn isolate_agent(&self, i: usize, on: bool) {
        match &self.agents[i] {
            Some(DevAgent::InProcess { agent, .. }) => agent.set_isolated(on),
            Some(DevAgent::Process { .. }) => panic!("agent {i} is a process: pause it instead"),
            None => {}
        }
    }

    /// Stops every agent and replica; running jobs are killed.
    pub async fn shutdown(mut self) {
        for a in self.agents.iter_mut().filter_map(Option::take) {
            a.stop(true).await;
        }
        for i in 0..self.controllers.len() {
            self.stop_controller(i).await;
        }
    }
}

/// Whether this process runs as root (which naming each job's host needs).
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and touches no memory.
    unsafe { libc::geteuid() == 0 }
}
