//! The connections a controller accepts: TLS (the default), plaintext (`insecure = true`), or
//! both during the move of a plaintext cluster to TLS (`transitional = true`: the first byte
//! tells, a TLS handshake starts with 0x16). Each connection carries a [`Peer`]: its address,
//! and the role its verified certificate names. Handshakes run concurrently, each bounded, so a
//! client that never finishes one holds up nobody.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use crate::pki::PeerRole;
use crate::tls::ServerTls;

/// What connections are accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Tls,
    Plaintext,
    /// Both, told apart by the first byte.
    Either,
}

/// Who is at the other end of a connection.
#[derive(Clone, Debug, Default)]
pub struct Peer {
    pub addr: Option<SocketAddr>,
    /// The role its certificate names, verified against the cluster CA; `None` without one.
    pub role: Option<PeerRole>,
    pub tls: bool,
    /// What was proved on this connection (one per connection, shared by its requests).
    pub session: Arc<Session>,
}

/// The credential a connection's client proved itself with, and who it named: a client sends
/// the same MUNGE credential with each request on one connection for a while, and only the first
/// is decoded by munged. The credential is accepted again on this connection only (its TLS
/// session); on any other, munged refuses it as replayed.
#[derive(Debug, Default)]
pub struct Session {
    verified: std::sync::Mutex<Option<Verified>>,
}

#[derive(Clone, Debug)]
struct Verified {
    credential: String,
    uid: u32,
    gid: u32,
    user: String,
    at: std::time::Instant,
}

impl Session {
    /// Who `credential` names: as this connection proved it less than `fresh` ago, else as
    /// `decode` says (then remembered). Requests of one connection that bring a new credential
    /// at once wait for one another, so that it is decoded once, not refused as replayed.
    pub fn prove<E>(
        &self,
        credential: &str,
        fresh: Duration,
        decode: impl FnOnce() -> Result<(String, u32, u32), E>,
    ) -> Result<(String, u32, u32), E> {
        let mut v = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hit) = v.as_ref().filter(|v| v.credential == credential && v.at.elapsed() < fresh) {
            return Ok((hit.user.clone(), hit.uid, hit.gid));
        }
        let (user, uid, gid) = decode()?;
        *v = Some(Verified {
            credential: credential.to_string(),
            uid,
            gid,
            user: user.clone(),
            at: std::time::Instant::now(),
        });
        Ok((user, uid, gid))
    }
}

impl Peer {
    pub fn describe(&self) -> String {
        self.addr.map_or_else(|| "an unknown address".into(), |a| a.to_string())
    }
}

/// An accepted connection.
pub enum Conn {
    Plain(TcpStream, Peer),
    Tls(Box<TlsStream<TcpStream>>, Peer),
}

impl Connected for Conn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        match self {
            Conn::Plain(_, p) | Conn::Tls(_, p) => p.clone(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s, _) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s, _) => s.is_write_vectored(),
            Conn::Tls(s, _) => s.is_write_vectored(),
        }
    }
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connections `listener` accepts in `mode` (with TCP_NODELAY: without it Nagle's algorithm
/// and the peer's delayed ACK hold a small answer on a new connection for 40 ms). `tls` is
/// required unless `mode` is plaintext. Accepting stops when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    mode: Mode,
    tls: Option<Arc<ServerTls>>,
) -> ReceiverStream<Result<Conn, io::Error>> {
    let (tx, rx) = mpsc::channel::<Result<Conn, io::Error>>(256);
    tokio::spawn(async move {
        loop {
            let (socket, addr) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and the like: back off a little rather than spin.
                        tracing::warn!(error = %e, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = tx.closed() => return,
            };
            let _ = socket.set_nodelay(true);
            let (tx, tls) = (tx.clone(), tls.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, accept(socket, addr, mode, tls)).await {
                    Ok(Ok(conn)) => {
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::warn!(peer = %addr, error = %e, "refused a connection"),
                    Err(_) => tracing::warn!(peer = %addr, "refused a connection: no TLS handshake within 10s"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

async fn accept(socket: TcpStream, addr: SocketAddr, mode: Mode, tls: Option<Arc<ServerTls>>) -> io::Result<Conn> {
    let plain = Peer { addr: Some(addr), role: None, tls: false, session: Arc::default() };
    let use_tls = match mode {
        Mode::Plaintext => false,
        Mode::Tls => true,
        Mode::Either => {
            let mut first = [0u8; 1];
            let n = socket.peek(&mut first).await?;
            n == 1 && first[0] == 0x16
        }
    };
    if !use_tls {
        return Ok(Conn::Plain(socket, plain));
    }
    let tls = tls.ok_or_else(|| io::Error::other("TLS is not configured"))?;
    let stream = tokio_rustls::TlsAcceptor::from(tls.config()).accept(socket).await?;
    let role = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|c| PeerRole::of_certificate(c));
    Ok(Conn::Tls(Box::new(stream), Peer { addr: Some(addr), role, tls: true, session: Arc::default() }))
}
