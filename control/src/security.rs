//! What a replica proves and verifies, loaded once from `[security]`: its TLS (server side, and
//! the client side it dials the other replicas with), the host's munged, the token keys and the
//! launch key.

use std::sync::Arc;

use quorum_auth::launch::Signer;
use quorum_auth::listener::Mode;
use quorum_auth::munge::Munge;
use quorum_auth::pki::{Layout, PeerRole};
use quorum_auth::tls::{ClientTls, ServerTls, TlsFiles};
use quorum_auth::token::Tokens;

use crate::config::{SecurityConfig, Transitional};

pub struct Security {
    pub config: SecurityConfig,
    pub mode: Mode,
    pub server_tls: Option<Arc<ServerTls>>,
    /// The same certificate for the HTTP port, which speaks HTTP/1.1 too.
    pub http_tls: Option<Arc<ServerTls>>,
    /// How this replica dials the others: with its replica certificate.
    pub peer_tls: Option<ClientTls>,
    pub munge: Munge,
    pub tokens: Option<Tokens>,
    /// Signs launches; without it (an insecure cluster with no keys) launches go unsigned and
    /// only agents that do not verify run them.
    pub signer: Option<Signer>,
}

impl Security {
    /// Whether a peer without a certificate is taken for a replica or an agent: only over
    /// plaintext, on a cluster that runs without TLS (`insecure`) or is moving to it
    /// (`transitional`).
    pub fn plaintext_trusted(&self, peer: &quorum_auth::listener::Peer) -> bool {
        !peer.tls && (self.config.insecure || self.config.transitional.is_some())
    }

    pub fn load(config: &SecurityConfig, replica: u64) -> anyhow::Result<Security> {
        let munge = Munge::new(config.munge_socket.as_deref());
        let layout = config.certs_dir.as_ref().map(Layout::new);
        let (mode, server_tls, http_tls, peer_tls) = match (&layout, config.insecure) {
            (_, true) => {
                tracing::warn!(
                    "[security] insecure = true: plaintext gRPC; anyone who reaches this port can pose as a replica or an agent"
                );
                (Mode::Plaintext, None, None, None)
            }
            (Some(layout), false) => {
                let (cert, key) = layout.pair(&PeerRole::Replica(replica));
                let files = TlsFiles { ca: layout.ca(), cert, key };
                let server = Some(Arc::new(ServerTls::load(files.clone())?));
                let http = Some(Arc::new(ServerTls::load_http(files.clone())?));
                match config.transitional {
                    None => (Mode::Tls, server, http, Some(files.client()?)),
                    Some(step) => {
                        tracing::warn!(
                            ?step,
                            "[security] transitional: plaintext is accepted too, and trusted as replicas and agents; finish the move to TLS"
                        );
                        let dial = (step == Transitional::DialTls).then(|| files.client()).transpose()?;
                        (Mode::Either, server, http, dial)
                    }
                }
            }
            (None, false) => anyhow::bail!("[security] certs_dir is required unless insecure = true"),
        };
        let mut token_keys: Vec<std::path::PathBuf> = Vec::new();
        if let Some(l) = layout.as_ref().filter(|l| l.token_key().exists()) {
            token_keys.push(l.token_key());
        }
        token_keys.extend(config.token_keys.iter().cloned());
        let tokens = if token_keys.is_empty() { None } else { Some(Tokens::load(&token_keys)?) };
        let signer = match layout.as_ref().filter(|l| l.launch_key().exists()) {
            Some(l) => Some(Signer::load(&l.launch_key())?),
            None => None,
        };
        Ok(Security { config: config.clone(), mode, server_tls, http_tls, peer_tls, munge, tokens, signer })
    }
}
