//! The server side of replica-to-replica traffic: hands each RPC to the local openraft
//! instance and returns its result, error included, serde-encoded. The entries of an
//! append-entries request are also handed to the log store as they came, to be written without
//! encoding them again.

use openraft::raft::InstallSnapshotRequest;
use openraft::Raft;
use quorum_proto::raft::raft_service_server::{RaftService, RaftServiceServer};
use quorum_proto::raft::{RaftPayload, SnapshotChunk};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::log_store::EntryCache;
use crate::network::{decode_append, Isolation, MAX_MESSAGE_BYTES};
use crate::QuorumTypeConfig;

/// When this replica last accepted replication from a leader (an append-entries request that
/// did not carry a stale vote); a follower's view of its leader's liveness.
#[derive(Clone, Debug, Default)]
pub struct LeaderContact(std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>);

impl LeaderContact {
    fn touch(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    }

    /// How long since the last accepted append-entries, if there was one.
    pub fn silent_for(&self) -> Option<std::time::Duration> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).map(|t| t.elapsed())
    }
}

/// Serves openraft's RPCs for one replica.
pub struct RaftRpcServer<C: QuorumTypeConfig> {
    raft: Raft<C>,
    isolation: Isolation,
    contact: LeaderContact,
    cache: EntryCache<C>,
}

impl<C: QuorumTypeConfig> RaftRpcServer<C> {
    /// The tonic service, ready to add to a router; refuses everything while `isolation` is set.
    /// `cache` is the log store's ([`crate::log_store::LogStore::entry_cache`]).
    pub fn into_service(
        raft: Raft<C>,
        isolation: Isolation,
        contact: LeaderContact,
        cache: EntryCache<C>,
    ) -> RaftServiceServer<Self> {
        RaftServiceServer::new(Self { raft, isolation, contact, cache })
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn check(&self) -> Result<(), Status> {
        if self.isolation.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Status::unavailable("isolated (fault injection)"));
        }
        Ok(())
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
        self.check()?;
        let started = std::time::Instant::now();
        let payload = request.into_inner().payload;
        let bytes = payload.len();
        let (rpc, received) = decode_append::<C>(&payload)
            .map_err(|e| Status::invalid_argument(format!("malformed append-entries request: {e}")))?;
        drop(payload);
        // The log store takes these bytes when openraft appends the entries, before the answer;
        // they are let go when this request ends, answered or abandoned.
        let _held = self.cache.receive(received);
        let response = self.raft.append_entries(rpc).await;
        if matches!(&response, Ok(r) if !matches!(r, openraft::raft::AppendEntriesResponse::HigherVote(_))) {
            self.contact.touch();
        }
        if bytes > 1 << 20 {
            // What bounds the leader's heartbeat interval: shipping, decoding and storing the
            // largest requests must fit in it.
            tracing::debug!(bytes, ms = started.elapsed().as_secs_f64() * 1e3, "stored a large append-entries request");
        }
        encode(&response)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.check()?;
        let rpc = decode("vote request", &request.into_inner().payload)?;
        encode(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, request: Request<SnapshotChunk>) -> Result<Response<RaftPayload>, Status> {
        self.check()?;
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
