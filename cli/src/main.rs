//! `quorum`: the command-line client of a Quorum cluster.
//!
//! It links the API client only (`quorum-client`), not the controller, the agent or RocksDB,
//! because people and scripts run it thousands of times (`for i in ...; do quorum submit ...`)
//! and each run pays for what the binary loads. `quorum dev`, `quorum simulate` and `quorum
//! bench`, which embed the controller, are served by `quorum-dev`, which this process becomes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use quorum_client::client::{Client, JobRef};
use quorum_client::display;
use quorum_client::submit::{build_spec, Payload, SubmitOpts};
use quorum_proto::api;

#[derive(Parser)]
#[command(name = "quorum", version, about = "Quorum: a batch scheduler with a replicated control plane")]
struct Cli {
    #[command(flatten)]
    controllers: quorum_client::client::ControllersArg,
    /// Answer reads (queue, show, nodes) from the first replica that answers, at once, without
    /// confirming with the leader that nothing newer was committed; the index answered at is
    /// printed on standard error. For when there is no leader, or to spare it.
    #[arg(long, global = true)]
    stale: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Submit a batch script or a command: `quorum submit job.sh` or `quorum submit -- CMD ARGS`.
    Submit {
        #[command(flatten)]
        opts: Box<SubmitOpts>,
        /// A batch script; its #SBATCH lines are read for options.
        script: Option<String>,
        /// The command to run, after `--`.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// The job queue, like squeue.
    Queue {
        /// Include finished jobs.
        #[arg(long, short)]
        all: bool,
        /// Pending jobs with their expected start times, like squeue --start.
        #[arg(long)]
        start: bool,
        /// Only this user's jobs.
        #[arg(long, short)]
        user: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// One job in detail, like scontrol show job.
    Show {
        /// A job id, or ARRAY_TASK such as 12_3.
        job: JobRef,
        #[arg(long)]
        json: bool,
    },
    /// Cancel jobs.
    Cancel {
        /// Job ids; an array's id cancels the whole array, ARRAY_TASK (12_3) one task.
        #[arg(required = true)]
        jobs: Vec<JobRef>,
        /// Only send this signal (USR1, SIGUSR1, 10) to the running jobs' processes on every
        /// node, like scancel --signal; the jobs are not cancelled.
        #[arg(long, short = 's')]
        signal: Option<String>,
    },
    /// Print a job's output, read on its node (the first by default); -f follows a running
    /// job until it ends, like kubectl logs -f.
    Logs {
        /// A job id, or ARRAY_TASK such as 12_3.
        job: JobRef,
        #[arg(long, short = 'f')]
        follow: bool,
        /// Read the file on this node of the job's allocation.
        #[arg(long)]
        node: Option<String>,
        /// The error file (--error) instead of the output.
        #[arg(long)]
        err: bool,
    },
    /// Hold pending jobs so that they do not start.
    Hold {
        #[arg(required = true)]
        jobs: Vec<u64>,
    },
    /// Release held jobs.
    Release {
        #[arg(required = true)]
        jobs: Vec<u64>,
    },
    /// Each pending job's priority and its factors, like sprio.
    Prio {
        #[arg(long)]
        json: bool,
    },
    /// The account tree with shares, usage and fairshare factors, like sshare.
    Share {
        #[arg(long)]
        json: bool,
    },
    /// Operator commands (as root).
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// The nodes, like sinfo.
    Nodes {
        #[arg(long)]
        json: bool,
    },
    /// Each controller replica's Raft status.
    Cluster {
        #[arg(long)]
        json: bool,
    },
    /// Replay a workload trace (SWF) through the scheduler in virtual time and report waits,
    /// slowdown and utilization (run by quorum-dev; `quorum simulate --help`).
    #[command(disable_help_flag = true)]
    Simulate {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Load generators against a real cluster (its own unless told otherwise): submit,
    /// dispatch, agents, memory, failover (run by quorum-dev; `quorum bench --help`).
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run three controller replicas and two agents in one process, on loopback (run by
    /// quorum-dev; `quorum dev --help`).
    #[command(disable_help_flag = true)]
    Dev {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Add or change an account, like sacctmgr add/modify account.
    Account {
        name: String,
        #[arg(long)]
        parent: Option<String>,
        #[arg(long, default_value_t = 1)]
        shares: u32,
        /// Users who may charge it, comma-separated.
        #[arg(long, value_delimiter = ',')]
        users: Vec<String>,
        #[arg(long)]
        max_jobs: Option<u32>,
        #[arg(long)]
        grp_gpus: Option<u32>,
        #[arg(long)]
        grp_cpus: Option<u32>,
        #[arg(long)]
        max_wall: Option<String>,
        /// Memory of all its running jobs, like 512G.
        #[arg(long)]
        grp_mem: Option<String>,
        #[arg(long)]
        grp_nodes: Option<u32>,
        /// GPUs of a type for all its running jobs: TYPE=N, repeatable.
        #[arg(long = "grp-gpus-type")]
        grp_gpus_type: Vec<String>,
    },
    /// Add a controller replica: it joins as a learner, catches up (by snapshot if it lags far),
    /// then becomes a voter. Start it first with `join = true` in its config.
    AddReplica {
        id: u64,
        /// host:port the other replicas and agents reach it at.
        addr: String,
    },
    /// Drain nodes: no new job lands there, running ones go on (like scontrol update
    /// state=drain). Comma-separated names.
    Drain {
        #[arg(value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// Why; shown in `quorum nodes`.
        #[arg(long)]
        reason: String,
    },
    /// Return drained nodes to service.
    Resume {
        #[arg(value_delimiter = ',', required = true)]
        nodes: Vec<String>,
    },
    /// Inject a fault into a simulated GPU (an agent with --gpus sim:...), to drill what a
    /// failing GPU does: xid:N, ecc-uncorrectable[:N], ecc-correctable:N, temperature:C,
    /// retired-pages:N, pcie-replay:N, remapped-rows:N, remap-pending, remap-failed, or clear
    /// (the GPU is healthy again).
    GpuFault { node: String, gpu: u32, kind: String },
    /// Hand leadership to replica ID (default: the most caught-up other voter).
    TransferLeader { id: Option<u64> },
    /// Remove a controller replica from the cluster (stop its process afterwards).
    RemoveReplica { id: u64 },
    /// What each replica runs and the cluster's feature level (the lowest among the voters):
    /// commands newer than it are refused until every replica is upgraded.
    Versions {
        #[arg(long)]
        json: bool,
    },
    /// Wait until replica ID answers from a process started after --started-after (epoch ms)
    /// and has applied everything the leader had committed by then; for upgrade scripts.
    WaitReplica {
        id: u64,
        #[arg(long, default_value_t = 0)]
        started_after: u64,
        /// Give up after this many seconds (exit 1).
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Wait until NODE's agent is connected from a process started after --started-after
    /// (epoch ms); for upgrade scripts.
    WaitNode {
        node: String,
        #[arg(long, default_value_t = 0)]
        started_after: u64,
        /// Give up after this many seconds (exit 1).
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Each replica's state digest at one log index (a digest point committed through Raft);
    /// exits 1 if any two differ.
    Digest {
        #[arg(long)]
        json: bool,
    },
    /// Add or change a QOS.
    Qos {
        name: String,
        #[arg(long, default_value_t = 0)]
        priority: u32,
        #[arg(long)]
        max_wall: Option<String>,
        #[arg(long)]
        max_gpus_per_user: Option<u32>,
        #[arg(long)]
        max_jobs_per_user: Option<u32>,
    },
}

fn parse_wall(v: &Option<String>) -> anyhow::Result<Option<u64>> {
    Ok(match v {
        Some(t) => quorum_model::parse::parse_time_limit(t).map_err(anyhow::Error::msg)?,
        None => None,
    })
}

fn current_user() -> String {
    if let Ok(u) = std::env::var("USER") {
        if !u.is_empty() {
            return u;
        }
    }
    // SAFETY: getpwuid returns a pointer into static storage or null; read at once.
    unsafe {
        let pw = libc::getpwuid(libc::getuid());
        if !pw.is_null() && !(*pw).pw_name.is_null() {
            return std::ffi::CStr::from_ptr((*pw).pw_name).to_string_lossy().into_owned();
        }
        format!("uid{}", libc::getuid())
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn status_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", status.message())
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let command = cli.command;
    let stale = cli.stale;
    let mut client = Client::new(cli.controllers.controllers)?;
    if matches!(command, Command::Admin { command: AdminCommand::AddReplica { .. } }) {
        // The leader answers once the new replica has caught up, which may take minutes.
        client.call_timeout = std::time::Duration::from_secs(660);
        client.deadline = std::time::Duration::from_secs(700);
    }
    match command {
        Command::Submit { opts, script, command } => {
            let payload = match (script, command.is_empty()) {
                (Some(_), false) => anyhow::bail!("give a script or -- COMMAND, not both"),
                (Some(path), true) => {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| anyhow::anyhow!("cannot read script '{path}': {e}"))?;
                    Payload::Script { path, text }
                }
                (None, false) => Payload::Command(command),
                (None, true) => anyhow::bail!("nothing to run: give a script or -- COMMAND [ARGS...]"),
            };
            let cwd = std::env::current_dir()?;
            let env: Vec<(String, String)> = std::env::vars().collect();
            let spec = build_spec(*opts, payload, &cwd, env).map_err(anyhow::Error::msg)?;
            let req = api::SubmitJobRequest {
                spec: Some(spec),
                user: current_user(),
                request_id: uuid::Uuid::new_v4().to_string(),
            };
            let r = client
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.submit_job(req).await }
                })
                .await
                .map_err(status_error)?;
            println!("Submitted job {}", r.job_id);
        }
        Command::Queue { all, start, user, json } => {
            let req = api::ListJobsRequest {
                states: if start {
                    vec!["PENDING".into()]
                } else if all {
                    vec![]
                } else {
                    vec!["PENDING".into(), "RUNNING".into()]
                },
                user: user.unwrap_or_default(),
                stale,
            };
            let r = client
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.list_jobs(req).await }
                })
                .await
                .map_err(status_error)?;
            note_stale(stale, r.applied_index);
            if json {
                print_json(&r.jobs.iter().map(display::job_json).collect::<Vec<_>>())?;
            } else if start {
                print!("{}", display::start_table(&r.jobs));
            } else {
                print!("{}", display::queue_table(&r.jobs, r.now_ms));
            }
        }
        Command::Show { job, json } => {
            let r = client
                .call(|mut c| async move {
                    c.get_job(api::GetJobRequest { job_id: job.id, stale, array_task_id: job.task }).await
                })
                .await
                .map_err(status_error)?;
            note_stale(stale, r.applied_index);
            let info = r.job.ok_or_else(|| anyhow::anyhow!("empty answer"))?;
            if json {
                print_json(&display::job_json(&info))?;
            } else {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
                print!("{}", display::show_job(&info, now));
            }
        }
        Command::Cancel { jobs, signal } => {
            let signalling = signal.is_some();
            let (mut job_ids, mut task_job_ids) = (Vec::new(), Vec::new());
            for j in jobs {
                match j.task {
                    None => job_ids.push(j.id),
                    Some(_) => task_job_ids.push(j.resolve(&client).await.map_err(status_error)?),
                }
            }
            let req = api::CancelJobRequest {
                job_ids,
                user: current_user(),
                signal: signal.unwrap_or_default(),
                task_job_ids,
            };
            let r = client
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.cancel_job(req).await }
                })
                .await
                .map_err(status_error)?;
            let mut failed = false;
            for res in r.results {
                if !res.ok {
                    eprintln!("quorum: error: {}", res.error);
                    failed = true;
                } else if signalling {
                    println!("signalled job {}", res.job_id);
                }
            }
            if failed {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Logs { job, follow, node, err } => {
            let job_id = job.resolve(&client).await.map_err(status_error)?;
            let opts = quorum_client::logs::LogsOptions { job_id, user: current_user(), follow, node, stderr: err };
            quorum_client::logs::logs(&client, &opts, &mut std::io::stdout(), &mut std::io::stderr())
                .await
                .map_err(status_error)?;
        }
        command @ (Command::Hold { .. } | Command::Release { .. }) => {
            let (jobs, release) = match command {
                Command::Release { jobs } => (jobs, true),
                Command::Hold { jobs } => (jobs, false),
                _ => unreachable!("matched above"),
            };
            let req = api::HoldJobRequest { job_ids: jobs, user: current_user(), release };
            let r = client
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.hold_job(req).await }
                })
                .await
                .map_err(status_error)?;
            let failed: Vec<_> = r.results.iter().filter(|r| !r.ok).collect();
            for f in &failed {
                eprintln!("quorum: error: {}", f.error);
            }
            if !failed.is_empty() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Prio { json } => {
            let r = client
                .call(|mut c| async move { c.priorities(api::PriorityRequest {}).await })
                .await
                .map_err(status_error)?;
            if json {
                print_json(&display::prio_json(&r))?;
            } else {
                print!("{}", display::prio_table(&r));
            }
        }
        Command::Share { json } => {
            let r = client
                .call(|mut c| async move { c.shares(api::SharesRequest {}).await })
                .await
                .map_err(status_error)?;
            if json {
                print_json(&display::share_json(&r))?;
            } else {
                print!("{}", display::share_table(&r));
            }
        }
        Command::Admin { command } => match command {
            AdminCommand::Account {
                name,
                parent,
                shares,
                users,
                max_jobs,
                grp_gpus,
                grp_cpus,
                max_wall,
                grp_mem,
                grp_nodes,
                grp_gpus_type,
            } => {
                let mut by_type = std::collections::HashMap::new();
                for t in &grp_gpus_type {
                    let (ty, n) = t
                        .split_once('=')
                        .and_then(|(ty, n)| n.parse::<u32>().ok().map(|n| (ty.to_string(), n)))
                        .ok_or_else(|| {
                            anyhow::anyhow!("invalid --grp-gpus-type '{t}': expected TYPE=N such as h100=16")
                        })?;
                    by_type.insert(ty, n);
                }
                let grp_mem_mb = match &grp_mem {
                    Some(m) => Some(quorum_model::parse::parse_mem_mb(m).map_err(anyhow::Error::msg)?),
                    None => None,
                };
                let req = api::UpsertAccountRequest {
                    account: Some(api::AccountSpec {
                        name,
                        parent: parent.unwrap_or_default(),
                        shares,
                        users,
                        max_jobs,
                        grp_gpus,
                        grp_cpus,
                        max_wall_s: parse_wall(&max_wall)?,
                        grp_mem_mb,
                        grp_nodes,
                        grp_gpus_by_type: by_type,
                    }),
                    user: current_user(),
                };
                client
                    .call(|mut c| {
                        let req = req.clone();
                        async move { c.upsert_account(req).await }
                    })
                    .await
                    .map_err(status_error)?;
            }
            AdminCommand::Qos { name, priority, max_wall, max_gpus_per_user, max_jobs_per_user } => {
                let req = api::UpsertQosRequest {
                    qos: Some(api::QosSpec {
                        name,
                        priority,
                        max_wall_s: parse_wall(&max_wall)?,
                        max_gpus_per_user,
                        max_jobs_per_user,
                    }),
                    user: current_user(),
                };
                client
                    .call(|mut c| {
                        let req = req.clone();
                        async move { c.upsert_qos(req).await }
                    })
                    .await
                    .map_err(status_error)?;
            }
            AdminCommand::AddReplica { id, addr } => {
                let req = api::MembershipChangeRequest { user: current_user(), id, addr };
                let r = client
                    .call(|mut c| {
                        let req = req.clone();
                        async move { c.add_replica(req).await }
                    })
                    .await
                    .map_err(status_error)?;
                println!("replica {id} added; voters: {}", voters_line(&r.members));
            }
            AdminCommand::TransferLeader { id } => {
                let req = api::TransferLeaderRequest { user: current_user(), to: id.unwrap_or(0) };
                let r = client
                    .call(|mut c| {
                        let req = req.clone();
                        async move { c.transfer_leader(req).await }
                    })
                    .await
                    .map_err(status_error)?;
                println!("replica {} leads", r.leader);
            }
            AdminCommand::RemoveReplica { id } => {
                let req = api::MembershipChangeRequest { user: current_user(), id, addr: String::new() };
                let r = client
                    .call(|mut c| {
                        let req = req.clone();
                        async move { c.remove_replica(req).await }
                    })
                    .await
                    .map_err(status_error)?;
                println!("replica {id} removed; voters: {}", voters_line(&r.members));
            }
            AdminCommand::Drain { nodes, reason } => set_drained(&client, nodes, Some(reason)).await?,
            AdminCommand::Resume { nodes } => set_drained(&client, nodes, None).await?,
            AdminCommand::GpuFault { node, gpu, kind } => {
                quorum_model::gpu_fault::parse_fault(&kind).map_err(anyhow::Error::msg)?;
                let req = api::GpuFaultRequest { user: current_user(), node: node.clone(), gpu, kind: kind.clone() };
                client
                    .call(|mut c| {
                        let req = req.clone();
                        async move { c.inject_gpu_fault(req).await }
                    })
                    .await
                    .map_err(status_error)?;
                println!("injected {kind} into GPU {gpu} of {node}; its next heartbeat reports it");
            }
            AdminCommand::WaitReplica { id, started_after, timeout } => {
                return wait_replica(&client, id, started_after, std::time::Duration::from_secs(timeout)).await;
            }
            AdminCommand::WaitNode { node, started_after, timeout } => {
                return wait_node(&client, &node, started_after, std::time::Duration::from_secs(timeout)).await;
            }
            AdminCommand::Versions { json } => {
                let replicas = replica_statuses(&client).await?;
                if json {
                    print_json(&serde_json::json!({
                        "replicas": replicas,
                        "cluster_level": display::cluster_level(&replicas),
                    }))?;
                } else {
                    print!("{}", display::versions_table(&replicas));
                }
            }
            AdminCommand::Digest { json } => {
                let report = quorum_client::digest::collect(&client).await.map_err(status_error)?;
                if json {
                    let agree = report.agree();
                    print_json(
                        &serde_json::json!({ "index": report.index, "replicas": report.replicas, "agree": agree }),
                    )?;
                } else {
                    print!("{}", report.table());
                }
                if !report.agree() {
                    return Ok(ExitCode::from(1));
                }
            }
        },
        Command::Nodes { json } => {
            let r = client
                .call(|mut c| async move { c.list_nodes(api::ListNodesRequest { stale }).await })
                .await
                .map_err(status_error)?;
            note_stale(stale, r.applied_index);
            if json {
                print_json(&r.nodes.iter().map(node_json).collect::<Vec<_>>())?;
            } else {
                print!("{}", display::nodes_table(&r.nodes));
                eprint!("{}", display::nodes_notes(&r.nodes));
            }
        }
        Command::Cluster { json } => {
            let replicas = replica_statuses(&client).await?;
            if json {
                print_json(&replicas)?;
            } else {
                print!("{}", display::cluster_table(&replicas));
            }
        }
        Command::Dev { .. } | Command::Simulate { .. } | Command::Bench { .. } => {
            unreachable!("main hands these to quorum-dev")
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `quorum admin wait-replica`: polls until replica `id` runs a process started after
/// `started_after`, a leader is known, and the replica has applied what the leader had
/// committed when it was last asked.
async fn wait_replica(
    client: &Client,
    id: u64,
    started_after: u64,
    limit: std::time::Duration,
) -> anyhow::Result<ExitCode> {
    let began = std::time::Instant::now();
    loop {
        let replicas = replica_statuses(client).await.unwrap_or_default();
        let me = replicas.iter().find(|r| r.id == id);
        let leader = replicas.iter().find(|r| r.role == "leader");
        let last = match (me, leader) {
            (None, _) if !replicas.is_empty() => anyhow::bail!("replica {id} is not a member of the cluster"),
            (Some(r), _) if !r.reachable => format!("replica {id} does not answer"),
            (Some(r), _) if r.started_at_ms <= started_after => {
                format!("replica {id} still runs the process started at {}", display::utc_time(r.started_at_ms))
            }
            (Some(_), None) => "no leader".into(),
            (Some(r), Some(l)) if r.applied_index < l.committed_index => {
                format!("replica {id} has applied {} of {} committed entries", r.applied_index, l.committed_index)
            }
            (Some(r), Some(_)) => {
                println!(
                    "replica {id} is back ({}, feature level {}) and caught up at index {} after {:.1}s",
                    r.version,
                    r.feature_level,
                    r.applied_index,
                    began.elapsed().as_secs_f64()
                );
                return Ok(ExitCode::SUCCESS);
            }
            (None, _) => "no replica answers".into(),
        };
        if began.elapsed() > limit {
            eprintln!("replica {id} not back within {}s: {last}", limit.as_secs());
            return Ok(ExitCode::from(1));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// `quorum admin wait-node`: polls until the node's agent is connected from a process started
/// after `started_after`.
async fn wait_node(
    client: &Client,
    node: &str,
    started_after: u64,
    limit: std::time::Duration,
) -> anyhow::Result<ExitCode> {
    let began = std::time::Instant::now();
    loop {
        let nodes =
            client.call(|mut c| async move { c.list_nodes(api::ListNodesRequest { stale: false }).await }).await;
        let last = match nodes.as_ref().map(|r| r.nodes.iter().find(|n| n.name == node)) {
            Err(e) => format!("cannot list nodes: {}", e.message()),
            Ok(None) => anyhow::bail!("there is no node {node}"),
            Ok(Some(n)) if !n.connected => format!("node {node} has no agent connected"),
            Ok(Some(n)) if n.agent_started_at_ms <= started_after => {
                format!("node {node} still runs the agent started at {}", display::utc_time(n.agent_started_at_ms))
            }
            Ok(Some(n)) => {
                println!(
                    "node {node}: agent {} connected again after {:.1}s",
                    n.agent_version,
                    began.elapsed().as_secs_f64()
                );
                return Ok(ExitCode::SUCCESS);
            }
        };
        if began.elapsed() > limit {
            eprintln!("node {node} not back within {}s: {last}", limit.as_secs());
            return Ok(ExitCode::from(1));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// `quorum admin drain` (with a reason) and `resume` (without).
async fn set_drained(client: &Client, nodes: Vec<String>, reason: Option<String>) -> anyhow::Result<()> {
    let req = api::SetNodesDrainedRequest {
        nodes: nodes.clone(),
        drain: reason.is_some(),
        reason: reason.unwrap_or_default(),
        user: current_user(),
    };
    let what = if req.drain { "drained" } else { "resumed" };
    client
        .call(|mut c| {
            let req = req.clone();
            async move { c.set_nodes_drained(req).await }
        })
        .await
        .map_err(status_error)?;
    println!("{what} {}", nodes.join(","));
    Ok(())
}

/// Each member of the cluster with what it says of itself (unreachable ones included).
async fn replica_statuses(client: &Client) -> anyhow::Result<Vec<display::ReplicaJson>> {
    display::replica_statuses(client).await.map_err(status_error)
}

fn note_stale(stale: bool, applied_index: u64) {
    if stale {
        eprintln!("(stale read: as of log index {applied_index} on the replica that answered)");
    }
}

fn voters_line(members: &[api::ReplicaStatus]) -> String {
    members.iter().map(|m| format!("{} ({})", m.id, m.address)).collect::<Vec<_>>().join(", ")
}

fn node_json(n: &api::NodeInfo) -> serde_json::Value {
    serde_json::json!({
        "name": n.name,
        "state": n.state,
        "reason": n.reason,
        "partitions": n.partitions,
        "cpus": n.cpus,
        "alloc_cpus": n.alloc_cpus,
        "mem_mb": n.mem_mb,
        "alloc_mem_mb": n.alloc_mem_mb,
        "gpus": n.gpus,
        "alloc_gpus": n.alloc_gpus,
        "gpu_types": n.gpu_types,
        "connected": n.connected,
        "agent_version": n.agent_version,
        "agent_started_at_ms": n.agent_started_at_ms,
        "limits": n.limits,
        "gpu_health": n.gpu_health.iter().map(|g| serde_json::json!({
            "index": g.index, "state": g.state, "detail": g.detail,
        })).collect::<Vec<_>>(),
        "health_check": n.health_check,
    })
}

/// Becomes `quorum-dev SUBCOMMAND ARGS...` (beside this program, else on PATH); returns only
/// if that cannot be run.
fn exec_quorum_dev(subcommand: &str, args: Vec<String>, controllers: &[String]) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let here = std::env::current_exe().ok();
    let beside = here.as_ref().map(|p| p.with_file_name("quorum-dev")).filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| PathBuf::from("quorum-dev"));
    let err = std::process::Command::new(&program)
        .arg0("quorum")
        .arg(subcommand)
        .args(args)
        .env("QUORUM_CONTROLLERS", controllers.join(","))
        .exec();
    if err.kind() == std::io::ErrorKind::NotFound {
        let dir = here.as_ref().and_then(|p| p.parent()).map_or("?".into(), |d| d.display().to_string());
        return anyhow::anyhow!(
            "quorum {subcommand} is run by quorum-dev, which is neither beside this program (in {dir}) nor on PATH: \
             build it with `cargo build --release --bin quorum-dev`, or install it with `cargo install --path dev`"
        );
    }
    anyhow::anyhow!("running {}: {err}", program.display())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let tool = match &cli.command {
        Command::Dev { args } => Some(("dev", args)),
        Command::Simulate { args } => Some(("simulate", args)),
        Command::Bench { args } => Some(("bench", args)),
        _ => None,
    };
    if let Some((subcommand, args)) = tool {
        eprintln!("quorum: error: {:#}", exec_quorum_dev(subcommand, args.clone(), &cli.controllers.controllers));
        return ExitCode::FAILURE;
    }
    // `quorum queue | head` ends quietly when head has read enough, as other Unix tools do,
    // instead of panicking on the closed pipe. (gRPC sockets are written with MSG_NOSIGNAL, so a
    // dropped connection still comes back as an error.)
    // SAFETY: no other thread exists yet; SIG_DFL is a valid disposition for SIGPIPE.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // A client command is one request or a few: one thread runs it, with no worker threads to
    // start and wake (a third of a short command's CPU).
    quorum_client::exit_code(tokio::runtime::Builder::new_current_thread().enable_all().build(), run(cli))
}
