//! What a job may use on its node. Each job gets a cgroup of its own where the node allows it:
//! its memory (no swap; a job the OOM killer hit ends OUT_OF_MEMORY), its CPUs' worth of CPU time
//! and, where the cpuset controller is there and enough CPUs are free, its own CPUs. Both
//! hierarchies are supported: cgroup v2 (most clusters today) and cgroup v1 (older
//! distributions, and this project's CI machines). Without either the agent says why, in its log
//! and in `quorum nodes`, and caps each job's data segment with `RLIMIT_DATA` instead.
//!
//! Where the agent knows the node's GPU device files, a job's cgroup also refuses it the other
//! jobs' GPUs ([`crate::devices`]): with v1 through the devices controller, with v2 through an
//! eBPF device filter.
//!
//! Layout under the agent's own cgroup `B` (per controller with v1): jobs live in
//! `B/quorum-<scope>/job<id>.<token>`, where the scope is the node's name and a digest of the
//! agent's spool ([`scope`]): stable across the agent's restarts, and apart for two clusters whose
//! agents share a host and node names (test clusters side by side). Jobs an older agent started
//! under `B/quorum-<node>` are still found there. With v2, a cgroup with processes cannot hand controllers to
//! its children, so the agent first moves itself to `B/quorum-agent`; under systemd that needs
//! `Delegate=yes`. With v1 there is no such rule.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;

use quorum_proto::CGROUPS_OFF;

use crate::devices::Device;

/// The name of an agent's directory for its jobs in each hierarchy: its node's name and a digest
/// of its spool directory (FNV-1a, so that it never changes between releases).
pub fn scope(node: &str, spool: &Path) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in spool.as_os_str().as_encoded_bytes() {
        hash = (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{node}-{:08x}", hash as u32)
}

/// Where an older agent (before [`scope`]) kept job `name`'s cgroup, given where this one keeps
/// it: the same, under `quorum-<node>`.
fn legacy_dir(dir: &Path) -> Option<PathBuf> {
    let root = dir.parent()?;
    let root_name = root.file_name()?.to_str()?;
    let (node_part, digest) = root_name.rsplit_once('-')?;
    if digest.len() != 8 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some(root.parent()?.join(node_part).join(dir.file_name()?))
}

/// How this agent limits its jobs.
#[derive(Clone, Debug)]
pub enum Limits {
    Cgroup(Cgroups),
    /// No usable cgroup hierarchy; the reason.
    Rlimits(String),
}

/// The agent's job cgroups.
#[derive(Clone, Debug)]
pub enum Cgroups {
    /// One directory per job holding every controller; `devices` when the kernel takes an eBPF
    /// device filter.
    V2 { root: PathBuf, cpuset: bool, devices: bool },
    /// One directory per job and controller; `cpu`, `cpuset` and `devices` where mounted and
    /// writable. `balanced`: the top cpuset balances load across every CPU, so a job's cpuset
    /// need not ask for it (see [`Cgroups::create`]).
    V1 { memory: PathBuf, cpu: Option<PathBuf>, cpuset: Option<PathBuf>, devices: Option<PathBuf>, balanced: bool },
}

/// One job's cgroup: a directory with v2, one per controller with v1 (memory first).
#[derive(Clone, Debug)]
pub struct JobCgroup {
    pub dirs: Vec<PathBuf>,
    pub v2: bool,
}

fn read(path: &Path) -> io::Result<String> {
    std::fs::read_to_string(path)
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("writing '{value}' to {}: {e}", path.display())))
}

/// This process's cgroup path in the hierarchy that `matches` names ("" for v2's `0::`), from
/// /proc/self/cgroup.
fn own_cgroup(matches: impl Fn(&str, &str) -> bool) -> Option<String> {
    read(Path::new("/proc/self/cgroup")).ok()?.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        matches(id, controllers).then(|| path.to_string())
    })
}

fn fs_magic(path: &Path) -> Option<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs fills the struct it is given; the path is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as i64)
}

fn words(path: &Path) -> BTreeSet<String> {
    read(path).map(|s| s.split_whitespace().map(str::to_string).collect()).unwrap_or_default()
}

impl Limits {
    /// Finds out whether jobs can get cgroups on this node, setting up the agent's part of the
    /// hierarchy if they can. `use_cgroups` false goes straight to rlimits.
    pub fn detect(node: &str, use_cgroups: bool) -> Limits {
        if !use_cgroups {
            return Limits::Rlimits(CGROUPS_OFF.into());
        }
        match Cgroups::setup(node) {
            Ok(c) => Limits::Cgroup(c),
            Err(why) => Limits::Rlimits(why),
        }
    }

