//! What a job gets on its nodes: its environment on every rank, its user, its memory limit.

use crate::common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use common::*;
use quorum_dev::cluster::{node_name, DevOptions};
use quorum_proto::api;

const T: Duration = Duration::from_secs(30);

fn env_file(path: &std::path::Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A 2-node job submitted with the `quorum` binary: each rank sees the allocation under the
/// Quorum and Slurm names, its own rank, exactly its GPUs, and the environment `--export` gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rank_of_a_two_node_job_sees_its_allocation_and_exported_environment() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quorum"))
        .args([
            "submit",
            "-J",
            "envcheck",
            "-N",
            "2",
            "--every-node",
            "-n",
            "4",
            "-c",
            "2",
            "--gpus",
            "h100:4",
            "-o",
            "%x-%j-%N.out",
            "--export",
            "PATH,GREETING=hello",
            "--",
            "bash",
            "-c",
            "env > env-$SLURMD_NODENAME.txt",
        ])
        .envs(cluster.env())
        .env("SECRET_OF_THE_SUBMITTER", "not for the job")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id: u64 = String::from_utf8_lossy(&out.stdout).split_whitespace().last().unwrap().parse().unwrap();
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    assert_eq!(j.allocation.len(), 2, "{j:?}");

    let nodelist = "node[01-02]";
    let mut ranks = Vec::new();
    for a in &j.allocation {
        let env = env_file(&dir.path().join(format!("env-{}.txt", a.node)));
        let get = |k: &str| env.get(k).cloned().unwrap_or_else(|| panic!("{k} missing on {}: {env:?}", a.node));
        for prefix in ["QUORUM", "SLURM"] {
            assert_eq!(get(&format!("{prefix}_JOB_ID")), id.to_string());
            assert_eq!(get(&format!("{prefix}_JOB_NAME")), "envcheck");
            assert_eq!(get(&format!("{prefix}_JOB_NODELIST")), nodelist);
            assert_eq!(get(&format!("{prefix}_JOB_NUM_NODES")), "2");
            assert_eq!(get(&format!("{prefix}_NTASKS")), "4");
            assert_eq!(get(&format!("{prefix}_CPUS_PER_TASK")), "2");
            assert_eq!(get(&format!("{prefix}_GPUS_PER_NODE")), "2");
            assert_eq!(get(&format!("{prefix}_SUBMIT_DIR")), dir.path().display().to_string());
        }
        assert_eq!(get("QUORUM_NODEID"), get("SLURM_NODEID"));
        ranks.push(get("QUORUM_NODEID"));
        assert_eq!(get("QUORUM_MASTER_ADDR"), "node01");
        let gpus: Vec<String> = a.gpus.iter().map(|g| g.to_string()).collect();
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), gpus.join(","), "the GPUs allocated on {}", a.node);
        assert_eq!(get("GREETING"), "hello");
        assert!(!env.contains_key("SECRET_OF_THE_SUBMITTER"), "--export gave more than it lists");
        // Each rank's output file is named for its node.
        assert!(dir.path().join(format!("envcheck-{id}-{}.out", a.node)).exists());
    }
    ranks.sort();
    assert_eq!(ranks, ["0", "1"]);
    cluster.shutdown().await;
}

/// Submits as `user`, who proves it with a token (the request's user field is not believed).
async fn submit_as(c: &quorum_client::client::Client, user: &str, spec: api::JobSpec) -> u64 {
    try_submit_as(c, user, spec).await.expect("submit")
}

async fn try_submit_as(
    c: &quorum_client::client::Client,
    user: &str,
    spec: api::JobSpec,
) -> Result<u64, tonic::Status> {
    let c = token_client(c.addrs(), user);
    let req = api::SubmitJobRequest {
        spec: Some(spec),
        user: user.into(),
        request_id: uuid::Uuid::new_v4().to_string(),
        test_only: false,
        run_as: String::new(),
    };
    c.call(|mut cl| {
        let req = req.clone();
        async move { cl.submit_job(req).await }
    })
    .await
    .map(|r| r.job_id)
}

