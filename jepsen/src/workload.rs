//! The clients: concurrent workers doing what users do, each bound to one replica as a user's
//! `quorum` would be to the first address it is given, every operation recorded as invoked and
//! as answered. Short jobs (some `--requeue`, some with a GPU) fill the nodes; long jobs serve as
//! the registers whose holds, releases, cancels and reads the linearizability checker judges.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorum_client::client::{Api, Client};
use quorum_proto::api;
use tonic::Code;

use crate::history::{Op, Outcome, Recorder, Seen};
use crate::rng::Rng;

/// Operations on one register job before it is retired (cancelled): the linearizability
/// search grows with the operations of one job.
const REGISTER_OPS: u32 = 24;
const ACTIVE_REGISTERS: usize = 3;
/// A client's patience with one operation; past it the operation's fate is unknown.
const OP_TIMEOUT: Duration = Duration::from_secs(4);

/// What each run of a job records (see `checker::runs`): $1 the directory, $2 how many ticks
/// of 0.2 s it runs.
const JOB_SCRIPT: &str = r#"f="$1/$SLURM_JOB_ID.$$"
read up _ < /proc/uptime
echo "start $up $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES ${SLURM_RESTART_COUNT:-0}" > "$f"
i=0
while [ "$i" -lt "$2" ]; do
  sleep 0.2
  read up _ < /proc/uptime
  echo "tick $up" >> "$f"
  i=$((i + 1))
done
read up _ < /proc/uptime
echo "end $up" >> "$f"
"#;

#[derive(Default)]
struct Pool {
    /// Acknowledged short jobs.
    short: Vec<u64>,
    /// Register jobs in use, with the operations each has had.
    active: Vec<(u64, u32)>,
    /// Every job used as a register.
    registers: Vec<u64>,
    /// Register submits in flight.
    submitting: usize,
    names: u64,
}

pub struct Workload {
    pub recorder: Arc<Recorder>,
    addrs: Vec<String>,
    security: quorum_client::client::Security,
    runs_dir: PathBuf,
    pool: Mutex<Pool>,
}

/// How long a short job runs, in ticks of 0.2 s: mostly under 3 s, some up to 12 s, long
/// enough to outlast the node timeout while a fault cuts their node off.
fn short_ticks(rng: &mut Rng) -> u64 {
    match rng.chance(0.3) {
        true => rng.between(15, 60),
        false => rng.between(2, 15),
    }
}

impl Workload {
    pub fn new(
        recorder: Arc<Recorder>,
        addrs: Vec<String>,
        security: quorum_client::client::Security,
        runs_dir: &Path,
    ) -> Workload {
        Workload { recorder, addrs, security, runs_dir: runs_dir.to_path_buf(), pool: Mutex::new(Pool::default()) }
    }

    /// A connection to `addr` proving itself afresh.
    fn connect(&self, addr: &str) -> Option<Api> {
        Client::new(vec![addr.to_string()], self.security.clone()).ok()?.replica(addr).ok()
    }

