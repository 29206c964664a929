//! The job supervisor as a small program of its own (`quorum-supervisor`), which the agent
//! starts for each job rank when it lies beside the agent's program; one of another build
//! refuses the work, and the agent then starts its own program instead.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

use quorum_agent::record::{create_record, record_dir, write_pids, Status};
use quorum_agent::supervisor::{spawn, use_program, wait, Output, Prepared};
use quorum_proto::agent::Launch;

/// Starts `bash -c 'echo hi; exit 3'` as job `job` under the supervisor program in use; the
/// supervisor's program, once the job has ended with its status and output checked.
async fn run_one(spool: &Path, job: u64) -> std::path::PathBuf {
    let record = record_dir(spool, job, 1);
    create_record(&record, &Launch { job_id: job, token: 1, ..Default::default() }, 1).unwrap();
    let out = spool.join(format!("out{job}"));
    let output = Output { stdout: out.clone(), stderr: None, truncate: true };
    let env = vec![("PATH".to_string(), std::env::var("PATH").unwrap())];
    let argv: Vec<String> = ["bash", "-c", "echo hi; exit 3"].iter().map(|s| s.to_string()).collect();
    let p = Prepared::new(&argv, &env, spool, &output, &record).unwrap();
    let pids = spawn(&p).unwrap();
    write_pids(&record, pids).unwrap();
    let program = std::fs::read_link(format!("/proc/{}/exe", pids.supervisor)).unwrap();
    assert_eq!(wait(pids, &record).await, Status::Exited(3));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "hi\n");
    program
}

#[tokio::test]
async fn each_rank_runs_under_the_supervisor_program_and_one_of_another_build_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let helper = std::fs::canonicalize(env!("CARGO_BIN_EXE_quorum-supervisor")).unwrap();
    let this = std::fs::read_link("/proc/self/exe").unwrap();

    // The program runs the job. It is small: it loads none of the libraries that the programs
    // linking the whole agent load (MUNGE's; the C++ runtime, RocksDB's in quorum-dev).
    use_program(Some(&helper));
    assert_eq!(run_one(dir.path(), 1).await, helper);
    let ldd = std::process::Command::new("ldd").arg(&helper).output().unwrap();
    let libraries = String::from_utf8_lossy(&ldd.stdout);
    assert!(ldd.status.success() && libraries.contains("libc.so"), "{ldd:?}");
    assert!(!libraries.contains("libmunge") && !libraries.contains("libstdc++"), "{libraries}");

    // Told work of another build, it refuses it before reading it, and says nothing.
    let refused = std::process::Command::new(&helper).arg0("quorum-supervisor").args(["/x", "0123"]).output().unwrap();
    assert_eq!((refused.status.code(), refused.stdout.len(), refused.stderr.len()), (Some(125), 0, 0), "{refused:?}");
    // Run by hand, it says what it is.
    let by_hand = std::process::Command::new(&helper).output().unwrap();
    assert_eq!(by_hand.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&by_hand.stderr).contains("not to be run by hand"), "{by_hand:?}");
    let fingerprint = std::process::Command::new(&helper).arg("--fingerprint").output().unwrap();
    assert!(fingerprint.status.success() && fingerprint.stdout.len() == 17, "{fingerprint:?}");

    // A supervisor program that refuses (as one of another build does) is passed over: the job
    // runs under this program again, and so do the ones after it.
    let other = dir.path().join("quorum-supervisor");
    std::fs::write(&other, "#!/bin/sh\nexit 125\n").unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
    use_program(Some(&other));
    assert_eq!(run_one(dir.path(), 2).await, this);
    assert_eq!(run_one(dir.path(), 3).await, this);
    // So is one that is gone.
    use_program(Some(&dir.path().join("gone")));
    assert_eq!(run_one(dir.path(), 4).await, this);
}
