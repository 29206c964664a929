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

/// The faults real processes lacked, alone in one short run: a node frozen whole (the agent and
/// its jobs, cgroup v2's freezer), a replica's wall clock run fast or slow (libfaketime's speed)
/// and replicas restarted with the controller's crash points armed (this test build has them).
/// The seed is one whose schedule has every one of them, a crash point the run passes among
/// them; the run must be valid, and the history must show each fault done, not skipped.
#[test]
fn a_run_of_node_freezes_clock_rates_and_crash_points_finds_no_violation() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_quorum-jepsen"));
    let seed = std::env::var("QUORUM_JEPSEN_FAULTS_SEED").unwrap_or_else(|_| SEED.into());
    let dir = format!("/tmp/quorum-jepsen/ci-faults-{seed}");
    let out = Command::new(bin)
        .args(["--seed", &seed, "--time", "30s", "--nemesis", "freeze-node,clock-rate,crash-point"])
        .args(["--dir", &dir])
        .output()
        .expect("run quorum-jepsen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(
        out.status.success() && stdout.contains("VALID"),
        "seed {seed} (replay: jepsen/run --seed {seed} --time 30s --nemesis freeze-node,clock-rate,crash-point):\n{stdout}\n{stderr}"
    );
    let history = std::fs::read_to_string(format!("{dir}/history.jsonl")).unwrap_or_default();
    for done in ["frozen whole (agent and jobs)", "thawed", "clock of r", "% ", "crash point", "crashed at"] {
        assert!(
            history.contains(done) || stderr.contains(done),
            "seed {seed}: no '{done}' in the run's faults (kept in {dir}):\n{stderr}"
        );
    }
}

/// A seed whose 30 s schedule holds a node freeze, a clock rate and a crash point that fires.
const SEED: &str = "1";
