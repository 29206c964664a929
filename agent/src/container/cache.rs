//! The node's image cache: each layer unpacked once into a directory of its own, keyed by its
//! digest, in overlayfs's form (a deleted file is a 0/0 character device, an opaque directory has
//! `trusted.overlay.opaque`), so that a container's root is its image's layers stacked by one
//! overlay mount and images that share a base layer share it on disk. An image is a record of its
//! layers and configuration, keyed by its manifest's digest. Concurrent pulls of one image or one
//! layer wait for the first; images in use are pinned; past its size bound the cache drops the
//! least recently used images that are not, then the layers no image left uses.
//!
//! Layout (root's alone, 0700): `layers/<hex>/` (complete), `layers/<hex>.bytes`,
//! `images/<hex>.json` (its modification time is its last use), `tmp/` (downloads and unpacks
//! under way, emptied at start).

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// What a container needs of its image.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The layers' digests (hex), bottom first.
    pub layers: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
    #[serde(default)]
    pub workdir: String,
}

impl ImageRecord {
    /// From an image's configuration (its JSON).
    pub fn from_config(layers: Vec<String>, config: &str) -> ImageRecord {
        let v: serde_json::Value = serde_json::from_str(config).unwrap_or_default();
        let c = &v["config"];
        let list = |k: &str| -> Vec<String> {
            c[k].as_array()
                .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                .unwrap_or_default()
        };
        ImageRecord {
            layers,
            env: list("Env"),
            entrypoint: list("Entrypoint"),
            cmd: list("Cmd"),
            workdir: c["WorkingDir"].as_str().unwrap_or("").to_string(),
        }
    }
}

/// How a layer blob is compressed, from its media type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

impl Compression {
    pub fn of(media_type: &str) -> Result<Compression, String> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar" | "application/vnd.docker.image.rootfs.diff.tar" => {
                Ok(Compression::None)
            }
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Ok(Compression::Gzip),
            other => Err(format!("layers of type {other} are not supported (gzip-compressed or plain tar only)")),
        }
    }
}

pub struct Cache {
    pub dir: PathBuf,
    limit_bytes: u64,
    /// One async lock per image or layer being fetched: the second asker waits for the first.
    inflight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Images in use, by digest (hex): never evicted.
    pins: Mutex<HashMap<String, usize>>,
    evicting: Mutex<()>,
}

impl Cache {
    /// The cache in `dir`, made (root's alone) if missing; what an interrupted pull left is removed.
    pub fn open(dir: &Path, limit_bytes: u64) -> std::io::Result<Cache> {
        for sub in ["layers", "images", "tmp"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        // Root's alone; what is under it keeps the modes the images give it.
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let tmp = dir.join("tmp");
        for e in std::fs::read_dir(&tmp)?.flatten() {
            let _ = remove_any(&e.path());
        }
        Ok(Cache {
            dir: dir.to_path_buf(),
            limit_bytes,
            inflight: Mutex::new(HashMap::new()),
            pins: Mutex::new(HashMap::new()),
            evicting: Mutex::new(()),
        })
    }

    /// Waits until nobody else fetches `key`; holds it until the guard is dropped.
    pub async fn exclusive(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            map.retain(|_, l| Arc::strong_count(l) > 1);
            map.entry(key.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }

    pub fn layer_dir(&self, hex: &str) -> PathBuf {
        self.dir.join("layers").join(hex)
    }

    fn image_file(&self, hex: &str) -> PathBuf {
        self.dir.join("images").join(format!("{hex}.json"))
    }

    pub fn has_layer(&self, hex: &str) -> bool {
        self.layer_dir(hex).is_dir()
    }

    /// The image's record when it and all its layers are here (marked used now).
    pub fn image(&self, hex: &str) -> Option<ImageRecord> {
        let path = self.image_file(hex);
        let record: ImageRecord = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
        if !record.layers.iter().all(|l| self.has_layer(l)) {
            return None;
        }
        touch(&path);
        Some(record)
    }

    pub fn save_image(&self, hex: &str, record: &ImageRecord) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        let tmp = self.temp_path(&format!("{hex}.json"));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, self.image_file(hex))
    }

