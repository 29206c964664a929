//! A job's record in the agent's spool: `<spool>/jobs/<job>.<token>/` with `launch.pb` (the
//! launch as the leader sent it), `started` (ms since the epoch), `pids` (supervisor pid and job
//! process group), `reason` (why the agent signalled it, if it did), `status` (written by the
//! supervisor at the end), `measured` (what the agent measured while it ran: its GPUs' use and
//! its processes' peak memory together, at each heartbeat) and the batch script. A restarted agent finds its jobs again from their
//! records ([`scan`]); a record is removed once the leader has acknowledged the job's exit.

use std::io;
use std::path::{Path, PathBuf};

use prost::Message;
use quorum_proto::agent::{ExitKind, Launch};

/// What a supervisor recorded about its job's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Exited(i32),
    Signaled(i32),
    /// Killed by its supervisor (with this signal) because the node's lease ran out.
    LeaseExpired(i32),
    /// The program could not be started: the step that failed and its errno.
    LaunchFailed(Step, i32),
    /// The supervisor is gone without a status (killed itself): the job's end is unknown.
    Lost,
}

/// The steps of starting a job's program, in order, each of which can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Joining the job's cgroup or setting its rlimits.
    Limits = 1,
    /// Becoming the job's user.
    Identity = 2,
    /// Opening the output files (as the job's user).
    Output = 3,
    Chdir = 4,
    Exec = 5,
}

impl Step {
    const ALL: [Step; 5] = [Step::Limits, Step::Identity, Step::Output, Step::Chdir, Step::Exec];

    /// The word in the status file.
    pub(crate) fn word(self) -> &'static [u8] {
        match self {
            Step::Limits => b"limits-failed",
            Step::Identity => b"identity-failed",
            Step::Output => b"output-failed",
            Step::Chdir => b"chdir-failed",
            // What agents before the steps existed wrote for chdir and exec alike.
            Step::Exec => b"launch-failed",
        }
    }

    pub(crate) fn from_code(code: i32) -> Step {
        Step::ALL.into_iter().find(|s| *s as i32 == code).unwrap_or(Step::Exec)
    }

    /// What the step is, for a message: "cannot <what>: <error>".
    pub fn what(self) -> &'static str {
        match self {
            Step::Limits => "apply the job's resource limits",
            Step::Identity => "switch to the job's user",
            Step::Output => "open the job's output files as its user",
            Step::Chdir => "change to the working directory",
            Step::Exec => "run the program",
        }
    }
}

impl Status {
    pub(crate) fn parse(text: &str) -> Option<Status> {
        let (kind, value) = text.trim().split_once(' ')?;
        let value: i32 = value.parse().ok()?;
        match kind {
            "exited" => Some(Status::Exited(value)),
            "signaled" => Some(Status::Signaled(value)),
            "lease-expired" => Some(Status::LeaseExpired(value)),
            _ => Step::ALL.into_iter().find(|s| s.word() == kind.as_bytes()).map(|s| Status::LaunchFailed(s, value)),
        }
    }
}

/// The processes of one running rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pids {
    pub supervisor: i32,
    /// The job's process group (its main process's pid).
    pub pgid: i32,
}

/// Where a job's record lives.
pub fn record_dir(spool: &Path, job_id: u64, token: u64) -> PathBuf {
    spool.join("jobs").join(format!("{job_id}.{token}"))
}

/// The node's lease file: the monotonic-clock deadline (ms) until which the agent last heard
/// the leader, which the supervisors of `--requeue` jobs enforce ([`crate::supervisor`]).
pub fn lease_file(spool: &Path) -> PathBuf {
    spool.join("lease")
}

/// Replaces the lease file atomically with `deadline_ms` (`None`: the leader gives no lease).
pub fn write_lease(spool: &Path, deadline_ms: Option<u64>) -> io::Result<()> {
    let text = deadline_ms.map_or_else(|| "never\n".to_string(), |d| format!("{d}\n"));
    let tmp = spool.join("lease.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, lease_file(spool))
}

/// The status the supervisor wrote, if it has.
pub fn read_status(record: &Path) -> Option<Status> {
    Status::parse(&std::fs::read_to_string(record.join("status")).ok()?)
}

/// What a job used on this node, as its supervisor recorded it when the job's main process
/// ended: CPU time (user, system, in microseconds) and the largest resident set of any of its
/// processes (KiB), from `wait4` (the job's process and every descendant it waited for).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_user_us: u64,
    pub cpu_system_us: u64,
    pub max_rss_kb: u64,
}