    /// One line for the log and for `quorum nodes`.
    pub fn describe(&self) -> String {
        match self {
            Limits::Cgroup(Cgroups::V2 { cpuset, devices, .. }) => format!(
                "cgroup v2 (memory, cpu{}{})",
                if *cpuset { ", cpuset" } else { "" },
                if *devices { ", devices" } else { "" }
            ),
            Limits::Cgroup(Cgroups::V1 { cpu, cpuset, devices, .. }) => format!(
                "cgroup v1 (memory{}{}{})",
                if cpu.is_some() { ", cpu" } else { "" },
                if cpuset.is_some() { ", cpuset" } else { "" },
                if devices.is_some() { ", devices" } else { "" }
            ),
            Limits::Rlimits(why) => format!("rlimits only: {why}"),
        }
    }

    pub fn cgroups(&self) -> Option<&Cgroups> {
        match self {
            Limits::Cgroup(c) => Some(c),
            Limits::Rlimits(_) => None,
        }
    }
}

impl Cgroups {
    fn setup(node: &str) -> Result<Cgroups, String> {
        let mount = Path::new(CGROUP_ROOT);
        if fs_magic(mount) == Some(CGROUP2_SUPER_MAGIC) {
            return Cgroups::setup_v2(mount, node);
        }
        let memory = mount.join("memory");
        if fs_magic(&memory) == Some(CGROUP_SUPER_MAGIC) {
            return Cgroups::setup_v1(mount, node);
        }
        Err(format!(
            "neither a cgroup v2 hierarchy at {CGROUP_ROOT} nor a cgroup v1 memory controller at {}",
            memory.display()
        ))
    }

