//! The agent's stream to the leader, and how it finds and follows the leader.
//!
//! The agent tries the leader hinted by the last replica it asked, else the next address of its
//! list. On a stream it registers, heartbeats every `heartbeat`, and re-sends every job exit the
//! leader has not yet acknowledged. A stream whose heartbeats go unanswered for a few periods
//! is abandoned and another replica is tried, which is how a crashed or isolated leader is left.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quorum_proto::agent::agent_service_client::AgentServiceClient;
use quorum_proto::agent::{
    agent_message, controller_message, AgentMessage, ExitKind, Gpu, Heartbeat, Kill, Launch, Register,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::{output, runner, supervisor, Agent, JobEntry, Order};

/// How many heartbeat periods without an answer before the stream is given up.
const MISSED_HEARTBEATS: u32 = 3;
/// Heartbeats remembered while unanswered (a minute at the default period).
const MAX_UNANSWERED: usize = 64;
/// How long an unacknowledged exit waits before it is sent again on the same stream.
const EXIT_RESEND: Duration = Duration::from_secs(3);

enum SessionEnd {
    /// Try this address next.
    Redirect(String),
    /// Could not reach a leader here.
    Retry,
    /// Was connected to the leader, and the stream ended: look again at once.
    Lost,
    Shutdown,
}

pub(crate) async fn run(
    agent: Arc<Agent>,
    mut exits: mpsc::UnboundedReceiver<u64>,
    mut outbox: mpsc::Receiver<AgentMessage>,
    mut shutdown: watch::Receiver<bool>,
) {
    let addrs = agent.config.controllers.clone();
    let mut next = 0usize;
    let mut hint: Option<String> = None;
    let mut failures = 0u32;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let addr = hint.take().unwrap_or_else(|| {
            let a = addrs[next % addrs.len()].clone();
            next += 1;
            a
        });
        match session(&agent, &addr, &mut exits, &mut outbox, &mut shutdown).await {
            SessionEnd::Shutdown => return,
            SessionEnd::Redirect(leader) => {
                hint = Some(leader);
                failures = 0;
                continue;
            }
            SessionEnd::Retry => failures += 1,
            SessionEnd::Lost => {
                failures = 0;
                continue;
            }
        }
        // After each full round of failures, back off a little more (up to 1 s).
        if (failures as usize).is_multiple_of(addrs.len()) {
            let rounds = failures / addrs.len() as u32;
            let wait = Duration::from_millis(100 * u64::from(rounds.min(10)));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

fn leader_hint(status: &tonic::Status) -> Option<String> {
    status.metadata().get(quorum_proto::LEADER_HINT_KEY).and_then(|v| v.to_str().ok()).map(str::to_string)
}

fn register(agent: &Agent) -> AgentMessage {
    let c = &agent.config;
    AgentMessage {
        msg: Some(agent_message::Msg::Register(Register {
            node: c.name.clone(),
            cpus: c.cpus,
            mem_mb: c.mem_mb,
            gpus: c.gpus.iter().map(|g| Gpu { index: g.index, gpu_type: g.gpu_type.clone() }).collect(),
            version: crate::VERSION.to_string(),
            features: c.features.clone(),
            started_at_ms: agent.started_at_ms,
            limits: agent.limits().describe(),
            // An agent that could never make a container says so: the leader then fails a
            // container job sent here instead of running it on the node itself.
            capabilities: (c.containers.enabled && crate::identity::is_root())
                .then(|| crate::container::CAPABILITY.to_string())
                .into_iter()
                .chain([crate::pmi::CAPABILITY, quorum_model::cpu_bind::CAPABILITY].map(String::from))
                // PMIx where its library is installed.
                .chain(crate::pmix::available().then(|| crate::pmix::CAPABILITY.to_string()))
                .collect(),
        })),
    }
}

async fn session(
    agent: &Arc<Agent>,
    addr: &str,
    exits: &mut mpsc::UnboundedReceiver<u64>,
    outbox: &mut mpsc::Receiver<AgentMessage>,
    shutdown: &mut watch::Receiver<bool>,
) -> SessionEnd {
    if agent.isolated() {
        return SessionEnd::Retry;
    }
    let endpoint = match quorum_auth::tls::endpoint(addr, agent.config.tls.as_ref()) {
        Ok(e) => e.connect_timeout(Duration::from_millis(500)).tcp_nodelay(true),
        Err(e) => {
            tracing::warn!(addr, error = %e, "bad controller address");
            return SessionEnd::Retry;
        }
    };
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(_) => return SessionEnd::Retry,
    };
    let (tx, rx) = mpsc::channel::<AgentMessage>(1024);
    if tx.send(register(agent)).await.is_err() {
        return SessionEnd::Retry;
    }
    let mut client = AgentServiceClient::new(channel);
    let mut inbound = match client.session(ReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(status) => {
            if matches!(status.code(), tonic::Code::PermissionDenied | tonic::Code::Unauthenticated) {
                tracing::warn!(addr, reason = status.message(), "the controller refused this agent");
            }
            return match leader_hint(&status) {
                Some(leader) if leader != addr => SessionEnd::Redirect(leader),
                _ => SessionEnd::Retry,
            };
        }
    };
    tracing::info!(addr, "connected to the leader");
    *agent.leader.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr.to_string());
    // Everything not yet acknowledged goes out again on a new stream.
    resend_exits(agent, &tx, true).await;

    let period = agent.config.heartbeat;
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    let mut last_ack = Instant::now();
    // Send times of the heartbeats not yet answered, oldest first.
    let mut unanswered: VecDeque<(u64, Instant)> = VecDeque::new();
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                if last_ack.elapsed() > period * MISSED_HEARTBEATS + Duration::from_secs(1) {
                    tracing::warn!(addr, "leader stopped answering heartbeats");
                    return SessionEnd::Lost;
                }
                if agent.isolated() {
                    continue;
                }
                seq += 1;
                if unanswered.len() >= MAX_UNANSWERED {
                    unanswered.pop_front();
                }
                unanswered.push_back((seq, Instant::now()));
                let running = agent.running_reports();
                let (image_cache_bytes, images) = agent.containers.cache_usage();
                let hb = AgentMessage { msg: Some(agent_message::Msg::Heartbeat(Heartbeat {
                    seq,
                    running,
                    gpus: agent.gpu_health(),
                    health_check: agent.health_check_failure(),
                    image_cache_bytes,
                    images_cached: images as u32,
                })) };
                if tx.send(hb).await.is_err() {
                    return SessionEnd::Lost;
                }
                resend_exits(agent, &tx, false).await;
            }
            msg = inbound.message() => {
                let msg = match msg {
                    Ok(Some(_)) if agent.isolated() => continue,
                    Ok(Some(m)) => m,
                    Ok(None) => return SessionEnd::Lost,
                    Err(status) => {
                        tracing::info!(addr, status = %status.message(), "stream to the leader ended");
                        if status.code() == tonic::Code::Aborted {
                            // Another agent under this node's name took the session: two agents
                            // of one node fight for it; each waits before taking it back.
                            tracing::warn!(addr, "another session for this node replaced ours; is a second agent running under this name?");
                            tokio::select! {
                                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                                _ = shutdown.changed() => return SessionEnd::Shutdown,
                            }
                        }
                        return match leader_hint(&status) {
                            Some(leader) if leader != addr => SessionEnd::Redirect(leader),
                            _ => SessionEnd::Lost,
                        };
                    }
                };
                match msg.msg {
                    Some(controller_message::Msg::HeartbeatAck(ack)) => {
                        last_ack = Instant::now();
                        while let Some(&(s, sent_at)) = unanswered.front() {
                            if s > ack.seq {
                                break;
                            }
                            unanswered.pop_front();
                            if s == ack.seq {
                                agent.heartbeat_answered(sent_at, Duration::from_millis(ack.lease_ms));
                            }
                        }
                    }
                    Some(controller_message::Msg::Launch(l)) => launch(agent, l, &tx).await,
                    Some(controller_message::Msg::Kill(k)) => kill(agent, k),
                    Some(controller_message::Msg::Suspend(s)) => suspend(agent, s),
                    Some(controller_message::Msg::StepLaunch(l)) => {
                        // Known before its tasks start, so that a kill and input right behind it
                        // are kept.
                        crate::step::expect(agent, &l);
                        tokio::spawn(crate::step::launch(agent.clone(), l));
                    }
                    Some(controller_message::Msg::StepIo(io)) => crate::step::io(agent, io),
                    Some(controller_message::Msg::Signal(s)) => signal(agent, s),
                    Some(controller_message::Msg::GpuFault(f)) => agent.inject_gpu_fault(f.gpu, &f.kind),
                    Some(controller_message::Msg::ReadOutput(r)) => {
                        // Off the stream's task: a slow disk holds up no heartbeat.
                        let (agent, tx) = (agent.clone(), tx.clone());
                        tokio::spawn(async move {
                            let chunk = output::read_output(agent, r).await;
                            let _ = tx.send(AgentMessage { msg: Some(agent_message::Msg::Output(chunk)) }).await;
                        });
                    }
                    Some(controller_message::Msg::ReadUsage(r)) => {
                        let (agent, tx) = (agent.clone(), tx.clone());
                        tokio::spawn(async move {
                            let sample = tokio::task::spawn_blocking(move || crate::usage::sample(&agent, &r)).await;
                            if let Ok(sample) = sample {
                                let _ = tx.send(AgentMessage { msg: Some(agent_message::Msg::Usage(sample)) }).await;
                            }
                        });
                    }
                    Some(controller_message::Msg::ExitAck(a)) => {
                        let mut jobs = agent.lock_jobs();
                        if let Some(e) = jobs.get_mut(&a.job_id).filter(|e| e.exit.is_some()) {
                            e.acked = true;
                            if let Some(record) = e.record.take() {
                                let _ = std::fs::remove_dir_all(record);
                            }
                        }
                    }
                    None => {}
                }
            }
            Some(job_id) = exits.recv() => {
                send_exit(agent, &tx, job_id).await;
            }
            Some(msg) = outbox.recv() => {
                if tx.send(msg).await.is_err() {
                    return SessionEnd::Lost;
                }
            }
            _ = shutdown.changed() => return SessionEnd::Shutdown,
        }
    }
}

