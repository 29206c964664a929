//! Launches that arrive on an agent's live stream to its leader: a real agent (in this process,
//! its jobs real processes) connected over gRPC to a leader of the test's own, which sends what a
//! compromised or confused peer could. A launch whose grant was forged, is missing, was signed
//! for another node or has expired runs nothing and is answered LAUNCH_FAILED; a launch the
//! agent already ran, sent again (a replay), runs nothing again; an older allocation's launch is
//! refused. The signed launch beside them runs once, which shows the refusals are not merely
//! launches going nowhere. A `--requeue` job's launch read after the node's lease ran out starts
//! nothing (the leader may have started it elsewhere).

use std::sync::Mutex;
use std::time::Duration;

use quorum_agent::AgentConfig;
use quorum_auth::launch::{launch_digest, Grant, Signer, Verifier};
use quorum_auth::pki::Layout;
use quorum_proto::agent::agent_service_server::{AgentService, AgentServiceServer};
use quorum_proto::agent::{
    agent_message, controller_message, AgentMessage, ControllerMessage, ExitKind, HeartbeatAck, JobExit, Launch,
};
use quorum_proto::api::JobSpec;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// The test's leader: hands what the agent sends to the test, and sends what the test says.
struct Leader {
    from_agent: mpsc::UnboundedSender<AgentMessage>,
    to_agent: Mutex<Option<mpsc::Receiver<Result<ControllerMessage, Status>>>>,
}

#[tonic::async_trait]
impl AgentService for Leader {
    type SessionStream = ReceiverStream<Result<ControllerMessage, Status>>;