    /// Jobs used as registers.
    pub fn registers(&self) -> Vec<u64> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).registers.clone()
    }

    fn pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn job_spec(&self, name: &str, ticks: u64, held: bool, requeue: bool, gpus: u32) -> api::JobSpec {
        let dir = self.runs_dir.display().to_string();
        api::JobSpec {
            name: name.into(),
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 1,
            mem_per_node_mb: 64,
            gpus_per_node: gpus,
            time_limit_s: 3600,
            argv: ["bash", "-c", JOB_SCRIPT, "jepsen", &dir, &ticks.to_string()].map(String::from).to_vec(),
            work_dir: dir.clone(),
            submit_dir: dir,
            stdout: "/dev/null".into(),
            stderr: "/dev/null".into(),
            env: vec![api::EnvVar { name: "PATH".into(), value: "/usr/local/bin:/usr/bin:/bin".into() }],
            hold: held,
            requeue,
            ..Default::default()
        }
    }

    /// Runs worker `w` until `stop` says so; its process id changes after each operation whose
    /// fate is unknown, as a Jepsen client's does.
    pub async fn worker(
        self: Arc<Self>,
        w: usize,
        workers: usize,
        mut rng: Rng,
        stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let addr = &self.addrs[w % self.addrs.len()];
        let Some(mut api) = self.connect(addr) else { return };
        let mut process = w as u64;
        while !*stop.borrow() {
            let op = self.choose(&mut rng, w);
            let Some((op, spec)) = op else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            self.recorder.invoke(process, op.clone());
            let outcome = self.perform(api.clone(), &op, spec, process).await;
            self.recorder.complete(process, outcome.clone());
            self.learn(&op, &outcome);
            if matches!(outcome, Outcome::Unknown { .. }) {
                process += workers as u64;
            }
            // A replica that restarted refuses the credential this connection proved before (it
            // may have seen it): a new connection proves a new one, as `quorum` does.
            if matches!(&outcome, Outcome::Failed { error } if error.contains("replayed")) {
                if let Some(fresh) = self.connect(addr) {
                    api = fresh;
                }
            }
            tokio::time::sleep(Duration::from_millis(rng.between(20, 200))).await;
        }
    }

    fn choose(&self, rng: &mut Rng, w: usize) -> Option<(Op, Option<api::JobSpec>)> {
        let mut pool = self.pool();
        let roll = rng.below(100);
        let register = |pool: &mut Pool, rng: &mut Rng| -> Option<u64> {
            let i = rng.below(pool.active.len() as u64) as usize;
            let (job, ops) = pool.active.get_mut(i)?;
            *ops += 1;
            Some(*job)
        };
        if pool.active.len() + pool.submitting < ACTIVE_REGISTERS {
            pool.names += 1;
            pool.submitting += 1;
            let name = format!("reg-{w}-{}", pool.names);
            let held = rng.chance(0.5);
            let spec = self.job_spec(&name, 100_000, held, false, 0);
            return Some((
                Op::Submit { name, held, requeue: false, gpus: 0, long: true, nodes: 1, after: None },
                Some(spec),
            ));
        }
        // A register that has had its share is cancelled and retired.
        if let Some(i) = pool.active.iter().position(|(_, ops)| *ops >= REGISTER_OPS) {
            let (job, _) = pool.active.remove(i);
            return Some((Op::Cancel { job }, None));
        }
        Some(match roll {
            0..=24 => {
                pool.names += 1;
                let name = format!("job-{w}-{}", pool.names);
                let requeue = rng.chance(0.3);
                let gpus = u32::from(rng.chance(0.3));
                // Some jobs span two nodes (the batch script, which records the run, runs on the
                // first); some wait for another short job to complete (afterok), and of those half
                // are cancelled once it cannot (--kill-on-invalid-dep).
                let nodes = if rng.chance(0.15) { 2 } else { 1 };
                let after = if rng.chance(0.2) { rng.pick(&pool.short).copied() } else { None };
                let mut spec = self.job_spec(&name, short_ticks(rng), false, requeue, gpus);
                spec.nodes = nodes;
                spec.ntasks = nodes;
                if let Some(job) = after {
                    spec.dependency = format!("afterok:{job}");
                    spec.kill_on_invalid_dep = rng.chance(0.5);
                }
                (Op::Submit { name, held: false, requeue, gpus, long: false, nodes, after }, Some(spec))
            }
            25..=39 => (Op::Hold { job: register(&mut pool, rng)? }, None),
            40..=54 => (Op::Release { job: register(&mut pool, rng)? }, None),
            55..=59 => (Op::Cancel { job: register(&mut pool, rng)? }, None),
            60..=64 => (Op::Cancel { job: *rng.pick(&pool.short)? }, None),
            65..=89 => (Op::Read { job: register(&mut pool, rng)? }, None),
            _ => {
                let job = match rng.chance(0.5) {
                    true => *rng.pick(&pool.short)?,
                    false => *rng.pick(&pool.registers)?,
                };
                (Op::StaleRead { job }, None)
            }
        })
    }

    /// Keeps what later choices need: the ids of acknowledged jobs.
    fn learn(&self, op: &Op, outcome: &Outcome) {
        let mut pool = self.pool();
        if let Op::Submit { long, .. } = op {
            if *long {
                pool.submitting -= 1;
            }
            if let Outcome::Submitted { job } = outcome {
                match long {
                    true => {
                        pool.active.push((*job, 0));
                        pool.registers.push(*job);
                    }
                    false => pool.short.push(*job),
                }
            }
        }
    }

    async fn perform(&self, mut api: Api, op: &Op, spec: Option<api::JobSpec>, process: u64) -> Outcome {
        let call = async {
            match op {
                Op::Submit { .. } => {
                    let req = api::SubmitJobRequest {
                        spec,
                        request_id: format!("jepsen-{process}-{}", uuid::Uuid::new_v4()),
                        ..Default::default()
                    };
                    api.submit_job(req).await.map(|r| Outcome::Submitted { job: r.into_inner().job_id })
                }
                Op::Hold { job } | Op::Release { job } => {
                    let req = api::HoldJobRequest {
                        job_ids: vec![*job],
                        release: matches!(op, Op::Release { .. }),
                        ..Default::default()
                    };
                    api.hold_job(req).await.map(|r| per_job(r.into_inner().results, false))
                }
                Op::Cancel { job } => {
                    let req = api::CancelJobRequest { job_ids: vec![*job], ..Default::default() };
                    api.cancel_job(req).await.map(|r| per_job(r.into_inner().results, true))
                }
                Op::Read { job } | Op::StaleRead { job } => {
                    let stale = matches!(op, Op::StaleRead { .. });
                    let req = api::GetJobRequest { job_id: *job, stale, array_task_id: None };
                    match api.get_job(req).await {
                        Ok(r) => Ok(r.into_inner().job.map_or(Outcome::Missing, |j| Outcome::Read { job: seen(&j) })),
                        Err(s) if s.code() == Code::NotFound => Ok(Outcome::Missing),
                        Err(s) => Err(s),
                    }
                }
            }
        };
        match tokio::time::timeout(OP_TIMEOUT, call).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(status)) => classify(&status),
            Err(_) => Outcome::Unknown { error: format!("no answer within {OP_TIMEOUT:?}") },
        }
    }
}

