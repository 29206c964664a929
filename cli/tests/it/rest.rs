//! The REST API on the controllers' HTTP port, used as a portal or a script would: `curl` over
//! the cluster's TLS with real tokens of real Unix users; and checked against its own OpenAPI
//! document by schemathesis (from PyPI), which generates requests from the document and checks
//! every answer against it.

use crate::common;

use std::time::Duration;

use common::*;
use quorum_dev::cluster::DevOptions;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(30);

/// Asks the REST API as one user.
struct Rest {
    ca: String,
    auth: String,
}

impl Rest {
    fn new(ca: &str, token: &str) -> Rest {
        Rest { ca: ca.to_string(), auth: format!("Authorization: Bearer {token}") }
    }

    /// `method` of `url` (with `body` as JSON when given): the status and the JSON answer.
    fn call(&self, method: &str, url: &str, body: Option<&Value>) -> (u16, Value) {
        let text = body.map(|b| b.to_string());
        let mut args = vec!["--cacert", &self.ca, "-H", &self.auth, "-X", method];
        if let Some(text) = &text {
            args.extend(["-H", "Content-Type: application/json", "--data-binary", text]);
        }
        let (status, out) = curl(url, &args);
        let value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{method} {url}: not JSON ({e}): {out}"));
        (status, value)
    }

    /// `method` of `url`, which must answer 200: its JSON.
    fn ok(&self, method: &str, url: &str, body: Option<&Value>) -> Value {
        let (status, value) = self.call(method, url, body);
        assert_eq!(status, 200, "{method} {url}: {value}");
        value
    }

    fn get(&self, url: &str) -> Value {
        self.ok("GET", url, None)
    }
}