    async fn session(&self, req: Request<Streaming<AgentMessage>>) -> Result<Response<Self::SessionStream>, Status> {
        let rx = self.to_agent.lock().unwrap().take().ok_or_else(|| Status::aborted("one session only"))?;
        let mut inbound = req.into_inner();
        let from_agent = self.from_agent.clone();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                let _ = from_agent.send(m);
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

fn user() -> (String, u32, u32) {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let name = std::env::var("USER").unwrap_or_else(|_| "root".into());
    (name, uid, gid)
}

/// A launch of job `job_id` (allocation `token`) on node01 that appends a line to `marker`.
fn launch(job_id: u64, token: u64, marker: &std::path::Path, dir: &std::path::Path) -> Launch {
    let spec = JobSpec {
        name: format!("j{job_id}"),
        nodes: 1,
        ntasks: 1,
        cpus_per_task: 1,
        argv: vec!["/bin/sh".into(), "-c".into(), format!("echo ran >> {}", marker.display())],
        work_dir: dir.display().to_string(),
        submit_dir: dir.display().to_string(),
        stdout: "/dev/null".into(),
        stderr: "/dev/null".into(),
        env: vec![quorum_proto::api::EnvVar { name: "PATH".into(), value: "/usr/bin:/bin".into() }],
        ..Default::default()
    };
    Launch {
        job_id,
        token,
        user: user().0,
        nodelist: "node01".into(),
        num_nodes: 1,
        cpus: 1,
        mem_mb: 64,
        spec: Some(spec),
        ..Default::default()
    }
}

fn grant(l: &Launch, node: &str, expires_at_ms: u64) -> Grant {
    let (name, uid, gid) = user();
    Grant {
        job_id: l.job_id,
        token: l.token,
        user: name,
        uid,
        gid,
        node: node.into(),
        nodelist: l.nodelist.clone(),
        expires_at_ms,
        spec: launch_digest(l.spec.as_ref()),
    }
}

fn signed(signer: &Signer, l: Launch, g: &Grant) -> Launch {
    let (grant, signature) = signer.sign(g);
    Launch { grant, signature, ..l }
}

/// The exits the agent reports, answering its heartbeats with a lease as a leader does.
struct Agent {
    to_agent: mpsc::Sender<Result<ControllerMessage, Status>>,
    exits: mpsc::UnboundedReceiver<JobExit>,
}

impl Agent {
    async fn send(&self, l: Launch) {
        let m = ControllerMessage { msg: Some(controller_message::Msg::Launch(l)) };
        self.to_agent.send(Ok(m)).await.expect("the stream is open");
    }

    /// The next exit report of `job`, within `wait`.
    async fn exit_of(&mut self, job: u64, wait: Duration) -> Option<JobExit> {
        tokio::time::timeout(wait, async {
            loop {
                let e = self.exits.recv().await?;
                if e.job_id == job {
                    return Some(e);
                }
            }
        })
        .await
        .ok()
        .flatten()
    }
}

/// How the test's leader answers heartbeats: with this lease, while `answering` is on.
struct Answers {
    lease_ms: u64,
    answering: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Default for Answers {
    fn default() -> Answers {
        Answers { lease_ms: 30_000, answering: std::sync::Arc::new(true.into()) }
    }
}

async fn connect(
    dir: &std::path::Path,
    verifier: Verifier,
    policy: Answers,
) -> (Agent, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (from_tx, mut from_rx) = mpsc::unbounded_channel();
    let (to_tx, to_rx) = mpsc::channel(64);
    let leader = Leader { from_agent: from_tx, to_agent: Mutex::new(Some(to_rx)) };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(leader))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let spool = dir.join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let config = AgentConfig {
        switch_user: false,
        cgroups: false,
        launch_key: Some(verifier),
        clock_skew: Duration::from_secs(5),
        heartbeat: Duration::from_millis(200),
        tmp_base: dir.join("tmp"),
        ..AgentConfig::new("node01", vec![addr], spool)
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(quorum_agent::run(config, Box::new(quorum_agent::gpu::SimSource::new(0)), async {
        let _ = stop_rx.await;
    }));

    // The first message registers node01; heartbeats are answered, exits acknowledged and
    // handed to the test.
    let first = tokio::time::timeout(Duration::from_secs(10), from_rx.recv()).await.expect("the agent connects");
    assert!(
        matches!(first, Some(AgentMessage { msg: Some(agent_message::Msg::Register(ref r)) }) if r.node == "node01"),
        "{first:?}"
    );
    let (exits_tx, exits) = mpsc::unbounded_channel();
    let answers = to_tx.clone();
    tokio::spawn(async move {
        while let Some(m) = from_rx.recv().await {
            let reply = match m.msg {
                Some(agent_message::Msg::Heartbeat(h)) => {
                    if !policy.answering.load(std::sync::atomic::Ordering::SeqCst) {
                        continue;
                    }
                    controller_message::Msg::HeartbeatAck(HeartbeatAck { seq: h.seq, lease_ms: policy.lease_ms })
                }
                Some(agent_message::Msg::Exit(e)) => {
                    let ack = quorum_proto::agent::ExitAck { job_id: e.job_id };
                    let _ = exits_tx.send(e);
                    controller_message::Msg::ExitAck(ack)
                }
                _ => continue,
            };
            if answers.send(Ok(ControllerMessage { msg: Some(reply) })).await.is_err() {
                return;
            }
        }
    });
    (Agent { to_agent: to_tx, exits }, stop_tx)
}

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map(|s| s.lines().count()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_expired_misdirected_and_replayed_launches_on_the_stream_run_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(dir.path().join("pki"));
    layout.init().unwrap();
    let signer = Signer::load(&layout.launch_key()).unwrap();
    let verifier = Verifier::load(&layout.launch_pub()).unwrap();
    let (mut agent, _stop) = connect(dir.path(), verifier, Answers::default()).await;
    let later = now_ms() + 60_000;
    let marker = |job: u64| dir.path().join(format!("ran-{job}"));

    // Refused, each answered LAUNCH_FAILED, nothing run: a grant altered after signing (to run
    // as uid 0), none at all, one signed for another node, one expired.
    let l = launch(7, 3, &marker(7), dir.path());
    let mut forged = signed(&signer, l.clone(), &grant(&l, "node01", later));
    forged.grant =
        String::from_utf8(forged.grant).unwrap().replace(&format!("\"uid\":{}", user().1), "\"uid\":0").into_bytes();
    if forged.grant == signer.sign(&grant(&l, "node01", later)).0 {
        // The agent's own uid is 0: forge the gid field instead.
        forged.grant = String::from_utf8(forged.grant).unwrap().replace("\"gid\":0", "\"gid\":1").into_bytes();
    }
    let unsigned = launch(8, 3, &marker(8), dir.path());
    let l9 = launch(9, 3, &marker(9), dir.path());
    let elsewhere = signed(&signer, l9.clone(), &grant(&l9, "node02", later));
    let l10 = launch(10, 3, &marker(10), dir.path());
    let expired = signed(&signer, l10.clone(), &grant(&l10, "node01", now_ms() - 60_000));
    for (job, bad) in [(7, forged), (8, unsigned), (9, elsewhere), (10, expired)] {
        agent.send(bad).await;
        let exit = agent.exit_of(job, Duration::from_secs(10)).await.unwrap_or_else(|| panic!("job {job}: no answer"));
        assert_eq!(exit.kind, ExitKind::LaunchFailed as i32, "job {job}: {exit:?}");
        assert!(!marker(job).exists(), "job {job} ran");
    }

    // The signed launch runs, once.
    let l = launch(11, 5, &marker(11), dir.path());
    let good = signed(&signer, l.clone(), &grant(&l, "node01", later));
    agent.send(good.clone()).await;
    let exit = agent.exit_of(11, Duration::from_secs(20)).await.expect("the signed job ends");
    assert_eq!((exit.kind, exit.exit_code), (ExitKind::Exited as i32, 0), "{exit:?}");
    assert_eq!(lines(&marker(11)), 1, "the signed job ran once");

    // Replayed: the same launch again runs nothing (its end is reported again instead), and an
    // older allocation's launch, signed, is refused outright.
    agent.send(good).await;
    let older = launch(11, 4, &marker(11), dir.path());
    agent.send(signed(&signer, older.clone(), &grant(&older, "node01", later))).await;
    // A signed launch of another job behind them on the stream: once it has run and ended, the
    // agent has handled the two before it (in order), and anything they started has run too.
    let after = launch(12, 6, &marker(12), dir.path());
    agent.send(signed(&signer, after.clone(), &grant(&after, "node01", later))).await;
    let exit = agent.exit_of(12, Duration::from_secs(20)).await.expect("the job after them ends");
    assert_eq!(exit.kind, ExitKind::Exited as i32, "{exit:?}");
    assert_eq!(lines(&marker(12)), 1);
    assert_eq!(lines(&marker(11)), 1, "a replayed or older launch ran the job again");
}

/// A `--requeue` job's launch that the agent reads only after its lease ran out (its leader's
/// answers stopped: cut off, or the agent frozen with the launch waiting on its stream) starts
/// nothing, and its end says the lease expired: the leader may already have declared the node
/// DOWN and started the job elsewhere. A job without `--requeue` sent with it runs, as it runs
/// through any outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_jobs_launch_read_after_the_lease_ran_out_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(dir.path().join("pki"));
    layout.init().unwrap();
    let signer = Signer::load(&layout.launch_key()).unwrap();
    let verifier = Verifier::load(&layout.launch_pub()).unwrap();
    let answers = Answers { lease_ms: 400, ..Answers::default() };
    let answering = answers.answering.clone();
    let (mut agent, _stop) = connect(dir.path(), verifier, answers).await;
    let later = now_ms() + 60_000;
    let marker = |job: u64| dir.path().join(format!("ran-{job}"));

    // Under a lease, a --requeue job runs.
    let mut leased = launch(20, 1, &marker(20), dir.path());
    leased.spec.as_mut().unwrap().requeue = true;
    agent.send(signed(&signer, leased.clone(), &grant(&leased, "node01", later))).await;
    let exit = agent.exit_of(20, Duration::from_secs(20)).await.expect("the leased job ends");
    assert_eq!(exit.kind, ExitKind::Exited as i32, "{exit:?}");
    assert_eq!(lines(&marker(20)), 1);

    // Heartbeats go unanswered: the lease (400 ms from the last answered one's send) runs out
    // a second before the agent gives the stream up (3 heartbeats of 200 ms and a second).
    answering.store(false, std::sync::atomic::Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut late = launch(21, 1, &marker(21), dir.path());
    late.spec.as_mut().unwrap().requeue = true;
    agent.send(signed(&signer, late.clone(), &grant(&late, "node01", later))).await;
    let exit = agent.exit_of(21, Duration::from_secs(20)).await.expect("the late launch is answered");
    // Not a process started and killed at once by its supervisor (which is signal 9).
    assert_eq!((exit.kind, exit.signal), (ExitKind::LeaseExpired as i32, 0), "started, then killed: {exit:?}");
    let plain = launch(22, 1, &marker(22), dir.path());
    agent.send(signed(&signer, plain.clone(), &grant(&plain, "node01", later))).await;
    let exit = agent.exit_of(22, Duration::from_secs(20)).await.expect("the job without --requeue ends");
    assert_eq!(exit.kind, ExitKind::Exited as i32, "{exit:?}");
    assert_eq!(lines(&marker(22)), 1, "the job without --requeue ran");
    assert!(!marker(21).exists(), "a --requeue job started after its node's lease ran out");
}
