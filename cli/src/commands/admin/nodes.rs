//! `quorum admin` for nodes: drain and resume, GPU fault drills, and waiting for a restarted
//! agent.

use std::process::ExitCode;

use quorum_client::client::Client;
use quorum_client::display;
use quorum_proto::api;

use crate::commands::{current_user, Context};

pub async fn gpu_fault(ctx: &Context, node: String, gpu: u32, kind: String) -> anyhow::Result<ExitCode> {
    quorum_model::gpu_fault::parse_fault(&kind).map_err(anyhow::Error::msg)?;
    let req = api::GpuFaultRequest { user: current_user(), node: node.clone(), gpu, kind: kind.clone() };
    ctx.send(req, |mut c, r| async move { c.inject_gpu_fault(r).await }).await?;
    println!("injected {kind} into GPU {gpu} of {node}; its next heartbeat reports it");
    Ok(ExitCode::SUCCESS)
}

/// `quorum admin drain` (with a reason) and `resume` (without).
pub async fn set_drained(ctx: &Context, nodes: Vec<String>, reason: Option<String>) -> anyhow::Result<()> {
    let what = if reason.is_some() { "drained" } else { "resumed" };
    set_drained_quietly(ctx, nodes.clone(), reason).await?;
    println!("{what} {}", nodes.join(","));
    Ok(())
}

/// Drains `nodes` (with a reason) or resumes them, printing nothing (`scontrol update
/// NodeName=`, which prints nothing either).
pub async fn set_drained_quietly(ctx: &Context, nodes: Vec<String>, reason: Option<String>) -> anyhow::Result<()> {
    let req = api::SetNodesDrainedRequest {
        nodes,
        drain: reason.is_some(),
        reason: reason.unwrap_or_default(),
        user: current_user(),
    };
    ctx.send(req, |mut c, r| async move { c.set_nodes_drained(r).await }).await?;
    Ok(())
}

/// `quorum admin wait-node`: polls until the node's agent is connected from a process started
/// after `started_after`.
pub async fn wait_node(
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

/// `quorum admin config`: the replicated settings as the controllers' TOML.
pub async fn config(ctx: &Context) -> anyhow::Result<ExitCode> {
    let r = ctx.send(api::ClusterConfigRequest {}, |mut c, r| async move { c.cluster_config(r).await }).await?;
    print!("{}", r.toml);
    Ok(ExitCode::SUCCESS)
}
