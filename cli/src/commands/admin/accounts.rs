//! `quorum admin account` and `quorum admin qos`: the account tree and QOS levels, like
//! sacctmgr.

use std::process::ExitCode;

use quorum_proto::api;

use crate::commands::{current_user, Context};

#[derive(clap::Args)]
pub struct AccountArgs {
    /// The account's name; it is made if missing, else changed.
    pub name: String,
    /// Its parent in the account tree (root by default).
    #[arg(long)]
    pub parent: Option<String>,
    /// Its fairshare shares among its siblings.
    #[arg(long, default_value_t = 1)]
    pub shares: u32,
    /// Users who may charge it, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub users: Vec<String>,
    /// Jobs of its users that may run at once (MaxJobs).
    #[arg(long)]
    pub max_jobs: Option<u32>,
    /// GPUs all its running jobs may hold together.
    #[arg(long)]
    pub grp_gpus: Option<u32>,
    /// CPUs all its running jobs may hold together.
    #[arg(long)]
    pub grp_cpus: Option<u32>,
    /// The longest time limit one of its jobs may have, like 2-00:00:00 (MaxWall).
    #[arg(long)]
    pub max_wall: Option<String>,
    /// Memory of all its running jobs, like 512G.
    #[arg(long)]
    pub grp_mem: Option<String>,
    /// Nodes all its running jobs may hold together.
    #[arg(long)]
    pub grp_nodes: Option<u32>,
    /// GPUs of a type for all its running jobs: TYPE=N, repeatable.
    #[arg(long = "grp-gpus-type")]
    pub grp_gpus_type: Vec<String>,
    /// What one job may ask for, a TRES list: cpu=16,mem=64G,node=2,gres/gpu=4.
    #[arg(long)]
    pub max_tres_per_job: Option<String>,
    /// Jobs each user may have pending or running at once; a submit past it is refused.
    #[arg(long)]
    pub max_submit_jobs: Option<u32>,
    /// A budget of minutes for all its jobs: cpu=60000,gres/gpu=6000 (GrpTRESMins).
    #[arg(long)]
    pub grp_tres_mins: Option<String>,
    /// A user's shares of the account: USER=N, repeatable (others have 1).
    #[arg(long = "user-shares", value_delimiter = ',')]
    pub user_shares: Vec<String>,
    /// The QOS its users may use, comma-separated (Slurm's QOS=); none given: its parent's,
    /// and where no account names any, the default QOS alone. Operators may use any.
    #[arg(long, value_delimiter = ',')]
    pub qos: Vec<String>,
    /// The QOS of its users' jobs that name none (DefaultQOS=; default: its parent's, then normal).
    #[arg(long)]
    pub default_qos: Option<String>,
}

#[derive(clap::Args)]
pub struct QosArgs {
    /// The QOS's name; it is made if missing, else changed.
    pub name: String,
    /// Its priority, weighted by weight_qos in a job's priority.
    #[arg(long, default_value_t = 0)]
    pub priority: u32,
    /// The longest time limit one of its jobs may have, like 1:00:00 (MaxWall).
    #[arg(long)]
    pub max_wall: Option<String>,
    /// GPUs one user's running jobs of this QOS may hold together.
    #[arg(long)]
    pub max_gpus_per_user: Option<u32>,
    /// Jobs of this QOS one user may have running at once.
    #[arg(long)]
    pub max_jobs_per_user: Option<u32>,
    /// What one job may ask for, a TRES list: cpu=16,mem=64G,node=2,gres/gpu=4.
    #[arg(long)]
    pub max_tres_per_job: Option<String>,
    /// What one user's running jobs may hold together, a TRES list.
    #[arg(long)]
    pub max_tres_per_user: Option<String>,
    /// What all its running jobs may hold together, a TRES list (GrpTRES).
    #[arg(long)]
    pub grp_tres: Option<String>,
    /// How many of its jobs may run at once (GrpJobs).
    #[arg(long)]
    pub grp_jobs: Option<u32>,
    /// A budget of minutes for all its jobs: cpu=60000,gres/gpu=6000 (GrpTRESMins).
    #[arg(long)]
    pub grp_tres_mins: Option<String>,
    /// Jobs each user may have pending or running at once; a submit past it is refused.
    #[arg(long)]
    pub max_submit_jobs_per_user: Option<u32>,
    /// Its usage never decays (Flags=NoDecay): a GrpTRESMins budget stays spent.
    #[arg(long)]
    pub no_decay: bool,
}

