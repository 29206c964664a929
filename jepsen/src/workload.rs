//! The clients: concurrent workers doing what users do, each bound to one replica as a user's
//! `quorum` would be to the first address it is given, every operation recorded as invoked and
//! as answered. What they do is chosen by [`crate::choice`], shared with the simulator: short
//! jobs (some `--requeue`, some with a GPU, some waiting on another) fill the nodes; long jobs
//! serve as the registers whose holds, releases, cancels and reads the linearizability checker
//! judges.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorum_client::client::{Api, Client};
use quorum_proto::api;
use tonic::Code;

use crate::choice::{Mix, Pool};
use crate::history::{Op, Outcome, Recorder, Seen};
use crate::rng::Rng;

/// A client's patience with one operation; past it the operation's fate is unknown.
const OP_TIMEOUT: Duration = Duration::from_secs(4);

/// What each run of a job, or of a step's task, records (see `checker::runs`), in a file of its
/// own (`JOB.PID`, a step's `JOB.sSTEP.PID`): $1 the directory, $2 how many ticks of 0.2 s it
/// runs.
const JOB_SCRIPT: &str = r#"f="$1/$SLURM_JOB_ID${SLURM_STEP_ID:+.s$SLURM_STEP_ID}.$$"
read up _ < /proc/uptime
echo "start $up $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES ${SLURM_RESTART_COUNT:-0} ${QUORUM_CRON_ID:+$QUORUM_CRON_ID@$QUORUM_CRON_TIME}${SLURM_STEP_ID:+step=$SLURM_STEP_ID}" > "$f"
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

/// A job of steps: its script records its run as [`JOB_SCRIPT`] does, but starts $3 steps one
/// after the other (`srun -n1`, each running $4, [`JOB_SCRIPT`], with $1 and $2), ticking
/// while each runs (so that its record spans its life), and records when each `srun` returned and
/// with what status (`srun <uptime> <rc>`).
const STEPS_SCRIPT: &str = r#"f="$1/$SLURM_JOB_ID.$$"
read up _ < /proc/uptime
echo "start $up $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES ${SLURM_RESTART_COUNT:-0} " > "$f"
i=0
while [ "$i" -lt "$3" ]; do
  srun -n1 bash -c "$4" jepsen "$1" "$2" &
  pid=$!
  while kill -0 "$pid" 2> /dev/null; do
    sleep 0.2
    read up _ < /proc/uptime
    echo "tick $up" >> "$f"
  done
  wait "$pid"
  rc=$?
  read up _ < /proc/uptime
  echo "srun $up $rc" >> "$f"
  i=$((i + 1))
done
read up _ < /proc/uptime
echo "end $up" >> "$f"
"#;

pub struct Workload {
    pub recorder: Arc<Recorder>,
    addrs: Vec<String>,
    security: quorum_client::client::Security,
    runs_dir: PathBuf,
    pool: Mutex<Pool>,
    /// What a job's `srun` needs to reach the cluster (the Slurm commands first on its `PATH`,
    /// the controllers, the CA, MUNGE's socket), as `quorum submit` passes the user's
    /// environment on; `None` where there is no `quorum` to run as `srun`, and no job starts steps.
    step_env: Option<Vec<api::EnvVar>>,
}

impl Workload {
    pub fn new(
        recorder: Arc<Recorder>,
        addrs: Vec<String>,
        security: quorum_client::client::Security,
        runs_dir: &Path,
    ) -> Workload {
        Workload {
            recorder,
            addrs,
            security,
            runs_dir: runs_dir.to_path_buf(),
            pool: Mutex::new(Pool::default()),
            step_env: None,
        }
    }

    /// Jobs may start steps, with this environment (see `step_env`).
    pub fn with_steps(mut self, env: Vec<(String, String)>) -> Workload {
        self.step_env = Some(env.into_iter().map(|(name, value)| api::EnvVar { name, value }).collect());
        self
    }

    /// A connection to `addr` proving itself afresh.
    fn connect(&self, addr: &str) -> Option<Api> {
        Client::new(vec![addr.to_string()], self.security.clone()).ok()?.replica(addr).ok()
    }

    /// From now on some short jobs run in the advance reservation `name`.
    pub fn reserve(&self, name: &str) {
        self.pool().reservation = Some(name.to_string());
    }

