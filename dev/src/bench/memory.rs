//! `quorum bench memory`: the resident memory of each replica — three `quorum-controller`
//! processes, as in production — before and after it holds N pending jobs. The jobs are held
//! (so nothing schedules them) and submitted one by one from concurrent clients, each job with
//! the environment its client's shell would send; or, with `--arrays`, as job arrays of up to
//! 100,000 tasks (each task a job of its own in the replicated state, all sharing one spec).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quorum_control::model::array::MAX_ARRAY_TASKS;

use super::harness::{controller_bin, held_job, progress, progress_done, submit_one, BenchAgent, JobShape, Replicas};

/// The jobs to hold and how they arrive.
pub struct Load {
    pub jobs: usize,
    pub shape: JobShape,
    pub arrays: bool,
    pub clients: usize,
}

/// `VmRSS` and `VmHWM` (peak) of a process, in KiB.
fn memory_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| anyhow::anyhow!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

#[derive(serde::Serialize)]
struct ReplicaMemory {
    id: usize,
    rss_before_mib: f64,
    rss_after_mib: f64,
    peak_mib: f64,
    bytes_per_job: f64,
}

pub async fn run(load: Load, bin: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    let jobs = load.jobs;
    anyhow::ensure!(jobs > 0 && load.clients > 0, "--jobs and --clients must be above 0");
    let replicas = Replicas::start(controller_bin(bin)?, "bench1", true)?;
    let c = replicas.client()?;
    let agent = BenchAgent::start(&replicas)?;
    let pids: Vec<u32> = replicas.children.iter().flatten().map(|c| c.id()).collect();
    let work = replicas.dir.path().to_path_buf();

    // The first submit waits for a leader and the agent's node.
    let started = Instant::now();
    let mut first = held_job(&work);
    first.name = "warmup".into();
    loop {
        match submit_one(&c, &first, "memory-warmup".into()).await {
            Ok(_) => break,
            Err(e) if started.elapsed() > Duration::from_secs(60) => {
                anyhow::bail!("the cluster did not accept a job: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let before: Vec<u64> = pids.iter().map(|&p| memory_kib(p).map(|m| m.0)).collect::<anyhow::Result<_>>()?;

    let start = Instant::now();
    let mut arrays = 0;
    if load.arrays {
        let mut submitted = 0usize;
        while submitted < jobs {
            let tasks = (jobs - submitted).min(MAX_ARRAY_TASKS);
            let mut spec = load.shape.job(&work, 0, 0);
            spec.array = format!("0-{}", tasks - 1);
            arrays += 1;
            submit_one(&c, &spec, format!("memory-{arrays}"))
                .await
                .map_err(|e| anyhow::anyhow!("submit: {}", e.message()))?;
            submitted += tasks;
            progress(&format!("memory: {submitted}/{jobs} jobs submitted in {:.1} s", start.elapsed().as_secs_f64()));
        }
    } else {
        submit_one_by_one(&load, &replicas, &work, start).await?;
    }
    let submit_time = start.elapsed();
    // Every replica has applied everything the leader committed.
    loop {
        let s = quorum_client::display::replica_statuses(&c).await.unwrap_or_default();
        let top = s.iter().map(|r| r.applied_index).max().unwrap_or(0);
        if s.len() == 3 && s.iter().all(|r| r.reachable && r.applied_index == top) {
            break;
        }
        anyhow::ensure!(start.elapsed() < Duration::from_secs(600), "the replicas did not catch up within 10 min");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Let the leader's first cycles over the new queue and any snapshot settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    progress_done();
    let mut rows = Vec::new();
    for (i, &pid) in pids.iter().enumerate() {
        let (rss, peak) = memory_kib(pid)?;
        rows.push(ReplicaMemory {
            id: i + 1,
            rss_before_mib: before[i] as f64 / 1024.0,
            rss_after_mib: rss as f64 / 1024.0,
            peak_mib: peak as f64 / 1024.0,
            bytes_per_job: (rss.saturating_sub(before[i]) * 1024) as f64 / jobs as f64,
        });
    }
    agent.stop().await;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "memory", "jobs": jobs, "arrays": arrays, "clients": load.clients,
                "env_vars": load.shape.env_vars, "unique_env": load.shape.unique_env,
                "submit_s": submit_time.as_secs_f64(), "replicas": rows,
            })
        );
    } else {
        let how = match load.arrays {
            true => format!("in {arrays} arrays"),
            false => format!("one by one from {} clients", load.clients),
        };
        println!(
            "memory: {jobs} held jobs submitted {how} in {:.1} s; each replica a process",
            submit_time.as_secs_f64()
        );
        println!("  each job: {}", load.shape.describe());
        println!("  REPLICA  RSS_BEFORE  RSS_AFTER  PEAK      PER_JOB");
        for r in &rows {
            println!(
                "  {:<8} {:>7.0} MiB {:>6.0} MiB {:>6.0} MiB {:>6.0} B",
                r.id, r.rss_before_mib, r.rss_after_mib, r.peak_mib, r.bytes_per_job
            );
        }
    }
    Ok(())
}

/// Submits `load.jobs` held jobs from `load.clients` concurrent clients, each job on its own.
async fn submit_one_by_one(
    load: &Load,
    replicas: &Replicas,
    work: &std::path::Path,
    start: Instant,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for k in 0..load.clients {
        let c = replicas.client()?;
        let (next, jobs, jobs_of_client) = (next.clone(), load.jobs, load.shape.for_client(work, k));
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return Ok::<(), anyhow::Error>(());
                }
                submit_one(&c, &jobs_of_client.job(i), format!("memory-{i}"))
                    .await
                    .map_err(|e| anyhow::anyhow!("submit {i}: {}", e.message()))?;
                if i % 10_000 == 0 {
                    progress(&format!("memory: {i}/{jobs} jobs submitted in {:.1} s", start.elapsed().as_secs_f64()));
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}