/// A TRES list for the API; `None`: no limit.
fn tres(flag: &str, text: &Option<String>) -> anyhow::Result<Option<api::TresLimit>> {
    let Some(text) = text else { return Ok(None) };
    let t = quorum_model::TresLimit::parse(text).map_err(|e| anyhow::anyhow!("invalid --{flag} '{text}': {e}"))?;
    Ok(Some(api::TresLimit { cpus: t.cpus, gpus: t.gpus, mem_mb: t.mem_mb, nodes: t.nodes }))
}

/// A budget of TRES-minutes for the API; `None`: no budget.
fn tres_mins(flag: &str, text: &Option<String>) -> anyhow::Result<Option<api::TresMins>> {
    let Some(text) = text else { return Ok(None) };
    let t = quorum_model::TresMins::parse(text).map_err(|e| anyhow::anyhow!("invalid --{flag} '{text}': {e}"))?;
    Ok(Some(api::TresMins { cpu: t.cpu, gpu: t.gpu }))
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
        max_tres_per_job,
        max_submit_jobs,
        grp_tres_mins,
        user_shares,
        qos,
        default_qos,
    } = args;
    let mut shares_of_users = std::collections::HashMap::new();
    for t in &user_shares {
        let (user, n) = t
            .split_once('=')
            .and_then(|(u, n)| n.parse::<u32>().ok().filter(|_| !u.is_empty()).map(|n| (u.to_string(), n)))
            .ok_or_else(|| anyhow::anyhow!("invalid --user-shares '{t}': expected USER=N such as alice=3"))?;
        shares_of_users.insert(user, n);
    }
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
            max_tres_per_job: tres("max-tres-per-job", &max_tres_per_job)?,
            max_submit_jobs,
            grp_tres_mins: tres_mins("grp-tres-mins", &grp_tres_mins)?,
            user_shares: shares_of_users,
            qos,
            default_qos: default_qos.unwrap_or_default(),
        }),
        user: current_user(),
    };
    ctx.send(req, |mut c, r| async move { c.upsert_account(r).await }).await?;
    Ok(ExitCode::SUCCESS)
}

/// Adds or changes a QOS.
pub async fn qos(ctx: &Context, q: QosArgs) -> anyhow::Result<ExitCode> {
    let req = api::UpsertQosRequest {
        qos: Some(api::QosSpec {
            max_wall_s: parse_wall(&q.max_wall)?,
            max_gpus_per_user: q.max_gpus_per_user,
            max_jobs_per_user: q.max_jobs_per_user,
            max_tres_per_job: tres("max-tres-per-job", &q.max_tres_per_job)?,
            max_tres_per_user: tres("max-tres-per-user", &q.max_tres_per_user)?,
            grp_tres: tres("grp-tres", &q.grp_tres)?,
            grp_jobs: q.grp_jobs,
            grp_tres_mins: tres_mins("grp-tres-mins", &q.grp_tres_mins)?,
            max_submit_jobs_per_user: q.max_submit_jobs_per_user,
            no_decay: q.no_decay,
            name: q.name,
            priority: q.priority,
        }),
        user: current_user(),
    };
    ctx.send(req, |mut c, r| async move { c.upsert_qos(r).await }).await?;
    Ok(ExitCode::SUCCESS)
}
