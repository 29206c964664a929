//! The scheduler's policy: ordering, backfill, priority weights and fairshare parameters.
//! Replicated in the state so that every leader schedules alike.

use serde::{Deserialize, Serialize};

/// The order in which pending jobs are considered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueueOrder {
    /// Slurm's multifactor priority.
    Multifactor,
    /// First come, first served.
    Fifo,
    /// Shortest time limit first.
    ShortestFirst,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BackfillMode {
    /// Strict order: the first blocked job of a partition blocks every job behind it.
    None,
    /// A reservation for the first blocked job; later jobs start now only if they delay it not.
    Easy,
    /// Reservations for the first `reservations` blocked jobs.
    Conservative,
}

/// In what order backfill tries the jobs behind the reservations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BackfillOrder {
    /// The queue's order.
    #[default]
    Priority,
    /// Shortest planned run time first (the prediction with `Policy::predict`, else the time
    /// limit): Tsafrir, Etsion and Feitelson's SJBF, which with predictions is their EASY++.
    /// The reservations are made in the queue's order all the same.
    Shortest,
}

impl BackfillOrder {
    pub fn is_priority(&self) -> bool {
        *self == BackfillOrder::Priority
    }
}

/// How much a cluster holds at once, as Slurm's `MaxJobCount`, `MaxArraySize` and a default
/// `MaxSubmitJobs` per user: what keeps one user (or a script gone wrong) from filling the
/// replicas' memory. `None` is no limit; a new cluster gets the configured ones (see the
/// controllers' `[limits]`). From feature level 27.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueLimits {
    /// Jobs pending or running at once in the whole cluster (each task of an array counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_job_count: Option<u32>,
    /// An array's task ids are below this (Slurm's `MaxArraySize`: 1001 allows 0-1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_array_size: Option<u32>,
    /// Jobs pending or running at once per user, where neither the user's account nor the
    /// job's QOS sets a `MaxSubmitJobs` of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_submit_jobs_per_user: Option<u32>,
}

impl QueueLimits {
    pub fn is_none(&self) -> bool {
        *self == QueueLimits::default()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Weights {
    pub age: u32,
    pub fairshare: u32,
    pub job_size: u32,
    pub partition: u32,
    pub qos: u32,
}

/// `PriorityWeightTRES`: what each trackable resource a job asks for adds to its priority, the
/// weight times the job's share of what its partition holds of that resource (Slurm's TRES
/// factors). All zero (the default): nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TresWeights {
    pub cpu: u32,
    pub mem: u32,
    pub node: u32,
    pub gpu: u32,
}

impl TresWeights {
    /// Slurm's names, in the order it lists them.
    pub const NAMES: [&'static str; 4] = ["cpu", "mem", "node", "gres/gpu"];
    /// The same, as `PriorityWeightTRES` spells them.
    pub const CONFIG_NAMES: [&'static str; 4] = ["CPU", "Mem", "Node", "GRES/gpu"];

    /// The `PriorityWeightTRES` spelling of one of [`TresWeights::NAMES`].
    pub fn config_name(name: &str) -> Option<&'static str> {
        Self::NAMES.iter().position(|n| *n == name).map(|i| Self::CONFIG_NAMES[i])
    }

    pub fn is_zero(&self) -> bool {
        *self == TresWeights::default()
    }

    /// The weights in [`TresWeights::NAMES`]' order.
    pub fn each(&self) -> [u32; 4] {
        [self.cpu, self.mem, self.node, self.gpu]
    }

    /// Reads Slurm's form, `CPU=1000,Mem=2000,GRES/gpu=3000` (names in any case; those left out
    /// weigh nothing; empty: none).
    pub fn parse(s: &str) -> Result<TresWeights, String> {
        let mut w = TresWeights::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) =
                item.split_once('=').ok_or_else(|| format!("'{item}': expected TRES=WEIGHT, e.g. GRES/gpu=3000"))?;
            let value: u32 = value.trim().parse().map_err(|_| {
                format!(
                    "'{item}': the weight must be a whole number from 0 to {} (negative weights are not supported)",
                    u32::MAX
                )
            })?;
            let slot = match name.trim().to_ascii_lowercase().as_str() {
                "cpu" => &mut w.cpu,
                "mem" => &mut w.mem,
                "node" => &mut w.node,
                "gres/gpu" => &mut w.gpu,
                other if other.starts_with("gres/gpu:") => {
                    return Err(format!(
                        "'{item}': weights per GPU type are not supported; weigh every GPU with GRES/gpu"
                    ))
                }
                other => return Err(format!("unknown TRES '{other}' (known: CPU, Mem, Node, GRES/gpu)")),
            };
            *slot = value;
        }
        Ok(w)
    }

