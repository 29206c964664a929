//! The client side of replica-to-replica traffic: openraft's RPCs sent over tonic.
//!
//! Requests are serde-encoded into [`RaftPayload`]; a remote `RaftError` comes back inside the
//! payload and becomes `RPCError::RemoteError`. An append-entries request carries each entry as
//! this replica wrote it to its log, from the [`EntryCache`], instead of encoding it once more
//! per follower ([`encode_append`]); the bytes are the ones serde would write.
//!
//! A replica that cannot be reached becomes `Unreachable`, so that openraft backs off (half a
//! second) before retrying; one that was reached but did not answer within the RPC's deadline
//! is only a `Network` error, retried at once, as openraft treats its own timeouts. Backing off from a replica that is merely slow
//! (a follower's fsync behind a busy disk) silenced the leader's heartbeats to it for longer
//! than an election timeout, and every slow fsync became an election.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use openraft::{Entry, LogId, Vote};
use quorum_proto::raft::raft_service_client::RaftServiceClient;
use quorum_proto::raft::{RaftPayload, SnapshotChunk};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use tonic::transport::{Channel, Endpoint};

use crate::log_store::{EntryCache, ReceivedEntry};
use crate::QuorumTypeConfig;

/// Largest gRPC message a replica sends or accepts (log batches, snapshot chunks).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Fault injection: while set, a replica's Raft traffic is dropped both ways (what it sends
/// fails as unreachable, what it receives is refused), as a network partition would.
pub type Isolation = std::sync::Arc<std::sync::atomic::AtomicBool>;

/// Makes the endpoint of a replica at an address (host:port): plaintext, or TLS with this
/// replica's certificate.
pub type Dialer = std::sync::Arc<dyn Fn(&str) -> Result<Endpoint, String> + Send + Sync>;

/// Plaintext endpoints.
pub fn plaintext() -> Dialer {
    std::sync::Arc::new(|addr: &str| Endpoint::from_shared(format!("http://{addr}")).map_err(|e| e.to_string()))
}

/// Builds one [`Connection`] per target replica.
pub struct Network<C: QuorumTypeConfig> {
    isolation: Isolation,
    cache: Option<EntryCache<C>>,
    dialer: Dialer,
}

impl<C: QuorumTypeConfig> Default for Network<C> {
    fn default() -> Self {
        Self::new(Isolation::default(), plaintext())
    }
}

impl<C: QuorumTypeConfig> Network<C> {
    pub fn new(isolation: Isolation, dialer: Dialer) -> Self {
        Self { isolation, cache: None, dialer }
    }

    /// Sends entries as the log store wrote them (see [`crate::log_store::LogStore::entry_cache`]).
    pub fn with_entry_cache(mut self, cache: EntryCache<C>) -> Self {
        self.cache = Some(cache);
        self
    }
}

impl<C: QuorumTypeConfig> RaftNetworkFactory<C> for Network<C> {
    type Network = Connection<C>;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Self::Network {
        let channel = (self.dialer)(&node.addr)
            .map(|e| e.connect_timeout(Duration::from_millis(500)).tcp_nodelay(true).connect_lazy());
        Connection {
            isolation: self.isolation.clone(),
            cache: self.cache.clone(),
            target,
            addr: node.addr.clone(),
            client: channel.ok().map(|c| {
                RaftServiceClient::new(c)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES)
            }),
        }
    }
}

/// A lazily connected channel to one replica.
pub struct Connection<C: QuorumTypeConfig> {
    isolation: Isolation,
    cache: Option<EntryCache<C>>,
    target: u64,
    addr: String,
    client: Option<RaftServiceClient<Channel>>,
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
    Ok(payload_request(serde_json::to_vec(value)?, option))
}

fn payload_request(payload: Vec<u8>, option: &RPCOption) -> tonic::Request<RaftPayload> {
    let mut req = tonic::Request::new(RaftPayload { payload });
    req.set_timeout(option.hard_ttl());
    req
}

