//! The client side of replica-to-replica traffic: openraft's RPCs sent over tonic.
//!
//! Requests are serde-encoded into [`RaftPayload`]; a remote `RaftError` comes back inside the
//! payload and becomes `RPCError::RemoteError`. A replica that cannot be reached becomes
//! `Unreachable`, so that openraft backs off (half a second) before retrying; one that was
//! reached but did not answer within the RPC's deadline is only a `Network` error, retried at
//! once, as openraft treats its own timeouts. Backing off from a replica that is merely slow
//! (a follower's fsync behind a busy disk) silenced the leader's heartbeats to it for longer
//! than an election timeout, and every slow fsync became an election.

use std::marker::PhantomData;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use quorum_proto::raft::raft_service_client::RaftServiceClient;
use quorum_proto::raft::{RaftPayload, SnapshotChunk};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use crate::QuorumTypeConfig;

/// Largest gRPC message a replica sends or accepts (log batches, snapshot chunks).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Fault injection: while set, a replica's Raft traffic is dropped both ways (what it sends
/// fails as unreachable, what it receives is refused), as a network partition would.
pub type Isolation = std::sync::Arc<std::sync::atomic::AtomicBool>;

/// Builds one [`Connection`] per target replica.
pub struct Network<C> {
    isolation: Isolation,
    _types: PhantomData<C>,
}

impl<C> Default for Network<C> {
    fn default() -> Self {
        Self::new(Isolation::default())
    }
}

impl<C> Network<C> {
    pub fn new(isolation: Isolation) -> Self {
        Self { isolation, _types: PhantomData }
    }
}

impl<C: QuorumTypeConfig> RaftNetworkFactory<C> for Network<C> {
    type Network = Connection<C>;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Self::Network {
        let channel = Endpoint::from_shared(format!("http://{}", node.addr))
            .map(|e| e.connect_timeout(Duration::from_millis(500)).tcp_nodelay(true).connect_lazy());
        Connection {
            isolation: self.isolation.clone(),
            target,
            addr: node.addr.clone(),
            client: channel.ok().map(|c| {
                RaftServiceClient::new(c)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES)
            }),
            _types: PhantomData,
        }
    }
}

/// A lazily connected channel to one replica.
pub struct Connection<C> {
    isolation: Isolation,
    target: u64,
    addr: String,
    client: Option<RaftServiceClient<Channel>>,
    _types: PhantomData<C>,
}

#[derive(Debug, thiserror::Error)]
#[error("replica {target} at {addr}: {message}")]
struct TransportError {
    target: u64,
    addr: String,
    message: String,
}

impl<C: QuorumTypeConfig> Connection<C> {
    fn transport_error(&self, message: impl Into<String>) -> TransportError {
        TransportError { target: self.target, addr: self.addr.clone(), message: message.into() }
    }

    fn client<E: std::error::Error>(&self) -> Result<RaftServiceClient<Channel>, RPCError<u64, BasicNode, E>> {
        if self.isolation.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(RPCError::Unreachable(Unreachable::new(&self.transport_error("isolated (fault injection)"))));
        }
        self.client
            .clone()
            .ok_or_else(|| RPCError::Unreachable(Unreachable::new(&self.transport_error("invalid address"))))
    }

    fn status_error<E: std::error::Error>(&self, status: tonic::Status) -> RPCError<u64, BasicNode, E> {
        let err = self.transport_error(format!("{}: {}", status.code(), status.message()));
        if unreachable(status.code()) {
            RPCError::Unreachable(Unreachable::new(&err))
        } else {
            RPCError::Network(NetworkError::new(&err))
        }
    }

    fn decode<T: DeserializeOwned, E: std::error::Error + DeserializeOwned>(
        &self,
        payload: RaftPayload,
    ) -> Result<T, RPCError<u64, BasicNode, E>> {
        let result: Result<T, E> =
            serde_json::from_slice(&payload.payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

/// Whether a failed RPC means the replica cannot be reached (no connection), as opposed to a
/// deadline passed (tonic reports its own as `Cancelled`) or an error answered.
fn unreachable(code: tonic::Code) -> bool {
    code == tonic::Code::Unavailable
}

fn request<T: Serialize>(value: &T, option: &RPCOption) -> Result<tonic::Request<RaftPayload>, serde_json::Error> {
    let mut req = tonic::Request::new(RaftPayload { payload: serde_json::to_vec(value)? });
    req.set_timeout(option.hard_ttl());
    Ok(req)
}

impl<C: QuorumTypeConfig> RaftNetwork<C> for Connection<C> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<C>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let req = request(&rpc, &option).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let reply = self.client()?.append_entries(req).await.map_err(|s| self.status_error(s))?;
        self.decode(reply.into_inner())
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<C>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>> {
        let encode = |e: serde_json::Error| RPCError::Network(NetworkError::new(&e));
        let mut req = tonic::Request::new(SnapshotChunk {
            vote: serde_json::to_vec(&rpc.vote).map_err(encode)?,
            meta: serde_json::to_vec(&rpc.meta).map_err(encode)?,
            offset: rpc.offset,
            data: rpc.data,
            done: rpc.done,
        });
        req.set_timeout(option.hard_ttl());
        let reply = self.client()?.install_snapshot(req).await.map_err(|s| self.status_error(s))?;
        self.decode(reply.into_inner())
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let req = request(&rpc, &option).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let reply = self.client()?.vote(req).await.map_err(|s| self.status_error(s))?;
        self.decode(reply.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::Cursor;

    openraft::declare_raft_types!(Types: D = String, R = String);

    /// openraft backs off for 500 ms after `Unreachable`, longer than an election timeout: a
    /// deadline missed by a slow follower must not count as unreachable.
    #[tokio::test]
    async fn only_a_replica_without_a_connection_is_unreachable_and_a_missed_deadline_is_not() {
        // Nothing listens on a port just released.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let node = BasicNode::new(format!("127.0.0.1:{port}"));
        let mut conn = Network::<Types>::default().new_client(2, &node).await;
        let vote = VoteRequest { vote: openraft::Vote::new(1, 1), last_log_id: None };
        let err = conn.vote(vote.clone(), RPCOption::new(Duration::from_millis(500))).await.unwrap_err();
        assert!(matches!(err, RPCError::Unreachable(_)), "{err}");

        // A server that accepts the connection and never answers: the deadline passes.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                held.push(sock);
            }
        });
        let mut conn = Network::<Types>::default().new_client(2, &BasicNode::new(addr.to_string())).await;
        let err = conn.vote(vote, RPCOption::new(Duration::from_millis(100))).await.unwrap_err();
        assert!(matches!(err, RPCError::Network(_)), "{err}");
        silent.abort();
    }
}
