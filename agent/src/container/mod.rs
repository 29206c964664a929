//! Containers for jobs and steps, with pyxis's options and enroot's model: no daemon, no setuid
//! helper; the agent (root) pulls an image once per node into its cache ([`cache`]), and builds
//! each container's tree once — an overlay of the image's layers with a writable layer of its
//! own, the node's `/proc`, a read-only `/sys`, a `/dev` of its own with the job's GPUs, the
//! user's bind mounts (opened as the user, so a mount shows nothing the user could not read) —
//! under its spool, where only root can reach it. Every task of a step on the node then enters
//! that one tree ([`enter::Enter`]): a mount namespace whose root it is, the job's cgroup as
//! outside, and a user namespace mapping the user to themselves (or to 0 with
//! `--container-remap-root`), never more.
//!
//! A registry's manifest is always fetched with the user's own credentials before the cache is
//! used, so an image another user pulled is never handed to someone the registry would refuse.

pub mod cache;
pub mod enter;
pub mod mounts;
pub mod registry;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use quorum_model::container::{ImageRef, Mount};
use quorum_proto::api;

use crate::devices::Device;
use crate::identity::Account;
use cache::{Cache, Compression, ImageRecord};
pub use enter::Enter;
use mounts::{Kind, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

/// What an agent that runs containers says it can do when it registers.
pub const CAPABILITY: &str = "containers";

/// What the operator allows and where images go (`quorum-agent --containers ...`).
#[derive(Clone, Debug)]
pub struct ContainerConfig {
    /// Whether jobs may run in containers on this node at all.
    pub enabled: bool,
    /// The image cache; `None`: `images/` in the spool.
    pub cache_dir: Option<PathBuf>,
    /// The cache's size bound: past it, the least recently used images not in use go.
    pub cache_bytes: u64,
    /// The registries images may come from (`host[:port]`); empty: any.
    pub registries: Vec<String>,
    /// Where an image without `REGISTRY#` is (Docker Hub's, as enroot's default).
    pub default_registry: String,
    /// CAs (PEM files) trusted for registries, beside the system's.
    pub registry_ca: Vec<PathBuf>,
    /// Registries spoken to over plain HTTP (a test registry on loopback).
    pub http_registries: Vec<String>,
}

impl Default for ContainerConfig {
    fn default() -> Self {
        ContainerConfig {
            enabled: true,
            cache_dir: None,
            cache_bytes: 50 << 30,
            registries: Vec::new(),
            default_registry: "registry-1.docker.io".into(),
            registry_ca: Vec::new(),
            http_registries: Vec::new(),
        }
    }
}

/// Counters for `/metrics`.
#[derive(Default)]
pub struct ContainerMetrics {
    /// Images fetched from a registry (at least one layer downloaded).
    pub pulls: AtomicU64,
    pub pull_bytes: AtomicU64,
    pub pull_ms: AtomicU64,
    /// Images found whole in the cache.
    pub cache_hits: AtomicU64,
    pub failures: AtomicU64,
    pub started: AtomicU64,
}

/// A container's tree on this node, shared by the tasks that run in it.
pub struct Live {
    dir: PathBuf,
    pub root: PathBuf,
    image: ImageRecord,
    /// The cached image it pins (digest hex), when from a registry.
    pinned: Option<String>,
    pub remap_root: bool,
    pub named: bool,
    /// The node's NVIDIA driver files are in it (`/usr/local/nvidia`).
    gpu_driver: bool,
    /// Tasks of steps running in it now.
    pub users: AtomicUsize,
}

impl Live {
    /// The task's environment: the job's, where the image sets a variable the image's value
    /// (pyxis's rule) unless `keep` names it; the job's own (`SLURM_*`, GPUs, `TMPDIR`) always.
    pub fn environment(&self, job: Vec<(String, String)>, keep: &[String]) -> Vec<(String, String)> {
        let ours = |k: &str| {
            k.starts_with("SLURM_")
                || k.starts_with("QUORUM_")
                || matches!(k, "CUDA_VISIBLE_DEVICES" | "GPU_DEVICE_ORDINAL" | "TMPDIR")
                || keep.iter().any(|n| n == k)
        };
        let mut env = job;
        for kv in &self.image.env {
            let Some((k, v)) = kv.split_once('=') else { continue };
            if ours(k) && env.iter().any(|(n, _)| n == k) {
                continue;
            }
            env.retain(|(n, _)| n != k);
            env.push((k.to_string(), v.to_string()));
        }
        if self.gpu_driver {
            for (k, dir) in [("PATH", "/usr/local/nvidia/bin"), ("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")] {
                match env.iter_mut().find(|(n, _)| n == k) {
                    Some((_, v)) if !v.split(':').any(|d| d == dir) => *v = format!("{v}:{dir}"),
                    Some(_) => {}
                    None => env.push((k.to_string(), dir.to_string())),
                }
            }
        }
        if !env.iter().any(|(k, _)| k == "PATH") {
            env.push(("PATH".into(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()));
        }
        env
    }

    /// The working directory inside: `--container-workdir`, the image's, or `/`.
    pub fn workdir(&self, spec: &api::Container) -> String {
        [spec.workdir.as_str(), self.image.workdir.as_str()]
            .into_iter()
            .find(|w| w.starts_with('/'))
            .unwrap_or("/")
            .to_string()
    }

    /// What runs: the command, after the image's entrypoint with `--container-entrypoint`.
    pub fn argv(&self, spec: &api::Container, argv: &[String]) -> Vec<String> {
        if spec.entrypoint && !self.image.entrypoint.is_empty() {
            self.image.entrypoint.iter().chain(argv).cloned().collect()
        } else {
            argv.to_vec()
        }
    }

    /// `program` found on `env`'s `PATH` inside the container (its path there); a name with a
    /// `/` as it is.
    pub fn find_program(&self, program: &str, env: &[(String, String)]) -> Option<String> {
        if program.contains('/') {
            return Some(program.to_string());
        }
        let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or("/usr/bin:/bin");
        let root = mounts::open_root(&self.root).ok()?;
        path.split(':').filter(|d| d.starts_with('/')).map(|d| format!("{}/{program}", d.trim_end_matches('/'))).find(
            |p| mounts::in_root_existing(&root, Path::new(p)).is_some_and(|fd| !mounts::is_dir(&fd).unwrap_or(true)),
        )
    }

    /// How a task of `account` (the agent's own user without one) enters it.
    pub fn enter(&self, account: Option<&Account>) -> std::io::Result<Enter> {
        let (uid, gid) = ids(account);
        Enter::new(&self.root, uid, gid, self.remap_root)
    }
}

/// The uid and gid a job of `account` runs with: the agent's own without one.
fn ids(account: Option<&Account>) -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail.
    account.map_or_else(|| unsafe { (libc::getuid(), libc::getgid()) }, |a| (a.uid, a.gid))
}

/// Where a pull tells the leader how far it got (`JobProgress`), for `squeue` and `scontrol`.
pub struct Progress {
    pub tx: tokio::sync::mpsc::Sender<quorum_proto::agent::AgentMessage>,
    pub job_id: u64,
    pub token: u64,
    /// The job's own start waits (its batch step), not one of its steps.
    pub launch: bool,
}

impl Progress {
    fn tell(&self, text: String) {
        use quorum_proto::agent::{agent_message, AgentMessage, JobProgress};
        let p = JobProgress { job_id: self.job_id, token: self.token, text, launch: self.launch };
        // Never held up by a full queue: progress is only a hint.
        let _ = self.tx.try_send(AgentMessage { msg: Some(agent_message::Msg::Progress(p)) });
    }
}

/// Says "no longer waiting" when dropped, however the pull ends.
struct Told<'a>(Option<&'a Progress>);

