//! The `quorum-agent` program: it documents its options and names a bad value. (Being an
//! integration test of this package, it also has `cargo test --workspace` build the program
//! afresh, which the cluster tests of `cli/tests` start as real agent processes.)

use std::process::Command;

#[test]
fn the_agent_program_documents_its_options_and_names_a_bad_value() {
    let bin = env!("CARGO_BIN_EXE_quorum-agent");
    let help = Command::new(bin).arg("--help").output().unwrap();
    assert!(help.status.success(), "{help:?}");
    let text = String::from_utf8_lossy(&help.stdout);
    for option in ["--controllers", "--node-hostname", "--slurm-commands", "--tmp-base", "--kill-wait"] {
        assert!(text.contains(option), "{option} is not documented:\n{text}");
    }
    let bad = Command::new(bin).args(["--controllers", "127.0.0.1:1", "--cpus", "many"]).output().unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--cpus") && err.contains("many"), "{err}");
}
