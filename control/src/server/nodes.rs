//! Nodes: the node list (`quorum nodes`), operators' drain and resume, and GPU fault drills.

use quorum_auth::Caller;
use quorum_proto::api::*;
use tonic::Status;

use super::api::{acting_as, read_barrier, rejection_status, write_status, Api};
use crate::leader::hub::AgentInfo;
use crate::model::reservation::{Reservation, ResvEnd, ResvFlags, ResvRequest};
use crate::model::Node;
use crate::replica::now_ms;
use quorum_state::{Command, Response};

pub(super) async fn list_nodes(api: &Api, _caller: &Caller, r: ListNodesRequest) -> Result<ListNodesResponse, Status> {
    read_barrier(api, r.stale).await?;
    let applied = api.replica.shared.read();
    let nodes = applied
        .state
        .nodes
        .values()
        .map(|n| node_to_proto(n, applied.state.partitions_of(&n.name), api.leader.hub.agent(&n.name)))
        .collect();
    let partitions = applied
        .state
        .partitions
        .values()
        .map(|p| PartitionInfo {
            name: p.name.clone(),
            nodes: p.nodes.clone(),
            default: p.default,
            max_time_s: p.max_time_s.unwrap_or(0),
            default_time_s: p.default_time_s.unwrap_or(0),
            default_mem_per_cpu_mb: p.default_mem_per_cpu_mb,
            priority_tier: p.priority_tier,
            max_nodes: p.max_nodes.unwrap_or(0),
            exclusive: p.exclusive,
            allow_accounts: p.access.allow_accounts.clone(),
            deny_accounts: p.access.deny_accounts.clone(),
            allow_qos: p.access.allow_qos.clone(),
            deny_qos: p.access.deny_qos.clone(),
            preempt_mode: p.preempt_mode.unwrap_or(applied.state.policy.preempt_mode).name().to_string(),
            grace_time_s: p.grace_time_s,
            oversubscribe: p.oversubscribe.to_string(),
            state: p.state.name().to_string(),
        })
        .collect();
    let mut used: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
    if !applied.state.licenses.is_empty() {
        for id in &applied.state.active {
            let Some(j) = applied.state.jobs.get(id).filter(|j| j.state.is_allocated()) else {
                continue;
            };
            for (name, count) in &j.spec.licenses {
                let u = used.entry(name.as_str()).or_default();
                *u = u.saturating_add(*count);
            }
        }
    }
    let licenses = applied
        .state
        .licenses
        .iter()
        .map(|(name, total)| LicenseInfo {
            name: name.clone(),
            total: *total,
            used: used.get(name.as_str()).copied().unwrap_or(0),
        })
        .collect();
    let clock = applied.state.clock.max(now_ms());
    let reservations = applied
        .state
        .reservations
        .values()
        .filter(|r| !r.expired(clock))
        .map(|r| reservation_to_proto(r, clock))
        .collect();
    Ok(ListNodesResponse { nodes, applied_index: applied.applied_index(), partitions, licenses, reservations })
}

pub fn reservation_to_proto(r: &Reservation, now_ms: u64) -> ReservationInfo {
    let (start, end) = r.next_window(now_ms).unwrap_or((r.start_ms, r.end_ms));
    let names: Vec<&str> = r.nodes.iter().map(String::as_str).collect();
    ReservationInfo {
        name: r.name.clone(),
        nodes: crate::model::hostlist::compress(&names),
        node_count: r.nodes.len() as u32,
        start_ms: start,
        end_ms: end.unwrap_or(0),
        users: r.users.clone(),
        accounts: r.accounts.clone(),
        partition: r.partition.clone().unwrap_or_default(),
        flags: r.flags.names().into_iter().map(String::from).collect(),
        state: r.state_name(now_ms).to_string(),
    }
}

/// The model's request from the wire's: names and flags read, hostlists expanded.
fn reservation_request(r: ReservationRequest) -> Result<ResvRequest, Status> {
    let bad = |what: &str, why: String| Status::invalid_argument(format!("invalid {what}: {why}"));
    let list = |s: Option<String>| -> Option<Vec<String>> {
        s.map(|s| s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(String::from).collect())
    };
    let end = match (r.end_ms, r.duration_s, r.unlimited) {
        (Some(_), Some(_), _) | (Some(_), _, true) | (_, Some(_), true) => {
            return Err(Status::invalid_argument("give one of EndTime=, Duration= and Duration=UNLIMITED"))
        }
        (Some(t), None, false) => Some(ResvEnd::At(t)),
        (None, Some(d), false) => Some(ResvEnd::After(d)),
        (None, None, true) => Some(ResvEnd::Unlimited),
        (None, None, false) => None,
    };
    let nodes = match r.nodes {
        Some(h) => Some(
            crate::model::hostlist::expand_at_most(&h, quorum_model::reservation::MAX_LIST_LEN)
                .map_err(|e| bad("Nodes", e.to_string()))?,
        ),
        None => None,
    };
    let request = ResvRequest {
        name: r.name.trim().to_string(),
        start_ms: r.start_ms,
        end,
        nodes,
        node_count: r.node_count,
        users: list(r.users),
        accounts: list(r.accounts),
        partition: r.partition.filter(|p| !p.is_empty()),
        flags: r.flags.map(|f| ResvFlags::parse(&f)).transpose().map_err(|e| bad("Flags", e))?,
    };
    request.check_shape().map_err(Status::invalid_argument)?;
    Ok(request)
}