    /// A fresh path in `tmp/`.
    pub fn temp_path(&self, name: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.dir.join("tmp").join(format!("{}.{n}.{name}", std::process::id()))
    }

    /// Unpacks the downloaded blob `blob` into the layer `hex` (then removes the blob); its size
    /// on disk is recorded. Blocking.
    pub fn unpack_layer(&self, hex: &str, blob: &Path, compression: Compression) -> Result<u64, String> {
        let staging = self.temp_path(&format!("layer-{hex}"));
        std::fs::create_dir(&staging).map_err(|e| format!("cannot make {}: {e}", staging.display()))?;
        let result = (|| -> Result<u64, String> {
            let file = std::fs::File::open(blob).map_err(|e| e.to_string())?;
            let reader: Box<dyn Read> = match compression {
                Compression::None => Box::new(std::io::BufReader::new(file)),
                Compression::Gzip => Box::new(flate2::read::GzDecoder::new(std::io::BufReader::new(file))),
            };
            let bytes = unpack(reader, &staging)?;
            std::fs::write(self.dir.join("layers").join(format!("{hex}.bytes")), bytes.to_string())
                .map_err(|e| e.to_string())?;
            std::fs::rename(&staging, self.layer_dir(hex)).map_err(|e| e.to_string())?;
            Ok(bytes)
        })();
        let _ = std::fs::remove_file(blob);
        if result.is_err() {
            let _ = remove_any(&staging);
        }
        result.map_err(|e| format!("unpacking layer sha256:{hex}: {e}"))
    }

    pub fn pin(&self, hex: &str) {
        *self.pins.lock().unwrap_or_else(|p| p.into_inner()).entry(hex.to_string()).or_default() += 1;
    }

    pub fn unpin(&self, hex: &str) {
        let mut pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = pins.get_mut(hex) {
            *n -= 1;
            if *n == 0 {
                pins.remove(hex);
            }
        }
    }

    /// Bytes the layers take, and how many images are cached.
    pub fn usage(&self) -> (u64, usize) {
        let images = std::fs::read_dir(self.dir.join("images")).map(|d| d.count()).unwrap_or(0);
        (self.layer_sizes().values().sum(), images)
    }

    fn layer_sizes(&self) -> HashMap<String, u64> {
        let mut sizes = HashMap::new();
        for e in std::fs::read_dir(self.dir.join("layers")).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if let Some(hex) = name.strip_suffix(".bytes") {
                let bytes = std::fs::read_to_string(e.path()).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
                if self.has_layer(hex) {
                    sizes.insert(hex.to_string(), bytes);
                }
            }
        }
        sizes
    }

    /// Past the size bound: drops least recently used images not in use, then every layer no
    /// image left names, until the layers fit (or only pinned images are left). Blocking.
    pub fn evict(&self) -> Vec<String> {
        let _one = self.evicting.lock().unwrap_or_else(|p| p.into_inner());
        let mut dropped = Vec::new();
        let sizes = self.layer_sizes();
        let mut total: u64 = sizes.values().sum();
        if total <= self.limit_bytes {
            return dropped;
        }
        let mut images: Vec<(std::time::SystemTime, String, ImageRecord)> = std::fs::read_dir(self.dir.join("images"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().strip_suffix(".json")?.to_string();
                let used = e.metadata().and_then(|m| m.modified()).ok()?;
                let record = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
                Some((used, name, record))
            })
            .collect();
        images.sort_by_key(|a| a.0);
        let pinned: HashSet<String> = self.pins.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        let mut kept: Vec<ImageRecord> = images.iter().map(|(_, _, r)| r.clone()).collect();
        for (i, (_, hex, _)) in images.iter().enumerate() {
            if total <= self.limit_bytes {
                break;
            }
            if pinned.contains(hex) {
                continue;
            }
            let _ = std::fs::remove_file(self.image_file(hex));
            dropped.push(hex.clone());
            kept[i].layers.clear();
            let used: HashSet<&String> = kept.iter().flat_map(|r| r.layers.iter()).collect();
            for (layer, bytes) in &sizes {
                if !used.contains(layer) && self.has_layer(layer) {
                    let _ = remove_any(&self.layer_dir(layer));
                    let _ = std::fs::remove_file(self.dir.join("layers").join(format!("{layer}.bytes")));
                    total = total.saturating_sub(*bytes);
                }
            }
        }
        dropped
    }
}

