//! quorum-dbd: follows a cluster's job history and writes it to PostgreSQL, for site reporting
//! (what slurmdbd's database is to a Slurm site).
//!
//! The history is the same on every replica, and every job has a place in it: the Raft index
//! of the entry that moved it there, then its id (`FollowHistory`). The exporter asks any
//! replica for the jobs after its place, a batch at a time, and writes each batch in one
//! transaction with its new place (table `quorum_export`): a batch is in the database whole or
//! not at all, and a restarted exporter, or one that meets another replica after a failover,
//! goes on from the last batch committed. Rows are keyed by cluster and job id and written
//! whole (`ON CONFLICT ... DO UPDATE`), so a batch written again changes nothing. Two exporters
//! of one cluster (one per controller host, say) take turns: each transaction locks the
//! cluster's place and gives up when another exporter has moved it since it was read.
//!
//! The tables are in `schema.sql` ([`SCHEMA`]).
//!
//! The jobs cross the network to PostgreSQL only under TLS ([`tls`], with `--postgres-ca`), or
//! in plaintext when the operator says the network is trusted; a Unix socket or the loopback
//! needs neither.

pub mod tls;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use quorum_client::client::Client;
use quorum_model::{hostlist, Job};
use quorum_proto::api::{FollowHistoryRequest, FollowHistoryResponse, HistoryRecord};
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, NoTls};

/// The tables (created when missing).
pub const SCHEMA: &str = include_str!("../schema.sql");

/// Where an export stands: the last job written, by its place in the history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    pub index: u64,
    pub job_id: u64,
}

/// What one exporter does.
#[derive(Clone, Debug)]
pub struct Options {
    /// PostgreSQL's connection string (`host=/var/run/postgresql dbname=quorum`).
    pub postgres: String,
    /// The name of the cluster in the tables (several clusters may share a database).
    pub cluster: String,
    /// Jobs per transaction.
    pub batch: u32,
    /// How long to wait, when none is left, before asking again.
    pub interval: Duration,
    /// Stop once none is left.
    pub once: bool,
    /// A fault for the tests: hold each transaction open this long before it commits.
    pub stall: Duration,
    /// The certificate authorities (PEM) that PostgreSQL's certificate is checked against:
    /// with them, every connection over TCP is TLS, the server's certificate naming its host.
    pub ca: Option<std::path::PathBuf>,
    /// Speak to a PostgreSQL across the network in plaintext, without `ca`.
    pub plaintext: bool,
}

/// Refuses a connection string that would carry the history across the network in plaintext:
/// without TLS (`tls` false), only a Unix socket or the loopback, unless the operator accepts
/// plaintext.
pub fn check_transport(conn: &str, tls: bool, plaintext: bool) -> anyhow::Result<()> {
    let config: tokio_postgres::Config = conn.parse().with_context(|| format!("the connection string '{conn}'"))?;
    let remote: Vec<String> = config
        .get_hosts()
        .iter()
        .filter_map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => Some(name.clone()),
            _ => None,
        })
        .chain(config.get_hostaddrs().iter().map(|a| a.to_string()))
        .filter(|h| !matches!(h.as_str(), "localhost" | "127.0.0.1" | "::1"))
        .collect();
    if remote.is_empty() || tls || plaintext {
        return Ok(());
    }
    anyhow::bail!(
        "{} would see every job in plaintext on the network: give --postgres-ca (the authority that signed PostgreSQL's certificate) for TLS, run quorum-dbd beside the database (host=/var/run/postgresql, or localhost), or pass --postgres-plaintext on a network you trust",
        remote.join(", ")
    )
}

/// One transaction's worth: the jobs written and the place the export reached.
#[derive(Clone, Copy, Debug, Default)]
pub struct Written {
    pub jobs: usize,
    pub to: Place,
}

