//! What a running job's processes on this node use now (`sstat`): read from `/proc` for every
//! process of the job's cgroup where it has one (its `srun` steps' and any that left its process
//! group with `setsid` too), else of its process group. CPU time and the largest resident set
//! one reached (`VmHWM`) are per process, so a process that already ended counts only through
//! the one that waited for it (the job's end report, from its supervisor, has them all).
//!
//! The most a job's (or a step task's) processes held together is sampled here too, at every
//! heartbeat ([`sample_memory`]): the kernel's count (`ru_maxrss`) is the largest one process
//! reached, less than what a script's processes held at once.

use std::collections::{BTreeMap, BTreeSet};

use quorum_proto::agent::{ReadUsage, UsageSample};
use quorum_proto::api::JobUsage;

use crate::agent::Agent;

/// Whose usage a sample sums.
#[derive(Debug)]
enum Members {
    /// The processes listed in a cgroup's `cgroup.procs`.
    Listed(BTreeSet<i32>),
    /// The processes of a process group.
    Group(i32),
}

/// Calls `each` with every process's pid and the fields of `/proc/<pid>/stat` after its
/// command (`fields[0]` is the state, the line's third field).
fn scan_proc(mut each: impl FnMut(u32, &[&str])) {
    let Ok(dir) = std::fs::read_dir("/proc") else { return };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // After the command's closing parenthesis: state, ppid, pgrp, ...
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        each(pid, &fields);
    }
}

/// The line's `n`th field of `/proc/<pid>/stat` (counted from 1, as `proc(5)` does) as a number.
fn stat_field(fields: &[&str], n: usize) -> u64 {
    fields.get(n - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// The process group a `/proc/<pid>/stat` line names.
fn stat_group(fields: &[&str]) -> Option<i32> {
    fields.get(2).and_then(|g| g.parse::<i32>().ok())
}

fn page_kb() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) } / 1024).unwrap_or(4)
}

/// What the processes of `members` use now: (usage, resident KiB together, processes).
fn group_usage(members: &Members) -> (JobUsage, u64, u32) {
    // SAFETY: sysconf only reads a system constant.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let us_per_tick = 1_000_000 / u64::try_from(tick).unwrap_or(100).max(1);
    let page_kb = page_kb();
    let (mut usage, mut rss_kb, mut processes) = (JobUsage::default(), 0u64, 0u32);
    scan_proc(|pid, fields| {
        let member = match members {
            Members::Listed(pids) => i32::try_from(pid).is_ok_and(|pid| pids.contains(&pid)),
            Members::Group(pgid) => stat_group(fields) == Some(*pgid),
        };
        if !member {
            return;
        }
        processes += 1;
        usage.cpu_user_us += stat_field(fields, 14) * us_per_tick;
        usage.cpu_system_us += stat_field(fields, 15) * us_per_tick;
        rss_kb += stat_field(fields, 24) * page_kb;
        let hwm = std::fs::read_to_string(format!("/proc/{pid}/status")).ok().and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
        });
        usage.max_rss_kb = usage.max_rss_kb.max(hwm.unwrap_or(0));
    });
    (usage, rss_kb, processes)
}

/// The resident memory (KiB) of each of these process groups' processes together, now: one
/// read of `/proc` for all of them. A group with no process left is absent.
fn groups_rss(groups: &BTreeSet<i32>) -> BTreeMap<i32, u64> {
    let page_kb = page_kb();
    let mut rss = BTreeMap::new();
    scan_proc(|_, fields| {
        if let Some(pgid) = stat_group(fields).filter(|g| groups.contains(g)) {
            *rss.entry(pgid).or_insert(0) += stat_field(fields, 24) * page_kb;
        }
    });
    rss
}

/// Samples the resident memory of every process group the agent tracks into its peak (one
/// read of `/proc`, off the runtime's threads): the groups whose peak rose.
pub(crate) async fn sample_memory(agent: &Agent) -> BTreeSet<i32> {
    let groups = agent.rss_tracked();
    if groups.is_empty() {
        return BTreeSet::new();
    }
    match tokio::task::spawn_blocking(move || groups_rss(&groups)).await {
        Ok(rss) => agent.raise_rss_peaks(rss),
        Err(_) => BTreeSet::new(),
    }
}

/// The answer to a `ReadUsage` for a job of this node.
pub fn sample(agent: &Agent, r: &ReadUsage) -> UsageSample {
    let running = agent.lock_jobs().get(&r.job_id).filter(|e| e.exit.is_none()).and_then(|e| Some((e.pgid?, e.token)));
    let Some((pgid, token)) = running else {
        return UsageSample {
            request_id: r.request_id,
            error: format!("job {} is not running on this node", r.job_id),
            ..Default::default()
        };
    };
    let listed = agent.limits().cgroups().and_then(|cg| {
        let procs = cg.job(r.job_id, token).procs_files().into_iter().next()?;
        let pids: BTreeSet<i32> =
            std::fs::read_to_string(procs).ok()?.lines().filter_map(|l| l.trim().parse().ok()).collect();
        (!pids.is_empty()).then_some(pids)
    });
    let members = listed.map_or(Members::Group(pgid), Members::Listed);
    let (usage, rss_kb, processes) = group_usage(&members);
    UsageSample { request_id: r.request_id, usage: Some(usage), rss_kb, processes, error: String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_group_s_cpu_and_memory_are_read_from_proc() {
        // This test's own process group: the test binary, at least, which has used CPU (a few
        // clock ticks of it first) and memory.
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(60) {
            std::hint::black_box(start.elapsed());
        }
        // SAFETY: getpgrp only reads this process's group.
        let pgid = unsafe { libc::getpgrp() };
        let (usage, rss_kb, processes) = group_usage(&Members::Group(pgid));
        assert!(processes >= 1);
        assert!(rss_kb > 0 && usage.max_rss_kb >= rss_kb / u64::from(processes));
        assert!(usage.cpu_user_us + usage.cpu_system_us > 0);
        assert_eq!(group_usage(&Members::Group(i32::MAX)), (JobUsage::default(), 0, 0), "no such group");
        // Listed by pid (as a cgroup lists them): this process alone.
        // SAFETY: getpid only reads this process's id.
        let me = unsafe { libc::getpid() };
        let (alone, _, processes) = group_usage(&Members::Listed([me].into()));
        assert_eq!(processes, 1);
        assert!(alone.cpu_user_us + alone.cpu_system_us > 0);
        assert_eq!(group_usage(&Members::Listed([i32::MAX].into())).2, 0, "no such process");
        // The group's memory together, as the peaks are sampled.
        let together = groups_rss(&[pgid, i32::MAX].into());
        assert!(together.get(&pgid).is_some_and(|kb| *kb >= rss_kb / 2), "{together:?}, {rss_kb} KiB");
        assert!(!together.contains_key(&i32::MAX), "no such group");
    }
}