/// An exit report still waiting for its acknowledgement.
fn pending_exit(e: &JobEntry) -> Option<&quorum_proto::agent::JobExit> {
    e.exit.as_ref().filter(|_| !e.acked)
}

async fn send_exit(agent: &Agent, tx: &mpsc::Sender<AgentMessage>, job_id: u64) {
    // Cut off: the report stays pending and goes out on the next stream.
    if agent.isolated() {
        return;
    }
    let exit = {
        let mut jobs = agent.lock_jobs();
        match jobs.get_mut(&job_id) {
            Some(e) => match pending_exit(e).cloned() {
                Some(x) => {
                    e.exit_sent = Some(Instant::now());
                    x
                }
                None => return,
            },
            None => return,
        }
    };
    let _ = tx.send(AgentMessage { msg: Some(agent_message::Msg::Exit(exit)) }).await;
}

async fn resend_exits(agent: &Agent, tx: &mpsc::Sender<AgentMessage>, all: bool) {
    let due: Vec<u64> = agent
        .lock_jobs()
        .iter()
        .filter(|(_, e)| pending_exit(e).is_some())
        .filter(|(_, e)| all || e.exit_sent.is_none_or(|t| t.elapsed() >= EXIT_RESEND))
        .map(|(id, _)| *id)
        .collect();
    for job_id in due {
        send_exit(agent, tx, job_id).await;
    }
}