/// Follows the history into PostgreSQL until it stops (with `once`, when none is left). A lost
/// connection to PostgreSQL is made again; the cluster's client finds another replica itself.
/// The export's place is read from the database when connected and when another exporter moved
/// it; otherwise it is where the last commit left it.
pub async fn run(cluster: Client, opts: Options) -> anyhow::Result<u64> {
    let tls = opts.ca.as_deref().map(tls::Rustls::trusting).transpose()?;
    check_transport(&opts.postgres, tls.is_some(), opts.plaintext)?;
    let mut exported = 0u64;
    let mut db: Option<(tokio_postgres::Client, Place)> = None;
    let mut announced = false;
    loop {
        let (pg, from) = match db.as_mut().filter(|(c, _)| !c.is_closed()) {
            Some((pg, from)) => (pg, from),
            None => match connect(&opts.postgres, tls.as_ref(), &opts.cluster).await {
                Ok(connected) => {
                    let (pg, from) = db.insert(connected);
                    if !announced {
                        tracing::info!(cluster = %opts.cluster, index = from.index, job_id = from.job_id, "resuming after this place in the history");
                        announced = true;
                    }
                    (pg, from)
                }
                Err(e) if opts.once => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "PostgreSQL unreachable; trying again");
                    tokio::time::sleep(opts.interval.max(Duration::from_secs(1))).await;
                    continue;
                }
            },
        };
        let page = match follow(&cluster, *from, opts.batch).await {
            Ok(page) => page,
            Err(e) if opts.once => return Err(e),
            // Following, it outlasts a cluster that cannot answer for a while.
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "the cluster did not answer; asking again");
                tokio::time::sleep(opts.interval.max(Duration::from_secs(1))).await;
                continue;
            }
        };
        if page.records.is_empty() {
            if opts.once && page.done {
                return Ok(exported);
            }
            tokio::time::sleep(opts.interval).await;
            continue;
        }
        match write(pg, &opts, *from, &page.records).await {
            Ok(Ok(w)) => {
                exported += w.jobs as u64;
                *from = w.to;
                tracing::debug!(jobs = w.jobs, index = w.to.index, job_id = w.to.job_id, "batch committed");
            }
            Ok(Err(moved)) => {
                tracing::info!(
                    index = moved.index,
                    job_id = moved.job_id,
                    "another exporter moved this cluster's place"
                );
                *from = moved;
            }
            Err(e) if pg.is_closed() => {
                tracing::warn!(error = %format!("{e:#}"), "PostgreSQL connection lost; the batch was not committed")
            }
            Err(e) => return Err(e),
        }
    }
}

/// A connection with the tables made, and the place the export of `cluster` stands at. With
/// `tls`, one over TCP is TLS or nothing.
async fn connect(
    conn: &str,
    tls: Option<&tls::Rustls>,
    cluster: &str,
) -> anyhow::Result<(tokio_postgres::Client, Place)> {
    let mut config: tokio_postgres::Config = conn.parse().with_context(|| format!("the connection string '{conn}'"))?;
    let connecting = || format!("connecting to PostgreSQL ({conn})");
    let client = match tls {
        Some(tls) => {
            if config.get_hosts().iter().any(|h| matches!(h, tokio_postgres::config::Host::Tcp(_))) {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
            }
            let (client, connection) = config.connect(tls.clone()).await.with_context(connecting)?;
            spawn_connection(connection);
            client
        }
        None => {
            let (client, connection) = config.connect(NoTls).await.with_context(connecting)?;
            spawn_connection(connection);
            client
        }
    };
    client.batch_execute(SCHEMA).await.context("creating quorum-dbd's tables")?;
    let from = place(&client, cluster).await?;
    Ok((client, from))
}

/// Drives a connection until it ends.
fn spawn_connection<S, T>(connection: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "PostgreSQL connection ended");
        }
    });
}

/// The place the export of `cluster` stands at (the start when it never ran).
pub async fn place(pg: &impl GenericClient, cluster: &str) -> anyhow::Result<Place> {
    let row = pg
        .query_opt("SELECT after_index, after_job_id FROM quorum_export WHERE cluster = $1", &[&cluster])
        .await
        .context("reading the export's place")?;
    Ok(row.as_ref().map_or(Place::default(), Place::of_row))
}

impl Place {
    /// From a row whose first two columns are `after_index, after_job_id`.
    fn of_row(row: &tokio_postgres::Row) -> Place {
        Place { index: row.get::<_, i64>(0) as u64, job_id: row.get::<_, i64>(1) as u64 }
    }
}

