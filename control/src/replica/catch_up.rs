//! Completing the job history of a replica that installed a snapshot: the entries the snapshot
//! stands for wrote the history of the jobs it no longer holds, and this replica never applied
//! them ([`super::history`]). It copies every record from a peer whose own history is complete
//! and has applied at least as far as the snapshot, a page at a time over the peers' API (a
//! request only replicas may make), writes them as its own (writing a record again changes
//! nothing), and takes the mark away once they are durable. The snapshot itself stays the size
//! of the hot state.

use std::sync::Arc;
use std::time::Duration;

use quorum_proto::api::HistoryPageRequest;
use tokio::sync::watch;

use super::history::History;
use super::peers::Peers;
use super::Replica;

/// How often a replica with an incomplete history tries again when no peer could help.
const RETRY: Duration = Duration::from_secs(2);

/// Records asked for per page.
const PAGE: u32 = 5_000;

/// Bounds connecting to a peer and each page.
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// Runs until `stop`: whenever the history is marked incomplete, copies it from a peer.
pub async fn complete_history(replica: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    let peers = Peers::new(replica.dialer.clone(), Some(CALL_LIMIT));
    loop {
        if let Some(gap) = replica.shared.history.gap() {
            match copy(&replica, &peers, gap, &stop).await {
                Ok(Some(from)) => tracing::info!(gap, from, "job history copied from a peer"),
                Ok(None) => {}
                Err(e) => tracing::warn!(gap, error = %e, "job history not copied yet; trying again"),
            }
        }
        let wait = match replica.shared.history.gap() {
            Some(_) => RETRY,
            None => Duration::from_secs(3600),
        };
        tokio::select! {
            _ = stop.changed() => return,
            _ = replica.shared.history_gap.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// Copies the history from the first peer that can give it: the leader first. The peer it
/// came from, or `None` when stopped.
async fn copy(replica: &Replica, peers: &Peers, gap: u64, stop: &watch::Receiver<bool>) -> Result<Option<u64>, String> {
    let candidates: Vec<(u64, String)> = {
        let m = replica.raft.metrics();
        let m = m.borrow();
        let leader = m.current_leader;
        let mut nodes: Vec<(u64, String)> = m
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != replica.id)
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect();
        nodes.sort_by_key(|(id, _)| (Some(*id) != leader, *id));
        nodes
    };
    let mut why = Vec::new();
    for (id, addr) in candidates {
        match copy_from(&replica.shared.history, peers, &addr, gap, stop).await {
            Ok(true) => {
                let closed = replica.shared.history.close_gap(gap).map_err(|e| e.to_string())?;
                // A later snapshot moved the mark meanwhile: the next round copies again.
                return Ok(closed.then_some(id));
            }
            Ok(false) => return Ok(None),
            Err(e) => why.push(format!("replica {id}: {e}")),
        }
    }
    Err(match why.is_empty() {
        true => "no other replica to copy it from".into(),
        false => why.join("; "),
    })
}

/// Every record of the peer at `addr`, written here; false when stopped.
async fn copy_from(
    history: &History,
    peers: &Peers,
    addr: &str,
    gap: u64,
    stop: &watch::Receiver<bool>,
) -> Result<bool, String> {
    let mut client = peers.client(addr)?;
    let mut stopped = stop.clone();
    let mut after = 0;
    loop {
        // A page asked of a peer that is itself stopping may take up to CALL_LIMIT; a stop
        // asked for here does not wait for it.
        let page = tokio::select! {
            page = client.history_page(HistoryPageRequest { after_job_id: after, limit: PAGE }) => page,
            _ = stopped.wait_for(|s| *s) => return Ok(false),
        };
        let page = page.map_err(|s| format!("{}: {}", s.code(), s.message()))?.into_inner();
        if page.incomplete {
            return Err("its own history is incomplete".into());
        }
        if page.applied_index < gap {
            return Err(format!("it has applied up to {}, short of the snapshot at {gap}", page.applied_index));
        }
        let history = history.clone();
        let records = page.records;
        tokio::task::spawn_blocking(move || history.write_records(&records))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if page.done {
            return Ok(true);
        }
        if page.last_job_id <= after {
            return Err(format!("its page after job {after} did not move on"));
        }
        after = page.last_job_id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that takes the connection and never answers (a replica stopping, a hung host): a
    /// stop asked for meanwhile ends the copy at once, not at the page's CALL_LIMIT.
    #[tokio::test]
    async fn a_stop_ends_a_copy_from_a_peer_that_never_answers() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let db = quorum_raft::open_db(dir.path(), &[super::super::history::CF_HISTORY]).expect("the database opens");
        let history = History::new(db, Default::default()).expect("the history opens");
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let addr = silent.local_addr().expect("its address").to_string();
        let accepted = tokio::spawn(async move {
            let (conn, _) = silent.accept().await.expect("the copy connects");
            conn
        });
        let dialer: quorum_raft::network::Dialer =
            Arc::new(|addr: &str| quorum_auth::tls::endpoint(addr, None).map_err(|e| e.to_string()));
        let peers = Peers::new(dialer, Some(CALL_LIMIT));
        let (stop, stop_rx) = watch::channel(false);
        let copying = tokio::spawn(async move { copy_from(&history, &peers, &addr, 1, &stop_rx).await });
        // Held open and silent while the copy waits on it.
        let _conn = accepted.await.expect("the listener task");
        stop.send(true).expect("the copy listens");
        let stopped = tokio::time::timeout(CALL_LIMIT / 2, copying).await;
        assert_eq!(stopped.expect("ended before the page's limit").expect("the copy task"), Ok(false));
    }
}
