//! Hostile input, as the never-twice issue found it: each request is refused with an error that
//! names what is wrong (or, for the large scripts, accepted without wedging anything), and the
//! cluster goes on serving. The test prints the table that `benches/RESULTS.md` shows.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use quorum_dev::cluster::DevOptions;
use quorum_proto::api;

const T: Duration = Duration::from_secs(60);

/// The highest Raft term any running replica has seen.
fn term(cluster: &quorum_dev::cluster::DevCluster) -> u64 {
    (0..3).filter_map(|i| cluster.controller(i)).map(|c| c.replica.raft.metrics().borrow().current_term).max().unwrap()
}

/// A batch script of about `bytes` bytes that does nothing.
fn big_script(bytes: usize) -> String {
    let line = format!("# {}\n", "x".repeat(77));
    let mut script = String::from("#!/bin/bash\n");
    while script.len() + line.len() < bytes {
        script.push_str(&line);
    }
    script + "true\n"
}

async fn refused(c: &quorum_client::client::Client, spec: api::JobSpec, request_id: &str) -> String {
    match submit_with_id(c, spec, request_id).await {
        Ok(r) => panic!("accepted as job {}", r.job_id),
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
            status.message().to_string()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_is_refused_with_its_error_while_the_cluster_keeps_serving() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let mut table: Vec<(String, String)> = Vec::new();
    let small = || spec(&["true"], dir.path());

    // Thirty concurrent submits of a 3.9 MB script: all accepted, no election storm, and a
    // one-line submit right after is answered.
    let term_before = term(&cluster);
    let script = big_script(3_900_000);
    let started = Instant::now();
    let submits = (0..30).map(|i| {
        let (c, mut s) = (client(&cluster.addrs), small());
        s.script = script.clone();
        s.argv.clear();
        s.hold = true;
        s.name = format!("big{i}");
        async move { submit_with_id(&c, s, &format!("big-{i}")).await }
    });
    let answers =
        tokio::time::timeout(T, futures::future::join_all(submits)).await.expect("the large submits answered");
    let big_ids: Vec<u64> = answers.into_iter().map(|a| a.expect("a 3.9 MB script is accepted").job_id).collect();
    let took = started.elapsed();
    let one = tokio::time::timeout(T, async { submit(&c, small()).await }).await.expect("a one-line submit answered");
    wait_state(&c, one, &["COMPLETED"], T).await;
    let terms = term(&cluster) - term_before;
    // A storm (the issue saw the term climb by a hundred) fails; one election may come from
    // three replicas on two cores decoding 117 MB at once.
    assert!(terms <= 3, "{terms} elections while the large submits were replicated");
    table.push((
        "30 concurrent submits of a 3.9 MB script".into(),
        format!("accepted in {:.1} s; {terms} elections; a one-line submit after them ran", took.as_secs_f64()),
    ));

    // Listings page: every user's `quorum queue` works with those jobs pending, and their owner
    // still reads the whole script.
    let listed = quorum_as(&cluster.controllers_env(), Some("bob"), dir.path(), &["queue"]).success();
    assert!(listed.contains("big29"), "{listed}");
    let whole = job(&c, big_ids[0]).await;
    assert_eq!(whole.spec.unwrap().script.len(), script.len());
    table.push((
        "`quorum queue` with those 30 jobs pending (117 MB of scripts)".into(),
        "lists them (pages of at most 2 MiB; a script's first line only)".into(),
    ));

    // Counts and sizes that overflowed or wrapped.
    let mut s = small();
    (s.nodes, s.ntasks, s.cpus_per_task) = (1, 65536, 65536);
    let e = refused(&c, s, "overflow").await;
    assert!(e.contains("need more than") && e.contains("CPUs on a node"), "{e}");
    table.push(("`-N 1 -n 65536 -c 65536`".into(), e));
    let cli = quorum(&cluster.controllers_env(), dir.path(), &["submit", "-t", "307445734561825861", "--", "true"]);
    assert!(cli.code != 0 && cli.stderr.contains("307445734561825861"), "{cli:?}");
    table.push(("`-t 307445734561825861`".into(), cli.stderr.trim().to_string()));
    let mut s = small();
    s.time_limit_s = u64::MAX;
    let e = refused(&c, s, "time").await;
    assert!(e.contains("100 years"), "{e}");

    // Terminal escapes, NUL bytes.
    let mut s = small();
    s.name = "\u{1b}[2J\u{1b}[Hpwned".into();
    let e = refused(&c, s, "escape").await;
    assert!(e.contains("control character"), "{e}");
    table.push(("a job name with terminal escape codes".into(), e));
    let mut s = small();
    s.env.push(api::EnvVar { name: "A".into(), value: "x\0y".into() });
    let e = refused(&c, s, "nul").await;
    assert!(e.contains("NUL"), "{e}");
    table.push(("a NUL byte in an environment value".into(), e));

    // Names no listing could hold.
    let mut s = small();
    s.name = "n".repeat(3 << 20);
    let e = refused(&c, s, "long-name").await;
    assert!(e.contains("invalid name: longer than 1024 bytes"), "{e}");
    table.push(("a 3 MB job name".into(), e));
    let mut s = small();
    s.constraint = (0..100_000).map(|i| format!("f{i}")).collect();
    let e = refused(&c, s, "features").await;
    assert!(e.contains("100000 features: at most 64"), "{e}");
    table.push(("100,000 node features (`-C`)".into(), e));

    // Sizes beyond the limits.
    let e = refused(&c, small(), &"r".repeat(3 << 20)).await;
    assert!(e.contains("request id of 3145728 bytes"), "{e}");
    table.push(("a 3 MB request id".into(), e));
    let mut s = small();
    s.env = (0..200_000).map(|i| api::EnvVar { name: format!("V{i}"), value: "x".into() }).collect();
    let e = refused(&c, s, "env").await;
    assert!(e.contains("200000 variables"), "{e}");
    table.push(("200,000 environment variables".into(), e));
    let mut s = small();
    s.dependency = format!("afterok:{}", (1..=100_000).map(|i| i.to_string()).collect::<Vec<_>>().join(":"));
    let e = refused(&c, s, "deps").await;
    assert!(e.contains("100000 jobs"), "{e}");
    table.push(("100,000 dependency ids".into(), e));
    let mut s = small();
    s.script = "\u{1}".repeat(1_500_000);
    s.argv.clear();
    s.env = vec![api::EnvVar { name: "PATH".into(), value: "\u{1}".repeat(1_000_000) }];
    let e = refused(&c, s, "escaped").await;
    assert!(e.contains("max_submit_bytes"), "{e}");
    table.push(("a 1.5 MB script and a 1 MB variable of control bytes (15 MB as JSON escapes)".into(), e));

    // The largest submit accepted (8 MiB as stored) is one entry of its own, shipped to each
    // follower in one request within a heartbeat interval: no election follows.
    let term_before = term(&cluster);
    let mut s = small();
    s.script = "\u{1}".repeat(1_390_000);
    s.argv.clear();
    s.hold = true;
    let started = Instant::now();
    let largest = submit_with_id(&c, s, "largest").await.expect("a submit just under max_submit_bytes");
    let took = started.elapsed();
    let next = submit(&c, small()).await;
    wait_state(&c, next, &["COMPLETED"], T).await;
    let terms = term(&cluster) - term_before;
    assert!(terms <= 1, "{terms} elections after the largest entry");
    table.push((
        "a 1.39 MB script of control bytes (8.3 MB as stored, just under the ceiling)".into(),
        format!(
            "accepted as job {} (committed {} ms after it was sent); {terms} elections",
            largest.job_id,
            took.as_millis()
        ),
    ));

    // A request id names the caller's own job only.
    let alice = client_as(&cluster.addrs, "alice");
    let bob = client_as(&cluster.addrs, "bob");
    let theirs = submit_with_id(&alice, small(), "same-id").await.unwrap();
    let mine = submit_with_id(&bob, small(), "same-id").await.unwrap();
    assert!(mine.job_id != theirs.job_id && !mine.duplicate, "bob got alice's job: {mine:?} {theirs:?}");
    let again = submit_with_id(&alice, small(), "same-id").await.unwrap();
    assert_eq!((again.job_id, again.duplicate), (theirs.job_id, true), "a retry is still deduplicated");
    table.push((
        "another user's request id".into(),
        format!(
            "a job of one's own (job {}, not {}); the owner's retry still finds theirs",
            mine.job_id, theirs.job_id
        ),
    ));

    // Still serving, and the replicas agree.
    let last = submit(&c, small()).await;
    wait_state(&c, last, &["COMPLETED"], T).await;
    eprintln!("| input | answer |\n|---|---|");
    for (input, answer) in &table {
        eprintln!("| {input} | {} |", answer.replace('|', "\\|").replace('\n', " "));
    }
    cluster.shutdown().await;
}
