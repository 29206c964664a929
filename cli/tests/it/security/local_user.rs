//! A hostile local user with an account of their own (mallory) against another's (alice), each
//! attack as it once succeeded (issue 56): secrets at rest, `--uid` dropped, the agent opening
//! a user's path as root, unbounded queues, QOS anyone could pick, MUNGE credentials made for
//! other services, and the lesser ones.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

fn skip_unless_root() -> bool {
    if !is_root() {
        eprintln!("skipped: the test makes Unix users and runs commands as them, as root");
        return true;
    }
    for u in ["alice", "mallory", "qop"] {
        ensure_user(u);
    }
    false
}

/// `program ARGS` as Unix user `user` in `dir`, with the cluster's variables, `env` and the umask
/// `umask` (as a shell of theirs would have them).
pub(super) fn run_as(
    cluster: &DevCluster,
    user: &str,
    dir: &Path,
    umask: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> Run {
    let out = std::process::Command::new("runuser")
        .args(["-u", user, "--", "sh", "-c", &format!("umask {umask}; exec \"$0\" \"$@\"")])
        .args(args)
        .envs(cluster.env())
        .envs(env.iter().copied())
        .current_dir(dir)
        .output()
        .expect("runuser");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `quorum` under a Slurm command's name (`salloc`, `srun`), where every user may run it.
fn slurm_command(name: &str) -> PathBuf {
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    let link = quorum_bin().with_file_name(name);
    if !link.exists() {
        std::os::unix::fs::symlink(quorum_bin(), &link).unwrap();
    }
    link
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o7777
}

/// Every file and directory under `dir` (not following links).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            out.extend(tree(&e.path()));
        }
    }
    out
}

async fn until_file(path: &Path) -> String {
    wait_for(T, &format!("{}", path.display()), || async {
        std::fs::read_to_string(path).ok().filter(|t| !t.is_empty())
    })
    .await
}