impl Drop for Told<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.0 {
            p.tell(String::new());
        }
    }
}

/// A step's container on this node, and what is to be done when its tasks here are all done.
pub struct StepUse {
    pub live: Arc<Live>,
    pub spec: api::Container,
    /// Tasks here not done yet.
    pub left: usize,
    pub save: bool,
    pub account: Option<Account>,
}

impl std::fmt::Debug for StepUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StepUse({}, {} left)", self.live.root.display(), self.left)
    }
}

/// What [`Containers::open`] needs besides the container spec.
pub struct Request<'a> {
    pub job_id: u64,
    /// The container's name within the job: `--container-name`, or the step's own.
    pub key: String,
    pub account: Option<&'a Account>,
    /// The job's environment (where the user's registry credentials are).
    pub env: &'a [(String, String)],
    /// Paths of the node seen at the same place inside (the job's TMPDIR, its batch script).
    pub same_path: Vec<PathBuf>,
    /// The job's GPUs here.
    pub gpus: Vec<Device>,
}

type Turn = Arc<tokio::sync::Mutex<()>>;

/// The node's containers: its image cache and the containers that exist now.
pub struct Containers {
    pub config: ContainerConfig,
    base: PathBuf,
    cache_dir: PathBuf,
    cache: OnceLock<Result<Arc<Cache>, String>>,
    registries: OnceLock<Result<registry::Registries, String>>,
    live: Mutex<HashMap<(u64, String), Arc<Live>>>,
    /// One async lock per container being made (job, name): a second asker waits for the first.
    making: Mutex<HashMap<(u64, String), Turn>>,
    /// The cache's use as last counted.
    usage: Mutex<Option<(u64, usize)>>,
    pub metrics: ContainerMetrics,
}

impl Containers {
    pub fn new(config: ContainerConfig, spool: &Path) -> Containers {
        let cache_dir = config.cache_dir.clone().unwrap_or_else(|| spool.join("images"));
        Containers {
            config,
            base: spool.join("containers"),
            cache_dir,
            cache: OnceLock::new(),
            registries: OnceLock::new(),
            live: Mutex::new(HashMap::new()),
            making: Mutex::new(HashMap::new()),
            usage: Mutex::new(None),
            metrics: ContainerMetrics::default(),
        }
    }

    fn cache(&self) -> Result<Arc<Cache>, String> {
        self.cache
            .get_or_init(|| {
                Cache::open(&self.cache_dir, self.config.cache_bytes)
                    .map(Arc::new)
                    .map_err(|e| format!("the image cache {}: {e}", self.cache_dir.display()))
            })
            .clone()
    }

