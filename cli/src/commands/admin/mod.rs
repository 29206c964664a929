//! `quorum admin`: the operators' commands (as root), one module per area.

mod accounts;
pub mod identity;
pub mod nodes;
mod replicas;

use std::process::ExitCode;

use clap::Subcommand;

use super::Context;

#[derive(Subcommand)]
#[command(defer = true)] // built when invoked, as `quorum`'s own subcommands are
pub enum Command {
    /// Add or change an account, like sacctmgr add/modify account.
    Account(Box<accounts::AccountArgs>),
    /// Add a controller replica: it joins as a learner, catches up (by snapshot if it lags far),
    /// then becomes a voter. Start it first with `join = true` in its config.
    AddReplica {
        /// The new replica's id (its config's `id`).
        id: u64,
        /// host:port the other replicas and agents reach it at.
        addr: String,
    },
    /// Drain nodes: no new job lands there, running ones go on (like scontrol update
    /// state=drain). Comma-separated names.
    Drain {
        /// The nodes, comma-separated.
        #[arg(value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// Why; shown in `quorum nodes`.
        #[arg(long)]
        reason: String,
    },
    /// Return drained nodes to service.
    Resume {
        /// The nodes, comma-separated.
        #[arg(value_delimiter = ',', required = true)]
        nodes: Vec<String>,
    },
    /// Inject a fault into a simulated GPU (an agent with --gpus sim:...), to drill what a
    /// failing GPU does: xid:N, ecc-uncorrectable[:N], ecc-correctable:N, temperature:C,
    /// retired-pages:N, pcie-replay:N, remapped-rows:N, remap-pending, remap-failed, or clear
    /// (the GPU is healthy again).
    GpuFault {
        /// The node whose agent simulates the GPU.
        node: String,
        /// The GPU's index on that node.
        gpu: u32,
        /// The fault, or clear.
        kind: String,
    },
    /// Hand leadership to replica ID (default: the most caught-up other voter).
    TransferLeader {
        /// The voter to lead next.
        id: Option<u64>,
    },
    /// Remove a controller replica from the cluster (stop its process afterwards).
    RemoveReplica {
        /// The replica's id.
        id: u64,
    },
    /// What each replica runs and the cluster's feature level (the lowest among the voters):
    /// commands newer than it are refused until every replica is upgraded.
    Versions {
        /// Print JSON instead of a table, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Wait until replica ID answers from a process started after --started-after (epoch ms)
    /// and has applied everything the leader had committed by then; for upgrade scripts.
    WaitReplica {
        /// The replica's id.
        id: u64,
        /// Only a process started after this time counts (milliseconds since the epoch; 0: any).
        #[arg(long, default_value_t = 0)]
        started_after: u64,
        /// Give up after this many seconds (exit 1).
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Wait until NODE's agent is connected from a process started after --started-after
    /// (epoch ms); for upgrade scripts.
    WaitNode {
        /// The node's name.
        node: String,
        /// Only a process started after this time counts (milliseconds since the epoch; 0: any).
        #[arg(long, default_value_t = 0)]
        started_after: u64,
        /// Give up after this many seconds (exit 1).
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Each replica's state digest at one log index (a digest point committed through Raft);
    /// exits 1 if any two differ.
    Digest {
        /// Print JSON instead of a table, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Write a backup of the cluster (its replicated state and job history at one log index,
    /// with a checksum) to FILE, from the replica the client reaches first (or --replica), while
    /// the cluster serves; `quorum-controller --restore FILE` starts a new cluster from it. The
    /// file holds every job's script and environment: it is made readable by its owner only.
    Backup {
        /// Where to write it (written beside it first, then renamed: never half a file).
        file: std::path::PathBuf,
        /// The replica to take it from (host:port).
        #[arg(long)]
        replica: Option<String>,
    },
    /// Print the cluster's replicated settings (partitions, QOS, accounts, licenses, topology)
    /// as the controllers' TOML: what they are now, after every change made at run time; it
    /// seeds a new cluster the same (`quorum dev --config`, a new cluster's replicas).
    Config,
    /// Add or change a QOS.
    Qos(accounts::QosArgs),
    /// Give a user a role at run time: user, operator (any job; drain and resume nodes) or
    /// admin (accounts, QOS, roles, tokens for others, membership). `user` takes back what was
    /// given; roles in the controllers' configuration stay.
    Role {
        /// The user's name.
        user: String,
        /// user, operator or admin.
        role: String,
    },
    /// Make the cluster's CA, keys and certificates in a directory (no cluster needed).
    Certs(identity::CertsArgs),
}

pub async fn run(ctx: &Context, command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Account(args) => accounts::account(ctx, *args).await,
        Command::Qos(args) => accounts::qos(ctx, args).await,
        Command::AddReplica { id, addr } => replicas::add(ctx, id, addr).await,
        Command::TransferLeader { id } => replicas::transfer_leader(ctx, id).await,
        Command::RemoveReplica { id } => replicas::remove(ctx, id).await,
        Command::Versions { json } => replicas::versions(ctx, json).await,
        Command::Digest { json } => replicas::digest(ctx, json).await,
        Command::Config => nodes::config(ctx).await,
        Command::Backup { file, replica } => replicas::backup(ctx, &file, replica.as_deref()).await,
        Command::WaitReplica { id, started_after, timeout } => {
            replicas::wait_replica(&ctx.client, id, started_after, std::time::Duration::from_secs(timeout)).await
        }
        Command::Drain { nodes, reason } => {
            nodes::set_drained(ctx, nodes, Some(reason)).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Resume { nodes } => nodes::set_drained(ctx, nodes, None).await.map(|()| ExitCode::SUCCESS),
        Command::GpuFault { node, gpu, kind } => nodes::gpu_fault(ctx, node, gpu, kind).await,
        Command::Role { user, role } => identity::role(ctx, user, role).await,
        Command::Certs(args) => identity::certs(args),
        Command::WaitNode { node, started_after, timeout } => {
            nodes::wait_node(&ctx.client, &node, started_after, std::time::Duration::from_secs(timeout)).await
        }
    }
}
