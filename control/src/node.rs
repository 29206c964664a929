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
    /// The HTTP port, the history's catch-up and the leader watchdog: each holds the replica
    /// (and so the database) until it sees the stop, and shutdown waits for them.
    background: Vec<JoinHandle<()>>,
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
        let mut background = Vec::new();
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
                background.push(tokio::spawn(http::serve(app, security.clone(), listener, stop_rx.clone())));
                Some(bound)
            }
            None => None,
        };
        let server = tokio::spawn(server::serve(api, faults.clone(), listener, stop_rx.clone()));
        let supervisor = tokio::spawn(leader::supervise(replica.clone(), leader.clone(), settings, stop_rx.clone()));
        background.push(tokio::spawn(catch_up::complete_history(replica.clone(), stop_rx.clone())));
        background.push(tokio::spawn(watchdog::watch_leader(
            replica.clone(),
            Duration::from_millis(config.election_timeout_max_ms),
            stop_rx,
        )));
        let http = http_addr.map(|a| a.to_string()).unwrap_or_default();
        tracing::info!(replica = config.id, addr = %replica.addr, http, "controller started");
        Ok(Controller { replica, leader, faults, db, http_addr, stop, server, supervisor, background })
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
        let joined = futures::future::join_all(self.background);
        if tokio::time::timeout(Duration::from_secs(5), joined).await.is_err() {
            tracing::warn!("the HTTP port, history catch-up or leader watchdog did not stop within 5s");
        }
        drop(self.replica);
        drop(self.leader);
        if !release(self.db, DB_RELEASE_WARN, DB_RELEASE_LIMIT).await {
            tracing::warn!(
                limit_s = DB_RELEASE_LIMIT.as_secs(),
                "the database is still held after shutdown; opening it again in this process will fail"
            );
        }
    }
}

/// After this long waiting for the database's other holders, shutdown says what it waits for.
const DB_RELEASE_WARN: Duration = Duration::from_secs(5);
/// How long shutdown waits for the database's other holders at most. A snapshot being encoded or
/// written, or the history being flushed, runs on a thread of the lowest CPU priority that holds
/// the database until it is done; on a busy machine that is seconds past every other stop.
const DB_RELEASE_LIMIT: Duration = Duration::from_secs(60);

/// Closes the database once `db` is its last holder, waiting for the others (threads that finish
/// their work and let go) up to `limit`: true when it was closed here, so that the data directory
/// can be opened again in this process.
async fn release(mut db: Arc<rocksdb::DB>, warn_after: Duration, limit: Duration) -> bool {
    let began = std::time::Instant::now();
    let mut warned = false;
    loop {
        match Arc::try_unwrap(db) {
            // The last holder: dropping it closes the database here and now.
            Ok(last) => {
                drop(last);
                if warned {
                    tracing::info!(waited_ms = began.elapsed().as_millis() as u64, "the database is released");
                }
                return true;
            }
            Err(shared) if began.elapsed() < limit => {
                db = shared;
                if !warned && began.elapsed() >= warn_after {
                    warned = true;
                    tracing::warn!(
                        holders = Arc::strong_count(&db) - 1,
                        "the database is still held (a snapshot or history write finishing); waiting"
                    );
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => return false,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot thread starved of CPU holds the database past every other stop (CI once
    /// restarted a replica 5 s into such a wait and RocksDB refused its own process's lock):
    /// shutdown waits for the last holder, and the directory then opens again at once.
    #[tokio::test]
    async fn the_database_closes_when_its_slowest_holder_lets_go_and_opens_again() {
        let dir = tempfile::tempdir().unwrap();
        let db = quorum_raft::open_db(dir.path(), &[]).unwrap();
        let held = db.clone();
        let hold = DB_RELEASE_WARN + Duration::from_secs(1);
        let began = std::time::Instant::now();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(hold);
            drop(held);
        });
        let again = quorum_raft::open_db(dir.path(), &[]).expect_err("the directory is in use");
        assert!(again.to_string().contains("lock"), "{again}");
        assert!(release(db, DB_RELEASE_WARN, DB_RELEASE_LIMIT).await, "released");
        assert!(began.elapsed() >= hold - Duration::from_millis(500), "it waited for the holder");
        quorum_raft::open_db(dir.path(), &[]).expect("the directory opens again");
        holder.join().unwrap();

        // A holder that never lets go: shutdown gives up at its limit and says so.
        let db = quorum_raft::open_db(dir.path(), &[]).unwrap();
        let held = db.clone();
        assert!(!release(db, Duration::from_millis(50), Duration::from_millis(200)).await);
        assert_eq!(Arc::strong_count(&held), 1, "the other holder has it alone");
    }
}
