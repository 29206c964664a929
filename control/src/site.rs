//! The replicated settings written back as the controllers' TOML (`quorum admin config`):
//! partitions, accounts, QOS, licenses and topology as the cluster holds them now, in the form
//! that seeds a new cluster the same ([`crate::config::ControllerConfig::parse_site`] reads it).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{AccountConfig, PartitionConfig, QosConfig, SwitchConfig};
use crate::model::parse::format_duration;
use crate::model::{Account, Partition, Qos};
use quorum_state::ClusterState;

/// A partition as its `[[partitions]]` section writes it.
pub fn partition_config(p: &Partition) -> PartitionConfig {
    let time = |t: Option<u64>| t.map(format_duration);
    PartitionConfig {
        name: p.name.clone(),
        nodes: p.nodes.clone(),
        default: p.default,
        max_time: time(p.max_time_s),
        default_time: time(p.default_time_s),
        default_mem_per_cpu: Some(format!("{}M", p.default_mem_per_cpu_mb)),
        priority_tier: p.priority_tier,
        max_nodes: p.max_nodes,
        exclusive: p.exclusive,
        oversubscribe: (!p.oversubscribe.is_no()).then(|| p.oversubscribe.to_string()),
        preempt_mode: p.preempt_mode.map(|m| m.name().to_ascii_lowercase()),
        grace_time: (p.grace_time_s > 0).then_some(p.grace_time_s),
        allow_accounts: p.access.allow_accounts.clone(),
        deny_accounts: p.access.deny_accounts.clone(),
        allow_qos: p.access.allow_qos.clone(),
        deny_qos: p.access.deny_qos.clone(),
        state: (!p.state.is_up()).then(|| p.state.name().to_string()),
    }
}

fn tres(t: &crate::model::TresLimit) -> Option<String> {
    (!t.is_empty()).then(|| t.to_slurm())
}

fn tres_mins(t: &crate::model::TresMins) -> Option<String> {
    (!t.is_empty()).then(|| t.to_slurm())
}

/// A QOS as its `[[qos]]` section writes it.
pub fn qos_config(q: &Qos) -> QosConfig {
    QosConfig {
        name: q.name.clone(),
        priority: q.priority,
        max_wall: q.max_wall_s.map(format_duration),
        max_gpus_per_user: q.max_gpus_per_user,
        max_jobs_per_user: q.max_jobs_per_user,
        preempt: q.preempt.clone(),
        preempt_mode: q.preempt_mode.map(|m| m.name().to_ascii_lowercase()),
        grace_time: (q.grace_time_s > 0).then_some(q.grace_time_s),
        max_tres_per_job: tres(&q.max_tres_per_job),
        max_tres_per_user: tres(&q.max_tres_per_user),
        grp_tres: tres(&q.grp_tres),
        grp_jobs: q.grp_jobs,
        grp_tres_mins: tres_mins(&q.grp_tres_mins),
        max_submit_jobs_per_user: q.max_submit_jobs_per_user,
        no_decay: q.no_decay,
    }
}

/// An account as its `[[accounts]]` section writes it.
pub fn account_config(a: &Account) -> AccountConfig {
    let l = &a.limits;
    AccountConfig {
        name: a.name.clone(),
        parent: a.parent.clone(),
        shares: a.shares,
        users: a.users.iter().cloned().collect(),
        max_jobs: l.max_jobs,
        grp_gpus: l.grp_gpus,
        grp_cpus: l.grp_cpus,
        max_wall: l.max_wall_s.map(format_duration),
        grp_mem: l.grp_mem_mb.map(|m| format!("{m}M")),
        grp_nodes: l.grp_nodes,
        grp_gpus_by_type: l.grp_gpus_by_type.clone(),
        max_tres_per_job: tres(&l.max_tres_per_job),
        max_submit_jobs: l.max_submit_jobs,
        grp_tres_mins: tres_mins(&l.grp_tres_mins),
        user_shares: a.user_shares.clone(),
        qos: a.qos.clone(),
        default_qos: a.default_qos.clone(),
    }
}

/// The sections `quorum admin config` prints, in the controllers' file's names.
#[derive(Serialize)]
struct Site {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    licenses: BTreeMap<String, u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    partitions: Vec<PartitionConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    qos: Vec<QosConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    accounts: Vec<AccountConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    switches: Vec<SwitchConfig>,
}

/// The replicated settings as TOML, after a comment that says what they are.
pub fn site_toml(state: &ClusterState, index: u64) -> String {
    // Accounts parents first, as a file seeds them; then by name.
    let mut accounts: Vec<&Account> = Vec::new();
    let mut left: Vec<&Account> = state.accounts.values().collect();
    while !left.is_empty() {
        let (ready, rest): (Vec<&Account>, Vec<&Account>) = left.into_iter().partition(|a| {
            a.parent.as_ref().is_none_or(|p| accounts.iter().any(|d| &d.name == p) || !state.accounts.contains_key(p))
        });
        if ready.is_empty() {
            accounts.extend(rest);
            break;
        }
        accounts.extend(ready);
        left = rest;
    }
    let mut by_switch: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (node, switch) in &state.switches {
        by_switch.entry(switch).or_default().push(node.clone());
    }
    let site = Site {
        licenses: state.licenses.clone(),
        partitions: state.partitions.values().map(partition_config).collect(),
        qos: state.qos.values().map(qos_config).collect(),
        accounts: accounts.into_iter().map(account_config).collect(),
        switches: by_switch
            .into_iter()
            .map(|(name, nodes)| SwitchConfig { name: name.to_string(), nodes: nodes.join(",") })
            .collect(),
    };
    let body = toml::to_string(&site).unwrap_or_else(|e| format!("# could not be written as TOML: {e}\n"));
    format!(
        "# The cluster's replicated settings at log index {index}: partitions, QOS, accounts, licenses and\n\
         # topology, as a controller's configuration file seeds them. The scheduler policy and each\n\
         # replica's own settings are in the replicas' files.\n{body}"
    )
}
