//! What a running job's processes on this node use now (`sstat`): read from `/proc` for every
//! process of the job's cgroup where it has one (its `srun` steps' and any that left its process
//! group with `setsid` too), else of its process group. CPU time and the largest resident set
//! one reached (`VmHWM`) are per process, so a process that already ended counts only through
//! the one that waited for it (the job's end report, from its supervisor, has them all).

use quorum_proto::agent::{ReadUsage, UsageSample};
use quorum_proto::api::JobUsage;

use crate::agent::Agent;

/// Whose usage a sample sums.
#[derive(Debug)]
enum Members {
    /// The processes listed in a cgroup's `cgroup.procs`.
    Listed(std::collections::BTreeSet<i32>),
    /// The processes of a process group.
    Group(i32),
}

/// What the processes of `members` use now: (usage, resident KiB together, processes).
fn group_usage(members: &Members) -> (JobUsage, u64, u32) {
    // SAFETY: sysconf only reads a system constant.
    let (tick, page_kb) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE) / 1024) };
    let us_per_tick = 1_000_000 / u64::try_from(tick).unwrap_or(100).max(1);
    let page_kb = u64::try_from(page_kb).unwrap_or(4);
    let (mut usage, mut rss_kb, mut processes) = (JobUsage::default(), 0u64, 0u32);
    let Ok(dir) = std::fs::read_dir("/proc") else { return (usage, 0, 0) };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // After the command's closing parenthesis: state, ppid, pgrp, ... utime (14th field of
        // the line), stime (15th), ... rss (24th), counted from the state as the 3rd.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let member = match members {
            Members::Listed(pids) => i32::try_from(pid).is_ok_and(|pid| pids.contains(&pid)),
            Members::Group(pgid) => fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(*pgid),
        };
        if !member {
            continue;
        }
        processes += 1;
        usage.cpu_user_us += field(14) * us_per_tick;
        usage.cpu_system_us += field(15) * us_per_tick;
        rss_kb += field(24) * page_kb;
        let hwm = std::fs::read_to_string(format!("/proc/{pid}/status")).ok().and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
        });
        usage.max_rss_kb = usage.max_rss_kb.max(hwm.unwrap_or(0));
    }
    (usage, rss_kb, processes)
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
        let pids: std::collections::BTreeSet<i32> =
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
    }
}
