//! `quorum admin account` and `quorum admin qos`: the account tree and QOS levels, like
//! sacctmgr.

use std::process::ExitCode;

use quorum_proto::api;

use crate::commands::{current_user, Context};

#[derive(clap::Args)]
pub struct AccountArgs {
    pub name: String,
    #[arg(long)]
    pub parent: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub shares: u32,
    /// Users who may charge it, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub users: Vec<String>,
    #[arg(long)]
    pub max_jobs: Option<u32>,
    #[arg(long)]
    pub grp_gpus: Option<u32>,
    #[arg(long)]
    pub grp_cpus: Option<u32>,
    #[arg(long)]
    pub max_wall: Option<String>,
    /// Memory of all its running jobs, like 512G.
    #[arg(long)]
    pub grp_mem: Option<String>,
    #[arg(long)]
    pub grp_nodes: Option<u32>,
    /// GPUs of a type for all its running jobs: TYPE=N, repeatable.
    #[arg(long = "grp-gpus-type")]
    pub grp_gpus_type: Vec<String>,
}

#[derive(clap::Args)]
pub struct QosArgs {
    pub name: String,
    #[arg(long, default_value_t = 0)]
    pub priority: u32,
    #[arg(long)]
    pub max_wall: Option<String>,
    #[arg(long)]
    pub max_gpus_per_user: Option<u32>,
    #[arg(long)]
    pub max_jobs_per_user: Option<u32>,
}

fn parse_wall(v: &Option<String>) -> anyhow::Result<Option<u64>> {
    Ok(match v {
        Some(t) => quorum_model::parse::parse_time_limit(t).map_err(anyhow::Error::msg)?,
        None => None,
    })
}

/// Adds or changes an account.
pub async fn account(ctx: &Context, args: AccountArgs) -> anyhow::Result<ExitCode> {
    let AccountArgs {
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
    } = args;
    let mut by_type = std::collections::HashMap::new();
    for t in &grp_gpus_type {
        let (ty, n) = t
            .split_once('=')
            .and_then(|(ty, n)| n.parse::<u32>().ok().map(|n| (ty.to_string(), n)))
            .ok_or_else(|| anyhow::anyhow!("invalid --grp-gpus-type '{t}': expected TYPE=N such as h100=16"))?;
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
    ctx.send(req, |mut c, r| async move { c.upsert_account(r).await }).await?;
    Ok(ExitCode::SUCCESS)
}

/// Adds or changes a QOS.
pub async fn qos(
    ctx: &Context,
    QosArgs { name, priority, max_wall, max_gpus_per_user, max_jobs_per_user }: QosArgs,
) -> anyhow::Result<ExitCode> {
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
    ctx.send(req, |mut c, r| async move { c.upsert_qos(r).await }).await?;
    Ok(ExitCode::SUCCESS)
}