    fn registries(&self) -> Result<&registry::Registries, String> {
        self.registries
            .get_or_init(|| registry::Registries::new(&self.config.registry_ca, &self.config.http_registries))
            .as_ref()
            .map_err(|e| e.clone())
    }

    /// Containers on this node now.
    pub fn live_count(&self) -> usize {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Bytes the cache's layers take, and its images, for `quorum nodes` and `/metrics`: as last
    /// counted (after each pull), without touching the disk when no container was ever asked for.
    pub fn cache_usage(&self) -> (u64, usize) {
        if self.cache.get().is_none() && !self.cache_dir.join("layers").exists() {
            return (0, 0);
        }
        let mut counted = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        if counted.is_none() {
            *counted = Some(self.cache().map(|c| c.usage()).unwrap_or((0, 0)));
        }
        counted.unwrap_or((0, 0))
    }

    /// Counts the cache again (after a pull).
    fn recount(&self) {
        let now = self.cache().map(|c| c.usage()).unwrap_or((0, 0));
        *self.usage.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
    }

    /// The container `spec` asks for: the job's of that name when it has one already, else a
    /// new one (its image pulled or found in the cache first).
    pub async fn open(
        &self,
        spec: &api::Container,
        req: Request<'_>,
        progress: Option<Progress>,
    ) -> Result<Arc<Live>, String> {
        let named = !spec.name.is_empty();
        let key = (req.job_id, if named { format!("name.{}", spec.name) } else { req.key.clone() });
        let making = {
            let mut m = self.making.lock().unwrap_or_else(|p| p.into_inner());
            m.retain(|_, l| Arc::strong_count(l) > 1);
            m.entry(key.clone()).or_default().clone()
        };
        let _one = making.lock().await;
        if let Some(live) = self.live.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(live.clone());
        }
        if !self.config.enabled {
            return Err("containers are not allowed on this node".into());
        }
        if !crate::identity::is_root() {
            return Err("containers need the node's agent to run as root".into());
        }
        if spec.image.is_empty() {
            return Err(format!(
                "no container named '{}' in this job on this node (give --container-image to make it)",
                spec.name
            ));
        }
        let (image, pinned, squash_file) = if spec.image.starts_with('/') {
            (ImageRecord::default(), None, Some(PathBuf::from(&spec.image)))
        } else {
            let (hex, record) = self.pull(&spec.image, &req, progress.as_ref()).await.inspect_err(|_| {
                self.metrics.failures.fetch_add(1, Ordering::Relaxed);
            })?;
            (record, Some(hex), None)
        };
        let dir = self.base.join(req.job_id.to_string()).join(&key.1);
        let plan = Plan {
            dir: dir.clone(),
            layers: match (&pinned, self.cache()) {
                (Some(_), Ok(cache)) => image.layers.iter().rev().map(|l| cache.layer_dir(l)).collect(),
                _ => Vec::new(),
            },
            squash_file,
            mounts: spec.mounts.iter().map(|m| Mount::parse(m)).collect::<Result<_, _>>()?,
            home: spec.mount_home.then(|| req.account.map(|a| PathBuf::from(&a.home))).flatten(),
            same_path: req.same_path.clone(),
            workdir: [spec.workdir.as_str(), image.workdir.as_str()]
                .into_iter()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from),
            readonly: spec.readonly,
            gpus: req.gpus.clone(),
            account: req.account.cloned(),
            ids: Some(ids(req.account)),
            base: self.base.clone(),
        };
        let built = tokio::task::spawn_blocking(move || build(&plan)).await.map_err(|e| e.to_string())?;
        let gpu_driver = match built {
            Ok(b) => b,
            Err(e) => {
                if let (Some(hex), Ok(cache)) = (&pinned, self.cache()) {
                    cache.unpin(hex);
                }
                self.metrics.failures.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        let live = Arc::new(Live {
            root: dir.join("root"),
            dir,
            image,
            pinned,
            remap_root: spec.remap_root,
            named,
            gpu_driver,
            users: AtomicUsize::new(0),
        });
        self.metrics.started.fetch_add(1, Ordering::Relaxed);
        self.live.lock().unwrap_or_else(|p| p.into_inner()).insert(key, live.clone());
        Ok(live)
    }

    /// Pulls `image` for the user (or finds it cached after the registry said they may have it):
    /// its digest (hex) and record, pinned.
    async fn pull(
        &self,
        image: &str,
        req: &Request<'_>,
        progress: Option<&Progress>,
    ) -> Result<(String, ImageRecord), String> {
        let named = |e: String| format!("image '{image}': {e}");
        let r = ImageRef::parse(image, &self.config.default_registry)?;
        if !self.config.registries.is_empty() && !self.config.registries.contains(&r.registry) {
            return Err(named(format!(
                "registry {} is not allowed on this cluster (allowed: {})",
                r.registry,
                self.config.registries.join(", ")
            )));
        }
        let cache = self.cache()?;
        let (account, env) = (req.account.cloned(), req.env.to_vec());
        let r2 = r.clone();
        let login = tokio::task::spawn_blocking(move || registry::user_login(&r2, account.as_ref(), &env))
            .await
            .map_err(|e| e.to_string())?
            .map_err(named)?;
        let uid = req.account.map(|a| a.uid).unwrap_or(0);
        let client = self.registries()?.client(uid, &r.registry, login.as_ref());
        let reference = if r.reference.starts_with("sha256:") {
            oci_client::Reference::with_digest(r.registry.clone(), r.repository.clone(), r.reference.clone())
        } else {
            oci_client::Reference::with_tag(r.registry.clone(), r.repository.clone(), r.reference.clone())
        };
        let auth = registry::auth(login.as_ref());
        let started = Instant::now();
        let _told = Told(progress);
        if let Some(p) = progress {
            p.tell(format!("pulling image {image}"));
        }
        let (manifest, digest, config) =
            client.pull_manifest_and_config(&reference, &auth).await.map_err(|e| named(registry::explain(&e)))?;
        let hex = digest.strip_prefix("sha256:").unwrap_or(&digest).to_string();
        if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(named(format!("the registry gave the digest '{digest}', not a sha256 one")));
        }
        let _image = cache.exclusive(&hex).await;
        cache.pin(&hex);
        if let Some(record) = cache.image(&hex) {
            self.metrics.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok((hex, record));
        }
        let total: i64 = manifest.layers.iter().map(|l| l.size.max(0)).sum();
        let mb = |b: i64| format!("{:.1} MB", b as f64 / 1e6);
        let fetched = async {
            let mut layers = Vec::new();
            let mut bytes = 0u64;
            let mut done: i64 = 0;
            for (i, layer) in manifest.layers.iter().enumerate() {
                if let Some(p) = progress {
                    let n = manifest.layers.len();
                    p.tell(format!("pulling image {image}: layer {} of {n}, {} of {}", i + 1, mb(done), mb(total)));
                }
                done += layer.size.max(0);
                let lhex = layer.digest.strip_prefix("sha256:").unwrap_or("").to_string();
                if lhex.len() != 64 || !lhex.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(format!("a layer's digest '{}' is not a sha256 one", layer.digest));
                }
                let compression = Compression::of(&layer.media_type)?;
                let _layer = cache.exclusive(&format!("layer.{lhex}")).await;
                if !cache.has_layer(&lhex) {
                    let blob = cache.temp_path(&format!("blob-{lhex}"));
                    let file = tokio::fs::File::create(&blob).await.map_err(|e| format!("{}: {e}", blob.display()))?;
                    let pulled = client.pull_blob(&reference, layer, file).await;
                    if let Err(e) = pulled {
                        let _ = std::fs::remove_file(&blob);
                        return Err(registry::explain(&e));
                    }
                    bytes += std::fs::metadata(&blob).map(|m| m.len()).unwrap_or(0);
                    let (c, h) = (cache.clone(), lhex.clone());
                    tokio::task::spawn_blocking(move || c.unpack_layer(&h, &blob, compression))
                        .await
                        .map_err(|e| e.to_string())??;
                }
                layers.push(lhex);
            }
            let record = ImageRecord::from_config(layers, &config);
            cache.save_image(&hex, &record).map_err(|e| format!("saving the image record: {e}"))?;
            Ok((record, bytes))
        }
        .await;
        let (record, bytes) = match fetched {
            Ok(f) => f,
            Err(e) => {
                cache.unpin(&hex);
                return Err(named(e));
            }
        };
        self.metrics.pulls.fetch_add(1, Ordering::Relaxed);
        self.metrics.pull_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.metrics.pull_ms.fetch_add(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        tracing::info!(image, digest = %digest, bytes, ms = started.elapsed().as_millis() as u64, "image pulled");
        let c = cache.clone();
        let _ = tokio::task::spawn_blocking(move || c.evict()).await;
        self.recount();
        Ok((hex, record))
    }

