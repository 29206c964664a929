//! Changing jobs after their submit (`quorum update`, `scontrol update`), as their owner and as
//! an operator: a running job's time limit moved both ways on its node, and a pending job's
//! name, size and nice changed before it starts; what is not allowed is refused with the reason.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use quorum_dev::cluster::{DevCluster, DevOptions};

const T: Duration = Duration::from_secs(30);

/// `scontrol ARGS` as `user` (by a token), run through the `quorum` binary under that name.
fn scontrol_as(cluster: &DevCluster, bin: &Path, user: &str, args: &[&str]) -> Run {
    slurm_as(cluster, bin, "scontrol", user, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_jobs_limit_moves_on_its_node_and_a_pending_job_changes_before_it_starts() {
    // The agents run each job as its user, as a site's do.
    let cluster = cluster(DevOptions { switch_user: true, ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let env = cluster.controllers_env();
    let (dir, bin) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let owner = |args: &[&str]| quorum_as(&env, Some("upd-owner"), dir.path(), args);
    let root = |args: &[&str]| quorum_as(&env, Some("root"), dir.path(), args);

    // The owner may lower a running job's limit, not raise it, nor move it elsewhere.
    let long = submitted(owner(&["submit", "-t", "10", "-J", "long", "--", "sleep", "1000"]));
    let running = wait_state(&c, long, &["RUNNING"], T).await;
    let raise = owner(&["update", &long.to_string(), "TimeLimit=+5"]);
    assert_eq!(raise.code, 1, "{raise:?}");
    assert!(
        raise.stderr.contains(&format!("only an operator may raise a job's time limit (job {long}: 10:00 to 15:00)")),
        "{raise:?}"
    );
    let moved = owner(&["update", &long.to_string(), "Partition=gpu"]);
    assert!(
        moved.stderr.contains(&format!("job {long} is RUNNING: its partition can change only while it is pending")),
        "{moved:?}"
    );
    // Lowered to 3 s through scontrol: its agent ends it then, TIMEOUT, long before 10 minutes.
    let cut = scontrol_as(
        &cluster,
        bin.path(),
        "upd-owner",
        &["update", &format!("JobId={long}"), "TimeLimit=0:03", "Comment=cut short"],
    );
    assert_eq!((cut.code, cut.stdout.as_str()), (0, ""), "{cut:?}");
    let ended = wait_state(&c, long, &["TIMEOUT", "COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(ended.state, "TIMEOUT", "{ended:?}");
    assert_eq!(ended.time_limit_s, 3);
    let ran_ms = ended.end_time_ms.saturating_sub(running.start_time_ms);
    assert!((3_000..20_000).contains(&ran_ms), "it ran {ran_ms} ms under a limit lowered to 3 s");
    assert_eq!(ended.spec.as_ref().map(|s| s.comment.as_str()), Some("cut short"));

    // An operator raises one past its first limit (5 s): it runs on beyond that and its kill wait.
    let raised = submitted(owner(&["submit", "-t", "0:05", "--", "sleep", "1000"]));
    let started = wait_state(&c, raised, &["RUNNING"], T).await;
    let since = Instant::now();
    root(&["update", &raised.to_string(), "TimeLimit=10"]).success();
    assert_eq!(job(&c, raised).await.time_limit_s, 600);
    // Its first limit and the kill wait (2 s) have passed, with room for a loaded machine.
    let past_first = Duration::from_millis((started.start_time_ms + 9_000).saturating_sub(now_ms()));
    tokio::time::sleep(past_first).await;
    let still = job(&c, raised).await;
    assert_eq!(
        still.state,
        "RUNNING",
        "killed at its first limit though raised {:?} after: {still:?}",
        since.elapsed()
    );
    cancel(&c, raised).await;

    // A pending (held) job: its name, size and comment change; a negative nice is an operator's.
    let held = submitted(owner(&["submit", "-H", "-J", "before", "--", "true"]));
    let words = ["update", &format!("jobid={held}"), "JobName=after", "NumNodes=2", "Comment=two nodes"];
    assert_eq!(scontrol_as(&cluster, bin.path(), "upd-owner", &words).code, 0);
    let nice = owner(&["update", &held.to_string(), "Nice=-5"]);
    assert!(nice.code == 1 && nice.stderr.contains("only an operator may set a negative nice (-5)"), "{nice:?}");
    root(&["update", &held.to_string(), "Nice=-5"]).success();
    let pending = job(&c, held).await;
    let spec = pending.spec.clone().unwrap();
    assert_eq!((pending.name.as_str(), spec.nodes, spec.nice, spec.comment.as_str()), ("after", 2, -5, "two nodes"));
    // Another user's job is not theirs to change; an unknown key is named.
    let other = quorum_as(&env, Some("upd-other"), dir.path(), &["update", &held.to_string(), "JobName=mine"]);
    assert!(other.stderr.contains("user 'upd-other' may not change job"), "{other:?}");
    let unknown = owner(&["update", &held.to_string(), "Features=x"]);
    assert!(unknown.code == 1 && unknown.stderr.contains("updating 'Features' is not supported"), "{unknown:?}");
    owner(&["release", &held.to_string()]).success();
    let done = wait_state(&c, held, &["COMPLETED", "FAILED"], T).await;
    assert_eq!((done.state.as_str(), done.allocation.len()), ("COMPLETED", 2), "{done:?}");
    let shown = owner(&["show", &held.to_string()]).success();
    assert!(shown.contains("after"), "{shown}");

    // scontrol update of a node drains and resumes it, as an operator.
    let drain = ["update", "NodeName=node02", "State=DRAIN", "Reason=maintenance window"];
    assert_eq!(scontrol_as(&cluster, bin.path(), "root", &drain).code, 0);
    let node = nodes(&c).await.into_iter().find(|n| n.name == "node02").unwrap();
    assert_eq!((node.state.as_str(), node.reason.as_str()), ("drain", "maintenance window"));
    let no_reason = scontrol_as(&cluster, bin.path(), "root", &["update", "NodeName=node02", "State=DRAIN"]);
    assert!(no_reason.code == 1 && no_reason.stderr.contains("specify a reason"), "{no_reason:?}");
    assert_eq!(scontrol_as(&cluster, bin.path(), "root", &["update", "NodeName=node02", "State=RESUME"]).code, 0);
    assert_ne!(nodes(&c).await.into_iter().find(|n| n.name == "node02").unwrap().state, "drain");
    cluster.shutdown().await;
}

/// `quorum suspend` freezes a running job where it runs (its output stops growing), keeps its
/// node, and holds its time limit; `quorum resume` thaws it, and it then ends at its limit
/// lengthened by the time it was suspended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_job_stops_where_it_runs_and_its_limit_waits_until_resumed() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let env = cluster.controllers_env();
    let dir = tempfile::tempdir().unwrap();
    let root = |args: &[&str]| quorum_as(&env, Some("root"), dir.path(), args);
    let ticks = dir.path().join("ticks");
    let script = format!("while true; do echo tick >> {}; sleep 0.1; done", ticks.display());
    let mut s = spec(&["bash", "-c", &script], dir.path());
    s.time_limit_s = 6;
    let id = submit(&c, s).await;
    let started = wait_state(&c, id, &["RUNNING"], T).await;
    let count = || std::fs::read_to_string(&ticks).unwrap_or_default().lines().count();
    wait_for(T, "the job's first ticks", || async { (count() > 3).then_some(()) }).await;

    let other = quorum_as(&env, Some("upd-user"), dir.path(), &["suspend", &id.to_string()]);
    assert!(other.code == 1 && other.stderr.contains("only an operator may suspend a job"), "{other:?}");
    root(&["suspend", &id.to_string()]).success();
    assert_eq!(job(&c, id).await.state, "SUSPENDED");
    let queue = root(&["queue"]).success();
    let line = queue.lines().find(|l| l.split_whitespace().next() == Some(&id.to_string())).expect("listed");
    assert_eq!(line.split_whitespace().nth(4), Some("S"), "squeue's code for SUSPENDED: {queue}");
    // Frozen: once the stop has reached it, no tick in a second, nor at its first limit (6 s).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let frozen = count();
    let past_limit = Duration::from_millis((started.start_time_ms + 7_000).saturating_sub(now_ms()));
    tokio::time::sleep(past_limit.max(Duration::from_secs(1))).await;
    assert_eq!(count(), frozen, "the suspended job went on");
    let held = job(&c, id).await;
    assert_eq!((held.state.as_str(), held.nodelist.is_empty()), ("SUSPENDED", false), "{held:?}");

    let resumed_at = Instant::now();
    root(&["resume", &id.to_string()]).success();
    wait_for(T, "ticks again", || async { (count() > frozen).then_some(()) }).await;
    // It ends at its limit, later by the time it was suspended: about 6 s of running in all.
    let ended = wait_state(&c, id, &["TIMEOUT", "COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(ended.state, "TIMEOUT", "{ended:?}");
    assert!(resumed_at.elapsed() > Duration::from_secs(2), "killed {:?} after its resume", resumed_at.elapsed());
    let ran = ended.end_time_ms - started.start_time_ms;
    assert!(ran > 9_000, "it ran {ran} ms, its suspension not counted against its 6 s");
    cluster.shutdown().await;
}
