//! A job's record in the agent's spool: `<spool>/jobs/<job>.<token>/` with `launch.pb` (the
//! launch as the leader sent it), `started` (ms since the epoch), `pids` (supervisor pid and job
//! process group), `reason` (why the agent signalled it, if it did), `status` (written by the
//! supervisor at the end), `measured` (what the agent measured while it ran: its GPUs' use and
//! its processes' peak memory together, at each heartbeat). A restarted agent finds its jobs
//! again from their records ([`scan`]); a record is removed once the leader has acknowledged the
//! job's exit.
//!
//! The spool is root's alone ([`prepare_spool`]): a launch holds the job's script and whole
//! environment, so `jobs/` and every record are 0700 with files 0600. The one thing a job's user
//! reads there is its own batch script, which its interpreter opens as that user: it lives in
//! `scripts/<job>.<token>/` ([`script_dir`]), a directory of the user's own (0700) inside
//! `scripts/`, which others may pass through but not list (0711), as Slurm keeps `slurm_script`
//! in a job directory of the user's own.

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

/// The directory of the job's user's own that holds its batch script on this node.
pub fn script_dir(spool: &Path, job_id: u64, token: u64) -> PathBuf {
    spool.join("scripts").join(format!("{job_id}.{token}"))
}

/// Makes the spool (and fixes one an older agent left readable): the spool itself and
/// `scripts/` may be passed through (0711), `jobs/` and everything in it is private (0700 and
/// 0600), and each job's script directory is its user's alone (0700, the script 0500).
pub fn prepare_spool(spool: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    const PASS_THROUGH: u32 = 0o711;
    std::fs::DirBuilder::new().recursive(true).mode(PASS_THROUGH).create(spool)?;
    let scripts = spool.join("scripts");
    for dir in [spool.join("jobs"), scripts.clone()] {
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    let (jobs, top) = (spool.join("jobs"), spool.to_path_buf());
    quorum_auth::private::restrict_tree(spool, &|path, is_dir| {
        if path == top || path == scripts {
            PASS_THROUGH
        } else if path.starts_with(&scripts) {
            if is_dir {
                0o700
            } else {
                0o500
            }
        } else if is_dir || path == jobs {
            0o700
        } else {
            0o600
        }
    })
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
    private(&tmp, text.as_bytes())?;
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
    private(&tmp, text.as_bytes())?;
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
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(record)?;
    private(&record.join("launch.pb"), &launch.encode_to_vec())?;
    private(&record.join("started"), started_ms.to_string().as_bytes())
}

/// Writes a file of the spool, root's alone whatever the umask.
fn private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    quorum_auth::private::write(path, bytes)
}

/// Replaces the launch a running job's record holds (its time limit moved), whole or not at all.
pub fn rewrite_launch(record: &Path, launch: &Launch) -> io::Result<()> {
    if !record.join("launch.pb").exists() {
        return Ok(());
    }
    let tmp = record.join("launch.pb.tmp");
    private(&tmp, &launch.encode_to_vec())?;
    std::fs::rename(&tmp, record.join("launch.pb"))
}

pub fn write_pids(record: &Path, pids: Pids) -> io::Result<()> {
    private(&record.join("pids"), format!("{} {}", pids.supervisor, pids.pgid).as_bytes())
}

/// Notes why the agent signalled the job, so that an agent restarted before it ends still
/// reports it as cancelled, timed out or killed by the lease.
pub fn write_reason(record: &Path, kind: ExitKind) {
    let _ = private(&record.join("reason"), (kind as i32).to_string().as_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// A spool an older agent left readable (0755 directories, 0644 records) is made private on
    /// start; a job's script directory stays its user's; new records are private whatever the
    /// umask.
    #[test]
    fn the_spool_is_made_private_and_new_records_are_private() {
        let tmp = tempfile::tempdir().unwrap();
        let spool = tmp.path().join("spool");
        let old = spool.join("jobs").join("6.18");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::create_dir_all(spool.join("scripts").join("6.18")).unwrap();
        std::fs::write(spool.join("scripts/6.18/slurm_script"), "#!/bin/sh\n").unwrap();
        std::fs::write(old.join("launch.pb"), "alice's environment").unwrap();
        std::fs::write(spool.join("lease"), "never\n").unwrap();
        for p in [&spool, &spool.join("jobs"), &old, &spool.join("scripts")] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        for p in [old.join("launch.pb"), spool.join("lease")] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        prepare_spool(&spool).unwrap();
        assert_eq!(mode(&spool), 0o711);
        assert_eq!(mode(&spool.join("jobs")), 0o700);
        assert_eq!(mode(&old), 0o700);
        assert_eq!(mode(&old.join("launch.pb")), 0o600);
        assert_eq!(mode(&spool.join("lease")), 0o600);
        assert_eq!(mode(&spool.join("scripts")), 0o711);
        assert_eq!(mode(&spool.join("scripts/6.18")), 0o700);
        assert_eq!(mode(&spool.join("scripts/6.18/slurm_script")), 0o500);

        let record = record_dir(&spool, 7, 1);
        create_record(&record, &Launch { job_id: 7, token: 1, ..Default::default() }, 5).unwrap();
        write_pids(&record, Pids { supervisor: 1, pgid: 2 }).unwrap();
        write_measured(&record, "x").unwrap();
        write_lease(&spool, Some(9)).unwrap();
        assert_eq!(mode(&record), 0o700);
        for f in ["launch.pb", "started", "pids", "measured"] {
            assert_eq!(mode(&record.join(f)), 0o600, "{f}");
        }
        assert_eq!(mode(&spool.join("lease")), 0o600);
        // A fresh spool is made so too.
        let fresh = tmp.path().join("fresh");
        prepare_spool(&fresh).unwrap();
        assert_eq!((mode(&fresh), mode(&fresh.join("jobs")), mode(&fresh.join("scripts"))), (0o711, 0o700, 0o711));
    }
}
