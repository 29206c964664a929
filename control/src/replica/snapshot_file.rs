//! The latest snapshot as a replica keeps it in RocksDB, so that a restart resumes from it.
//!
//! A snapshot of up to [`Layout::single_max`] is one value, as releases before this layout
//! wrote it (so a replica rolled back to one still reads it). A larger one is split into
//! chunks under a generation of its own, because RocksDB takes no value of 4 GiB or more and a
//! million pending jobs with their environments encode to about 3 GB. The chunks are written
//! first; one batch then points the meta at them and drops every other generation, so a crash
//! at any point leaves the previous snapshot whole.
//!
//! None of it goes through the write-ahead log, which the Raft log shares: a synced log append
//! waits for every byte written to the WAL before it, and a snapshot of a few hundred MB there
//! stalled the leader's appends (and with them its heartbeats) for seconds, long enough for
//! elections. The snapshot is written to its memtable instead and flushed to its own table
//! files, and `write` returns once the flush is durable; the log is purged only after that.

use openraft::{BasicNode, SnapshotMeta};
use rocksdb::{FlushOptions, WriteBatch, WriteOptions, DB};
use serde::{Deserialize, Serialize};

/// Column family holding the latest snapshot.
pub const CF_SNAPSHOT: &str = "sm_snapshot";
const KEY_META: &[u8] = b"meta";
const KEY_DATA: &[u8] = b"data";
/// Chunk keys are `chunk/<generation>/<index>`, zero-padded so that they sort by number.
const CHUNK_PREFIX: &str = "chunk/";
/// Just after every chunk key ('0' follows '/').
const CHUNK_END: &[u8] = b"chunk0";

/// Where the sizes switch; tests use small ones.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// Larger snapshots are chunked.
    pub single_max: usize,
    pub chunk: usize,
}

impl Default for Layout {
    fn default() -> Self {
        Layout { single_max: 1 << 30, chunk: 256 << 20 }
    }
}

/// A chunked snapshot's pieces.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Chunks {
    generation: u64,
    count: u32,
    len: u64,
}

#[derive(Serialize, Deserialize)]
struct StoredMeta {
    meta: SnapshotMeta<u64, BasicNode>,
    /// Absent when the data is one value under `data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chunks: Option<Chunks>,
}

fn chunk_key(generation: u64, i: u32) -> Vec<u8> {
    format!("{CHUNK_PREFIX}{generation:020}/{i:08}").into_bytes()
}

/// The first key after every chunk of `generation`.
fn generation_end(generation: u64) -> Vec<u8> {
    format!("{CHUNK_PREFIX}{generation:020}0").into_bytes()
}

fn cf(db: &DB) -> Result<&rocksdb::ColumnFamily, String> {
    db.cf_handle(CF_SNAPSHOT).ok_or_else(|| format!("missing column family {CF_SNAPSHOT}"))
}

/// A stored snapshot: its meta and its data.
pub type Stored = (SnapshotMeta<u64, BasicNode>, Vec<u8>);

/// The stored snapshot, if any.
pub fn read(db: &DB) -> Result<Option<Stored>, String> {
    let cf = cf(db)?;
    let Some(meta) = db.get_cf(cf, KEY_META).map_err(|e| e.to_string())? else { return Ok(None) };
    let stored: StoredMeta = serde_json::from_slice(&meta).map_err(|e| format!("snapshot meta: {e}"))?;
    let data = match stored.chunks {
        None => match db.get_cf(cf, KEY_DATA).map_err(|e| e.to_string())? {
            Some(data) => data,
            None => return Ok(None),
        },
        Some(c) => {
            let mut data = Vec::with_capacity(c.len as usize);
            for i in 0..c.count {
                let piece =
                    db.get_pinned_cf(cf, chunk_key(c.generation, i)).map_err(|e| e.to_string())?.ok_or_else(|| {
                        format!("snapshot chunk {i} of {} (generation {}) is missing", c.count, c.generation)
                    })?;
                data.extend_from_slice(&piece);
            }
            if data.len() as u64 != c.len {
                return Err(format!("snapshot chunks hold {} bytes, the meta says {}", data.len(), c.len));
            }
            data
        }
    };
    Ok(Some((stored.meta, data)))
}

/// Stores `data` as the latest snapshot, durably, replacing the previous one.
pub fn write(db: &DB, meta: SnapshotMeta<u64, BasicNode>, data: &[u8], layout: Layout) -> Result<(), String> {
    let cf = cf(db)?;
    let mut unlogged = WriteOptions::default();
    unlogged.disable_wal(true);
    let mut batch = WriteBatch::default();
    let chunks = if data.len() <= layout.single_max {
        // Data and meta in one batch: one memtable, so one flush makes both durable or neither.
        batch.put_cf(cf, KEY_DATA, data);
        batch.delete_range_cf(cf, CHUNK_PREFIX.as_bytes(), CHUNK_END);
        None
    } else {
        // A generation newer than any stored: nanoseconds, or one past the stored one.
        let stored = read_meta(db)?.and_then(|m| m.chunks).map_or(0, |c| c.generation);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let generation = now.max(stored + 1);
        let pieces: Vec<&[u8]> = data.chunks(layout.chunk.max(1)).collect();
        for (i, piece) in pieces.iter().enumerate() {
            // A crash before the meta below is durable leaves an unreferenced generation, which
            // the next write drops.
            db.put_cf_opt(cf, chunk_key(generation, i as u32), piece, &unlogged).map_err(|e| e.to_string())?;
        }
        batch.delete_cf(cf, KEY_DATA);
        batch.delete_range_cf(cf, CHUNK_PREFIX.as_bytes(), chunk_key(generation, 0).as_slice());
        batch.delete_range_cf(cf, generation_end(generation).as_slice(), CHUNK_END);
        Some(Chunks { generation, count: pieces.len() as u32, len: data.len() as u64 })
    };
    let meta = serde_json::to_vec(&StoredMeta { meta, chunks }).map_err(|e| e.to_string())?;
    batch.put_cf(cf, KEY_META, meta);
    db.write_opt(batch, &unlogged).map_err(|e| e.to_string())?;
    let mut flush = FlushOptions::default();
    flush.set_wait(true);
    db.flush_cf_opt(cf, &flush).map_err(|e| format!("flushing the snapshot: {e}"))
}

