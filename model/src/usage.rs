//! What a job, or a step of it, used.

use serde::{Deserialize, Serialize};

/// What a job (or a step) used: the CPU time of its processes (those its main process waited
/// for) and the largest resident set among them, as each node measured it when they ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUsage {
    pub cpu_user_us: u64,
    pub cpu_system_us: u64,
    pub max_rss_kb: u64,
}

impl JobUsage {
    /// Everything a job used: its batch script's and its steps'.
    pub fn total(batch: Option<JobUsage>, steps: Option<JobUsage>) -> Option<JobUsage> {
        match (batch, steps) {
            (Some(b), Some(s)) => Some(b.and(s)),
            (b, s) => b.or(s),
        }
    }

    /// Another node's usage added: CPU times summed, the largest resident set kept.
    pub fn and(self, other: JobUsage) -> JobUsage {
        JobUsage {
            cpu_user_us: self.cpu_user_us.saturating_add(other.cpu_user_us),
            cpu_system_us: self.cpu_system_us.saturating_add(other.cpu_system_us),
            max_rss_kb: self.max_rss_kb.max(other.max_rss_kb),
        }
    }
}