pub(super) async fn reserve(
    api: &Api,
    caller: &Caller,
    r: ReservationRequest,
    update: bool,
) -> Result<ReservationResponse, Status> {
    let request = reservation_request(r)?;
    let (user, now) = (acting_as(caller), now_ms());
    let command = match update {
        false => Command::CreateReservation { request, user, now },
        true => Command::UpdateReservation { request, user, now },
    };
    match api.replica.write(command).await.map_err(write_status)?.1 {
        Response::Reserved { reservation } => {
            Ok(ReservationResponse { reservation: Some(reservation_to_proto(&reservation, now)) })
        }
        Response::Rejected(r) => Err(rejection_status(&r)),
        other => Err(Status::internal(format!("unexpected answer to a reservation: {other:?}"))),
    }
}

pub(super) async fn delete_reservation(
    api: &Api,
    caller: &Caller,
    r: DeleteReservationRequest,
) -> Result<AdminResponse, Status> {
    let command =
        Command::DeleteReservation { name: r.name.trim().to_string(), user: acting_as(caller), now: now_ms() };
    match api.replica.write(command).await.map_err(write_status)?.1 {
        Response::Ok => Ok(AdminResponse {}),
        Response::Rejected(r) => Err(rejection_status(&r)),
        other => Err(Status::internal(format!("unexpected answer to a reservation's delete: {other:?}"))),
    }
}

pub(super) async fn set_nodes_drained(
    api: &Api,
    _caller: &Caller,
    r: SetNodesDrainedRequest,
) -> Result<AdminResponse, Status> {
    let nodes: Vec<String> = r.nodes.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
    if nodes.is_empty() {
        return Err(Status::invalid_argument("name at least one node"));
    }
    let drain = match (r.drain, r.reason.trim()) {
        (true, "") => return Err(Status::invalid_argument("a drain needs a reason (--reason), shown in quorum nodes")),
        (true, reason) => Some(reason.to_string()),
        (false, _) => None,
    };
    match api.replica.write(Command::SetNodesDrained { nodes, drain, now: now_ms() }).await.map_err(write_status)?.1 {
        Response::Ok => Ok(AdminResponse {}),
        Response::Rejected(r) => Err(rejection_status(&r)),
        other => Err(Status::internal(format!("unexpected answer to a drain: {other:?}"))),
    }
}

pub(super) async fn inject_gpu_fault(
    api: &Api,
    _caller: &Caller,
    r: GpuFaultRequest,
) -> Result<GpuFaultResponse, Status> {
    crate::model::gpu_fault::parse_fault(&r.kind).map_err(Status::invalid_argument)?;
    {
        let applied = api.replica.shared.read();
        let node = applied
            .state
            .nodes
            .get(&r.node)
            .ok_or_else(|| Status::not_found(format!("there is no node {}", r.node)))?;
        if r.gpu as usize >= node.gpus.len() {
            return Err(Status::invalid_argument(format!(
                "node {} has no GPU {} ({} GPUs)",
                r.node,
                r.gpu,
                node.gpus.len()
            )));
        }
    }
    if !api.leader.hub.gpu_fault(&r.node, r.gpu, &r.kind) {
        return Err(Status::unavailable(format!("node {} has no agent connected", r.node)));
    }
    Ok(GpuFaultResponse {})
}

fn node_to_proto(n: &Node, partitions: Vec<String>, agent: Option<AgentInfo>) -> NodeInfo {
    NodeInfo {
        name: n.name.clone(),
        state: n.state().name().to_string(),
        reason: n.reason().to_string(),
        features: n.features.clone(),
        weight: n.weight,
        cpus: n.cpus,
        alloc_cpus: n.cpus_in_use(),
        mem_mb: n.mem_mb,
        alloc_mem_mb: n.alloc_mem_mb,
        gpus: n.gpus.len() as u32,
        alloc_gpus: n.alloc_gpus.len() as u32,
        gpu_types: n.gpu_summary(),
        partitions,
        connected: agent.is_some(),
        agent_version: agent.as_ref().map(|a| a.version.clone()).unwrap_or_default(),
        agent_started_at_ms: agent.as_ref().map_or(0, |a| a.started_at_ms),
        limits: agent.as_ref().map(|a| a.limits.clone()).unwrap_or_default(),
        gpu_health: agent
            .as_ref()
            .map(|a| {
                a.gpus
                    .iter()
                    .map(|g| GpuHealthInfo {
                        index: g.index,
                        state: crate::wire::gpu_state_name(g.state).to_string(),
                        detail: g.detail.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        image_cache_bytes: agent.as_ref().map_or(0, |a| a.image_cache.0),
        images_cached: agent.as_ref().map_or(0, |a| a.image_cache.1),
        health_check: agent.map(|a| a.health_check).unwrap_or_default(),
    }
}
