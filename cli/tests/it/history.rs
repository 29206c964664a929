//! The job history: ended jobs leave the hot state after `min_job_age` and answer from the
//! history on every replica, a restarted one included; dependencies and retried submits still
//! find them; `quorum acct` (sacct) reports them.

use crate::common;

use std::time::Duration;

use common::*;
use quorum_dev::cluster::DevOptions;
use quorum_proto::api;

const T: Duration = Duration::from_secs(30);

/// The jobs replica `addr` lists from its own state and history, at once.
async fn listed_by(addr: &str, history: bool) -> Vec<api::JobInfo> {
    let c = client(&[addr.to_string()]);
    let req = api::ListJobsRequest { stale: true, history, ..Default::default() };
    c.call(|mut cl| {
        let req = req.clone();
        async move { cl.list_jobs(req).await }
    })
    .await
    .expect("list jobs")
    .jobs
}

async fn job_from(addr: &str, id: u64) -> api::JobInfo {
    let c = client(&[addr.to_string()]);
    c.call(
        |mut cl| async move { cl.get_job(api::GetJobRequest { job_id: id, stale: true, array_task_id: None }).await },
    )
    .await
    .expect("get job")
    .job
    .expect("a job")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_jobs_move_to_the_history_and_answer_from_it_on_every_replica() {
    let mut cluster = cluster(DevOptions { min_job_age: Duration::from_secs(2), ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();

    let ok = submit_with_id(&c, spec(&["true"], dir.path()), "kept-request").await.unwrap().job_id;
    let failed = submit(&c, spec(&["false"], dir.path())).await;
    let mut array_spec = spec(&["true"], dir.path());
    array_spec.array = "0-2".into();
    let array = submit(&c, array_spec).await;
    wait_state(&c, ok, &["COMPLETED"], T).await;
    wait_state(&c, failed, &["FAILED"], T).await;
    for task in array..array + 3 {
        wait_state(&c, task, &["COMPLETED"], T).await;
    }
    let before = job(&c, ok).await;

    // They leave every replica's hot state...
    for addr in cluster.addrs.clone() {
        wait_for(T, "the ended jobs to leave the hot state", || {
            let addr = addr.clone();
            async move { listed_by(&addr, false).await.iter().all(|j| j.id > array + 2).then_some(()) }
        })
        .await;
    }
    // ... and every replica answers for them from its history, the same record.
    for addr in &cluster.addrs {
        let j = job_from(addr, ok).await;
        assert_eq!((j.state.as_str(), j.exit_code, j.end_time_ms), ("COMPLETED", 0, before.end_time_ms), "{addr}");
        assert_eq!((&j.nodelist, j.alloc_index), (&before.nodelist, before.alloc_index));
        assert_eq!(job_from(addr, failed).await.state, "FAILED");
        let ids: Vec<u64> = listed_by(addr, true).await.iter().map(|j| j.id).collect();
        assert_eq!(ids, (ok..=array + 2).collect::<Vec<_>>(), "{addr}");
    }

    // A retried submit gets its job back, long after it left.
    let retried = submit_with_id(&c, spec(&["true"], dir.path()), "kept-request").await.unwrap();
    assert!(retried.duplicate && retried.job_id == ok, "{retried:?}");

    // Dependencies on jobs that left: once their tombstones have gone too (min_job_age after
    // they left), the leader recalls them from the history.
    wait_for(T, "the tombstones to go", || {
        let gone = (0..3).all(|i| {
            let state = &cluster.controller(i).unwrap().replica.shared.read().state;
            !state.departed.contains_key(&ok) && !state.departed.contains_key(&array)
        });
        async move { gone.then_some(()) }
    })
    .await;
    let mut after_ok = spec(&["true"], dir.path());
    after_ok.dependency = format!("afterok:{ok},afterok:{array}");
    let after_ok = submit(&c, after_ok).await;
    let mut after_failed = spec(&["true"], dir.path());
    after_failed.dependency = format!("afterok:{failed}");
    let after_failed = submit(&c, after_failed).await;
    let leader = cluster.leader().unwrap();
    let recalled = cluster.controller(leader).unwrap().replica.shared.read().state.departed.contains_key(&ok);
    assert!(recalled, "the leader recalled job {ok} from the history for the dependency");
    wait_state(&c, after_ok, &["COMPLETED"], T).await;
    wait_for(T, "the dependency on a failed job to be never satisfied", || {
        let c = &c;
        async move { (job(c, after_failed).await.reason == "DependencyNeverSatisfied").then_some(()) }
    })
    .await;

    // A replica restarted from its data directory still answers from its history.
    let leader = cluster.leader().unwrap();
    let follower = (0..3).find(|i| *i != leader).unwrap();
    cluster.stop_controller(follower).await;
    cluster.restart_controller(follower).await.unwrap();
    let addr = cluster.addrs[follower].clone();
    let j = wait_for(T, "the restarted replica to answer", || {
        let addr = addr.clone();
        async move {
            let c = client(&[addr]);
            let r = c
                .call(|mut cl| async move {
                    cl.get_job(api::GetJobRequest { job_id: ok, stale: true, array_task_id: None }).await
                })
                .await;
            r.ok().and_then(|r| r.job)
        }
    })
    .await;
    assert_eq!((j.state.as_str(), j.end_time_ms), ("COMPLETED", before.end_time_ms));

    // `quorum acct` (sacct) reports them from the history, with their steps' line.
    let env = cluster.controllers_env();
    let out = quorum(
        &env,
        dir.path(),
        &["acct", "-X", "-n", "-P", "-j", &format!("{ok},{failed}"), "-o", "JobID,State,ExitCode"],
    )
    .success();
    assert_eq!(out, format!("{ok}|COMPLETED|0:0\n{failed}|FAILED|1:0\n"));
    let out = quorum(&env, dir.path(), &["acct", "-n", "-P", "-S", "now-1hour", "-o", "JobID,State"]).success();
    for id in [ok, failed] {
        assert!(out.contains(&format!("{id}|")), "{id} in {out}");
    }
    // By partition and by account.
    let by = |filter: &[&str]| {
        let args = [&["acct", "-X", "-n", "-P", "-S", "now-1hour", "-o", "JobID"][..], filter].concat();
        quorum(&env, dir.path(), &args).success()
    };
    assert!(by(&["-r", &j.partition]).lines().any(|l| l == ok.to_string()), "{}", j.partition);
    assert_eq!(by(&["--partition=nosuch"]), "");
    if !j.account.is_empty() {
        assert!(by(&["-A", &j.account]).lines().any(|l| l == ok.to_string()), "{}", j.account);
    }
    assert_eq!(by(&["--accounts", "nosuch"]), "");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_s_cpu_time_and_peak_memory_are_recorded_as_it_used_them() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    // The job fills 200 MB and burns a second of CPU, then says what it used, as the kernel
    // counts it for itself.
    let program = "import resource, time\n\
        block = bytearray(b'x' * (200 << 20))\n\
        start = time.process_time()\n\
        while time.process_time() - start < 1.0:\n    pass\n\
        u = resource.getrusage(resource.RUSAGE_SELF)\n\
        print(int((u.ru_utime + u.ru_stime) * 1e6), u.ru_maxrss)\n";
    let mut job_spec = spec(&["python3", "-c", program], dir.path());
    job_spec.mem_per_node_mb = 1024;
    let id = submit(&c, job_spec).await;
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    let out = std::fs::read_to_string(dir.path().join(format!("quorum-{id}.out"))).unwrap();
    let said: Vec<u64> = out.split_whitespace().map(|v| v.parse().unwrap()).collect();
    let (cpu_us, rss_kb) = (said[0], said[1]);
    let usage = j.usage.expect("the job's usage is recorded");
    let total = usage.cpu_user_us + usage.cpu_system_us;
    let near = |got: u64, did: u64| got.abs_diff(did) * 10 <= did;
    assert!(near(total, cpu_us), "CPU recorded {total} µs, the job used {cpu_us} µs");
    assert!(
        near(usage.max_rss_kb, rss_kb),
        "peak memory recorded {} KiB, the job's was {rss_kb} KiB",
        usage.max_rss_kb
    );
    assert!(rss_kb > 200 << 10, "the job held its 200 MB: {rss_kb} KiB");
    // sacct's fields.
    let out = quorum(
        &cluster.controllers_env(),
        dir.path(),
        &["acct", "-X", "-n", "-P", "-j", &id.to_string(), "-o", "JobID,TotalCPU,MaxRSS"],
    )
    .success();
    let fields: Vec<&str> = out.trim().split('|').collect();
    assert_eq!(fields[0], id.to_string());
    // TotalCPU is what was recorded (at least the second it burned; starting Python and filling
    // the 200 MB add to it, more on a loaded machine), as MM:SS.mmm.
    let shown_ms = fields[1]
        .split_once(':')
        .and_then(|(m, s)| Some(m.parse::<f64>().ok()? * 60_000.0 + s.parse::<f64>().ok()? * 1000.0))
        .unwrap_or_else(|| panic!("TotalCPU in {out}"));
    assert!(shown_ms >= 990.0 && (shown_ms - total as f64 / 1000.0).abs() <= 1.0, "{out}: recorded {total} µs");
    assert_eq!(fields[2], format!("{}K", usage.max_rss_kb));
    // seff's report of it: the CPU time recorded (the second it burned, more on a loaded machine)
    // over its wall-clock time on one core, and its 200-odd MB of the 1 GB it was given.
    let out = quorum(&cluster.controllers_env(), dir.path(), &["eff", &id.to_string()]).success();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], format!("Job ID: {id}"), "{out}");
    assert!(lines.contains(&"State: COMPLETED (exit code 0)") && lines.contains(&"Cores: 1"), "{out}");
    let cpu_s = total / 1_000_000;
    let utilized = format!("CPU Utilized: {:02}:{:02}:{:02}", cpu_s / 3600, cpu_s / 60 % 60, cpu_s % 60);
    assert!(cpu_s >= 1 && lines.contains(&utilized.as_str()), "{out}: recorded {total} µs");
    let rss_mb = usage.max_rss_kb as f64 / 1024.0;
    assert!(lines.contains(&format!("Memory Utilized: {rss_mb:.2} MB").as_str()), "{out}");
    let efficiency = format!("Memory Efficiency: {:.2}% of 1.00 GB (1.00 GB/node)", rss_mb * 100.0 / 1024.0);
    assert!(lines.contains(&efficiency.as_str()), "{out}");
    // sreport's view: the user's CPU seconds in the last hour, its account's and the cluster's,
    // each at least the job's (it ran a second or more on one CPU).
    let out = quorum(
        &cluster.controllers_env(),
        dir.path(),
        &["report", "-P", "-n", "-t", "Seconds", "cluster", "AccountUtilizationByUser", "start=now-1hour", "end=now"],
    )
    .success();
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split('|').collect()).collect();
    let used = |row: &Vec<&str>| row[4].parse::<u64>().unwrap();
    assert_eq!(rows[0][..2], ["quorum", "root"], "{out}");
    let mine = rows.iter().find(|r| r[2] == j.user).unwrap_or_else(|| panic!("no line for {}: {out}", j.user));
    assert!(used(mine) >= 1 && used(mine) <= used(&rows[0]), "{out}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_process_that_left_the_job_used_still_counts() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    // A daemon's escape: a shell starts a second of CPU work in a session of its own and ends
    // at once, so no process of the job ever waits for it; the job's main process sleeps on.
    let burn = "import time\nstart = time.process_time()\nwhile time.process_time() - start < 1.0:\n    pass\n";
    let script = format!("sh -c 'setsid python3 -c \"{burn}\" </dev/null >/dev/null 2>&1 &'; sleep 2.5");
    let id = submit(&c, spec(&["sh", "-c", &script], dir.path())).await;
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    let usage = j.usage.expect("the job's usage is recorded");
    let total = usage.cpu_user_us + usage.cpu_system_us;
    assert!(total >= 900_000, "the escaped process's second of CPU counts: {total} µs recorded");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_s_peak_memory_is_what_its_processes_held_together() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    // Two processes hold 150 MB each at once for three seconds (heartbeats, 1 s, sample it):
    // the job's peak is about their sum, where the larger one alone reached about half.
    let hold = "import time\nblock = b'x' * (150 << 20)\ntime.sleep(3)\n";
    let script = format!("python3 -c \"{hold}\" & python3 -c \"{hold}\" & wait");
    let mut job_spec = spec(&["sh", "-c", &script], dir.path());
    job_spec.mem_per_node_mb = 1024;
    let id = submit(&c, job_spec).await;
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    let usage = j.usage.expect("the job's usage is recorded");
    assert!(usage.max_rss_kb >= 290 << 10, "both processes' memory at once: {} KiB", usage.max_rss_kb);
    assert!(usage.max_rss_kb < 400 << 10, "no more than they held: {} KiB", usage.max_rss_kb);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sstat_shows_what_a_running_job_uses_now() {
    let cluster = cluster(DevOptions::for_tests()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    // 200 MB held, then CPU burned until it is cancelled.
    let program = "block = b'x' * (200 << 20)\nwhile True:\n    pass\n";
    let mut job_spec = spec(&["python3", "-c", program], dir.path());
    job_spec.mem_per_node_mb = 1024;
    let id = submit(&c, job_spec).await;
    wait_state(&c, id, &["RUNNING"], T).await;
    let env = cluster.controllers_env();
    let stat = |args: &[&str]| quorum(&env, dir.path(), args);
    let (cpu, rss) = wait_for(T, "sstat to show the job's CPU and memory", || {
        // RUNNING is committed before the agent has launched it: until then its agent says so.
        let run = stat(&["stat", "-j", &id.to_string(), "-o", "JobID,TotalCPU,MaxRSS,NTasks", "-P", "-n"]);
        let launching = run.code != 0 && run.stderr.contains("is not running on this node");
        let out = if launching { String::new() } else { run.success() };
        let fields: Vec<String> = out.trim().split('|').map(String::from).collect();
        async move {
            if launching {
                return None;
            }
            assert_eq!(fields[0], format!("{id}.batch"), "{fields:?}");
            let rss: u64 = fields[2].trim_end_matches('K').parse().ok()?;
            (fields[1].as_str() >= "00:00.500" && rss > 200 << 10).then(|| (fields[1].clone(), rss))
        }
    })
    .await;
    assert!(cpu.starts_with("00:"), "{cpu}");
    assert!(rss < 400 << 10, "the job holds about 200 MB, not {rss} KiB");
    // Only its owner or an operator may look.
    let other = quorum_as(&env, Some("qstat-other"), dir.path(), &["stat", "-j", &id.to_string()]);
    assert_ne!(other.code, 0);
    assert!(other.stderr.contains("only its owner or an operator"), "{}", other.stderr);
    cancel(&c, id).await;
    wait_state(&c, id, &["CANCELLED"], T).await;
    let ended = stat(&["stat", "-j", &id.to_string()]);
    assert!(ended.code != 0 && ended.stderr.contains("is not running"), "{}", ended.stderr);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_forgets_jobs_purge_job_after_their_end_on_every_replica() {
    let opts = DevOptions {
        min_job_age: Duration::from_secs(1),
        purge_job_after: Duration::from_secs(8),
        ..DevOptions::for_tests()
    };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let old = submit(&c, spec(&["true"], dir.path())).await;
    let user = wait_state(&c, old, &["COMPLETED"], T).await.user;
    let histories: Vec<_> = (0..3).map(|i| cluster.controller(i).unwrap().replica.shared.history.clone()).collect();
    // In every replica's history once it leaves the hot state...
    wait_for(T, "the job in every history", || async {
        histories.iter().all(|h| h.get(old).ok().flatten().is_some()).then_some(())
    })
    .await;
    // ...and gone from each, its indexes with it, once it ended purge_job_after ago.
    wait_for(T, "the job forgotten by every history", || async {
        histories.iter().all(|h| h.get(old).ok().flatten().is_none()).then_some(())
    })
    .await;
    for h in &histories {
        assert!(!h.ended_since(Some(&user), 0, u64::MAX).unwrap().contains(&old), "its user's index kept it");
        assert!(!h.ended_since(None, 0, u64::MAX).unwrap().contains(&old), "the end-time index kept it");
    }
    let gone = c
        .call(|mut cl| async move { cl.get_job(api::GetJobRequest { job_id: old, ..Default::default() }).await })
        .await
        .unwrap_err();
    assert!(gone.to_string().contains(&format!("job {old} does not exist")), "{gone}");
    // A job that ended since is still there: only what ended before the age goes.
    let recent = submit(&c, spec(&["true"], dir.path())).await;
    wait_state(&c, recent, &["COMPLETED"], T).await;
    wait_for(T, "the recent job in the history", || async {
        histories.iter().all(|h| h.get(recent).ok().flatten().is_some()).then_some(())
    })
    .await;
    assert_eq!(job(&c, recent).await.state, "COMPLETED");
    cluster.shutdown().await;
}
