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

use super::batch::SubmitBatcher;
use super::{convert, not_leader};
use crate::model::JobState;
use crate::replica::{now_ms, Core, UpTo, WriteError, VERSION};
use quorum_state::{Command, Response as Applied, Submit};

pub fn service(core: Arc<Core>) -> QuorumServer<Api> {
    let submits = SubmitBatcher::submits(core.clone());
    QuorumServer::new(Api { core, channels: Mutex::new(HashMap::new()), submits })
}

pub struct Api {
    core: Arc<Core>,
    channels: Mutex<HashMap<String, Channel>>,
    submits: SubmitBatcher,
}

pub fn write_status(e: WriteError) -> Status {
    match e {
        WriteError::NotLeader { leader } => not_leader(leader.as_deref()),
        WriteError::Raft(msg) => Status::unavailable(msg),
        e @ WriteError::TooNew { .. } => Status::failed_precondition(e.to_string()),
    }
}

/// A forwarded call's answer, carrying the leader's address so that the client can go there
/// directly next time.
fn with_leader_hint<T>(leader: &str, result: Result<Response<T>, Status>) -> Result<Response<T>, Status> {
    result.map(|mut r| {
        if let Ok(v) = tonic::metadata::MetadataValue::try_from(leader) {
            r.metadata_mut().insert(quorum_proto::LEADER_HINT_KEY, v);
        }
        r
    })
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

/// Task `task` of the array whose id is `array_id` (its tasks have the ids from `array_id` on).
fn array_task(state: &quorum_state::ClusterState, array_id: u64, task: u32) -> Result<&crate::model::Job, Status> {
    let first = state.jobs.get(&array_id).ok_or_else(|| Status::not_found(format!("job {array_id} does not exist")))?;
    let Some(a) = first.array.filter(|a| a.array_job_id == array_id) else {
        return Err(Status::invalid_argument(format!("job {array_id} is not a job array, so it has no task {task}")));
    };
    state
        .jobs
        .range(array_id..array_id + u64::from(a.count))
        .map(|(_, j)| &**j)
        .find(|j| j.array.is_some_and(|t| t.task_id == task))
        .ok_or_else(|| {
            Status::not_found(format!("array {array_id} has no task {task} (its tasks are {}-{})", a.min, a.max))
        })
}

fn require_root(user: &str) -> Result<(), Status> {
    if user == "root" {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "user '{user}' may not change accounts, QOS or the replicas; only root may"
        )))
    }
}