    fn setup_v2(mount: &Path, node: &str) -> Result<Cgroups, String> {
        let own = own_cgroup(|id, _| id == "0").ok_or("this process is in no cgroup v2")?;
        let own = mount.join(own.trim_start_matches('/'));
        // Already in its leaf (a second agent in this process)?
        let (base, in_leaf) = match own.parent() {
            Some(parent) if own.file_name().is_some_and(|n| n == "quorum-agent") => (parent.to_path_buf(), true),
            _ => (own.clone(), false),
        };
        let available = words(&base.join("cgroup.controllers"));
        for needed in ["memory", "cpu"] {
            if !available.contains(needed) {
                return Err(format!(
                    "the {needed} controller is not available in {} (not delegated to the agent; under systemd, Delegate=yes)",
                    base.display()
                ));
            }
        }
        let cpuset = available.contains("cpuset");
        let wanted = if cpuset { "+memory +cpu +cpuset" } else { "+memory +cpu" };
        // A cgroup with processes cannot give controllers to its children: the agent moves to a
        // leaf of its own first (always: an agent restarted by systemd starts again in the
        // unit's cgroup, whose controllers the previous one already enabled).
        if !in_leaf {
            let leaf = base.join("quorum-agent");
            std::fs::create_dir_all(&leaf).map_err(|e| format!("cannot create {}: {e}", leaf.display()))?;
            write(&leaf.join("cgroup.procs"), &std::process::id().to_string()).map_err(|e| e.to_string())?;
        }
        let enabled = words(&base.join("cgroup.subtree_control"));
        if !enabled.contains("memory") || !enabled.contains("cpu") || (cpuset && !enabled.contains("cpuset")) {
            write(&base.join("cgroup.subtree_control"), wanted)
                .map_err(|e| format!("{e} (other processes share the agent's cgroup; under systemd, Delegate=yes)"))?;
        }
        let root = base.join(format!("quorum-{node}"));
        std::fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
        write(&root.join("cgroup.subtree_control"), wanted).map_err(|e| e.to_string())?;
        let devices = match crate::devices::v2_supported() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("jobs' GPUs are not isolated (CUDA_VISIBLE_DEVICES only): {e}");
                false
            }
        };
        Ok(Cgroups::V2 { root, cpuset, devices })
    }

    /// The agent's directory for jobs under its own cgroup of a v1 controller, made if missing.
    fn v1_root(mount: &Path, controller: &str, node: &str) -> Result<PathBuf, String> {
        let own = own_cgroup(|id, names| id != "0" && names.split(',').any(|n| n == controller))
            .ok_or_else(|| format!("this process is in no cgroup v1 {controller} hierarchy"))?;
        let root = mount.join(controller).join(own.trim_start_matches('/')).join(format!("quorum-{node}"));
        std::fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
        Ok(root)
    }

    fn setup_v1(mount: &Path, node: &str) -> Result<Cgroups, String> {
        let memory = Cgroups::v1_root(mount, "memory", node)?;
        // cpu and cpuset are optional: without them a job still gets its memory limit.
        let optional = |controller: &str| match Cgroups::v1_root(mount, controller, node) {
            Ok(root) => Some(root),
            Err(e) => {
                tracing::warn!(controller, "jobs get no {controller} cgroup: {e}");
                None
            }
        };
        let cpu = optional("cpu");
        let cpuset = optional("cpuset").and_then(|root| {
            // A v1 cpuset starts empty: it takes its parent's CPUs and memory nodes.
            let parent = root.parent()?;
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let value = read(&parent.join(file)).ok()?;
                if read(&root.join(file)).ok()?.trim().is_empty() {
                    write(&root.join(file), value.trim()).ok()?;
                }
            }
            Some(root)
        });
        let devices = optional("devices");
        let balanced = read(&mount.join("cpuset/cpuset.sched_load_balance")).is_ok_and(|v| v.trim() == "1");
        Ok(Cgroups::V1 { memory, cpu, cpuset, devices, balanced })
    }

    /// The cgroup of one allocation of a job (where an older agent put it, for a job it started).
    pub fn job(&self, job_id: u64, token: u64) -> JobCgroup {
        let job = self.job_here(job_id, token);
        if !job.dirs[0].exists() {
            let old: Option<Vec<PathBuf>> = job.dirs.iter().map(|d| legacy_dir(d)).collect();
            if let Some(dirs) = old.filter(|d| d[0].exists()) {
                return JobCgroup { dirs, v2: job.v2 };
            }
        }
        job
    }

    fn job_here(&self, job_id: u64, token: u64) -> JobCgroup {
        let name = job_name(job_id, token);
        match self {
            Cgroups::V2 { root, .. } => JobCgroup { dirs: vec![root.join(name)], v2: true },
            Cgroups::V1 { memory, cpu, cpuset, devices, .. } => JobCgroup {
                dirs: std::iter::once(memory).chain(cpu).chain(cpuset).chain(devices).map(|r| r.join(&name)).collect(),
                v2: false,
            },
        }
    }

    /// Makes the job's cgroup with its limits, refusing its processes the devices `deny` (the
    /// node's other GPUs); the job's first process joins it itself.
    pub fn create(&self, job_id: u64, token: u64, mem_mb: u64, cpus: u32, deny: &[Device]) -> io::Result<JobCgroup> {
        let job = self.job_here(job_id, token);
        for dir in &job.dirs {
            std::fs::create_dir_all(dir)?;
        }
        let bytes = (mem_mb * 1024 * 1024).to_string();
        let quota = (u64::from(cpus) * 100_000).to_string();
        match self {
            Cgroups::V2 { root, cpuset, devices } => {
                let dir = &job.dirs[0];
                if mem_mb > 0 {
                    write(&dir.join("memory.max"), &bytes)?;
                    // Swap would turn an OOM kill into a crawl; the group is killed together.
                    let _ = write(&dir.join("memory.swap.max"), "0");
                    let _ = write(&dir.join("memory.oom.group"), "1");
                }
                if cpus > 0 {
                    write(&dir.join("cpu.max"), &format!("{quota} 100000"))?;
                }
                if *cpuset && cpus > 0 {
                    if let Some(list) = free_cpus(root, "cpuset.cpus.effective", dir, cpus as usize) {
                        write(&dir.join("cpuset.cpus"), &list)?;
                    }
                }
                if *devices {
                    crate::devices::attach_v2(dir, deny)?;
                }
            }
            Cgroups::V1 { memory, cpu, cpuset, devices, balanced } => {
                let name = job_name(job_id, token);
                let dir = memory.join(&name);
                if mem_mb > 0 {
                    write(&dir.join("memory.limit_in_bytes"), &bytes)?;
                    // Present only with swap accounting; memory plus swap no more than memory.
                    let memsw = dir.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write(&memsw, &bytes)?;
                    }
                    let _ = write(&dir.join("memory.swappiness"), "0");
                }
                if let (Some(root), true) = (cpu, cpus > 0) {
                    let dir = root.join(&name);
                    // A new group's period is the kernel's default, 100 ms; each write of
                    // either file takes the scheduler's bandwidth locks.
                    if read(&dir.join("cpu.cfs_period_us")).ok().as_deref().map(str::trim) != Some("100000") {
                        write(&dir.join("cpu.cfs_period_us"), "100000")?;
                    }
                    write(&dir.join("cpu.cfs_quota_us"), &quota)?;
                }
                if let Some(root) = cpuset {
                    let dir = root.join(&name);
                    let all = read(&root.join("cpuset.cpus"))?;
                    let list = (cpus > 0)
                        .then(|| free_cpus(root, "cpuset.effective_cpus", &dir, cpus as usize))
                        .flatten()
                        .unwrap_or_else(|| all.trim().to_string());
                    if *balanced {
                        // A v1 cpuset that asks for load balancing makes the kernel rebuild
                        // every scheduling domain when its CPUs are set and again when it is
                        // removed, twice per job; where the top cpuset balances across all
                        // CPUs, the flags below it change nothing (the kernel's cpusets.rst,
                        // 1.7), so the job's cpuset does not ask.
                        let _ = write(&dir.join("cpuset.sched_load_balance"), "0");
                    }
                    write(&dir.join("cpuset.cpus"), &list)?;
                    write(&dir.join("cpuset.mems"), read(&root.join("cpuset.mems"))?.trim())?;
                }
                if let Some(root) = devices {
                    crate::devices::deny_v1(&root.join(&name), deny)?;
                }
            }
        }
        Ok(job)
    }
}