/// An agent running as root runs a job as its submitter: uid, gid, groups, home; the output
/// file belongs to the user; a user unknown on the node fails the job instead of running it as
/// root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_agent_runs_each_job_as_its_submitter() {
    // SAFETY: geteuid has no failure mode.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: the agent must run as root to switch users");
        return;
    }
    let cluster = cluster(DevOptions { switch_user: true, ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let nobody = quorum_agent::identity::lookup("nobody").unwrap();

    let mut s = spec(&["sh", "-c", "echo \"$(id -u) $(id -g) $(id -G) $HOME $USER\""], dir.path());
    s.env.retain(|e| e.name == "PATH");
    let id = submit_as(&c, "nobody", s.clone()).await;
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    let path = dir.path().join(format!("quorum-{id}.out"));
    let text = std::fs::read_to_string(&path).unwrap();
    let groups: Vec<String> = nobody.groups.iter().map(|g| g.to_string()).collect();
    assert_eq!(
        text.trim(),
        format!("{} {} {} {} nobody", nobody.uid, nobody.gid, groups.join(" "), nobody.home),
        "the job's identity"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&path).unwrap().uid(), nobody.uid, "the output file is the user's");

    // The user cannot write where it has no permission, even though the agent could.
    let private = tempfile::tempdir().unwrap();
    let mut s2 = s.clone();
    s2.work_dir = private.path().display().to_string();
    let denied = submit_as(&c, "nobody", s2).await;
    let j = wait_state(&c, denied, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "FAILED", "{j:?}");
    assert!(!private.path().join(format!("quorum-{denied}.out")).exists(), "written as root");

    // The user's own output, through quorum logs; but not a root-owned file the job named as
    // its output (its process could not open it, and the agent, root, must not read it for them).
    let env = cluster.controllers_env();
    let logs = |job: u64| quorum_as(&env, Some("nobody"), dir.path(), &["logs", &job.to_string()]);
    assert_eq!(logs(id).success(), text);
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "root's secret\n").unwrap();
    let mut s3 = s.clone();
    s3.stdout = secret.display().to_string();
    let snoop = submit_as(&c, "nobody", s3).await;
    assert_eq!(wait_state(&c, snoop, &["COMPLETED", "FAILED"], T).await.state, "FAILED");
    let out = logs(snoop);
    assert!(out.code != 0 && out.stderr.contains("belongs to uid 0, not to the job's user nobody"), "{out:?}");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's secret\n");

    // Root submits for another user (sbatch --uid): the job is theirs and runs as them. Nobody
    // else may, the user must exist, and --priority is for operators.
    let request = |spec: api::JobSpec, run_as: &str| api::SubmitJobRequest {
        spec: Some(spec),
        user: String::new(),
        request_id: uuid::Uuid::new_v4().to_string(),
        test_only: false,
        run_as: run_as.into(),
    };
    let send = |c: quorum_client::client::Client, req: api::SubmitJobRequest| async move {
        c.call(|mut cl| {
            let req = req.clone();
            async move { cl.submit_job(req).await }
        })
        .await
    };
    let for_nobody = send(client(&cluster.addrs), request(s.clone(), "nobody")).await.unwrap().job_id;
    let j = wait_state(&c, for_nobody, &["COMPLETED", "FAILED"], T).await;
    assert_eq!((j.state.as_str(), j.user.as_str()), ("COMPLETED", "nobody"), "{j:?}");
    assert_eq!(std::fs::read_to_string(dir.path().join(format!("quorum-{for_nobody}.out"))).unwrap(), text);
    let e = send(token_client(&cluster.addrs, "nobody"), request(s.clone(), "root")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("only root may submit a job as another user (--uid root)"), "{e:?}");
    let e = send(client(&cluster.addrs), request(s.clone(), "no-such-user-here")).await.unwrap_err();
    assert!(e.message().contains("invalid --uid 'no-such-user-here'"), "{e:?}");
    let mut first = s.clone();
    first.priority = Some(1000);
    let e = send(token_client(&cluster.addrs, "nobody"), request(first.clone(), "")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("--priority is for operators"), "{e:?}");
    let prioritized = send(client(&cluster.addrs), request(first, "")).await.unwrap().job_id;
    assert_eq!(job(&c, prioritized).await.spec.unwrap().priority, Some(1000));

    // A user the controller's user database does not know is refused at the door.
    let unknown = try_submit_as(&c, "no-such-user-here", s).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::Unauthenticated, "{unknown:?}");
    assert!(unknown.message().contains("not in the user database"), "{unknown:?}");
    cluster.shutdown().await;
}

