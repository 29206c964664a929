//! The public API. Every replica serves it: the leader answers; a follower forwards the request
//! once to the leader it knows (marking it, so it is never forwarded twice) or answers
//! UNAVAILABLE with the leader's address. Reads are linearizable: the leader confirms its
//! leadership with a quorum before reading its applied state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use quorum_proto::api::quorum_client::QuorumClient;
use quorum_proto::api::quorum_server::{Quorum, QuorumServer};
use quorum_proto::api::*;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::{convert, not_leader};
use crate::model::JobState;
use crate::replica::{now_ms, Core, WriteError, VERSION};
use crate::state::{Command, Response as Applied};

pub fn service(core: Arc<Core>) -> QuorumServer<Api> {
    QuorumServer::new(Api { core, channels: Mutex::new(HashMap::new()) })
}

pub struct Api {
    core: Arc<Core>,
    channels: Mutex<HashMap<String, Channel>>,
}

pub fn write_status(e: WriteError) -> Status {
    match e {
        WriteError::NotLeader { leader } => not_leader(leader.as_deref()),
        WriteError::Raft(msg) => Status::unavailable(msg),
    }
}

fn forwarded<T>(msg: T) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut().insert(quorum_proto::FORWARDED_KEY, tonic::metadata::MetadataValue::from_static("1"));
    req
}

impl Api {
    /// `Some(leader address)` when this replica must forward the request there.
    fn forward_target<T>(&self, req: &Request<T>) -> Result<Option<String>, Status> {
        if self.core.is_leader() {
            return Ok(None);
        }
        let leader = self.core.leader_addr();
        if req.metadata().contains_key(quorum_proto::FORWARDED_KEY) || leader.is_none() {
            return Err(not_leader(leader.as_deref()));
        }
        Ok(leader)
    }

    fn client(&self, addr: &str) -> Result<QuorumClient<Channel>, Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let channel = match channels.get(addr) {
            Some(c) => c.clone(),
            None => {
                let c = Endpoint::from_shared(format!("http://{addr}"))
                    .map_err(|e| Status::internal(format!("leader address {addr}: {e}")))?
                    .tcp_nodelay(true)
                    .connect_lazy();
                channels.insert(addr.to_string(), c.clone());
                c
            }
        };
        Ok(QuorumClient::new(channel))
    }
}