fn job_name(job_id: u64, token: u64) -> String {
    format!("job{job_id}.{token}")
}

/// `n` CPUs of `root` that no other job cgroup in it pins, as a cpuset list.
fn free_cpus(root: &Path, effective: &str, own: &Path, n: usize) -> Option<String> {
    let mut free = parse_cpu_list(&read(&root.join(effective)).ok()?);
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) && entry.path() != own {
            for cpu in parse_cpu_list(&read(&entry.path().join("cpuset.cpus")).unwrap_or_default()) {
                free.remove(&cpu);
            }
        }
    }
    (free.len() >= n).then(|| free.iter().take(n).map(u32::to_string).collect::<Vec<_>>().join(","))
}

impl JobCgroup {
    /// The `cgroup.procs` of each directory, which the job's first process writes itself to.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// The CPUs the job's cpuset gives it, where it has one (v2's `cpuset.cpus.effective`, v1's
    /// `cpuset.effective_cpus`, else `cpuset.cpus`).
    pub fn cpus(&self) -> Option<Vec<u32>> {
        ["cpuset.cpus.effective", "cpuset.effective_cpus", "cpuset.cpus"].iter().find_map(|file| {
            self.dirs
                .iter()
                .find_map(|d| read(&d.join(file)).ok())
                .and_then(|text| quorum_model::cpu_bind::parse_list(&text).filter(|cpus| !cpus.is_empty()))
        })
    }

