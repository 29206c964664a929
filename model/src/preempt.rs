//! Preemption, as Slurm configures it: `PreemptType` says who may preempt whom (a higher
//! partition tier preempts a lower one, or a QOS lists the QOS it preempts), `PreemptMode` what
//! becomes of a preempted job (requeued, cancelled, or suspended), `GraceTime` how long a
//! requeued or cancelled one has between SIGTERM and SIGKILL. The scheduler plans preemptions ([`PlannedPreemption`]); apply marks
//! the victims ([`Preempting`]) and gives the preemptor their nodes ([`Claim`]).

use serde::{Deserialize, Serialize};

use crate::{JobId, Millis};

/// Who may preempt whom (Slurm's `PreemptType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PreemptType {
    /// No preemption (`preempt/none`).
    #[default]
    Off,
    /// A job of a higher `priority_tier` partition preempts jobs of lower tiers on its nodes
    /// (`preempt/partition_prio`).
    PartitionPrio,
    /// A job preempts jobs whose QOS its QOS lists in `preempt` (`preempt/qos`).
    Qos,
}

impl PreemptType {
    pub fn parse(s: &str) -> Result<PreemptType, String> {
        match s.trim().to_ascii_lowercase().trim_start_matches("preempt/") {
            "none" | "off" => Ok(PreemptType::Off),
            "partition_prio" => Ok(PreemptType::PartitionPrio),
            "qos" => Ok(PreemptType::Qos),
            other => Err(format!("unknown preempt type '{other}' (none, partition_prio, qos)")),
        }
    }

    pub fn is_off(&self) -> bool {
        *self == PreemptType::Off
    }
}

/// What becomes of a preempted job (Slurm's `PreemptMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PreemptMode {
    /// Not preemptable.
    #[default]
    Off,
    /// Ended, PREEMPTED.
    Cancel,
    /// Back to the queue, to run again (counting a restart).
    Requeue,
    /// Frozen in place (level 23): it keeps its memory and GPUs and lends its CPUs to the
    /// preemptor; it is resumed, its time limit lengthened by the pause, once they are free.
    Suspend,
}

impl PreemptMode {
    pub fn parse(s: &str) -> Result<PreemptMode, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Ok(PreemptMode::Off),
            "cancel" => Ok(PreemptMode::Cancel),
            "requeue" => Ok(PreemptMode::Requeue),
            "suspend" => Ok(PreemptMode::Suspend),
            "gang" => Err(format!(
                "preempt mode '{s}' (time-slicing) is not supported; 'suspend' suspends a preempted job until its CPUs are free again"
            )),
            other => Err(format!("unknown preempt mode '{other}' (off, cancel, requeue, suspend)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PreemptMode::Off => "OFF",
            PreemptMode::Cancel => "CANCEL",
            PreemptMode::Requeue => "REQUEUE",
            PreemptMode::Suspend => "SUSPEND",
        }
    }

    /// Whether a job preempted this way is stopped (and gets SIGTERM, then SIGKILL after the
    /// grace time) rather than frozen in place.
    pub fn stops(self) -> bool {
        matches!(self, PreemptMode::Cancel | PreemptMode::Requeue)
    }
}

/// A running job the scheduler chose to make room: it has been sent SIGTERM, and SIGKILL
/// follows after `grace_s`; when it ends it is requeued or ends PREEMPTED, as `mode` says. With
/// `mode` SUSPEND it was suspended at once instead, lending its CPUs until it is resumed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preempting {
    /// The job it makes room for.
    pub by: JobId,
    pub at: Millis,
    pub mode: PreemptMode,
    pub grace_s: u64,
}

/// The nodes a pending job preempted others for: held for it (nothing else is started there
/// across its start) until it starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub nodes: Vec<String>,
}

/// A running job to preempt, and what becomes of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Victim {
    pub job_id: JobId,
    pub mode: PreemptMode,
    pub grace_s: u64,
}

/// A preemption the scheduler planned: `victims` stop so that `job_id` starts on `nodes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedPreemption {
    pub job_id: JobId,
    pub nodes: Vec<String>,
    pub victims: Vec<Victim>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_names_read() {
        assert_eq!(PreemptType::parse("preempt/partition_prio"), Ok(PreemptType::PartitionPrio));
        assert_eq!(PreemptType::parse("QOS"), Ok(PreemptType::Qos));
        assert_eq!(PreemptType::parse("preempt/none"), Ok(PreemptType::Off));
        assert!(PreemptType::parse("preempt/x").unwrap_err().contains("unknown preempt type 'x'"));
        assert_eq!(PreemptMode::parse("REQUEUE"), Ok(PreemptMode::Requeue));
        assert_eq!(PreemptMode::parse("Suspend"), Ok(PreemptMode::Suspend));
        assert!(PreemptMode::parse("gang").unwrap_err().contains("not supported"));
        assert!(PreemptMode::Requeue.stops() && !PreemptMode::Suspend.stops());
    }
}