    /// A step done with its container on this node: saved to `save` (as the user) when asked,
    /// then removed unless it is named (a named one lasts as long as the job). Blocking.
    pub fn release(&self, job_id: u64, live: &Arc<Live>, save: Option<(&str, Option<&Account>)>) -> Result<(), String> {
        let saved = match save {
            Some((path, account)) if !path.is_empty() => save_squashfs(live, Path::new(path), account),
            _ => Ok(()),
        };
        if !live.named {
            self.remove(job_id, live);
        }
        saved
    }

    fn remove(&self, job_id: u64, live: &Arc<Live>) {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).retain(|(j, _), l| !(*j == job_id && Arc::ptr_eq(l, live)));
        teardown(&live.dir);
        if let (Some(hex), Ok(cache)) = (&live.pinned, self.cache()) {
            cache.unpin(hex);
        }
    }

    /// The job ended here: every container it has on this node goes. Blocking.
    pub fn end_job(&self, job_id: u64) {
        let mine: Vec<Arc<Live>> = {
            let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            live.iter().filter(|((j, _), _)| *j == job_id).map(|(_, l)| l.clone()).collect()
        };
        for l in mine {
            self.remove(job_id, &l);
        }
        let dir = self.base.join(job_id.to_string());
        if dir.exists() {
            sweep(&dir);
        }
    }

    /// The agent stops: with no container left, the containers' directory is unmounted (a
    /// running job's container stays, for the next agent).
    pub fn stop(&self) {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).len();
        if live == 0 && mounts::mounts_under(&self.base).len() == 1 {
            let _ = mounts::detach(&self.base);
        }
    }

    /// At the agent's start: the containers of jobs that no longer run here are removed.
    pub fn sweep_except(&self, running: &[u64]) {
        let Ok(jobs) = std::fs::read_dir(&self.base) else { return };
        for job in jobs.flatten() {
            let id = job.file_name().to_string_lossy().parse::<u64>().ok();
            if id.is_some_and(|id| !running.contains(&id)) {
                sweep(&job.path());
            }
        }
    }
}

