//! `quorum nodes`: the nodes, like sinfo.

use std::process::ExitCode;

use quorum_client::display;
use quorum_proto::api;

use super::{note_stale, print_json, Context};

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON instead of a table, for scripts.
    #[arg(long)]
    json: bool,
}

pub async fn run(ctx: &Context, Args { json }: Args) -> anyhow::Result<ExitCode> {
    let stale = ctx.stale;
    let r = ctx.send(api::ListNodesRequest { stale }, |mut c, r| async move { c.list_nodes(r).await }).await?;
    note_stale(ctx.stale, r.applied_index);
    if json {
        print_json(&r.nodes.iter().map(node_json).collect::<Vec<_>>())?;
    } else {
        print!("{}", display::nodes_table(&r.nodes));
        eprint!("{}", display::nodes_notes(&r.nodes));
    }
    Ok(ExitCode::SUCCESS)
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
        "image_cache_bytes": n.image_cache_bytes,
        "images_cached": n.images_cached,
    })
}