/// A job spec as JSON: `argv` in `dir`, with this test's PATH.
fn spec_json(argv: &[&str], dir: &std::path::Path, extra: Value) -> Value {
    let mut spec = json!({
        "name": "rest",
        "nodes": 1,
        "ntasks": 1,
        "cpus_per_task": 1,
        "argv": argv,
        "work_dir": dir.display().to_string(),
        "env": [{"name": "PATH", "value": std::env::var("PATH").unwrap_or_default()}],
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    spec
}

/// A directory every test user may write their jobs' output in.
fn shared_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod 777");
    dir
}

/// Waits until `GET url` answers a job in one of `states`; returns it.
async fn wait_job(rest: &Rest, url: &str, states: &[&str]) -> Value {
    wait_for(T, &format!("{url} in {states:?}"), || async {
        let job = rest.get(url)["job"].clone();
        states.contains(&job["state"].as_str().unwrap_or("")).then_some(job)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn rest_api_submits_reads_and_acts_on_jobs_as_their_owners() {
    let opts = DevOptions { operators: vec!["qrestop".into()], ..DevOptions::for_tests() };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let security = cluster.security.clone().expect("a secure dev cluster");
    let ca = security.ca().display().to_string();
    for user in ["qrestuser", "qrestother", "qrestop"] {
        ensure_user(user);
    }
    let (user, other, op) = (
        Rest::new(&ca, &security.token_for("qrestuser")),
        Rest::new(&ca, &security.token_for("qrestother")),
        Rest::new(&ca, &security.token_for("qrestop")),
    );
    let urls = cluster.http_urls();
    // Followers answer as the leader does: they forward.
    let leader = cluster.leader().expect("a leader");
    let follower = &urls[(leader + 1) % urls.len()];
    let base = format!("{follower}/api/v1");
    let dir = shared_dir();

    // The document describes what is served.
    let doc = user.get(&format!("{base}/openapi.json"));
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")), "{doc}");
    for path in ["/api/v1/jobs", "/api/v1/jobs/{id}", "/api/v1/plan", "/api/v1/nodes", "/api/v1/cluster"] {
        assert!(doc["paths"][path].is_object(), "{path} missing from the document");
    }

    // Without a credential, or with a forged one: refused, as JSON.
    let (status, body) = curl(&format!("{base}/jobs"), &["--cacert", &ca]);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("\"UNAUTHENTICATED\""), "{body}");
    let (status, body) = Rest::new(&ca, "forged.token.here").call("GET", &format!("{base}/jobs"), None);
    assert_eq!(status, 401, "{body}");

    // Submit, then read it back: it is the caller's, whatever the body says.
    let mut submit = json!({"spec": spec_json(&["sh", "-c", "echo hello from rest; sleep 60"], dir.path(), json!({"time_limit_s": 120})), "user": "root"});
    let answer = user.ok("POST", &format!("{base}/jobs"), Some(&submit));
    let running = answer["job_id"].as_u64().expect("a job id");
    assert!(running > 0, "{answer}");
    let job = wait_job(&user, &format!("{base}/jobs/{running}"), &["RUNNING"]).await;
    assert_eq!(job["user"], "qrestuser", "{job}");
    assert_eq!(job["spec"]["argv"][0], "sh", "{job}");

    // The same request id is the same job.
    submit["request_id"] = json!("rest-once");
    let first = user.ok(
        "POST",
        &format!("{base}/jobs"),
        Some(&json!({"spec": spec_json(&["true"], dir.path(), json!({})), "request_id": "rest-once"})),
    );
    let again = user.ok(
        "POST",
        &format!("{base}/jobs"),
        Some(&json!({"spec": spec_json(&["true"], dir.path(), json!({})), "request_id": "rest-once"})),
    );
    assert_eq!(first["job_id"], again["job_id"], "{first} {again}");
    assert_eq!(again["duplicate"], true, "{again}");

    // Bad input: named, as a 400 with a JSON body; nothing made.
    let (status, body) =
        user.call("POST", &format!("{base}/jobs"), Some(&json!({"spec": {"argv": ["true"], "partiton": "x"}})));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains("partiton")), "{body}");
    let (status, body) = user.call(
        "POST",
        &format!("{base}/jobs"),
        Some(&json!({"spec": spec_json(&["true"], dir.path(), json!({"partition": "nosuch"}))})),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains("nosuch")), "{body}");
    let (status, body) = user.call("GET", &format!("{base}/jobs?limit=many"), None);
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "INVALID_ARGUMENT", "{body}");
    let (status, body) = user.call("GET", &format!("{base}/jobs/x1"), None);
    assert_eq!(status, 400, "{body}");
    let (status, body) = user.call("GET", &format!("{base}/jobs/987654321"), None);
    assert_eq!(status, 404, "{body}");

    // Held, listed, released; another user may neither cancel nor hold it.
    let held = user.ok(
        "POST",
        &format!("{base}/jobs"),
        Some(&json!({"spec": spec_json(&["true"], dir.path(), json!({"hold": true}))})),
    );
    let held = held["job_id"].as_u64().expect("a job id");
    let page = user.get(&format!("{base}/jobs?state=PENDING,RUNNING&user=qrestuser"));
    let ids: Vec<u64> = page["jobs"].as_array().expect("jobs").iter().filter_map(|j| j["id"].as_u64()).collect();
    assert!(ids.contains(&held) && ids.contains(&running), "{ids:?}");
    let one = user.get(&format!("{base}/jobs?limit=1&user=qrestuser"));
    assert_eq!(one["jobs"].as_array().map(Vec::len), Some(1), "{one}");
    assert!(one["next_after"].as_u64().is_some_and(|n| n > 0), "a next page: {one}");
    let (status, body) = other.call("POST", &format!("{base}/jobs/{running}/cancel"), None);
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "PERMISSION_DENIED", "{body}");
    let (status, body) = other.call("POST", &format!("{base}/jobs/{held}/release"), None);
    assert_eq!(status, 403, "{body}");
    // Changed while pending (scontrol update); a raised limit is an operator's, an unknown key named.
    let changed = user.ok(
        "POST",
        &format!("{base}/jobs/{held}/update"),
        Some(&json!({"changes": {"JobName": "renamed", "TimeLimit": "-1"}})),
    );
    assert_eq!(changed["results"][0]["ok"], true, "{changed}");
    let shown = user.get(&format!("{base}/jobs/{held}"));
    assert_eq!(shown["job"]["name"], "renamed", "{shown}");
    let limit = shown["job"]["time_limit_s"].as_u64().expect("a limit");
    let raise = json!({"changes": {"TimeLimit": "+10"}});
    let (status, body) = user.call("POST", &format!("{base}/jobs/{held}/update"), Some(&raise));
    assert_eq!((status, body["code"].as_str()), (403, Some("PERMISSION_DENIED")), "{body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains("only an operator may raise")), "{body}");
    let (status, body) =
        user.call("POST", &format!("{base}/jobs/{held}/update"), Some(&json!({"changes": {"Features": "x"}})));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains("updating 'Features' is not supported")), "{body}");
    assert_eq!(user.get(&format!("{base}/jobs/{held}"))["job"]["time_limit_s"].as_u64(), Some(limit));
    user.ok("POST", &format!("{base}/jobs/{held}/release"), None);
    wait_job(&user, &format!("{base}/jobs/{held}"), &["COMPLETED"]).await;
    let (status, body) = user.call("POST", &format!("{base}/jobs/{held}/hold"), None);
    assert_eq!(status, 409, "an ended job cannot be held: {body}");

    // Its output, read on its node.
    let logs = wait_for(T, "the job's output", || async {
        let chunk = user.get(&format!("{base}/jobs/{running}/logs"));
        chunk["text"].as_str().is_some_and(|t| t.contains("hello from rest")).then_some(chunk)
    })
    .await;
    assert_eq!(logs["finished"], false, "{logs}");
    assert!(logs["next_offset"].as_u64().is_some_and(|n| n > 0), "{logs}");
    let (status, body) = other.call("GET", &format!("{base}/jobs/{running}/logs"), None);
    assert_eq!(status, 403, "another user's output: {body}");

    // Nodes, partitions, the cluster, and who the caller is.
    let nodes = user.get(&format!("{base}/nodes"));
    assert_eq!(nodes["nodes"].as_array().map(Vec::len), Some(2), "{nodes}");
    let partitions = user.get(&format!("{base}/partitions"));
    assert!(partitions["partitions"].as_array().is_some_and(|p| !p.is_empty()), "{partitions}");
    let members = user.get(&format!("{base}/cluster"));
    let members = members["members"].as_array().expect("members").clone();
    assert_eq!(members.len(), 3, "{members:?}");
    assert!(members.iter().all(|m| m["status"]["version"].is_string()), "{members:?}");
    let leaders = members.iter().filter(|m| m["status"]["role"] == "leader").count();
    assert_eq!(leaders, 1, "{members:?}");
    let me = user.get(&format!("{base}/whoami"));
    assert_eq!((me["user"].as_str(), me["proof"].as_str()), (Some("qrestuser"), Some("token")), "{me}");

    // A signal is one the document names; an empty or unknown one is refused and cancels nothing.
    for bad in ["", "SIGUSR1", "99"] {
        let (status, body) = user.call("POST", &format!("{base}/jobs/{running}/cancel?signal={bad}"), None);
        assert_eq!(status, 400, "signal={bad}: {body}");
        assert!(body["error"].as_str().is_some_and(|e| e.contains("is not one of")), "{body}");
    }
    let signalled = user.ok("POST", &format!("{base}/jobs/{running}/cancel?signal=CONT"), None);
    assert_eq!(signalled["ok"], true, "{signalled}");
    assert_eq!(user.get(&format!("{base}/jobs/{running}"))["job"]["state"], "RUNNING");

    // An operator cancels anyone's job.
    let cancelled = op.ok("POST", &format!("{base}/jobs/{running}/cancel"), None);
    assert_eq!(cancelled["was_running"], true, "{cancelled}");
    wait_job(&user, &format!("{base}/jobs/{running}"), &["CANCELLED"]).await;
    let accounted = user.get(&format!("{base}/accounting/jobs?user=qrestuser&state=CANCELLED"));
    assert!(accounted["jobs"].as_array().is_some_and(|j| j.iter().any(|j| j["id"] == running)), "{accounted}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_plan_shows_running_jobs_to_their_limit_and_reserved_ones_where_backfill_put_them() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let security = cluster.security.clone().expect("a secure dev cluster");
    let ca = security.ca().display().to_string();
    ensure_user("qrestuser");
    let rest = Rest::new(&ca, &security.token_for("qrestuser"));
    let base = format!("{}/api/v1", cluster.http_urls()[0]);
    let dir = shared_dir();

    // Every CPU of both nodes for two minutes, then a job that needs a whole node: it waits,
    // and backfill reserves it a node from when the first ends.
    let wide = json!({"nodes": 2, "ntasks": 2, "cpus_per_task": 8, "time_limit_s": 120});
    let wide = rest.ok(
        "POST",
        &format!("{base}/jobs"),
        Some(&json!({"spec": spec_json(&["sleep", "100"], dir.path(), wide)})),
    );
    let wide = wide["job_id"].as_u64().expect("a job id");
    let started = wait_job(&rest, &format!("{base}/jobs/{wide}"), &["RUNNING"]).await;
    let next = json!({"ntasks": 1, "cpus_per_task": 8, "time_limit_s": 60});
    let next = rest.ok("POST", &format!("{base}/jobs"), Some(&json!({"spec": spec_json(&["true"], dir.path(), next)})));
    let next = next["job_id"].as_u64().expect("a job id");
    let reserved = wait_for(T, "an expected start for the waiting job", || async {
        let job = rest.get(&format!("{base}/jobs/{next}"))["job"].clone();
        (job["expected_start_ms"].as_u64().unwrap_or(0) > 0).then_some(job)
    })
    .await;

    let plan = rest.get(&format!("{base}/plan"));
    let names: Vec<&str> = plan["nodes"].as_array().expect("nodes").iter().filter_map(|n| n["name"].as_str()).collect();
    assert_eq!(names.len(), 2, "{plan}");
    let jobs = plan["jobs"].as_array().expect("jobs");
    let find =
        |id: u64| jobs.iter().find(|j| j["id"] == id).unwrap_or_else(|| panic!("job {id} not in the plan {plan}"));
    let w = find(wide);
    assert_eq!(w["state"], "RUNNING");
    assert_eq!(w["start_ms"], started["start_time_ms"], "{w}");
    assert_eq!(w["end_ms"].as_u64(), started["start_time_ms"].as_u64().map(|s| s + 120_000), "{w}");
    assert_eq!(w["nodes"].as_array().map(Vec::len), Some(2), "{w}");
    let n = find(next);
    assert_eq!(n["state"], "PENDING");
    assert_eq!(n["start_ms"], reserved["expected_start_ms"], "{n} {reserved}");
    assert_eq!(n["end_ms"].as_u64(), reserved["expected_start_ms"].as_u64().map(|s| s + 60_000), "{n}");
    assert_eq!(n["nodes"].as_array().map(Vec::len), Some(1), "{n}");
    assert!(names.contains(&n["nodes"][0].as_str().unwrap_or("")), "{n}");
    assert!(plan["now_ms"].as_u64().is_some_and(|now| now >= started["start_time_ms"].as_u64().unwrap_or(0)), "{plan}");
    cluster.shutdown().await;
}

