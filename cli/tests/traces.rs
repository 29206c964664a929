//! One submit is one trace: a client's span, the follower it asked, the leader's submit, the
//! Raft commit, the scheduling cycle that started the job, its launch, and the job's run on its
//! node, each with the job's id. The spans go over OTLP (gRPC) to a collector in this test, which
//! keeps what it receives, as the OpenTelemetry Collector's receiver would.

#[path = "it/common/mod.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use quorum_dev::cluster::DevOptions;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

const T: Duration = Duration::from_secs(30);

/// A span as the collector received it.
#[derive(Clone, Debug)]
struct Seen {
    trace: Vec<u8>,
    span: Vec<u8>,
    parent: Vec<u8>,
    name: String,
    job_id: Option<i64>,
    service: String,
}

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Seen>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut seen = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        for resource in req.into_inner().resource_spans {
            let attribute = |attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue], key: &str| {
                attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()?.value.clone())
            };
            let service = match resource.resource.as_ref().and_then(|r| attribute(&r.attributes, "service.name")) {
                Some(Value::StringValue(s)) => s,
                _ => String::new(),
            };
            for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                let job_id = match attribute(&span.attributes, "job_id") {
                    Some(Value::IntValue(i)) => Some(i),
                    Some(Value::StringValue(s)) => s.parse().ok(),
                    _ => None,
                };
                seen.push(Seen {
                    trace: span.trace_id,
                    span: span.span_id,
                    parent: span.parent_span_id,
                    name: span.name,
                    job_id,
                    service: service.clone(),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_submit_is_one_trace_from_the_client_to_the_job_on_its_node() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port for the collector");
    let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
    let service = TraceServiceServer::new(collector.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    // This process is the client, the replicas and the agents: one exporter for all of them.
    let (layer, provider) = quorum_proto::telemetry::otlp_layer("quorum-dev", &endpoint).expect("the exporter");
    tracing_subscriber::registry().with(tracing_subscriber::EnvFilter::new("info,openraft=off")).with(layer).init();

    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let leader = cluster.leader().expect("a leader");
    let follower = (leader + 1) % cluster.addrs.len();
    let through_follower = client(&[cluster.addrs[follower].clone()]);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let asked = tracing::info_span!("client_submit");
    let id = submit(&through_follower, spec(&["true"], dir.path())).instrument(asked.clone()).await;
    drop(asked);
    wait_state(&c, id, &["COMPLETED"], T).await;

    let wanted = ["client_submit", "submit", "raft_commit", "schedule", "launch", "job"];
    let trace = wait_for(T, "every span of the submit's trace", || {
        let provider = provider.clone();
        let spans = collector.spans.clone();
        async move {
            tokio::task::spawn_blocking(move || provider.force_flush()).await.ok()?.ok()?;
            let spans = spans.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let root = spans.iter().find(|s| s.name == "client_submit")?;
            let trace: Vec<Seen> = spans.iter().filter(|s| s.trace == root.trace).cloned().collect();
            let names: Vec<&str> = trace.iter().map(|s| s.name.as_str()).collect();
            let submits = names.iter().filter(|n| **n == "submit").count();
            (wanted.iter().all(|w| names.contains(w)) && submits == 2).then_some(trace)
        }
    })
    .await;

    // Each span's parent is the one before it: client, follower, leader, then the leader's
    // commit and its scheduling of the job, the launch, and the job on its node.
    let by_name = |name: &str| trace.iter().filter(|s| s.name == name).collect::<Vec<_>>();
    let client_span = by_name("client_submit")[0];
    let follower_submit = trace.iter().find(|s| s.name == "submit" && s.parent == client_span.span);
    let follower_submit =
        follower_submit.unwrap_or_else(|| panic!("the follower's submit continues the client's: {trace:#?}"));
    let leader_submit = trace.iter().find(|s| s.name == "submit" && s.parent == follower_submit.span);
    let leader_submit =
        leader_submit.unwrap_or_else(|| panic!("the leader's submit continues the follower's: {trace:#?}"));
    let commit = by_name("raft_commit")[0];
    assert_eq!(commit.parent, leader_submit.span, "{trace:#?}");
    let schedule = by_name("schedule")[0];
    assert_eq!(schedule.parent, leader_submit.span, "{trace:#?}");
    let launch = by_name("launch")[0];
    assert_eq!(launch.parent, schedule.span, "{trace:#?}");
    let job = by_name("job")[0];
    assert_eq!(job.parent, launch.span, "{trace:#?}");
    // The job's id on every span of the controllers and the agent.
    for span in trace.iter().filter(|s| s.name != "client_submit") {
        assert_eq!(span.job_id, Some(id as i64), "{span:?}");
        assert_eq!(span.service, "quorum-dev", "{span:?}");
    }
    cluster.shutdown().await;
}

/// `quorum-controller --otlp-endpoint`: a replica process exports its spans (here with its log
/// at `warn`, which must not hold them back).
#[tokio::test(flavor = "multi_thread")]
async fn a_controller_process_exports_its_spans_to_the_endpoint_it_is_given() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port for the collector");
    let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = dir.path().join("c.toml");
    let listen = format!("127.0.0.1:{}", quorum_dev::ports::free_port().expect("a port"));
    let data = dir.path().join("data");
    let toml = format!(
        "id = 1\nlisten = \"{listen}\"\ndata_dir = \"{}\"\n[[replicas]]\nid = 1\naddr = \"{listen}\"\n\
         [[partitions]]\nname = \"batch\"\nnodes = \"n1\"\ndefault = true\n[security]\ninsecure = true\n",
        data.display()
    );
    std::fs::write(&config, toml).expect("writing the configuration");
    let mut controller = tokio::process::Command::new(sibling_binary("quorum-controller"))
        .arg("--config")
        .arg(&config)
        .args(["--otlp-endpoint", &endpoint])
        .env("RUST_LOG", "warn")
        .stdout(std::fs::File::create(dir.path().join("log")).expect("its log"))
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("quorum-controller starts");
    let security =
        quorum_client::client::Security { tls: None, proof: quorum_client::client::Proof::Claim("root:0:0".into()) };
    let c = quorum_client::client::Client::new(vec![listen.to_string()], security).expect("a client");
    let mut held = spec(&["true"], dir.path());
    held.hold = true;
    let id = wait_for(T, "the replica to take a submit", || {
        let held = held.clone();
        let c = &c;
        async move {
            match submit_with_id(c, held, "traced-once").await {
                Ok(r) => Some(r.job_id),
                Err(e) => {
                    eprintln!("submit: {e}");
                    None
                }
            }
        }
    })
    .await;
    // Exported in its batch (within the exporter's 5 s delay), then it stops.
    let exported = wait_for(Duration::from_secs(20), "the submit's spans at the collector", || async {
        let spans = collector.spans.lock().unwrap_or_else(|p| p.into_inner()).clone();
        spans.iter().any(|s| s.name == "raft_commit" && s.job_id == Some(id as i64)).then_some(spans)
    })
    .await;
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(controller.id().expect("it runs") as i32, libc::SIGTERM) };
    let stopped = tokio::time::timeout(T, controller.wait()).await.expect("it stops within 30 s");
    assert!(stopped.is_ok(), "{stopped:?}");
    let spans = exported;
    let submit = spans.iter().find(|s| s.name == "submit" && s.job_id == Some(id as i64));
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    let submit = submit.unwrap_or_else(|| panic!("no submit span of job {id} among {spans:#?}; its log: {log}"));
    assert_eq!(submit.service, "quorum-controller", "{submit:?}");
    let commit = spans.iter().find(|s| s.name == "raft_commit" && s.trace == submit.trace);
    assert!(commit.is_some_and(|c| c.parent == submit.span), "{spans:#?}");
}
