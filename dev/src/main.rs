//! `quorum-dev`: the commands that embed the controller and the agent — `quorum dev`, `quorum
//! simulate` and `quorum bench`. `quorum` runs this program for them (it looks beside itself,
//! then on PATH), so that every other `quorum` command starts without loading RocksDB.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use quorum_dev::cluster::{DevCluster, DevOptions};

#[derive(Parser)]
#[command(name = "quorum", version, about = "Quorum's embedded cluster, trace replay and load generators")]
struct Cli {
    #[command(flatten)]
    controllers: quorum_client::client::ControllersArg,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a workload trace (SWF) through the scheduler in virtual time and report waits,
    /// slowdown and utilization.
    Simulate(Box<quorum_dev::simulate::SimulateArgs>),
    /// Load generators against a real cluster (its own unless told otherwise): submit,
    /// dispatch, agents, memory, failover.
    Bench(quorum_dev::bench::BenchArgs),
    /// Write the man pages of `quorum dev`, `simulate` and `bench` into DIR/man1 (`quorum man`
    /// runs this for them).
    #[command(hide = true)]
    Man { dir: PathBuf },
    /// Run three controller replicas and agents in this process, on loopback.
    Dev {
        /// Keep data here instead of a temporary directory.
        #[arg(long)]
        data: Option<PathBuf>,
        /// A controller config file (TOML, as quorum-controller reads it): its partitions,
        /// scheduler and preemption, QOS, accounts, switches, licenses, limits, [gpu_idle],
        /// mpi_default, roles and the rest of its cluster-wide sections replace the dev
        /// cluster's; its replica's own fields (id, addresses, data_dir, certificates) are
        /// ignored. Partitions name the dev cluster's nodes: node01, node02, ...
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// First controller port; the replicas use it and the next two.
        #[arg(long, default_value_t = 7101)]
        port: u16,
        /// How many agents.
        #[arg(long, default_value_t = 2)]
        agents: usize,
        /// CPUs each agent offers.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
        cpus: u32,
        /// Give jobs no cgroups, only rlimits (by default the agents use the machine's cgroups
        /// where they can, and say why not where they cannot).
        #[arg(long)]
        no_cgroups: bool,
        /// Run each agent as a process of its own (the `quorum-agent` program beside this one), as
        /// on a cluster, instead of inside this process.
        #[arg(long)]
        agent_processes: bool,
        /// Seconds an ended job stays in the hot state (`quorum queue --all`) before it moves
        /// to the job history (`sacct`), like Slurm's MinJobAge; 0 keeps ended jobs there
        /// (default: --config's min_job_age_s, else 300).
        #[arg(long)]
        min_job_age: Option<u64>,
        /// Plaintext, and names taken from the host's munged at its default socket without TLS
        /// (`insecure = true`): to measure what TLS costs. Not for use.
        #[arg(long, hide = true)]
        insecure: bool,
        /// A CA certificate (PEM) the agents trust for container registries beside the
        /// system's (`quorum-agent --registry-ca`); repeat for more.
        #[arg(long)]
        registry_ca: Vec<PathBuf>,
        /// Container registries the agents reach in plain HTTP, `host:port` comma-separated
        /// (`quorum-agent --http-registries`): a test registry on loopback.
        #[arg(long, value_delimiter = ',')]
        http_registries: Vec<String>,
    },
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Dev {
            data,
            config,
            port,
            agents,
            cpus,
            no_cgroups,
            agent_processes,
            min_job_age,
            insecure,
            registry_ca,
            http_registries,
        } => {
            let agent_binary = if agent_processes {
                let binary = std::env::current_exe()?.with_file_name("quorum-agent");
                anyhow::ensure!(binary.is_file(), "--agent-processes: no quorum-agent program at {}", binary.display());
                Some(binary)
            } else {
                None
            };
            let mut site = match &config {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?;
                    Some(quorum_control::ControllerConfig::parse_site(&path.display().to_string(), &text)?)
                }
                None => None,
            };
            let min_job_age =
                std::time::Duration::from_secs(min_job_age.or(site.as_ref().map(|s| s.min_job_age_s)).unwrap_or(300));
            if let Some(s) = &mut site {
                s.min_job_age_s = min_job_age.as_secs();
            }
            let opts = DevOptions {
                site,
                insecure,
                containers: quorum_agent::container::ContainerConfig {
                    registry_ca,
                    http_registries,
                    ..Default::default()
                },
                min_job_age,
                data_dir: data,
                ports: vec![port, port + 1, port + 2],
                agents,
                cpus_per_agent: cpus,
                cgroups: !no_cgroups,
                agent_binary,
                // Jobs find `scontrol` and the other Slurm names, as on a node that has them installed.
                quorum_program: std::env::current_exe()
                    .ok()
                    .map(|p| p.with_file_name("quorum"))
                    .filter(|p| p.is_file()),
                ..DevOptions::default()
            };
            dev(opts).await
        }
        Command::Simulate(args) => {
            // Pure computation: off the async runtime's workers.
            tokio::task::spawn_blocking(move || quorum_dev::simulate::run(*args)).await??;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => {
            quorum_dev::bench::run(args, &cli.controllers).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { dir } => {
            use clap::CommandFactory;
            quorum_client::manual::write_subcommand_pages(Cli::command(), &dir, OF_QUORUM_DEV)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The `quorum` subcommands this program serves.
const OF_QUORUM_DEV: &[&str] = &["dev", "simulate", "bench"];

async fn dev(opts: DevOptions) -> anyhow::Result<ExitCode> {
    let (agents, cpus) = (opts.agents, opts.cpus_per_agent);
    let partitions: Option<Vec<String>> =
        opts.site.as_ref().map(|s| s.partitions.iter().map(|p| p.name.clone()).collect());
    let cluster = DevCluster::start(opts).await?;
    println!(
        "Quorum dev cluster: 3 controller replicas, {agents} agents ({cpus} CPUs, 32G, 4 simulated h100 GPUs each)"
    );
    println!("data: {}", cluster.data_dir.display());
    if let Some(p) = partitions.filter(|p| !p.is_empty()) {
        println!("partitions (from --config): {}", p.join(", "));
    }
    println!();
    println!("In another terminal (any user of this machine; each is who the kernel says):");
    let env: Vec<String> = cluster.env().into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("  export {}", env.join(" "));
    println!("  quorum submit -- hostname");
    println!("  quorum submit --gpus h100:2 -t 10 -- bash -c 'echo $CUDA_VISIBLE_DEVICES; sleep 30'");
    println!("  quorum queue");
    println!("  quorum nodes");
    println!("  quorum cluster");
    println!();
    println!("Metrics (an operator's token: `quorum token`, as root):");
    for url in cluster.metrics_urls() {
        let ca = cluster.security.as_ref().map(|s| format!(" --cacert {}", s.ca().display())).unwrap_or_default();
        println!("  curl{ca} -H \"Authorization: Bearer $TOKEN\" {url}");
    }
    println!();
    println!("The dashboard and the REST API (/api/v1; sign in with a token):");
    for url in cluster.http_urls() {
        println!("  {url}/");
    }
    println!();
    println!("Ctrl-C stops the cluster.");
    tokio::signal::ctrl_c().await?;
    println!("stopping...");
    cluster.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Dev { .. } => "info,openraft=error",
        _ => "warn,openraft=off",
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build();
    // Spans go to the OTLP endpoint OpenTelemetry's variable names, when it is set (the
    // exporter's gRPC client is made in the runtime).
    let endpoint = std::env::var(quorum_proto::telemetry::OTLP_ENDPOINT_ENV).ok();
    let logging = quorum_proto::telemetry::Logging {
        service: "quorum-dev",
        format: "text",
        default_filter,
        stderr: true,
        otlp_endpoint: endpoint.as_deref(),
    };
    let telemetry = match &runtime {
        Ok(rt) => {
            let _in_runtime = rt.enter();
            quorum_proto::telemetry::init(logging)
        }
        Err(_) => quorum_proto::telemetry::init(quorum_proto::telemetry::Logging { otlp_endpoint: None, ..logging }),
    };
    if let Err(e) = &telemetry {
        eprintln!("quorum-dev: {e}");
    }
    quorum_client::exit_code(runtime, async move {
        let code = run(cli).await;
        // The last spans are exported while the runtime still runs.
        let _ = tokio::task::spawn_blocking(move || drop(telemetry)).await;
        code
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_subcommand_and_option_is_documented() {
        let missing = quorum_client::manual::undocumented(&Cli::command());
        assert!(missing.is_empty(), "without a description, so missing from the man pages:\n{}", missing.join("\n"));
    }

    /// Every `quorum dev|simulate|bench` command the README, the manual and the runbook show
    /// parses (`quorum`'s own test checks the other commands).
    #[test]
    fn every_command_shown_in_the_docs_parses() {
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        let files = quorum_client::manual::manual_files(root);
        let mut checked = 0;
        let mut wrong = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let file = file.display();
            for (line, words) in quorum_client::manual::shell_commands(&text, &["quorum"]) {
                if !words.get(1).is_some_and(|w| OF_QUORUM_DEV.contains(&w.as_str())) {
                    continue;
                }
                checked += 1;
                if let Err(e) = Cli::try_parse_from(&words) {
                    if e.kind() != clap::error::ErrorKind::DisplayHelp {
                        let first = e.to_string().lines().next().unwrap_or_default().to_string();
                        wrong.push(format!("{file}:{line}: `{}`: {first}", words.join(" ")));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "commands in the docs that do not parse:\n{}", wrong.join("\n"));
        assert!(checked >= 5, "only {checked} quorum dev/simulate/bench commands found");
    }

    #[test]
    fn pages_are_written_for_dev_simulate_and_bench_only() {
        let dir = tempfile::tempdir().unwrap();
        let written = quorum_client::manual::write_subcommand_pages(Cli::command(), dir.path(), OF_QUORUM_DEV).unwrap();
        let names: Vec<String> =
            written.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        for name in ["quorum-dev.1", "quorum-simulate.1", "quorum-bench.1", "quorum-bench-submit.1"] {
            assert!(names.contains(&name.to_string()), "{name} not among {names:?}");
        }
        assert!(!names.contains(&"quorum.1".to_string()), "quorum's own page is quorum's to write");
    }
}
