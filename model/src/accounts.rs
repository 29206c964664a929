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
    /// What one job may ask for (`MaxTRESPerJob`). From feature level 20.
    #[serde(default, skip_serializing_if = "TresLimit::is_empty")]
    pub max_tres_per_job: TresLimit,
    /// Jobs pending or running at once, per user of the account and its sub-accounts
    /// (`MaxSubmitJobs`); a submit past it is refused. From feature level 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_submit_jobs: Option<u32>,
    /// A budget of TRES-minutes (`GrpTRESMins`): no job of the account starts once its decayed
    /// usage and what its running jobs have used so far reach it. From feature level 20.
    #[serde(default, skip_serializing_if = "TresMins::is_empty")]
    pub grp_tres_mins: TresMins,
}

impl AssocLimits {
    /// Whether it sets a limit that replicas below feature level 20 do not know.
    pub fn uses_level_20(&self) -> bool {
        !self.max_tres_per_job.is_empty() || self.max_submit_jobs.is_some() || !self.grp_tres_mins.is_empty()
    }
}

/// Limits on trackable resources (Slurm's TRES): CPUs, GPUs, memory and nodes; `None` is no
/// limit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TresLimit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
}

/// Which TRES a [`TresLimit`] found exceeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tres {
    Cpu,
    Gpu,
    Mem,
    Node,
}

impl TresLimit {
    pub fn is_empty(&self) -> bool {
        *self == TresLimit::default()
    }

    /// The first TRES of which `cpus`, `gpus`, `mem_mb` and `nodes` together ask for more than
    /// the limit allows.
    pub fn exceeded(&self, cpus: i64, gpus: i64, mem_mb: i64, nodes: i64) -> Option<Tres> {
        let over = |limit: Option<u64>, n: i64| limit.is_some_and(|m| n > 0 && n as u64 > m);
        if over(self.cpus.map(u64::from), cpus) {
            Some(Tres::Cpu)
        } else if over(self.gpus.map(u64::from), gpus) {
            Some(Tres::Gpu)
        } else if over(self.mem_mb, mem_mb) {
            Some(Tres::Mem)
        } else if over(self.nodes.map(u64::from), nodes) {
            Some(Tres::Node)
        } else {
            None
        }
    }

    /// Slurm's way of writing it: `cpu=4,mem=8G,node=2,gres/gpu=2`.
    pub fn to_slurm(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.cpus {
            parts.push(format!("cpu={n}"));
        }
        if let Some(m) = self.mem_mb {
            parts.push(format!("mem={m}M"));
        }
        if let Some(n) = self.nodes {
            parts.push(format!("node={n}"));
        }
        if let Some(n) = self.gpus {
            parts.push(format!("gres/gpu={n}"));
        }
        parts.join(",")
    }

    /// Reads Slurm's TRES list (`cpu=4,mem=8G,node=2,gres/gpu=2`; `gpu` is taken for
    /// `gres/gpu`); an empty string is no limit.
    pub fn parse(text: &str) -> Result<TresLimit, String> {
        let mut out = TresLimit::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) =
                part.split_once('=').ok_or_else(|| format!("'{part}' is not NAME=VALUE (like cpu=4 or gres/gpu=2)"))?;
            let count = || value.parse::<u32>().map_err(|_| format!("'{value}' in '{part}' is not a count"));
            match name.to_ascii_lowercase().as_str() {
                "cpu" | "cpus" => out.cpus = Some(count()?),
                "gres/gpu" | "gpu" | "gpus" => out.gpus = Some(count()?),
                "node" | "nodes" => out.nodes = Some(count()?),
                "mem" => out.mem_mb = Some(crate::parse::parse_mem_mb(value).map_err(|e| format!("'{part}': {e}"))?),
                other => return Err(format!("unknown TRES '{other}' in '{part}' (known: cpu, mem, node, gres/gpu)")),
            }
        }
        Ok(out)
    }
}

/// A budget of TRES-minutes (`GrpTRESMins=cpu=N,gres/gpu=M`); `None` is no budget.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TresMins {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u64>,
}

impl TresMins {
    pub fn is_empty(&self) -> bool {
        *self == TresMins::default()
    }