fn read_meta(db: &DB) -> Result<Option<StoredMeta>, String> {
    let Some(meta) = db.get_cf(cf(db)?, KEY_META).map_err(|e| e.to_string())? else { return Ok(None) };
    serde_json::from_slice(&meta).map(Some).map_err(|e| format!("snapshot meta: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(id: &str) -> SnapshotMeta<u64, BasicNode> {
        SnapshotMeta { last_log_id: None, last_membership: Default::default(), snapshot_id: id.into() }
    }

    fn chunk_keys(db: &DB) -> Vec<String> {
        let cf = cf(db).unwrap();
        db.iterator_cf(cf, rocksdb::IteratorMode::Start)
            .map(|kv| String::from_utf8(kv.unwrap().0.to_vec()).unwrap())
            .filter(|k| k.starts_with(CHUNK_PREFIX))
            .collect()
    }

    #[test]
    fn small_snapshots_are_one_value_and_large_ones_chunks_and_each_replaces_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let db = quorum_raft::open_db(&dir.path().join("db"), &[CF_SNAPSHOT]).unwrap();
        let layout = Layout { single_max: 100, chunk: 30 };
        assert!(read(&db).unwrap().is_none());

        let small: Vec<u8> = (0..100u8).collect();
        write(&db, meta("small"), &small, layout).unwrap();
        let (m, data) = read(&db).unwrap().unwrap();
        assert_eq!((m.snapshot_id.as_str(), data), ("small", small.clone()));
        assert!(chunk_keys(&db).is_empty());

        let large: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        write(&db, meta("large"), &large, layout).unwrap();
        let (m, data) = read(&db).unwrap().unwrap();
        assert_eq!((m.snapshot_id.as_str(), &data), ("large", &large));
        assert_eq!(chunk_keys(&db).len(), 34, "1000 bytes in chunks of 30");
        assert!(db.get_cf(cf(&db).unwrap(), KEY_DATA).unwrap().is_none(), "the single value is dropped");

        // Another large one: only its own generation is left.
        let larger: Vec<u8> = (0..=255u8).rev().cycle().take(700).collect();
        write(&db, meta("larger"), &larger, layout).unwrap();
        assert_eq!(read(&db).unwrap().unwrap().1, larger);
        let keys = chunk_keys(&db);
        assert_eq!(keys.len(), 24, "{keys:?}");
        let generation = |k: &String| k.split('/').nth(1).unwrap().to_string();
        assert!(keys.iter().all(|k| generation(k) == generation(&keys[0])), "{keys:?}");

        // And back to one value: every chunk goes.
        write(&db, meta("small again"), &small, layout).unwrap();
        assert_eq!(read(&db).unwrap().unwrap().1, small);
        assert!(chunk_keys(&db).is_empty());
    }

    /// Bytes in the database's write-ahead log files.
    fn wal_bytes(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
            .map(|e| e.metadata().unwrap().len())
            .sum()
    }

    #[test]
    fn a_snapshot_bypasses_the_write_ahead_log_and_is_flushed_before_write_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let db = quorum_raft::open_db(&path, &[CF_SNAPSHOT]).unwrap();
        let layout = Layout { single_max: 4 << 20, chunk: 1 << 20 };
        // An unflushed write to another column family keeps every WAL file from here on alive.
        db.put_cf(db.cf_handle(quorum_raft::CF_LOG).unwrap(), b"entry", b"x").unwrap();
        // Incompressible, so that table files cannot hide it either way.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<u8> = (0..(6 << 20))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for (name, len) in [("single", 3 << 20), ("chunked", 6 << 20)] {
            write(&db, meta(name), &data[..len], layout).unwrap();
            let wal = wal_bytes(&path);
            assert!(wal < 1 << 20, "{name}: {wal} bytes in the WAL for a {len}-byte snapshot");
            let unflushed = db.property_int_value_cf(cf(&db).unwrap(), "rocksdb.num-entries-active-mem-table").unwrap();
            assert_eq!(unflushed, Some(0), "{name}: the snapshot is still only in the memtable");
            assert_eq!(read(&db).unwrap().unwrap().1, &data[..len]);
        }
    }

    #[test]
    fn a_missing_chunk_is_an_error_not_a_short_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let db = quorum_raft::open_db(&dir.path().join("db"), &[CF_SNAPSHOT]).unwrap();
        let layout = Layout { single_max: 10, chunk: 10 };
        write(&db, meta("s"), &[7u8; 95], layout).unwrap();
        let keys = chunk_keys(&db);
        db.delete_cf(cf(&db).unwrap(), keys[3].as_bytes()).unwrap();
        let err = read(&db).unwrap_err();
        assert!(err.contains("snapshot chunk 3 of 10") && err.contains("missing"), "{err}");
    }
}
