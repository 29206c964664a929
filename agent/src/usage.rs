//! What a running job's processes on this node use now (`sstat`): read from `/proc` for every
//! process of the job's process group. CPU time and the largest resident set one reached
//! (`VmHWM`) are per process, so a process that already ended counts only through the one that
//! waited for it (the job's end report, from `wait4`, has them all); a process that left the
//! group (`setsid`) is not seen.

use quorum_proto::agent::{ReadUsage, UsageSample};
use quorum_proto::api::JobUsage;

use crate::agent::Agent;

/// What the processes of `pgid` use now: (usage, resident KiB together, processes).
fn group_usage(pgid: i32) -> (JobUsage, u64, u32) {
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
        if fields.get(2).and_then(|g| g.parse::<i32>().ok()) != Some(pgid) {
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
    let pgid = agent.lock_jobs().get(&r.job_id).filter(|e| e.exit.is_none()).and_then(|e| e.pgid);
    let Some(pgid) = pgid else {
        return UsageSample {
            request_id: r.request_id,
            error: format!("job {} is not running on this node", r.job_id),
            ..Default::default()
        };
    };
    let (usage, rss_kb, processes) = group_usage(pgid);
    UsageSample { request_id: r.request_id, usage: Some(usage), rss_kb, processes, error: String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_group_s_cpu_and_memory_are_read_from_proc() {
        // This test's own process group: the test binary, at least, which has used CPU and memory.
        // SAFETY: getpgrp only reads this process's group.
        let pgid = unsafe { libc::getpgrp() };
        let (usage, rss_kb, processes) = group_usage(pgid);
        assert!(processes >= 1);
        assert!(rss_kb > 0 && usage.max_rss_kb >= rss_kb / u64::from(processes));
        assert!(usage.cpu_user_us + usage.cpu_system_us > 0);
        assert_eq!(group_usage(i32::MAX), (JobUsage::default(), 0, 0), "no such group");
    }
}