/// Removes every container under `dir` (a job's), unmounting first; never removes what is still
/// mounted.
fn sweep(dir: &Path) {
    for c in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        teardown(&c.path());
    }
    let _ = std::fs::remove_dir(dir);
}

/// Unmounts a container's tree (its root, its image's layers, a squashfs image) and removes its
/// directory, unless something is still mounted there (then it is left, and logged): nothing
/// mounted from elsewhere (a user's directory, a cached layer) is ever removed through it.
fn teardown(dir: &Path) {
    for m in mounts::mounts_under(dir) {
        if let Err(e) = mounts::detach(&m) {
            // Below a mount detached before it: gone with it.
            if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOENT) {
                tracing::warn!(mount = %m.display(), error = %e, "cannot unmount a container's mount");
            }
        }
    }
    let left = mounts::mounts_under(dir);
    if !left.is_empty() {
        tracing::warn!(dir = %dir.display(), mounts = left.len(), "a container is still mounted: left in place");
        return;
    }
    let _ = cache::remove_any(dir);
}

/// Each layer seen with `uid`:`gid` as its root (an idmapped mount each, under `dir/lowers`).
fn idmap_layers(dir: &Path, layers: &[OwnedFd], uid: u32, gid: u32) -> std::io::Result<Vec<OwnedFd>> {
    use std::os::unix::fs::DirBuilderExt;
    let ns = mounts::user_namespace(uid, gid)?;
    let at = dir.join("lowers");
    std::fs::DirBuilder::new().mode(0o700).create(&at)?;
    layers
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            let target = at.join(i.to_string());
            std::fs::DirBuilder::new().mode(0o700).create(&target)?;
            mounts::idmapped(layer, &ns, &target)?;
            mounts::open_path(&target)
        })
        .collect()
}

/// What a container's tree is made of.
struct Plan {
    dir: PathBuf,
    /// The image's layers, top first (from the cache).
    layers: Vec<PathBuf>,
    squash_file: Option<PathBuf>,
    mounts: Vec<Mount>,
    home: Option<PathBuf>,
    same_path: Vec<PathBuf>,
    workdir: Option<PathBuf>,
    readonly: bool,
    gpus: Vec<Device>,
    account: Option<Account>,
    /// The job's uid and gid.
    ids: Option<(u32, u32)>,
    base: PathBuf,
}

/// Opens each of `paths` (`O_PATH`) as `account`, on a thread of its own: what they cannot reach
/// fails here, naming the path.
fn open_as(account: Option<&Account>, paths: Vec<PathBuf>) -> Result<Vec<OwnedFd>, String> {
    let account = account.cloned();
    std::thread::spawn(move || {
        if let Some(a) = &account {
            crate::as_user::become_for_files(a).map_err(|e| format!("cannot act as user {}: {e}", a.name))?;
        }
        paths
            .iter()
            .map(|p| mounts::open_path(p).map_err(|e| format!("{}: {e}", p.display())))
            .collect::<Result<Vec<_>, _>>()
    })
    .join()
    .map_err(|_| "opening the mounts failed".to_string())?
}