/// A job as a read shows it to the checkers.
pub fn seen(j: &api::JobInfo) -> Seen {
    Seen {
        name: j.name.clone(),
        state: j.state.clone(),
        held: !j.held.is_empty(),
        cancelled: j.state == "CANCELLED" || j.cancel_requested || !j.cancelled_by.is_empty(),
    }
}

pub(crate) fn per_job(results: Vec<api::CancelResult>, cancel: bool) -> Outcome {
    match results.into_iter().next() {
        Some(r) if r.ok && cancel => Outcome::Cancelled { was_running: r.was_running },
        Some(r) if r.ok => Outcome::Done,
        Some(r) if r.error.contains("does not exist") || r.error.contains("unknown job") => Outcome::Missing,
        Some(r) => Outcome::Refused { reason: r.error },
        None => Outcome::Unknown { error: "an answer without a result".into() },
    }
}

/// A status a replica or the transport gave: refused before anything was applied, or unknown.
fn classify(status: &tonic::Status) -> Outcome {
    let error = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        // No connection: the request was never sent.
        Code::Unavailable if status.message().contains("tcp connect error") => Outcome::Failed { error },
        Code::InvalidArgument | Code::PermissionDenied | Code::Unauthenticated | Code::FailedPrecondition => {
            Outcome::Failed { error }
        }
        _ => Outcome::Unknown { error },
    }
}
