//! One run: the cluster started, clients and the nemesis let loose for the run's time, every
//! fault healed, the cluster asked to serve again and to end every job, and the evidence judged.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quorum_client::client::Client;
use quorum_proto::api;

use crate::checker::cron::Cron;
use crate::checker::ended::Placed;
use crate::checker::resv::Resv;
use crate::checker::{self, terminal, Evidence, Final};
use crate::cluster::{within, Binaries, Cluster, AGENT_CPUS};
use crate::history::{self, now_s, Op, Outcome, Recorder};
use crate::nemesis::{self, Active};
use crate::rng::Rng;
use crate::workload::Workload;

/// How soon after the last fault heals the cluster must acknowledge a submit again.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(30);
/// How soon after that every job must have ended (those left are cancelled).
pub const SETTLE_BOUND: Duration = Duration::from_secs(60);
/// How long the cluster is left alone after every job ended before it is read again (longer
/// than the 5 s after which a job still running counts against it).
const QUIET: Duration = Duration::from_secs(8);

#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    pub time: Duration,
    pub nemeses: Vec<String>,
    pub replicas: usize,
    pub agents: usize,
    pub workers: usize,
    pub dir: PathBuf,
    pub bins: Binaries,
    /// The previous release's, for the upgrade nemesis.
    pub old_bins: Option<Binaries>,
}

#[derive(Debug)]
pub struct Verdict {
    pub seed: u64,
    pub problems: Vec<String>,
    pub ops: usize,
    pub ok: usize,
    pub unknown: usize,
    pub faults: Vec<String>,
    pub recovery: Duration,
}

impl Verdict {
    pub fn valid(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Holds the machine's one run lock (the bridge and the addresses are the machine's).
struct Lock {
    _file: std::fs::File,
}

fn lock() -> anyhow::Result<Lock> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new().create(true).write(true).truncate(false).open("/run/quorum-jepsen.lock")?;
    // SAFETY: flock on a descriptor we own; it is released when the file closes.
    anyhow::ensure!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0, "locking /run/quorum-jepsen.lock");
    Ok(Lock { _file: file })
}

