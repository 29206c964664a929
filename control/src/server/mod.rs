//! The replica's gRPC services on one listener: the public API, the agent stream ([`agents`])
//! and the internal Raft service, which shares the port but not the API.
//!
//! Every replica serves the public API. The leader answers; a follower forwards a request once
//! to the leader it knows ([`forward`]) or answers UNAVAILABLE with the leader's address. Reads
//! are linearizable unless asked `stale`: the leader confirms its leadership with a quorum before
//! reading its applied state. The [`Quorum`] implementation below is only the routing table:
//! each request is answered by its area's module ([`jobs`], [`accounts`], [`nodes`],
//! [`cluster`], [`logs`]).

mod accounts;
pub mod agents;
mod api;
pub mod auth;
mod cluster;
mod cron;
pub mod filter;
#[macro_use]
mod forward;
mod identity;
mod jobs;
pub mod logs;
mod nodes;
mod partitions;
pub mod shown;
mod steps;

use std::sync::Arc;

use quorum_proto::api::quorum_server::{Quorum, QuorumServer};
use quorum_proto::api::*;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::Instrument;

pub use api::{not_leader, rejection_status, write_status, Api};

use crate::faults::Faults;

/// Serves until `stop` turns true.
pub async fn serve(
    api: Arc<Api>,
    faults: Faults,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) -> Result<(), tonic::transport::Error> {
    let (replica, leader, security) = (api.replica.clone(), api.leader.clone(), api.security.clone());
    let authenticator = Arc::new(auth::Authenticator::new(security.clone(), replica.clone()));
    let incoming = quorum_auth::listener::incoming(listener, security.mode, security.server_tls.clone());
    let raft = quorum_raft::service::RaftRpcServer::into_service(
        replica.raft.clone(),
        faults.raft.clone(),
        replica.leader_contact.clone(),
        replica.entry_cache.clone(),
    );
    tonic::transport::Server::builder()
        .layer(auth::AuthLayer(authenticator))
        .add_service(raft)
        .add_service(QuorumServer::from_arc(api).max_decoding_message_size(crate::model::limits::MAX_REQUEST_BYTES))
        .add_service(agents::service(replica, leader, security))
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
}

#[tonic::async_trait]
impl Quorum for Api {
    type RunStepStream = steps::StepStream;
    type BackupStream = cluster::BackupStream;

    async fn backup(&self, req: Request<BackupRequest>) -> Result<Response<Self::BackupStream>, Status> {
        let caller = auth::caller(&req)?;
        cluster::backup(self, &caller).map(Response::new)
    }

    async fn run_step(
        &self,
        req: Request<tonic::Streaming<StepInput>>,
    ) -> Result<Response<Self::RunStepStream>, Status> {
        let caller = auth::caller(&req)?;
        steps::run_step(self, caller, req.into_inner()).await.map(Response::new)
    }

    async fn hold_job(&self, req: Request<HoldJobRequest>) -> Result<Response<HoldJobResponse>, Status> {
        let (caller, r) = at_leader!(self, req, hold_job);
        jobs::hold_job(self, &caller, r).await.map(Response::new)
    }

    async fn update_job(&self, req: Request<UpdateJobRequest>) -> Result<Response<UpdateJobResponse>, Status> {
        let (caller, r) = at_leader!(self, req, update_job);
        jobs::update_job(self, &caller, r).await.map(Response::new)
    }

    async fn priorities(&self, req: Request<PriorityRequest>) -> Result<Response<PriorityResponse>, Status> {
        let (caller, r) = at_leader!(self, req, priorities);
        jobs::priorities(self, &caller, r).await.map(Response::new)
    }

    async fn shares(&self, req: Request<SharesRequest>) -> Result<Response<SharesResponse>, Status> {
        let (caller, r) = at_leader!(self, req, shares);
        accounts::shares(self, &caller, r).await.map(Response::new)
    }

    async fn list_accounts(&self, req: Request<ListAccountsRequest>) -> Result<Response<ListAccountsResponse>, Status> {
        let (caller, r) = at_leader!(self, req, list_accounts);
        accounts::list_accounts(self, &caller, r).await.map(Response::new)
    }

    async fn config(&self, req: Request<ConfigRequest>) -> Result<Response<ConfigResponse>, Status> {
        let (_caller, _r) = at_leader!(self, req, config);
        let policy = self.replica.shared.read().state.policy.clone();
        let entries =
            shown::merged(&self.shown_config, &policy).into_iter().map(|(key, value)| ConfigEntry { key, value });
        Ok(Response::new(ConfigResponse { entries: entries.collect() }))
    }

    async fn upsert_account(&self, req: Request<UpsertAccountRequest>) -> Result<Response<AdminResponse>, Status> {
        let (caller, r) = at_leader!(self, req, upsert_account);
        accounts::upsert_account(self, &caller, r).await.map(Response::new)
    }

