//! The snapshot encoding of the state: what a replica persists and streams to a lagging or new
//! replica, and decodes on install or restart. Canonical (ordered maps only), so equal states
//! encode to equal bytes.
//!
//! The state is JSON. From [`COMPRESSED_SNAPSHOT_LEVEL`] on it is written through an LZ4 frame
//! behind [`LZ4_MAGIC`], streamed both ways, so that neither side ever holds the uncompressed
//! text (a million pending jobs with their environments are about 4 GB of JSON). Inside the
//! frame come first the distinct environments of the jobs, then the state with each job's
//! environment as its index among them: the jobs of one shell carry the same few KB, and LZ4
//! only finds a repeat within 64 KB. Below that level (a replica of an older release may have to
//! decode it) the snapshot stays plain JSON, which every release reads.

use std::io::{BufReader, Write};

use quorum_model::env::{decode_by_reference, encode_by_reference, Env, EnvTable};
use serde::Deserialize;

use super::{ClusterState, COMPRESSED_SNAPSHOT_LEVEL};

/// What a compressed snapshot starts with; a plain one starts with `{`.
pub const LZ4_MAGIC: &[u8] = b"quorum-snapshot-lz4\n";

/// Encodes `state` for a snapshot, compressed when the cluster's level allows.
pub fn encode(state: &ClusterState) -> Result<Vec<u8>, serde_json::Error> {
    if state.cluster_level() < COMPRESSED_SNAPSHOT_LEVEL {
        return serde_json::to_vec(state);
    }
    let mut out = LZ4_MAGIC.to_vec();
    // The checksum makes a damaged snapshot an error, never a different state.
    let info = lz4_flex::frame::FrameInfo::new().content_checksum(true);
    let mut frame = lz4_flex::frame::FrameEncoder::with_frame_info(info, &mut out);
    let mut table = EnvTable::default();
    for job in state.jobs.values() {
        table.add(&job.spec.env);
    }
    serde_json::to_writer(&mut frame, table.envs())?;
    frame.write_all(b"\n").map_err(serde_json::Error::io)?;
    encode_by_reference(table, || serde_json::to_writer(&mut frame, state))?;
    frame.finish().map_err(|e| serde_json::Error::io(std::io::Error::other(e)))?;
    Ok(out)
}

/// Decodes a snapshot made by [`encode`], compressed or not. The tasks of each array share one
/// spec again, as they did in the replica that encoded it.
pub fn decode(bytes: &[u8]) -> Result<ClusterState, serde_json::Error> {
    let mut state: ClusterState = match bytes.strip_prefix(LZ4_MAGIC) {
        Some(compressed) => {
            let frame = lz4_flex::frame::FrameDecoder::new(compressed);
            let mut de = serde_json::Deserializer::from_reader(BufReader::with_capacity(1 << 20, frame));
            let envs = Vec::<Env>::deserialize(&mut de)?;
            let state = decode_by_reference(envs, || ClusterState::deserialize(&mut de))?;
            de.end()?;
            state
        }
        None => serde_json::from_slice(bytes)?,
    };
    state.share_array_specs();
    state.count_active_by_user();
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ReplicaVersion, FEATURE_LEVEL};

    fn at_level(level: u32) -> ClusterState {
        let mut s = ClusterState::new();
        for id in 1..=3 {
            s.replica_versions.insert(id, ReplicaVersion { level, version: "test".into() });
        }
        s
    }

    #[test]
    fn compressed_from_its_level_on_plain_below_and_both_decode_to_the_same_state() {
        let old = at_level(COMPRESSED_SNAPSHOT_LEVEL - 1);
        let plain = encode(&old).unwrap();
        assert_eq!(plain.first(), Some(&b'{'), "an older release reads plain JSON only");
        assert_eq!(decode(&plain).unwrap(), old);

        let new = at_level(FEATURE_LEVEL);
        let compressed = encode(&new).unwrap();
        assert!(compressed.starts_with(LZ4_MAGIC));
        assert_eq!(decode(&compressed).unwrap(), new);
        // The same state, whichever way it was written.
        assert_eq!(decode(&serde_json::to_vec(&new).unwrap()).unwrap(), new);
    }

    #[test]
    fn a_damaged_compressed_snapshot_is_an_error() {
        let bytes = encode(&at_level(FEATURE_LEVEL)).unwrap();
        let cut = &bytes[..bytes.len() / 2];
        assert!(decode(cut).is_err());
        let mut flipped = bytes.clone();
        let i = LZ4_MAGIC.len() + 12;
        flipped[i] ^= 0xff;
        assert!(decode(&flipped).is_err());
    }
}
