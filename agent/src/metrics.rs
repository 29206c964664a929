//! The agent's own `/metrics` (`quorum-agent --metrics-listen`), in the OpenMetrics text format
//! for the node's Prometheus scraper: the jobs and step tasks it runs, what each job's processes
//! use now (CPU time and resident memory, from its cgroup where it has one), and each GPU's
//! health, utilization, memory and temperature from the last check.
//!
//! Plain HTTP, as node exporters are, and only to the addresses `--metrics-allow` names (this
//! host's loopback unless told otherwise). Loopback is every local user of the node, so what
//! each job uses (by job id) is shown only with `--metrics-jobs` ([`Exposure::per_job`]), where
//! the allowed addresses are the monitoring system's alone; without it, the node's totals.
//! Never who runs a job or what.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use quorum_model::Cidr;
use quorum_proto::telemetry::gauges::{labels, Gauges};

use crate::agent::Agent;

struct Scrape {
    agent: Arc<Agent>,
    per_job: bool,
}

/// Who may read an agent's `/metrics`, and what they see.
#[derive(Clone, Debug, Default)]
pub struct Exposure {
    /// The address ranges that may read it.
    pub allow: Vec<Cidr>,
    /// Each running job's CPU time, memory and processes by job id; otherwise only the node's
    /// totals.
    pub per_job: bool,
}

impl fmt::Debug for Scrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scrape(agent {})", self.agent.config.name)
    }
}

