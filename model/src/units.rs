//! The identifiers and units that every other type is written in.

/// A job's id, assigned by apply in submit order (an array's tasks take consecutive ids).
pub type JobId = u64;

/// Milliseconds since the Unix epoch, as stamped by the leader on each command.
pub type Millis = u64;
