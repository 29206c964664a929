//! `quorum bench dispatch`: submit to job process running, one job at a time on an idle cluster.

use std::time::{Duration, Instant};

use quorum_proto::api;

use super::harness::{own_cluster, progress, progress_done, spread, submit_one};

pub(super) fn epoch_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

pub(super) async fn dispatch(jobs: usize, insecure: bool, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(jobs > 0, "--jobs must be above 0");
    let cluster = own_cluster(1, insecure).await?;
    let c = cluster.client()?;
    let dir = tempfile::tempdir()?;
    let path = std::env::var("PATH").unwrap_or_default();
    let mut latencies = Vec::new();
    for i in 0..jobs {
        let out = dir.path().join(format!("start-{i}"));
        let spec = api::JobSpec {
            name: "dispatch".into(),
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 1,
            argv: vec!["date".into(), "+%s%N".into()],
            stdout: out.display().to_string(),
            work_dir: dir.path().display().to_string(),
            submit_dir: dir.path().display().to_string(),
            env: vec![api::EnvVar { name: "PATH".into(), value: path.clone() }],
            ..Default::default()
        };
        let sent = epoch_ns();
        let id = submit_one(&c, &spec, uuid::Uuid::new_v4().to_string()).await?;
        let waited = Instant::now();
        let started_ns = loop {
            if let Some(ns) = std::fs::read_to_string(&out).ok().and_then(|t| t.trim().parse::<u128>().ok()) {
                break ns;
            }
            anyhow::ensure!(waited.elapsed() < Duration::from_secs(30), "job {id} did not start within 30 s");
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        latencies.push(Duration::from_nanos(started_ns.saturating_sub(sent) as u64));
        // Idle again before the next: the job has ended and its end is committed.
        loop {
            let j = c
                .call(|mut cl| async move {
                    cl.get_job(api::GetJobRequest { job_id: id, stale: false, array_task_id: None }).await
                })
                .await?;
            if j.job.is_some_and(|j| j.state != "RUNNING" && j.state != "PENDING") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        progress(&format!(
            "dispatch: {}/{jobs} jobs, last {:.1} ms",
            i + 1,
            latencies.last().map_or(0.0, |d| d.as_secs_f64() * 1e3)
        ));
    }
    progress_done();
    let s = spread(&mut latencies);
    if json {
        println!("{}", serde_json::json!({ "bench": "dispatch", "jobs": jobs, "latency": s }));
    } else {
        println!("dispatch: {jobs} jobs, one at a time on an idle cluster, submit sent -> job process running");
        println!("  p50  {:.1} ms", s.p50_ms);
        println!("  p99  {:.1} ms", s.p99_ms);
        println!("  min  {:.1} ms   max {:.1} ms", s.min_ms, s.max_ms);
    }
    cluster.shutdown().await;
    Ok(())
}
