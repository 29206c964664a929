//! The monotonic clock the leader measures its own durations with (heartbeats, node silence, the
//! hold on a replaced session's jobs; DESIGN.md, "Time"): tokio's. In a controller it is the
//! operating system's monotonic clock; in `quorum-sim`, whose runtime pauses time so that it
//! advances only when every task waits, it is the simulated one, so the same code (the agent hub
//! and its `Heard`) runs there unchanged and a seed replays it exactly.

/// Now, on the runtime's monotonic clock.
pub fn monotonic() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}
