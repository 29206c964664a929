//! The replicated settings follow the leader's configuration file: policy and topology on
//! every new leadership; partitions, accounts and QOS once (after that they change at run time,
//! through the API: `scontrol create|update|delete partition`, `sacctmgr`). Before the cluster's
//! level records partitions changed at run time (32), partitions too follow every new leader.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::ClusterSettings;
use crate::replica::{now_ms, Replica};
use quorum_model::preempt::PreemptMode;
use quorum_state::Command;

/// The commands that make the replicated settings match this replica's configuration.
fn settings_commands(replica: &Replica, settings: &ClusterSettings) -> Vec<Command> {
    let applied = replica.shared.read();
    let state = &applied.state;
    let now = now_ms();
    let mut commands = Vec::new();
    let current: Vec<_> = state.partitions.values().cloned().collect();
    let mut wanted = configured_partitions(settings);
    // Who may use a partition needs every replica at level 22: until then the partitions are
    // open to all, and the rest of their settings apply ([`settings_wait`]).
    if state.cluster_level() < quorum_state::PARTITION_ACCESS_LEVEL {
        for p in &mut wanted {
            p.access = Default::default();
        }
    }
    // Suspending preempted jobs needs every replica at level 23: until then jobs that would
    // be suspended are not preempted at all (mode OFF), rather than stopped ([`settings_wait`]).
    let suspend_waits = state.cluster_level() < quorum_state::PREEMPT_SUSPEND_LEVEL;
    let mut policy = settings.policy.clone();
    if suspend_waits {
        for p in wanted.iter_mut().filter(|p| p.preempt_mode == Some(PreemptMode::Suspend)) {
            p.preempt_mode = Some(PreemptMode::Off);
        }
        if policy.preempt_mode == PreemptMode::Suspend {
            policy.preempt_mode = PreemptMode::Off;
        }
    }
    // Sharing CPUs needs every replica at level 24: until then the partitions' jobs do not
    // share them ([`settings_wait`]).
    if state.cluster_level() < quorum_state::OVERSUBSCRIBE_LEVEL {
        for p in &mut wanted {
            p.oversubscribe = Default::default();
        }
    }
    // What the cluster holds at once needs every replica at level 27: until then there is no
    // such limit ([`settings_wait`]).
    if state.cluster_level() < quorum_state::QUEUE_LIMITS_LEVEL {
        policy.queue = Default::default();
    }
    // TRES weights need every replica at level 36: until then they weigh nothing
    // ([`settings_wait`]).
    if state.cluster_level() < quorum_state::TRES_WEIGHTS_LEVEL {
        policy.tres_weights = Default::default();
    }
    if state.cluster_level() >= quorum_state::LIVE_CONFIG_LEVEL {
        // Seeded once, from whichever leader first sees the level: after that the replicated
        // partitions are the truth.
        if !state.partitions_seeded {
            commands.push(Command::SeedPartitions { partitions: wanted, now });
        }
    } else if current != wanted {
        commands.push(Command::SetPartitions { partitions: wanted, now });
    }
    if state.policy != policy {
        commands.push(Command::SetPolicy { policy, now });
    }
    if state.switches != settings.switches {
        commands.push(Command::SetTopology { switches: settings.switches.clone(), now });
    }
    // Licenses need every replica at level 12: until the leader has recorded that (a new
    // cluster's first moments, an upgrade under way) they wait ([`settings_wait`]).
    if state.licenses != settings.licenses && state.cluster_level() >= quorum_state::DEPENDENCY_FORMS_LEVEL {
        commands.push(Command::SetLicenses { licenses: settings.licenses.clone(), now });
    }
    // Accounts and QOS are seeded once; after that they change through the API.
    let seeds_wait = suspend_waits && settings.qos.iter().any(suspends);
    if state.accounts.is_empty()
        && state.qos.is_empty()
        && !(settings.accounts.is_empty() && settings.qos.is_empty())
        && !seeds_wait
    {
        commands.push(Command::SeedAccounts { accounts: settings.accounts.clone(), qos: settings.qos.clone(), now });
    }
    commands
}

/// This replica's configured partitions in name order, as the replicated ones are kept.
fn configured_partitions(settings: &ClusterSettings) -> Vec<quorum_model::Partition> {
    let mut wanted = settings.partitions.clone();
    wanted.sort_by(|a, b| a.name.cmp(&b.name));
    wanted
}

/// Whether a QOS's jobs are suspended when preempted.
fn suspends(qos: &quorum_model::Qos) -> bool {
    qos.preempt_mode == Some(PreemptMode::Suspend)
}

/// Whether the configured licenses, who may use the partitions, suspending preempted jobs, or
/// sharing CPUs, wait for the cluster's level to reach the one that records them.
fn settings_wait(replica: &Replica, settings: &ClusterSettings) -> bool {
    let applied = replica.shared.read();
    let level = applied.state.cluster_level();
    let suspend = settings.policy.preempt_mode == PreemptMode::Suspend
        || settings.partitions.iter().any(|p| p.preempt_mode == Some(PreemptMode::Suspend))
        || (applied.state.qos.is_empty() && settings.qos.iter().any(suspends));
    (!applied.state.partitions_seeded && level < quorum_state::LIVE_CONFIG_LEVEL)
        || (applied.state.licenses != settings.licenses && level < quorum_state::DEPENDENCY_FORMS_LEVEL)
        || (settings.partitions.iter().any(|p| !p.access.is_open()) && level < quorum_state::PARTITION_ACCESS_LEVEL)
        || (suspend && level < quorum_state::PREEMPT_SUSPEND_LEVEL)
        || (settings.partitions.iter().any(|p| !p.oversubscribe.is_no()) && level < quorum_state::OVERSUBSCRIBE_LEVEL)
        || (!settings.policy.queue.is_none() && level < quorum_state::QUEUE_LIMITS_LEVEL)
        || (!settings.policy.tres_weights.is_zero() && level < quorum_state::TRES_WEIGHTS_LEVEL)
}

/// Says, once a leadership, when this replica's configured partitions are not the cluster's:
/// its file seeded a cluster that has since changed them, or another replica's file did.
fn warn_partitions_differ(replica: &Replica, settings: &ClusterSettings) {
    let applied = replica.shared.read();
    if !applied.state.partitions_seeded {
        return;
    }
    if !applied.state.partitions.values().eq(configured_partitions(settings).iter()) {
        tracing::warn!(
            "the partitions in this replica's configuration are not the cluster's; the cluster's are in force \
             (they change with scontrol create|update|delete partition; quorum admin config prints them)"
        );
    }
}

pub(super) async fn sync_settings(replica: Arc<Replica>, settings: ClusterSettings, mut stop: watch::Receiver<bool>) {
    warn_partitions_differ(&replica, &settings);
    loop {
        let commands = settings_commands(&replica, &settings);
        if commands.is_empty() {
            if !settings_wait(&replica, &settings) {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = stop.changed() => return,
            }
            continue;
        }
        let mut failed = false;
        for command in commands {
            if let Err(e) = replica.write(command).await {
                tracing::warn!(error = %e, "syncing cluster settings");
                failed = true;
                break;
            }
        }
        if !failed {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.changed() => return,
        }
    }
}