/// The most bytes of entries one append-entries request carries (one larger entry goes alone).
/// openraft gives each request one heartbeat interval to be answered, whatever it carries; a
/// request of many large entries that cannot be shipped, decoded and stored in that time was
/// sent again and again, heartbeats to that follower stopped, and elections followed.
pub const MAX_APPEND_BYTES: usize = 2 << 20;

/// An append-entries request as JSON: the bytes `serde_json::to_vec(rpc)` gives, with each entry
/// the cache holds copied as written to the log instead of encoded again.
pub fn encode_append<C: QuorumTypeConfig>(
    rpc: &AppendEntriesRequest<C>,
    cache: Option<&EntryCache<C>>,
) -> Result<Vec<u8>, serde_json::Error> {
    Ok(encode_append_within(rpc, cache, usize::MAX)?.0)
}

/// As [`encode_append`], with only the first entries whose JSON fits in `budget` bytes (at
/// least one); also how many entries it holds.
pub fn encode_append_within<C: QuorumTypeConfig>(
    rpc: &AppendEntriesRequest<C>,
    cache: Option<&EntryCache<C>>,
    budget: usize,
) -> Result<(Vec<u8>, usize), serde_json::Error> {
    let mut encoded: Vec<Arc<[u8]>> = Vec::with_capacity(rpc.entries.len());
    let mut bytes = 0usize;
    for entry in &rpc.entries {
        let json = match cache.and_then(|c| c.encoded(&entry.log_id)) {
            Some(json) => json,
            None => Arc::from(serde_json::to_vec(entry)?),
        };
        if !encoded.is_empty() && bytes + json.len() > budget {
            break;
        }
        bytes += json.len() + 1;
        encoded.push(json);
    }
    let mut out = Vec::with_capacity(256 + bytes);
    out.extend_from_slice(br#"{"vote":"#);
    serde_json::to_writer(&mut out, &rpc.vote)?;
    out.extend_from_slice(br#","prev_log_id":"#);
    serde_json::to_writer(&mut out, &rpc.prev_log_id)?;
    out.extend_from_slice(br#","entries":["#);
    for (i, json) in encoded.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(json);
    }
    out.extend_from_slice(br#"],"leader_commit":"#);
    serde_json::to_writer(&mut out, &rpc.leader_commit)?;
    out.push(b'}');
    Ok((out, encoded.len()))
}

/// The fields of an append-entries request, each entry still as its JSON text.
#[derive(serde::Deserialize)]
struct AppendWire<'a> {
    vote: Vote<u64>,
    prev_log_id: Option<LogId<u64>>,
    #[serde(borrow)]
    entries: Vec<&'a RawValue>,
    leader_commit: Option<LogId<u64>>,
}

/// Decodes an append-entries request, keeping each entry's JSON as well, so that the follower
/// writes those bytes to its log instead of encoding the entry again.
pub fn decode_append<C: QuorumTypeConfig>(
    bytes: &[u8],
) -> Result<(AppendEntriesRequest<C>, Vec<ReceivedEntry>), serde_json::Error> {
    let wire: AppendWire<'_> = serde_json::from_slice(bytes)?;
    let mut entries = Vec::with_capacity(wire.entries.len());
    let mut received = Vec::with_capacity(wire.entries.len());
    for raw in wire.entries {
        let entry: Entry<C> = serde_json::from_str(raw.get())?;
        received.push((entry.log_id, Arc::from(raw.get().as_bytes())));
        entries.push(entry);
    }
    let rpc = AppendEntriesRequest {
        vote: wire.vote,
        prev_log_id: wire.prev_log_id,
        entries,
        leader_commit: wire.leader_commit,
    };
    Ok((rpc, received))
}

impl<C: QuorumTypeConfig> RaftNetwork<C> for Connection<C> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<C>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let (payload, sent) = encode_append_within(&rpc, self.cache.as_ref(), MAX_APPEND_BYTES)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let reply =
            self.client()?.append_entries(payload_request(payload, &option)).await.map_err(|s| self.status_error(s))?;
        let answer = self.decode(reply.into_inner())?;
        // Fewer entries than asked went: the follower matched up to the last one sent, and
        // openraft sends the rest next.
        Ok(match answer {
            AppendEntriesResponse::Success if sent < rpc.entries.len() => {
                AppendEntriesResponse::PartialSuccess(rpc.entries[..sent].last().map(|e| e.log_id))
            }
            other => other,
        })
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

    /// The request built from the log's bytes is the one serde writes, entry for entry, whether
    /// the cache holds every entry, some or none; and the follower reads back the same request
    /// with each entry's bytes.
    #[tokio::test]
    async fn append_entries_carry_the_logs_bytes_and_decode_as_serde_would() {
        use openraft::storage::RaftLogStorageExt;
        use openraft::{CommittedLeaderId, EntryPayload, LogId};
        let entry = |index: u64| Entry::<Types> {
            log_id: LogId::new(CommittedLeaderId::new(2, 1), index),
            payload: EntryPayload::Normal(format!("command \"{index}\"\n")),
        };
        let dir = tempfile::tempdir().unwrap();
        let mut log =
            crate::log_store::LogStore::<Types>::new(crate::open_db(&dir.path().join("db"), &[]).unwrap()).unwrap();
        log.blocking_append((1..=3).map(entry)).await.unwrap();
        let cache = log.entry_cache();
        for entries in [vec![], vec![entry(2), entry(3)], vec![entry(3), entry(4)], vec![entry(9)]] {
            let rpc = AppendEntriesRequest::<Types> {
                vote: openraft::Vote::new_committed(2, 1),
                prev_log_id: Some(LogId::new(CommittedLeaderId::new(2, 1), 1)),
                entries,
                leader_commit: None,
            };
            let bytes = encode_append(&rpc, Some(&cache)).unwrap();
            assert_eq!(bytes, serde_json::to_vec(&rpc).unwrap());
            assert_eq!(encode_append(&rpc, None).unwrap(), bytes);
            let (back, received) = decode_append::<Types>(&bytes).unwrap();
            assert_eq!(serde_json::to_vec(&back).unwrap(), bytes);
            assert_eq!(received.len(), rpc.entries.len());
            for ((id, json), e) in received.iter().zip(&rpc.entries) {
                assert_eq!((id, &**json), (&e.log_id, serde_json::to_vec(e).unwrap().as_slice()));
            }
        }
        assert!(decode_append::<Types>(br#"{"vote":1}"#).is_err());
    }

    /// A request is cut to the entries that fit the byte budget, never to none: a large entry
    /// goes alone, and what is cut off is the prefix a follower can store.
    #[test]
    fn append_entries_are_cut_to_the_byte_budget() {
        use openraft::{CommittedLeaderId, EntryPayload, LogId};
        let entry = |index: u64, size: usize| Entry::<Types> {
            log_id: LogId::new(CommittedLeaderId::new(2, 1), index),
            payload: EntryPayload::Normal("x".repeat(size)),
        };
        let rpc = |entries| AppendEntriesRequest::<Types> {
            vote: openraft::Vote::new_committed(2, 1),
            prev_log_id: None,
            entries,
            leader_commit: None,
        };
        let big = rpc(vec![entry(1, 5000), entry(2, 10), entry(3, 10)]);
        let (bytes, sent) = encode_append_within(&big, None, 1000).unwrap();
        assert_eq!(sent, 1, "a large entry goes alone");
        let (back, _) = decode_append::<Types>(&bytes).unwrap();
        assert_eq!(back.entries.len(), 1);
        let small = rpc(vec![entry(1, 100), entry(2, 100), entry(3, 100), entry(4, 5000)]);
        let (bytes, sent) = encode_append_within(&small, None, 1000).unwrap();
        assert_eq!(sent, 3);
        assert!(bytes.len() < 1000 + 200, "{}", bytes.len());
        let (bytes, sent) = encode_append_within(&small, None, usize::MAX).unwrap();
        assert_eq!((sent, bytes), (4, serde_json::to_vec(&small).unwrap()));
    }
}