pub async fn run(opts: &Options) -> anyhow::Result<Verdict> {
    let _lock = lock()?;
    std::fs::create_dir_all(&opts.dir)?;
    let runs_dir = opts.dir.join("runs");
    std::fs::create_dir_all(&runs_dir)?;
    let mut cluster = Cluster::start(&opts.dir, &opts.bins, opts.old_bins.as_ref(), opts.replicas, opts.agents)?;
    let client = cluster.client()?;
    cluster.wait_ready(Duration::from_secs(60)).await?;

    let rng = Rng::new(opts.seed);
    let time = opts.time.as_secs_f64();
    let schedule = nemesis::schedule(&mut rng.fork(1), &opts.nemeses, time, opts.replicas, opts.agents);
    std::fs::write(opts.dir.join("schedule.txt"), format!("{schedule:#?}\n"))?;

    let recorder = Arc::new(Recorder::default());
    let mut workload = Workload::new(recorder.clone(), cluster.addrs.clone(), cluster.security.client(), &runs_dir);
    if let Some(env) = cluster.step_env() {
        workload = workload.with_steps(env);
    }
    let workload = Arc::new(workload);
    let reservations: Vec<Resv> = operate(&client, &workload).await.into_iter().collect();
    let cron_added = add_cron(&client, &workload).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let workers: Vec<_> = (0..opts.workers)
        .map(|w| tokio::spawn(workload.clone().worker(w, opts.workers, rng.fork(100 + w as u64), stopped.clone())))
        .collect();

    // The nemesis, in this task.
    let began = Instant::now();
    let mut active = Active::default();
    let mut faults = Vec::new();
    for step in &schedule {
        sleep_until(began, step.at).await;
        for f in &step.faults {
            let what = nemesis::apply(&mut cluster, &client, f, &mut active).await?;
            recorder.nemesis(what.clone());
            faults.push(format!("{what} (from {:.1} s, for {:.1} s)", step.at, step.hold));
        }
        // The last fault lasts until the clients stop.
        if step.at + step.hold < time - 0.001 {
            sleep_until(began, step.at + step.hold).await;
            let what = nemesis::heal(&mut cluster, &client, &mut active).await?;
            recorder.nemesis(format!("heal: {what}"));
        }
    }
    sleep_until(began, time).await;
    let _ = stop.send(true);
    for w in workers {
        let _ = w.await;
    }
    let what = nemesis::heal(&mut cluster, &client, &mut active).await?;
    recorder.nemesis(format!("final heal: {what}"));

    // The cluster serves again: a submit acknowledged within the bound of the last heal (and the
    // operator's recurring job removed before it).
    let healed = Instant::now();
    let mut problems = Vec::new();
    let cron_removed = cron_added && remove_cron(&client).await;
    let mut process = 10_000_000;
    let probe = loop {
        let name = format!("probe-{process}");
        let spec = workload.job_spec(&name, 1, false, false, 0);
        let op = Op::probe(name);
        recorder.invoke(process, op);
        let req = api::SubmitJobRequest {
            spec: Some(spec),
            request_id: format!("jepsen-probe-{}", uuid::Uuid::new_v4()),
            ..Default::default()
        };
        let answer = within(&client, Duration::from_secs(5), |mut cl| {
            let req = req.clone();
            async move { cl.submit_job(req).await }
        })
        .await;
        match answer {
            Ok(r) => {
                recorder.complete(process, Outcome::Submitted { job: r.job_id });
                break Some(r.job_id);
            }
            Err(error) => recorder.complete(process, Outcome::Unknown { error }),
        }
        process += 1;
        if healed.elapsed() > RECOVERY_BOUND {
            problems.push(format!("recovery: no submit was acknowledged within {RECOVERY_BOUND:?} of the last heal"));
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let recovery = healed.elapsed();

    // Every job ends: the probe runs to completion, what is left is cancelled.
    let mut process = 20_000_000;
    let mut finals = settle(&client, &recorder, probe, &mut process, &mut problems).await;
    let mut finished_at = now_s();
    // A submit that had no answer may still take effect, and after the final read: its request
    // can reach a replica late (TCP sends again, after the heal, what a partition held back; seed
    // 3042 saw one forwarded submit committed 10 s after the last heal). The cluster is read
    // again after a quiet spell, and jobs that appeared meanwhile are ended and judged with the
    // rest (a late job of a submit that was answered is a duplicate, which the checkers catch).
    for _ in 0..3 {
        tokio::time::sleep(QUIET).await;
        let ids = |jobs: &[api::JobInfo]| jobs.iter().map(|j| j.id).collect::<std::collections::BTreeSet<u64>>();
        // (Jobs that left the queue for the history meanwhile are not new.)
        match all_jobs(&client).await {
            Ok(again) if !ids(&again).is_subset(&ids(&finals)) => {
                let late: Vec<u64> = ids(&again).difference(&ids(&finals)).copied().collect();
                recorder.nemesis(format!("late: jobs {late:?} appeared after the final read"));
                finals = settle(&client, &recorder, None, &mut process, &mut problems).await;
                finished_at = now_s();
            }
            _ => break,
        }
    }
    if let Some(p) = probe {
        match finals.iter().find(|j| j.id == p) {
            Some(j) if j.state == "COMPLETED" => {}
            other => problems.push(format!("recovery: the probe job {p} did not complete: {other:?}")),
        }
    }

    // Every replica holds the same state at the same index. Each try with a fresh client: a
    // replica that restarted refuses a credential it may have seen.
    let mut last = String::new();
    for attempt in 0..5 {
        let fresh = cluster.client()?;
        match tokio::time::timeout(Duration::from_secs(30), quorum_client::digest::collect(&fresh)).await {
            Ok(Ok(report)) if report.agree() && report.missing() == 0 => {
                last.clear();
                break;
            }
            Ok(Ok(report)) if !report.agree() => {
                last = report.table().replace('\n', "; ");
                break;
            }
            Ok(Ok(report)) => last = report.table().replace('\n', "; "),
            Ok(Err(e)) => last = format!("no digest point: {}", e.message()),
            Err(_) => last = "no digest within 30 s".into(),
        }
        tokio::time::sleep(Duration::from_millis(500 * (attempt + 1))).await;
    }
    if !last.is_empty() {
        problems.push(format!("digest: {last}"));
    }

    // Nothing the cluster says has ended still runs (the quiet spell has waited).
    let mut runs = checker::runs::read(&runs_dir)?;
    // A job suspended by preemption lends its CPUs: when it was frozen, as its agent's log says.
    let offset = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs_f64() - now_s();
    for a in 1..=opts.agents {
        let node = format!("a{a}");
        let log = std::fs::read_to_string(opts.dir.join(format!("{node}.log"))).unwrap_or_default();
        checker::runs::apply_pauses(&mut runs, &node, &checker::runs::pauses(&log, offset));
    }
    for r in runs.iter().filter(|r| r.last > finished_at + 5.0) {
        problems.push(format!(
            "runs: job {} still ran on {} at {:.2}, {:.1} s after the cluster said every job had ended ({})",
            r.job,
            r.node,
            r.last,
            r.last - finished_at,
            r.file
        ));
    }

    let events = recorder.events();
    history::write(&opts.dir.join("history.jsonl"), &events)?;
    let finals: BTreeMap<u64, Final> = finals
        .iter()
        .map(|j| {
            let s = crate::workload::seen(j);
            let placed = Placed {
                reservation: j.spec.as_ref().map(|s| s.reservation.clone()).filter(|r| !r.is_empty()),
                start_ms: j.start_time_ms,
                end_ms: j.end_time_ms,
                nodes: j.allocation.iter().map(|a| a.node.clone()).collect(),
            };
            (
                j.id,
                Final {
                    id: j.id,
                    name: s.name,
                    state: s.state,
                    cancelled: s.cancelled,
                    task: s.task,
                    placed: Some(placed),
                    restarts: Some(j.requeues),
                },
            )
        })
        .collect();
    // The history: jobs that left the queue, judged with those still in it; every replica's the
    // same.
    let archived = history(&cluster, &client).await;
    problems.extend(archived.problems);
    eprintln!("quorum-jepsen: {} jobs had left the queue for the history", archived.jobs.len());
    let mut finals = finals;
    finals.extend(archived.jobs.into_iter().map(|f| (f.id, f)));
    let registers = workload.registers();
    // Every probe was submitted after the recurring job was removed: none of its jobs comes after
    // the first.
    let first_probe = finals.values().filter(|f| f.name.starts_with("probe-")).map(|f| f.id).min();
    let cron = Cron { name: CRON.into(), period_s: CRON_EVERY_S, removed_before: first_probe.filter(|_| cron_removed) };
    problems.extend(checker::check(&Evidence {
        events: &events,
        finals: &finals,
        runs: &runs,
        registers: &registers,
        node_cpus: AGENT_CPUS,
        reservations: &reservations,
        cron: cron_added.then_some(&cron),
    }));
    cluster.kill_all();
    let completions = events.iter().filter_map(|e| match e {
        history::Event::Complete { outcome, .. } => Some(outcome),
        _ => None,
    });
    let (mut ops, mut ok, mut unknown) = (0, 0, 0);
    for o in completions {
        ops += 1;
        match o {
            Outcome::Unknown { .. } => unknown += 1,
            Outcome::Failed { .. } => {}
            _ => ok += 1,
        }
    }
    Ok(Verdict { seed: opts.seed, problems, ops, ok, unknown, faults, recovery })
}

/// A job as a failure report shows it: its script and environment left out.
fn without_spec(j: &api::JobInfo) -> api::JobInfo {
    api::JobInfo { spec: None, ..j.clone() }
}

async fn sleep_until(began: Instant, at: f64) {
    let target = began + Duration::from_secs_f64(at.max(0.0));
    tokio::time::sleep_until(target.into()).await;
}

/// Every replica's job history, judged with the queue read after it (`checker::archive`), read
/// again (up to five times, 2 s apart) while the replicas' differ: one that installed a snapshot
/// copies the records it lacks from the others in the background.
async fn history(cluster: &Cluster, client: &Client) -> checker::archive::Judged {
    let mut attempt = 0;
    loop {
        let mut histories = Vec::new();
        for (i, addr) in cluster.addrs.iter().enumerate() {
            if let Some(records) = history_of(cluster, addr).await {
                histories.push((format!("r{}", i + 1), records));
            }
        }
        let queue: std::collections::BTreeSet<u64> =
            all_jobs(client).await.map(|js| js.iter().map(|j| j.id).collect()).unwrap_or_default();
        let judged = checker::archive::check(&histories, &queue);
        attempt += 1;
        if judged.agree || attempt == 5 {
            return judged;
        }
        tokio::time::sleep(Duration::from_secs(2 * attempt)).await;
    }
}

/// One replica's whole history (`FollowHistory`, page by page); `None` when it cannot be read.
async fn history_of(cluster: &Cluster, addr: &str) -> Option<Vec<Vec<u8>>> {
    let mut api = cluster.client().ok()?.replica(addr).ok()?;
    let (mut after_index, mut after_job_id) = (0, 0);
    let mut records = Vec::new();
    loop {
        let req = api::FollowHistoryRequest { after_index, after_job_id, limit: 1000 };
        let page =
            tokio::time::timeout(Duration::from_secs(10), api.follow_history(req)).await.ok()?.ok()?.into_inner();
        if let Some(last) = page.records.last() {
            (after_index, after_job_id) = (last.index, last.job_id);
        }
        let empty = page.records.is_empty();
        records.extend(page.records.into_iter().map(|r| r.job));
        if page.done || empty {
            return Some(records);
        }
    }
}

/// The operator's advance reservation.
const RESV: &str = "jepsen-resv";

/// The operator, before the clients begin: an advance reservation of one node for the clients'
/// user (root), its window from 10 s to 30 s after it is asked for (by this machine's clock),
/// asked for until it is made or 20 s passed; some of the clients' short jobs then run in it.
/// The reservation as the cluster made it.
async fn operate(client: &Client, workload: &Workload) -> Option<Resv> {
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(20) {
        let wall_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64;
        let req = api::ReservationRequest {
            name: RESV.into(),
            start_ms: Some(wall_ms + 10_000),
            duration_s: Some(20),
            node_count: Some(1),
            users: Some("root".into()),
            ..Default::default()
        };
        let made = within(client, Duration::from_secs(5), |mut cl| {
            let req = req.clone();
            async move { cl.create_reservation(req).await }
        })
        .await;
        // Made, or made by an attempt whose answer was lost: as the cluster has it.
        if made.as_ref().is_ok() || made.as_ref().is_err_and(|e| e.contains("exists already")) {
            let listed = within(client, Duration::from_secs(5), |mut cl| async move {
                cl.list_nodes(api::ListNodesRequest::default()).await
            })
            .await;
            if let Some(r) = listed.ok().and_then(|l| l.reservations.into_iter().find(|r| r.name == RESV)) {
                workload.reserve(RESV);
                let nodes = r.nodes.split(',').map(String::from).collect();
                let end_ms = if r.end_ms == 0 { u64::MAX } else { r.end_ms };
                return Some(Resv { name: r.name, nodes, start_ms: r.start_ms, end_ms });
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    None
}

/// The name of the operator's recurring job.
const CRON: &str = "jepsen-cron";
/// It fires every this many seconds.
const CRON_EVERY_S: u64 = 2;

/// The operator's recurring job, before the clients begin: a job of 0.2 s every two seconds
/// (`*/2 * * * * *`, UTC), asked for until the cluster lists it (an add whose answer was lost may
/// have been applied: the operator looks before asking again) or 20 s passed. Whether it was made.
async fn add_cron(client: &Client, workload: &Workload) -> bool {
    let req = api::AddCronRequest {
        schedule: format!("*/{CRON_EVERY_S} * * * * *"),
        zone: "UTC".into(),
        spec: Some(workload.job_spec(CRON, 1, false, false, 0)),
        run_as: String::new(),
    };
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(20) {
        if cron_ids(client).await.is_some_and(|ids| !ids.is_empty()) {
            return true;
        }
        let added = within(client, Duration::from_secs(5), |mut cl| {
            let req = req.clone();
            async move { cl.add_cron(req).await }
        })
        .await;
        if added.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    false
}

/// The recurring jobs the cluster has (`quorum cron list`): `None` when it did not answer.
async fn cron_ids(client: &Client) -> Option<Vec<u64>> {
    let listed = within(client, Duration::from_secs(5), |mut cl| async move {
        cl.list_cron(api::ListCronRequest { stale: false }).await
    })
    .await;
    listed.ok().map(|l| l.entries.iter().map(|e| e.id).collect())
}

/// The operator removes every recurring job once the faults heal, until none is listed or the
/// recovery bound passed; whether it was done.
async fn remove_cron(client: &Client) -> bool {
    let began = Instant::now();
    while began.elapsed() < RECOVERY_BOUND {
        match cron_ids(client).await {
            Some(ids) if ids.is_empty() => return true,
            Some(ids) => {
                for id in ids {
                    let _ = within(client, Duration::from_secs(5), |mut cl| async move {
                        cl.remove_cron(api::RemoveCronRequest { id }).await
                    })
                    .await;
                }
            }
            None => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    false
}

/// Cancels `job` alone: an array's first task is not the whole array (seed 4011: a whole array
/// cancelled by its id ended the first task's cancel COMPLETED, as it had been).
async fn cancel(client: &Client, job: u64) -> Outcome {
    let req = api::CancelJobRequest { task_job_ids: vec![job], ..Default::default() };
    let answer = within(client, Duration::from_secs(10), |mut cl| {
        let req = req.clone();
        async move { cl.cancel_job(req).await }
    })
    .await;
    match answer {
        Ok(r) => crate::workload::per_job(r.results, true),
        Err(error) => Outcome::Unknown { error },
    }
}

/// Every job ended: the probe (if any) runs to completion, whatever else is open is cancelled,
/// until the cluster shows no job open or [`SETTLE_BOUND`] passes. Every job, as it then shows.
async fn settle(
    client: &Client,
    recorder: &Recorder,
    probe: Option<u64>,
    process: &mut u64,
    problems: &mut Vec<String>,
) -> Vec<api::JobInfo> {
    let settle = Instant::now();
    let mut cancelled = std::collections::BTreeSet::new();
    loop {
        let jobs = all_jobs(client).await;
        if let Ok(jobs) = &jobs {
            let open: Vec<&api::JobInfo> = jobs.iter().filter(|j| !terminal(&j.state)).collect();
            let probe_done = probe.is_none_or(|p| jobs.iter().any(|j| j.id == p && terminal(&j.state)));
            if open.is_empty() {
                return jobs.clone();
            }
            for j in open {
                if Some(j.id) == probe && !probe_done || cancelled.contains(&j.id) {
                    continue;
                }
                recorder.invoke(*process, Op::Cancel { job: j.id });
                let outcome = cancel(client, j.id).await;
                recorder.complete(*process, outcome.clone());
                if !matches!(outcome, Outcome::Unknown { .. }) {
                    cancelled.insert(j.id);
                }
                *process += 1;
            }
        }
        if settle.elapsed() > SETTLE_BOUND {
            let open: Vec<String> = jobs
                .map(|js| js.iter().filter(|j| !terminal(&j.state)).map(|j| format!("{:?}", without_spec(j))).collect())
                .unwrap_or_default();
            problems.push(format!(
                "terminal: jobs were still open {SETTLE_BOUND:?} after the cluster served again: {open:?}"
            ));
            return all_jobs(client).await.unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Every job, page by page, read linearizably.
async fn all_jobs(client: &Client) -> Result<Vec<api::JobInfo>, tonic::Status> {
    let mut jobs = Vec::new();
    let mut after = 0;
    loop {
        let req = api::ListJobsRequest { after, ..Default::default() };
        let page = client
            .call(|mut cl| {
                let req = req.clone();
                async move { cl.list_jobs(req).await }
            })
            .await?;
        jobs.extend(page.jobs);
        if page.next_after == 0 {
            return Ok(jobs);
        }
        after = page.next_after;
    }
}
