//! `quorum bench submit`: many clients submitting held jobs; throughput and latency.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quorum_client::client::{Client, Security};

use super::harness::{own_cluster, progress, progress_done, spread, submit_one, JobShape};

pub(super) async fn submit(
    clients: usize,
    jobs: usize,
    shape: JobShape,
    external: Option<(Vec<String>, Security)>,
    insecure: bool,
    json: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(clients > 0 && jobs > 0, "--clients and --jobs must be above 0");
    let (own, addrs, security) = match external {
        Some((addrs, security)) => (None, addrs, security),
        None => {
            let cluster = own_cluster(1, insecure).await?;
            let (addrs, security) = (cluster.addrs.clone(), cluster.client_security());
            (Some(cluster), addrs, security)
        }
    };
    let dir = tempfile::tempdir()?;
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let run_id = uuid::Uuid::new_v4();
    // Each client first connects and learns the leader with one submit not counted, so that
    // connection set-up is not counted as submit latency; then all start together.
    let ready = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for k in 0..clients {
        let c = Client::new(addrs.clone(), security.clone())?;
        let (next, done, errors, ready) = (next.clone(), done.clone(), errors.clone(), ready.clone());
        let jobs_of_client = shape.for_client(dir.path(), k);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let warm = submit_one(&c, &jobs_of_client.job(jobs + k), format!("bench-{run_id}-warm-{k}")).await;
            if let Err(e) = warm {
                errors.lock().unwrap_or_else(|p| p.into_inner()).push(e.message().to_string());
            }
            ready.wait().await;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return latencies;
                }
                let spec = jobs_of_client.job(i);
                let sent = Instant::now();
                match submit_one(&c, &spec, format!("bench-{run_id}-{i}")).await {
                    Ok(_) => latencies.push(sent.elapsed()),
                    Err(e) => errors.lock().unwrap_or_else(|p| p.into_inner()).push(e.message().to_string()),
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    ready.wait().await;
    let started = Instant::now();
    let mut all = Vec::new();
    let reporter = {
        let done = done.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let n = done.load(Ordering::Relaxed);
                let secs = started.elapsed().as_secs_f64();
                progress(&format!("submit: {n}/{jobs} answered, {:.0}/s", n as f64 / secs));
            }
        })
    };
    for t in tasks {
        all.extend(t.await?);
    }
    reporter.abort();
    progress_done();
    let elapsed = started.elapsed();
    let errors = errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let acked = all.len();
    let s = spread(&mut all);
    let per_second = acked as f64 / elapsed.as_secs_f64();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "submit", "clients": clients, "jobs": jobs, "acknowledged": acked,
                "env_vars": shape.env_vars, "unique_env": shape.unique_env,
                "errors": errors.len(), "seconds": elapsed.as_secs_f64(), "per_second": per_second,
                "latency": s,
            })
        );
    } else {
        println!("submit: {clients} clients, {acked} of {jobs} submits acknowledged in {:.2} s", elapsed.as_secs_f64());
        println!("  each job     {}", shape.describe());
        println!("  throughput   {per_second:.0} jobs/s");
        println!("  latency p50  {:.1} ms", s.p50_ms);
        println!("          p99  {:.1} ms", s.p99_ms);
        println!("          max  {:.1} ms", s.max_ms);
        println!("  errors       {}", errors.len());
        if let Some(first) = errors.first() {
            println!("  first error  {first}");
        }
    }
    if let Some(c) = own {
        c.shutdown().await;
    }
    Ok(())
}
