//! The `quorum-dev` binary itself: the commands it serves, and (through its presence here) that
//! `cargo test` builds it for the `quorum` client's tests, which reach it beside `quorum`.

use std::process::Command;

#[test]
fn quorum_dev_serves_dev_simulate_and_bench() {
    let out = Command::new(env!("CARGO_BIN_EXE_quorum-dev")).arg("--help").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for command in ["dev", "simulate", "bench"] {
        assert!(stdout.lines().any(|l| l.trim_start().starts_with(command)), "no {command} in:\n{stdout}");
    }
    let out =
        Command::new(env!("CARGO_BIN_EXE_quorum-dev")).args(["simulate", "/nonexistent/trace.swf"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("/nonexistent/trace.swf"), "{stderr}");
}
