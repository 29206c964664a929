//! The `quorum` binary against a running cluster: what a user types and sees, bad input first.

use crate::common;

use std::time::Duration;

use common::*;
use quorum_dev::cluster::DevOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_creates_nothing() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let ctl = cluster.controllers_env();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.sh"), "#!/bin/bash\n#SBATCH -J ok\n#SBATCH --mem=4X\necho hi\n").unwrap();
    std::fs::write(dir.path().join("empty.sh"), "   \n").unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["submit", "-p", "nope", "--", "true"], "unknown partition 'nope' (partitions: gpu)"),
        (
            &["submit", "--gpus", "h100:16", "--", "true"],
            "partition 'gpu' has no node with 16 GPUs of type h100; the largest has 4",
        ),
        (&["submit", "--gpus", "a100:1", "--", "true"], "no node with 1 GPUs of type a100; the largest has 0"),
        (&["submit", "-c", "64", "--", "true"], "no node with 64 CPUs; the largest has 8"),
        (&["submit", "-N", "3", "--", "true"], "fewer than the 3 requested"),
        (&["submit", "-t", "abc", "--", "true"], "invalid time 'abc'"),
        (&["submit", "-t", "8-00:00:00", "--", "true"], "exceeds partition 'gpu' limit of 7-00:00:00"),
        (&["submit", "--mem", "4X", "--", "true"], "invalid memory size '4X'"),
        (&["submit", "--"], "nothing to run"),
        (&["submit", "--", ""], "empty command"),
        (&["submit", "bad.sh"], "bad.sh line 3: '#SBATCH --mem=4X': invalid memory size '4X'"),
        (&["submit", "empty.sh"], "empty script"),
        (&["submit", "missing.sh"], "cannot read script 'missing.sh'"),
        (&["submit", "-N", "1", "-n", "65536", "-c", "65536", "--", "true"], "need more than 1048576 CPUs on a node"),
        (&["submit", "-t", "307445734561825861", "--", "true"], "longer than the longest time limit"),
        (&["submit", "-J", "\u{1b}[2J\u{1b}[H", "--", "true"], "contains the control character '\\u{1b}'"),
        (&["show", "999"], "job 999 does not exist"),
        (&["cancel", "999"], "job 999 does not exist"),
    ];
    for (args, want) in cases {
        let r = quorum(&ctl, dir.path(), args);
        assert_ne!(r.code, 0, "quorum {args:?} should fail; stdout: {}", r.stdout);
        assert!(r.stderr.contains(want), "quorum {args:?}: stderr {:?} should contain {want:?}", r.stderr);
    }
    assert!(all_jobs(&c).await.is_empty(), "bad input created a job");

    // And the happy path through the same binary: a Slurm batch script runs unchanged.
    std::fs::write(
        dir.path().join("job.sh"),
        "#!/bin/bash\n#SBATCH -J scripted\n#SBATCH -o %x.%j.txt\n#SBATCH --gres=gpu:h100:2\n#SBATCH -t 5\necho \"$SLURM_JOB_NAME gpus=$CUDA_VISIBLE_DEVICES\"\n",
    )
    .unwrap();
    let r = quorum(&ctl, dir.path(), &["submit", "job.sh"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let id: u64 = r.stdout.trim().strip_prefix("Submitted job ").expect(&r.stdout).parse().unwrap();
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], Duration::from_secs(30)).await;
    assert_eq!(j.state, "COMPLETED");
    let out = std::fs::read_to_string(dir.path().join(format!("scripted.{id}.txt"))).unwrap();
    let gpus: Vec<String> = j.allocation[0].gpus.iter().map(|g| g.to_string()).collect();
    assert_eq!(out, format!("scripted gpus={}\n", gpus.join(",")));

    let r = quorum(&ctl, dir.path(), &["show", &id.to_string(), "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["id"], id);
    assert_eq!(v["name"], "scripted");
    assert_eq!(v["state"], "COMPLETED");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["nodes"].as_array().unwrap().len(), 1);

    let r = quorum(&ctl, dir.path(), &["queue", "--all"]);
    assert!(r.stdout.starts_with("JOBID  PARTITION  NAME"), "{}", r.stdout);
    let row: Vec<&str> = r
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.first() == Some(&id.to_string().as_str()))
        .expect("the job's row");
    assert_eq!((row[1], row[2], row[4], row[6]), ("gpu", "scripted", "CD", "1"), "{}", r.stdout);
    let r = quorum(&ctl, dir.path(), &["nodes"]);
    assert!(r.stdout.contains("node01") && r.stdout.contains("h100:4"), "{}", r.stdout);
    let r = quorum(&ctl, dir.path(), &["cluster", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let roles: Vec<&str> = v.as_array().unwrap().iter().map(|r| r["role"].as_str().unwrap()).collect();
    assert_eq!(roles.iter().filter(|r| **r == "leader").count(), 1, "{roles:?}");
    assert_eq!(roles.len(), 3);

    // `quorum queue ... | head -c 10`: the reader goes away after a few bytes and quorum ends
    // quietly on SIGPIPE, like other Unix tools, instead of panicking. 100 held tasks make a
    // JSON answer far larger than a pipe's buffer, so the write after the close does fail.
    assert_eq!(quorum(&ctl, dir.path(), &["submit", "--hold", "--array", "0-99", "--", "true"]).code, 0);
    use std::io::Read;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_quorum"))
        .args(["queue", "--json"])
        .envs(cluster.env())
        .env("RUST_BACKTRACE", "0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 10];
    child.stdout.take().unwrap().read_exact(&mut head).unwrap(); // and the pipe closes here
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}: {stderr}", out.status);
    cluster.shutdown().await;
}

fn json(r: &Run) -> serde_json::Value {
    assert_eq!(r.code, 0, "{}", r.stderr);
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout))
}

