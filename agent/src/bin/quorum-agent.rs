//! `quorum-agent`: the node agent.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use quorum_agent::{parse_gpu_source, resources, AgentConfig, HealthCheck};

#[derive(Parser)]
#[command(version, about = "The Quorum node agent")]
struct Args {
    /// `text` for people, `json` (one object a line, with every field) for log collectors.
    #[arg(long, env = "QUORUM_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// Export spans to this OTLP (gRPC) endpoint, e.g. `http://collector:4317`.
    #[arg(long, env = quorum_proto::telemetry::OTLP_ENDPOINT_ENV)]
    otlp_endpoint: Option<String>,
    /// Serve this agent's `/metrics` (OpenMetrics, plain HTTP) on this address, e.g. `0.0.0.0:7190`.
    #[arg(long, env = "QUORUM_AGENT_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// Address ranges that may read `/metrics`, comma-separated (default: this host's loopback).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.0/8,::1")]
    metrics_allow: Vec<String>,
    /// Show each running job's CPU time, memory and processes (by job id) in `/metrics`, not
    /// only the node's totals. Whoever may read `/metrics` sees them: allow only the monitoring
    /// system's addresses (loopback is every local user).
    #[arg(long)]
    metrics_jobs: bool,
    /// This node's name as the partitions name it (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// Controller addresses, comma-separated; any replica will do.
    #[arg(long, env = "QUORUM_CONTROLLERS", value_delimiter = ',', required = true)]
    controllers: Vec<String>,
    /// CPUs to offer (default: all the OS gives this process).
    #[arg(long)]
    cpus: Option<u32>,
    /// Memory to offer, like 64G (default: all of MemTotal).
    #[arg(long)]
    mem: Option<String>,
    /// GPU source: `nvml` (the node's GPUs and their health, through the driver's NVML),
    /// `sim:TYPExCOUNT` such as `sim:h100x8` (simulated; faults injected with
    /// `quorum admin gpu-fault`), or `none`.
    #[arg(long, default_value = "none")]
    gpus: String,
    /// The GPUs' device files by index, in hostlist syntax (`/dev/nvidia[0-3]`), like the
    /// `File=` of Slurm's gres.conf: each job's cgroup refuses it the files of GPUs not its own
    /// (Slurm's ConstrainDevices). With `--gpus nvml` the driver's minor numbers give them.
    #[arg(long)]
    gpu_files: Option<String>,
    /// A health check program run with `sh -c` every --health-check-interval seconds, like
    /// Slurm's HealthCheckProgram: a non-zero exit drains the node with its output as the
    /// reason, until it passes again.
    #[arg(long)]
    health_check: Option<String>,
    #[arg(long, default_value_t = 60)]
    health_check_interval: u64,
    /// A program run with `sh -c` as the agent's user before each job starts on this node,
    /// like Slurm's Prolog, with SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_UID and the others in
    /// its environment: when it fails the job goes back to the queue and the node is drained.
    #[arg(long)]
    prolog: Option<String>,
    /// A program run likewise after each job ends on this node, like Slurm's Epilog (with
    /// SLURM_JOB_EXIT_CODE too): when it fails the node is drained.
    #[arg(long)]
    epilog: Option<String>,
    /// Seconds the prolog or epilog may run before it is killed and counts as failed.
    #[arg(long, default_value_t = 120)]
    prolog_epilog_timeout: u64,
    /// Node features, comma-separated.
    #[arg(long, value_delimiter = ',')]
    features: Vec<String>,
    /// Where job scripts are kept.
    #[arg(long, default_value = "/var/spool/quorum")]
    spool: PathBuf,
    /// Seconds between SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 30)]
    kill_wait: u64,
    /// Run every job as this agent's user instead of its submitter (an agent that is not root
    /// always does).
    #[arg(long)]
    no_switch_user: bool,
    /// Do not give jobs cgroups even where the node has them (rlimits only).
    #[arg(long)]
    no_cgroups: bool,
    /// The cluster's certificates (`quorum admin certs`): `ca.pem`, this node's
    /// `agent-<name>.pem` and `.key`, and `launch.pub`.
    #[arg(long, env = "QUORUM_CERTS", default_value = "/etc/quorum/certs")]
    certs: PathBuf,
    /// Plaintext to the controllers, and launches run unsigned: only against controllers with
    /// `insecure = true`, on a private test network.
    #[arg(long)]
    insecure: bool,
    /// How far the controllers' clocks may be from this node's, in seconds.
    #[arg(long, default_value_t = 30)]
    clock_skew: u64,
    /// Where `quorum install-slurm-commands` linked scontrol and the other Slurm names on this
    /// node: put first on every job's PATH when the directory exists.
    #[arg(long, default_value = "/usr/local/lib/quorum/slurm")]
    slurm_commands: PathBuf,
    /// Where each job gets its private temporary directory (its TMPDIR, its user's alone),
    /// removed when the job ends.
    #[arg(long, default_value = "/tmp")]
    tmp_base: PathBuf,
    /// Jobs see the node's name (--name) as their host name, each in a UTS namespace of its
    /// own: for several agents on one host (needs root).
    #[arg(long)]
    node_hostname: bool,
    /// With --node-hostname: the file jobs see as /etc/hosts, each in a mount namespace of its
    /// own (node names where no name service knows them, as `quorum dev` writes it).
    #[arg(long, requires = "node_hostname")]
    hosts_file: Option<PathBuf>,
    /// Refuse jobs and steps in containers (`--container-image`) on this node.
    #[arg(long)]
    no_containers: bool,
    /// Where container images are cached, each layer once for every image and user (default:
    /// `images/` in the spool). Root's alone.
    #[arg(long)]
    image_cache: Option<PathBuf>,
    /// The image cache's size bound, like 50G: past it the least recently used images that no
    /// container uses are removed.
    #[arg(long, default_value = "50G")]
    image_cache_size: String,
    /// The registries images may come from (`host[:port]`, comma-separated); any when not given.
    #[arg(long, value_delimiter = ',')]
    registries: Vec<String>,
    /// The registry of an image named without `REGISTRY#` (Docker Hub's, as enroot's default).
    #[arg(long, default_value = "registry-1.docker.io")]
    default_registry: String,
    /// A CA certificate (PEM) trusted for registries beside the system's; repeat for more.
    #[arg(long)]
    registry_ca: Vec<PathBuf>,
    /// Registries reached over plain HTTP (`host:port`, comma-separated): only on a private network.
    #[arg(long, value_delimiter = ',')]
    http_registries: Vec<String>,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

fn main() -> anyhow::Result<()> {
    // `--pmix-server`: this binary as one step's PMIx server on this node, started by the agent
    // as the job's user (see `quorum_agent::pmix`); not for people.
    if std::env::args_os().nth(1).is_some_and(|a| a == quorum_agent::pmix::HELPER_FLAG) {
        quorum_agent::pmix::helper_main();
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(agent_main())
}

async fn agent_main() -> anyhow::Result<()> {
    // The spool holds every job's launch (script, environment): what the agent creates is its own
    // alone. Each job gets its submitter's umask instead (SLURM_UMASK).
    quorum_auth::private::restrict_umask();
    let args = Args::parse();
    let _telemetry = quorum_proto::telemetry::init(quorum_proto::telemetry::Logging {
        service: "quorum-agent",
        format: &args.log_format,
        default_filter: "info",
        stderr: false,
        otlp_endpoint: args.otlp_endpoint.as_deref(),
    })
    .map_err(|e| anyhow::anyhow!(e))?;
    if let Some(f) = args.hosts_file.as_ref().filter(|f| !f.is_file()) {
        anyhow::bail!("--hosts-file {}: not a file", f.display());
    }
    let mem_mb = match &args.mem {
        Some(m) => parse_mem(m)?,
        None => resources::detect_mem_mb(),
    };
    let mut config = AgentConfig {
        cpus: args.cpus.unwrap_or_else(resources::detect_cpus),
        mem_mb,
        features: args.features,
        kill_wait: Duration::from_secs(args.kill_wait),
        switch_user: !args.no_switch_user,
        cgroups: !args.no_cgroups,
        health_check: args
            .health_check
            .map(|command| HealthCheck { command, interval: Duration::from_secs(args.health_check_interval.max(1)) }),
        job_scripts: quorum_agent::site::JobScripts {
            prolog: args.prolog,
            epilog: args.epilog,
            timeout: Duration::from_secs(args.prolog_epilog_timeout.max(1)),
        },
        clock_skew: Duration::from_secs(args.clock_skew),
        slurm_commands: args.slurm_commands.is_dir().then_some(args.slurm_commands),
        tmp_base: args.tmp_base,
        node_hostname: args.node_hostname,
        hosts_file: args.hosts_file.clone(),
        containers: quorum_agent::container::ContainerConfig {
            enabled: !args.no_containers,
            cache_dir: args.image_cache,
            cache_bytes: parse_mem(&args.image_cache_size)
                .map_err(|e| anyhow::anyhow!("--image-cache-size: {e}"))?
                .saturating_mul(1 << 20),
            registries: args.registries,
            default_registry: args.default_registry,
            registry_ca: args.registry_ca,
            http_registries: args.http_registries,
        },
        ..AgentConfig::new(args.name.unwrap_or_else(hostname), args.controllers, args.spool)
    };
    if args.insecure {
        tracing::warn!("--insecure: plaintext to the controllers, and launches are not verified");
    } else {
        config.secure_with(&args.certs).map_err(|e| {
            anyhow::anyhow!("{e} (make them with `quorum admin certs`, or run with --insecure on a test network)")
        })?;
    }
    let mut gpu_files = match &args.gpu_files {
        Some(expr) => Some(quorum_agent::devices::expand_files(expr).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let source: Box<dyn quorum_agent::gpu::GpuSource> = if args.gpus.trim() == "nvml" {
        let (source, gpus, files) = quorum_agent::gpu::nvml::NvmlSource::open().map_err(anyhow::Error::msg)?;
        config.gpus = gpus;
        gpu_files = gpu_files.or(files);
        Box::new(source)
    } else {
        config.gpus = parse_gpu_source(&args.gpus).map_err(anyhow::Error::msg)?;
        Box::new(quorum_agent::gpu::SimSource::new(config.gpus.len()))
    };
    if let Some(files) = &gpu_files {
        config.gpu_devices = quorum_agent::devices::resolve(files, config.gpus.len()).map_err(anyhow::Error::msg)?;
    } else if !config.gpus.is_empty() {
        tracing::warn!(
            "the GPUs' device files are not known (--gpu-files): jobs are told their GPUs but not kept from the others"
        );
    }
    tracing::info!(node = %config.name, cpus = config.cpus, mem_mb = config.mem_mb, gpus = config.gpus.len(), "agent starting");
    let metrics = match &args.metrics_listen {
        Some(addr) => {
            let allow = args
                .metrics_allow
                .iter()
                .map(|c| quorum_model::Cidr::parse(c).map_err(|e| anyhow::anyhow!("--metrics-allow '{c}': {e}")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("--metrics-listen {addr}: {e}"))?;
            tracing::info!(addr = %listener.local_addr()?, per_job = args.metrics_jobs, "serving /metrics");
            Some((listener, quorum_agent::metrics::Exposure { allow, per_job: args.metrics_jobs }))
        }
        None => None,
    };
    quorum_agent::run_with_metrics(config, source, metrics, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
    Ok(())
}

fn parse_mem(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| anyhow::anyhow!("invalid memory size '{s}'"))?;
    Ok(match unit.to_ascii_uppercase().trim_end_matches('B') {
        "" | "M" => n,
        "G" => n * 1024,
        "T" => n * 1024 * 1024,
        _ => anyhow::bail!("invalid memory size '{s}': unknown unit"),
    })
}
