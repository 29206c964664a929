//! `quorum bench agents`: N simulated agents against three `quorum-controller` processes. Each
//! is what the real agent is on the wire — one gRPC stream to the leader, a `Register` for its
//! node, then a heartbeat every second — without running jobs, so that one process can be ten
//! thousand nodes. Measured once all have registered: the heartbeat round trip (sent to
//! answered), the leader's CPU, and whether the leader declared any node DOWN although its agent
//! never stopped heartbeating.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quorum_proto::agent::agent_service_client::AgentServiceClient;
use quorum_proto::agent::{agent_message, controller_message, AgentMessage, Heartbeat, Register};
use quorum_proto::api;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::harness::{controller_bin, progress, progress_done, spread, Replicas};

/// Agents sharing one HTTP/2 connection (each has a stream of its own on it).
const AGENTS_PER_CONNECTION: usize = 100;
const HEARTBEAT: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Stats {
    /// Agents whose first heartbeat was answered.
    registered: AtomicUsize,
    /// Streams that could not be opened or ended while the bench ran (each agent connects again).
    broken: AtomicUsize,
    measuring: AtomicBool,
    lags: Mutex<Vec<Duration>>,
    /// Why the first broken stream broke.
    first_error: Mutex<Option<String>>,
}

impl Stats {
    fn broke(&self, why: String) {
        self.broken.fetch_add(1, Ordering::Relaxed);
        self.first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(why);
    }
}

/// CPU time (user + system) a process has used so far.
fn cpu_time(pid: &str) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rfind(')').map(|i| &stat[i + 2..]).ok_or_else(|| anyhow::anyhow!("bad /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command name: state is field 3, utime 14 and stime 15 (1-based, of the whole line).
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no failure mode for this name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_millis(ticks * 1000 / hz))
}

/// One simulated agent: registers `node`, then heartbeats until `stop`. Like the real agent, it
/// connects again when its stream ends, to the leader a refusal names or else the next replica.
async fn agent(first: Channel, addrs: Arc<Vec<String>>, node: String, stats: Arc<Stats>, stop: watch::Receiver<bool>) {
    let register = Register {
        node,
        cpus: 64,
        mem_mb: 512 * 1024,
        version: quorum_agent::VERSION.to_string(),
        started_at_ms: 1,
        limits: "rlimits only: simulated by quorum bench agents".into(),
        ..Default::default()
    };
    let lazy = |addr: &str| Endpoint::from_shared(format!("http://{addr}")).map(|e| e.tcp_nodelay(true).connect_lazy());
    let mut channel = first;
    let mut next = 0usize;
    let mut registered = false;
    let mut failures = 0u64;
    while !*stop.borrow() {
        let (tx, rx) = mpsc::channel::<AgentMessage>(16);
        if tx.send(AgentMessage { msg: Some(agent_message::Msg::Register(register.clone())) }).await.is_err() {
            return;
        }
        let hint = match AgentServiceClient::new(channel.clone()).session(ReceiverStream::new(rx)).await {
            Ok(r) => {
                failures = 0;
                if heartbeat(tx, r.into_inner(), &stats, stop.clone(), &mut registered).await {
                    return;
                }
                None
            }
            Err(status) => {
                failures += 1;
                stats.broke(format!("opening the stream: {}", status.message()));
                status.metadata().get(quorum_proto::LEADER_HINT_KEY).and_then(|v| v.to_str().ok()).map(str::to_string)
            }
        };
        let target = hint.unwrap_or_else(|| {
            next += 1;
            addrs[next % addrs.len()].clone()
        });
        match lazy(&target) {
            Ok(c) => channel = c,
            Err(_) => return,
        }
        // As the real agent: longer waits after repeated failures (up to 1 s), spread out.
        let wait = 100 * failures.clamp(1, 10);
        tokio::time::sleep(Duration::from_millis(wait / 2 + rand_below(wait))).await;
    }
}

