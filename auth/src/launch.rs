//! Signed launches. The leader signs each launch (job, allocation token, user, uid, gid, node,
//! node list, a digest of what runs, expiry) with the cluster's launch key, as slurmctld signs
//! job credentials; an agent verifies the signature with the public key before it creates a
//! process or switches user, and signals and output reads carry the same proof.

use std::path::Path;

use base64::Engine;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};

const CONTEXT: &[u8] = b"quorum-launch-v1\0";

/// What a launch signature vouches for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub job_id: u64,
    pub token: u64,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub node: String,
    pub nodelist: String,
    /// Wall-clock milliseconds after which the grant starts nothing new.
    pub expires_at_ms: u64,
    /// [`spec_digest`] of what the launch runs.
    pub spec: String,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error("the launch carries no signature")]
    Unsigned,
    #[error("the launch signature does not verify with this node's launch key")]
    BadSignature,
    #[error("the launch grant cannot be read: {0}")]
    Malformed(String),
    #[error("the launch grant expired {0} ms ago")]
    Expired(u64),
    #[error("the launch grant is for {field} '{granted}', not '{asked}'")]
    Mismatch { field: &'static str, granted: String, asked: String },
}

/// The SHA-256 of `parts`, each length-prefixed (so that no two lists of parts collide).
pub fn spec_digest<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        ctx.update(&(p.len() as u64).to_le_bytes());
        ctx.update(p);
    }
    crate::pki::hex(ctx.finish().as_ref())
}

/// What a launch's grant covers of the job's spec: what runs, where, with what environment.
pub fn launch_digest(spec: Option<&quorum_proto::api::JobSpec>) -> String {
    let Some(s) = spec else { return spec_digest([]) };
    let mut parts: Vec<&[u8]> = vec![s.script.as_bytes(), s.work_dir.as_bytes()];
    parts.extend(s.argv.iter().map(|a| a.as_bytes()));
    for e in &s.env {
        parts.push(e.name.as_bytes());
        parts.push(e.value.as_bytes());
    }
    // Only when set, so that a step without one has the digest it had before `--gid`.
    if !s.group.is_empty() {
        parts.push(b"group");
        parts.push(s.group.as_bytes());
    }
    let container = s.container.as_ref().map(container_parts).unwrap_or_default();
    parts.extend(container.iter().map(|p| p.as_slice()));
    spec_digest(parts)
}

/// What a grant covers of a container: every field (only when there is one, so that a job
/// without one has the digest it had before containers).
fn container_parts(c: &quorum_proto::api::Container) -> Vec<Vec<u8>> {
    let mut parts: Vec<Vec<u8>> = vec![b"container".to_vec(), c.image.clone().into_bytes()];
    parts.push(c.mounts.len().to_le_bytes().to_vec());
    parts.extend(c.mounts.iter().map(|m| m.clone().into_bytes()));
    parts.extend([c.workdir.clone(), c.name.clone(), c.save.clone()].map(String::into_bytes));
    parts.push(vec![u8::from(c.mount_home), u8::from(c.remap_root), u8::from(c.readonly), u8::from(c.entrypoint)]);
    parts.extend(c.env.iter().map(|e| e.clone().into_bytes()));
    parts
}

/// What a step launch's grant covers: the step, what its tasks run, where and with what
/// environment, which tasks and GPUs (never equal to a job's digest: it starts with "step").
pub fn step_digest(s: &quorum_proto::agent::StepLaunch) -> String {
    let numbers: Vec<[u8; 4]> = [s.step_id, s.node_id, s.first_task, s.tasks, s.gpus_per_task, u32::from(s.pty)]
        .into_iter()
        .chain(s.gpus.iter().copied())
        .map(u32::to_le_bytes)
        .collect();
    let mut parts: Vec<&[u8]> = vec![b"step", s.work_dir.as_bytes()];
    parts.extend(numbers.iter().map(|n| n.as_slice()));
    parts.extend(s.argv.iter().map(|a| a.as_bytes()));
    for e in &s.env {
        parts.push(e.name.as_bytes());
        parts.push(e.value.as_bytes());
    }
    let container = s.container.as_ref().map(container_parts).unwrap_or_default();
    parts.extend(container.iter().map(|p| p.as_slice()));
    // Only when set, so that a step without PMI has the digest it had before `--mpi`.
    let layout: Vec<[u8; 4]> = s.node_tasks.iter().map(|t| t.to_le_bytes()).collect();
    if !s.mpi.is_empty() || !layout.is_empty() {
        parts.push(b"mpi");
        parts.push(s.mpi.as_bytes());
        parts.extend(layout.iter().map(|n| n.as_slice()));
    }
    // Likewise the binding, only when set.
    if !s.cpu_bind.is_empty() {
        parts.push(b"cpu_bind");
        parts.push(s.cpu_bind.as_bytes());
    }
    // And the cyclic numbering of its tasks.
    if s.cyclic {
        parts.push(b"cyclic");
    }
    spec_digest(parts)
}

/// The controllers' side.
pub struct Signer {
    key: Ed25519KeyPair,
}

impl Signer {
    pub fn load(path: &Path) -> anyhow::Result<Signer> {
        let bytes =
            std::fs::read(path).map_err(|e| anyhow::anyhow!("reading the launch key {}: {e}", path.display()))?;
        let key = Ed25519KeyPair::from_pkcs8(&bytes)
            .map_err(|e| anyhow::anyhow!("{} is not an Ed25519 launch key: {e}", path.display()))?;
        Ok(Signer { key })
    }