    async fn upsert_qos(&self, req: Request<UpsertQosRequest>) -> Result<Response<AdminResponse>, Status> {
        let (caller, r) = at_leader!(self, req, upsert_qos);
        accounts::upsert_qos(self, &caller, r).await.map(Response::new)
    }

    async fn create_reservation(
        &self,
        req: Request<ReservationRequest>,
    ) -> Result<Response<ReservationResponse>, Status> {
        let (caller, r) = at_leader!(self, req, create_reservation);
        nodes::reserve(self, &caller, r, false).await.map(Response::new)
    }

    async fn update_reservation(
        &self,
        req: Request<ReservationRequest>,
    ) -> Result<Response<ReservationResponse>, Status> {
        let (caller, r) = at_leader!(self, req, update_reservation);
        nodes::reserve(self, &caller, r, true).await.map(Response::new)
    }

    async fn delete_reservation(
        &self,
        req: Request<DeleteReservationRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let (caller, r) = at_leader!(self, req, delete_reservation);
        nodes::delete_reservation(self, &caller, r).await.map(Response::new)
    }

    async fn add_cron(&self, req: Request<AddCronRequest>) -> Result<Response<AddCronResponse>, Status> {
        let (caller, r) = at_leader!(self, req, add_cron);
        cron::add_cron(self, &caller, r).await.map(Response::new)
    }

    async fn list_cron(&self, req: Request<ListCronRequest>) -> Result<Response<ListCronResponse>, Status> {
        let (caller, r) = at_leader!(self, req, list_cron, unless_stale);
        cron::list_cron(self, &caller, r).await.map(Response::new)
    }

    async fn remove_cron(&self, req: Request<RemoveCronRequest>) -> Result<Response<AdminResponse>, Status> {
        let (caller, r) = at_leader!(self, req, remove_cron);
        cron::remove_cron(self, &caller, r).await.map(Response::new)
    }

    async fn set_nodes_drained(&self, req: Request<SetNodesDrainedRequest>) -> Result<Response<AdminResponse>, Status> {
        let (caller, r) = at_leader!(self, req, set_nodes_drained);
        nodes::set_nodes_drained(self, &caller, r).await.map(Response::new)
    }

    async fn put_partition(&self, req: Request<PutPartitionRequest>) -> Result<Response<AdminResponse>, Status> {
        let (caller, r) = at_leader!(self, req, put_partition);
        partitions::put_partition(self, &caller, r).await.map(Response::new)
    }

    async fn delete_partition(&self, req: Request<DeletePartitionRequest>) -> Result<Response<AdminResponse>, Status> {
        let (caller, r) = at_leader!(self, req, delete_partition);
        partitions::delete_partition(self, &caller, r).await.map(Response::new)
    }

    async fn update_nodes(&self, req: Request<UpdateNodesRequest>) -> Result<Response<UpdateNodesResponse>, Status> {
        let (caller, r) = at_leader!(self, req, update_nodes);
        partitions::update_nodes(self, &caller, r).await.map(Response::new)
    }

    async fn cluster_config(
        &self,
        req: Request<ClusterConfigRequest>,
    ) -> Result<Response<ClusterConfigResponse>, Status> {
        let (caller, r) = at_leader!(self, req, cluster_config);
        partitions::cluster_config(self, &caller, r).await.map(Response::new)
    }

    async fn submit_job(&self, req: Request<SubmitJobRequest>) -> Result<Response<SubmitJobResponse>, Status> {
        // One submit is one trace: it continues the client's (or the forwarding follower's).
        let span = tracing::info_span!("submit", job_id = tracing::field::Empty, replica = self.replica.id);
        quorum_proto::telemetry::continue_trace(&span, quorum_proto::telemetry::traceparent_of(req.metadata()));
        let answer = async move {
            let (caller, r) = at_leader!(self, req, submit_job);
            let arrived = std::time::Instant::now();
            let answer = jobs::submit_job(self, &caller, r).await.map(Response::new);
            self.leader.stats.submit_seconds.observe(arrived.elapsed().as_secs_f64());
            answer
        }
        .instrument(span.clone())
        .await;
        // Here too when a follower forwarded it: the leader's answer names the job.
        if let Ok(submitted) = &answer {
            span.record("job_id", submitted.get_ref().job_id);
        }
        answer
    }

    async fn job_logs(&self, req: Request<JobLogsRequest>) -> Result<Response<JobLogsResponse>, Status> {
        let (caller, r) = at_leader!(self, req, job_logs);
        logs::job_logs(self, &caller, r).await.map(Response::new)
    }

    async fn job_usage(&self, req: Request<JobUsageRequest>) -> Result<Response<JobUsageResponse>, Status> {
        let (caller, r) = at_leader!(self, req, job_usage);
        logs::job_usage(self, &caller, r).await.map(Response::new)
    }