/// A job over its memory ends OUT_OF_MEMORY where the agent has cgroups (v1 or v2); elsewhere it
/// is held by its rlimit (it fails; it does not complete) and the node says why it has no cgroups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_its_memory_is_stopped() {
    let cluster = cluster(DevOptions { cgroups: true, agents: 1, ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let limits = wait_for(T, "the node's limits", || {
        let c = &c;
        async move { nodes(c).await.first().map(|n| n.limits.clone()).filter(|l| !l.is_empty()) }
    })
    .await;
    let cgroups = limits.starts_with("cgroup v");
    // As root on a machine with a cgroup hierarchy (this project's CI has v1), cgroups are a
    // must: the fallback would hide a broken cgroup path.
    let hierarchy = ["/sys/fs/cgroup/cgroup.controllers", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .any(|p| std::path::Path::new(p).exists());
    // SAFETY: geteuid has no failure mode.
    if unsafe { libc::geteuid() } == 0 && hierarchy {
        assert!(cgroups, "root on a machine with cgroups, yet the agent uses: {limits}");
    }
    // quorum nodes shows it: the version in the LIMITS column, or rlimits with the reason on
    // standard error (the table stays a table for scripts).
    let shown = quorum(&cluster.controllers_env(), dir.path(), &["nodes"]);
    let word = limits.split(" (").next().unwrap();
    let line = shown.stdout.lines().find(|l| l.starts_with("node01")).unwrap_or_default();
    assert!(line.contains(if cgroups { word } else { "rlimits" }), "{shown:?}");
    assert_eq!(shown.stdout.lines().count(), 2, "only the header and the node: {shown:?}");
    if !cgroups {
        assert!(shown.stderr.contains("no cgroups for jobs"), "{shown:?}");
        eprintln!("OUT_OF_MEMORY not checked: no cgroups for jobs here ({limits}); checking the rlimit fallback");
        assert!(limits.starts_with("rlimits only: "), "{limits}");
    }
    // `tail` keeps a line without a newline in memory: 400 MiB of zeros against 64 MiB.
    let mut s = spec(&["bash", "-c", "head -c 400M /dev/zero | tail > /dev/null"], dir.path());
    s.mem_per_node_mb = 64;
    let id = submit(&c, s).await;
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "OUT_OF_MEMORY"], T).await;
    if cgroups {
        assert_eq!(j.state, "OUT_OF_MEMORY", "{j:?}");
        // What it reached before the kill is recorded: near its 64 MiB, far below the 400 it
        // tried to hold.
        let peak = j.usage.as_ref().expect("an OOM-killed job's usage is recorded").max_rss_kb;
        assert!(peak > 32 << 10 && peak <= 72 << 10, "peak {peak} KiB for a 64 MiB job");
    } else {
        assert_eq!(j.state, "FAILED", "{j:?}");
    }
    // Within its memory the same job completes.
    let mut s = spec(&["bash", "-c", "head -c 4M /dev/zero | tail > /dev/null"], dir.path());
    s.mem_per_node_mb = 64;
    let id = submit(&c, s).await;
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "OUT_OF_MEMORY"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    cluster.shutdown().await;
}

