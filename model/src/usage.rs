//! What a job, or a step of it, used.

use serde::{Deserialize, Serialize};

/// What a job (or a step) used: the CPU time of its processes (those its main process waited
/// for) and the largest resident set among them, as each node measured it when they ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUsage {
    pub cpu_user_us: u64,
    pub cpu_system_us: u64,
    pub max_rss_kb: u64,
    /// Its GPUs, sampled by each node's agent at every GPU check while it ran (from feature
    /// level 16): how many samples (one per GPU per check), the sum of their utilization in
    /// percent, the most memory one of its GPUs held (MiB), and the energy its GPUs drew (mJ).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_samples: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_util_sum: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_mem_max_mb: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_energy_mj: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl JobUsage {
    /// Everything a job used: its batch script's and its steps'.
    pub fn total(batch: Option<JobUsage>, steps: Option<JobUsage>) -> Option<JobUsage> {
        match (batch, steps) {
            (Some(b), Some(s)) => Some(b.and(s)),
            (b, s) => b.or(s),
        }
    }

    /// Another node's usage added: CPU times, GPU samples and energy summed, the largest
    /// resident set and GPU memory kept.
    pub fn and(self, other: JobUsage) -> JobUsage {
        JobUsage {
            cpu_user_us: self.cpu_user_us.saturating_add(other.cpu_user_us),
            cpu_system_us: self.cpu_system_us.saturating_add(other.cpu_system_us),
            max_rss_kb: self.max_rss_kb.max(other.max_rss_kb),
            gpu_samples: self.gpu_samples.saturating_add(other.gpu_samples),
            gpu_util_sum: self.gpu_util_sum.saturating_add(other.gpu_util_sum),
            gpu_mem_max_mb: self.gpu_mem_max_mb.max(other.gpu_mem_max_mb),
            gpu_energy_mj: self.gpu_energy_mj.saturating_add(other.gpu_energy_mj),
        }
    }

    /// Whether it says anything of GPUs (what a replica below level 16 cannot record).
    pub fn has_gpu(&self) -> bool {
        self.gpu_samples > 0 || self.gpu_mem_max_mb > 0 || self.gpu_energy_mj > 0
    }

    /// Without what it says of GPUs.
    pub fn without_gpu(self) -> JobUsage {
        JobUsage {
            cpu_user_us: self.cpu_user_us,
            cpu_system_us: self.cpu_system_us,
            max_rss_kb: self.max_rss_kb,
            ..Default::default()
        }
    }

    /// Its GPUs' mean utilization over the samples, in percent (`None` without a sample).
    pub fn gpu_util_pct(&self) -> Option<f64> {
        (self.gpu_samples > 0).then(|| self.gpu_util_sum as f64 / self.gpu_samples as f64)
    }
}