/// schemathesis generates requests for every operation of the document (its examples, and
/// values the schemas allow) and checks each answer: no server error, and a status, content
/// type and body the document declares for it.
#[tokio::test(flavor = "multi_thread")]
async fn rest_api_answers_as_its_openapi_document_says() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let security = cluster.security.clone().expect("a secure dev cluster");
    ensure_user("qrestfuzz");
    let python = pypi_python("schemathesis", "4.32.5", "schemathesis");
    let schemathesis = std::path::Path::new(&python).with_file_name("schemathesis");
    let base = cluster.http_urls()[0].clone();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let report = dir.path().join("report");
    let bearer = format!("Authorization: Bearer {}", security.token_for("qrestfuzz"));
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/schemathesis.toml");
    let out = tokio::process::Command::new(&schemathesis)
        .args(["--no-color", "--config-file", config, "run"])
        .arg(format!("{base}/api/v1/openapi.json"))
        .args(["--url", &base, "--header", &bearer, "--tls-verify"])
        .arg(security.ca())
        .args(["--max-examples", "30", "--seed", "7", "--workers", "2"])
        .args(["--report", "junit", "--report-dir"])
        .arg(&report)
        .current_dir(dir.path())
        .output()
        .await
        .expect("schemathesis runs");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "schemathesis found answers that break the document:\n{said}");
    // It tested every operation of the document, and followed the links from a submitted job.
    let count = |label: &str| {
        let line =
            said.lines().find_map(|l| l.trim().strip_prefix(label)).unwrap_or_else(|| panic!("no '{label}' in {said}"));
        line.trim().split('/').next().and_then(|n| n.trim().parse::<usize>().ok()).unwrap_or(0)
    };
    let (selected, tested) = (count("Selected:"), count("Tested:"));
    assert!(selected >= 20 && tested == selected, "{selected} selected, {tested} tested:\n{said}");
    assert!(!said.contains("API Links:    0 covered"), "no link was followed:\n{said}");
    cluster.shutdown().await;
}
