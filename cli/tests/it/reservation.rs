//! Advance reservations on a cluster with agents, through the Slurm command names: an operator
//! sets node02 aside for one user; that user's jobs run there and nowhere else, other jobs keep
//! off it and say why, strangers are refused, a reservation in use cannot be deleted, and a job
//! in a reservation that ends is stopped at its end.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use quorum_dev::cluster::DevOptions;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_keeps_its_node_for_its_users_and_ends_their_jobs_with_it() {
    for user in ["resv-user", "resv-other"] {
        ensure_user(user);
    }
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let env = cluster.controllers_env();
    let (dir, bin) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Jobs run as their users, who write their output here.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let as_user = |user: &str, args: &[&str]| quorum_as(&env, Some(user), dir.path(), args);
    let scontrol = |user: &str, args: &[&str]| slurm_as(&cluster, bin.path(), "scontrol", user, args);

    // Only operators make reservations.
    let refused = scontrol(
        "resv-user",
        &["create", "reservation", "ReservationName=lab", "Duration=60", "Nodes=node02", "Users=resv-user"],
    );
    assert!(refused.stderr.contains("may not call CreateReservation: it needs the operator role"), "{refused:?}");
    let made = scontrol(
        "root",
        &[
            "create",
            "reservation",
            "ReservationName=lab",
            "StartTime=now",
            "Duration=UNLIMITED",
            "Nodes=node02",
            "Users=resv-user",
        ],
    );
    assert_eq!(made.success(), "Reservation created: lab\n");
    let shown = scontrol("resv-user", &["show", "reservation", "lab"]).success();
    for part in
        ["ReservationName=lab ", "Duration=UNLIMITED", "Nodes=node02 NodeCnt=1", "Users=resv-user", "State=ACTIVE"]
    {
        assert!(shown.contains(part), "{part} in {shown}");
    }
    let listed = slurm_as(&cluster, bin.path(), "sinfo", "resv-user", &["-T"]).success();
    assert!(listed.lines().any(|l| l.starts_with("lab") && l.contains("ACTIVE") && l.ends_with("node02")), "{listed}");

    // Its user's job runs on its node; whole-node jobs of others take node01, then wait.
    let inside = submitted(as_user("resv-user", &["submit", "--exclusive", "--reservation=lab", "--", "sleep", "300"]));
    let outside = submitted(as_user("resv-other", &["submit", "--exclusive", "--", "sleep", "300"]));
    let waiting = submitted(as_user("resv-other", &["submit", "--exclusive", "--", "sleep", "300"]));
    assert_eq!(wait_state(&c, inside, &["RUNNING"], T).await.nodelist, "node02");
    assert_eq!(wait_state(&c, outside, &["RUNNING"], T).await.nodelist, "node01");
    let why = wait_for(T, "the reason of the job outside", || async {
        let j = job(&c, waiting).await;
        (j.reason != "None").then_some(j)
    })
    .await;
    assert_eq!(
        (why.state.as_str(), why.reason.as_str()),
        ("PENDING", "ReqNodeNotAvail, May be reserved for other job")
    );
    let start = as_user("resv-other", &["queue", "--start"]).success();
    let after = start.split("Advance reservations").nth(1).unwrap_or_else(|| panic!("{start}"));
    assert!(after.lines().any(|l| l.starts_with("lab") && l.ends_with("node02")), "{start}");
    let squeue =
        slurm_as(&cluster, bin.path(), "squeue", "resv-user", &["-h", "-o", "%i %v", "-j", &inside.to_string()]);
    assert_eq!(squeue.success().trim(), format!("{inside} lab"));

    // Strangers and unknown reservations are refused at submit, naming why.
    let stranger = as_user("resv-other", &["submit", "--reservation=lab", "--", "true"]);
    assert!(stranger.stderr.contains("reservation 'lab': access denied: neither user 'resv-other'"), "{stranger:?}");
    let unknown = as_user("resv-user", &["submit", "--reservation=nope", "--", "true"]);
    assert!(unknown.stderr.contains("reservation 'nope': no such reservation"), "{unknown:?}");

    // In use, it stays; once its job is gone it goes, and node02 takes the job that waited.
    let busy = scontrol("root", &["delete", "ReservationName=lab"]);
    assert!(busy.stderr.contains(&format!("it is in use by job {inside} (RUNNING)")), "{busy:?}");
    as_user("resv-user", &["cancel", &inside.to_string()]).success();
    wait_state(&c, inside, &["CANCELLED"], T).await;
    scontrol("root", &["delete", "ReservationName=lab"]).success();
    assert_eq!(wait_state(&c, waiting, &["RUNNING"], T).await.nodelist, "node02");
    assert!(scontrol("root", &["show", "reservation"]).success().contains("No reservations in the system"));
    for j in [outside, waiting] {
        as_user("resv-other", &["cancel", &j.to_string()]).success();
        wait_state(&c, j, &["CANCELLED"], T).await;
    }

    // A job in a reservation of 6 s (for the jobs of account root, every job's here), with a
    // limit of 10 minutes, is stopped where the reservation ends.
    scontrol(
        "root",
        &["create", "reservation", "ReservationName=short", "Duration=0:06", "Nodes=node01", "Accounts=root"],
    )
    .success();
    let cut = submitted(as_user("resv-user", &["submit", "-t", "10", "--reservation=short", "--", "sleep", "300"]));
    let started = wait_state(&c, cut, &["RUNNING"], T).await;
    assert_eq!(started.nodelist, "node01");
    let since = Instant::now();
    let ended = wait_state(&c, cut, &["TIMEOUT", "COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(ended.state, "TIMEOUT", "{ended:?}");
    assert!(since.elapsed() < Duration::from_secs(25), "it ran {:?} after it started", since.elapsed());
    let ran_ms = ended.end_time_ms.saturating_sub(started.start_time_ms);
    assert!(ran_ms < 20_000, "it ran {ran_ms} ms in a reservation of 6 s");

    // A FLEX reservation an hour ahead: its job starts now, before it; without the flag the
    // same job waits for the window.
    let flex = |name: &str, node: &str, flags: &[&str]| {
        let mut args = vec!["create", "reservation"];
        let (name, node) = (format!("ReservationName={name}"), format!("Nodes={node}"));
        args.extend([name.as_str(), "StartTime=now+1hour", "Duration=0:06", node.as_str(), "Accounts=root"]);
        args.extend(flags);
        scontrol("root", &args).success();
    };
    flex("early", "node01", &["Flags=FLEX"]);
    let shown = scontrol("root", &["show", "reservation", "early"]).success();
    assert!(shown.contains("Flags=FLEX") && shown.contains("State=INACTIVE"), "{shown}");
    let before = submitted(as_user("resv-user", &["submit", "-t", "10", "--reservation=early", "--", "sleep", "300"]));
    assert_eq!(wait_state(&c, before, &["RUNNING"], T).await.nodelist, "node01");
    flex("strict", "node02", &[]);
    let waits = submitted(as_user("resv-user", &["submit", "-t", "10", "--reservation=strict", "--", "sleep", "300"]));
    let why = wait_for(T, "the strict reservation's job's reason", || async {
        let j = job(&c, waits).await;
        (j.reason != "None").then_some(j)
    })
    .await;
    assert_eq!((why.state.as_str(), why.reason.as_str()), ("PENDING", "Reservation"));
    for j in [before, waits] {
        as_user("resv-user", &["cancel", &j.to_string()]).success();
    }
}
