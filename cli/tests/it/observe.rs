//! The controllers' HTTP port, scraped as Prometheus and an operator would: real TLS with the
//! cluster's CA, real tokens, `curl`.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use quorum_dev::cluster::DevOptions;

const T: Duration = Duration::from_secs(30);

/// The metric families of an OpenMetrics text as Prometheus's own Python client reads it (its
/// strict parser refuses what is not OpenMetrics): `name type` each, one a line.
fn families_by_the_reference_parser(text: &str) -> String {
    use std::io::Write;
    let python = pypi_python("prometheus-client", "0.21.1", "prometheus_client.openmetrics.parser");
    let mut child = std::process::Command::new(python)
        .args([
            "-c",
            "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as read\n\
             for f in read(sys.stdin.read()): print(f.name, f.type)",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the venv's python starts");
    child.stdin.take().expect("stdin is piped").write_all(text.as_bytes()).expect("writing to the parser");
    let out = child.wait_with_output().expect("the parser exits");
    assert!(out.status.success(), "the OpenMetrics parser refused it: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("metric names are UTF-8")
}

/// The samples of an OpenMetrics text, by name and labels as written (`name{a="b"}`).
fn samples(text: &str) -> BTreeMap<String, f64> {
    assert!(text.trim_end().ends_with("# EOF"), "an OpenMetrics text ends with # EOF: {text}");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("a sample without a value: {l}"));
            (key.to_string(), value.parse().unwrap_or_else(|_| panic!("not a number in {l}")))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_show_the_cluster_to_operators_and_allowed_scrapers_only() {
    let opts = DevOptions {
        operators: vec!["qop".into()],
        // Loopback has every 127.x address: 127.0.0.2 stands for the scraper's network.
        metrics_allow: vec!["127.0.0.2/32".into()],
        ..DevOptions::for_tests()
    };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let running = submit(&c, spec(&["sleep", "60"], dir.path())).await;
    let held = submit(&c, api_held(spec(&["true"], dir.path()))).await;
    wait_state(&c, running, &["RUNNING"], T).await;

    let security = cluster.security.clone().expect("a secure dev cluster");
    let ca = security.ca().display().to_string();
    let urls = cluster.metrics_urls();
    assert_eq!(urls.len(), 3, "{urls:?}");
    assert!(urls.iter().all(|u| u.starts_with("https://127.0.0.1:")), "{urls:?}");
    let url = &urls[0];
    let bearer = |user: &str| format!("Authorization: Bearer {}", security.token_for(user));

    // Without a credential, with a user's, and over plaintext: refused.
    let (status, body) = curl(url, &["--cacert", &ca]);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("no credential"), "{body}");
    ensure_user("qmetricsuser");
    let (status, body) = curl(url, &["--cacert", &ca, "-H", &bearer("qmetricsuser")]);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("for operators and administrators"), "{body}");
    let (status, _) = curl(&url.replace("https://", "http://"), &[]);
    assert_ne!(status, 200, "plaintext to a TLS port");
    let (status, body) = curl(url, &["--cacert", &ca, "-H", "Authorization: Bearer forged.token.here"]);
    assert_eq!(status, 401, "{body}");

    // An operator, over HTTP/1.1 and HTTP/2 alike; an allowed scraper without a credential.
    ensure_user("qop");
    let mut by_replica = Vec::new();
    let mut families = std::collections::BTreeSet::new();
    for u in &urls {
        for http in ["--http1.1", "--http2"] {
            let (status, body) = curl(u, &["--cacert", &ca, http, "-H", &bearer("qop")]);
            assert_eq!(status, 200, "{u} {http}: {body}");
        }
        let (status, body) = curl(u, &["--cacert", &ca, "--interface", "127.0.0.2"]);
        assert_eq!(status, 200, "{u} from an allowed range: {body}");
        by_replica.push(samples(&body));
        let read = families_by_the_reference_parser(&body);
        for family in [
            "quorum_jobs gauge",
            "quorum_scheduler_cycle_seconds histogram",
            "quorum_raft_leader_changes counter",
            "quorum_snapshot_build_seconds histogram",
            "quorum_snapshot_bytes gauge",
        ] {
            assert!(read.lines().any(|l| l == family), "{family} not among {read}");
        }
        families.extend(read.lines().filter_map(|l| l.split(' ').next()).map(str::to_string));
    }
    // The Grafana dashboard in deploy/ asks only for what the replicas serve.
    let dashboard = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/quorum.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dashboard).unwrap()).unwrap();
    let exprs: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap()))
        .collect();
    assert!(exprs.len() >= 16, "{exprs:?}");
    // So do the alerting rules the runbook explains, and each has its section there.
    let alerts =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus/alerts.yml")).unwrap();
    let runbook = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/RUNBOOK.md")).unwrap();
    let alert_exprs: Vec<&str> = alerts.lines().filter_map(|l| l.trim().strip_prefix("expr:")).map(str::trim).collect();
    let names: Vec<&str> = alerts.lines().filter_map(|l| l.trim().strip_prefix("- alert:")).map(str::trim).collect();
    assert!(alert_exprs.len() >= 10 && alert_exprs.len() == names.len(), "{alert_exprs:?} {names:?}");
    for name in &names {
        assert!(runbook.contains(&format!("### {name}\n")), "the runbook does not explain {name}");
    }
    for expr in exprs.into_iter().chain(alert_exprs) {
        for (at, _) in expr.match_indices("quorum_") {
            let name: String = expr[at..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            let family = ["_bucket", "_count", "_sum", "_total"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| families.contains(*f)))
                .unwrap_or(&name);
            assert!(
                families.contains(family),
                "the dashboard or an alert asks for {name} ({expr}), which no replica serves"
            );
        }
    }

    // Every replica shows the same cluster: the running job, the held one, the nodes and
    // what is allocated.
    for m in &by_replica {
        assert_eq!(m.get(r#"quorum_jobs{state="RUNNING",partition="gpu"}"#), Some(&1.0), "{m:?}");
        let held_reason =
            m.iter().find(|(k, _)| k.starts_with(r#"quorum_jobs_pending{partition="gpu",reason="JobHeld"#));
        assert_eq!(held_reason.map(|(_, v)| *v), Some(1.0), "{m:?}");
        assert_eq!(m.get(r#"quorum_user_jobs{user="root",account="root",state="RUNNING"}"#), Some(&1.0), "{m:?}");
        let nodes: f64 = m.iter().filter(|(k, _)| k.starts_with("quorum_nodes{")).map(|(_, v)| v).sum();
        assert_eq!(nodes, 2.0, "{m:?}");
        assert_eq!(m.get("quorum_cpus"), Some(&16.0), "{m:?}");
        assert_eq!(m.get("quorum_cpus_allocated"), Some(&1.0), "{m:?}");
        assert_eq!(m.get(r#"quorum_gpus{type="h100"}"#), Some(&8.0), "{m:?}");
    }
    // One leader; it alone has agents and scheduling cycles, and counted both submits.
    let leaders: Vec<_> = by_replica
        .iter()
        .filter(|m| m.iter().any(|(k, v)| k.starts_with("quorum_raft_is_leader{") && *v == 1.0))
        .collect();
    assert_eq!(leaders.len(), 1, "{by_replica:?}");
    let leader = leaders[0];
    assert_eq!(leader.get("quorum_agents_connected"), Some(&2.0));
    assert!(leader["quorum_scheduler_cycle_seconds_count"] >= 1.0, "{leader:?}");
    assert!(leader["quorum_scheduler_planned_starts_total"] >= 1.0, "{leader:?}");
    assert_eq!(leader.get("quorum_submit_seconds_count"), Some(&2.0), "{leader:?}");
    // The running job's launch reached its node's agent.
    assert!(leader["quorum_dispatch_seconds_count"] >= 1.0, "{leader:?}");
    assert_eq!(leader.get("quorum_scheduler_backfill_starts_total"), Some(&0.0), "{leader:?}");
    for m in &by_replica {
        let of = |name: &str| m.iter().find(|(k, _)| k.starts_with(name)).map(|(_, v)| *v);
        assert_eq!(of("quorum_rocksdb_write_stopped{"), Some(0.0), "{m:?}");
        assert!(of("quorum_raft_log_entries{").is_some_and(|n| n >= 1.0), "{m:?}");
        assert!(of("quorum_rocksdb_memtable_bytes{").is_some_and(|n| n > 0.0), "{m:?}");
    }
    let healthy =
        leader.iter().filter(|(k, v)| k.starts_with("quorum_gpu_health{") && k.contains(r#"state="ok""#) && **v == 1.0);
    assert_eq!(healthy.count(), 8, "{leader:?}");
    let terms: Vec<f64> = by_replica
        .iter()
        .map(|m| m.iter().find(|(k, _)| k.starts_with("quorum_raft_term{")).map(|(_, v)| *v).expect("a term"))
        .collect();
    assert!(terms.iter().all(|t| *t == terms[0] && *t >= 1.0), "{terms:?}");

    cancel(&c, running).await;
    cancel(&c, held).await;
}

/// A spec submitted held (`--hold`).
fn api_held(mut s: quorum_proto::api::JobSpec) -> quorum_proto::api::JobSpec {
    s.hold = true;
    s
}

/// `quorum-controller --log-format json`: every line a JSON object a log collector can read,
/// with the event's fields as fields (here a one-replica insecure cluster that starts and stops).
#[test]
fn a_controller_logs_json_lines_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    let listen = format!("127.0.0.1:{}", quorum_dev::ports::free_port().unwrap());
    std::fs::write(
        &config,
        format!(
            "id = 1\nlisten = \"{listen}\"\ndata_dir = \"{}\"\n[[replicas]]\nid = 1\naddr = \"{listen}\"\n\
             [security]\ninsecure = true\n[http]\nlisten = \"127.0.0.1:0\"\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(sibling_binary("quorum-controller"))
        .args(["--config", config.to_str().expect("a temporary path is UTF-8"), "--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("quorum-controller starts");
    // Its lines as they come, until it says it started; then it is stopped, and says so.
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout is piped"));
    let mut text = String::new();
    let began = std::time::Instant::now();
    while !text.contains("controller started") {
        assert!(began.elapsed() < T, "no 'controller started' within {T:?}: {text}");
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut out, &mut line).expect("reading its stdout") == 0 {
            panic!("it exited before it started: {text}");
        }
        text.push_str(&line);
    }
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    std::io::Read::read_to_string(&mut out, &mut text).expect("reading its stdout");
    child.wait().expect("quorum-controller exits");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let started = lines
        .iter()
        .find(|l| l["fields"]["message"] == "controller started")
        .unwrap_or_else(|| panic!("no 'controller started' among {text}"));
    assert_eq!(started["level"], "INFO");
    assert_eq!(started["fields"]["replica"], 1);
    let http = started["fields"]["http"].as_str().expect("the HTTP port's address");
    assert!(http.starts_with("127.0.0.1:"), "{started}");
    assert!(lines.iter().any(|l| l["fields"]["message"] == "shutting down"), "{text}");
}

/// An agent's own `/metrics`: its jobs, what each uses now, its GPUs; refused to addresses
/// outside `--metrics-allow`.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_shows_its_jobs_and_gpus_to_allowed_scrapers() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let agent = cluster.agent(0).expect("an agent in this process");
    let node = agent.config.name.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let url = format!("http://{}/metrics", listener.local_addr().expect("its address"));
    let allow = vec![quorum_model::Cidr::parse("127.0.0.1/32").expect("a range")];
    let exposure = quorum_agent::metrics::Exposure { allow: allow.clone(), per_job: true };
    tokio::spawn(quorum_agent::metrics::serve(agent.clone(), listener, exposure));
    // Without --metrics-jobs, the node's totals only: no job's usage by its id.
    let totals_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let totals_url = format!("http://{}/metrics", totals_listener.local_addr().expect("its address"));
    let totals = quorum_agent::metrics::Exposure { allow, per_job: false };
    tokio::spawn(quorum_agent::metrics::serve(agent.clone(), totals_listener, totals));

    let dir = tempfile::tempdir().unwrap();
    let mut s = spec(&["sh", "-c", "x=0; while :; do x=$((x+1)); done"], dir.path());
    (s.nodelist, s.gpus_per_node) = (vec![node.clone()], 1);
    let id = submit(&c, s).await;
    wait_state(&c, id, &["RUNNING"], T).await;
    let job = format!(r#"job="{id}""#);
    let m = wait_for(T, "the job's CPU time and the GPUs' health in the agent's metrics", || async {
        let (status, body) = curl(&url, &[]);
        assert_eq!(status, 200, "{body}");
        let m = samples(&body);
        let cpu = m.get(&format!("quorum_agent_job_cpu_seconds{{{job}}}")).copied().unwrap_or(0.0);
        let gpus = m.iter().filter(|(k, v)| k.starts_with("quorum_agent_gpu_health{") && **v == 1.0).count();
        (cpu >= 1.0 && gpus == 4).then_some((m, body))
    })
    .await;
    let (m, body) = m;
    let read = families_by_the_reference_parser(&body);
    for family in ["quorum_agent_jobs gauge", "quorum_agent_job_resident_bytes gauge", "quorum_agent_gpu_health gauge"]
    {
        assert!(read.lines().any(|l| l == family), "{family} not among {read}");
    }
    assert_eq!(m.get("quorum_agent_jobs"), Some(&1.0), "{m:?}");
    assert!(m[&format!("quorum_agent_job_resident_bytes{{{job}}}")] > 0.0, "{m:?}");
    assert!(m[&format!("quorum_agent_job_processes{{{job}}}")] >= 1.0, "{m:?}");
    assert_eq!(m.get(r#"quorum_agent_gpu_health{gpu="0",state="ok"}"#), Some(&1.0), "{m:?}");
    assert!(m.keys().any(|k| k.starts_with("quorum_agent_gpu_temperature_celsius{")), "{m:?}");

    let (status, body) = curl(&totals_url, &[]);
    assert_eq!(status, 200, "{body}");
    let t = samples(&body);
    assert!(!body.contains(&job) && !body.contains("quorum_agent_job_cpu_seconds"), "per-job usage shown: {body}");
    assert!(t.get("quorum_agent_jobs_cpu_seconds").is_some_and(|v| *v >= 1.0), "{t:?}");
    assert!(t.get("quorum_agent_jobs_resident_bytes").is_some_and(|v| *v > 0.0), "{t:?}");

    let (status, body) = curl(&url, &["--interface", "127.0.0.2"]);
    assert_eq!(status, 403, "from an address not allowed: {body}");
    cancel(&c, id).await;
    cluster.shutdown().await;
}