impl Scrape {
    fn gauges(&self) -> Vec<Gauges> {
        let agent = &self.agent;
        let mut jobs = Gauges::new("agent_jobs", "Jobs this agent runs (their batch step here)");
        let mut steps = Gauges::new("agent_step_tasks", "Step tasks (srun) this agent runs");
        let mut cpu = Gauges::new("agent_job_cpu_seconds", "CPU time of a running job's processes here so far");
        let mut rss = Gauges::new("agent_job_resident_bytes", "Resident memory of a running job's processes here now");
        let mut processes = Gauges::new("agent_job_processes", "Processes of a running job here");
        let mut total_cpu =
            Gauges::new("agent_jobs_cpu_seconds", "CPU time of the running jobs' processes here so far");
        let mut total_rss =
            Gauges::new("agent_jobs_resident_bytes", "Resident memory of the running jobs' processes here now");
        let (mut cpu_sum, mut rss_sum) = (0i64, 0i64);
        let running: Vec<u64> = agent.lock_jobs().iter().filter(|(_, e)| e.exit.is_none()).map(|(id, _)| *id).collect();
        jobs.set(Vec::new(), running.len() as i64);
        steps.set(Vec::new(), agent.steps.lock().unwrap_or_else(|p| p.into_inner()).len() as i64);
        for job_id in running {
            let read = quorum_proto::agent::ReadUsage { job_id, ..Default::default() };
            let sample = crate::usage::sample(agent, &read);
            let Some(usage) = sample.usage.filter(|_| sample.error.is_empty()) else { continue };
            let (job_cpu, job_rss) =
                (((usage.cpu_user_us + usage.cpu_system_us) / 1_000_000) as i64, (sample.rss_kb * 1024) as i64);
            cpu_sum = cpu_sum.saturating_add(job_cpu);
            rss_sum = rss_sum.saturating_add(job_rss);
            if self.per_job {
                let job = labels([("job", &job_id.to_string())]);
                cpu.set(job.clone(), job_cpu);
                rss.set(job.clone(), job_rss);
                processes.set(job, sample.processes.into());
            }
        }
        total_cpu.set(Vec::new(), cpu_sum);
        total_rss.set(Vec::new(), rss_sum);
        let mut health = Gauges::new("agent_gpu_health", "Each GPU's health at the last check: 1 for its state");
        let mut util = Gauges::new("agent_gpu_utilization_percent", "How busy each GPU was at the last check");
        let mut memory = Gauges::new("agent_gpu_memory_used_bytes", "Memory in use on each GPU at the last check");
        let mut temperature = Gauges::new("agent_gpu_temperature_celsius", "Each GPU's temperature at the last check");
        for g in agent.gpu_health() {
            let state = quorum_proto::gpu_state_name(g.state);
            health.set(labels([("gpu", &g.index.to_string()), ("state", state)]), 1);
        }
        for (index, r) in agent.gpu_readings() {
            let gpu = labels([("gpu", &index.to_string())]);
            temperature.set(gpu.clone(), r.temperature_c.into());
            if let Some(pct) = r.utilization_pct {
                util.set(gpu.clone(), pct.into());
            }
            if let Some(mb) = r.memory_used_mb {
                memory.set(gpu, (mb * 1024 * 1024) as i64);
            }
        }
        let c = &agent.containers;
        let count = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed) as i64;
        let mut pulls = Gauges::new("agent_image_pulls", "Images pulled from a registry since the agent started");
        pulls.set(Vec::new(), count(&c.metrics.pulls));
        let mut pulled =
            Gauges::new("agent_image_pull_bytes", "Bytes of image layers downloaded since the agent started");
        pulled.set(Vec::new(), count(&c.metrics.pull_bytes));
        let mut pull_seconds =
            Gauges::new("agent_image_pull_seconds", "Seconds spent pulling images since the agent started");
        pull_seconds.set(Vec::new(), count(&c.metrics.pull_ms) / 1000);
        let mut hits = Gauges::new("agent_image_cache_hits", "Containers whose image was in the cache already");
        hits.set(Vec::new(), count(&c.metrics.cache_hits));
        let mut failures =
            Gauges::new("agent_container_failures", "Containers that could not be made (pulls that failed too)");
        failures.set(Vec::new(), count(&c.metrics.failures));
        let (bytes, images) = c.cache_usage();
        let mut cache = Gauges::new("agent_image_cache_bytes", "Bytes the image cache's layers take on disk");
        cache.set(Vec::new(), bytes as i64);
        let mut cached = Gauges::new("agent_images_cached", "Images in the cache");
        cached.set(Vec::new(), images as i64);
        let mut live = Gauges::new("agent_containers", "Containers on this node now");
        live.set(Vec::new(), c.live_count() as i64);
        let mut all =
            vec![jobs, steps, total_cpu, total_rss, pulls, pulled, pull_seconds, hits, failures, cache, cached, live];
        if self.per_job {
            all.extend([cpu, rss, processes]);
        }
        all.extend([health, util, memory, temperature]);
        all
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        for gauges in self.gauges() {
            gauges.encode(&mut encoder)?;
        }
        Ok(())
    }
}

struct Served {
    registry: Registry,
    allow: Vec<Cidr>,
}

async fn scrape(State(served): State<Arc<Served>>, ConnectInfo(peer): ConnectInfo<SocketAddr>) -> Response {
    if !served.allow.iter().any(|c| c.contains(peer.ip())) {
        let refused = format!("{} may not read this agent's metrics (--metrics-allow)\n", peer.ip());
        return (StatusCode::FORBIDDEN, refused).into_response();
    }
    // It reads /proc and the jobs' cgroups: off the async workers.
    let encoded = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &served.registry).map(|()| text)
    })
    .await;
    match encoded.unwrap_or(Err(fmt::Error)) {
        Ok(text) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the metrics: {e}\n")).into_response(),
    }
}

/// Serves `/metrics` of `agent` on `listener` as `exposure` says, until the agent stops.
pub async fn serve(agent: Arc<Agent>, listener: tokio::net::TcpListener, exposure: Exposure) -> std::io::Result<()> {
    let mut registry = Registry::with_prefix("quorum");
    registry.register_collector(Box::new(Scrape { agent: agent.clone(), per_job: exposure.per_job }));
    let served = Arc::new(Served { registry, allow: exposure.allow });
    let router = Router::new().route("/metrics", get(scrape)).with_state(served);
    let mut stopped = agent.stopped.subscribe();
    axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })
        .await
}