#[tonic::async_trait]
impl Quorum for Api {
    async fn hold_job(&self, req: Request<HoldJobRequest>) -> Result<Response<HoldJobResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.hold_job(forwarded(req.into_inner())).await);
        }
        let r = req.into_inner();
        if r.user.is_empty() {
            return Err(Status::invalid_argument("missing user"));
        }
        let mut results = Vec::new();
        for job_id in r.job_ids {
            let (user, now) = (r.user.clone(), now_ms());
            let command = if r.release {
                Command::ReleaseJob { job_id, user, now }
            } else {
                Command::HoldJob { job_id, user, now }
            };
            let error = match self.core.write(command).await.map_err(write_status)?.1 {
                Applied::Held { .. } | Applied::Released { .. } => String::new(),
                Applied::Rejected(rej) => rej.to_string(),
                other => return Err(Status::internal(format!("unexpected answer to a hold: {other:?}"))),
            };
            results.push(CancelResult { job_id, ok: error.is_empty(), error });
        }
        Ok(Response::new(HoldJobResponse { results }))
    }

    async fn priorities(&self, req: Request<PriorityRequest>) -> Result<Response<PriorityResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.priorities(forwarded(req.into_inner())).await);
        }
        self.core.linearizable().await.map_err(write_status)?;
        let (view, policy) = {
            let applied = self.core.shared.read();
            (quorum_sched::ClusterView::from_state(&applied.state), applied.state.policy.clone())
        };
        let factors = quorum_sched::priority::breakdown(&view, now_ms(), &policy);
        let jobs = view
            .pending
            .iter()
            .map(|j| {
                let f = &factors[&j.id];
                JobPriority {
                    job_id: j.id,
                    user: j.user.to_string(),
                    account: j.account.to_string(),
                    partition: j.partition.to_string(),
                    total: f.total,
                    age: f.age,
                    fairshare: f.fairshare,
                    job_size: f.job_size,
                    partition_factor: f.partition,
                    qos: f.qos,
                    nice: f.nice,
                }
            })
            .collect();
        let w = policy.weights;
        Ok(Response::new(PriorityResponse {
            jobs,
            weight_age: w.age,
            weight_fairshare: w.fairshare,
            weight_job_size: w.job_size,
            weight_partition: w.partition,
            weight_qos: w.qos,
        }))
    }

    async fn shares(&self, req: Request<SharesRequest>) -> Result<Response<SharesResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.shares(forwarded(req.into_inner())).await);
        }
        self.core.linearizable().await.map_err(write_status)?;
        let applied = self.core.shared.read();
        let view = quorum_sched::ClusterView::from_state(&applied.state);
        let shares = quorum_sched::priority::fairshare(&view, now_ms(), &applied.state.policy);
        let accounts = shares
            .values()
            .map(|s| AccountShare {
                name: s.name.clone(),
                parent: s.parent.clone().unwrap_or_default(),
                raw_shares: s.raw_shares,
                norm_shares: s.norm_shares,
                raw_usage: s.raw_usage,
                norm_usage: s.norm_usage,
                fairshare: s.fairshare,
                users: applied
                    .state
                    .accounts
                    .get(&s.name)
                    .map(|a| a.users.iter().cloned().collect())
                    .unwrap_or_default(),
            })
            .collect();
        Ok(Response::new(SharesResponse { accounts }))
    }

    async fn upsert_account(&self, req: Request<UpsertAccountRequest>) -> Result<Response<AdminResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.upsert_account(forwarded(req.into_inner())).await);
        }
        let r = req.into_inner();
        require_root(&r.user)?;
        let a = r.account.ok_or_else(|| Status::invalid_argument("missing account"))?;
        let account = crate::model::Account {
            name: a.name,
            parent: (!a.parent.is_empty()).then_some(a.parent),
            shares: a.shares.max(1),
            users: a.users.into_iter().collect(),
            limits: crate::model::AssocLimits {
                max_jobs: a.max_jobs,
                grp_gpus: a.grp_gpus,
                grp_cpus: a.grp_cpus,
                max_wall_s: a.max_wall_s,
                grp_mem_mb: a.grp_mem_mb,
                grp_nodes: a.grp_nodes,
                grp_gpus_by_type: a.grp_gpus_by_type.into_iter().collect(),
            },
        };
        match self.core.write(Command::UpsertAccount { account, now: now_ms() }).await.map_err(write_status)?.1 {
            Applied::Rejected(rej) => Err(convert::rejection_status(&rej)),
            _ => Ok(Response::new(AdminResponse {})),
        }
    }

    async fn upsert_qos(&self, req: Request<UpsertQosRequest>) -> Result<Response<AdminResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.upsert_qos(forwarded(req.into_inner())).await);
        }
        let r = req.into_inner();
        require_root(&r.user)?;
        let q = r.qos.ok_or_else(|| Status::invalid_argument("missing qos"))?;
        if q.name.is_empty() {
            return Err(Status::invalid_argument("invalid qos: empty name"));
        }
        let qos = crate::model::Qos {
            name: q.name,
            priority: q.priority,
            max_wall_s: q.max_wall_s,
            max_gpus_per_user: q.max_gpus_per_user,
            max_jobs_per_user: q.max_jobs_per_user,
        };
        self.core.write(Command::UpsertQos { qos, now: now_ms() }).await.map_err(write_status)?;
        Ok(Response::new(AdminResponse {}))
    }

    async fn set_nodes_drained(&self, req: Request<SetNodesDrainedRequest>) -> Result<Response<AdminResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.set_nodes_drained(forwarded(req.into_inner())).await);
        }
        let r = req.into_inner();
        require_root(&r.user)?;
        let nodes: Vec<String> = r.nodes.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
        if nodes.is_empty() {
            return Err(Status::invalid_argument("name at least one node"));
        }
        let drain = match (r.drain, r.reason.trim()) {
            (true, "") => {
                return Err(Status::invalid_argument("a drain needs a reason (--reason), shown in quorum nodes"))
            }
            (true, reason) => Some(reason.to_string()),
            (false, _) => None,
        };
        match self.core.write(Command::SetNodesDrained { nodes, drain, now: now_ms() }).await.map_err(write_status)?.1 {
            Applied::Ok => Ok(Response::new(AdminResponse {})),
            Applied::Rejected(r) => Err(convert::rejection_status(&r)),
            other => Err(Status::internal(format!("unexpected answer to a drain: {other:?}"))),
        }
    }

    async fn submit_job(&self, req: Request<SubmitJobRequest>) -> Result<Response<SubmitJobResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.submit_job(forwarded(req.into_inner())).await);
        }
        let r = req.into_inner();
        let spec = r.spec.ok_or_else(|| Status::invalid_argument("missing job spec"))?;
        let spec = convert::spec_from_proto(spec).map_err(|e| convert::rejection_status(&e))?;
        spec.check_shape().map_err(|e| convert::rejection_status(&e))?;
        if r.user.is_empty() {
            return Err(Status::invalid_argument("missing user"));
        }
        let submit = Submit { spec: Box::new(spec), user: r.user, request_id: r.request_id };
        match self.submits.write(submit).await? {
            Applied::Submitted { job_id, duplicate } => Ok(Response::new(SubmitJobResponse { job_id, duplicate })),
            Applied::Rejected(r) => Err(convert::rejection_status(&r)),
            other => Err(Status::internal(format!("unexpected answer to a submit: {other:?}"))),
        }
    }

    async fn job_logs(&self, req: Request<JobLogsRequest>) -> Result<Response<JobLogsResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.job_logs(forwarded(req.into_inner())).await);
        }
        super::logs::job_logs(&self.core, req.into_inner()).await.map(Response::new)
    }

    async fn inject_gpu_fault(&self, req: Request<GpuFaultRequest>) -> Result<Response<GpuFaultResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.inject_gpu_fault(forwarded(req.into_inner())).await);
        }
        let r = req.into_inner();
        require_root(&r.user)?;
        crate::model::gpu_fault::parse_fault(&r.kind).map_err(Status::invalid_argument)?;
        {
            let applied = self.core.shared.read();
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
        if !self.core.hub.gpu_fault(&r.node, r.gpu, &r.kind) {
            return Err(Status::unavailable(format!("node {} has no agent connected", r.node)));
        }
        Ok(Response::new(GpuFaultResponse {}))
    }

    async fn cancel_job(&self, req: Request<CancelJobRequest>) -> Result<Response<CancelJobResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.cancel_job(forwarded(req.into_inner())).await);
        }
        let r = req.into_inner();
        if r.user.is_empty() {
            return Err(Status::invalid_argument("missing user"));
        }
        if !r.signal.is_empty() {
            return self.signal_jobs(r).await;
        }
        let mut results = Vec::new();
        let targets = {
            let applied = self.core.shared.read();
            let is_array =
                |id: u64| applied.state.jobs.get(&id).and_then(|j| j.array).is_some_and(|a| a.array_job_id == id);
            let whole = r.job_ids.iter().map(|&id| (id, is_array(id)));
            whole.chain(r.task_job_ids.iter().map(|&id| (id, false))).collect::<Vec<_>>()
        };
        for (job_id, whole_array) in targets {
            let command = Command::CancelJob { job_id, user: r.user.clone(), now: now_ms(), whole_array };
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
        if !req.get_ref().stale {
            if let Some(addr) = self.forward_target(&req)? {
                return with_leader_hint(&addr, self.client(&addr)?.get_job(forwarded(req.into_inner())).await);
            }
        }
        let GetJobRequest { job_id, stale, array_task_id } = req.into_inner();
        self.read_barrier(stale).await?;
        let applied = self.core.shared.read();
        let job = match array_task_id {
            None => applied
                .state
                .jobs
                .get(&job_id)
                .ok_or_else(|| Status::not_found(format!("job {job_id} does not exist")))?,
            Some(task) => array_task(&applied.state, job_id, task)?,
        };
        Ok(Response::new(GetJobResponse {
            job: Some(convert::job_to_proto(job, true)),
            applied_index: applied.applied_index(),
        }))
    }

    async fn list_jobs(&self, req: Request<ListJobsRequest>) -> Result<Response<ListJobsResponse>, Status> {
        if !req.get_ref().stale {
            if let Some(addr) = self.forward_target(&req)? {
                return with_leader_hint(&addr, self.client(&addr)?.list_jobs(forwarded(req.into_inner())).await);
            }
        }
        let r = req.into_inner();
        let mut states = Vec::new();
        for s in &r.states {
            states.push(
                JobState::from_name(s).ok_or_else(|| Status::invalid_argument(format!("unknown job state '{s}'")))?,
            );
        }
        self.read_barrier(r.stale).await?;
        let estimates = self.core.estimates.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let applied = self.core.shared.read();
        let jobs = applied
            .state
            .jobs
            .values()
            .filter(|j| states.is_empty() || states.contains(&j.state))
            .filter(|j| r.user.is_empty() || j.user == r.user)
            .map(|j| {
                let mut info = convert::job_to_proto(j, false);
                if let Some(e) = estimates.get(&j.id).filter(|_| j.state == JobState::Pending) {
                    info.expected_start_ms = e.start_ms;
                    info.expected_nodes = crate::model::hostlist::compress(&e.nodes);
                }
                info
            })
            .collect();
        Ok(Response::new(ListJobsResponse { jobs, applied_index: applied.applied_index(), now_ms: now_ms() }))
    }

    async fn list_nodes(&self, req: Request<ListNodesRequest>) -> Result<Response<ListNodesResponse>, Status> {
        if !req.get_ref().stale {
            if let Some(addr) = self.forward_target(&req)? {
                return with_leader_hint(&addr, self.client(&addr)?.list_nodes(forwarded(req.into_inner())).await);
            }
        }
        self.read_barrier(req.get_ref().stale).await?;
        let applied = self.core.shared.read();
        let nodes = applied
            .state
            .nodes
            .values()
            .map(|n| convert::node_to_proto(n, applied.state.partitions_of(&n.name), self.core.hub.agent(&n.name)))
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
            feature_level: self.core.feature_level,
            cluster_level: self.core.shared.read().state.cluster_level(),
            started_at_ms: self.core.started_at_ms,
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

    async fn digest(&self, req: Request<DigestRequest>) -> Result<Response<DigestResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.digest(forwarded(req.into_inner())).await);
        }
        match self.core.write(Command::Digest { now: now_ms() }).await.map_err(write_status)? {
            (index, Applied::Digest { digest }) => Ok(Response::new(DigestResponse { index, digest })),
            (_, other) => Err(Status::internal(format!("unexpected answer to a digest point: {other:?}"))),
        }
    }

    async fn transfer_leader(
        &self,
        req: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.transfer_leader(forwarded(req.into_inner())).await);
        }
        let r = req.into_inner();
        require_root(&r.user)?;
        let Ok(_guard) = self.core.membership_change.try_lock() else {
            return Err(Status::failed_precondition(
                "cannot transfer leadership: a membership change is in progress; wait for it to finish",
            ));
        };
        let leader = self
            .core
            .transfer_leadership((r.to != 0).then_some(r.to))
            .await
            .map_err(|e| Status::failed_precondition(format!("cannot transfer leadership: {e}")))?;
        Ok(Response::new(TransferLeaderResponse { leader }))
    }

    async fn campaign(&self, _req: Request<CampaignRequest>) -> Result<Response<CampaignResponse>, Status> {
        self.core.campaign();
        Ok(Response::new(CampaignResponse {}))
    }

    async fn add_replica(
        &self,
        req: Request<MembershipChangeRequest>,
    ) -> Result<Response<MembershipChangeResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.add_replica(forwarded(req.into_inner())).await);
        }
        let r = req.into_inner();
        require_root(&r.user)?;
        if r.id == 0 || r.addr.trim().is_empty() {
            return Err(Status::invalid_argument("add-replica needs an id above 0 and an address host:port"));
        }
        let (voters, _, _) = self.membership();
        if voters.contains(&r.id) {
            return Err(Status::already_exists(format!("replica {} is already a voter", r.id)));
        }
        let what = format!("add replica {} at {}", r.id, r.addr);
        self.one_change(&what, || async {
            tracing::info!(id = r.id, addr = %r.addr, "adding a replica: as a learner until it has caught up");
            self.core
                .raft
                .add_learner(r.id, openraft::BasicNode::new(r.addr.trim()), false)
                .await
                .map_err(membership_status)?;
            let started = std::time::Instant::now();
            self.core.wait_replicated(r.id, UpTo::Start, CATCH_UP_LIMIT).await.map_err(|(matched, wanted)| {
                Status::deadline_exceeded(format!(
                    "replica {} has not caught up within {}s (it has {matched} of {wanted} entries); it stays a learner: check that it runs and that the leader can reach it, then add it again or remove it",
                    r.id,
                    CATCH_UP_LIMIT.as_secs()
                ))
            })?;
            tracing::info!(id = r.id, elapsed_ms = started.elapsed().as_millis() as u64, "learner caught up");
            // A voter of an older release would lower the cluster's level after commands above
            // its level may already be in the log: refuse it.
            let asked = tokio::time::timeout(
                std::time::Duration::from_secs(1),
                self.client(r.addr.trim())?.get_replica_status(ReplicaStatusRequest {}),
            )
            .await;
            let runs = match asked {
                Ok(Ok(s)) => {
                    let s = s.into_inner();
                    Some(crate::leader::versions::reported(s.feature_level, s.version))
                }
                _ => None,
            };
            let cluster = self.core.shared.read().state.cluster_level();
            match runs {
                Some(v) if v.level >= cluster => {}
                Some(v) => {
                    return Err(Status::failed_precondition(format!(
                        "replica {} runs {} (feature level {}) but the cluster is at level {cluster}: it could not apply what the log holds; start it with this release. It stays a learner until then: remove it or add it again",
                        r.id, v.version, v.level
                    )))
                }
                None => {
                    return Err(Status::unavailable(format!(
                        "replica {} caught up but does not answer what it runs; it stays a learner: add it again",
                        r.id
                    )))
                }
            }
            let mut voters = self.membership().0;
            voters.insert(r.id);
            self.core.raft.change_membership(voters, false).await.map_err(membership_status)?;
            tracing::info!(id = r.id, "replica added as a voter");
            Ok(())
        })
        .await
    }

    async fn remove_replica(
        &self,
        req: Request<MembershipChangeRequest>,
    ) -> Result<Response<MembershipChangeResponse>, Status> {
        if let Some(addr) = self.forward_target(&req)? {
            return with_leader_hint(&addr, self.client(&addr)?.remove_replica(forwarded(req.into_inner())).await);
        }
        let r = req.into_inner();
        require_root(&r.user)?;
        let (mut voters, learners, _) = self.membership();
        if !voters.contains(&r.id) && !learners.contains(&r.id) {
            return Err(Status::not_found(format!(
                "replica {} is not a member (voters: {})",
                r.id,
                voters.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
            )));
        }
        if voters.len() == 1 && voters.contains(&r.id) {
            return Err(Status::failed_precondition(format!("replica {} is the last voter", r.id)));
        }
        let what = format!("remove replica {}", r.id);
        self.one_change(&what, || async {
            voters.remove(&r.id);
            self.core.raft.change_membership(voters, false).await.map_err(membership_status)?;
            tracing::info!(id = r.id, "replica removed");
            Ok(())
        })
        .await
    }

    async fn replica_digest(
        &self,
        req: Request<ReplicaDigestRequest>,
    ) -> Result<Response<ReplicaDigestResponse>, Status> {
        let index = req.into_inner().index;
        let mut applied = self.core.shared.applied_index.subscribe();
        let reached =
            tokio::time::timeout(DIGEST_WAIT, applied.wait_for(|a| *a >= index)).await.is_ok_and(|r| r.is_ok());
        if !reached {
            let at = *applied.borrow();
            return Err(Status::deadline_exceeded(format!(
                "replica {} has applied up to {at}, not yet the digest point {index}",
                self.core.id
            )));
        }
        let digest = self.core.shared.digest_at(index).ok_or_else(|| {
            Status::not_found(format!(
                "replica {} took no digest at {index} (it installed a snapshot past it, or the point is old); run it again",
                self.core.id
            ))
        })?;
        Ok(Response::new(ReplicaDigestResponse { id: self.core.id, index, digest }))
    }
}

