//! CI's randomized sample: one short run of `quorum-jepsen` with every nemesis, a seed from the
//! clock (or QUORUM_JEPSEN_SEED), against the workspace's own binaries. A failure prints the seed
//! and keeps the run's history and logs; `jepsen/run --seed N` replays its faults.

use std::process::Command;

#[test]
fn a_short_randomized_run_with_every_nemesis_finds_no_violation() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_quorum-jepsen"));
    let dir = bin.parent().expect("the binaries' directory");
    for sibling in ["quorum-controller", "quorum-agent"] {
        assert!(
            dir.join(sibling).exists(),
            "{} is missing: run the tests with `cargo test --workspace`",
            dir.join(sibling).display()
        );
    }
    let seed = std::env::var("QUORUM_JEPSEN_SEED").ok().unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        now.as_secs().to_string()
    });
    let time = std::env::var("QUORUM_JEPSEN_TIME").unwrap_or_else(|_| "20s".into());
    let out = Command::new(bin)
        .args(["--seed", &seed, "--time", &time, "--nemesis", "all"])
        .args(["--dir", &format!("/tmp/quorum-jepsen/ci-seed-{seed}")])
        .output()
        .expect("run quorum-jepsen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    println!("{stdout}");
    assert!(
        out.status.success(),
        "seed {seed} found a violation or could not run (replay: jepsen/run --seed {seed} --time {time}):\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("VALID"), "{stdout}");
}

/// Two of the faults real processes lacked, alone in one short run: a replica's wall clock run
/// fast or slow (libfaketime's speed) and replicas restarted with the controller's crash points
/// armed (this test build has them). The seed is the first from the clock's whose schedule has
/// both, its first crash point one every replica passes (entries appended or applied); the run must be
/// valid, and its history must show each fault done, not skipped. (The third, `freeze-node`,
/// finds a known bound: `jepsen/RESULTS.md`.)
#[test]
fn a_run_of_clock_rates_and_crash_points_finds_no_violation() {
    use quorum_jepsen::nemesis::{schedule, Fault};
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_quorum-jepsen"));
    let kinds: Vec<String> = ["clock-rate", "crash-point"].map(String::from).to_vec();
    let has_all = |seed: u64| {
        let steps = schedule(&mut quorum_jepsen::rng::Rng::new(seed).fork(1), &kinds, 30.0, 3, 3);
        let faults: Vec<&Fault> = steps.iter().flat_map(|s| &s.faults).collect();
        // The first crash point armed must be one every replica passes: a replica armed with
        // another (a membership change, say, that never comes) is skipped by the ones after.
        let first_crash = faults.iter().find(|f| matches!(f, Fault::CrashPoint { .. }));
        faults.iter().any(|f| matches!(f, Fault::ClockRate { .. }))
            && matches!(first_crash, Some(Fault::CrashPoint { point: "apply-before" | "raft-after-append", .. }))
    };
    let seed = match std::env::var("QUORUM_JEPSEN_FAULTS_SEED") {
        Ok(s) => s,
        Err(_) => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs();
            (now..).find(|s| has_all(*s)).expect("a seed").to_string()
        }
    };
    let dir = format!("/tmp/quorum-jepsen/ci-faults-{seed}");
    let out = Command::new(bin)
        .args(["--seed", &seed, "--time", "30s", "--nemesis", "clock-rate,crash-point"])
        .args(["--dir", &dir, "--keep"])
        .output()
        .expect("run quorum-jepsen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(
        out.status.success() && stdout.contains("VALID"),
        "seed {seed} (replay: jepsen/run --seed {seed} --time 30s --nemesis clock-rate,crash-point):\n{stdout}\n{stderr}"
    );
    let history = std::fs::read_to_string(format!("{dir}/history.jsonl")).unwrap_or_default();
    for done in ["runs at", "crash point", "crashed at"] {
        assert!(
            history.contains(done) || stderr.contains(done),
            "seed {seed}: no '{done}' in the run's faults (kept in {dir}):\n{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Replicas killed as by a power cut (`lose-unsynced`): each file of the replica's data cut back
/// to what its last sync covered, a file never synced emptied, then started again. The run must
/// be valid, and its history must show the cuts done and some unsynced bytes lost.
#[test]
fn a_run_of_power_cuts_that_lose_unsynced_writes_finds_no_violation() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_quorum-jepsen"));
    let seed = std::env::var("QUORUM_JEPSEN_POWER_SEED").unwrap_or_else(|_| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970");
        now.as_secs().to_string()
    });
    let dir = format!("/tmp/quorum-jepsen/ci-power-{seed}");
    let out = Command::new(bin)
        .args(["--seed", &seed, "--time", "20s", "--nemesis", "lose-unsynced"])
        .args(["--dir", &dir, "--keep"])
        .output()
        .expect("run quorum-jepsen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("VALID"),
        "seed {seed} (replay: jepsen/run --seed {seed} --time 20s --nemesis lose-unsynced):\n{stdout}\n{stderr}"
    );
    let history = std::fs::read_to_string(format!("{dir}/history.jsonl")).unwrap_or_default();
    assert!(
        history.contains("power cut") && history.contains("bytes not synced lost, files cut back: "),
        "seed {seed}: no power cut that lost anything (kept in {dir}):\n{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Mixed versions while the cluster serves: the `upgrade` nemesis alone, replicas (and sometimes
/// every agent) restarted one by one onto the previous release and back. CI builds that release
/// from the commit in `jepsen/PREVIOUS_RELEASE` (`jepsen/build-old`) and names the directory of
/// its binaries in QUORUM_JEPSEN_OLD_BIN_DIR; the run must then show a replica running them.
/// Without the variable the replicas restart onto this release (a rolling restart), and the run
/// says so. The seed is the first from the clock's whose schedule upgrades a replica.
#[test]
fn a_rolling_upgrade_with_the_previous_release_finds_no_violation() {
    use quorum_jepsen::nemesis::{schedule, Fault};
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_quorum-jepsen"));
    let kinds = vec!["upgrade".to_string()];
    let upgrades = |seed: u64| {
        let steps = schedule(&mut quorum_jepsen::rng::Rng::new(seed).fork(1), &kinds, 30.0, 3, 3);
        steps.iter().flat_map(|s| &s.faults).any(|f| matches!(f, Fault::Upgrade { order, .. } if !order.is_empty()))
    };
    let seed = match std::env::var("QUORUM_JEPSEN_UPGRADE_SEED") {
        Ok(s) => s,
        Err(_) => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs();
            (now..).find(|s| upgrades(*s)).expect("a seed").to_string()
        }
    };
    let old = std::env::var("QUORUM_JEPSEN_OLD_BIN_DIR").ok().filter(|d| !d.is_empty());
    let dir = format!("/tmp/quorum-jepsen/ci-upgrade-{seed}");
    let mut cmd = Command::new(bin);
    cmd.args(["--seed", &seed, "--time", "30s", "--nemesis", "upgrade", "--dir", &dir, "--keep"]);
    if let Some(old) = &old {
        cmd.args(["--old-bin-dir", old]);
    }
    let out = cmd.output().expect("run quorum-jepsen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    let replay = match &old {
        Some(old) => format!("jepsen/run --seed {seed} --time 30s --nemesis upgrade --old-bin-dir {old}"),
        None => format!("jepsen/run --seed {seed} --time 30s --nemesis upgrade"),
    };
    assert!(out.status.success() && stdout.contains("VALID"), "seed {seed} (replay: {replay}):\n{stdout}\n{stderr}");
    let history = std::fs::read_to_string(format!("{dir}/history.jsonl")).unwrap_or_default();
    let done = match &old {
        // A replica started on the old release's controller.
        Some(old) => format!("runs {}", std::path::Path::new(old).join("quorum-controller").display()),
        None => "rolling restart".to_string(),
    };
    assert!(
        history.contains(&done) || stderr.contains(&done),
        "seed {seed}: no '{done}' in the run's faults (kept in {dir}):\n{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