async fn launch(agent: &Arc<Agent>, l: Launch, tx: &mpsc::Sender<AgentMessage>) {
    let job_id = l.job_id;
    let resend = {
        let mut jobs = agent.lock_jobs();
        match jobs.get_mut(&job_id) {
            Some(e) if l.token < e.token => {
                tracing::warn!(job = job_id, token = l.token, seen = e.token, "refusing a launch older than one seen");
                return;
            }
            // Already launched; if it ended, the leader may have missed the report. A launch
            // sent again with another time limit moves the running job's (`scontrol update`).
            Some(e) if l.token == e.token => {
                if e.exit.is_none() && l.time_limit_s != e.time_limit_s {
                    new_time_limit(agent, e, &l);
                }
                pending_exit(e).is_some()
            }
            existing => {
                // A newer allocation of the same job (requeued): stop what runs of the old one.
                if let Some(JobEntry { pgid: Some(pgid), exit: None, .. }) = existing {
                    supervisor::signal_group(*pgid, libc::SIGKILL);
                }
                let (kill_tx, kill_rx) = mpsc::channel(4);
                let mut entry = JobEntry::new(l.token, Some(kill_tx));
                entry.time_limit_s = l.time_limit_s;
                entry.leased = l.spec.as_ref().is_some_and(|s| s.requeue);
                entry.gpus = l.gpus.clone();
                jobs.insert(job_id, entry);
                runner::start(agent.clone(), l, kill_rx);
                false
            }
        }
    };
    if resend {
        send_exit(agent, tx, job_id).await;
    }
}

