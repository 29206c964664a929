//! `quorum-dbd` as an operator starts it: it explains itself, and refuses bad settings before it
//! connects to anything. (This test also has `cargo test --workspace` build the binary beside
//! `quorum`, where the CLI's export tests start it.)

use std::process::Command;

fn dbd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_quorum-dbd"))
        .args(args)
        .env_remove("QUORUM_DBD_POSTGRES")
        .output()
        .expect("run quorum-dbd");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[test]
fn it_explains_itself_and_refuses_bad_settings() {
    let (code, help, _) = dbd(&["--help"]);
    assert_eq!(code, 0);
    for want in ["--postgres", "--cluster", "--batch", "--once", "--postgres-ca"] {
        assert!(help.contains(want), "'{want}' in\n{help}");
    }
    let (code, _, err) = dbd(&[]);
    assert_ne!(code, 0);
    assert!(err.contains("--postgres"), "{err}");
    let (code, _, err) = dbd(&["--postgres", "host=/tmp", "--batch", "0"]);
    assert_ne!(code, 0);
    assert!(err.contains("--batch"), "{err}");
    let (code, _, err) = dbd(&["--postgres", "host=/tmp", "--interval-s", "100000"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--interval-s must be between 0 and 86400 seconds"), "{err}");
}