/// Builds the container's tree (see the module's text). Blocking; as root. Whether the node's
/// GPU driver went in.
fn build(plan: &Plan) -> Result<bool, String> {
    use std::os::unix::fs::DirBuilderExt;
    let io = |what: &str| {
        let what = what.to_string();
        move |e: std::io::Error| format!("{what}: {e}")
    };
    // The containers' directory: root's alone, and a private mount, so that nothing mounted in it
    // shows in other mount namespaces of the node.
    static BASE: Mutex<()> = Mutex::new(());
    let base_lock = BASE.lock().unwrap_or_else(|p| p.into_inner());
    if !mounts::is_mount_point(&plan.base) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&plan.base)
            .map_err(io("the containers directory"))?;
        let base = mounts::open_path(&plan.base).map_err(io("the containers directory"))?;
        mounts::bind(&base, &base, false, 0).map_err(io("making the containers directory a mount"))?;
    }
    drop(base_lock);
    let dir = &plan.dir;
    if dir.exists() {
        teardown(dir);
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io("the container directory"))?;
    let made = (|| -> Result<bool, String> {
        for (sub, mode) in [("upper", 0o755), ("work", 0o700), ("root", 0o755)] {
            std::fs::DirBuilder::new().mode(mode).create(dir.join(sub)).map_err(io("the container directory"))?;
        }
        // The user's files, opened as the user: their image file and every source they mount.
        let mut sources: Vec<PathBuf> = plan.mounts.iter().map(|m| PathBuf::from(&m.source)).collect();
        sources.extend(plan.home.iter().cloned());
        sources.extend(plan.same_path.iter().cloned());
        sources.extend(plan.squash_file.iter().cloned());
        let mut opened = open_as(plan.account.as_ref(), sources)?.into_iter();
        let user_mounts: Vec<OwnedFd> = opened.by_ref().take(plan.mounts.len()).collect();
        let home = plan.home.as_ref().and_then(|_| opened.next());
        let same: Vec<OwnedFd> = opened.by_ref().take(plan.same_path.len()).collect();
        let squash_fd = opened.next();
        let lowers: Vec<OwnedFd> = if let (Some(file), Some(fd)) = (&plan.squash_file, squash_fd) {
            let at = dir.join("image");
            std::fs::DirBuilder::new().mode(0o700).create(&at).map_err(io("the image mount point"))?;
            squashfuse(&fd, &at).map_err(|e| format!("image '{}': {e}", file.display()))?;
            vec![mounts::open_path(&at).map_err(io("the image"))?]
        } else {
            plan.layers.iter().map(|l| mounts::open_path(l).map_err(io("a cached layer"))).collect::<Result<_, _>>()?
        };
        if lowers.is_empty() {
            return Err("the image has no layers".into());
        }
        // The image's files, root's in the cache, are the user's in their container (as enroot's,
        // which the user unpacks): each layer seen through an idmapped mount (0 is the user),
        // where the kernel and file system have them; else as they are (writable only where
        // the image lets anyone write).
        let lowers = match plan.ids.filter(|(uid, _)| *uid != 0) {
            None => lowers,
            Some((uid, gid)) => {
                match idmap_layers(dir, &lowers, uid, gid) {
                    Ok(mapped) => mapped,
                    Err(e) => {
                        static WARNED: std::sync::Once = std::sync::Once::new();
                        WARNED.call_once(|| tracing::warn!(error = %e, "no idmapped mounts here: containers' image files stay root's"));
                        lowers
                    }
                }
            }
        };
        let fds: Vec<String> =
            lowers.iter().map(|f| format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(f))).collect();
        let (upper, work) = (dir.join("upper"), dir.join("work"));
        for p in [&upper, &work] {
            if p.to_string_lossy().contains([',', ':', '\\']) {
                return Err(format!(
                    "the spool path {} has a ',', ':' or '\\', which overlayfs cannot take",
                    p.display()
                ));
            }
        }
        if let Some((uid, gid)) = plan.ids {
            // The container's own root directory is the user's, as the image's files are.
            std::os::unix::fs::chown(&upper, Some(uid), Some(gid)).map_err(io("the container directory"))?;
        }
        let data = format!("lowerdir={},upperdir={},workdir={}", fds.join(":"), upper.display(), work.display());
        if data.len() > 4000 {
            return Err(format!("the image has {} layers, more than one overlay mount takes here", lowers.len()));
        }
        let root_path = dir.join("root");
        let root_c = std::ffi::CString::new(root_path.display().to_string()).map_err(|e| e.to_string())?;
        mounts::mount_at("overlay", &root_c, libc::MS_NOSUID | libc::MS_NODEV, &data)
            .map_err(io("mounting the image (overlayfs)"))?;
        drop(lowers);
        let root = mounts::open_root(&root_path).map_err(io("the container root"))?;
        let inside = |p: &Path, kind: Kind| {
            mounts::in_root(&root, p, kind).map_err(|e| format!("{} in the container: {e}", p.display()))
        };
        // Every mount point first, while the root is writable.
        let targets: Vec<(OwnedFd, Kind)> = plan
            .mounts
            .iter()
            .zip(&user_mounts)
            .map(|(m, src)| {
                let kind = if mounts::is_dir(src).unwrap_or(true) { Kind::Dir } else { Kind::File };
                inside(Path::new(&m.target), kind).map(|t| (t, kind))
            })
            .collect::<Result<_, _>>()?;
        let home_target = match (&plan.home, &home) {
            (Some(h), Some(_)) => Some(inside(h, Kind::Dir)?),
            _ => None,
        };
        let same_targets: Vec<OwnedFd> = plan
            .same_path
            .iter()
            .zip(&same)
            .map(|(p, src)| inside(p, if mounts::is_dir(src).unwrap_or(true) { Kind::Dir } else { Kind::File }))
            .collect::<Result<_, _>>()?;
        if let Some(w) = &plan.workdir {
            let existed = mounts::in_root_existing(&root, w).is_some();
            let made = inside(w, Kind::Dir)?;
            if let (false, Some((uid, gid))) = (existed, plan.ids) {
                mounts::chown(&made, uid, gid).map_err(io("the working directory"))?;
            }
        }
        let proc_t = inside(Path::new("/proc"), Kind::Dir)?;
        let sys_t = inside(Path::new("/sys"), Kind::Dir)?;
        let dev_t = inside(Path::new("/dev"), Kind::Dir)?;
        let etc: Vec<(OwnedFd, OwnedFd)> = ["/etc/hosts", "/etc/resolv.conf"]
            .iter()
            .filter(|f| Path::new(f).is_file())
            .map(|f| Ok((mounts::open_path(Path::new(f)).map_err(io(f))?, inside(Path::new(f), Kind::File)?)))
            .collect::<Result<_, String>>()?;
        let driver = nvidia_driver_files();
        let driver_targets: Vec<(OwnedFd, OwnedFd)> = driver
            .iter()
            .map(|(host, inner)| {
                Ok((mounts::open_path(host).map_err(io("a driver file"))?, inside(inner, Kind::File)?))
            })
            .collect::<Result<_, String>>()?;
        if plan.readonly {
            mounts::set_attrs(&root_path, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
                .map_err(io("making the container read-only"))?;
        }
        let safe = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        mounts::bind(
            &mounts::open_path(Path::new("/proc")).map_err(io("/proc"))?,
            &proc_t,
            true,
            safe | MOUNT_ATTR_NOEXEC,
        )
        .map_err(io("mounting /proc"))?;
        mounts::bind(
            &mounts::open_path(Path::new("/sys")).map_err(io("/sys"))?,
            &sys_t,
            true,
            safe | MOUNT_ATTR_NOEXEC | MOUNT_ATTR_RDONLY,
        )
        .map_err(io("mounting /sys"))?;
        make_dev(&root, &dev_t, &plan.gpus).map_err(io("making /dev"))?;
        for (src, t) in &etc {
            mounts::bind(src, t, false, safe | MOUNT_ATTR_RDONLY).map_err(io("mounting /etc/hosts"))?;
        }
        for (src, t) in &driver_targets {
            mounts::bind(src, t, false, MOUNT_ATTR_NODEV | MOUNT_ATTR_RDONLY).map_err(io("mounting the GPU driver"))?;
        }
        for ((m, src), (t, _)) in plan.mounts.iter().zip(&user_mounts).zip(&targets) {
            let mut attrs = safe;
            if m.readonly {
                attrs |= MOUNT_ATTR_RDONLY;
            }
            if m.noexec {
                attrs |= MOUNT_ATTR_NOEXEC;
            }
            mounts::bind(src, t, m.recursive, attrs)
                .map_err(|e| format!("--container-mounts {}:{}: {e}", m.source, m.target))?;
        }
        if let (Some(src), Some(t)) = (&home, &home_target) {
            mounts::bind(src, t, false, safe).map_err(io("mounting the home directory"))?;
        }
        for (src, t) in same.iter().zip(&same_targets) {
            mounts::bind(src, t, false, safe).map_err(io("mounting the job's directories"))?;
        }
        Ok(!driver.is_empty())
    })();
    if made.is_err() {
        teardown(dir);
    }
    made
}