/// A running job's new time limit, from a launch of its allocation sent again: given to its
/// runner, and written into its record, so that an agent restarted meanwhile keeps it. The
/// launch is verified as a first one is, where this agent verifies launches.
fn new_time_limit(agent: &Agent, e: &mut JobEntry, l: &Launch) {
    if let Err(why) = crate::grants::verify_launch(agent, l) {
        tracing::warn!(job = l.job_id, error = %why, "refused a launch moving a job's time limit");
        return;
    }
    let Some(runner) = &e.kill else { return };
    if runner.try_send(Order::TimeLimit(l.time_limit_s)).is_err() {
        return;
    }
    tracing::info!(job = l.job_id, from = e.time_limit_s, to = l.time_limit_s, "the job's time limit moved");
    e.time_limit_s = l.time_limit_s;
    let record = crate::record::record_dir(&agent.config.spool_dir, l.job_id, l.token);
    if let Err(err) = crate::record::rewrite_launch(&record, l) {
        tracing::warn!(job = l.job_id, error = %err, "could not record the job's new time limit");
    }
}

/// Freezes or thaws a job running here under the allocation the message names.
fn suspend(agent: &Agent, s: quorum_proto::agent::Suspend) {
    let jobs = agent.lock_jobs();
    match jobs.get(&s.job_id) {
        Some(e) if e.token == s.token && e.exit.is_none() => {
            if let Some(runner) = &e.kill {
                let order = if s.resume { Order::Resume(s.time_limit_s) } else { Order::Suspend };
                let _ = runner.try_send(order);
            }
        }
        _ => tracing::warn!(job = s.job_id, token = s.token, "a suspend for a job not running here; ignored"),
    }
}

/// Sends a signal to a running job's process group (`quorum cancel --signal`), if the token is
/// the job's current one.
fn signal(agent: &Agent, s: quorum_proto::agent::Signal) {
    if let Err(e) = crate::grants::verify_signal(agent, &s) {
        tracing::warn!(job = s.job_id, error = %e, "refused a signal");
        return;
    }
    let jobs = agent.lock_jobs();
    match jobs.get(&s.job_id) {
        Some(e) if e.token == s.token && e.exit.is_none() => {
            if let Some(pgid) = e.pgid {
                tracing::info!(job = s.job_id, signal = s.signal, "signalling the job");
                supervisor::signal_group(pgid, s.signal);
            }
        }
        _ => tracing::warn!(job = s.job_id, token = s.token, "a signal for a job not running here; ignored"),
    }
}

