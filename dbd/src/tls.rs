//! TLS to PostgreSQL, for a database on another host: rustls (as every other connection of
//! Quorum's), trusting the certificate authorities the operator names (`--postgres-ca`), and
//! checking that the server's certificate names the host the connection string gives.
//!
//! tokio-postgres asks for TLS through its `MakeTlsConnect` and `TlsConnect` traits; this is
//! their rustls side. The stream offers no channel binding, so SCRAM's `-PLUS` variant is not
//! used (the certificate check is what binds the session to the server).

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

/// Makes TLS connections that trust the roots it was given.
#[derive(Clone)]
pub struct Rustls {
    config: Arc<rustls::ClientConfig>,
}

impl Rustls {
    /// Trusting the certificates of the PEM file `ca` (a bundle may hold several).
    pub fn trusting(ca: &Path) -> anyhow::Result<Rustls> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
            .with_context(|| format!("reading PostgreSQL's certificate authority {}", ca.display()))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading PostgreSQL's certificate authority {}", ca.display()))?;
        if certs.is_empty() {
            anyhow::bail!(
                "{} holds no PEM certificate (--postgres-ca names the authority that signed PostgreSQL's certificate)",
                ca.display()
            );
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs {
            roots.add(cert).with_context(|| format!("a certificate of {}", ca.display()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Rustls { config: Arc::new(config) })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> MakeTlsConnect<S> for Rustls {
    type Stream = Stream<S>;
    type TlsConnect = Connect;
    type Error = io::Error;

    /// `host` is empty for a Unix socket, where PostgreSQL offers no TLS and none is asked.
    fn make_tls_connect(&mut self, host: &str) -> io::Result<Connect> {
        let name = (!host.is_empty())
            .then(|| ServerName::try_from(host.to_string()))
            .transpose()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("'{host}' as a TLS server name: {e}")))?;
        Ok(Connect { config: self.config.clone(), name })
    }
}

/// One connection's handshake.
pub struct Connect {
    config: Arc<rustls::ClientConfig>,
    name: Option<ServerName<'static>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> TlsConnect<S> for Connect {
    type Stream = Stream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let name =
                self.name.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "TLS without a host name"))?;
            let tls = tokio_rustls::TlsConnector::from(self.config).connect(name, stream).await?;
            Ok(Stream(tls))
        })
    }
}

/// A TLS connection to PostgreSQL.
pub struct Stream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for Stream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}