/// Heartbeats on an open stream, timing each answer: true when told to stop, false when the
/// stream ended.
async fn heartbeat(
    tx: mpsc::Sender<AgentMessage>,
    mut inbound: tonic::Streaming<quorum_proto::agent::ControllerMessage>,
    stats: &Stats,
    mut stop: watch::Receiver<bool>,
    registered: &mut bool,
) -> bool {
    // Heartbeats spread over the second, as agents started at different times would be.
    let offset = Duration::from_micros(rand_below(HEARTBEAT.as_micros() as u64));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + offset, HEARTBEAT);
    let mut sent: VecDeque<(u64, Instant)> = VecDeque::new();
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                seq += 1;
                sent.push_back((seq, Instant::now()));
                if sent.len() > 16 {
                    sent.pop_front();
                }
                let hb = Heartbeat { seq, ..Default::default() };
                if tx.send(AgentMessage { msg: Some(agent_message::Msg::Heartbeat(hb)) }).await.is_err() {
                    return false;
                }
            }
            msg = inbound.message() => {
                let ack = match msg {
                    Ok(Some(m)) => match m.msg {
                        Some(controller_message::Msg::HeartbeatAck(a)) => a,
                        _ => continue,
                    },
                    other => {
                        if *stop.borrow() {
                            return true;
                        }
                        stats.broke(match other {
                            Err(status) => format!("the stream ended: {}", status.message()),
                            _ => "the leader closed the stream".into(),
                        });
                        return false;
                    }
                };
                if let Some(&(_, at)) = sent.iter().find(|(s, _)| *s == ack.seq) {
                    if !*registered {
                        *registered = true;
                        stats.registered.fetch_add(1, Ordering::Relaxed);
                    }
                    if stats.measuring.load(Ordering::Relaxed) {
                        stats.lags.lock().unwrap_or_else(|p| p.into_inner()).push(at.elapsed());
                    }
                }
            }
            _ = stop.changed() => return true,
        }
    }
}

/// A number below `n` from the clock: spreading start times needs no better randomness.
fn rand_below(n: u64) -> u64 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    u64::from(nanos).wrapping_mul(6_364_136_223_846_793_005) % n.max(1)
}