fn kill(agent: &Agent, k: Kill) {
    let mut jobs = agent.lock_jobs();
    let known = jobs.get(&k.job_id).is_some_and(|e| e.token >= k.token);
    if !known {
        // An allocation never launched here: the job was cancelled (or timed out) between
        // being placed and its launch being sent, so the leader sent the kill instead. It ends
        // here without having run, reported as any end is; a launch of it arriving later finds
        // it ended and starts nothing.
        tracing::info!(job = k.job_id, token = k.token, "killed before it was launched here");
        // What still runs of an older allocation of it goes too, as a newer launch would do.
        if let Some(JobEntry { pgid: Some(pgid), exit: None, .. }) = jobs.get(&k.job_id) {
            supervisor::signal_group(*pgid, libc::SIGKILL);
        }
        let mut entry = JobEntry::new(k.token, None);
        let kind = ExitKind::try_from(k.reason).unwrap_or(ExitKind::Cancelled);
        entry.exit = Some(quorum_proto::agent::JobExit {
            job_id: k.job_id,
            token: k.token,
            kind: kind as i32,
            ..Default::default()
        });
        jobs.insert(k.job_id, entry);
        drop(jobs);
        let _ = agent.exits_tx.send(k.job_id);
        return;
    }
    let Some(e) = jobs.get(&k.job_id) else { return };
    if k.token < e.token {
        tracing::warn!(job = k.job_id, token = k.token, seen = e.token, "refusing a kill older than the launch seen");
        return;
    }
    if let Some(kill) = &e.kill {
        let reason = ExitKind::try_from(k.reason).unwrap_or(ExitKind::Cancelled);
        let order = if k.grace_s > 0 { Order::Preempt(u64::from(k.grace_s)) } else { Order::Kill(reason) };
        let _ = kill.try_send(order);
    }
}

#[cfg(test)]
mod tests {
    use quorum_proto::agent::{ExitKind, Kill, Launch};
    use tokio::sync::mpsc;

    use super::{kill, launch};
    use crate::{Agent, AgentConfig, JobEntry};

    fn agent() -> std::sync::Arc<Agent> {
        Agent::new(AgentConfig {
            switch_user: false,
            cgroups: false,
            ..AgentConfig::new("node01", vec!["127.0.0.1:1".into()], std::env::temp_dir())
        })
    }

    /// The fencing token: a launch or kill of an older allocation than the one this agent has
    /// seen for the job does nothing (a re-sent or delayed message never runs a job again, nor
    /// kills its newer allocation).
    #[tokio::test]
    async fn launches_and_kills_older_than_the_allocation_seen_are_refused() {
        let agent = agent();
        let (kill_tx, mut kill_rx) = mpsc::channel(4);
        agent.lock_jobs().insert(7, JobEntry::new(5, Some(kill_tx)));
        let (tx, _rx) = mpsc::channel(4);

        launch(&agent, Launch { job_id: 7, token: 4, ..Default::default() }, &tx).await;
        let jobs = agent.lock_jobs();
        let entry = &jobs[&7];
        assert_eq!(entry.token, 5, "an older launch replaced the allocation");
        assert!(entry.kill.is_some() && entry.exit.is_none(), "an older launch touched the running job");
        drop(jobs);

        kill(&agent, Kill { job_id: 7, token: 4, reason: ExitKind::Cancelled as i32, grace_s: 0 });
        assert!(kill_rx.try_recv().is_err(), "an older kill reached the job");
        kill(&agent, Kill { job_id: 7, token: 5, reason: ExitKind::Cancelled as i32, grace_s: 0 });
        assert_eq!(
            kill_rx.try_recv().ok(),
            Some(crate::Order::Kill(ExitKind::Cancelled)),
            "the current allocation's kill is delivered"
        );
    }

    /// A job cancelled between being placed and being launched gets a kill and no launch: it
    /// ends here without running (reported, so that the leader ends it instead of waiting for
    /// ever), and a launch of it that comes later starts nothing.
    #[tokio::test]
    async fn a_kill_before_the_launch_ends_the_job_without_running_it() {
        let agent = agent();
        let mut exits = agent.exits_rx.lock().unwrap().take().unwrap();
        kill(&agent, Kill { job_id: 9, token: 3, reason: ExitKind::Cancelled as i32, grace_s: 0 });
        assert_eq!(exits.try_recv().ok(), Some(9), "the end is reported");
        let exit = agent.lock_jobs()[&9].exit.clone().expect("ended");
        assert_eq!((exit.token, exit.kind), (3, ExitKind::Cancelled as i32));

        let (tx, mut sent) = mpsc::channel(4);
        launch(&agent, Launch { job_id: 9, token: 3, ..Default::default() }, &tx).await;
        let jobs = agent.lock_jobs();
        assert!(jobs[&9].kill.is_none() && jobs[&9].pgid.is_none(), "the late launch started it");
        drop(jobs);
        assert!(sent.try_recv().is_ok(), "the late launch is answered with the end again");
    }
}
