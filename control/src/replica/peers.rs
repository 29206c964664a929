//! Channels to the other replicas' public API, one per address, made on first use: for
//! forwarding requests to the leader and for asking a replica what it runs.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use quorum_proto::api::quorum_client::QuorumClient;
use quorum_raft::network::Dialer;
use tonic::transport::Channel;

pub struct Peers {
    dialer: Dialer,
    /// Bounds connecting and each call, when set.
    timeout: Option<Duration>,
    channels: Mutex<HashMap<String, Channel>>,
}

impl Peers {
    pub fn new(dialer: Dialer, timeout: Option<Duration>) -> Peers {
        Peers { dialer, timeout, channels: Mutex::new(HashMap::new()) }
    }

    /// A client of the replica at `addr` (host:port); it connects on its first call.
    pub fn client(&self, addr: &str) -> Result<QuorumClient<Channel>, String> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let channel = match channels.get(addr) {
            Some(c) => c.clone(),
            None => {
                let mut endpoint =
                    (self.dialer)(addr).map_err(|e| format!("replica address {addr}: {e}"))?.tcp_nodelay(true);
                if let Some(t) = self.timeout {
                    endpoint = endpoint.connect_timeout(t).timeout(t);
                }
                let c = endpoint.connect_lazy();
                channels.insert(addr.to_string(), c.clone());
                c
            }
        };
        Ok(QuorumClient::new(channel))
    }
}