/// `quorum logs -f` prints a running job's output as it is written (the first line arrives
/// while the job still runs) and ends once the job has ended and all of it was printed;
/// `quorum logs` of a finished job prints its file; `--err` its error file; refusals named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_a_running_job_and_print_a_finished_one() {
    let cluster = cluster(DevOptions { agents: 1, ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    // Line 1, then nothing until the test says so, then lines 2-3 and one on stderr.
    let script = format!(
        "echo line1; while [ ! -e {} ]; do sleep 0.1; done; echo line2; echo oops >&2; echo line3",
        go.display()
    );
    let mut s = spec(&["bash", "-c", &script], dir.path());
    s.stderr = "err-%j.txt".into();
    let id = submit(&c, s).await;

    let (mut follow, line_rx) = follow_logs(&cluster, id, Pipe::Stdout);
    let first = tokio::task::spawn_blocking(move || (line_rx.recv_timeout(T), line_rx)).await.unwrap();
    let (first, line_rx) = (first.0.expect("the first line while the job runs"), first.1);
    assert_eq!(first, "line1");
    assert_eq!(job(&c, id).await.state, "RUNNING", "the line came from a running job");
    std::fs::write(&go, "").unwrap();
    let status = tokio::task::spawn_blocking(move || follow.wait()).await.unwrap().unwrap();
    assert!(status.success());
    let rest: Vec<String> = line_rx.try_iter().collect();
    assert_eq!(rest, ["line2", "line3"], "quorum logs -f ends after the job's last line");
    assert_eq!(job(&c, id).await.state, "COMPLETED");

    let env = cluster.controllers_env();
    let run = |args: &[&str], user: &str| quorum_as(&env, Some(user), dir.path(), args);
    ensure_user("mallory");
    assert_eq!(run(&["logs", &id.to_string()], "root").success(), "line1\nline2\nline3\n");
    assert_eq!(run(&["logs", "--err", &id.to_string()], "root").success(), "oops\n");
    let other = run(&["logs", &id.to_string()], "mallory");
    assert!(
        other.code != 0 && other.stderr.contains("is another user's") && !other.stderr.contains("root"),
        "{other:?}"
    );
    let wrong = run(&["logs", "--node", "node99", &id.to_string()], "root");
    assert!(wrong.stderr.contains("did not run on node99; it ran on node01"), "{wrong:?}");
    let missing = run(&["logs", "424242"], "root");
    assert!(missing.stderr.contains("there is no job 424242"), "{missing:?}");
    let mut held = spec(&["true"], dir.path());
    held.hold = true;
    let pending = submit(&c, held).await;
    let early = run(&["logs", &pending.to_string()], "root");
    assert!(early.stderr.contains("has not started"), "{early:?}");
    cluster.shutdown().await;
}

/// One rank of a two-node job fails: the job ends FAILED with that rank's exit code at once, and
/// the other rank, which would have run for a minute, is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rank_ends_the_job_and_kills_the_other_ranks() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let script = "echo $$ > rank$QUORUM_NODEID.pid; \
                  if [ $QUORUM_NODEID = 1 ]; then while [ ! -e rank0.pid ]; do sleep 0.05; done; exit 3; fi; \
                  sleep 60";
    let mut s = spec(&["bash", "-c", script], dir.path());
    s.nodes = 2;
    s.ntasks = 2;
    s.every_node = true;
    let id = submit(&c, s).await;
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!((j.state.as_str(), j.exit_code), ("FAILED", 3), "{j:?}");
    let pid: i32 = std::fs::read_to_string(dir.path().join("rank0.pid")).unwrap().trim().parse().unwrap();
    wait_for(T, "rank 0 killed", || async move { (!group_alive(pid)).then_some(()) }).await;
    cluster.shutdown().await;
}

/// A job array submitted with the binary: every task runs once with its task id, writes to its
/// own `%A_%a` file, never more at once than the throttle; `quorum queue` and `show` name the
/// tasks `A_T`; `quorum cancel A_T` cancels one task and `quorum cancel A` the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_array_runs_each_task_once_within_its_throttle() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let env = cluster.controllers_env();
    let quorum = |args: &[&str]| {
        let r = common::quorum(&env, dir.path(), args);
        (r.code == 0, r.stdout, r.stderr)
    };
    let (ok, out, err) = quorum(&[
        "submit",
        "--array=0-4,10%2",
        "-o",
        "task-%A_%a.out",
        "--",
        "bash",
        "-c",
        "echo $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT in $SLURM_ARRAY_JOB_ID; sleep 0.5",
    ]);
    assert!(ok, "{err}");
    let array: u64 = out.split_whitespace().last().unwrap().parse().unwrap();
    let tasks = [0u32, 1, 2, 3, 4, 10];
    let mut intervals = Vec::new();
    for (i, task) in tasks.iter().enumerate() {
        let id = array + i as u64;
        let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
        assert_eq!(j.state, "COMPLETED", "{j:?}");
        let a = j.array.expect("a task of the array");
        assert_eq!((a.array_job_id, a.task_id, a.count, a.throttle), (array, *task, 6, 2));
        intervals.push((j.start_time_ms, j.end_time_ms));
        let text = std::fs::read_to_string(dir.path().join(format!("task-{array}_{task}.out"))).unwrap();
        assert_eq!(text, format!("{task} of 6 in {array}\n"));
    }
    // At no instant did three tasks run at once.
    for (start, _) in &intervals {
        let running = intervals.iter().filter(|(s, e)| s <= start && start < e).count();
        assert!(running <= 2, "{running} tasks ran at once: {intervals:?}");
    }

    // Cancelling: one task by its name, then the rest by the array's id.
    let (ok, out, err) = quorum(&["submit", "--array=1-3", "--", "sleep", "60"]);
    assert!(ok, "{err}");
    let second: u64 = out.split_whitespace().last().unwrap().parse().unwrap();
    wait_state(&c, second + 2, &["RUNNING"], T).await;
    let (_, queue, _) = quorum(&["queue"]);
    assert!(queue.contains(&format!("{second}_3 ")), "{queue}");
    let (ok, show, err) = quorum(&["show", &format!("{second}_2")]);
    assert!(ok, "{err}");
    assert!(show.contains(&format!("JobId={} ArrayJobId={second} ArrayTaskId=2", second + 1)), "{show}");
    let (ok, _, err) = quorum(&["cancel", &format!("{second}_2")]);
    assert!(ok, "{err}");
    assert_eq!(wait_state(&c, second + 1, &["CANCELLED"], T).await.state, "CANCELLED");
    assert_eq!(job(&c, second).await.state, "RUNNING", "one task cancelled, not the array");
    let (ok, _, err) = quorum(&["cancel", &second.to_string()]);
    assert!(ok, "{err}");
    for id in [second, second + 2] {
        assert_eq!(wait_state(&c, id, &["CANCELLED"], T).await.state, "CANCELLED");
    }

    // Bad input is refused with what is wrong, and nothing is created.
    let before = all_jobs(&c).await.len();
    let (ok, _, err) = quorum(&["submit", "--array=5-2", "--", "true"]);
    assert!(!ok && err.contains("invalid --array '5-2': the range '5-2' runs backwards"), "{err}");
    let (ok, _, err) = quorum(&["show", &format!("{second}_9")]);
    assert!(!ok && err.contains(&format!("array {second} has no task 9 (its tasks are 1-3)")), "{err}");
    let (ok, _, err) = quorum(&["show", "1_x"]);
    assert!(!ok && err.contains("invalid job '1_x'"), "{err}");
    assert_eq!(all_jobs(&c).await.len(), before);
    cluster.shutdown().await;
}

