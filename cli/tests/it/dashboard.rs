//! The dashboard in a real browser: headless Chromium from Debian's packages, driven through
//! chromedriver by Selenium (from PyPI), over the replica's TLS with a user's token
//! (`dashboard/drive.py` says what it checks). The plan's screenshot is kept under the target
//! directory (`tmp/dashboard-plan.png`).

use crate::common;

use std::time::Duration;

use common::*;
use quorum_dev::cluster::DevOptions;
use quorum_proto::api;

const T: Duration = Duration::from_secs(30);

/// Every page is served with a policy that allows no inline script, and the assets carry no data.
#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_is_served_from_the_binary_under_a_strict_policy() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let security = cluster.security.clone().expect("a secure dev cluster");
    let ca = security.ca().display().to_string();
    let base = cluster.http_urls()[0].clone();
    for (path, kind) in [("/", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/style.css", "text/css")] {
        let (status, headers) = curl(&format!("{base}{path}"), &["--cacert", &ca, "-D", "-", "-o", "/dev/null"]);
        assert_eq!(status, 200, "{path}: {headers}");
        let headers = headers.to_ascii_lowercase();
        assert!(headers.contains(&format!("content-type: {kind}")), "{path}: {headers}");
        assert!(
            headers.contains("content-security-policy: default-src 'none'; script-src 'self'"),
            "{path}: {headers}"
        );
        assert!(headers.contains("x-content-type-options: nosniff"), "{path}: {headers}");
    }
    let (_, page) = curl(&format!("{base}/"), &["--cacert", &ca]);
    assert!(page.contains("<script src=\"/ui/app.js\" defer></script>"), "{page}");
    assert!(!page.contains("<script>"), "no inline script: {page}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_sees_the_queue_and_the_plan_and_cancels_from_the_page_in_chromium() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let root = client(&cluster.addrs);
    wait_ready(&cluster, &root, 2).await;
    let security = cluster.security.clone().expect("a secure dev cluster");
    let user = "qdashuser";
    let c = client_as(&cluster.addrs, user);
    let dir = tempfile::tempdir().expect("a temporary directory");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod 777");
    }

    // Every CPU of both nodes for two minutes, and a job that waits for a whole node: backfill
    // reserves it one from when the first ends.
    let mut wide = spec(&["sh", "-c", "echo hello from the dashboard; sleep 100"], dir.path());
    (wide.nodes, wide.ntasks, wide.cpus_per_task, wide.time_limit_s) = (2, 2, 8, 120);
    let running = submit(&c, wide).await;
    wait_state(&c, running, &["RUNNING"], T).await;
    let mut next = spec(&["true"], dir.path());
    (next.cpus_per_task, next.time_limit_s) = (8, 60);
    let reserved = submit(&c, next).await;
    // What `quorum queue --start` shows: the listing's expected start.
    let expected_start_ms = wait_for(T, "an expected start for the waiting job", || async {
        let req = api::ListJobsRequest { job_ids: vec![reserved], ..Default::default() };
        let page = c
            .call(|mut cl| {
                let req = req.clone();
                async move { cl.list_jobs(req).await }
            })
            .await
            .ok()?;
        page.jobs.first().map(|j| j.expected_start_ms).filter(|s| *s > 0)
    })
    .await;

    // An operator's maintenance window on node01, from five minutes on: the plan draws it.
    let maint = api::ReservationRequest {
        name: "maint".into(),
        start_ms: Some(now_ms() + 300_000),
        duration_s: Some(600),
        nodes: Some("node01".into()),
        users: Some("root".into()),
        flags: Some("MAINT".into()),
        ..Default::default()
    };
    let made = root
        .call(|mut cl| {
            let req = maint.clone();
            async move { cl.create_reservation(req).await }
        })
        .await
        .expect("an operator makes a reservation");
    let maint = made.reservation.expect("the reservation as made");

    let python = pypi_python("selenium", "4.40.0", "selenium");
    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-plan.png");
    let _ = std::fs::remove_file(&screenshot);
    let args = serde_json::json!({
        "url": cluster.http_urls()[0],
        "token": security.token_for(user),
        "user": user,
        "running": running,
        "reserved": reserved,
        "expected_start_ms": expected_start_ms,
        "maint_start_ms": maint.start_ms,
        "maint_end_ms": maint.end_ms,
        "screenshot": screenshot,
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dashboard/drive.py");
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .arg(args.to_string())
        .output()
        .await
        .expect("the browser driver runs");
    let (said, why) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the dashboard is not as it should be:\n{why}\n{said}");
    let seen: serde_json::Value = serde_json::from_str(said.trim()).expect("the driver's report is JSON");
    assert_eq!(seen["job_state"], "RUNNING", "{seen}");
    assert_eq!(
        (seen["nodes"].as_u64(), seen["replicas"].as_u64(), seen["leaders"].as_u64()),
        (Some(2), Some(3), Some(1)),
        "{seen}"
    );

    // The cancel from the page cancelled it.
    let j = wait_state(&c, reserved, &["CANCELLED"], T).await;
    assert_eq!(j.cancelled_by, user, "{j:?}");
    let png = std::fs::read(&screenshot).expect("the plan's screenshot is kept");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 5_000, "{} bytes", png.len());
    cluster.shutdown().await;
}
