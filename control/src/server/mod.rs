//! The replica's gRPC services on one listener: the public API ([`api`]), the agent stream
//! ([`agents`]) and the internal Raft service, which shares the port but not the API.

pub mod agents;
pub mod api;
mod batch;
pub mod convert;
pub mod logs;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

use crate::replica::Core;

/// The connections `listener` accepts, with TCP_NODELAY. Server::tcp_nodelay only applies to
/// the sockets `serve` accepts itself, and ours come from a listener bound by the caller. Without
/// it Nagle's algorithm and the peer's delayed ACK hold a small answer on a new connection for
/// 40 ms.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Serves until `stop` turns true.
pub async fn serve(
    core: Arc<Core>,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) -> Result<(), tonic::transport::Error> {
    let raft = quorum_raft::service::RaftRpcServer::into_service(
        core.raft.clone(),
        core.raft_isolation.clone(),
        core.leader_contact.clone(),
        core.entry_cache.clone(),
    );
    tonic::transport::Server::builder()
        .add_service(raft)
        .add_service(api::service(core.clone()))
        .add_service(agents::service(core))
        .serve_with_incoming_shutdown(incoming(listener), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
}

/// The status a replica answers when it cannot serve a request because it does not lead,
/// carrying the leader's address when known.
pub fn not_leader(leader: Option<&str>) -> tonic::Status {
    let mut status = tonic::Status::unavailable(match leader {
        Some(l) => format!("not the leader; the leader is {l}"),
        None => "not the leader, and no leader is known yet".to_string(),
    });
    if let Some(Ok(v)) = leader.map(tonic::metadata::MetadataValue::try_from) {
        status.metadata_mut().insert(quorum_proto::LEADER_HINT_KEY, v);
    }
    status
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn accepted_connections_send_small_answers_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = super::incoming(listener);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.nodelay().unwrap(), "an accepted connection must have TCP_NODELAY");
    }
}
