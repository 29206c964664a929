//! `seff JOBID`: how well a job used what it was given, as the `seff` that sites install beside
//! Slurm prints it: its CPU time against its cores times its wall-clock time, and its largest
//! resident set against the memory it was given. For an ended job, what its supervisors measured
//! at its end (`sacct`'s TotalCPU and MaxRSS); for a running one, what its agents read now
//! (`sstat`), with a warning that it may mislead.

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_proto::api::{self, JobInfo};

use crate::commands::Context;
use crate::sacct::hms;

#[derive(Parser, Debug)]
#[command(
    name = "seff",
    no_binary_name = true,
    infer_long_args = true,
    about = "How efficiently a job used its CPUs and memory (Quorum's seff)"
)]
pub struct SeffArgs {
    #[command(flatten)]
    controllers: ControllersArg,
    /// The job: 12, or an array's task, 12_3.
    job: String,
}

/// Memory as seff writes it, from KiB: `0.00 MB`, `512.00 KB`, `1.50 GB`.
fn memory(kib: u64) -> String {
    if kib == 0 {
        return "0.00 MB".into();
    }
    let mut value = kib as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < 5 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}B", ["K", "M", "G", "T", "P", "E"][unit])
}

fn percent(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part * 100.0 / whole
    } else {
        0.0
    }
}

/// The report. `usage` is what the job used (CPU in microseconds, the largest resident set in
/// KiB), `group` its user's group, `now_ms` the time a running job is measured to.
fn report(job: &JobInfo, usage: Option<&api::JobUsage>, group: &str, now_ms: u64) -> String {
    let mut out = format!("Job ID: {}\n", job.id);
    if let Some(a) = &job.array {
        out += &format!("Array Job ID: {}_{}\n", a.array_job_id, a.task_id);
    }
    out += "Cluster: quorum\n";
    out += &format!("User/Group: {}/{group}\n", job.user);
    if job.state == "PENDING" {
        out += "State: PENDING\nEfficiency not available for jobs in the PENDING state.\n";
        return out;
    }
    match job.has_exit_code {
        true => out += &format!("State: {} (exit code {})\n", job.state, job.exit_code),
        false => out += &format!("State: {}\n", job.state),
    }
    let nodes = job.allocation.len().max(1) as u64;
    let cores: u64 = job.allocation.iter().map(|a| u64::from(a.cpus)).sum();
    if cores <= 1 {
        out += &format!("Cores: {}\n", cores.max(1));
    } else {
        out += &format!("Nodes: {nodes}\nCores per node: {}\n", cores / nodes);
    }
    let elapsed_s = match (job.start_time_ms, job.end_time_ms) {
        (0, _) => 0,
        (s, 0) => now_ms.saturating_sub(s) / 1000,
        (s, e) => e.saturating_sub(s) / 1000,
    };
    let cpu_us = usage.map_or(0, |u| u.cpu_user_us + u.cpu_system_us);
    let core_walltime = elapsed_s * cores.max(1);
    out += &format!("CPU Utilized: {}\n", hms(cpu_us / 1_000_000));
    out += &format!(
        "CPU Efficiency: {:.2}% of {} core-walltime\n",
        percent(cpu_us as f64 / 1e6, core_walltime as f64),
        hms(core_walltime)
    );
    out += &format!("Job Wall-clock time: {}\n", hms(elapsed_s));
    let rss_kib = usage.map_or(0, |u| u.max_rss_kb);
    out += &format!("Memory Utilized: {}\n", memory(rss_kib));
    let per_node_kib = job.allocation.first().map_or(0, |a| a.mem_mb) * 1024;
    let given_kib = job.allocation.iter().map(|a| a.mem_mb * 1024).sum::<u64>();
    out += &format!(
        "Memory Efficiency: {:.2}% of {} ({}/node)\n",
        percent(rss_kib as f64, given_kib as f64),
        memory(given_kib),
        memory(per_node_kib)
    );
    // A job with GPUs: how busy they were, as their agents sampled them (Quorum's line).
    if let Some(util) = usage.and_then(crate::sacct::gpu_util) {
        out += &format!(
            "GPU Utilization: {util} of {} GPUs\n",
            job.allocation.iter().map(|a| a.gpus.len()).sum::<usize>()
        );
    }
    if job.state == "RUNNING" {
        out += "WARNING: Efficiency statistics may be misleading for RUNNING jobs.\n";
    }
    out
}

