//! The composition root: the one place that wires a replica ([`crate::replica`]), its leader
//! work ([`crate::leader`]) and its services ([`crate::server`]) together, started by
//! [`Controller::start`] on a listener and stopped by [`Controller::shutdown`]. [`run`] is the
//! same behind a shutdown future, as the binary uses it. Nothing else in the crate imports it.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::ControllerConfig;
use crate::faults::Faults;
use crate::http;
use crate::leader::{self, Grants, LeaderState};
use crate::replica::{catch_up, watchdog, Replica};
use crate::security::Security;
use crate::server;

/// A running replica.
pub struct Controller {
    pub replica: Arc<Replica>,
    pub leader: Arc<LeaderState>,
    faults: Faults,
    /// Kept so that shutdown closes RocksDB itself once every other holder has let go: the data
    /// directory can be opened again (a restart in the same process) as soon as shutdown returns.
    db: Arc<rocksdb::DB>,
    /// Where the HTTP port listens (`[http] listen`), if it does.
    pub http_addr: Option<std::net::SocketAddr>,
    stop: watch::Sender<bool>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    supervisor: JoinHandle<()>,
}

impl Controller {
    /// Opens the data directory, starts Raft (initializing the cluster from `replicas` if this
    /// replica's log is empty) and serves on `listener`.
    pub async fn start(config: ControllerConfig, listener: TcpListener) -> anyhow::Result<Controller> {
        config.validate()?;
        let settings = config.settings()?;
        let faults = Faults::default();
        let mut security = Security::load(&config.security, config.id)?;
        let grants = Grants::new(security.signer.take());
        let security = Arc::new(security);
        let peer_tls = security.peer_tls.clone();
        let dialer: quorum_raft::network::Dialer =
            Arc::new(move |addr: &str| quorum_auth::tls::endpoint(addr, peer_tls.as_ref()).map_err(|e| e.to_string()));
        let (replica, db) = Replica::start(&config, &faults, dialer).await?;
        let gpu_idle = config.gpu_idle.as_ref().map(|g| g.policy()).transpose()?;
        let leader = Arc::new(
            LeaderState::new(config.liveness(), grants)
                .mail_through(config.mail_program.clone())
                .watch_gpu_idle(gpu_idle)
                .mpi_default(config.mpi_default),
        );
        let (stop, stop_rx) = watch::channel(false);
        let limits = Arc::new(config.limits.clone());
        let api = Arc::new(
            server::Api::new(replica.clone(), leader.clone(), security.clone(), limits)
                .with_submit_filter(config.submit_filter.clone())
                .with_shown_config(server::shown::from_config(&config)),
        );
        let http_addr = match &config.http.listen {
            Some(addr) => {
                let listener =
                    TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("[http] listen = \"{addr}\": {e}"))?;
                let bound = listener.local_addr()?;
                let app = Arc::new(http::Http {
                    api: api.clone(),
                    authenticator: Arc::new(server::auth::Authenticator::new(security.clone(), replica.clone())),
                    metrics: http::metrics::Metrics::new(replica.clone(), leader.clone(), db.clone()),
                    metrics_allow: config.http.metrics_allow()?,
                });
                tokio::spawn(http::serve(app, security.clone(), listener, stop_rx.clone()));
                Some(bound)
            }
            None => None,
        };
        let server = tokio::spawn(server::serve(api, faults.clone(), listener, stop_rx.clone()));
        let supervisor = tokio::spawn(leader::supervise(replica.clone(), leader.clone(), settings, stop_rx.clone()));
        tokio::spawn(catch_up::complete_history(replica.clone(), stop_rx.clone()));
        tokio::spawn(watchdog::watch_leader(
            replica.clone(),
            Duration::from_millis(config.election_timeout_max_ms),
            stop_rx,
        ));
        let http = http_addr.map(|a| a.to_string()).unwrap_or_default();
        tracing::info!(replica = config.id, addr = %replica.addr, http, "controller started");
        Ok(Controller { replica, leader, faults, db, http_addr, stop, server, supervisor })
    }

    /// The fault switches of this replica, for tests.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Stops serving, ends leader work and Raft, and releases the data directory. A leader with
    /// another voter first hands leadership over, so that a planned stop costs the cluster one
    /// leader lease rather than an election timeout.
    pub async fn shutdown(self) {
        let id = self.replica.id;
        if self.replica.is_leader() {
            match tokio::time::timeout(Duration::from_secs(5), self.replica.transfer_leadership(None)).await {
                Ok(Ok(to)) => tracing::info!(replica = id, to, "handed leadership over before stopping"),
                Ok(Err(e)) => tracing::warn!(replica = id, error = %e, "stopping without handing over"),
                Err(_) => tracing::warn!(replica = id, "handing over took too long; stopping"),
            }
        }
        let _ = self.stop.send(true);
        // Every step is bounded: a stop asked for must happen.
        if tokio::time::timeout(Duration::from_secs(5), self.supervisor).await.is_err() {
            tracing::warn!("leader work did not stop within 5s");
        }
        self.leader.hub.close_all();
        match tokio::time::timeout(Duration::from_secs(5), self.server).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "server"),
            Ok(_) => {}
            Err(_) => tracing::warn!("server did not stop within 5s"),
        }
        match tokio::time::timeout(Duration::from_secs(5), self.replica.raft.shutdown()).await {
            Ok(Err(e)) => tracing::warn!(error = %e, "raft shutdown"),
            Ok(Ok(())) => {}
            Err(_) => tracing::warn!("raft did not shut down within 5s"),
        }
        drop(self.replica);
        drop(self.leader);
        let mut db = self.db;
        let released = std::time::Instant::now();
        loop {
            match Arc::try_unwrap(db) {
                // The last holder: dropping it closes the database here and now.
                Ok(last) => break drop(last),
                Err(shared) if released.elapsed() < Duration::from_secs(5) => {
                    db = shared;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(_) => break tracing::warn!("the database is still held 5s after shutdown"),
            }
        }
    }
}

/// Runs a replica until `shutdown` completes.
pub async fn run(
    config: ControllerConfig,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let controller = Controller::start(config, listener).await?;
    shutdown.await;
    controller.shutdown().await;
    Ok(())
}