    /// The public key as `launch.pub` holds it.
    pub fn public_key_text(&self) -> String {
        crate::pki::public_key_text(self.key.public_key().as_ref())
    }

    /// The grant's bytes and their signature.
    pub fn sign(&self, grant: &Grant) -> (Vec<u8>, Vec<u8>) {
        let bytes = serde_json::to_vec(grant).expect("a grant serializes");
        let mut message = CONTEXT.to_vec();
        message.extend_from_slice(&bytes);
        (bytes, self.key.sign(&message).as_ref().to_vec())
    }
}

/// The agents' side.
#[derive(Clone)]
pub struct Verifier {
    key: Vec<u8>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verifier(Ed25519)")
    }
}

impl Verifier {
    pub fn load(path: &Path) -> anyhow::Result<Verifier> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading the launch public key {}: {e}", path.display()))?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| anyhow::anyhow!("{} is not a launch public key: {e}", path.display()))?;
        if key.len() != 32 {
            anyhow::bail!("{} is not an Ed25519 public key ({} bytes)", path.display(), key.len());
        }
        Ok(Verifier { key })
    }

    /// The grant in `bytes` when `signature` verifies and it has not expired (with `skew_ms`
    /// of tolerance for clocks that disagree).
    pub fn verify(&self, bytes: &[u8], signature: &[u8], now_ms: u64, skew_ms: u64) -> Result<Grant, LaunchError> {
        if bytes.is_empty() || signature.is_empty() {
            return Err(LaunchError::Unsigned);
        }
        let mut message = CONTEXT.to_vec();
        message.extend_from_slice(bytes);
        UnparsedPublicKey::new(&ED25519, &self.key)
            .verify(&message, signature)
            .map_err(|_| LaunchError::BadSignature)?;
        let grant: Grant = serde_json::from_slice(bytes).map_err(|e| LaunchError::Malformed(e.to_string()))?;
        if grant.expires_at_ms.saturating_add(skew_ms) < now_ms {
            return Err(LaunchError::Expired(now_ms - grant.expires_at_ms));
        }
        Ok(grant)
    }
}

/// Checks that a grant is for what is asked.
pub fn expect(field: &'static str, granted: impl ToString, asked: impl ToString) -> Result<(), LaunchError> {
    let (granted, asked) = (granted.to_string(), asked.to_string());
    if granted == asked {
        Ok(())
    } else {
        Err(LaunchError::Mismatch { field, granted, asked })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(expires_at_ms: u64) -> Grant {
        Grant {
            job_id: 4,
            token: 9,
            user: "alice".into(),
            uid: 1001,
            gid: 1001,
            node: "node01".into(),
            nodelist: "node[01-02]".into(),
            expires_at_ms,
            spec: spec_digest([b"id".as_slice()]),
        }
    }

    #[test]
    fn a_grant_verifies_only_unchanged_unexpired_and_with_the_right_key() {
        let dir = tempfile::tempdir().unwrap();
        let layout = crate::pki::Layout::new(dir.path());
        layout.init().unwrap();
        let signer = Signer::load(&layout.launch_key()).unwrap();
        let verifier = Verifier::load(&layout.launch_pub()).unwrap();
        let (bytes, sig) = signer.sign(&grant(10_000));
        assert_eq!(verifier.verify(&bytes, &sig, 9_000, 0).unwrap(), grant(10_000));
        assert_eq!(verifier.verify(&bytes, &sig, 12_000, 5_000).unwrap(), grant(10_000), "within the skew");
        assert_eq!(verifier.verify(&bytes, &sig, 16_000, 5_000), Err(LaunchError::Expired(6_000)));
        let forged = String::from_utf8(bytes.clone()).unwrap().replace("1001", "0000").into_bytes();
        assert_eq!(verifier.verify(&forged, &sig, 9_000, 0), Err(LaunchError::BadSignature));
        assert_eq!(verifier.verify(&bytes, &[], 9_000, 0), Err(LaunchError::Unsigned));

        let other = tempfile::tempdir().unwrap();
        let other_layout = crate::pki::Layout::new(other.path());
        other_layout.init().unwrap();
        let (bytes, sig) = Signer::load(&other_layout.launch_key()).unwrap().sign(&grant(10_000));
        assert_eq!(verifier.verify(&bytes, &sig, 9_000, 0), Err(LaunchError::BadSignature));
        assert_ne!(spec_digest([b"ab".as_slice(), b"c"]), spec_digest([b"a".as_slice(), b"bc"]));
    }

    #[test]
    fn a_step_digest_covers_its_layout() {
        let launch = quorum_proto::agent::StepLaunch {
            step_id: 1,
            node_id: 1,
            first_task: 1,
            tasks: 2,
            node_tasks: vec![2, 2],
            argv: vec!["hostname".into()],
            ..Default::default()
        };
        let digest = step_digest(&launch);
        let cyclic = quorum_proto::agent::StepLaunch { cyclic: true, ..launch.clone() };
        assert_ne!(step_digest(&cyclic), digest, "the numbering of the tasks");
        let moved = quorum_proto::agent::StepLaunch { node_tasks: vec![3, 1], ..launch.clone() };
        assert_ne!(step_digest(&moved), digest, "the tasks per node");
        assert_eq!(step_digest(&launch.clone()), digest);
    }
}
