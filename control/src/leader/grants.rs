//! Launch grants: the leader signs what each launch may do (DESIGN.md, "Trust"). The uid and
//! gid come from the user database by the job's user name, which the controller got from an
//! authenticated uid at submit; they are looked up once a minute per user, not per launch.

use std::time::Duration;

use quorum_auth::launch::{launch_digest, step_digest, Grant, Signer};
use quorum_auth::users;
use quorum_proto::agent::{Launch, StepLaunch};

/// How long a grant starts anything: a launch re-sent later (a new stream, a new leader) is
/// signed again.
const LIFETIME: Duration = Duration::from_secs(600);

/// A uid and gid no user has: the grant of a user this host does not know, which every agent
/// that switches users refuses.
const UNKNOWN_ID: u32 = u32::MAX;

pub struct Grants {
    signer: Option<Signer>,
    users: users::Cache,
}

impl Grants {
    pub fn new(signer: Option<Signer>) -> Grants {
        Grants { signer, users: users::Cache::default() }
    }

    fn ids(&self, user: &str) -> (u32, u32) {
        match self.users.by_name(user) {
            Ok(u) => (u.uid, u.gid),
            Err(e) => {
                tracing::warn!(user, error = %e, "a job's user is unknown here: its launches name no real uid");
                (UNKNOWN_ID, UNKNOWN_ID)
            }
        }
    }

    /// What a launch of `user`'s allocation `token` of job `job_id` on `node` may run (`spec`,
    /// a digest), signed: (grant, signature); empty when this cluster has no launch key.
    #[allow(clippy::too_many_arguments)]
    fn signed(
        &self,
        job_id: u64,
        token: u64,
        user: &str,
        node: &str,
        nodelist: &str,
        spec: String,
        now_ms: u64,
    ) -> (Vec<u8>, Vec<u8>) {
        let Some(signer) = &self.signer else { return (Vec::new(), Vec::new()) };
        let (uid, gid) = self.ids(user);
        let grant = Grant {
            job_id,
            token,
            user: user.to_string(),
            uid,
            gid,
            node: node.to_string(),
            nodelist: nodelist.to_string(),
            expires_at_ms: now_ms + LIFETIME.as_millis() as u64,
            spec,
        };
        signer.sign(&grant)
    }

    /// Signs a step's launch for `node`, when this cluster has a launch key.
    pub fn sign_step(&self, launch: &mut StepLaunch, node: &str, now_ms: u64) {
        let spec = step_digest(launch);
        (launch.grant, launch.signature) =
            self.signed(launch.job_id, launch.token, &launch.user, node, "", spec, now_ms);
    }

    /// Signs `launch` for `node`, when this cluster has a launch key.
    pub fn sign(&self, launch: &mut Launch, node: &str, now_ms: u64) {
        let spec = launch_digest(launch.spec.as_ref());
        (launch.grant, launch.signature) =
            self.signed(launch.job_id, launch.token, &launch.user, node, &launch.nodelist, spec, now_ms);
    }
}
