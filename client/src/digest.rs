//! `quorum admin digest`: commits a digest point through the leader, then asks every member
//! for the digest it took when it applied that entry. Replicas applied the same log up to the
//! same index, so any difference is a divergence of the state machine.

use std::time::Duration;

use quorum_proto::api;
use serde::Serialize;

use crate::client::Client;

/// One replica's answer.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ReplicaDigest {
    pub id: u64,
    pub address: String,
    /// `None` when the replica could not answer; `error` says why.
    pub digest: Option<String>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DigestReport {
    /// The log index of the digest point.
    pub index: u64,
    pub replicas: Vec<ReplicaDigest>,
}

impl DigestReport {
    /// Every replica that answered gave the same digest.
    pub fn agree(&self) -> bool {
        let mut answered = self.replicas.iter().filter_map(|r| r.digest.as_ref());
        let first = answered.next();
        answered.all(|d| Some(d) == first)
    }

    /// Replicas that did not answer.
    pub fn missing(&self) -> usize {
        self.replicas.iter().filter(|r| r.digest.is_none()).count()
    }

    pub fn table(&self) -> String {
        let mut out = format!("digest point at log index {}\n", self.index);
        out.push_str(&format!("{:<4} {:<22} {:<18}\n", "ID", "ADDRESS", "DIGEST"));
        for r in &self.replicas {
            let shown =
                r.digest.clone().unwrap_or_else(|| format!("- ({})", r.error.as_deref().unwrap_or("no answer")));
            out.push_str(&format!("{:<4} {:<22} {}\n", r.id, r.address, shown));
        }
        out.push_str(&if !self.agree() {
            "DIVERGED: replicas disagree on the state at the same index\n".to_string()
        } else if self.missing() > 0 {
            format!("the replicas that answered agree; {} did not answer\n", self.missing())
        } else {
            format!("all {} replicas agree\n", self.replicas.len())
        });
        out
    }
}

/// Takes a digest point and collects every member's digest there.
pub async fn collect(client: &Client) -> Result<DigestReport, tonic::Status> {
    let point = client.call(|mut c| async move { c.digest(api::DigestRequest {}).await }).await?;
    let members =
        client.call(|mut c| async move { c.cluster_members(api::ClusterStatusRequest {}).await }).await?.members;
    let mut replicas = Vec::new();
    for m in members {
        let answer = match client.replica(&m.address) {
            Ok(mut c) => match tokio::time::timeout(
                Duration::from_secs(15),
                c.replica_digest(api::ReplicaDigestRequest { index: point.index }),
            )
            .await
            {
                Ok(Ok(r)) => Ok(r.into_inner().digest),
                Ok(Err(status)) => Err(status.message().to_string()),
                Err(_) => Err("no answer within 15 s".to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        replicas.push(ReplicaDigest {
            id: m.id,
            address: m.address,
            digest: answer.as_ref().ok().map(|d| format!("{d:016x}")),
            error: answer.err(),
        });
    }
    Ok(DigestReport { index: point.index, replicas })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(id: u64, digest: Option<&str>) -> ReplicaDigest {
        ReplicaDigest {
            id,
            address: format!("h{id}:7101"),
            digest: digest.map(str::to_string),
            error: digest.is_none().then(|| "unreachable".to_string()),
        }
    }

    #[test]
    fn agreement_counts_only_answers_and_names_a_divergence() {
        let same = DigestReport { index: 9, replicas: vec![replica(1, Some("ab")), replica(2, Some("ab"))] };
        assert!(same.agree());
        assert!(same.table().contains("all 2 replicas agree"));
        let one_down = DigestReport { index: 9, replicas: vec![replica(1, Some("ab")), replica(2, None)] };
        assert!(one_down.agree());
        assert!(one_down.table().contains("1 did not answer") && one_down.table().contains("unreachable"));
        let diverged = DigestReport { index: 9, replicas: vec![replica(1, Some("ab")), replica(2, Some("cd"))] };
        assert!(!diverged.agree());
        assert!(diverged.table().contains("DIVERGED"));
    }
}