/// `/dev` of the container's own: a small tmpfs with the usual devices, a `pts` of its own, `shm`,
/// and the job's GPUs (and the NVIDIA control devices the node has).
fn make_dev(root: &OwnedFd, target: &OwnedFd, gpus: &[Device]) -> std::io::Result<()> {
    mounts::mount_new("tmpfs", target, libc::MS_NOSUID | libc::MS_NOEXEC, "mode=755,size=65536k")?;
    let dev = mounts::in_root(root, Path::new("/dev"), Kind::Dir)?;
    for (name, major, minor) in
        [("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0)]
    {
        mounts::char_device(&dev, name, major, minor)?;
    }
    for (i, g) in gpus.iter().enumerate() {
        let _ = i;
        mounts::char_device(&dev, &format!("nvidia{}", g.minor), g.major, g.minor)?;
    }
    for name in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"] {
        if let Ok(d) = Device::of(&Path::new("/dev").join(name)) {
            mounts::char_device(&dev, name, d.major, d.minor)?;
        }
    }
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        mounts::symlink(&dev, name, to)?;
    }
    mounts::dir_with_mode(&dev, "pts", 0o755)?;
    mounts::dir_with_mode(&dev, "shm", 0o1777)?;
    let pts = mounts::in_root(root, Path::new("/dev/pts"), Kind::Dir)?;
    mounts::mount_new("devpts", &pts, libc::MS_NOSUID | libc::MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")?;
    let shm = mounts::in_root(root, Path::new("/dev/shm"), Kind::Dir)?;
    mounts::mount_new("tmpfs", &shm, libc::MS_NOSUID | libc::MS_NODEV, "mode=1777")?;
    Ok(())
}

/// The node's NVIDIA driver libraries and tools, as enroot's NVIDIA hook gives them: (where on
/// the node, where inside — `/usr/local/nvidia/lib64` and `bin`, on CUDA images' paths).
/// Nothing where no driver is loaded.
fn nvidia_driver_files() -> Vec<(PathBuf, PathBuf)> {
    if !Path::new("/proc/driver/nvidia/version").exists() {
        return Vec::new();
    }
    let mut files = Vec::new();
    if let Ok(out) = std::process::Command::new("ldconfig").arg("-p").output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((name, path)) = line.trim().split_once(" => ") else { continue };
            let soname = name.split_whitespace().next().unwrap_or("");
            let wanted = soname.starts_with("libcuda.so")
                || soname.starts_with("libnvidia-")
                || soname.starts_with("libcudadebugger");
            if wanted && line.contains("x86-64") == cfg!(target_arch = "x86_64") && Path::new(path).exists() {
                files.push((PathBuf::from(path), Path::new("/usr/local/nvidia/lib64").join(soname)));
            }
        }
    }
    for tool in
        ["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"]
    {
        let host = Path::new("/usr/bin").join(tool);
        if host.exists() {
            files.push((host, Path::new("/usr/local/nvidia/bin").join(tool)));
        }
    }
    files.sort_by(|a, b| a.1.cmp(&b.1));
    files.dedup_by(|a, b| a.1 == b.1);
    files
}

