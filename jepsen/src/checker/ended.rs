//! How a run's jobs ended, as the final read showed them.

/// A job as the final read (after the faults healed and every job ended) showed it.
#[derive(Clone, Debug)]
pub struct Final {
    pub id: u64,
    pub name: String,
    pub state: String,
    /// Cancelled, or a cancel asked of it while it ran.
    pub cancelled: bool,
    /// Its task id, when it is a task of an array.
    pub task: Option<u32>,
    /// Where and when its last attempt ran, by the cluster's clock (`None` when not known).
    pub placed: Option<Placed>,
    /// How many times it went back to the queue: its last attempt's restart count (`None` when
    /// not known).
    pub restarts: Option<u32>,
}

/// Where and when a job's last attempt ran, by the cluster's clock (`end_ms` 0: still running).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placed {
    pub reservation: Option<String>,
    pub start_ms: u64,
    pub end_ms: u64,
    pub nodes: Vec<String>,
}

pub fn terminal(state: &str) -> bool {
    !matches!(state, "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED" | "REQUEUED")
}