/// The next records after `from`, from any replica.
async fn follow(cluster: &Client, from: Place, limit: u32) -> anyhow::Result<FollowHistoryResponse> {
    let req = FollowHistoryRequest { after_index: from.index, after_job_id: from.job_id, limit };
    cluster
        .call(|mut c| async move { c.follow_history(req).await })
        .await
        .map_err(|s| anyhow::anyhow!("reading the job history: {}", s.message()))
}

/// Writes `records` (which follow `from`) in one transaction with the place they reach; the
/// cluster's place instead when it is no longer `from` (another exporter wrote meanwhile).
async fn write(
    pg: &mut tokio_postgres::Client,
    opts: &Options,
    from: Place,
    records: &[HistoryRecord],
) -> anyhow::Result<Result<Written, Place>> {
    let rows = records.iter().map(|r| Row::of(r).with_context(|| format!("job {} in the history", r.job_id)));
    let rows: Vec<Row> = rows.collect::<anyhow::Result<_>>()?;
    let tx = pg.transaction().await.context("beginning a transaction")?;
    let cluster = &opts.cluster;
    tx.execute(
        "INSERT INTO quorum_export (cluster, after_index, after_job_id) VALUES ($1, 0, 0) ON CONFLICT DO NOTHING",
        &[&cluster],
    )
    .await?;
    let now = tx
        .query_one("SELECT after_index, after_job_id FROM quorum_export WHERE cluster = $1 FOR UPDATE", &[&cluster])
        .await?;
    let now = Place::of_row(&now);
    if now != from {
        return Ok(Err(now));
    }
    let upsert = tx.prepare(UPSERT_JOB).await.context("preparing the job upsert")?;
    let clear_steps = tx.prepare("DELETE FROM quorum_steps WHERE cluster = $1 AND job_id = $2").await?;
    let insert_step = tx.prepare(INSERT_STEP).await?;
    for row in &rows {
        tx.execute(&upsert, &row.job_params(cluster)).await.with_context(|| format!("writing job {}", row.job_id))?;
        tx.execute(&clear_steps, &[&cluster, &row.job_id]).await?;
        for step in &row.steps {
            tx.execute(&insert_step, &step.params(cluster, &row.job_id))
                .await
                .with_context(|| format!("writing step {}.{}", row.job_id, step.step_id))?;
        }
    }
    let last = records.last().map_or(from, |r| Place { index: r.index, job_id: r.job_id });
    tx.execute(
        "UPDATE quorum_export SET after_index = $2, after_job_id = $3, updated_at = now() WHERE cluster = $1",
        &[&cluster, &sql_int(last.index), &sql_int(last.job_id)],
    )
    .await?;
    if !opts.stall.is_zero() {
        tokio::time::sleep(opts.stall).await;
    }
    tx.commit().await.context("committing a batch")?;
    Ok(Ok(Written { jobs: rows.len(), to: last }))
}

const UPSERT_JOB: &str = "INSERT INTO quorum_jobs (cluster, job_id, array_job_id, array_task_id, name, user_name, \
     account, partition, qos, state, reason, exit_code, signal, requeues, submit_time, start_time, end_time, \
     elapsed_s, time_limit_s, node_list, node_count, alloc_cpus, alloc_gpus, alloc_mem_mb, cpu_user_s, cpu_system_s, \
     max_rss_kb, gpu_util_pct, gpu_mem_max_mb, gpu_energy_j, work_dir, history_index, record) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, \
     $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33) \
     ON CONFLICT (cluster, job_id) DO UPDATE SET array_job_id = EXCLUDED.array_job_id, \
     array_task_id = EXCLUDED.array_task_id, name = EXCLUDED.name, user_name = EXCLUDED.user_name, \
     account = EXCLUDED.account, partition = EXCLUDED.partition, qos = EXCLUDED.qos, state = EXCLUDED.state, \
     reason = EXCLUDED.reason, exit_code = EXCLUDED.exit_code, signal = EXCLUDED.signal, \
     requeues = EXCLUDED.requeues, submit_time = EXCLUDED.submit_time, start_time = EXCLUDED.start_time, \
     end_time = EXCLUDED.end_time, elapsed_s = EXCLUDED.elapsed_s, time_limit_s = EXCLUDED.time_limit_s, \
     node_list = EXCLUDED.node_list, node_count = EXCLUDED.node_count, alloc_cpus = EXCLUDED.alloc_cpus, \
     alloc_gpus = EXCLUDED.alloc_gpus, alloc_mem_mb = EXCLUDED.alloc_mem_mb, cpu_user_s = EXCLUDED.cpu_user_s, \
     cpu_system_s = EXCLUDED.cpu_system_s, max_rss_kb = EXCLUDED.max_rss_kb, gpu_util_pct = EXCLUDED.gpu_util_pct, \
     gpu_mem_max_mb = EXCLUDED.gpu_mem_max_mb, gpu_energy_j = EXCLUDED.gpu_energy_j, work_dir = EXCLUDED.work_dir, \
     history_index = EXCLUDED.history_index, record = EXCLUDED.record, exported_at = now()";

