//! `scontrol show config`: the configuration the leader runs with, under Slurm's names where
//! Slurm has one, as `KEY = VALUE` pairs in Slurm's (alphabetical) order. What comes from the
//! replica's configuration file is fixed when it starts ([`from_config`]); the scheduling policy
//! is read from the replicated state when asked ([`from_policy`]).

use crate::config::ControllerConfig;
use crate::model::policy::{BackfillMode, Policy, QueueOrder};
use crate::model::preempt::PreemptType;

/// A duration as Slurm's configuration shows it: `7-00:00:00`, `00:05:00`.
fn days(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    format!("{d}-{h:02}:{m:02}:{s:02}")
}

/// What the replica's configuration says.
pub fn from_config(c: &ControllerConfig) -> Vec<(String, String)> {
    let mut out = vec![
        ("AuthType", if c.security.insecure { "auth/munge (plaintext gRPC)" } else { "auth/munge" }.to_string()),
        ("ClusterName", "quorum".to_string()),
        ("MaxArraySize", c.limits.max_array_size.to_string()),
        ("MaxJobCount", c.limits.max_job_count.to_string()),
        ("MinJobAge", format!("{} sec", c.min_job_age_s)),
        ("MpiDefault", c.mpi_default.to_string()),
        (
            "PrivateData",
            if c.security.private_data.is_empty() { "none".into() } else { c.security.private_data.join(",") },
        ),
        ("SelectType", "select/cons_tres".to_string()),
        ("TaskPlugin", "task/cgroup,task/affinity".to_string()),
    ];
    if !c.licenses.is_empty() {
        let licenses: Vec<String> = c.licenses.iter().map(|(n, k)| format!("{n}:{k}")).collect();
        out.push(("Licenses", licenses.join(",")));
    }
    out.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// What the replicated scheduling policy says.
pub fn from_policy(p: &Policy) -> Vec<(String, String)> {
    let w = &p.weights;
    let preempt = match p.preempt_type {
        PreemptType::Off => "preempt/none",
        PreemptType::PartitionPrio => "preempt/partition_prio",
        PreemptType::Qos => "preempt/qos",
    };
    [
        ("PreemptMode", p.preempt_mode.name().to_string()),
        ("PreemptType", preempt.to_string()),
        ("PriorityDecayHalfLife", days(p.half_life_s)),
        ("PriorityMaxAge", days(p.max_age_s)),
        (
            "PriorityType",
            match p.ordering {
                QueueOrder::Multifactor => "priority/multifactor",
                QueueOrder::Fifo | QueueOrder::ShortestFirst => "priority/basic",
            }
            .to_string(),
        ),
        ("PriorityWeightAge", w.age.to_string()),
        ("PriorityWeightFairshare", w.fairshare.to_string()),
        ("PriorityWeightJobSize", w.job_size.to_string()),
        ("PriorityWeightPartition", w.partition.to_string()),
        ("PriorityWeightQOS", w.qos.to_string()),
        (
            "PriorityWeightTRES",
            match p.tres_weights.to_slurm() {
                t if t.is_empty() => "(null)".to_string(),
                t => t,
            },
        ),
        (
            "SchedulerType",
            match p.backfill {
                BackfillMode::None => "sched/builtin",
                BackfillMode::Easy | BackfillMode::Conservative => "sched/backfill",
            }
            .to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Both, in Slurm's order (by name, ignoring case).
pub fn merged(fixed: &[(String, String)], policy: &Policy) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = fixed.iter().cloned().chain(from_policy(policy)).collect();
    all.sort_by_key(|(k, _)| k.to_ascii_lowercase());
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_reads_as_slurms_does() {
        let c: ControllerConfig = toml::from_str(
            "id = 1\nlisten = \"127.0.0.1:1\"\ndata_dir = \"/d\"\nreplicas = []\nmin_job_age_s = 600\n\
             mpi_default = \"pmi2\"\n[security]\ninsecure = true\n",
        )
        .unwrap();
        let all = merged(&from_config(&c), &Policy::default());
        let get = |k: &str| all.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("MinJobAge"), Some("600 sec"));
        assert_eq!(get("MpiDefault"), Some("pmi2"));
        assert_eq!(get("MaxArraySize"), Some("1001"));
        assert_eq!(get("ClusterName"), Some("quorum"));
        assert_eq!(get("SchedulerType"), Some("sched/backfill"));
        assert_eq!(get("PriorityDecayHalfLife"), Some("7-00:00:00"));
        let keys: Vec<String> = all.iter().map(|(k, _)| k.to_ascii_lowercase()).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
    }
}
