//! quorum-dbd against a real PostgreSQL: every job that left the hot state is in the database
//! exactly once, after the exporter was killed with a transaction open and after the leader
//! it read from was stopped; and every replica gives the history in the same order.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use quorum_dev::cluster::DevOptions;
use quorum_proto::api;

const T: Duration = Duration::from_secs(60);

/// A PostgreSQL server of its own, started from the system's binaries in a temporary
/// directory, listening on a Unix socket only; stopped when dropped.
struct Postgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl Postgres {
    fn start() -> Postgres {
        let bin = postgres_bin().expect(
            "PostgreSQL's server binaries (initdb, pg_ctl) are missing: install postgresql (scripts/install-build-deps.sh does)",
        );
        let dir = tempfile::Builder::new().prefix("quorum-pg-").tempdir().unwrap();
        // The server refuses to run as root: as the system's postgres user then.
        if is_root() {
            let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status().unwrap();
            assert!(status.success(), "chown to the postgres user");
        }
        let pg = Postgres { bin, dir };
        pg.run("initdb", &["-D", &pg.data(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"]);
        let options = format!("-k {} -c listen_addresses='' -c fsync=off", pg.dir.path().display());
        let log = pg.dir.path().join("log").display().to_string();
        pg.run("pg_ctl", &["start", "-w", "-D", &pg.data(), "-l", &log, "-o", &options]);
        pg
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let path = self.bin.join(tool);
        let out = if is_root() {
            Command::new("runuser").args(["-u", "postgres", "--"]).arg(&path).args(args).output()
        } else {
            Command::new(&path).args(args).output()
        }
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn conn(&self) -> String {
        format!("host={} user=postgres dbname=postgres", self.dir.path().display())
    }

    async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.conn(), tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(connection);
        client
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.data();
        let args = ["stop", "-D", data.as_str(), "-m", "immediate"];
        let path = self.bin.join("pg_ctl");
        let _ = if is_root() {
            Command::new("runuser").args(["-u", "postgres", "--"]).arg(&path).args(args).output()
        } else {
            Command::new(&path).args(args).output()
        };
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The newest installed server's binaries (Debian keeps them under /usr/lib/postgresql/N/bin).
fn postgres_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).or_else(|| {
        let out = Command::new("sh").args(["-c", "command -v initdb"]).output().ok()?;
        let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
        path.parent().map(Path::to_path_buf)
    })
}

/// quorum-dbd writing to `pg` from `controllers`, with `args` more.
fn dbd(pg: &Postgres, controllers: &str, args: &[&str]) -> Command {
    let mut command = Command::new(sibling_binary("quorum-dbd"));
    command
        .args(["--postgres", &pg.conn(), "--cluster", "test"])
        .args(args)
        .env("QUORUM_CONTROLLERS", controllers)
        .env("RUST_LOG", "quorum_dbd=debug")
        .envs(quorum_dev::security::DevSecurity::shared().env());
    command
}

fn kill(child: &mut Child) {
    // SAFETY: signalling a child of ours.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

async fn count(db: &tokio_postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e:?}")).get(0)
}

async fn exported_ids(db: &tokio_postgres::Client) -> Vec<u64> {
    let rows = db.query("SELECT job_id FROM quorum_jobs WHERE cluster = 'test' ORDER BY job_id", &[]).await.unwrap();
    rows.iter().map(|r| r.get::<_, i64>(0) as u64).collect()
}

/// The history in the order jobs entered it, as replica `addr` gives it.
async fn followed(addr: &str) -> Vec<(u64, u64)> {
    let c = client(&[addr.to_string()]);
    let page = c
        .call(|mut cl| async move {
            cl.follow_history(api::FollowHistoryRequest { after_index: 0, after_job_id: 0, limit: 1000 }).await
        })
        .await
        .expect("follow history");
    assert!(page.done);
    page.records.iter().map(|r| (r.index, r.job_id)).collect()
}

/// Submits `n` jobs (one of them a script with a step) and waits until they have all left
/// every replica's hot state: their ids.
async fn run_jobs_to_history(cluster: &quorum_dev::cluster::DevCluster, n: usize, dir: &Path) -> BTreeSet<u64> {
    let c = client(&cluster.addrs);
    let mut ids = BTreeSet::new();
    for _ in 1..n {
        ids.insert(submit(&c, spec(&["true"], dir)).await);
    }
    std::fs::write(dir.join("step.sh"), "#!/bin/bash\nsrun true\n").unwrap();
    let out = quorum(&cluster.controllers_env(), dir, &["submit", "step.sh"]).success();
    ids.insert(out.split_whitespace().last().and_then(|id| id.parse().ok()).expect("the job's id"));
    for id in &ids {
        wait_state(&c, *id, &["COMPLETED"], T).await;
    }
    wait_for(T, "the jobs to leave the hot state", || async {
        let hot = all_jobs(&c).await;
        (!hot.iter().any(|j| ids.contains(&j.id))).then_some(())
    })
    .await;
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_has_every_job_once_after_a_kill_mid_batch_and_after_a_failover() {
    let pg = Postgres::start();
    let db = pg.client().await;
    let mut cluster = cluster(DevOptions {
        min_job_age: Duration::from_secs(1),
        // srun on the jobs' PATH
        quorum_program: Some(env!("CARGO_BIN_EXE_quorum").into()),
        ..DevOptions::for_tests()
    })
    .await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let controllers = cluster.controllers_env();

    let first = run_jobs_to_history(&cluster, 24, dir.path()).await;
    // Every replica has them in the same order, the order the exporter follows.
    let order = followed(&cluster.addrs[0]).await;
    assert_eq!(order.iter().map(|(_, id)| *id).collect::<BTreeSet<_>>(), first);
    for addr in &cluster.addrs[1..] {
        assert_eq!(followed(addr).await, order, "{addr}");
    }
    // Everyone's jobs, whole: operators only.
    let user = client_as(&cluster.addrs, "tester");
    let refused = user
        .call(|mut cl| async move {
            cl.follow_history(api::FollowHistoryRequest { after_index: 0, after_job_id: 0, limit: 10 }).await
        })
        .await
        .expect_err("a user may not follow the history");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");

    // Killed with a batch written but not committed: it holds each transaction open 400 ms.
    let mut exporter = dbd(&pg, &controllers, &["--batch", "4", "--fault-stall-ms", "400", "--interval-s", "0.2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start quorum-dbd");
    wait_for(T, "two batches committed and a third open", || async {
        // (the exporter makes the tables)
        let committed = db.query_one("SELECT count(*) FROM quorum_jobs", &[]).await.ok()?.get::<_, i64>(0);
        let open = count(&db, "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'").await;
        (committed >= 8 && open >= 1).then_some(())
    })
    .await;
    kill(&mut exporter);
    let exported = exported_ids(&db).await;
    assert!(exported.len() < first.len(), "killed before it finished: {} of {}", exported.len(), first.len());
    assert_eq!(exported.len() % 4, 0, "whole batches only: {exported:?}");
    let place: (i64, i64) = {
        let r = db
            .query_one("SELECT after_index, after_job_id FROM quorum_export WHERE cluster = 'test'", &[])
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    let upto = order.iter().position(|(i, id)| (*i as i64, *id as i64) == place).expect("the place is a record's");
    let mut expected: Vec<u64> = order[..=upto].iter().map(|(_, id)| *id).collect();
    expected.sort();
    assert_eq!(exported, expected, "exactly the jobs up to its place");

    // Restarted, it goes on from there and stops once it has every job.
    let out = dbd(&pg, &controllers, &["--batch", "4", "--once"]).output().expect("run quorum-dbd --once");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("resuming after") && log.contains(&format!("job_id={}", place.1)), "{log}");
    assert_eq!(exported_ids(&db).await, first.iter().copied().collect::<Vec<_>>());
    let me = quorum_auth::users::current().expect("this user").name;
    let rows = db
        .query(
            "SELECT user_name, state, exit_code, node_list, alloc_cpus, elapsed_s >= 0, end_time >= start_time, \
             record->>'id' FROM quorum_jobs ORDER BY job_id",
            &[],
        )
        .await
        .unwrap();
    for (row, id) in rows.iter().zip(&first) {
        assert_eq!(row.get::<_, String>(0), me);
        assert_eq!((row.get::<_, String>(1), row.get::<_, Option<i32>>(2)), ("COMPLETED".into(), Some(0)), "{id}");
        assert!(row.get::<_, String>(3).starts_with("node"), "{id}");
        assert_eq!((row.get::<_, i32>(4), row.get::<_, bool>(5), row.get::<_, bool>(6)), (1, true, true));
        assert_eq!(row.get::<_, Option<String>>(7), Some(id.to_string()));
    }
    let script = *first.last().unwrap();
    let step = db
        .query_one(
            "SELECT step_id, state, ntasks, cpu_user_s IS NOT NULL AND max_rss_kb > 0 FROM quorum_steps WHERE job_id = $1",
            &[&(script as i64)],
        )
        .await
        .expect("the script's srun step");
    let step = (step.get::<_, i32>(0), step.get::<_, String>(1), step.get::<_, i32>(2), step.get::<_, bool>(3));
    assert_eq!(step, (0, "COMPLETED".into(), 1, true), "its number, state, tasks and what it used");

    // Following, through a failover: the replica it reads from is the leader, and is stopped.
    let leader = cluster.leader().expect("a leader");
    let mut order = cluster.addrs.clone();
    order.rotate_left(leader);
    let mut follower = dbd(&pg, &order.join(","), &["--interval-s", "0.2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start quorum-dbd");
    // A second exporter beside it: they take turns, and the export still has each job once.
    let mut beside = dbd(&pg, &controllers, &["--interval-s", "0.1", "--batch", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a second quorum-dbd");
    let c = client(&cluster.addrs);
    let mut second = BTreeSet::new();
    for _ in 0..6 {
        second.insert(submit(&c, spec(&["true"], dir.path())).await);
    }
    cluster.stop_controller(leader).await;
    for id in &second {
        wait_state(&c, *id, &["COMPLETED"], T).await;
    }
    let all: Vec<u64> = first.iter().chain(&second).copied().collect();
    wait_for(T, "every job exported after the failover", || async { (exported_ids(&db).await == all).then_some(()) })
        .await;
    kill(&mut follower);
    kill(&mut beside);
    assert_eq!(count(&db, "SELECT count(*) FROM quorum_export").await, 1);
    cluster.shutdown().await;
}
