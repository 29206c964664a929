//! The snapshot encoding of the state: what a replica persists and streams to a lagging or new
//! replica, and decodes on install or restart. Canonical (ordered maps only), so equal states
//! encode to equal bytes.

use super::ClusterState;

/// Encodes `state` for a snapshot.
pub fn encode(state: &ClusterState) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(state)
}

/// Decodes a snapshot made by [`encode`]. The tasks of each array share one spec again, as they
/// did in the replica that encoded it.
pub fn decode(bytes: &[u8]) -> Result<ClusterState, serde_json::Error> {
    let mut state: ClusterState = serde_json::from_slice(bytes)?;
    state.share_array_specs();
    Ok(state)
}
