//! Recurring jobs: four times a second the leader looks for cron entries whose next firing has
//! come and proposes a `FireCron` for each, with the entry's next firing after now. Apply fires
//! an entry only at the firing it waits for, so a leader that proposes one again after a
//! failover (or two leaders of one moment) submit one job; an entry whose firings were missed
//! (no leader then) fires once, late, and then on schedule.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::model::cron::{Schedule, Zone};
use crate::model::Millis;
use crate::replica::{now_ms, Replica};
use quorum_state::{ClusterState, Command, Response, CRON_LEVEL};

/// The most firings one look proposes; the rest are due at the next.
const MAX_PER_LOOK: usize = 1_000;

/// The firings due at `now`: one per entry whose next firing has come, however many it missed,
/// with its next firing after now (`Millis::MAX`: never again).
pub fn due(state: &ClusterState, now: Millis) -> Vec<Command> {
    if state.cluster_level() < CRON_LEVEL {
        return Vec::new();
    }
    state
        .cron
        .values()
        .filter(|e| e.next_ms <= now)
        .take(MAX_PER_LOOK)
        .map(|e| {
            let next_ms = match (Schedule::parse(&e.schedule), Zone::parse(&e.zone)) {
                (Ok(s), Ok(z)) => s.next_after(now.max(e.next_ms), z).unwrap_or(Millis::MAX),
                _ => Millis::MAX,
            };
            Command::FireCron { id: e.id, due_ms: e.next_ms, next_ms, now }
        })
        .collect()
}

pub async fn cron_loop(replica: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let due = due(&replica.shared.read().state, now_ms());
        for command in due {
            let Command::FireCron { id, due_ms, .. } = command else { continue };
            match replica.write(command).await {
                Ok((_, Response::CronFired { job: Some(job), .. })) => {
                    tracing::info!(entry = id, job, due_ms, "cron entry fired");
                }
                Ok((_, Response::CronFired { error, .. })) => {
                    tracing::warn!(entry = id, due_ms, error = error.unwrap_or_default(), "cron entry fired, no job");
                }
                Ok((_, other)) => tracing::debug!(entry = id, ?other, "cron firing not applied"),
                Err(e) => {
                    tracing::debug!(entry = id, error = %e, "proposing a cron firing");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cron::CronEntry;

    fn entry(next_ms: Millis) -> CronEntry {
        CronEntry {
            id: 1,
            user: "alice".into(),
            schedule: "*/10 * * * * *".into(),
            zone: "UTC".into(),
            spec: quorum_state::testing::spec(&["true"]),
            next_ms,
            added_ms: 0,
            fired: 0,
            last_fired_ms: None,
            last_job: None,
            last_error: None,
        }
    }

    #[test]
    fn a_missed_firing_is_proposed_once_and_the_next_comes_after_now() {
        let mut state = ClusterState::new();
        state.cron.insert(1, entry(1_000_000));
        // Below the level that applies cron entries, nothing is proposed.
        assert!(due(&state, 2_000_000).is_empty());
        let level = quorum_state::ReplicaVersion { level: quorum_state::FEATURE_LEVEL, version: "test".into() };
        state.replica_versions.insert(1, level);
        // Not yet due.
        assert!(due(&state, 999_999).is_empty());
        // Due on time: the next is 10 s later.
        assert_eq!(
            due(&state, 1_000_000),
            vec![Command::FireCron { id: 1, due_ms: 1_000_000, next_ms: 1_010_000, now: 1_000_000 }]
        );
        // An hour of firings missed: one firing, and the next after now.
        let late = 1_000_000 + 3_600_000 + 3_000;
        assert_eq!(
            due(&state, late),
            vec![Command::FireCron { id: 1, due_ms: 1_000_000, next_ms: 4_610_000, now: late }]
        );
    }
}