fn submitted(r: &Run) -> u64 {
    assert_eq!(r.code, 0, "{}", r.stderr);
    r.stdout.trim().strip_prefix("Submitted job ").expect(&r.stdout).parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_estimates_holds_dependencies_priorities_and_shares() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let ctl = cluster.controllers_env();
    let dir = tempfile::tempdir().unwrap();
    let q = |args: &[&str]| quorum(&ctl, dir.path(), args);
    let t = Duration::from_secs(30);

    // A held job says so at once: holding it wakes no scheduling cycle to record the reason.
    let early = submitted(&q(&["submit", "--hold", "--", "true"]));
    assert_eq!(json(&q(&["show", &early.to_string(), "--json"]))["reason"], "JobHeldUser");
    assert_eq!(q(&["cancel", &early.to_string()]).code, 0);

    // A fills both nodes for at most a minute; B needs them too and gets a reservation.
    let a = submitted(&q(&["submit", "-N", "2", "-c", "8", "-t", "1", "--", "sleep", "300"]));
    let a_job = wait_state(&c, a, &["RUNNING"], t).await;
    let b = submitted(&q(&["submit", "-N", "2", "-c", "8", "-t", "1", "--", "true"]));
    let held = submitted(&q(&["submit", "--hold", "--", "true"]));
    let dep = submitted(&q(&["submit", "--dependency", &format!("afterok:{a}"), "--", "true"]));
    let expected = wait_for(t, "B's reservation", || async {
        let v = json(&q(&["queue", "--start", "--json"]));
        let jobs = v.as_array().unwrap().clone();
        let jb = jobs.iter().find(|j| j["id"] == b)?.clone();
        jb["expected_start_ms"].as_u64().map(|s| (s, jb))
    })
    .await;
    let (start_ms, jb) = expected;
    assert_eq!(jb["reason"], "Resources");
    assert_eq!(jb["expected_nodes"], "node[01-02]");
    let want = a_job.start_time_ms / 1000 * 1000 + 60_000;
    assert!(start_ms.abs_diff(want) <= 2000, "B expected at {start_ms}, A's limit ends at {want}");
    // Forecasts: every waiting job it can place has an expected start and nodes, not only the
    // one backfill reserves for (B, whose is its reservation); the others' are marked as
    // forecasts (in the table too), and come after A's limit. (Niced below B, which keeps the
    // reservation.)
    let more: Vec<u64> =
        (0..4).map(|_| submitted(&q(&["submit", "--nice=5000", "-c", "8", "-t", "1", "--", "true"]))).collect();
    let forecast = wait_for(t, "a forecast of every waiting job", || async {
        let jobs = json(&q(&["queue", "--start", "--json"])).as_array().unwrap().clone();
        let placed = |id: &u64| jobs.iter().any(|j| j["id"] == *id && j["expected_start_ms"].as_u64().is_some());
        more.iter().all(placed).then_some(jobs)
    })
    .await;
    for id in &more {
        let j = forecast.iter().find(|j| j["id"] == *id).unwrap();
        assert_eq!(j["expected_forecast"], true, "{j}");
        assert!(j["expected_nodes"].as_str().is_some_and(|n| n.starts_with("node")), "{j}");
        assert!(j["expected_start_ms"].as_u64().unwrap() + 1000 >= want, "not before A's limit ends: {j}");
    }
    assert_eq!(forecast.iter().find(|j| j["id"] == b).unwrap()["expected_forecast"], false, "B's is a reservation");
    let table = q(&["queue", "--start"]);
    assert_eq!(table.stdout.matches("(forecast)").count(), 4, "{}", table.stdout);
    for id in &more {
        assert_eq!(q(&["cancel", &id.to_string()]).code, 0);
    }
    let reason = |id: u64| {
        let v = json(&q(&["show", &id.to_string(), "--json"]));
        v["reason"].as_str().unwrap_or_default().to_string()
    };
    wait_for(t, "reasons", || async { (reason(held) == "JobHeldUser" && reason(dep) == "Dependency").then_some(()) })
        .await;
    assert_eq!(json(&q(&["show", &held.to_string(), "--json"]))["held"], "USER");

    // Priorities list every pending job with its factors.
    let prio = json(&q(&["prio", "--json"]));
    let ids: Vec<u64> = prio["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_u64().unwrap()).collect();
    for id in [b, held, dep] {
        assert!(ids.contains(&id), "{prio}");
    }
    assert!(prio["jobs"][0]["fairshare"].as_f64().is_some());
    assert_eq!(prio["weights"]["fairshare"], 10000);

    // Releasing lets the held job compete; cancelling A lets B and the others run.
    assert_eq!(q(&["release", &held.to_string()]).code, 0);
    wait_for(t, "the release", || async { (reason(held) != "JobHeldUser").then_some(()) }).await;
    let r = q(&["release", "999"]);
    assert!(r.code != 0 && r.stderr.contains("job 999 does not exist"), "{r:?}");
    assert_eq!(q(&["cancel", &a.to_string()]).code, 0);
    wait_state(&c, b, &["COMPLETED"], t).await;
    // B keeps the starts it was shown while it waited, for the history: the first (its
    // reservation) and the one in force when it started (later, once the released job was
    // placed ahead of it), in `show` and sacct's ForecastFirst and ForecastLast.
    let jb = json(&q(&["show", &b.to_string(), "--json"]));
    let first = jb["shown_first_ms"].as_u64().unwrap_or_else(|| panic!("{jb}"));
    assert!(first.abs_diff(start_ms) <= 2000, "{jb}: first shown {start_ms}");
    assert!(jb["shown_last_ms"].as_u64().is_some_and(|last| last + 2000 >= first), "{jb}");
    let sacct = crate::slurm_commands::slurm_command(dir.path(), "sacct");
    let out = std::process::Command::new(&sacct)
        .args(["-X", "-n", "-P", "-j", &b.to_string(), "-o", "JobID,ForecastFirst,ForecastLast"])
        .envs(cluster.env())
        .output()
        .unwrap();
    let local = quorum_client::display::local_time;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(
        line,
        format!(
            "{b}|{}|{}",
            local(jb["shown_first_ms"].as_u64().unwrap()),
            local(jb["shown_last_ms"].as_u64().unwrap())
        ),
        "{out:?}"
    );
    wait_state(&c, held, &["COMPLETED"], t).await;
    let d = wait_for(t, "the dependent job to be decided", || async {
        let j = json(&q(&["show", &dep.to_string(), "--json"]));
        (j["reason"] == "DependencyNeverSatisfied").then_some(j)
    })
    .await;
    assert_eq!(d["state"], "PENDING", "afterok of a cancelled job never runs");

    // Accounts change at run time, like sacctmgr; the fairshare view shows them.
    let r = q(&["admin", "account", "physics", "--shares", "3", "--users", "root,alice", "--max-jobs", "4"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = q(&["admin", "account", "bad", "--parent", "nowhere"]);
    assert!(r.code != 0 && r.stderr.contains("parent 'nowhere' does not exist"), "{r:?}");
    let shares = json(&q(&["share", "--json"]));
    let physics = shares.as_array().unwrap().iter().find(|a| a["account"] == "physics").expect("physics").clone();
    assert_eq!(physics["raw_shares"], 3);
    assert_eq!(physics["users"], serde_json::json!(["alice", "root"]));
    let r = q(&["submit", "-A", "physics", "--", "true"]);
    let id = submitted(&r);
    assert_eq!(json(&q(&["show", &id.to_string(), "--json"]))["account"], "physics");
    let r = q(&["submit", "-A", "chemistry", "--", "true"]);
    assert!(r.code != 0 && r.stderr.contains("invalid account 'chemistry'"), "{r:?}");
    cluster.shutdown().await;
}

/// `quorum` runs thousands of times from users' scripts, and each run pays for what the binary
/// loads; the controller, the agent and RocksDB are in `quorum-dev` only (a 95 MB binary whose
/// start-up cost twice sbatch's), which `quorum dev|simulate|bench` become.
#[test]
fn the_quorum_client_links_neither_the_controller_nor_rocksdb() {
    let client = std::fs::read(env!("CARGO_BIN_EXE_quorum")).unwrap();
    // quorum-dev is another package's binary, built beside quorum (where quorum looks for it).
    let tools_path = std::path::Path::new(env!("CARGO_BIN_EXE_quorum")).with_file_name("quorum-dev");
    let tools = std::fs::read(&tools_path)
        .unwrap_or_else(|e| panic!("{}: {e} (cargo test --workspace builds it)", tools_path.display()));
    let has = |bin: &[u8], what: &str| bin.windows(what.len()).any(|w| w == what.as_bytes());
    for what in ["rocksdb", "RocksDB", "openraft::", "quorum_control::", "quorum_agent::"] {
        assert!(has(&tools, what), "quorum-dev should contain {what}: the check below would prove nothing");
        assert!(!has(&client, what), "the quorum client binary links {what}");
    }

    // `quorum dev --help` is quorum-dev's, reached through quorum.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quorum")).args(["dev", "--help"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("Usage: quorum dev") && stdout.contains("--agents"), "{out:?}");

    // Without quorum-dev beside it or on PATH, quorum says where it looked and how to build it.
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("quorum");
    std::fs::copy(env!("CARGO_BIN_EXE_quorum"), &alone).unwrap();
    let out = std::process::Command::new(&alone).args(["simulate", "trace.swf"]).env("PATH", "").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr.contains("quorum simulate is run by quorum-dev")
            && stderr.contains(&dir.path().display().to_string())
            && stderr.contains("cargo build --release --bin quorum-dev"),
        "{stderr}"
    );
}