pub async fn run(n: usize, seconds: u64, bin: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    anyhow::ensure!((1..=99_999).contains(&n), "--agents must be 1 to 99999");
    anyhow::ensure!(seconds > 0, "--seconds must be above 0");
    // Plaintext: the simulated agents share connections, AGENTS_PER_CONNECTION streams each,
    // which node certificates (one node per connection) cannot do. What is measured is the
    // heartbeat path and the leader's CPU for it.
    let replicas = Replicas::start(controller_bin(bin)?, &format!("sim[00001-{n:05}]"), false)?;
    let c = replicas.client()?;
    let started = Instant::now();
    // A leader that has led for 2 s with every replica answering (not one of the first
    // elections, which a replica starting late may still overturn).
    let mut since: Option<(u64, Instant)> = None;
    let (leader_id, leader_addr) = loop {
        let s = quorum_client::display::replica_statuses(&c).await.unwrap_or_default();
        let leader = s.iter().find(|r| r.role == "leader").filter(|_| s.len() == 3 && s.iter().all(|r| r.reachable));
        match (leader, since) {
            (Some(l), Some((id, t))) if l.id == id && t.elapsed() >= Duration::from_secs(2) => {
                break (l.id, l.address.clone())
            }
            (Some(l), Some((id, _))) if l.id == id => {}
            (Some(l), _) => since = Some((l.id, Instant::now())),
            (None, _) => since = None,
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "no steady leader within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let pid_of = |id: u64| {
        replicas.children[(id - 1) as usize]
            .as_ref()
            .map(|c| c.id().to_string())
            .ok_or_else(|| anyhow::anyhow!("replica {id}'s process is gone"))
    };

    let stats = Arc::new(Stats::default());
    let addrs = Arc::new(replicas.addrs.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let endpoint = Endpoint::from_shared(format!("http://{leader_addr}"))?.tcp_nodelay(true);
    let channels: Vec<Channel> = (0..n.div_ceil(AGENTS_PER_CONNECTION)).map(|_| endpoint.connect_lazy()).collect();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let channel = channels[i / AGENTS_PER_CONNECTION].clone();
        let node = format!("sim{:05}", i + 1);
        tasks.push(tokio::spawn(agent(channel, addrs.clone(), node, stats.clone(), stop_rx.clone())));
    }
    while stats.registered.load(Ordering::Relaxed) < n {
        let registered = stats.registered.load(Ordering::Relaxed);
        let broken = stats.broken.load(Ordering::Relaxed);
        let why = stats.first_error.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default();
        progress(&format!(
            "agents: {registered}/{n} registered after {:.1} s{}",
            started.elapsed().as_secs_f64(),
            if broken > 0 {
                format!(" ({broken} streams refused or ended, agents reconnecting; the first: {why})")
            } else {
                String::new()
            }
        ));
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "only {registered} of {n} agents registered within 300 s ({} streams broke; the first: {})",
            stats.broken.load(Ordering::Relaxed),
            stats.first_error.lock().unwrap_or_else(|p| p.into_inner()).as_deref().unwrap_or("-")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let registered_in = started.elapsed();

    let broken_before = stats.broken.load(Ordering::Relaxed);
    // The leader now: the registration storm may have moved it.
    let statuses = quorum_client::display::replica_statuses(&c).await.unwrap_or_default();
    let measured_leader = statuses.iter().find(|r| r.role == "leader").map_or(leader_id, |r| r.id);
    let leader_pid = pid_of(measured_leader)?;
    let (cpu0, own0, t0) = (cpu_time(&leader_pid)?, cpu_time("self")?, Instant::now());
    stats.measuring.store(true, Ordering::Relaxed);
    while t0.elapsed() < Duration::from_secs(seconds) {
        let answered = stats.lags.lock().unwrap_or_else(|p| p.into_inner()).len();
        progress(&format!(
            "agents: {n} heartbeating, {answered} heartbeats answered in {:.0} s",
            t0.elapsed().as_secs_f64()
        ));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stats.measuring.store(false, Ordering::Relaxed);
    let wall = t0.elapsed();
    let leader_cpu = (cpu_time(&leader_pid)? - cpu0).as_secs_f64() / wall.as_secs_f64();
    let own_cpu = (cpu_time("self")? - own0).as_secs_f64() / wall.as_secs_f64();
    progress_done();

    let nodes = c.call(|mut cl| async move { cl.list_nodes(api::ListNodesRequest::default()).await }).await?.nodes;
    let down: Vec<&str> = nodes.iter().filter(|n| n.state == "down").map(|n| n.name.as_str()).collect();
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    let mut lags = std::mem::take(&mut *stats.lags.lock().unwrap_or_else(|p| p.into_inner()));
    let answered = lags.len();
    let expected = (n as f64 * wall.as_secs_f64() / HEARTBEAT.as_secs_f64()) as usize;
    let s = spread(&mut lags);
    let broken = stats.broken.load(Ordering::Relaxed) - broken_before;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "agents", "agents": n, "seconds": wall.as_secs_f64(),
                "registered_s": registered_in.as_secs_f64(), "nodes": nodes.len(),
                "heartbeats_answered": answered, "heartbeats_expected": expected, "round_trip": s,
                "leader_cpu": leader_cpu, "bench_cpu": own_cpu, "down": down, "streams_broken_while_registering": broken_before, "streams_broken_while_measured": broken,
            })
        );
    } else {
        println!("agents: {n} simulated agents on {} connections to the leader, heartbeat every 1 s", channels.len());
        println!("  all registered after {:.1} s; {} nodes in the state", registered_in.as_secs_f64(), nodes.len());
        println!("  {:.0} s measured: {answered} heartbeats answered (~{expected} sent)", wall.as_secs_f64());
        println!("  round trip: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms", s.p50_ms, s.p99_ms, s.max_ms);
        println!(
            "  leader CPU: {:.0} % of a core (this bench's own process: {:.0} %)",
            leader_cpu * 100.0,
            own_cpu * 100.0
        );
        println!(
            "  nodes DOWN: {} {}; streams refused or ended: {broken_before} while registering, {broken} while measured",
            down.len(),
            if down.is_empty() { "(none)".to_string() } else { format!("{down:?}") }
        );
    }
    anyhow::ensure!(down.is_empty(), "{} nodes were declared DOWN while their agents heartbeated", down.len());

    Ok(())
}
