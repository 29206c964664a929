//! Fairshare down to users and the limits sites set most, on a cluster with agents, as an
//! operator sets them (`quorum admin account|qos`) and users meet them: a submit past
//! `MaxSubmitJobs` refused with the limit named, a job past `MaxTRESPerJob` or a spent
//! `GrpTRESMins` budget pending with Slurm's reason, and `sshare -a` with each user's own line.

use crate::common;

use std::time::Duration;

use common::*;
use quorum_dev::cluster::DevOptions;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_meet_their_limits_and_see_their_own_shares() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let env = cluster.controllers_env();
    let (dir, bin) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let root = |args: &[&str]| quorum_as(&env, Some("root"), dir.path(), args);
    let (env_ref, dir_ref) = (&env, dir.path());
    let as_user = |user: &'static str| move |args: &[&str]| quorum_as(env_ref, Some(user), dir_ref, args);
    let (ann, ben) = (as_user("lim-ann"), as_user("lim-ben"));

    // A limit a replica below level 20 would not know waits for the cluster to reach it; a
    // dev cluster's replicas are all of this build, so it lands as soon as their level is
    // recorded.
    let account = [
        "admin",
        "account",
        "lab",
        "--users",
        "lim-ann,lim-ben",
        "--user-shares",
        "lim-ben=3",
        "--max-submit-jobs",
        "2",
        "--max-tres-per-job",
        "cpu=4",
        // Its users may use these QOS (as a Slurm association's QOS=).
        "--qos",
        "normal,budget",
    ];
    wait_for(T, "the account with level-20 limits", || async { (root(&account).code == 0).then_some(()) }).await;
    let bad = root(&["admin", "qos", "normal", "--max-tres-per-user", "cpu=4,disk=9"]);
    assert!(bad.code != 0 && bad.stderr.contains("unknown TRES 'disk'"), "{bad:?}");
    root(&["admin", "qos", "normal"]).success();
    root(&["admin", "qos", "budget", "--grp-tres-mins", "cpu=1", "--no-decay"]).success();

    // Two jobs each, then the third is refused with the limit named; the other user has theirs.
    submitted(ann(&["submit", "-A", "lab", "--", "sleep", "100"]));
    submitted(ann(&["submit", "-A", "lab", "--", "sleep", "100"]));
    let third = ann(&["submit", "-A", "lab", "--", "true"]);
    assert!(
        third.code != 0
            && third.stderr.contains(
                "job violates accounting/QOS policy: MaxSubmitJobs=2 of account 'lab' (for account 'lab') \
                 (user 'lim-ann' has 2 jobs pending or running)"
            ),
        "{third:?}"
    );
    // Past what one job may ask for: it waits with Slurm's reason, in squeue too.
    let wide = submitted(ben(&["submit", "-A", "lab", "-c", "6", "--", "true"]));
    let cr = &c;
    let reason = move |id: u64| async move { job(cr, id).await.reason };
    wait_for(T, "AssocMaxCpuPerJobLimit", || async { (reason(wide).await == "AssocMaxCpuPerJobLimit").then_some(()) })
        .await;
    let squeue = slurm_as(&cluster, bin.path(), "squeue", "lim-ben", &["-h", "-o", "%i %r", "-j", &wide.to_string()]);
    assert_eq!(squeue.success().trim(), format!("{wide} AssocMaxCpuPerJobLimit"));

    // A budget of one CPU-minute with no decay: a job on four CPUs spends it in 15 s of
    // running; the next job of the QOS then waits, and still waits once the first has ended
    // (its use is charged and does not decay).
    root(&["cancel", &wide.to_string()]).success();
    let spender = submitted(ben(&["submit", "-A", "lab", "-q", "budget", "-c", "4", "--", "sleep", "100"]));
    let started = wait_state(&c, spender, &["RUNNING"], T).await.start_time_ms;
    let spent_at = started + 16_000;
    tokio::time::sleep(Duration::from_millis(spent_at.saturating_sub(now_ms()))).await;
    let waiting = submitted(ben(&["submit", "-A", "lab", "-q", "budget", "--", "true"]));
    wait_for(T, "QOSGrpCPUMinutesLimit", || async { (reason(waiting).await == "QOSGrpCPUMinutesLimit").then_some(()) })
        .await;
    root(&["cancel", &spender.to_string()]).success();
    wait_state(&c, spender, &["CANCELLED"], T).await;
    // Later cycles (one ran the job submitted here) give it the same reason.
    let later = submitted(root(&["submit", "-A", "lab", "--", "true"]));
    wait_state(&c, later, &["COMPLETED"], T).await;
    assert_eq!(job(&c, waiting).await.state, "PENDING");
    assert_eq!(reason(waiting).await, "QOSGrpCPUMinutesLimit");

    // Each user's own line under the account: shares 1 and 3.
    let sshare = slurm_as(&cluster, bin.path(), "sshare", "root", &["-a", "-P", "-n", "-A", "lab"]).success();
    let line = |user: &str| sshare.lines().find(|l| l.split('|').nth(1) == Some(user)).map(str::to_string);
    let ann_line = line("lim-ann").unwrap_or_else(|| panic!("{sshare}"));
    let ben_line = line("lim-ben").unwrap_or_else(|| panic!("{sshare}"));
    assert!(ann_line.starts_with("lab|lim-ann|1|") && ben_line.starts_with("lab|lim-ben|3|"), "{sshare}");
    cluster.shutdown().await;
}
