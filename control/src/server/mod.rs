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
mod cluster;
#[macro_use]
mod forward;
mod jobs;
pub mod logs;
mod nodes;

use std::sync::Arc;

use quorum_proto::api::quorum_server::{Quorum, QuorumServer};
use quorum_proto::api::*;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

pub use api::{not_leader, rejection_status, write_status};

use crate::faults::Faults;
use crate::leader::LeaderState;
use crate::replica::Replica;
use api::Api;

/// The connections `listener` accepts, with TCP_NODELAY. Server::tcp_nodelay only applies to
/// the sockets `serve` accepts itself, and ours come from a listener bound by the caller. Without
/// it Nagle's algorithm and the peer's delayed ACK hold a small answer on a new connection for
/// 40 ms.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Serves until `stop` turns true.
pub async fn serve(
    replica: Arc<Replica>,
    leader: Arc<LeaderState>,
    faults: Faults,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) -> Result<(), tonic::transport::Error> {
    let raft = quorum_raft::service::RaftRpcServer::into_service(
        replica.raft.clone(),
        faults.raft.clone(),
        replica.leader_contact.clone(),
        replica.entry_cache.clone(),
    );
    tonic::transport::Server::builder()
        .add_service(raft)
        .add_service(QuorumServer::new(Api::new(replica.clone(), leader.clone())))
        .add_service(agents::service(replica, leader))
        .serve_with_incoming_shutdown(incoming(listener), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
}

#[tonic::async_trait]
impl Quorum for Api {
    async fn hold_job(&self, req: Request<HoldJobRequest>) -> Result<Response<HoldJobResponse>, Status> {
        let r = at_leader!(self, req, hold_job);
        jobs::hold_job(self, r).await.map(Response::new)
    }

    async fn priorities(&self, req: Request<PriorityRequest>) -> Result<Response<PriorityResponse>, Status> {
        let r = at_leader!(self, req, priorities);
        jobs::priorities(self, r).await.map(Response::new)
    }

    async fn shares(&self, req: Request<SharesRequest>) -> Result<Response<SharesResponse>, Status> {
        let r = at_leader!(self, req, shares);
        accounts::shares(self, r).await.map(Response::new)
    }

    async fn upsert_account(&self, req: Request<UpsertAccountRequest>) -> Result<Response<AdminResponse>, Status> {
        let r = at_leader!(self, req, upsert_account);
        accounts::upsert_account(self, r).await.map(Response::new)
    }

    async fn upsert_qos(&self, req: Request<UpsertQosRequest>) -> Result<Response<AdminResponse>, Status> {
        let r = at_leader!(self, req, upsert_qos);
        accounts::upsert_qos(self, r).await.map(Response::new)
    }

    async fn set_nodes_drained(&self, req: Request<SetNodesDrainedRequest>) -> Result<Response<AdminResponse>, Status> {
        let r = at_leader!(self, req, set_nodes_drained);
        nodes::set_nodes_drained(self, r).await.map(Response::new)
    }

    async fn submit_job(&self, req: Request<SubmitJobRequest>) -> Result<Response<SubmitJobResponse>, Status> {
        let r = at_leader!(self, req, submit_job);
        jobs::submit_job(self, r).await.map(Response::new)
    }

    async fn job_logs(&self, req: Request<JobLogsRequest>) -> Result<Response<JobLogsResponse>, Status> {
        let r = at_leader!(self, req, job_logs);
        logs::job_logs(self, r).await.map(Response::new)
    }

    async fn inject_gpu_fault(&self, req: Request<GpuFaultRequest>) -> Result<Response<GpuFaultResponse>, Status> {
        let r = at_leader!(self, req, inject_gpu_fault);
        nodes::inject_gpu_fault(self, r).await.map(Response::new)
    }

    async fn cancel_job(&self, req: Request<CancelJobRequest>) -> Result<Response<CancelJobResponse>, Status> {
        let r = at_leader!(self, req, cancel_job);
        jobs::cancel_job(self, r).await.map(Response::new)
    }

    async fn get_job(&self, req: Request<GetJobRequest>) -> Result<Response<GetJobResponse>, Status> {
        let r = at_leader!(self, req, get_job, unless_stale);
        jobs::get_job(self, r).await.map(Response::new)
    }

    async fn list_jobs(&self, req: Request<ListJobsRequest>) -> Result<Response<ListJobsResponse>, Status> {
        let r = at_leader!(self, req, list_jobs, unless_stale);
        jobs::list_jobs(self, r).await.map(Response::new)
    }

    async fn list_nodes(&self, req: Request<ListNodesRequest>) -> Result<Response<ListNodesResponse>, Status> {
        let r = at_leader!(self, req, list_nodes, unless_stale);
        nodes::list_nodes(self, r).await.map(Response::new)
    }

    async fn get_replica_status(&self, req: Request<ReplicaStatusRequest>) -> Result<Response<ReplicaStatus>, Status> {
        let r = req.into_inner();
        cluster::get_replica_status(self, r).await.map(Response::new)
    }

    async fn cluster_members(
        &self,
        req: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusResponse>, Status> {
        let r = req.into_inner();
        cluster::cluster_members(self, r).await.map(Response::new)
    }

    async fn digest(&self, req: Request<DigestRequest>) -> Result<Response<DigestResponse>, Status> {
        let r = at_leader!(self, req, digest);
        cluster::digest(self, r).await.map(Response::new)
    }

    async fn transfer_leader(
        &self,
        req: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        let r = at_leader!(self, req, transfer_leader);
        cluster::transfer_leader(self, r).await.map(Response::new)
    }

    async fn campaign(&self, req: Request<CampaignRequest>) -> Result<Response<CampaignResponse>, Status> {
        let r = req.into_inner();
        cluster::campaign(self, r).await.map(Response::new)
    }

    async fn add_replica(
        &self,
        req: Request<MembershipChangeRequest>,
    ) -> Result<Response<MembershipChangeResponse>, Status> {
        let r = at_leader!(self, req, add_replica);
        cluster::add_replica(self, r).await.map(Response::new)
    }

    async fn remove_replica(
        &self,
        req: Request<MembershipChangeRequest>,
    ) -> Result<Response<MembershipChangeResponse>, Status> {
        let r = at_leader!(self, req, remove_replica);
        cluster::remove_replica(self, r).await.map(Response::new)
    }

    async fn replica_digest(
        &self,
        req: Request<ReplicaDigestRequest>,
    ) -> Result<Response<ReplicaDigestResponse>, Status> {
        let r = req.into_inner();
        cluster::replica_digest(self, r).await.map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use crate::model::parse_signal;

    #[tokio::test]
    async fn accepted_connections_send_small_answers_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = super::incoming(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.nodelay().unwrap(), "an accepted connection must have TCP_NODELAY");
    }

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(parse_signal("USR1"), Ok(libc::SIGUSR1));
        assert_eq!(parse_signal("sigterm"), Ok(libc::SIGTERM));
        assert_eq!(parse_signal("9"), Ok(9));
        assert!(parse_signal("0").unwrap_err().contains("unknown signal '0'"));
        assert!(parse_signal("FOO").unwrap_err().contains("one of HUP, INT"));
    }
}