    /// Which budget `cpu_s` and `gpu_s` CPU- and GPU-seconds have spent, if either.
    pub fn spent(&self, cpu_s: f64, gpu_s: f64) -> Option<Tres> {
        let spent = |budget: Option<u64>, used_s: f64| budget.is_some_and(|m| used_s / 60.0 >= m as f64);
        if spent(self.cpu, cpu_s) {
            Some(Tres::Cpu)
        } else if spent(self.gpu, gpu_s) {
            Some(Tres::Gpu)
        } else {
            None
        }
    }

    pub fn to_slurm(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.cpu {
            parts.push(format!("cpu={n}"));
        }
        if let Some(n) = self.gpu {
            parts.push(format!("gres/gpu={n}"));
        }
        parts.join(",")
    }

    /// Reads `cpu=N,gres/gpu=M` (minutes); an empty string is no budget.
    pub fn parse(text: &str) -> Result<TresMins, String> {
        let mut out = TresMins::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) =
                part.split_once('=').ok_or_else(|| format!("'{part}' is not NAME=MINUTES (like cpu=6000)"))?;
            let minutes =
                value.parse::<u64>().map_err(|_| format!("'{value}' in '{part}' is not a number of minutes"))?;
            match name.to_ascii_lowercase().as_str() {
                "cpu" | "cpus" => out.cpu = Some(minutes),
                "gres/gpu" | "gpu" | "gpus" => out.gpu = Some(minutes),
                other => return Err(format!("unknown TRES '{other}' in '{part}' (budgets: cpu, gres/gpu)")),
            }
        }
        Ok(out)
    }
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
    /// Each user's shares of the account, relative to the others and to its sub-accounts
    /// (Slurm's user associations' `Fairshare=`); a user not named has 1. From level 20.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub user_shares: std::collections::BTreeMap<String, u32>,
    /// The QOS its users may use (Slurm's association `QOS=`), for it and its sub-accounts
    /// that name none; empty: its parent's. An account tree that names none allows the default
    /// QOS alone. From level 27.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub qos: Vec<String>,
    /// The QOS of its users' jobs that name none (`DefaultQOS=`), for it and its sub-accounts
    /// that name none; `None`: its parent's, and at the top `normal`. From level 27.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_qos: Option<String>,
}

impl Account {
    /// A user's shares of the account.
    pub fn user_shares_of(&self, user: &str) -> u32 {
        self.user_shares.get(user).copied().unwrap_or(1)
    }

    /// Whether it uses what replicas below feature level 20 do not know.
    pub fn uses_level_20(&self) -> bool {
        !self.user_shares.is_empty() || self.limits.uses_level_20()
    }

    /// Whether it names QOS, which replicas below feature level 27 do not know.
    pub fn uses_level_27(&self) -> bool {
        !self.qos.is_empty() || self.default_qos.is_some()
    }
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
    /// What one job may ask for (`MaxTRESPerJob`). From feature level 20.
    #[serde(default, skip_serializing_if = "TresLimit::is_empty")]
    pub max_tres_per_job: TresLimit,
    /// What one user's running jobs may hold together (`MaxTRESPerUser`), besides
    /// `max_gpus_per_user`. From feature level 20.
    #[serde(default, skip_serializing_if = "TresLimit::is_empty")]
    pub max_tres_per_user: TresLimit,
    /// What all the QOS's running jobs may hold together (`GrpTRES`). From feature level 20.
    #[serde(default, skip_serializing_if = "TresLimit::is_empty")]
    pub grp_tres: TresLimit,
    /// How many of its jobs may run at once (`GrpJobs`). From feature level 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grp_jobs: Option<u32>,
    /// A budget of TRES-minutes for all its jobs (`GrpTRESMins`). From feature level 20.
    #[serde(default, skip_serializing_if = "TresMins::is_empty")]
    pub grp_tres_mins: TresMins,
    /// Jobs pending or running at once per user (`MaxSubmitJobsPerUser`); a submit past it is
    /// refused. From feature level 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_submit_jobs_per_user: Option<u32>,
    /// Its usage does not decay (`Flags=NoDecay`): a `grp_tres_mins` budget is then spent for
    /// good. From feature level 20.
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_decay: bool,
}

