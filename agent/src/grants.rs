//! The agent's side of signed launches: a launch, a signal or an output read acts only with a
//! grant the leader signed for this job, this allocation, this node and what runs.

use quorum_auth::launch::{expect, launch_digest, Grant};
use quorum_proto::agent::{Launch, Signal};

use crate::Agent;

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn verify(agent: &Agent, job_id: u64, token: u64, bytes: &[u8], signature: &[u8]) -> Result<Option<Grant>, String> {
    let Some(key) = &agent.config.launch_key else { return Ok(None) };
    let grant = key
        .verify(bytes, signature, now_ms(), agent.config.clock_skew.as_millis() as u64)
        .map_err(|e| e.to_string())?;
    expect("job", grant.job_id, job_id).map_err(|e| e.to_string())?;
    expect("allocation", grant.token, token).map_err(|e| e.to_string())?;
    expect("node", &grant.node, &agent.config.name).map_err(|e| e.to_string())?;
    Ok(Some(grant))
}

/// The grant of `launch`, when this agent verifies launches; an error when it does and the
/// launch carries none that fits it.
pub fn verify_launch(agent: &Agent, launch: &Launch) -> Result<Option<Grant>, String> {
    let Some(grant) = verify(agent, launch.job_id, launch.token, &launch.grant, &launch.signature)? else {
        return Ok(None);
    };
    expect("user", &grant.user, &launch.user).map_err(|e| e.to_string())?;
    expect("job spec", &grant.spec, launch_digest(launch.spec.as_ref())).map_err(|e| e.to_string())?;
    Ok(Some(grant))
}

pub fn verify_signal(agent: &Agent, s: &Signal) -> Result<(), String> {
    verify(agent, s.job_id, s.token, &s.grant, &s.signature).map(|_| ())
}
