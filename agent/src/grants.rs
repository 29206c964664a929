//! The agent's side of signed launches: a launch, a signal or an output read acts only with a
//! grant the leader signed for this job, this allocation, this node and what runs.

use quorum_auth::launch::{expect, launch_digest, step_digest, Grant};
use quorum_proto::agent::{Launch, Signal, StepLaunch};

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

/// The grant of a step's launch, when this agent verifies launches.
pub fn verify_step(agent: &Agent, launch: &StepLaunch) -> Result<Option<Grant>, String> {
    let Some(grant) = verify(agent, launch.job_id, launch.token, &launch.grant, &launch.signature)? else {
        return Ok(None);
    };
    expect("user", &grant.user, &launch.user).map_err(|e| e.to_string())?;
    expect("step", &grant.spec, step_digest(launch)).map_err(|e| e.to_string())?;
    Ok(Some(grant))
}

pub fn verify_signal(agent: &Agent, s: &Signal) -> Result<(), String> {
    verify(agent, s.job_id, s.token, &s.grant, &s.signature).map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use quorum_auth::launch::{launch_digest, Grant, Signer, Verifier};
    use quorum_auth::pki::Layout;
    use quorum_proto::agent::Launch;
    use quorum_proto::api::JobSpec;

    use super::{now_ms, verify_launch, verify_signal};
    use crate::{Agent, AgentConfig};

    fn agent(key: Option<Verifier>) -> std::sync::Arc<Agent> {
        Agent::new(AgentConfig {
            switch_user: false,
            cgroups: false,
            launch_key: key,
            clock_skew: Duration::from_secs(5),
            ..AgentConfig::new("node01", vec!["127.0.0.1:1".into()], std::env::temp_dir())
        })
    }

    fn launch() -> Launch {
        Launch {
            job_id: 7,
            token: 3,
            user: "alice".into(),
            nodelist: "node01".into(),
            spec: Some(JobSpec { argv: vec!["id".into()], ..Default::default() }),
            ..Default::default()
        }
    }

    fn grant_for(l: &Launch, node: &str, expires_at_ms: u64) -> Grant {
        Grant {
            job_id: l.job_id,
            token: l.token,
            user: l.user.clone(),
            uid: 1001,
            gid: 1001,
            node: node.into(),
            nodelist: l.nodelist.clone(),
            expires_at_ms,
            spec: launch_digest(l.spec.as_ref()),
        }
    }

    #[tokio::test]
    async fn an_agent_runs_only_what_the_leader_signed_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        layout.init().unwrap();
        let signer = Signer::load(&layout.launch_key()).unwrap();
        let agent = agent(Some(Verifier::load(&layout.launch_pub()).unwrap()));
        let later = now_ms() + 60_000;
        let signed = |l: &Launch, g: &Grant| {
            let (grant, signature) = signer.sign(g);
            Launch { grant, signature, ..l.clone() }
        };
        let good = signed(&launch(), &grant_for(&launch(), "node01", later));
        assert_eq!(verify_launch(&agent, &good).unwrap().unwrap().uid, 1001);

        let unsigned = launch();
        assert!(verify_launch(&agent, &unsigned).unwrap_err().contains("no signature"));
        let mut as_root = good.clone();
        as_root.user = "root".into();
        assert!(verify_launch(&agent, &as_root).unwrap_err().contains("for user 'alice', not 'root'"));
        let mut other_command = good.clone();
        other_command.spec = Some(JobSpec { argv: vec!["cat".into(), "/etc/shadow".into()], ..Default::default() });
        assert!(verify_launch(&agent, &other_command).unwrap_err().contains("job spec"));
        let elsewhere = signed(&launch(), &grant_for(&launch(), "node02", later));
        assert!(verify_launch(&agent, &elsewhere).unwrap_err().contains("for node 'node02'"));
        let stale = signed(&launch(), &grant_for(&launch(), "node01", now_ms() - 60_000));
        assert!(verify_launch(&agent, &stale).unwrap_err().contains("expired"));
        let mut forged = good.clone();
        forged.grant = String::from_utf8(forged.grant).unwrap().replace("1001", "0").into_bytes();
        assert!(verify_launch(&agent, &forged).unwrap_err().contains("does not verify"));

        // Signals carry the job's grant too.
        let signal = |g: &Launch| quorum_proto::agent::Signal {
            job_id: 7,
            token: 3,
            signal: 10,
            grant: g.grant.clone(),
            signature: g.signature.clone(),
        };
        assert!(verify_signal(&agent, &signal(&good)).is_ok());
        assert!(verify_signal(&agent, &signal(&unsigned)).is_err());
        let mut other_job = signal(&good);
        other_job.job_id = 8;
        assert!(verify_signal(&agent, &other_job).is_err());

        // An agent without the launch key (an insecure cluster) checks nothing.
        assert_eq!(verify_launch(&self::agent(None), &unsigned), Ok(None));
    }
}
