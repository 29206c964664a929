//! Each job rank runs under its own supervisor process, as Slurm's jobs run under slurmstepd:
//! the agent forks the supervisor, which starts a session of its own, forks and execs the job
//! (in a process group of its own), waits for it, kills whatever is left of its group and writes
//! the exit status to the job's record directory. Nothing in it depends on the agent process, so
//! an agent stopped or restarted (an upgrade, a crash) leaves its jobs running; the new agent
//! finds them again from their records ([`scan`]) and watches each supervisor through a pidfd.
//!
//! A record is `<spool>/jobs/<job>.<token>/` with `launch.pb` (the launch as the leader sent it),
//! `started` (ms since the epoch), `pids` (supervisor pid and job process group), `reason` (why
//! the agent signalled it, if it did), `status` (written by the supervisor at the end) and the
//! batch script. It is removed once the leader has acknowledged the job's exit.
//!
//! Between the forks only async-signal-safe calls run: everything the children need (paths,
//! argv, environment, open files) is prepared before the first fork.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use quorum_proto::agent::{ExitKind, Launch};

/// What a supervisor recorded about its job's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Exited(i32),
    Signaled(i32),
    /// The program could not be started (errno of chdir or exec).
    LaunchFailed(i32),
    /// The supervisor is gone without a status (killed itself): the job's end is unknown.
    Lost,
}