    async fn inject_gpu_fault(&self, req: Request<GpuFaultRequest>) -> Result<Response<GpuFaultResponse>, Status> {
        let (caller, r) = at_leader!(self, req, inject_gpu_fault);
        nodes::inject_gpu_fault(self, &caller, r).await.map(Response::new)
    }

    async fn cancel_job(&self, req: Request<CancelJobRequest>) -> Result<Response<CancelJobResponse>, Status> {
        let (caller, r) = at_leader!(self, req, cancel_job);
        jobs::cancel_job(self, &caller, r).await.map(Response::new)
    }

    async fn get_job(&self, req: Request<GetJobRequest>) -> Result<Response<GetJobResponse>, Status> {
        let (caller, r) = at_leader!(self, req, get_job, unless_stale);
        jobs::get_job(self, &caller, r).await.map(Response::new)
    }

    async fn list_jobs(&self, req: Request<ListJobsRequest>) -> Result<Response<ListJobsResponse>, Status> {
        let (caller, r) = at_leader!(self, req, list_jobs, unless_stale);
        jobs::list_jobs(self, &caller, r).await.map(Response::new)
    }

    async fn list_nodes(&self, req: Request<ListNodesRequest>) -> Result<Response<ListNodesResponse>, Status> {
        let (caller, r) = at_leader!(self, req, list_nodes, unless_stale);
        nodes::list_nodes(self, &caller, r).await.map(Response::new)
    }

    async fn get_replica_status(&self, req: Request<ReplicaStatusRequest>) -> Result<Response<ReplicaStatus>, Status> {
        let caller = auth::caller(&req)?;
        let r = req.into_inner();
        cluster::get_replica_status(self, &caller, r).await.map(Response::new)
    }

    async fn cluster_members(
        &self,
        req: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusResponse>, Status> {
        let caller = auth::caller(&req)?;
        let r = req.into_inner();
        cluster::cluster_members(self, &caller, r).await.map(Response::new)
    }

    async fn digest(&self, req: Request<DigestRequest>) -> Result<Response<DigestResponse>, Status> {
        let (caller, r) = at_leader!(self, req, digest);
        cluster::digest(self, &caller, r).await.map(Response::new)
    }

    async fn transfer_leader(
        &self,
        req: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        let (caller, r) = at_leader!(self, req, transfer_leader);
        cluster::transfer_leader(self, &caller, r).await.map(Response::new)
    }

    async fn history_page(&self, req: Request<HistoryPageRequest>) -> Result<Response<HistoryPageResponse>, Status> {
        let _replica = auth::caller(&req)?;
        cluster::history_page(self, req.into_inner()).await.map(Response::new)
    }

    async fn follow_history(
        &self,
        req: Request<FollowHistoryRequest>,
    ) -> Result<Response<FollowHistoryResponse>, Status> {
        let caller = auth::caller(&req)?;
        cluster::follow_history(self, &caller, req.into_inner()).await.map(Response::new)
    }

    async fn campaign(&self, req: Request<CampaignRequest>) -> Result<Response<CampaignResponse>, Status> {
        let caller = auth::caller(&req)?;
        let r = req.into_inner();
        cluster::campaign(self, &caller, r).await.map(Response::new)
    }

    async fn add_replica(
        &self,
        req: Request<MembershipChangeRequest>,
    ) -> Result<Response<MembershipChangeResponse>, Status> {
        let (caller, r) = at_leader!(self, req, add_replica);
        cluster::add_replica(self, &caller, r).await.map(Response::new)
    }

    async fn remove_replica(
        &self,
        req: Request<MembershipChangeRequest>,
    ) -> Result<Response<MembershipChangeResponse>, Status> {
        let (caller, r) = at_leader!(self, req, remove_replica);
        cluster::remove_replica(self, &caller, r).await.map(Response::new)
    }

    async fn replica_digest(
        &self,
        req: Request<ReplicaDigestRequest>,
    ) -> Result<Response<ReplicaDigestResponse>, Status> {
        let caller = auth::caller(&req)?;
        let r = req.into_inner();
        cluster::replica_digest(self, &caller, r).await.map(Response::new)
    }

    async fn issue_token(&self, req: Request<IssueTokenRequest>) -> Result<Response<IssueTokenResponse>, Status> {
        let caller = auth::caller(&req)?;
        let r = req.into_inner();
        identity::issue_token(self, &caller, r).map(Response::new)
    }

    async fn set_role(&self, req: Request<SetRoleRequest>) -> Result<Response<SetRoleResponse>, Status> {
        let (caller, r) = at_leader!(self, req, set_role);
        identity::set_role(self, &caller, r).await.map(Response::new)
    }

    async fn who_am_i(&self, req: Request<WhoAmIRequest>) -> Result<Response<WhoAmIResponse>, Status> {
        let caller = auth::caller(&req)?;
        Ok(Response::new(identity::who_am_i(&caller)))
    }
}

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