    /// Freezes (or thaws) every process in the job's cgroup (v2's freezer).
    pub fn freeze(&self, frozen: bool) -> io::Result<()> {
        if !self.v2 {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "no cgroup v2 freezer"));
        }
        write(&self.dirs[0].join("cgroup.freeze"), if frozen { "1" } else { "0" })
    }

    /// Whether the OOM killer killed anything in the job's cgroup.
    pub fn oom_killed(&self) -> bool {
        let (file, key) = if self.v2 { ("memory.events", "oom_kill") } else { ("memory.oom_control", "oom_kill") };
        read(&self.dirs[0].join(file)).ok().is_some_and(|events| {
            events.lines().any(|l| {
                let mut it = l.split_whitespace();
                it.next() == Some(key) && it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) > 0
            })
        })
    }

    /// Kills whatever is left in the job's cgroup and removes it.
    pub async fn remove(&self) {
        if self.v2 {
            let _ = write(&self.dirs[0].join("cgroup.kill"), "1");
        }
        for dir in &self.dirs {
            for _ in 0..50 {
                if !self.v2 {
                    for pid in words(&dir.join("cgroup.procs")).iter().filter_map(|p| p.parse::<i32>().ok()) {
                        // SAFETY: kill(2) touches no memory; the pid is in the job's cgroup.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                }
            }
            if dir.exists() {
                tracing::warn!(cgroup = %dir.display(), "cannot remove a finished job's cgroup");
            }
        }
    }
}

/// `0-3,8,10-11` → the CPUs it names.
fn parse_cpu_list(text: &str) -> BTreeSet<u32> {
    let mut cpus = BTreeSet::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    cpus.extend(a..=b);
                }
            }
            None => {
                if let Ok(c) = part.parse() {
                    cpus.insert(c);
                }
            }
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n").into_iter().collect::<Vec<_>>(), [0, 1, 2, 3, 8, 10, 11]);
        assert!(parse_cpu_list("").is_empty());
    }

    #[test]
    fn oom_events_v1_and_v2() {
        let dir = tempfile::tempdir().unwrap();
        let v2 = JobCgroup { dirs: vec![dir.path().to_path_buf()], v2: true };
        std::fs::write(dir.path().join("memory.events"), "low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n").unwrap();
        assert!(!v2.oom_killed());
        std::fs::write(dir.path().join("memory.events"), "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n").unwrap();
        assert!(v2.oom_killed());
        let v1 = JobCgroup { dirs: vec![dir.path().to_path_buf()], v2: false };
        std::fs::write(dir.path().join("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n").unwrap();
        assert!(!v1.oom_killed());
        std::fs::write(dir.path().join("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").unwrap();
        assert!(v1.oom_killed());
    }

    #[test]
    fn two_clusters_agents_of_one_node_name_keep_their_jobs_apart_and_old_jobs_are_found() {
        let a = scope("node01", Path::new("/tmp/quorum-dev-a/agent-node01"));
        let b = scope("node01", Path::new("/tmp/quorum-dev-b/agent-node01"));
        assert_ne!(a, b);
        assert_eq!(a, scope("node01", Path::new("/tmp/quorum-dev-a/agent-node01")), "stable across restarts");
        assert!(a.starts_with("node01-") && a.len() == "node01-".len() + 8, "{a}");
        // A job an older agent started, under quorum-<node>, is found there.
        let tmp = tempfile::tempdir().unwrap();
        let scoped = format!("quorum-{}", scope("gpu-7", Path::new("/var/spool/quorum")));
        let cg = Cgroups::V2 { root: tmp.path().join(&scoped), cpuset: false, devices: false };
        std::fs::create_dir_all(tmp.path().join("quorum-gpu-7/job5.9")).unwrap();
        assert_eq!(cg.job(5, 9).dirs, [tmp.path().join("quorum-gpu-7/job5.9")]);
        assert_eq!(cg.job(6, 1).dirs, [tmp.path().join(&scoped).join("job6.1")], "a new job under the scope");
        std::fs::create_dir_all(tmp.path().join(&scoped).join("job5.9")).unwrap();
        assert_eq!(cg.job(5, 9).dirs, [tmp.path().join(&scoped).join("job5.9")], "this agent's own first");
    }

    #[test]
    fn without_cgroups_the_reason_is_given() {
        let l = Limits::detect("n1", false);
        assert_eq!(l.describe(), "rlimits only: cgroups are off for this agent");
    }

    /// Where this process may make cgroups (root on a v1 or v2 machine), a job cgroup gets its
    /// memory limit and goes away again.
    #[tokio::test]
    async fn a_job_cgroup_is_made_with_its_limit_and_removed() {
        let node = format!("unit{}", std::process::id());
        let Limits::Cgroup(cg) = Limits::detect(&node, true) else {
            eprintln!("skipped: no cgroups here ({})", Limits::detect(&node, true).describe());
            return;
        };
        let job = cg.create(7, 3, 64, 1, &[]).unwrap();
        let limit = match &cg {
            Cgroups::V2 { .. } => read(&job.dirs[0].join("memory.max")).unwrap(),
            Cgroups::V1 { .. } => read(&job.dirs[0].join("memory.limit_in_bytes")).unwrap(),
        };
        assert_eq!(limit.trim(), (64u64 << 20).to_string());
        if let Cgroups::V1 { cpu: Some(cpu), cpuset: Some(cpuset), balanced, .. } = &cg {
            let name = job_name(7, 3);
            // One CPU's bandwidth, and one CPU of its own.
            assert_eq!(read(&cpu.join(&name).join("cpu.cfs_period_us")).unwrap().trim(), "100000");
            assert_eq!(read(&cpu.join(&name).join("cpu.cfs_quota_us")).unwrap().trim(), "100000");
            assert_eq!(job.cpus().map(|c| c.len()), Some(1));
            let flag = read(&cpuset.join(&name).join("cpuset.sched_load_balance")).unwrap();
            assert_eq!(flag.trim(), if *balanced { "0" } else { "1" });
        }
        assert!(!job.oom_killed());
        job.remove().await;
        assert!(job.dirs.iter().all(|d| !d.exists()));
        for d in &job.dirs {
            let _ = std::fs::remove_dir(d.parent().unwrap());
        }
    }
}