impl Qos {
    /// Whether it sets what replicas below feature level 20 do not know.
    pub fn uses_level_20(&self) -> bool {
        !self.max_tres_per_job.is_empty()
            || !self.max_tres_per_user.is_empty()
            || !self.grp_tres.is_empty()
            || self.grp_jobs.is_some()
            || !self.grp_tres_mins.is_empty()
            || self.max_submit_jobs_per_user.is_some()
            || self.no_decay
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// An account's charged usage in TRES-seconds, as of `at`; it decays with the half-life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub value: f64,
    pub at: Millis,
    /// CPU-seconds and GPU-seconds, decayed alike, for `GrpTRESMins`. From feature level 20.
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub cpu_s: f64,
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub gpu_s: f64,
}

fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

impl Usage {
    /// Adds a charge at `now`: the usage so far decays to `now` first (unless `decay` is
    /// false, for a QOS with `NoDecay`).
    pub fn charge(&mut self, now: Millis, half_life_ms: u64, decay: bool, billed: f64, cpu_s: f64, gpu_s: f64) {
        let factor = if decay && now > self.at && half_life_ms > 0 {
            exp2_neg((now - self.at) as f64 / half_life_ms as f64)
        } else {
            1.0
        };
        self.value = self.value * factor + billed;
        self.cpu_s = self.cpu_s * factor + cpu_s;
        self.gpu_s = self.gpu_s * factor + gpu_s;
        self.at = self.at.max(now);
    }

    /// CPU- and GPU-seconds decayed to `now` (as charged, with `decay` false).
    pub fn tres_at(&self, now: Millis, half_life_ms: u64, decay: bool) -> (f64, f64) {
        if !decay || now <= self.at || half_life_ms == 0 {
            return (self.cpu_s, self.gpu_s);
        }
        let factor = exp2_neg((now - self.at) as f64 / half_life_ms as f64);
        (self.cpu_s * factor, self.gpu_s * factor)
    }

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
        let u = Usage { value: 100.0, at: 0, ..Default::default() };
        assert!((u.at(7_000, 7_000) - 50.0).abs() < 1e-9);
        assert!((u.at(21_000, 7_000) - 12.5).abs() < 1e-9);
    }

    #[test]
    fn tres_lists_read_as_slurm_writes_them() {
        let t = TresLimit::parse("cpu=16,mem=64G,node=2,gres/gpu=4").unwrap();
        assert_eq!(t, TresLimit { cpus: Some(16), gpus: Some(4), mem_mb: Some(65536), nodes: Some(2) });
        assert_eq!(t.to_slurm(), "cpu=16,mem=65536M,node=2,gres/gpu=4");
        assert_eq!(TresLimit::parse(&t.to_slurm()).unwrap(), t);
        assert_eq!(TresLimit::parse("").unwrap(), TresLimit::default());
        assert_eq!(t.exceeded(16, 4, 65536, 2), None, "at the limit is allowed");
        assert_eq!(t.exceeded(17, 0, 0, 1), Some(Tres::Cpu));
        assert_eq!(t.exceeded(1, 1, 70_000, 1), Some(Tres::Mem));
        for (bad, says) in [
            ("cpu", "is not NAME=VALUE"),
            ("cpu=x", "'x' in 'cpu=x' is not a count"),
            ("license/x=1", "unknown TRES 'license/x'"),
            ("mem=lots", "'mem=lots'"),
        ] {
            let e = TresLimit::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let m = TresMins::parse("cpu=60000,gres/gpu=600").unwrap();
        assert_eq!((m.cpu, m.gpu), (Some(60000), Some(600)));
        assert_eq!(m.to_slurm(), "cpu=60000,gres/gpu=600");
        assert_eq!(m.spent(60000.0 * 60.0 - 1.0, 0.0), None);
        assert_eq!(m.spent(60000.0 * 60.0, 0.0), Some(Tres::Cpu));
        assert_eq!(m.spent(0.0, 600.0 * 60.0), Some(Tres::Gpu));
        assert!(TresMins::parse("mem=5").unwrap_err().contains("budgets: cpu, gres/gpu"));
        // Charging decays what was there (unless told not to) and adds the new.
        let mut u = Usage::default();
        u.charge(0, 1000, true, 10.0, 6.0, 2.0);
        u.charge(1000, 1000, true, 10.0, 6.0, 2.0);
        assert_eq!((u.value, u.cpu_s, u.gpu_s, u.at), (15.0, 9.0, 3.0, 1000));
        assert_eq!(u.tres_at(2000, 1000, true), (4.5, 1.5));
        assert_eq!(u.tres_at(2000, 1000, false), (9.0, 3.0));
        u.charge(3000, 1000, false, 1.0, 1.0, 0.0);
        assert_eq!((u.cpu_s, u.at), (10.0, 3000));
    }
}