/// Mounts the squashfs file open as `file` (opened as the user) at `at` with squashfuse, in user
/// space (the kernel never parses a file a user gave).
fn squashfuse(file: &OwnedFd, at: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    // A plain descriptor the helper inherits (O_PATH cannot be read: reopen it for reading).
    let reopened = std::fs::File::open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|e| format!("cannot read it: {e}"))?;
    // SAFETY: dup of a live descriptor; the copy is not close-on-exec, for the helper.
    let inherited = unsafe { libc::dup(reopened.as_raw_fd()) };
    if inherited < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let out = std::process::Command::new("squashfuse")
        .arg("-o")
        .arg("ro,allow_other,nosuid,nodev")
        .arg(format!("/proc/self/fd/{inherited}"))
        .arg(at)
        .output();
    // SAFETY: ours to close.
    unsafe { libc::close(inherited) };
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("squashfuse: {}", String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err("squashfuse is not installed on this node".into()),
        Err(e) => Err(format!("squashfuse: {e}")),
    }
}

/// `--container-save`: the container's file system (not what is mounted in it) as a squashfs
/// file at `path`, written as the user.
fn save_squashfs(live: &Live, path: &Path, account: Option<&Account>) -> Result<(), String> {
    let tmp = live.dir.join("save.sqsh");
    let out = std::process::Command::new("mksquashfs")
        .arg(&live.root)
        .arg(&tmp)
        .args(["-noappend", "-one-file-system", "-all-root", "-no-progress", "-quiet"])
        .output()
        .map_err(|e| format!("--container-save: mksquashfs: {e}"))?;
    if !out.status.success() {
        return Err(format!("--container-save: mksquashfs: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let (account, path, from) = (account.cloned(), path.to_path_buf(), tmp.clone());
    let written = std::thread::spawn(move || -> Result<(), String> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut src = std::fs::File::open(&from).map_err(|e| e.to_string())?;
        if let Some(a) = &account {
            crate::as_user::become_for_files(a).map_err(|e| e.to_string())?;
        }
        let mut dst = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        std::io::copy(&mut src, &mut dst).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(())
    })
    .join()
    .map_err(|_| "--container-save failed".to_string())?;
    let _ = std::fs::remove_file(&tmp);
    written.map_err(|e| format!("--container-save: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(env: &[&str]) -> Live {
        Live {
            dir: PathBuf::new(),
            root: PathBuf::new(),
            image: ImageRecord {
                env: env.iter().map(|s| s.to_string()).collect(),
                workdir: "/w".into(),
                entrypoint: vec!["/init".into()],
                ..Default::default()
            },
            pinned: None,
            remap_root: false,
            named: false,
            gpu_driver: false,
            users: AtomicUsize::new(0),
        }
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_image_environment_wins_as_with_pyxis_but_never_over_the_jobs_own() {
        let l = live(&["PATH=/opt/bin:/usr/bin", "LANG=C.UTF-8", "CUDA_VISIBLE_DEVICES=all", "HOME=/root"]);
        let job =
            pairs(&[("PATH", "/host/bin"), ("HOME", "/home/a"), ("CUDA_VISIBLE_DEVICES", "1"), ("SLURM_JOB_ID", "7")]);
        let env = l.environment(job.clone(), &[]);
        let get = |env: &[(String, String)], k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get(&env, "PATH").as_deref(), Some("/opt/bin:/usr/bin"));
        assert_eq!(get(&env, "LANG").as_deref(), Some("C.UTF-8"));
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES").as_deref(), Some("1"));
        assert_eq!(get(&env, "SLURM_JOB_ID").as_deref(), Some("7"));
        assert_eq!(get(&env, "HOME").as_deref(), Some("/root"));
        let kept = l.environment(job, &["HOME".into()]);
        assert_eq!(get(&kept, "HOME").as_deref(), Some("/home/a"));
    }

    #[test]
    fn workdir_and_entrypoint_follow_the_options() {
        let l = live(&[]);
        let mut spec = api::Container::default();
        assert_eq!(l.workdir(&spec), "/w");
        spec.workdir = "/data".into();
        assert_eq!(l.workdir(&spec), "/data");
        let argv = vec!["sh".to_string()];
        assert_eq!(l.argv(&spec, &argv), ["sh"]);
        spec.entrypoint = true;
        assert_eq!(l.argv(&spec, &argv), ["/init", "sh"]);
    }
}