impl Api {
    /// `quorum cancel --signal`: signals each running job on every node of its allocation, after
    /// a linearizable read; per-job results like a cancel.
    async fn signal_jobs(&self, r: CancelJobRequest) -> Result<Response<CancelJobResponse>, Status> {
        let signal = crate::model::parse_signal(&r.signal).map_err(Status::invalid_argument)?;
        self.core.linearizable().await.map_err(write_status)?;
        let mut results = Vec::new();
        for job_id in r.job_ids.iter().chain(&r.task_job_ids).copied() {
            let target = {
                let applied = self.core.shared.read();
                match applied.state.jobs.get(&job_id) {
                    None => Err(format!("job {job_id} does not exist")),
                    Some(j) if j.user != r.user && r.user != "root" => {
                        Err(format!("user '{}' may not signal job {job_id} of user '{}'", r.user, j.user))
                    }
                    Some(j) if j.state != crate::model::JobState::Running => {
                        Err(format!("job {job_id} is not running ({})", j.state.name()))
                    }
                    Some(j) => Ok((
                        j.alloc_index,
                        j.allocation.as_ref().map(|a| a.nodes.iter().map(|n| n.node.clone()).collect::<Vec<_>>()),
                    )),
                }
            };
            let result = match target {
                Ok((token, Some(nodes))) => {
                    let missed: Vec<String> =
                        nodes.into_iter().filter(|n| !self.core.hub.signal(n, job_id, token, signal)).collect();
                    if missed.is_empty() {
                        CancelResult { job_id, ok: true, error: String::new() }
                    } else {
                        CancelResult { job_id, ok: false, error: format!("no agent connected on {}", missed.join(",")) }
                    }
                }
                Ok((_, None)) => CancelResult { job_id, ok: false, error: format!("job {job_id} has no allocation") },
                Err(error) => CancelResult { job_id, ok: false, error },
            };
            results.push(result);
        }
        Ok(Response::new(CancelJobResponse { results }))
    }