const INSERT_STEP: &str = "INSERT INTO quorum_steps (cluster, job_id, step_id, name, state, exit_code, signal, \
     start_time, end_time, node_list, ntasks, cpus, cpu_user_s, cpu_system_s, max_rss_kb) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";

/// A number as PostgreSQL's bigint holds it (the largest for one beyond it).
fn sql_int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn sql_small(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// A job's row and its steps'.
struct Row {
    job_id: i64,
    array_job_id: Option<i64>,
    array_task_id: Option<i32>,
    name: String,
    user: String,
    account: String,
    partition: String,
    qos: String,
    state: &'static str,
    reason: &'static str,
    exit_code: Option<i32>,
    signal: Option<i32>,
    requeues: i32,
    submit: SystemTime,
    start: Option<SystemTime>,
    end: Option<SystemTime>,
    elapsed_s: i64,
    time_limit_s: Option<i64>,
    node_list: String,
    node_count: i32,
    cpus: i32,
    gpus: i32,
    mem_mb: i64,
    cpu_user_s: Option<f64>,
    cpu_system_s: Option<f64>,
    max_rss_kb: Option<i64>,
    gpu_util_pct: Option<f64>,
    gpu_mem_max_mb: Option<i64>,
    gpu_energy_j: Option<f64>,
    work_dir: String,
    index: i64,
    record: serde_json::Value,
    steps: Vec<StepRow>,
}

struct StepRow {
    step_id: i32,
    name: String,
    state: &'static str,
    exit_code: Option<i32>,
    signal: Option<i32>,
    start: SystemTime,
    end: Option<SystemTime>,
    node_list: String,
    ntasks: i32,
    cpus: i32,
    cpu_user_s: Option<f64>,
    cpu_system_s: Option<f64>,
    max_rss_kb: Option<i64>,
}

impl Row {
    fn of(r: &HistoryRecord) -> anyhow::Result<Row> {
        let record: serde_json::Value = serde_json::from_slice(&r.job).context("not JSON")?;
        let job: Job = serde_json::from_value(record.clone()).context("not a job this release can read")?;
        let nodes = job.allocation.as_ref().map(|a| a.nodes.as_slice()).unwrap_or_default();
        let used = quorum_model::JobUsage::total(job.usage, job.step_usage);
        let elapsed_ms = match (job.start_time, job.end_time) {
            (Some(s), Some(e)) => e.saturating_sub(s),
            _ => 0,
        };
        let steps = job
            .steps
            .iter()
            .map(|s| StepRow {
                step_id: sql_small(s.id),
                name: s.name.clone(),
                state: s.state.name(),
                exit_code: s.exit_code,
                signal: s.signal,
                start: time(s.start),
                end: s.end.map(time),
                node_list: hostlist::compress(&s.node_names()),
                ntasks: sql_small(s.ntasks),
                cpus: sql_small(s.nodes.iter().map(|n| n.cpus).sum()),
                cpu_user_s: s.usage.map(|u| u.cpu_user_us as f64 / 1e6),
                cpu_system_s: s.usage.map(|u| u.cpu_system_us as f64 / 1e6),
                max_rss_kb: s.usage.map(|u| sql_int(u.max_rss_kb)),
            })
            .collect();
        Ok(Row {
            job_id: sql_int(job.id),
            array_job_id: job.array.map(|a| sql_int(a.array_job_id)),
            array_task_id: job.array.map(|a| sql_small(a.task_id)),
            name: job.spec.name.clone(),
            user: job.user.clone(),
            account: job.account.clone(),
            partition: job.partition.clone(),
            qos: job.qos.clone(),
            state: job.state.name(),
            reason: job.reason.name(),
            exit_code: job.exit_code,
            signal: job.signal,
            requeues: sql_small(job.requeues),
            submit: time(job.submit_time),
            start: job.start_time.map(time),
            end: job.end_time.map(time),
            elapsed_s: sql_int(elapsed_ms / 1000),
            time_limit_s: job.spec.time_limit_s.map(sql_int),
            node_list: job.allocation.as_ref().map(|a| a.nodelist()).unwrap_or_default(),
            node_count: sql_small(nodes.len() as u32),
            cpus: sql_small(nodes.iter().map(|n| n.cpus).sum()),
            gpus: sql_small(nodes.iter().map(|n| n.gpus.len() as u32).sum()),
            mem_mb: sql_int(nodes.iter().map(|n| n.mem_mb).sum()),
            cpu_user_s: used.map(|u| u.cpu_user_us as f64 / 1e6),
            cpu_system_s: used.map(|u| u.cpu_system_us as f64 / 1e6),
            max_rss_kb: used.map(|u| sql_int(u.max_rss_kb)),
            gpu_util_pct: used.and_then(|u| u.gpu_util_pct()),
            gpu_mem_max_mb: used.filter(|u| u.gpu_samples > 0).map(|u| sql_int(u.gpu_mem_max_mb)),
            gpu_energy_j: used.filter(|u| u.gpu_energy_mj > 0).map(|u| u.gpu_energy_mj as f64 / 1e3),
            work_dir: job.spec.work_dir.clone(),
            index: sql_int(r.index),
            record,
            steps,
        })
    }

    fn job_params<'a>(&'a self, cluster: &'a String) -> [&'a (dyn ToSql + Sync); 33] {
        [
            cluster as &(dyn ToSql + Sync),
            &self.job_id,
            &self.array_job_id,
            &self.array_task_id,
            &self.name,
            &self.user,
            &self.account,
            &self.partition,
            &self.qos,
            &self.state,
            &self.reason,
            &self.exit_code,
            &self.signal,
            &self.requeues,
            &self.submit,
            &self.start,
            &self.end,
            &self.elapsed_s,
            &self.time_limit_s,
            &self.node_list,
            &self.node_count,
            &self.cpus,
            &self.gpus,
            &self.mem_mb,
            &self.cpu_user_s,
            &self.cpu_system_s,
            &self.max_rss_kb,
            &self.gpu_util_pct,
            &self.gpu_mem_max_mb,
            &self.gpu_energy_j,
            &self.work_dir,
            &self.index,
            &self.record,
        ]
    }
}