/// Finding 1: alice's script, environment and token, at rest: the agents' spools and the replicas' data
/// are nobody else's to read, a job never carries its submitter's token, and it runs with its
/// submitter's umask (not the agent's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_script_environment_and_token_are_nobody_elses_at_rest() {
    if skip_unless_root() {
        return;
    }
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = open_dir();
    let secret = format!("ALICE_SECRET_{}", std::process::id());
    let token = quorum_dev::security::DevSecurity::shared().token_for("alice");
    let script = dir.path().join("job.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nenv > env.txt\numask > umask.txt\ntouch made\necho $0 > script-path.txt\nsleep 120\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let env = [("ALICE_VALUE", secret.as_str()), ("QUORUM_TOKEN", token.as_str())];
    let r = run_as(&cluster, "alice", dir.path(), "027", &env, &[quorum_bin().to_str().unwrap(), "submit", "job.sh"]);
    let id = submitted(&r);
    wait_state(&c, id, &["RUNNING"], T).await;
    let seen = until_file(&dir.path().join("env.txt")).await;
    until_file(&dir.path().join("script-path.txt")).await;

    // The job has alice's variables, not her client's token, and her umask.
    assert!(seen.contains(&secret), "alice's own variable reaches her job: {seen}");
    assert!(!seen.contains("QUORUM_TOKEN") && !seen.contains(&token), "the token reached the job: {seen}");
    assert!(!seen.contains("SLURM_UMASK"), "SLURM_UMASK is applied, not shown (as Slurm does): {seen}");
    assert_eq!(until_file(&dir.path().join("umask.txt")).await.trim(), "0027");
    let alice = quorum_auth::users::by_name("alice").unwrap();
    let made = std::fs::metadata(dir.path().join("made")).unwrap();
    assert_eq!((made.uid(), made.permissions().mode() & 0o777), (alice.uid, 0o640));

    // Where it is stored, root finds it (the test would see a leak)...
    let spools: Vec<PathBuf> = (0..2).map(|i| cluster.agent_config(i).spool_dir).collect();
    let records: Vec<PathBuf> = spools
        .iter()
        .flat_map(|s| std::fs::read_dir(s.join("jobs")).into_iter().flatten().flatten().map(|e| e.path()))
        .collect();
    assert!(!records.is_empty(), "no job record in {spools:?}");
    let launch = records.iter().map(|r| r.join("launch.pb")).find(|p| p.exists()).expect("a launch.pb");
    assert!(String::from_utf8_lossy(&std::fs::read(&launch).unwrap()).contains(&secret), "the record holds it");
    let controller = cluster.data_dir.join("controller-1");
    let grep_root = std::process::Command::new("grep").args(["-rla", &secret]).arg(&controller).output().unwrap();
    assert!(!grep_root.stdout.is_empty(), "the replica's log holds it");

    // ...and mallory does not: neither the record, nor the replicas' files, nor alice's script.
    let mallory = |args: &[&str]| run_as(&cluster, "mallory", dir.path(), "022", &[], args);
    let launch_path = launch.to_str().unwrap();
    let r = mallory(&["cat", launch_path]);
    assert!(r.code != 0 && !r.stdout.contains(&secret), "mallory read the launch: {r:?}");
    let r = mallory(&["grep", "-rla", &secret, cluster.data_dir.to_str().unwrap()]);
    assert!(r.stdout.trim().is_empty(), "mallory found the secret in {}", r.stdout);
    let script_at = std::fs::read_to_string(dir.path().join("script-path.txt")).unwrap();
    let r = mallory(&["cat", script_at.trim()]);
    assert!(r.code != 0, "mallory read alice's script at {script_at}: {r:?}");
    let r = mallory(&["ls", spools[0].join("scripts").to_str().unwrap()]);
    assert!(r.code != 0, "mallory listed the scripts: {r:?}");

    // The modes that say so: records and replicas' directories are their daemon's alone.
    for spool in &spools {
        assert_eq!(mode(spool), 0o711, "{}", spool.display());
        assert_eq!(mode(&spool.join("jobs")), 0o700);
        for p in tree(&spool.join("jobs")) {
            let m = mode(&p);
            assert_eq!(m & 0o077, 0, "{} is mode {m:o}", p.display());
        }
    }
    for i in 1..=3 {
        let d = cluster.data_dir.join(format!("controller-{i}"));
        assert_eq!(mode(&d), 0o700, "{}", d.display());
        for p in tree(&d).into_iter().filter(|p| p.is_dir()) {
            assert_eq!(mode(&p) & 0o077, 0, "{}", p.display());
        }
    }
    cancel(&c, id).await;
    cluster.shutdown().await;
}