/// The group the job ran with, by name: the one it was given (`--gid`), else its user's (the
/// name it was given, or the user's, when this host does not know the group).
fn group_of(job: &JobInfo) -> String {
    let given = job.spec.as_ref().map_or("", |s| s.group.as_str());
    quorum_client::display::job_group(&job.user, given)
        .map_or_else(|| if given.is_empty() { job.user.clone() } else { given.to_string() }, |g| g.name)
}

pub async fn run(a: SeffArgs) -> anyhow::Result<u8> {
    let bad = || anyhow::anyhow!("invalid job '{}': give a job id such as 12, or an array task such as 12_3", a.job);
    let (id, task) = match a.job.trim().split_once('_') {
        Some((id, task)) => (id.parse::<u64>().map_err(|_| bad())?, Some(task.parse::<u32>().map_err(|_| bad())?)),
        None => (a.job.trim().parse::<u64>().map_err(|_| bad())?, None),
    };
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let req = api::GetJobRequest { job_id: id, array_task_id: task, stale: false };
    let job = ctx.send(req, |mut c, r| async move { c.get_job(r).await }).await?.job.ok_or_else(bad)?;
    let usage = match job.state.as_str() {
        // Measured now, on each of its nodes, summed (the largest resident set of any one).
        // (Nothing yet in the moment between its start and its agent launching it.)
        "RUNNING" => {
            let req = api::JobUsageRequest { job_id: job.id };
            let answer = ctx.client.call(|mut c| async move { c.job_usage(req).await }).await;
            // Another user's job is refused, as sstat refuses it: never a report of zeros.
            if let Err(e) = &answer {
                if e.code() == tonic::Code::PermissionDenied {
                    anyhow::bail!("{}", e.message());
                }
            }
            answer.ok().map(|answer| {
                let mut sum = api::JobUsage::default();
                for u in answer.nodes.iter().filter_map(|n| n.usage.as_ref()) {
                    sum.cpu_user_us += u.cpu_user_us;
                    sum.cpu_system_us += u.cpu_system_us;
                    sum.max_rss_kb = sum.max_rss_kb.max(u.max_rss_kb);
                }
                sum
            })
        }
        _ => job.usage,
    };
    let now_ms = crate::format::now_ms();
    print!("{}", report(&job, usage.as_ref(), &group_of(&job), now_ms));
    Ok(0)
}

pub fn main(args: &[String]) -> std::process::ExitCode {
    crate::entry::main_of::<SeffArgs, _, _>("seff", crate::entry::Threads::One, args, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_reads_as_seff_prints_it() {
        let alloc =
            |node: &str| api::NodeAllocation { node: node.into(), cpus: 4, mem_mb: 2048, gpus: vec![], het_group: 0 };
        let job = JobInfo {
            id: 12,
            user: "ada".into(),
            state: "COMPLETED".into(),
            has_exit_code: true,
            start_time_ms: 1_000_000,
            end_time_ms: 1_000_000 + 100_000,
            allocation: vec![alloc("n1"), alloc("n2")],
            ..Default::default()
        };
        // 8 cores for 100 s; 400 s of CPU; 1 GiB of the 4 GiB given.
        let usage = api::JobUsage {
            cpu_user_us: 300_000_000,
            cpu_system_us: 100_000_000,
            max_rss_kb: 1 << 20,
            ..Default::default()
        };
        assert_eq!(
            report(&job, Some(&usage), "staff", 0),
            "Job ID: 12\nCluster: quorum\nUser/Group: ada/staff\nState: COMPLETED (exit code 0)\nNodes: 2\n\
             Cores per node: 4\nCPU Utilized: 00:06:40\nCPU Efficiency: 50.00% of 00:13:20 core-walltime\n\
             Job Wall-clock time: 00:01:40\nMemory Utilized: 1.00 GB\nMemory Efficiency: 25.00% of 4.00 GB \
             (2.00 GB/node)\n"
        );
        let one = JobInfo { allocation: vec![api::NodeAllocation { cpus: 1, ..alloc("n1") }], ..job.clone() };
        assert!(report(&one, None, "staff", 0).contains("\nCores: 1\nCPU Utilized: 00:00:00\nCPU Efficiency: 0.00% of"));
        let pending = JobInfo { state: "PENDING".into(), allocation: vec![], ..job };
        assert!(
            report(&pending, None, "staff", 0).ends_with("Efficiency not available for jobs in the PENDING state.\n")
        );
        assert_eq!(memory(0), "0.00 MB");
        assert_eq!(memory(512), "512.00 KB");
        assert_eq!(memory(1536), "1.50 MB");
    }
}