    /// Jobs used as registers.
    pub fn registers(&self) -> Vec<u64> {
        self.pool().registers()
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
            if matches!(&outcome, Outcome::Failed { error } | Outcome::Unknown { error } if error.contains("replayed"))
            {
                if let Some(fresh) = self.connect(addr) {
                    api = fresh;
                }
            }
            tokio::time::sleep(Duration::from_millis(rng.between(20, 200))).await;
        }
    }

    /// The next operation of worker `w` (the workload shared with the simulator, some jobs on
    /// two nodes), with its job as this cluster runs it.
    fn choose(&self, rng: &mut Rng, w: usize) -> Option<(Op, Option<api::JobSpec>)> {
        let (op, job) = self.pool().choose(rng, w, Mix::Full)?;
        let spec = job.map(|j| {
            let mut spec = self.job_spec(&j.name, j.ticks, j.held, j.requeue, j.gpus);
            spec.nodes = j.nodes;
            spec.ntasks = j.nodes;
            if j.het {
                // Its first component on one node, the second (`sbatch A : B`) on another, with a GPU.
                (spec.nodes, spec.ntasks) = (1, 1);
                spec.het = vec![api::HetComponent {
                    nodes: 1,
                    ntasks: 1,
                    cpus_per_task: 1,
                    mem_per_node_mb: 64,
                    gpus_per_node: 1,
                    ..Default::default()
                }];
            }
            if let (true, Some(env)) = (j.steps > 0, &self.step_env) {
                let dir = self.runs_dir.display().to_string();
                let (ticks, steps) = (j.ticks.to_string(), j.steps.to_string());
                spec.argv =
                    ["bash", "-c", STEPS_SCRIPT, "jepsen", &dir, &ticks, &steps, JOB_SCRIPT].map(String::from).to_vec();
                spec.env = env.clone();
            }
            if let Some(after) = j.after {
                spec.dependency = format!("afterok:{after}");
                spec.kill_on_invalid_dep = j.kill_on_invalid_dep;
            }
            if let Some(a) = j.array {
                spec.array = a.arg();
            }
            spec.partition = j.partition.unwrap_or_default();
            spec.reservation = j.reservation.unwrap_or_default();
            spec
        });
        Some((op, spec))
    }

    fn learn(&self, op: &Op, outcome: &Outcome) {
        self.pool().learn(op, outcome);
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
                    submit(&mut api, req).await
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
                    // The job alone, never a whole array.
                    let req = api::CancelJobRequest { task_job_ids: vec![*job], ..Default::default() };
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

/// How long a submit waits for an answer before it is sent again.
const SUBMIT_PATIENCE: Duration = Duration::from_millis(1500);

/// A submit as `quorum submit` makes it: sent again, with the same request id, while the replica
/// does not answer or answers that it cannot now (its request id makes it one job however many
/// times it arrives), until `perform`'s deadline. Once an attempt may have been applied, an
/// error is no longer a refusal: the outcome is unknown.
async fn submit(api: &mut Api, req: api::SubmitJobRequest) -> Result<Outcome, tonic::Status> {
    let mut sent = false;
    loop {
        let status = match tokio::time::timeout(SUBMIT_PATIENCE, api.submit_job(req.clone())).await {
            Ok(Ok(r)) => return Ok(Outcome::Submitted { job: r.into_inner().job_id }),
            Ok(Err(s)) if !Client::retryable(&s) && !sent => return Err(s),
            Ok(Err(s)) if !Client::retryable(&s) => {
                return Ok(Outcome::Unknown { error: format!("{:?}: {}", s.code(), s.message()) })
            }
            Ok(Err(s)) => s,
            Err(_) => tonic::Status::deadline_exceeded("no answer"),
        };
        sent |= !never_sent(&status);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// No connection: the request was never sent.
fn never_sent(status: &tonic::Status) -> bool {
    status.code() == Code::Unavailable && status.message().contains("tcp connect error")
}

/// A job as a read shows it to the checkers.
pub fn seen(j: &api::JobInfo) -> Seen {
    Seen {
        name: j.name.clone(),
        state: j.state.clone(),
        held: !j.held.is_empty(),
        cancelled: j.state == "CANCELLED" || j.cancel_requested || !j.cancelled_by.is_empty(),
        task: j.array.as_ref().map(|a| a.task_id),
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
        _ if never_sent(status) => Outcome::Failed { error },
        Code::InvalidArgument | Code::PermissionDenied | Code::Unauthenticated | Code::FailedPrecondition => {
            Outcome::Failed { error }
        }
        _ => Outcome::Unknown { error },
    }
}
