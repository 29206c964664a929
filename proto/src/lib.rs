//! Quorum's wire formats: the public API, the agent stream and the replica-to-replica Raft
//! service, generated from `proto/*.proto` by tonic and prost. Everything that crosses a process
//! boundary is defined here, and changes to it are additive only (see DESIGN.md, "Upgrades").

pub mod telemetry;

pub mod api {
    tonic::include_proto!("quorum.api");
}

pub mod agent {
    tonic::include_proto!("quorum.agent");
}

pub mod raft {
    tonic::include_proto!("quorum.raft");
}

/// Metadata key carrying the leader's public address on a FAILED_PRECONDITION / UNAVAILABLE
/// answer from a replica that is not the leader.
pub const LEADER_HINT_KEY: &str = "x-quorum-leader";

/// The variable that names the replica that led when a job, a task or an allocation's shell
/// started: the client commands run there ask it first.
pub const LEADER_ENV: &str = "QUORUM_LEADER";

/// Metadata key of a request's proof of its caller: `MUNGE <credential>` or `Bearer <token>`.
pub const AUTHORIZATION_KEY: &str = "authorization";
pub const MUNGE_PREFIX: &str = "MUNGE ";
pub const BEARER_PREFIX: &str = "Bearer ";
/// How long a client sends one MUNGE credential on one connection before it gets a fresh one.
pub const CREDENTIAL_REUSE_S: u64 = 30;
/// `Claim user:uid:gid`: a name taken at its word, by controllers with `insecure = true` only.
pub const CLAIM_PREFIX: &str = "Claim ";

/// Metadata key set on a request that a follower forwarded to the leader, so that it is never
/// forwarded twice.
pub const FORWARDED_KEY: &str = "x-quorum-forwarded";

/// What an agent puts after `rlimits only: ` in `Register.limits` when cgroups were turned off on
/// purpose (`--no-cgroups`), as opposed to a reason the machine gave; clients say nothing of it.
pub const CGROUPS_OFF: &str = "cgroups are off for this agent";

/// A GPU's health as an agent reported it, as `quorum nodes` and `/metrics` name it.
pub fn gpu_state_name(state: i32) -> &'static str {
    use agent::GpuState;
    match GpuState::try_from(state) {
        Ok(GpuState::GpuWarning) => "warning",
        Ok(GpuState::GpuFailure) => "failure",
        _ => "ok",
    }
}
