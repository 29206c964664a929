//! Accounts (Slurm's associations), QOS levels and fairshare usage: replicated state that the
//! scheduler reads and that apply charges when jobs end.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::Millis;

/// Limits on an account (Slurm's association limits).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssocLimits {
    /// Running jobs at once (`MaxJobs`).
    pub max_jobs: Option<u32>,
    /// GPUs in use by the account's running jobs (`GrpTRES=gres/gpu`).
    pub grp_gpus: Option<u32>,
    /// CPUs in use by the account's running jobs (`GrpTRES=cpu`).
    pub grp_cpus: Option<u32>,
    /// Longest time limit of one job (`MaxWall`).
    pub max_wall_s: Option<u64>,
    /// Memory in use by the account's running jobs, MiB (`GrpTRES=mem`).
    #[serde(default)]
    pub grp_mem_mb: Option<u64>,
    /// Nodes in use by the account's running jobs (`GrpTRES=node`).
    #[serde(default)]
    pub grp_nodes: Option<u32>,
    /// GPUs of a type in use by the account's running jobs (`GrpTRES=gres/gpu:h100`).
    #[serde(default)]
    pub grp_gpus_by_type: std::collections::BTreeMap<String, u32>,
}

/// A node of the account tree.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub name: String,
    /// `None` for the root of the tree.
    pub parent: Option<String>,
    /// Shares relative to its siblings.
    pub shares: u32,
    /// Users who may charge this account.
    pub users: BTreeSet<String>,
    pub limits: AssocLimits,
}

/// A quality of service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qos {
    pub name: String,
    pub priority: u32,
    pub max_wall_s: Option<u64>,
    pub max_gpus_per_user: Option<u32>,
    pub max_jobs_per_user: Option<u32>,
    /// The QOS whose jobs this one's preempt (`Preempt=`, with `PreemptType=preempt/qos`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempt: Vec<String>,
    /// What becomes of this QOS's jobs when preempted; `None`: their partition's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_mode: Option<crate::preempt::PreemptMode>,
    /// Seconds between a preempted job's SIGTERM and SIGKILL (`GraceTime`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub grace_time_s: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// An account's charged usage in TRES-seconds, as of `at`; it decays with the half-life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub value: f64,
    pub at: Millis,
}

impl Usage {
    /// The usage decayed to `now`.
    pub fn at(&self, now: Millis, half_life_ms: u64) -> f64 {
        if now <= self.at || half_life_ms == 0 {
            return self.value;
        }
        self.value * exp2_neg((now - self.at) as f64 / half_life_ms as f64)
    }
}

/// `2^-x` for `x >= 0`, computed only with IEEE basic operations (exactly rounded, the same on
/// every platform), so that every replica decays usage to the same bits. `powf` and `exp2` come
/// from the platform's math library and may differ in the last bit between builds.
pub fn exp2_neg(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 {
        return 1.0;
    }
    if x >= 1000.0 {
        return 0.0;
    }
    let n = x.floor();
    let f = x - n;
    // e^y for y = -f ln 2 in (-0.7, 0]: 24 Taylor terms are exact to well below 1e-16.
    let y = -f * std::f64::consts::LN_2;
    let mut term = 1.0;
    let mut sum = 1.0;
    for k in 1..=24 {
        term *= y / f64::from(k);
        sum += term;
    }
    // 2^-n exactly, by building the float: n < 1000 keeps it a normal number.
    let scale = f64::from_bits((1023 - n as u64) << 52);
    sum * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp2_neg_is_accurate() {
        for x in [0.0f64, 0.25, 0.5, 1.0, 1.5, 3.7, 10.0, 52.3] {
            let want = (-x).exp2();
            assert!((exp2_neg(x) - want).abs() <= want * 1e-14, "2^-{x}: {} vs {want}", exp2_neg(x));
        }
        assert_eq!(exp2_neg(2000.0), 0.0);
        let u = Usage { value: 100.0, at: 0 };
        assert!((u.at(7_000, 7_000) - 50.0).abs() < 1e-9);
        assert!((u.at(21_000, 7_000) - 12.5).abs() < 1e-9);
    }
}
