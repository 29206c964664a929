//! A digest of the whole state, equal on every replica at the same applied index.

use crate::cluster::ClusterState;

/// FNV-1a over the state's canonical encoding (ordered maps only, so the encoding is canonical).
pub fn digest(state: &ClusterState) -> u64 {
    let bytes = serde_json::to_vec(state).expect("the state always serializes");
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}