impl Status {
    fn parse(text: &str) -> Option<Status> {
        let (kind, value) = text.trim().split_once(' ')?;
        let value: i32 = value.parse().ok()?;
        match kind {
            "exited" => Some(Status::Exited(value)),
            "signaled" => Some(Status::Signaled(value)),
            "launch-failed" => Some(Status::LaunchFailed(value)),
            _ => None,
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

/// What the job's process needs, prepared before any fork.
pub struct Prepared {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
    stdout: File,
    stderr: File,
    stdin: File,
    status_tmp: CString,
    status: CString,
}

fn cstring(what: &str, bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{what} contains a NUL byte")))
}

/// Finds `program` the way a shell would, on the job's `PATH`.
fn resolve_program(program: &str, env: &[(String, String)]) -> io::Result<PathBuf> {
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or("/usr/bin:/bin");
    for dir in path.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(program);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            use std::os::unix::fs::PermissionsExt;
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(io::Error::new(io::ErrorKind::NotFound, format!("'{program}' is not found on the job's PATH")))
}

impl Prepared {
    /// `argv[0]` is looked up on the job's `PATH`; `record` is the job's record directory.
    pub fn new(
        argv: &[String],
        env: &[(String, String)],
        cwd: &Path,
        stdout: File,
        stderr: File,
        record: &Path,
    ) -> io::Result<Prepared> {
        let first = argv.first().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
        let program = resolve_program(first, env)?;
        Ok(Prepared {
            program: cstring("the program path", program.as_os_str().as_bytes())?,
            argv: argv.iter().map(|a| cstring("an argument", a.as_bytes())).collect::<io::Result<_>>()?,
            envp: env
                .iter()
                .map(|(k, v)| cstring("an environment variable", format!("{k}={v}").as_bytes()))
                .collect::<io::Result<_>>()?,
            cwd: cstring("the working directory", cwd.as_os_str().as_bytes())?,
            stdout,
            stderr,
            stdin: File::open("/dev/null")?,
            status_tmp: cstring("the record path", record.join("status.tmp").as_os_str().as_bytes())?,
            status: cstring("the record path", record.join("status").as_os_str().as_bytes())?,
        })
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Forks the supervisor, which starts the job. Blocks until the job's exec succeeded or failed
/// (run it off the async threads). On an exec failure the supervisor still records the status.
pub fn spawn(p: &Prepared) -> io::Result<Pids> {
    let (report_r, report_w) = pipe()?;
    let (exec_r, exec_w) = pipe()?;
    let argv: Vec<*const libc::c_char> =
        p.argv.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let envp: Vec<*const libc::c_char> =
        p.envp.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let keep = [
        report_w.as_raw_fd(),
        exec_r.as_raw_fd(),
        exec_w.as_raw_fd(),
        p.stdout.as_raw_fd(),
        p.stderr.as_raw_fd(),
        p.stdin.as_raw_fd(),
    ];
    // SAFETY: the child runs only async-signal-safe calls on memory prepared above and ends in
    // _exit; the parent only closes descriptors and reads the pipe.
    let supervisor = unsafe { libc::fork() };
    if supervisor == -1 {
        return Err(io::Error::last_os_error());
    }
    if supervisor == 0 {
        // SAFETY: see above; this never returns.
        unsafe { supervise(p, &argv, &envp, keep, report_w.as_raw_fd(), exec_r.as_raw_fd(), exec_w.as_raw_fd()) }
    }
    drop(report_w);
    drop(exec_w);
    drop(exec_r);
    let mut buf = [0u8; 8];
    let mut reader = File::from(report_r);
    reader.read_exact(&mut buf).map_err(|e| io::Error::other(format!("the job supervisor did not report: {e}")))?;
    let pgid = i32::from_ne_bytes(buf[..4].try_into().expect("4 bytes"));
    Ok(Pids { supervisor, pgid })
}

/// Closes every descriptor from 3 up except those in `keep`.
unsafe fn close_all_but(keep: &mut [RawFd]) {
    keep.sort_unstable();
    let mut from: u32 = 3;
    for &fd in keep.iter() {
        let fd = fd as u32;
        if fd >= from {
            if fd > from {
                libc::syscall(libc::SYS_close_range, from, fd - 1, 0);
            }
            from = fd + 1;
        }
    }
    libc::syscall(libc::SYS_close_range, from, u32::MAX, 0);
}

unsafe fn write_all(fd: RawFd, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        if n <= 0 {
            if n == -1 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// "<word> <number>\n" without allocating.
fn status_line(word: &[u8], value: i32, out: &mut [u8; 48]) -> usize {
    let mut n = 0;
    for &b in word.iter().chain(b" ") {
        out[n] = b;
        n += 1;
    }
    let mut digits = [0u8; 12];
    let mut d = 0;
    let negative = value < 0;
    let mut v = (value as i64).unsigned_abs();
    loop {
        digits[d] = b'0' + (v % 10) as u8;
        d += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if negative {
        out[n] = b'-';
        n += 1;
    }
    while d > 0 {
        d -= 1;
        out[n] = digits[d];
        n += 1;
    }
    out[n] = b'\n';
    n + 1
}

unsafe fn write_status(p: &Prepared, word: &[u8], value: i32) {
    let mut line = [0u8; 48];
    let len = status_line(word, value, &mut line);
    let fd = libc::open(p.status_tmp.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC, 0o644);
    if fd >= 0 {
        write_all(fd, &line[..len]);
        libc::fsync(fd);
        libc::close(fd);
        libc::rename(p.status_tmp.as_ptr(), p.status.as_ptr());
    }
}

/// The supervisor process: never returns.
#[allow(clippy::too_many_arguments)]
unsafe fn supervise(
    p: &Prepared,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    mut keep: [RawFd; 6],
    report_w: RawFd,
    exec_r: RawFd,
    exec_w: RawFd,
) -> ! {
    // Descriptors inherited from the agent (sockets, other jobs' pipes) are not the job's.
    close_all_but(&mut keep);
    libc::setsid();
    // Default dispositions and no blocked signal: the agent's handlers are not ours.
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    for sig in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGPIPE, libc::SIGUSR1, libc::SIGUSR2] {
        libc::signal(sig, libc::SIG_DFL);
    }
    let job = libc::fork();
    if job == 0 {
        libc::setpgid(0, 0);
        libc::dup2(p.stdin.as_raw_fd(), 0);
        libc::dup2(p.stdout.as_raw_fd(), 1);
        libc::dup2(p.stderr.as_raw_fd(), 2);
        let failed = if libc::chdir(p.cwd.as_ptr()) == -1 {
            *libc::__errno_location()
        } else {
            libc::execve(p.program.as_ptr(), argv.as_ptr(), envp.as_ptr());
            *libc::__errno_location()
        };
        write_all(exec_w, &failed.to_ne_bytes());
        libc::_exit(127);
    }
    if job == -1 {
        let errno = *libc::__errno_location();
        let mut report = [0u8; 8];
        report[4..].copy_from_slice(&errno.to_ne_bytes());
        write_all(report_w, &report);
        write_status(p, b"launch-failed", errno);
        libc::_exit(0);
    }
    libc::setpgid(job, job);
    libc::close(exec_w);
    // The exec pipe closes on a successful exec; four bytes mean chdir or exec failed.
    let mut errno_bytes = [0u8; 4];
    let mut got = 0usize;
    while got < 4 {
        let n = libc::read(exec_r, errno_bytes[got..].as_mut_ptr().cast(), 4 - got);
        if n == -1 && *libc::__errno_location() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    let mut report = [0u8; 8];
    report[..4].copy_from_slice(&job.to_ne_bytes());
    report[4..].copy_from_slice(&errno_bytes);
    write_all(report_w, &report);
    libc::close(report_w);
    let mut status = 0;
    while libc::waitpid(job, &mut status, 0) == -1 && *libc::__errno_location() == libc::EINTR {}
    // Nothing of a finished job outlives it.
    libc::kill(-job, libc::SIGKILL);
    if got == 4 {
        write_status(p, b"launch-failed", i32::from_ne_bytes(errno_bytes));
    } else if libc::WIFSIGNALED(status) {
        write_status(p, b"signaled", libc::WTERMSIG(status));
    } else {
        write_status(p, b"exited", libc::WEXITSTATUS(status));
    }
    libc::_exit(0);
}

/// The status the supervisor wrote, if it has.
pub fn read_status(record: &Path) -> Option<Status> {
    Status::parse(&std::fs::read_to_string(record.join("status")).ok()?)
}

/// Whether process `pid` exists (a zombie counts until reaped).
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0 && (unsafe { libc::kill(pid, 0) } == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// Reaps the supervisor if it is this process's child (a no-op for one found after a restart).
fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid on a specific pid with WNOHANG only reaps that child, if it is ours.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
}

/// Waits until the supervisor has ended and returns what it recorded.
pub async fn wait(pids: Pids, record: &Path) -> Status {
    wait_exit(pids.supervisor).await;
    reap(pids.supervisor);
    read_status(record).unwrap_or(Status::Lost)
}

/// Waits for process `pid` to end: through a pidfd when the kernel has them, else by polling.
async fn wait_exit(pid: i32) {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd >= 0 {
        // SAFETY: the descriptor was just opened and is owned by nobody else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        // SAFETY: the AsyncFd owns the pidfd, which nothing else closes or replaces.
        let registered =
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) };
        if let Ok(async_fd) = registered {
            let _ = async_fd.readable().await;
            return;
        }
    }
    while alive(pid) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        reap(pid);
    }
}

/// Creates the record of a job about to start.
pub fn create_record(record: &Path, launch: &Launch, started_ms: u64) -> io::Result<()> {
    std::fs::create_dir_all(record)?;
    std::fs::write(record.join("launch.pb"), launch.encode_to_vec())?;
    std::fs::write(record.join("started"), started_ms.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_round_trip() {
        let mut buf = [0u8; 48];
        for (word, value, want) in [
            (&b"exited"[..], 0, Status::Exited(0)),
            (b"exited", 255, Status::Exited(255)),
            (b"signaled", 9, Status::Signaled(9)),
            (b"launch-failed", -2, Status::LaunchFailed(-2)),
        ] {
            let n = status_line(word, value, &mut buf);
            assert_eq!(Status::parse(std::str::from_utf8(&buf[..n]).unwrap()), Some(want));
        }
        assert_eq!(Status::parse("garbage"), None);
    }

    #[tokio::test]
    async fn a_supervised_job_records_its_exit_and_can_be_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let record = record_dir(dir.path(), 5, 9);
        let launch = Launch { job_id: 5, token: 9, ..Default::default() };
        create_record(&record, &launch, 1234).unwrap();
        let out = File::create(dir.path().join("out")).unwrap();
        let err = out.try_clone().unwrap();
        let env = vec![("PATH".to_string(), std::env::var("PATH").unwrap())];
        let argv: Vec<String> = ["bash", "-c", "echo hi; sleep 0.3; exit 3"].iter().map(|s| s.to_string()).collect();
        let p = Prepared::new(&argv, &env, dir.path(), out, err, &record).unwrap();
        let pids = spawn(&p).unwrap();
        write_pids(&record, pids).unwrap();
        assert!(pids.pgid > 0 && pids.supervisor > 0 && pids.pgid != pids.supervisor);
        // Found again while it runs, as a restarted agent would.
        let found = scan(dir.path());
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].launch.job_id, found[0].started_ms, found[0].pids, found[0].status),
            (5, 1234, Some(pids), None)
        );
        assert_eq!(wait(pids, &record).await, Status::Exited(3));
        assert_eq!(std::fs::read_to_string(dir.path().join("out")).unwrap(), "hi\n");
        assert_eq!(scan(dir.path())[0].status, Some(Status::Exited(3)));

        let out = File::create(dir.path().join("out2")).unwrap();
        let err = out.try_clone().unwrap();
        let record2 = record_dir(dir.path(), 6, 1);
        std::fs::create_dir_all(&record2).unwrap();
        let missing = Prepared::new(&argv, &env, &dir.path().join("no-such-dir"), out, err, &record2).unwrap();
        let pids = spawn(&missing).unwrap();
        assert_eq!(wait(pids, &record2).await, Status::LaunchFailed(libc::ENOENT));
    }
}
