//! Leadership transfer. openraft 0.9 has no transfer of its own, so it is done from outside:
//! the leader checks that the target has every entry it has, stops sending heartbeats (and
//! stops campaigning itself), and asks the target to campaign until it wins — which it can once
//! the others' leader lease (the election timeout) has run out since the last heartbeat. Used by
//! `quorum admin transfer-leader` and by a leader shutting down on SIGTERM, so a planned restart
//! costs one lease instead of an election timeout plus, often, a second round.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use quorum_proto::api::quorum_client::QuorumClient;
use quorum_proto::api::CampaignRequest;

use super::{matched_index, Replica, UpTo};

/// How long the target may take to catch up before the transfer is refused.
const CATCH_UP: Duration = Duration::from_secs(2);
/// How long the other voters may take to drain before heartbeats stop.
const DRAIN: Duration = Duration::from_secs(1);
/// How long the transfer may take once heartbeats stopped.
const TAKEOVER: Duration = Duration::from_secs(3);
/// Between two campaigns of the target.
const CAMPAIGN_EVERY: Duration = Duration::from_millis(60);

/// While alive, this replica proposes nothing; on drop, it heartbeats and campaigns again.
struct Handing<'a>(&'a Replica);

impl<'a> Handing<'a> {
    fn start(replica: &'a Replica) -> Self {
        replica.transferring.store(true, Ordering::SeqCst);
        Handing(replica)
    }
}

impl Drop for Handing<'_> {
    fn drop(&mut self) {
        let config = self.0.raft.runtime_config();
        config.heartbeat(true);
        config.elect(true);
        self.0.transferring.store(false, Ordering::SeqCst);
    }
}

impl Replica {
    /// Hands leadership to `to`, or to the most caught-up other voter; returns the new leader.
    pub async fn transfer_leadership(&self, to: Option<u64>) -> Result<u64, String> {
        let (target, addr) = self.pick_successor(to)?;
        // Nothing new from here on: the target catches up to a fixed point, and with neither
        // entries nor heartbeats the followers' leases run out. The guard undoes this however
        // the transfer ends, a dropped call included.
        let _guard = Handing::start(self);
        self.wait_replicated(target, UpTo::Latest, CATCH_UP).await.map_err(|(matched, last)| {
            format!("replica {target} is behind ({matched} of {last} entries); try again or pick another")
        })?;
        // Heartbeats stop below, but replication to a voter still catching up (after a restart,
        // or by snapshot) would go on, and each append renews that voter's leader lease: it
        // would refuse the target its vote for as long. So the other voters drain too, briefly;
        // one that is down or stays behind is no reason to refuse the transfer.
        for voter in self.other_voters(target) {
            if let Err((matched, last)) = self.wait_replicated(voter, UpTo::Latest, DRAIN).await {
                tracing::info!(voter, matched, last, "transfer: a voter is still behind; handing over anyway");
            }
        }
        let config = self.raft.runtime_config();
        config.heartbeat(false);
        config.elect(false);
        self.hand_over(target, &addr).await
    }

    /// The voters other than this replica and `target`.
    fn other_voters(&self, target: u64) -> Vec<u64> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.membership_config.membership().voter_ids().filter(|v| *v != self.id && *v != target).collect()
    }

    fn pick_successor(&self, to: Option<u64>) -> Result<(u64, String), String> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        if m.current_leader != Some(self.id) {
            return Err(format!("replica {} is not the leader", self.id));
        }
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().filter(|v| *v != self.id).collect();
        let target = match to {
            Some(t) if t == self.id => return Err(format!("replica {t} already leads")),
            Some(t) if !voters.contains(&t) => {
                return Err(format!(
                    "replica {t} is not a voter (voters: {})",
                    membership.voter_ids().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
                ))
            }
            Some(t) => t,
            None => *voters
                .iter()
                .max_by_key(|v| (matched_index(&m, **v), std::cmp::Reverse(**v)))
                .ok_or("no other voter to lead")?,
        };
        let addr = membership.get_node(&target).map(|n| n.addr.clone()).ok_or("the target has no address")?;
        Ok((target, addr))
    }

    async fn hand_over(&self, target: u64, addr: &str) -> Result<u64, String> {
        let channel = (self.dialer)(addr)
            .map_err(|e| format!("replica {target} has a bad address {addr}: {e}"))?
            .connect_timeout(Duration::from_millis(500))
            .connect()
            .await
            .map_err(|e| format!("cannot reach replica {target} at {addr}: {e}"))?;
        let mut client = QuorumClient::new(channel);
        client
            .campaign(CampaignRequest {})
            .await
            .map_err(|e| format!("replica {target} refused to campaign: {}", e.message()))?;
        let mut metrics = self.raft.metrics();
        let started = Instant::now();
        loop {
            let leader = metrics.borrow_and_update().current_leader;
            if let Some(l) = leader.filter(|l| *l != self.id) {
                tracing::info!(
                    from = self.id,
                    to = l,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "leadership transferred"
                );
                return Ok(l);
            }
            let left = TAKEOVER.saturating_sub(started.elapsed());
            if left.is_zero() || tokio::time::timeout(left, metrics.changed()).await.is_err() {
                return Err(format!("replica {target} did not take over within {}s", TAKEOVER.as_secs()));
            }
        }
    }

    /// On the transfer's target: campaign until this replica leads, another does, or time runs
    /// out. Returns at once; the campaigning goes on in the background.
    pub fn campaign(self: &std::sync::Arc<Self>) {
        let replica = self.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let old_leader = replica.raft.metrics().borrow().current_leader;
            while started.elapsed() < TAKEOVER {
                let leader = replica.raft.metrics().borrow().current_leader;
                if leader.is_some() && leader != old_leader {
                    return;
                }
                if let Err(e) = replica.raft.trigger().elect().await {
                    tracing::warn!(error = %e, "campaigning");
                    return;
                }
                tokio::time::sleep(CAMPAIGN_EVERY).await;
            }
        });
    }
}
