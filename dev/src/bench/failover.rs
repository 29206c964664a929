//! `quorum bench failover`: kill -9 of the leader under load, run after run: time to the next
//! acknowledged write.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::harness::{controller_bin, held_job, progress, progress_done, spread, submit_one, BenchAgent, Replicas};

#[derive(serde::Serialize)]
pub(super) struct FailoverRun {
    pub(super) killed: u64,
    pub(super) new_leader: u64,
    /// Kill to the first acknowledged submit sent after the kill.
    pub(super) next_write_ms: f64,
    /// Kill to the new leader being known to a replica.
    pub(super) leader_known_ms: f64,
}

pub(super) async fn failover(runs: usize, clients: usize, bin: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0 && clients > 0, "--runs and --clients must be above 0");
    let mut replicas = Replicas::start(controller_bin(bin)?, "bench1", true)?;
    let c = replicas.client()?;
    let agent = BenchAgent::start(&replicas)?;

    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let work = replicas.dir.path().to_path_buf();
    let run_id = uuid::Uuid::new_v4();
    let mut tasks = Vec::new();
    for k in 0..clients {
        let (stop, acked) = (stop.clone(), acked.clone());
        let c = replicas.client()?;
        let spec = held_job(&work);
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let sent = Instant::now();
                if submit_one(&c, &spec, format!("failover-{run_id}-{k}-{n}")).await.is_ok() {
                    acked.lock().unwrap_or_else(|p| p.into_inner()).push((sent, Instant::now()));
                } else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }));
    }

    let mut results = Vec::new();
    for run in 0..runs {
        // Steady: every replica answers, one leads, and submits flow.
        let steady = Instant::now();
        let leader = loop {
            let s = quorum_client::display::replica_statuses(&c).await.unwrap_or_default();
            let leader = s.iter().find(|s| s.role == "leader").map(|s| s.id);
            if let Some(leader) = leader.filter(|_| s.len() == 3 && s.iter().all(|r| r.reachable)) {
                if steady.elapsed() > Duration::from_secs(2) {
                    break leader;
                }
            }
            anyhow::ensure!(steady.elapsed() < Duration::from_secs(60), "the cluster did not settle within 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let i = (leader - 1) as usize;
        let killed_at = Instant::now();
        if let Some(mut child) = replicas.children[i].take() {
            child.kill()?;
            child.wait()?;
        }
        let mut leader_known = None;
        let mut new_leader = 0;
        let next_write = loop {
            if leader_known.is_none() {
                let s = quorum_client::display::replica_statuses(&c).await.unwrap_or_default();
                if let Some(l) = s.iter().find(|s| s.role == "leader" && s.id != leader) {
                    leader_known = Some(killed_at.elapsed());
                    new_leader = l.id;
                }
            }
            let first = acked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(sent, _)| *sent >= killed_at)
                .map(|(_, a)| *a)
                .min();
            if let Some(at) = first {
                break at - killed_at;
            }
            anyhow::ensure!(
                killed_at.elapsed() < Duration::from_secs(30),
                "no submit acknowledged within 30 s of the kill"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let r = FailoverRun {
            killed: leader,
            new_leader,
            next_write_ms: next_write.as_secs_f64() * 1000.0,
            leader_known_ms: leader_known.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0),
        };
        progress(&format!(
            "failover: run {}/{runs}: killed {} -> next write {:.0} ms",
            run + 1,
            r.killed,
            r.next_write_ms
        ));
        results.push(r);
        replicas.children[i] = Some(replicas.spawn(i)?);
    }
    progress_done();
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        let _ = t.await;
    }
    agent.stop().await;

    let mut times: Vec<Duration> = results.iter().map(|r| Duration::from_secs_f64(r.next_write_ms / 1000.0)).collect();
    let s = spread(&mut times);
    let over = results.iter().filter(|r| r.next_write_ms >= 1000.0).count();
    if json {
        println!(
            "{}",
            serde_json::json!({ "bench": "failover", "clients": clients, "runs": results, "next_write": s, "over_1s": over })
        );
    } else {
        println!("failover: leader killed with SIGKILL under {clients} submitting clients, {runs} runs");
        println!("  RUN  KILLED  NEW  LEADER_KNOWN  NEXT_WRITE");
        for (n, r) in results.iter().enumerate() {
            println!(
                "  {:<4} {:<7} {:<4} {:>9.0} ms  {:>7.0} ms",
                n + 1,
                r.killed,
                r.new_leader,
                r.leader_known_ms,
                r.next_write_ms
            );
        }
        println!(
            "  next write: min {:.0} ms, median {:.0} ms, p99 {:.0} ms, max {:.0} ms; {over} of {runs} at 1 s or more",
            s.min_ms, s.p50_ms, s.p99_ms, s.max_ms
        );
    }
    Ok(())
}