impl StepRow {
    fn params<'a>(&'a self, cluster: &'a String, job_id: &'a i64) -> [&'a (dyn ToSql + Sync); 15] {
        [
            cluster as &(dyn ToSql + Sync),
            job_id,
            &self.step_id,
            &self.name,
            &self.state,
            &self.exit_code,
            &self.signal,
            &self.start,
            &self.end,
            &self.node_list,
            &self.ntasks,
            &self.cpus,
            &self.cpu_user_s,
            &self.cpu_system_s,
            &self.max_rss_kb,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::check_transport;

    #[test]
    fn the_history_goes_to_a_remote_database_under_tls_or_in_plaintext_only_when_asked() {
        assert!(check_transport("host=/var/run/postgresql dbname=quorum", false, false).is_ok());
        assert!(check_transport("host=localhost dbname=quorum", false, false).is_ok());
        assert!(check_transport("host=127.0.0.1,/tmp dbname=quorum", false, false).is_ok());
        let refused = check_transport("host=db.example dbname=quorum", false, false).unwrap_err().to_string();
        assert!(
            refused.contains("db.example")
                && refused.contains("--postgres-ca")
                && refused.contains("--postgres-plaintext"),
            "{refused}"
        );
        assert!(check_transport("hostaddr=10.0.0.5 dbname=quorum", false, false).is_err());
        assert!(check_transport("host=db.example dbname=quorum", true, false).is_ok(), "under TLS");
        assert!(check_transport("host=db.example dbname=quorum", false, true).is_ok(), "plaintext, as asked");
        assert!(check_transport("host=db.example port=notaport", false, true).is_err(), "a bad string is named");
    }
}