/// The usage the supervisor wrote, if it has.
pub fn read_usage(record: &Path) -> Option<Usage> {
    let text = std::fs::read_to_string(record.join("usage")).ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    let (Some(Some(cpu_user_us)), Some(Some(cpu_system_us)), Some(Some(max_rss_kb))) =
        (fields.next(), fields.next(), fields.next())
    else {
        return None;
    };
    Some(Usage { cpu_user_us, cpu_system_us, max_rss_kb })
}

/// Replaces what the agent measured of a running job so far (`measured`); see
/// [`crate::agent::Agent::save_measured`].
pub fn write_measured(record: &Path, text: &str) -> io::Result<()> {
    let tmp = record.join("measured.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, record.join("measured"))
}

/// What an agent measured of the job before it stopped, if anything.
pub fn read_measured(record: &Path) -> Option<String> {
    std::fs::read_to_string(record.join("measured")).ok()
}

/// Whether process `pid` exists (a zombie counts until reaped).
pub(crate) fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0 && (unsafe { libc::kill(pid, 0) } == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// Creates the record of a job about to start.
pub fn create_record(record: &Path, launch: &Launch, started_ms: u64) -> io::Result<()> {
    std::fs::create_dir_all(record)?;
    std::fs::write(record.join("launch.pb"), launch.encode_to_vec())?;
    std::fs::write(record.join("started"), started_ms.to_string())
}

/// Replaces the launch a running job's record holds (its time limit moved), whole or not at all.
pub fn rewrite_launch(record: &Path, launch: &Launch) -> io::Result<()> {
    if !record.join("launch.pb").exists() {
        return Ok(());
    }
    let tmp = record.join("launch.pb.tmp");
    std::fs::write(&tmp, launch.encode_to_vec())?;
    std::fs::rename(&tmp, record.join("launch.pb"))
}

pub fn write_pids(record: &Path, pids: Pids) -> io::Result<()> {
    std::fs::write(record.join("pids"), format!("{} {}", pids.supervisor, pids.pgid))
}

/// Notes why the agent signalled the job, so that an agent restarted before it ends still
/// reports it as cancelled, timed out or killed by the lease.
pub fn write_reason(record: &Path, kind: ExitKind) {
    let _ = std::fs::write(record.join("reason"), (kind as i32).to_string());
}

/// A job found in the spool when the agent starts.
#[derive(Debug)]
pub struct Found {
    pub launch: Launch,
    pub record: PathBuf,
    pub started_ms: u64,
    pub pids: Option<Pids>,
    pub reason: Option<ExitKind>,
    /// Set when it has ended (or cannot be watched any more).
    pub status: Option<Status>,
}

/// Every job record in `spool`; records that cannot be read are reported and skipped.
pub fn scan(spool: &Path) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(spool.join("jobs")) else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let record = entry.path();
        match read_record(&record) {
            Ok(f) => found.push(f),
            Err(e) => tracing::warn!(record = %record.display(), error = %e, "unreadable job record; skipped"),
        }
    }
    found.sort_by_key(|f| (f.launch.job_id, f.launch.token));
    found
}

fn read_record(record: &Path) -> io::Result<Found> {
    let launch = Launch::decode(std::fs::read(record.join("launch.pb"))?.as_slice())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let started_ms = std::fs::read_to_string(record.join("started"))?.trim().parse().unwrap_or(0);
    let pids = std::fs::read_to_string(record.join("pids")).ok().and_then(|t| {
        let mut it = t.split_whitespace().map(str::parse::<i32>);
        match (it.next(), it.next()) {
            (Some(Ok(supervisor)), Some(Ok(pgid))) => Some(Pids { supervisor, pgid }),
            _ => None,
        }
    });
    let reason = std::fs::read_to_string(record.join("reason"))
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok())
        .and_then(|k| ExitKind::try_from(k).ok());
    let status = match read_status(record) {
        Some(s) => Some(s),
        None if pids.is_some_and(|p| alive(p.supervisor)) => None,
        // No supervisor (or it just ended): read again, and without a status it is lost.
        None => Some(read_status(record).unwrap_or(Status::Lost)),
    };
    Ok(Found { launch, record: record.to_path_buf(), started_ms, pids, reason, status })
}
