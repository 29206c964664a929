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