#[tonic::async_trait]
impl Quorum for Api {
    async fn submit_job(&self, req: Request<SubmitJobRequest>) -> Result<Response<SubmitJobResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return self.client(&addr)?.submit_job(forwarded(req.into_inner())).await;
        }
        let r = req.into_inner();
        let spec = r.spec.ok_or_else(|| Status::invalid_argument("missing job spec"))?;
        let spec = convert::spec_from_proto(spec).map_err(|e| convert::rejection_status(&e))?;
        spec.check_shape().map_err(|e| convert::rejection_status(&e))?;
        if r.user.is_empty() {
            return Err(Status::invalid_argument("missing user"));
        }
        let command =
            Command::SubmitJob { spec: Box::new(spec), user: r.user, now: now_ms(), request_id: r.request_id };
        match self.core.write(command).await.map_err(write_status)?.1 {
            Applied::Submitted { job_id, duplicate } => Ok(Response::new(SubmitJobResponse { job_id, duplicate })),
            Applied::Rejected(r) => Err(convert::rejection_status(&r)),
            other => Err(Status::internal(format!("unexpected answer to a submit: {other:?}"))),
        }
    }

    async fn cancel_job(&self, req: Request<CancelJobRequest>) -> Result<Response<CancelJobResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return self.client(&addr)?.cancel_job(forwarded(req.into_inner())).await;
        }
        let r = req.into_inner();
        if r.user.is_empty() {
            return Err(Status::invalid_argument("missing user"));
        }
        let mut results = Vec::new();
        for job_id in r.job_ids {
            let command = Command::CancelJob { job_id, user: r.user.clone(), now: now_ms() };
            let result = match self.core.write(command).await.map_err(write_status)?.1 {
                Applied::Cancelled { .. } => CancelResult { job_id, ok: true, error: String::new() },
                Applied::Rejected(rej) => CancelResult { job_id, ok: false, error: rej.to_string() },
                other => return Err(Status::internal(format!("unexpected answer to a cancel: {other:?}"))),
            };
            results.push(result);
        }
        Ok(Response::new(CancelJobResponse { results }))
    }

    async fn get_job(&self, req: Request<GetJobRequest>) -> Result<Response<GetJobResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return self.client(&addr)?.get_job(forwarded(req.into_inner())).await;
        }
        let job_id = req.into_inner().job_id;
        self.core.linearizable().await.map_err(write_status)?;
        let applied = self.core.shared.read();
        let job =
            applied.state.jobs.get(&job_id).ok_or_else(|| Status::not_found(format!("job {job_id} does not exist")))?;
        Ok(Response::new(GetJobResponse {
            job: Some(convert::job_to_proto(job, true)),
            applied_index: applied.applied_index(),
        }))
    }

    async fn list_jobs(&self, req: Request<ListJobsRequest>) -> Result<Response<ListJobsResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return self.client(&addr)?.list_jobs(forwarded(req.into_inner())).await;
        }
        let r = req.into_inner();
        let mut states = Vec::new();
        for s in &r.states {
            states.push(
                JobState::from_name(s).ok_or_else(|| Status::invalid_argument(format!("unknown job state '{s}'")))?,
            );
        }
        self.core.linearizable().await.map_err(write_status)?;
        let applied = self.core.shared.read();
        let jobs = applied
            .state
            .jobs
            .values()
            .filter(|j| states.is_empty() || states.contains(&j.state))
            .filter(|j| r.user.is_empty() || j.user == r.user)
            .map(|j| convert::job_to_proto(j, false))
            .collect();
        Ok(Response::new(ListJobsResponse { jobs, applied_index: applied.applied_index(), now_ms: now_ms() }))
    }

    async fn list_nodes(&self, req: Request<ListNodesRequest>) -> Result<Response<ListNodesResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return self.client(&addr)?.list_nodes(forwarded(req.into_inner())).await;
        }
        self.core.linearizable().await.map_err(write_status)?;
        let applied = self.core.shared.read();
        let nodes = applied
            .state
            .nodes
            .values()
            .map(|n| convert::node_to_proto(n, applied.state.partitions_of(&n.name), self.core.hub.connected(&n.name)))
            .collect();
        Ok(Response::new(ListNodesResponse { nodes, applied_index: applied.applied_index() }))
    }

    async fn get_replica_status(&self, _req: Request<ReplicaStatusRequest>) -> Result<Response<ReplicaStatus>, Status> {
        let metrics = self.core.raft.metrics();
        let m = metrics.borrow();
        let role = match m.state {
            openraft::ServerState::Leader => "leader",
            openraft::ServerState::Follower => "follower",
            openraft::ServerState::Candidate => "candidate",
            openraft::ServerState::Learner => "learner",
            openraft::ServerState::Shutdown => "shutdown",
        };
        Ok(Response::new(ReplicaStatus {
            id: self.core.id,
            address: self.core.addr.clone(),
            role: role.to_string(),
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            committed_index: self.core.committed_index(),
            applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
            leader_id: m.current_leader.unwrap_or(0),
            has_leader: m.current_leader.is_some(),
            version: VERSION.to_string(),
            snapshot_index: m.snapshot.map(|l| l.index).unwrap_or(0),
        }))
    }

    async fn cluster_members(
        &self,
        _req: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusResponse>, Status> {
        let metrics = self.core.raft.metrics();
        let m = metrics.borrow();
        let members = m
            .membership_config
            .membership()
            .nodes()
            .map(|(id, node)| ReplicaStatus { id: *id, address: node.addr.clone(), ..Default::default() })
            .collect();
        Ok(Response::new(ClusterStatusResponse { members }))
    }
}
