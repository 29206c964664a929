//! TLS with the cluster's CA (rustls, ring): the controllers' server side, reloaded from disk
//! when the files change, and the client side every caller of a controller uses.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::pki::CONTROLLER_NAME;

pub fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| anyhow::anyhow!("reading certificates from {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("reading certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{} holds no certificate", path.display());
    }
    Ok(certs)
}

fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| anyhow::anyhow!("reading the private key {}: {e}", path.display()))
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))
}

/// The files one party of the cluster presents: the CA it trusts, its certificate and key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    fn mtimes(&self) -> [Option<SystemTime>; 3] {
        [&self.ca, &self.cert, &self.key].map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
    }

    /// A server configuration: our certificate, and client certificates of the CA verified when
    /// presented (a user's client has none; its requests carry a credential instead). gRPC speaks
    /// HTTP/2 only.
    pub fn server_config(&self) -> anyhow::Result<Arc<ServerConfig>> {
        self.server_config_for(&[b"h2"])
    }

    /// [`TlsFiles::server_config`], offering the application protocols `alpn`.
    fn server_config_for(&self, alpn: &[&[u8]]) -> anyhow::Result<Arc<ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for ca in read_certs(&self.ca)? {
            roots.add(ca)?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .allow_unauthenticated()
            .build()?;
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(read_certs(&self.cert)?, read_key(&self.key)?)?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// The client side with our certificate (replicas, agents).
    pub fn client(&self) -> anyhow::Result<ClientTls> {
        let identity = Identity::from_pem(read(&self.cert)?, read(&self.key)?);
        Ok(ClientTls { config: ClientTls::base(&self.ca)?.identity(identity) })
    }
}

/// The server configuration, read again from disk when a file changed (checked at most once a
/// second, when a connection comes): certificates are renewed without a restart.
pub struct ServerTls {
    files: TlsFiles,
    alpn: &'static [&'static [u8]],
    current: Mutex<(Arc<ServerConfig>, [Option<SystemTime>; 3], Instant)>,
}

impl ServerTls {
    /// For gRPC: HTTP/2.
    pub fn load(files: TlsFiles) -> anyhow::Result<ServerTls> {
        Self::load_for(files, &[b"h2"])
    }

    /// For the HTTP port: HTTP/2 and HTTP/1.1 (browsers, `curl`, Prometheus and Python clients
    /// may offer either; a client offering only HTTP/1.1 is refused by an HTTP/2-only server).
    pub fn load_http(files: TlsFiles) -> anyhow::Result<ServerTls> {
        Self::load_for(files, &[b"h2", b"http/1.1"])
    }

    fn load_for(files: TlsFiles, alpn: &'static [&'static [u8]]) -> anyhow::Result<ServerTls> {
        let config = files.server_config_for(alpn)?;
        let mtimes = files.mtimes();
        Ok(ServerTls { files, alpn, current: Mutex::new((config, mtimes, Instant::now())) })
    }

    pub fn config(&self) -> Arc<ServerConfig> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.2.elapsed() >= Duration::from_secs(1) {
            current.2 = Instant::now();
            let mtimes = self.files.mtimes();
            if mtimes != current.1 {
                match self.files.server_config_for(self.alpn) {
                    Ok(config) => {
                        tracing::info!(cert = %self.files.cert.display(), "TLS certificates reloaded");
                        *current = (config, mtimes, Instant::now());
                    }
                    // Half-written files: the old configuration serves until they are whole.
                    Err(e) => tracing::warn!(error = %e, "TLS files changed but cannot be read; keeping the old ones"),
                }
            }
        }
        current.0.clone()
    }
}

/// How a client reaches controllers over TLS: the cluster CA, the name controllers' certificates
/// carry, and our own certificate when we have one.
#[derive(Clone, Debug)]
pub struct ClientTls {
    config: ClientTlsConfig,
}

impl ClientTls {
    fn base(ca: &Path) -> anyhow::Result<ClientTlsConfig> {
        Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?)).domain_name(CONTROLLER_NAME))
    }

    /// Only the CA: a user's client, which proves who it is with a credential per request.
    pub fn anonymous(ca: &Path) -> anyhow::Result<ClientTls> {
        Ok(ClientTls { config: Self::base(ca)? })
    }
}

/// An endpoint for a controller at `addr` (host:port): TLS with `tls`, plaintext without.
pub fn endpoint(addr: &str, tls: Option<&ClientTls>) -> anyhow::Result<Endpoint> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|e| anyhow::anyhow!("bad controller address '{addr}': {e}"))?;
    Ok(match tls {
        Some(t) => endpoint
            .tls_config(t.config.clone())
            .map_err(|e| anyhow::anyhow!("TLS for controller address '{addr}': {e}"))?,
        None => endpoint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{Layout, PeerRole};

    #[test]
    fn the_server_reads_its_certificate_again_when_the_files_change() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        layout.init().unwrap();
        let (cert, key) = layout.issue(&PeerRole::Replica(1), &[]).unwrap();
        let tls = ServerTls::load(TlsFiles { ca: layout.ca(), cert, key }).unwrap();
        let first = tls.config();
        assert!(Arc::ptr_eq(&first, &tls.config()), "unchanged files: the same configuration");
        std::thread::sleep(Duration::from_millis(1100));
        layout.issue(&PeerRole::Replica(1), &["ctl1.example.org".into()]).unwrap();
        let renewed = tls.config();
        assert!(!Arc::ptr_eq(&first, &renewed), "a renewed certificate is served without a restart");
        // Half-written files keep the old configuration.
        std::thread::sleep(Duration::from_millis(1100));
        std::fs::write(layout.pair(&PeerRole::Replica(1)).0, "not a certificate").unwrap();
        assert!(Arc::ptr_eq(&renewed, &tls.config()));
    }
}