/// Finding 1, the daemons: a `quorum-controller` makes its data directory private on start, fixes what
/// an older release left readable, and everything it writes is its own alone (umask 077).
#[test]
fn a_controller_makes_its_data_private_and_fixes_what_was_readable() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("db")).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(data.join("db"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(data.join("left-by-an-older-release"), "x").unwrap();
    std::fs::set_permissions(data.join("left-by-an-older-release"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = dir.path().join("c.toml");
    let listen = format!("127.0.0.1:{}", quorum_dev::ports::free_port().unwrap());
    std::fs::write(
        &config,
        format!(
            "id = 1\nlisten = \"{listen}\"\ndata_dir = \"{}\"\n[[replicas]]\nid = 1\naddr = \"{listen}\"\n\
             [security]\ninsecure = true\n",
            data.display()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(sibling_binary("quorum-controller"))
        .args(["--config", config.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("quorum-controller starts");
    // Until RocksDB has written its files and the replica has made itself a cluster.
    let began = std::time::Instant::now();
    while !data.join("db/CURRENT").exists() || began.elapsed() < Duration::from_secs(2) {
        assert!(began.elapsed() < T, "no database in {}", data.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    let all = tree(&data);
    assert!(all.len() > 5, "{all:?}");
    for p in all {
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(&p), want, "{}", p.display());
    }
}

/// Finding 2: `--uid` everywhere it is taken (cron, salloc, srun, REST): the job is that user's, and
/// runs as them, never as root; a user asking for another's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uid_is_honoured_by_every_entry_point_that_takes_it() {
    if skip_unless_root() {
        return;
    }
    let cluster =
        cluster(DevOptions { quorum_program: Some(quorum_bin().to_path_buf()), ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = open_dir();
    let alice = quorum_auth::users::by_name("alice").unwrap();
    let root = |args: &[&str]| run_as(&cluster, "root", dir.path(), "022", &[], args);
    let bin = quorum_bin().to_str().unwrap().to_string();

    let (salloc, srun) = (slurm_command("salloc"), slurm_command("srun"));
    let (salloc, srun) = (salloc.to_str().unwrap(), srun.to_str().unwrap());
    // salloc --uid: the command runs as alice, and so do the steps it starts.
    let r = root(&[salloc, "--uid", "alice", "sh", "-c", &format!("id -u; {srun} id -u")]);
    assert_eq!(r.code, 0, "{r:?}");
    let uids: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(uids, [alice.uid.to_string(), alice.uid.to_string()], "{r:?}");
    // srun --uid from outside a job: its allocation and step are alice's.
    let r = root(&[srun, "--uid", "alice", "id", "-u"]);
    assert_eq!((r.code, r.stdout.trim()), (0, alice.uid.to_string().as_str()), "{r:?}");
    // Inside a job it is refused: the job's steps run as the job's user.
    let r = run_as(&cluster, "root", dir.path(), "022", &[("SLURM_JOB_ID", "1")], &[srun, "--uid", "alice", "true"]);
    refused(&r, "srun --uid inside a job", "--uid and --gid take effect only");

    // cron add --uid: the entry, and each job it submits, are alice's; the job writes its file
    // as alice through her symlink, which cannot lead it into root's files.
    let out = dir.path().join("nightly.out");
    let r =
        root(&[&bin, "cron", "add", "* * * * * *", "--uid", "alice", "-o", out.to_str().unwrap(), "--", "id", "-u"]);
    assert_eq!(r.code, 0, "{r:?}");
    let text = until_file(&out).await;
    assert_eq!(text.lines().next(), Some(alice.uid.to_string().as_str()), "{text}");
    assert_eq!(std::fs::metadata(&out).unwrap().uid(), alice.uid);
    let listed = run_as(&cluster, "alice", dir.path(), "022", &[], &[&bin, "cron", "list"]);
    assert!(listed.stdout.contains("alice"), "alice sees her entry: {listed:?}");
    let entry = listed.stdout.lines().nth(1).and_then(|l| l.split_whitespace().next()).unwrap().to_string();
    assert_eq!(root(&[&bin, "cron", "remove", &entry]).code, 0);

    // REST with run_as (root's token): alice's job.
    let (base, ca) = (cluster.http_urls()[0].clone(), quorum_dev::security::DevSecurity::shared().ca());
    let rest_out = dir.path().join("rest.out");
    let body = serde_json::json!({
        "spec": {"argv": ["id", "-u"], "work_dir": dir.path(), "stdout": rest_out, "time_limit_s": 60},
        "run_as": "alice",
    });
    let auth = format!("Authorization: Bearer {}", quorum_dev::security::DevSecurity::shared().token_for("root"));
    let (status, text) = curl(
        &format!("{base}/api/v1/jobs"),
        &[
            "--cacert",
            ca.to_str().unwrap(),
            "-H",
            &auth,
            "-H",
            "Content-Type: application/json",
            "-d",
            &body.to_string(),
        ],
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(until_file(&rest_out).await.trim(), alice.uid.to_string());

    // Nobody but root asks for another user.
    let as_mallory = |args: &[&str]| run_as(&cluster, "mallory", dir.path(), "022", &[], args);
    for args in [
        vec![bin.as_str(), "cron", "add", "@daily", "--uid", "alice", "--", "true"],
        vec![salloc, "--uid", "alice", "true"],
        vec![srun, "--uid", "alice", "true"],
        vec![bin.as_str(), "submit", "--uid", "alice", "--", "true"],
    ] {
        refused(&as_mallory(&args), &format!("{args:?} as mallory"), "only root may submit a job as another user");
    }
    cluster.shutdown().await;
}

/// Finding 3: The agent never blocks on, nor reports on, a path a user chose: a job's output replaced by
/// a FIFO and a flood of `quorum logs` leave another user's launch unhurt, each read is answered
/// at once, and what a read says is what its user could have found out alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_and_a_flood_of_log_reads_wedge_nothing_and_reveal_nothing() {
    if skip_unless_root() {
        return;
    }
    let cluster = cluster(DevOptions { agents: 1, ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 1).await;
    let dir = open_dir();
    let bin = quorum_bin().to_str().unwrap().to_string();
    let mallory = |args: &[&str]| run_as(&cluster, "mallory", dir.path(), "022", &[], args);
    let id = submitted(&mallory(&[&bin, "submit", "-o", "out.txt", "--", "sleep", "300"]));
    wait_state(&c, id, &["RUNNING"], T).await;
    let out = dir.path().join("out.txt");
    wait_for(T, "the job's output file", || async { out.exists().then_some(()) }).await;
    std::fs::remove_file(&out).unwrap();
    let made = mallory(&["mkfifo", out.to_str().unwrap()]);
    assert_eq!(made.code, 0, "{made:?}");

    // 200 reads at once, each answered promptly with a refusal of the FIFO (or "busy").
    let started = std::time::Instant::now();
    let reads: Vec<_> = (0..200)
        .map(|_| {
            let (bin, env, dir) = (bin.clone(), cluster.env(), dir.path().to_path_buf());
            let id = id.to_string();
            std::thread::spawn(move || {
                let read = || {
                    std::process::Command::new("runuser")
                        .args(["-u", "mallory", "--", &bin, "logs", &id])
                        .envs(env.clone())
                        .current_dir(&dir)
                        .output()
                        .unwrap()
                };
                // A read made while leadership moves (other tests load this machine too) finds
                // the agent between leaders; it is asked again, as a user would.
                let mut answer = read();
                for _ in 0..50 {
                    if !String::from_utf8_lossy(&answer.stderr).contains("has no agent connected") {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                    answer = read();
                }
                answer
            })
        })
        .collect();
    let answers: Vec<std::process::Output> = reads.into_iter().map(|t| t.join().unwrap()).collect();
    for a in &answers {
        let said = String::from_utf8_lossy(&a.stderr);
        assert!(said.contains("not a regular file") || said.contains("busy reading"), "{said}");
    }
    assert!(started.elapsed() < Duration::from_secs(60), "the reads took {:?}", started.elapsed());

    // Meanwhile alice's job launches and ends as ever.
    let alice = |args: &[&str]| run_as(&cluster, "alice", dir.path(), "022", &[], args);
    let other = submitted(&alice(&[&bin, "submit", "-o", "alice.out", "--", "echo", "launched"]));
    assert_eq!(wait_state(&c, other, &["COMPLETED", "FAILED"], T).await.state, "COMPLETED");
    assert_eq!(until_file(&dir.path().join("alice.out")).await.trim(), "launched");

    // A job whose output is a FIFO nobody reads fails at once instead of holding its launch.
    let fifo_job = dir.path().join("never-read.fifo");
    assert_eq!(alice(&["mkfifo", fifo_job.to_str().unwrap()]).code, 0);
    let held = submitted(&alice(&[&bin, "submit", "-o", fifo_job.to_str().unwrap(), "--", "true"]));
    assert_eq!(wait_state(&c, held, &["COMPLETED", "FAILED"], T).await.state, "FAILED");

    // A path into root's private directory answers as it would to mallory herself: the same
    // refusal whether the file is there or not.
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(private.path().join("there"), "root's").unwrap();
    let mut answers = Vec::new();
    for name in ["there", "not-there"] {
        let path = private.path().join(name);
        let j = submitted(&mallory(&[&bin, "submit", "-o", path.to_str().unwrap(), "--", "true"]));
        wait_state(&c, j, &["COMPLETED", "FAILED"], T).await;
        let r = mallory(&[&bin, "logs", &j.to_string()]);
        assert!(!r.stdout.contains("root's"), "mallory read root's file: {r:?}");
        answers.push(format!("{} {}", r.code, r.stderr.replace(name, "NAME")));
    }
    assert_eq!(answers[0], answers[1], "the answers tell the files apart");
    assert!(answers[0].contains("Permission denied"), "{answers:?}");
    cancel(&c, id).await;
    cluster.shutdown().await;
}

/// Finding 4: Default limits on what the queue holds: an array past `MaxArraySize`, a user past their
/// `MaxSubmitJobs`, the cluster past `MaxJobCount`: each refused by name, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_has_default_limits_and_refuses_past_them_by_name() {
    if skip_unless_root() {
        return;
    }
    let limits = quorum_control::config::AdmissionLimits {
        max_job_count: 12,
        max_submit_jobs_per_user: 8,
        ..Default::default()
    };
    let cluster = cluster(DevOptions { limits, ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = open_dir();
    let bin = quorum_bin().to_str().unwrap().to_string();
    let mallory = |args: &[&str]| run_as(&cluster, "mallory", dir.path(), "022", &[], args);
    let alice = |args: &[&str]| run_as(&cluster, "alice", dir.path(), "022", &[], args);
    // The limits are the cluster's once its feature level is recorded, moments after it starts:
    // until then a test-only submit (which creates nothing) still passes.
    let sbatch = slurm_command("sbatch");
    wait_for(T, "the queue limits in force", || async {
        let r = mallory(&[sbatch.to_str().unwrap(), "--test-only", "--array=0-99999", "--wrap", "true"]);
        (r.code != 0 && r.stderr.contains("MaxArraySize")).then_some(())
    })
    .await;
    // Slurm's MaxArraySize by default: task ids 0 to 1000.
    refused(
        &mallory(&[&bin, "submit", "--hold", "--array=0-99999", "--", "true"]),
        "an array of 100,000",
        "MaxArraySize=1001",
    );
    let five = submitted(&mallory(&[&bin, "submit", "--hold", "--array=0-4", "--", "true"]));
    let three = submitted(&mallory(&[&bin, "submit", "--hold", "--array=0-2", "--", "true"]));
    refused(&mallory(&[&bin, "submit", "--hold", "--", "true"]), "mallory's ninth job", "MaxSubmitJobs=8 per user");
    // Alice still may, up to the cluster's MaxJobCount.
    let hers = submitted(&alice(&[&bin, "submit", "--hold", "--array=0-3", "--", "true"]));
    refused(&alice(&[&bin, "submit", "--hold", "--", "true"]), "the thirteenth job", "MaxJobCount=12");
    // Nothing accepted was lost, and room comes back as jobs end.
    let all = all_jobs(&c).await;
    assert_eq!(all.iter().filter(|j| j.state == "PENDING").count(), 12, "{all:?}");
    assert_eq!(mallory(&[&bin, "cancel", &five.to_string()]).code, 0);
    submitted(&alice(&[&bin, "submit", "--hold", "--", "true"]));
    let _ = (three, hers);
    cluster.shutdown().await;
}

/// Finding 5: Which QOS a user may use is their account's to say; the default QOS is always there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_may_use_only_the_qos_their_account_allows_and_normal_stays() {
    if skip_unless_root() {
        return;
    }
    let vip = quorum_control::config::QosConfig { name: "vip".into(), priority: 100, ..Default::default() };
    let cluster =
        cluster(DevOptions { qos: vec![vip], operators: vec!["qop".into()], ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = open_dir();
    let bin = quorum_bin().to_str().unwrap().to_string();
    let as_ = |user: &str, args: &[&str]| run_as(&cluster, user, dir.path(), "022", &[], args);
    // Once the cluster's feature level is recorded (moments after it starts).
    let sbatch = slurm_command("sbatch");
    wait_for(T, "QOS access in force", || async {
        let r = as_("mallory", &[sbatch.to_str().unwrap(), "--test-only", "-q", "vip", "--wrap", "true"]);
        (r.code != 0 && r.stderr.contains("may not use QOS")).then_some(())
    })
    .await;
    // Defining a QOS did not take `normal` away: a plain submit works.
    let plain = submitted(&as_("mallory", &[&bin, "submit", "--hold", "--", "true"]));
    assert_eq!(job(&c, plain).await.qos, "normal");
    refused(&as_("mallory", &[&bin, "submit", "-q", "vip", "--hold", "--", "true"]), "-q vip", "may not use QOS 'vip'");
    let r = as_("mallory", &[&bin, "update", &plain.to_string(), "QOS=vip"]);
    assert!(r.code != 0 && r.stderr.contains("may not use QOS 'vip'"), "{r:?}");
    assert_eq!(job(&c, plain).await.qos, "normal");
    // An operator may move it; an account that lists vip lets its users use it.
    assert_eq!(as_("qop", &[&bin, "update", &plain.to_string(), "QOS=vip"]).code, 0);
    assert_eq!(job(&c, plain).await.qos, "vip");
    let root = |args: &[&str]| quorum(&cluster.controllers_env(), dir.path(), args);
    assert_eq!(root(&["admin", "account", "root"]).code, 0);
    let r = root(&["admin", "account", "lab", "--parent", "root", "--users", "alice", "--qos", "normal,vip"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(root(&["admin", "account", "other", "--parent", "root", "--users", "mallory"]).code, 0);
    let hers = submitted(&as_("alice", &[&bin, "submit", "-q", "vip", "--hold", "--", "true"]));
    assert_eq!(job(&c, hers).await.qos, "vip");
    refused(
        &as_("mallory", &[&bin, "submit", "-q", "vip", "--hold", "--", "true"]),
        "mallory, other",
        "allowed: normal",
    );
    // A default QOS for an account's jobs that name none.
    assert_eq!(
        root(&[
            "admin",
            "account",
            "lab",
            "--parent",
            "root",
            "--users",
            "alice",
            "--qos",
            "normal,vip",
            "--default-qos",
            "vip"
        ])
        .code,
        0
    );
    let defaulted = submitted(&as_("alice", &[&bin, "submit", "--hold", "--", "true"]));
    assert_eq!(job(&c, defaulted).await.qos, "vip");
    cluster.shutdown().await;
}

/// Finding 6: A MUNGE credential made for another service (its own payload, unrestricted) is refused,
/// though munged decodes it: a credential counts only when made for Quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_munge_credential_made_for_another_service_is_refused() {
    if skip_unless_root() {
        return;
    }
    let cluster = cluster(DevOptions { agents: 0, ..DevOptions::for_tests() }).await;
    let shared = quorum_dev::security::DevSecurity::shared();
    let addr = cluster.addrs[0].clone();
    let anonymous = ClientTls::anonymous(&shared.ca()).unwrap();
    let socket = shared.munge_socket().to_str().unwrap().to_string();
    // alice asks her munged for credentials as any other MUNGE client would.
    let munge = |args: &[&str]| {
        let out = std::process::Command::new("runuser")
            .args(["-u", "alice", "--", "munge", "--socket", &socket])
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("munge (Debian's munge package)");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let for_others = [
        (munge(&["-n"]), "payload is not Quorum's"),
        (munge(&["-s", "hello from another service"]), "payload is not Quorum's"),
        (munge(&["-s", "quorum/1 purpose=api"]), "not restricted to the controllers' uid"),
        (munge(&["-s", "quorum/1 purpose=api", "--restrict-uid", "mallory"]), "MUNGE credential"),
    ];
    for (cred, want) in for_others {
        let mut api = QuorumClient::new(channel(&addr, &anonymous).await);
        let mut req = tonic::Request::new(api::WhoAmIRequest {});
        munge_metadata(&mut req, &cred);
        let e = api.who_am_i(req).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains(want), "{want:?} not in {e:?}");
    }
    // Made for Quorum (restricted to the controllers' uid, here root), it counts.
    let ours = munge(&["-s", "quorum/1 purpose=api", "--restrict-uid", "root"]);
    let mut api = QuorumClient::new(channel(&addr, &anonymous).await);
    let mut req = tonic::Request::new(api::WhoAmIRequest {});
    munge_metadata(&mut req, &ours);
    assert_eq!(api.who_am_i(req).await.unwrap().into_inner().user, "alice");
    cluster.shutdown().await;
}

/// Finding 7: The lesser ones: a token mints no token that outlives it, refusals name no other user, the
/// documented 4 MiB script limit is reachable, and `seff` refuses another's running job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_refusals_script_size_and_seff_leak_nothing() {
    if skip_unless_root() {
        return;
    }
    let cluster =
        cluster(DevOptions { quorum_program: Some(quorum_bin().to_path_buf()), ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = open_dir();
    let bin = quorum_bin().to_str().unwrap().to_string();
    let as_ = |user: &str, env: &[(&str, &str)], args: &[&str]| run_as(&cluster, user, dir.path(), "022", env, args);
    // A short token cannot mint a long one; a shorter one it may.
    let short = as_("alice", &[], &[&bin, "token", "--lifespan", "10m"]);
    let short = short.stdout.trim().strip_prefix("QUORUM_TOKEN=").expect(&short.stdout).to_string();
    let with_token = [("QUORUM_TOKEN", short.as_str()), ("QUORUM_MUNGE_SOCKET", "/nonexistent")];
    refused(
        &as_("alice", &with_token, &[&bin, "token", "--lifespan", "1d"]),
        "a day from a 10-minute token",
        "ends before it does",
    );
    refused(&as_("alice", &[], &[&bin, "token", "--lifespan", "365d"]), "a year", "above the most");
    let renewed = as_("alice", &with_token, &[&bin, "token", "--lifespan", "5m"]);
    assert_eq!(renewed.code, 0, "{renewed:?}");
    refused(&as_("alice", &[], &[&bin, "token", "--lifespan", "3600"]), "a bare number", "ambiguous");

    // Refusals do not name the owner of someone else's job.
    let hers = submitted(&as_("alice", &[], &[&bin, "submit", "--", "sleep", "120"]));
    wait_state(&c, hers, &["RUNNING"], T).await;
    for args in [vec!["cancel"], vec!["hold"], vec!["cancel", "--signal", "USR1"]] {
        let mut args: Vec<&str> = std::iter::once(bin.as_str()).chain(args).collect();
        let id = hers.to_string();
        args.push(&id);
        let r = as_("mallory", &[], &args);
        assert!(r.code != 0 && !r.stderr.contains("alice") && !r.stdout.contains("alice"), "{args:?}: {r:?}");
    }
    // seff on alice's running job: refused, not a report of zeros.
    let seff = dir.path().join("seff");
    std::os::unix::fs::symlink(quorum_bin(), &seff).unwrap();
    let r = as_("mallory", &[], &[seff.to_str().unwrap(), &hers.to_string()]);
    assert!(r.code != 0 && !r.stdout.contains("CPU Efficiency"), "{r:?}");

    // A script of 4,000,000 bytes (under the 4 MiB limit) is accepted, through gRPC and REST.
    let big = dir.path().join("big.sh");
    let mut text = String::from("#!/bin/sh\ntrue\n");
    while text.len() < 4_000_000 {
        text.push_str("# padding padding padding padding padding padding padding padding padding\n");
    }
    std::fs::write(&big, &text).unwrap();
    std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o644)).unwrap();
    submitted(&as_("alice", &[], &[&bin, "submit", "--hold", "big.sh"]));
    let body = serde_json::json!({"spec": {"script": text, "work_dir": dir.path(), "time_limit_s": 60, "hold": true}});
    let body_file = dir.path().join("body.json");
    std::fs::write(&body_file, body.to_string()).unwrap();
    let auth = format!("Authorization: Bearer {}", quorum_dev::security::DevSecurity::shared().token_for("alice"));
    let ca = quorum_dev::security::DevSecurity::shared().ca();
    let (status, said) = curl(
        &format!("{}/api/v1/jobs", cluster.http_urls()[0]),
        &[
            "--cacert",
            ca.to_str().unwrap(),
            "-H",
            &auth,
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &format!("@{}", body_file.display()),
        ],
    );
    assert_eq!(status, 200, "{said}");
    cancel(&c, hers).await;
    cluster.shutdown().await;
}