    /// The current voters and learners, and whether a change is half done (joint config).
    fn membership(&self) -> (std::collections::BTreeSet<u64>, Vec<u64>, bool) {
        let metrics = self.core.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        (membership.voter_ids().collect(), membership.learner_ids().collect(), membership.get_joint_config().len() > 1)
    }

    fn members_response(&self) -> MembershipChangeResponse {
        let metrics = self.core.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        let members = membership
            .voter_ids()
            .filter_map(|id| membership.get_node(&id).map(|n| (id, n.addr.clone())))
            .map(|(id, address)| ReplicaStatus { id, address, role: "voter".into(), ..Default::default() })
            .collect();
        MembershipChangeResponse { members }
    }

    /// A default read waits until this replica, as the confirmed leader, has applied everything
    /// committed before it; a stale read answers from what this replica has applied.
    async fn read_barrier(&self, stale: bool) -> Result<(), Status> {
        if stale {
            return Ok(());
        }
        self.core.linearizable().await.map_err(write_status)
    }

    /// Runs `change` as the only membership change in progress, or refuses.
    async fn one_change<F, Fut>(&self, what: &str, change: F) -> Result<Response<MembershipChangeResponse>, Status>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(), Status>>,
    {
        let Ok(_guard) = self.core.membership_change.try_lock() else {
            return Err(Status::failed_precondition(format!(
                "cannot {what}: another membership change is in progress; wait for it to finish"
            )));
        };
        if self.membership().2 {
            return Err(Status::failed_precondition(format!(
                "cannot {what}: the cluster is between two memberships (a change was interrupted); retry shortly"
            )));
        }
        change().await?;
        Ok(Response::new(self.members_response()))
    }
}

fn membership_status(e: impl std::fmt::Display) -> Status {
    Status::aborted(format!("membership change failed: {e}"))
}

/// How long a new replica may take to catch up before it is promoted.
const CATCH_UP_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// How long a replica waits to reach a digest point before saying how far it got.
const DIGEST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use crate::model::parse_signal;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(parse_signal("USR1"), Ok(libc::SIGUSR1));
        assert_eq!(parse_signal("sigterm"), Ok(libc::SIGTERM));
        assert_eq!(parse_signal("9"), Ok(9));
        assert!(parse_signal("0").unwrap_err().contains("unknown signal '0'"));
        assert!(parse_signal("FOO").unwrap_err().contains("one of HUP, INT"));
    }
}