fn touch(path: &Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(path) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

/// Removes a file or a whole tree (never following a link out of it).
pub fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Unpacks the tar stream `reader` into `dir` as one overlayfs layer: ownership and modes as
/// archived, whiteouts as overlayfs's, device files and anything leaving `dir` refused. The
/// bytes it takes.
pub fn unpack(reader: impl Read, dir: &Path) -> Result<u64, String> {
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let mut bytes = 0u64;
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        let name = path.file_name().map(|n| n.as_bytes().to_vec()).unwrap_or_default();
        let parent = path.parent().unwrap_or(Path::new(""));
        if parent.components().any(|c| !matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir)) {
            return Err(format!("the entry {} leaves the layer", path.display()));
        }
        if name == b".wh..wh..opq" {
            let d = dir.join(parent);
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            set_xattr(&d, c"trusted.overlay.opaque", b"y")?;
            continue;
        }
        if let Some(hidden) = name.strip_prefix(b".wh.") {
            let d = dir.join(parent);
            std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
            let target = d.join(std::ffi::OsStr::from_bytes(hidden));
            let _ = remove_any(&target);
            whiteout(&target)?;
            continue;
        }
        match entry.header().entry_type() {
            // A device in an image could open the node's disks: never made.
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => continue,
            _ => {}
        }
        bytes = bytes.saturating_add(entry.header().size().unwrap_or(0)).saturating_add(512);
        let unpacked = entry.unpack_in(dir).map_err(|e| {
            let cause = std::error::Error::source(&e).map(|s| format!(": {s}")).unwrap_or_default();
            format!("{}: {e}{cause}", path.display())
        })?;
        if !unpacked {
            return Err(format!("the entry {} leaves the layer", path.display()));
        }
    }
    Ok(bytes)
}

fn set_xattr(path: &Path, name: &std::ffi::CStr, value: &[u8]) -> Result<(), String> {
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: NUL-terminated path and name, and a value with its length.
    if unsafe { libc::lsetxattr(p.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) } != 0 {
        return Err(format!("marking {} opaque: {}", path.display(), std::io::Error::last_os_error()));
    }
    Ok(())
}