/// `quorum logs -f` of a running job whose output cannot be read yet (here: its agent is cut
/// off) says so and waits, then follows the output once it can be read, instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_waits_while_a_running_jobs_output_cannot_be_read() {
    let cluster = cluster(DevOptions { agents: 1, ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script = format!("echo line1; while [ ! -e {} ]; do sleep 0.1; done; echo line2", go.display());
    let id = submit(&c, spec(&["bash", "-c", &script], dir.path())).await;
    wait_state(&c, id, &["RUNNING"], T).await;
    let out = dir.path().join(format!("quorum-{id}.out"));
    wait_for(T, "the job's first line", || async {
        std::fs::read_to_string(&out).ok().filter(|t| t.starts_with("line1")).map(|_| ())
    })
    .await;

    // Cut the agent off until the leader no longer holds its stream: its output cannot be read.
    cluster.isolate_agent(0, true);
    wait_for(T, "the agent's stream to end", || async {
        nodes(&c).await.into_iter().find(|n| n.name == node_name(0) && !n.connected)
    })
    .await;
    let (follow, note_rx) = follow_logs(&cluster, id, Pipe::Stderr);
    let note = tokio::task::spawn_blocking(move || note_rx.recv_timeout(T)).await.unwrap();
    let note = note.expect("quorum logs -f says it waits (it exited instead)");
    assert!(note.contains(&format!("job {id} runs, but its output cannot be read yet")), "{note}");
    assert!(note.contains("no agent connected"), "{note}");

    cluster.isolate_agent(0, false);
    std::fs::write(&go, "").unwrap();
    let done = tokio::task::spawn_blocking(move || follow.wait_with_output()).await.unwrap().unwrap();
    assert!(done.status.success(), "{done:?}");
    assert_eq!(String::from_utf8_lossy(&done.stdout), "line1\nline2\n");
    assert_eq!(job(&c, id).await.state, "COMPLETED");
    cluster.shutdown().await;
}

/// Which output of `quorum logs -f` a test reads line by line.
enum Pipe {
    Stdout,
    Stderr,
}

/// `quorum logs -f JOB` as user `tester`, each line of `pipe` sent to the receiver as it comes.
fn follow_logs(
    cluster: &quorum_dev::cluster::DevCluster,
    id: u64,
    pipe: Pipe,
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead;
    let mut follow = std::process::Command::new(env!("CARGO_BIN_EXE_quorum"))
        .args(["logs", "-f", &id.to_string()])
        .envs(cluster.env())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let read: Box<dyn std::io::Read + Send> = match pipe {
        Pipe::Stdout => Box::new(follow.stdout.take().unwrap()),
        Pipe::Stderr => Box::new(follow.stderr.take().unwrap()),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(read).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    (follow, rx)
}

/// A batch script runs under the interpreter its `#!` line names (bash without one), and finds
/// `scontrol` (linked by `quorum install-slurm-commands`) and Slurm's variables, as on Slurm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_run_under_their_interpreter_and_find_scontrol_and_slurm_variables() {
    let opts = DevOptions { quorum_program: Some(env!("CARGO_BIN_EXE_quorum").into()), ..DevOptions::for_tests() };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let script = |text: &str, nodes: u32| {
        let mut s = spec(&[], dir.path());
        s.argv.clear();
        s.script = text.into();
        (s.nodes, s.ntasks, s.every_node) = (nodes, nodes, true);
        s
    };
    let sh = submit(
        &c,
        script(
            "#!/bin/sh\nn=$SLURMD_NODENAME\nscontrol show hostnames > hosts-$n\nscontrol show hostlist \"$(scontrol show hostnames | tr '\\n' ,)\" > list-$n\necho $SLURM_PROCID $SLURM_NNODES $SLURM_TASKS_PER_NODE $SLURM_JOBID > env-$n\nreadlink /proc/$$/exe > shell-$n\n",
            2,
        ),
    )
    .await;
    let login = submit(&c, script("#!/bin/bash -l\nshopt -q login_shell && echo login > login\n", 1)).await;
    let perl = submit(
        &c,
        script("#!/usr/bin/env perl\nopen(my $f, '>', 'perl'); print $f \"perl $ENV{SLURM_JOB_ID}\\n\";\n", 1),
    )
    .await;
    let plain = submit(&c, script("echo ${BASH_VERSION:+bash} > plain\n", 1)).await;
    let tmp = submit(
        &c,
        script("#!/bin/sh\necho $TMPDIR > tmp-$SLURMD_NODENAME\nls -A $TMPDIR | wc -l >> tmp-$SLURMD_NODENAME\ntouch $TMPDIR/left\nstat -c %a $TMPDIR >> tmp-$SLURMD_NODENAME\n", 2),
    )
    .await;
    // SLURM_SUBMIT_HOST is where `quorum submit` ran, even with --export=NONE and a stale value
    // in the submitting shell.
    let out = Command::new(env!("CARGO_BIN_EXE_quorum"))
        .args(["submit", "--export=NONE", "--", "sh", "-c", "echo $SLURM_SUBMIT_HOST > submit-host"])
        .env("QUORUM_CONTROLLERS", cluster.controllers_env())
        .envs(quorum_dev::security::DevSecurity::shared().env())
        .env("SLURM_SUBMIT_HOST", "elsewhere")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let from: u64 = stdout.trim().trim_start_matches("Submitted job ").parse().unwrap_or_else(|_| panic!("{out:?}"));
    for id in [sh, login, perl, plain, tmp, from] {
        wait_state(&c, id, &["COMPLETED"], T).await;
    }
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (rank, node) in ["node01", "node02"].iter().enumerate() {
        assert_eq!(read(&format!("hosts-{node}")), "node01\nnode02\n");
        assert_eq!(read(&format!("list-{node}")), "node[01-02]\n");
        assert_eq!(read(&format!("env-{node}")), format!("{rank} 2 1(x2) {sh}\n"));
        let shell = read(&format!("shell-{node}"));
        assert!(!shell.contains("bash"), "#!/bin/sh ran under {shell}");
    }
    assert_eq!(read("login"), "login\n");
    assert_eq!(read("perl"), format!("perl {perl}\n"));
    assert_eq!(read("plain"), "bash\n", "a script without #! runs under bash");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(read("submit-host").trim(), host.trim());
    // Each rank had a private, empty TMPDIR of its own, gone with the job.
    let dirs: Vec<String> = ["node01", "node02"]
        .iter()
        .map(|node| {
            let text = read(&format!("tmp-{node}"));
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines[1..], ["0", "700"], "{node}: {text}");
            assert!(!std::path::Path::new(lines[0]).exists(), "{node}'s TMPDIR {} outlived the job", lines[0]);
            lines[0].to_string()
        })
        .collect();
    assert_ne!(dirs[0], dirs[1]);
    cluster.shutdown().await;
}
