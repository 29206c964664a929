//! quorum-dbd against a real PostgreSQL: every job that left the hot state is in the database
//! exactly once, after the exporter was killed with a transaction open, after the leader it
//! read from was stopped, and after every replica was down a while; every replica gives the
//! history in the same order; across the network the export is TLS.

use crate::common;

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
    /// Its loopback port, when it listens there.
    port: Option<u16>,
}

impl Postgres {
    fn start() -> Postgres {
        Postgres::start_with(None)
    }

    /// With `tls` (its certificate and key): listening on the loopback too, taking there only
    /// TLS connections (`hostssl`), on the port it returns.
    fn start_with(tls: Option<(&Path, &Path)>) -> Postgres {
        let bin = postgres_bin().expect(
            "PostgreSQL's server binaries (initdb, pg_ctl) are missing: install postgresql (scripts/install-build-deps.sh does)",
        );
        let dir = tempfile::Builder::new().prefix("quorum-pg-").tempdir().unwrap();
        // The server refuses to run as root: as the system's postgres user then.
        let chown = |path: &Path| {
            if is_root() {
                let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(path).status().unwrap();
                assert!(status.success(), "chown to the postgres user");
            }
        };
        chown(dir.path());
        let mut pg = Postgres { bin, dir, port: None };
        pg.run("initdb", &["-D", &pg.data(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"]);
        let mut options = format!("-k {} -c fsync=off", pg.dir.path().display());
        match tls {
            None => options.push_str(" -c listen_addresses=''"),
            Some((cert, key)) => {
                let data = PathBuf::from(pg.data());
                std::fs::copy(cert, data.join("server.crt")).unwrap();
                std::fs::copy(key, data.join("server.key")).unwrap();
                std::fs::set_permissions(data.join("server.key"), std::os::unix::fs::PermissionsExt::from_mode(0o600))
                    .unwrap();
                std::fs::write(data.join("pg_hba.conf"), "local all all trust\nhostssl all all 127.0.0.1/32 trust\n")
                    .unwrap();
                chown(&data);
                let port = quorum_dev::ports::free_port().unwrap();
                options.push_str(&format!(" -c listen_addresses=127.0.0.1 -p {port} -c ssl=on"));
                pg.port = Some(port);
            }
        }
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
        match self.port {
            // The socket's directory names the port too.
            Some(port) => format!("host={} port={port} user=postgres dbname=postgres", self.dir.path().display()),
            None => format!("host={} user=postgres dbname=postgres", self.dir.path().display()),
        }
    }

    /// Over TCP, to the loopback by name (what a certificate names).
    fn tcp_conn(&self) -> String {
        format!("host=localhost port={} user=postgres dbname=postgres", self.port.expect("listening on the loopback"))
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
    dbd_to(&pg.conn(), controllers, args)
}

/// quorum-dbd writing to the database `conn` names.
fn dbd_to(conn: &str, controllers: &str, args: &[&str]) -> Command {
    let mut command = Command::new(sibling_binary("quorum-dbd"));
    command
        .args(["--postgres", conn, "--cluster", "test"])
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

    // Every replica down for a while: the exporters wait it out, and go on once it is back.
    for i in (0..3).filter(|i| *i != leader) {
        cluster.stop_controller(i).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for exporter in [&mut follower, &mut beside] {
        assert!(exporter.try_wait().unwrap().is_none(), "an exporter gave up while the cluster was down");
    }
    for i in 0..3 {
        cluster.restart_controller(i).await.expect("restart a replica");
    }
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let mut third = Vec::new();
    for _ in 0..3 {
        third.push(submit(&c, spec(&["true"], dir.path())).await);
    }
    let all: Vec<u64> = all.into_iter().chain(third).collect();
    wait_for(T, "every job exported after the outage", || async { (exported_ids(&db).await == all).then_some(()) })
        .await;
    kill(&mut follower);
    kill(&mut beside);
    assert_eq!(count(&db, "SELECT count(*) FROM quorum_export").await, 1);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_the_network_the_export_is_tls_with_the_server_s_certificate_checked() {
    // PostgreSQL with a certificate for localhost from an authority of the test's own, taking
    // nothing but TLS over TCP.
    let certs = tempfile::tempdir().unwrap();
    let pki = quorum_auth::pki::Layout::new(certs.path().join("ours"));
    pki.init().unwrap();
    let (cert, key) = pki.issue(&quorum_auth::pki::PeerRole::Replica(1), &[]).unwrap();
    let stranger = quorum_auth::pki::Layout::new(certs.path().join("theirs"));
    stranger.init().unwrap();
    let pg = Postgres::start_with(Some((&cert, &key)));
    let db = pg.client().await;

    let cluster = cluster(DevOptions { min_job_age: Duration::from_secs(1), ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let controllers = cluster.controllers_env();
    let mut ids = BTreeSet::new();
    for _ in 0..3 {
        ids.insert(submit(&c, spec(&["true"], dir.path())).await);
    }
    for id in &ids {
        wait_state(&c, *id, &["COMPLETED"], T).await;
    }
    wait_for(T, "the jobs to leave the hot state", || async {
        (!all_jobs(&c).await.iter().any(|j| ids.contains(&j.id))).then_some(())
    })
    .await;

    let run = |args: &[&str]| {
        let out = dbd_to(&pg.tcp_conn(), &controllers, &[&["--once"][..], args].concat()).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // Without TLS (the loopback is allowed it): the server refuses the plaintext connection.
    let (ok, err) = run(&[]);
    assert!(!ok && err.contains("no encryption"), "{err}");
    // Trusting another authority: the server's certificate is refused.
    let (ok, err) = run(&["--postgres-ca", &stranger.ca().display().to_string()]);
    assert!(!ok && err.contains("invalid peer certificate"), "{err}");
    // The right authority, but a certificate that does not name the host asked for (the
    // address is the server's, the name another's).
    let port = pg.port.unwrap();
    let conn = format!("host=db.example.org hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres");
    let out =
        dbd_to(&conn, &controllers, &["--once", "--postgres-ca", &pki.ca().display().to_string()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("invalid peer certificate"), "{err}");
    // None got as far as making the tables.
    assert_eq!(count(&db, "SELECT count(*) FROM pg_tables WHERE tablename = 'quorum_jobs'").await, 0);
    // Trusting the one that signed it: every job, over TLS.
    let (ok, err) = run(&["--postgres-ca", &pki.ca().display().to_string()]);
    assert!(ok, "{err}");
    assert_eq!(exported_ids(&db).await, ids.iter().copied().collect::<Vec<_>>());
    // A remote database without TLS is refused before anything is sent.
    let out = dbd_to("host=db.example.org dbname=quorum", &controllers, &["--once"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--postgres-ca"), "{err}");
    cluster.shutdown().await;
}