/// overlayfs's whiteout: a character device 0/0.
fn whiteout(path: &Path) -> Result<(), String> {
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated path; makedev(0, 0) is 0.
    if unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR, 0) } != 0 {
        return Err(format!("whiting out {}: {}", path.display(), std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_cksum();
            b.append_data(&mut h, path, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn configs_give_what_a_container_needs() {
        let r = ImageRecord::from_config(
            vec!["aa".into()],
            r#"{"config":{"Env":["PATH=/usr/bin","X=1"],"Entrypoint":["/init"],"Cmd":["sh"],"WorkingDir":"/w"}}"#,
        );
        assert_eq!(r.env, ["PATH=/usr/bin", "X=1"]);
        assert_eq!(
            (r.entrypoint.as_slice(), r.cmd.as_slice(), r.workdir.as_str()),
            (&["/init".to_string()][..], &["sh".to_string()][..], "/w")
        );
        assert_eq!(ImageRecord::from_config(vec![], "not json").env, Vec::<String>::new());
    }

    #[test]
    fn media_types_name_their_compression() {
        assert_eq!(Compression::of("application/vnd.oci.image.layer.v1.tar+gzip"), Ok(Compression::Gzip));
        assert_eq!(Compression::of("application/vnd.docker.image.rootfs.diff.tar"), Ok(Compression::None));
        assert!(Compression::of("application/vnd.oci.image.layer.v1.tar+zstd").unwrap_err().contains("zstd"));
    }

    #[test]
    fn a_layer_unpacks_with_its_files_and_never_outside() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("l");
        std::fs::create_dir(&out).unwrap();
        unpack(&layer(&[("etc/os-release", b"NAME=test\n"), ("bin/x", b"#!")])[..], &out).unwrap();
        assert_eq!(std::fs::read_to_string(out.join("etc/os-release")).unwrap(), "NAME=test\n");
        // A path that climbs out is refused.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..8].copy_from_slice(b"../../xx");
        h.set_size(1);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_cksum();
        b.append(&h, &b"x"[..]).unwrap();
        let raw = b.into_inner().unwrap();
        let escaped = dir.path().join("e");
        std::fs::create_dir(&escaped).unwrap();
        assert!(unpack(&raw[..], &escaped).is_err());
        assert!(!dir.path().parent().unwrap().join("xx").exists());
    }

    #[test]
    fn past_its_bound_the_cache_drops_the_least_recently_used_images_not_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path(), 250).unwrap();
        let layer = |hex: &str, bytes: u64| {
            std::fs::create_dir(cache.layer_dir(hex)).unwrap();
            std::fs::write(dir.path().join("layers").join(format!("{hex}.bytes")), bytes.to_string()).unwrap();
        };
        // Three images of a layer of their own (100 bytes each) over a shared base (50).
        for (hex, bytes) in [("base", 50), ("a", 100), ("b", 100), ("c", 100)] {
            layer(hex, bytes);
        }
        for (i, (image, own)) in [("ia", "a"), ("ib", "b"), ("ic", "c")].into_iter().enumerate() {
            let record = ImageRecord { layers: vec!["base".into(), own.into()], ..Default::default() };
            cache.save_image(image, &record).unwrap();
            let used = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i as u64);
            let file = dir.path().join("images").join(format!("{image}.json"));
            std::fs::File::options().append(true).open(file).unwrap().set_modified(used).unwrap();
        }
        assert_eq!(cache.usage(), (350, 3));
        // The oldest is in use: the next oldest goes, with its own layer alone.
        cache.pin("ia");
        assert_eq!(cache.evict(), ["ib"]);
        assert!(!cache.has_layer("b") && cache.has_layer("a") && cache.has_layer("base") && cache.has_layer("c"));
        assert!(cache.image("ib").is_none() && cache.image("ic").is_some());
        assert_eq!(cache.usage(), (250, 2));
        // Within the bound: nothing more goes.
        cache.unpin("ia");
        assert!(cache.evict().is_empty());
    }

    #[test]
    fn whiteouts_become_overlayfs_whiteouts() {
        use std::os::unix::fs::FileTypeExt;
        if !crate::identity::is_root() {
            eprintln!("skipped: whiteouts are device files, made by root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        unpack(&layer(&[("etc/.wh.gone", b""), ("opt/.wh..wh..opq", b""), ("opt/new", b"1")])[..], dir.path()).unwrap();
        let gone = std::fs::symlink_metadata(dir.path().join("etc/gone")).unwrap();
        assert!(gone.file_type().is_char_device());
        let mut value = [0u8; 4];
        let p = std::ffi::CString::new(dir.path().join("opt").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path and name, and a buffer with its length.
        let n =
            unsafe { libc::lgetxattr(p.as_ptr(), c"trusted.overlay.opaque".as_ptr(), value.as_mut_ptr().cast(), 4) };
        assert_eq!(&value[..n.max(0) as usize], b"y");
        assert!(!dir.path().join("opt/.wh..wh..opq").exists());
    }
}