    /// Slurm's form of the weights that are not zero (`CPU=1000,GRES/gpu=3000`); empty when all
    /// are.
    pub fn to_slurm(&self) -> String {
        let set = Self::CONFIG_NAMES.iter().zip(self.each()).filter(|(_, w)| *w > 0);
        set.map(|(n, w)| format!("{n}={w}")).collect::<Vec<_>>().join(",")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub ordering: QueueOrder,
    pub backfill: BackfillMode,
    /// Conservative backfill: how many blocked jobs get a reservation.
    pub reservations: u32,
    /// How far ahead reservations may be placed (`bf_window`).
    pub bf_window_s: u64,
    /// Reservation start times are rounded up to this (`bf_resolution`).
    pub bf_resolution_s: u64,
    pub weights: Weights,
    /// The age factor saturates after this long (`PriorityMaxAge`).
    pub max_age_s: u64,
    /// Small jobs rank higher by job size (`PriorityFavorSmall`).
    pub favor_small: bool,
    /// Fairshare usage halves in this time (`PriorityDecayHalfLife`).
    pub half_life_s: u64,
    /// A GPU-second is charged as this many CPU-seconds (`TRESBillingWeights=GRES/gpu`).
    pub gpu_billing_weight: u32,
    /// Who may preempt whom (`PreemptType`); off unless configured.
    #[serde(default, skip_serializing_if = "crate::preempt::PreemptType::is_off")]
    pub preempt_type: crate::preempt::PreemptType,
    /// What becomes of a preempted job whose partition and QOS do not say (`PreemptMode`).
    #[serde(default, skip_serializing_if = "is_off")]
    pub preempt_mode: crate::preempt::PreemptMode,
    /// Backfill plans with run times predicted from each user's last two jobs (capped by the
    /// time limit, see [`crate::predict`]) instead of the limits; jobs are still killed at their
    /// limit only. Off unless configured.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub predict: bool,
    /// In what order backfill tries the jobs behind the reservations; the queue's unless
    /// configured.
    #[serde(default, skip_serializing_if = "BackfillOrder::is_priority")]
    pub backfill_order: BackfillOrder,
    /// What the cluster holds at once. From feature level 27.
    #[serde(default, skip_serializing_if = "QueueLimits::is_none")]
    pub queue: QueueLimits,
    /// `PriorityWeightTRES`. From feature level 36.
    #[serde(default, skip_serializing_if = "TresWeights::is_zero")]
    pub tres_weights: TresWeights,
}

impl Policy {
    /// CPUs and GPUs as Slurm's TRES billing counts them: each GPU `gpu_billing_weight` CPUs.
    pub fn billed(&self, cpus: u64, gpus: u64) -> u64 {
        cpus.saturating_add(gpus.saturating_mul(u64::from(self.gpu_billing_weight)))
    }
}

fn is_off(m: &crate::preempt::PreemptMode) -> bool {
    *m == crate::preempt::PreemptMode::Off
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            ordering: QueueOrder::Multifactor,
            backfill: BackfillMode::Easy,
            reservations: 1,
            bf_window_s: 86_400,
            bf_resolution_s: 1,
            weights: Weights { age: 1000, fairshare: 10_000, job_size: 1000, partition: 1000, qos: 1000 },
            max_age_s: 7 * 86_400,
            favor_small: true,
            half_life_s: 7 * 86_400,
            gpu_billing_weight: 10,
            preempt_type: Default::default(),
            preempt_mode: Default::default(),
            predict: false,
            backfill_order: BackfillOrder::Priority,
            queue: QueueLimits::default(),
            tres_weights: TresWeights::default(),
        }
    }
}

impl Policy {
    /// How many blocked jobs get reservations.
    pub fn reservation_count(&self) -> usize {
        match self.backfill {
            BackfillMode::None => 0,
            BackfillMode::Easy => 1,
            BackfillMode::Conservative => self.reservations as usize,
        }
    }
}
