//! The server side of replica-to-replica traffic: hands each RPC to the local openraft
//! instance and returns its result, error included, serde-encoded.

use openraft::raft::InstallSnapshotRequest;
use openraft::Raft;
use quorum_proto::raft::raft_service_server::{RaftService, RaftServiceServer};
use quorum_proto::raft::{RaftPayload, SnapshotChunk};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::network::MAX_MESSAGE_BYTES;
use crate::QuorumTypeConfig;

/// Serves openraft's RPCs for one replica.
pub struct RaftRpcServer<C: QuorumTypeConfig> {
    raft: Raft<C>,
}

impl<C: QuorumTypeConfig> RaftRpcServer<C> {
    /// The tonic service, ready to add to a router.
    pub fn into_service(raft: Raft<C>) -> RaftServiceServer<Self> {
        RaftServiceServer::new(Self { raft })
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }
}

fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(bytes).map_err(|e| Status::invalid_argument(format!("malformed {what}: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    serde_json::to_vec(value)
        .map(|payload| Response::new(RaftPayload { payload }))
        .map_err(|e| Status::internal(format!("encoding a raft response: {e}")))
}

#[tonic::async_trait]
impl<C: QuorumTypeConfig> RaftService for RaftRpcServer<C> {
    async fn append_entries(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode("append-entries request", &request.into_inner().payload)?;
        encode(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode("vote request", &request.into_inner().payload)?;
        encode(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, request: Request<SnapshotChunk>) -> Result<Response<RaftPayload>, Status> {
        let chunk = request.into_inner();
        let rpc = InstallSnapshotRequest::<C> {
            vote: decode("snapshot vote", &chunk.vote)?,
            meta: decode("snapshot meta", &chunk.meta)?,
            offset: chunk.offset,
            data: chunk.data,
            done: chunk.done,
        };
        encode(&self.raft.install_snapshot(rpc).await)
    }
}
