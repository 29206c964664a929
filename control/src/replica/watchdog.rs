//! A follower that stops hearing from its leader and finds the leader's process gone campaigns as
//! soon as the other followers' leader lease has run out, instead of waiting out openraft's own
//! timer (the lease plus a further election timeout, more after a collision).
//!
//! openraft 0.9 lets a follower whose vote is committed elect only after `election_timeout_max`
//! (the leader lease) plus its own random election timeout, and makes it wait twice more that
//! after meeting a longer log: a crashed leader then costs 0.5–2 s. Here the followers take turns
//! by id, one step apart, from just after the lease: the first one with the longest log wins, and
//! a follower that would lose to a longer log has made way by the time the next one campaigns.
//!
//! Only a leader whose client port does not accept a connection counts as gone. One that answers
//! but does not replicate (partitioned from this replica, or handing leadership over) is left to
//! openraft's own timers, so a transfer picks its target and a partition its usual majority.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::ServerState;
use tokio::sync::watch;

use super::Replica;

/// How often the follower looks.
const TICK: Duration = Duration::from_millis(20);
/// After the lease, so that the other followers' leases have surely run out.
const MARGIN: Duration = Duration::from_millis(30);
/// Between the turns of successive followers.
const STEP: Duration = Duration::from_millis(80);
/// How long a connection to the leader's client port may take.
const PROBE: Duration = Duration::from_millis(150);

/// Whether the process at `addr` is there at all: its port accepts a connection. A killed
/// process's port refuses at once, a dead host's does not answer; a live process accepts even
/// while it is too busy to answer a request (applying a large entry on a loaded machine), and
/// such a leader must not be deposed by this shortcut: it is left to openraft's timers. (A probe
/// that waited for an answer once deposed busy leaders again and again under 100,000-task arrays.)
async fn answers(addr: &str) -> bool {
    matches!(tokio::time::timeout(PROBE, tokio::net::TcpStream::connect(addr)).await, Ok(Ok(_)))
}

pub async fn watch_leader(replica: Arc<Replica>, lease: Duration, mut stop: watch::Receiver<bool>) {
    let mut last_leader: Option<u64> = None;
    let mut last_campaign: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = stop.changed() => return,
        }
        let (state, leader, turn, leader_addr) = {
            let m = replica.raft.metrics();
            let m = m.borrow();
            if let Some(l) = m.current_leader {
                last_leader = Some(l);
            }
            let membership = m.membership_config.membership();
            let voters: Vec<u64> = membership.voter_ids().filter(|v| Some(*v) != last_leader).collect();
            let turn = voters.iter().position(|v| *v == replica.id);
            let addr = last_leader.and_then(|l| membership.get_node(&l)).map(|n| n.addr.clone());
            (m.state, m.current_leader, turn, addr)
        };
        let (Some(turn), Some(silent), Some(leader_addr)) = (turn, replica.leader_contact.silent_for(), leader_addr)
        else {
            continue;
        };
        if state != ServerState::Follower || last_leader == Some(replica.id) {
            continue;
        }
        let due = lease + MARGIN + STEP * turn as u32;
        if silent < due || last_campaign.is_some_and(|t| t.elapsed() < lease) {
            continue;
        }
        if answers(&leader_addr).await {
            continue;
        }
        last_campaign = Some(Instant::now());
        tracing::info!(
            replica = replica.id,
            leader = ?leader.or(last_leader),
            silent_ms = silent.as_millis() as u64,
            "the leader is gone: campaigning"
        );
        if let Err(e) = replica.raft.trigger().elect().await {
            tracing::warn!(error = %e, "campaigning");
        }
    }
}
