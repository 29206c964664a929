//! `quorum admin role` (roles at run time) and `quorum admin certs` (the cluster's CA, keys and
//! certificates).

use std::path::PathBuf;
use std::process::ExitCode;

use quorum_auth::pki::{Layout, PeerRole};
use quorum_proto::api;

use crate::commands::Context;

pub async fn role(ctx: &Context, user: String, role: String) -> anyhow::Result<ExitCode> {
    let req = api::SetRoleRequest { user, role };
    ctx.send(req, |mut c, r| async move { c.set_role(r).await }).await?;
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct CertsArgs {
    /// The directory: made with the CA, the launch key and the token key the first time;
    /// what exists is kept.
    dir: PathBuf,
    /// A controller replica's certificate (replica-ID.pem), for these ids.
    #[arg(long = "replica", value_delimiter = ',')]
    replicas: Vec<u64>,
    /// Host names or addresses the replicas are reached at, besides localhost.
    #[arg(long = "host", value_delimiter = ',')]
    hosts: Vec<String>,
    /// An agent's certificate (agent-NODE.pem), for these nodes (a hostlist: node[01-64]).
    #[arg(long = "agent")]
    agents: Vec<String>,
    /// A client certificate (client-NAME.pem), for tools; it authenticates no user.
    #[arg(long = "client")]
    clients: Vec<String>,
}

/// Runs without a cluster: it only writes files.
pub fn certs(args: CertsArgs) -> anyhow::Result<ExitCode> {
    let layout = Layout::new(&args.dir);
    layout.init()?;
    let mut roles: Vec<PeerRole> = args.replicas.iter().map(|id| PeerRole::Replica(*id)).collect();
    for list in &args.agents {
        let nodes = quorum_model::hostlist::expand(list).map_err(|e| anyhow::anyhow!("--agent {list}: {e}"))?;
        roles.extend(nodes.into_iter().map(PeerRole::Agent));
    }
    roles.extend(args.clients.iter().cloned().map(PeerRole::Client));
    for role in &roles {
        let (cert, _) = layout.issue(role, &args.hosts)?;
        println!("{}", cert.display());
    }
    println!(
        "{}: give ca.pem to everyone, launch.pub to the agents, launch.key and token.key to the controllers; keep ca.key to yourself",
        args.dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
