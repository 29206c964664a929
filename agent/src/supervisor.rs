//! Each job rank runs under its own supervisor process, as Slurm's jobs run under slurmstepd:
//! the agent forks the supervisor, which starts a session of its own, forks and execs the job
//! (in a process group of its own), waits for it, kills whatever is left of its group and writes
//! the exit status to the job's record directory. Nothing in it depends on the agent process, so
//! an agent stopped or restarted (an upgrade, a crash) leaves its jobs running; the new agent
//! finds them again from their records ([`crate::record::scan`]) and watches each supervisor through a pidfd.
//!
//! Each job's record in the spool, which the supervisor writes its status into, is
//! [`crate::record`]'s.
//!
//! The supervisor is not a fork of the agent: a fork copies the page tables of the agent's whole
//! address space (in `quorum dev`, three replicas' RocksDB as well), tears the copy down again,
//! and makes every page the agent writes afterwards a copy-on-write fault while the supervisor
//! lives; measured, nearly half of all CPU when a node runs short jobs back to back. The agent
//! starts a program instead (`posix_spawn`, which shares the agent's memory only until the
//! exec) under the name `quorum-supervisor`, and hands it what it needs ([`Prepared`], encoded)
//! through a memfd. The program is `quorum-supervisor` where it lies beside the agent's own
//! ([`program`]): a small one, which links this module and little else (starting the agent's
//! program, or `quorum-dev` with three replicas' RocksDB, for each job rank cost several times
//! more: the loader's relocations, the page faults of a binary of 100-200 MB, and its fork of
//! the job). Else it is the agent's own program again (`/proc/self/exe`). Either never reaches
//! `main`: [`SUPERVISOR_ENTRY`], run by the C runtime before it, sees that name and runs the
//! supervisor. Every program that can run an agent links this module, tests included, so each
//! can be its own supervisor. Where the exec is impossible (no `/proc`), the agent forks.
//!
//! Between the supervisor's fork and the job's exec only async-signal-safe calls run:
//! everything the job's process needs (paths, argv, environment, open files) is prepared before.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::limits::JobCgroup;
use crate::record::{alive, read_status, Pids, Status, Step};

/// The umask a job's processes start with when its submitter's is not known (an older client,
/// the REST API): the usual default, never the agent's own (077).
pub const DEFAULT_UMASK: u32 = 0o022;

/// Who the job's process becomes before it runs anything.
#[derive(Clone, Debug)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// The job's output files; opened by the job's process itself, as its user.
pub struct Output {
    pub stdout: PathBuf,
    /// `None`: with the output.
    pub stderr: Option<PathBuf>,
    /// Truncate (the first rank) or append.
    pub truncate: bool,
}

/// What the job's process needs, prepared before any fork.
pub struct Prepared {
    /// Where to look for the program, in order (one path when it has a `/`).
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
    stdout: CString,
    stderr: Option<CString>,
    truncate: bool,
    stdin: File,
    credentials: Option<Credentials>,
    /// The `cgroup.procs` of each of the job's cgroup directories (one with v2, one per
    /// controller with v1), joined before anything runs.
    cgroup_procs: Vec<CString>,
    /// At the end, v2's `cgroup.kill`; v1 has none, so the pids left in its memory cgroup's
    /// `cgroup.procs` are killed one by one.
    cgroup_kill: Option<CString>,
    cgroup_sweep: Option<CString>,
    /// Without a cgroup: `RLIMIT_DATA` in bytes.
    rlimit_data: Option<u64>,
    /// Written to the job's stderr before the error text when chdir or exec fails.
    chdir_message: Vec<u8>,
    exec_message: Vec<u8>,
    not_found_message: Vec<u8>,
    /// The program was looked up on `PATH`.
    searched: bool,
    status_tmp: CString,
    status: CString,
    /// Where the supervisor writes what the job used ([`crate::record::read_usage`]).
    usage: CString,
    /// The dead-man switch of a job that may be started elsewhere (`--requeue`): the node's
    /// lease file, which the agent keeps renewing, and the deadline the job starts with.
    lease: Option<(CString, u64)>,
    /// The host name the job sees, in a UTS namespace of its own.
    hostname: Option<CString>,
    /// With the host name: the file the job sees as `/etc/hosts`, in a mount namespace of its
    /// own (the cluster's node names, where no name service knows them).
    hosts: Option<CString>,
    /// The umask the job starts with (its submitter's; never the agent's own).
    umask: u32,
    /// The container the job runs in (`--container-image`): entered after its output files
    /// are open, before it becomes its user.
    container: Option<crate::container::Enter>,
}

/// The text of every errno, made before any fork (strerror is not async-signal-safe).
fn error_texts() -> &'static [Vec<u8>] {
    static TEXTS: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    TEXTS.get_or_init(|| {
        (0..160)
            .map(|e| {
                let text = io::Error::from_raw_os_error(e).to_string();
                let text = text.split(" (os error").next().unwrap_or(&text).to_string();
                format!("{text}\n").into_bytes()
            })
            .collect()
    })
}

fn cstring(what: &str, bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{what} contains a NUL byte")))
}

/// Where a shell would look for `program`: on the job's `PATH`, tried in order by the job's
/// process itself (as its user, so its permissions decide).
fn program_candidates(program: &str, env: &[(String, String)]) -> Vec<PathBuf> {
    if program.contains('/') {
        return vec![PathBuf::from(program)];
    }
    let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or("/usr/bin:/bin");
    path.split(':').filter(|d| !d.is_empty()).map(|dir| Path::new(dir).join(program)).collect()
}

fn path_cstring(what: &str, path: &Path) -> io::Result<CString> {
    cstring(what, path.as_os_str().as_bytes())
}

impl Prepared {
    /// `argv[0]` is looked up on the job's `PATH`; `record` is the job's record directory.
    pub fn new(
        argv: &[String],
        env: &[(String, String)],
        cwd: &Path,
        output: &Output,
        record: &Path,
    ) -> io::Result<Prepared> {
        let first = argv.first().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
        let candidates = program_candidates(first, env);
        let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or("");
        error_texts();
        Ok(Prepared {
            candidates: candidates.iter().map(|c| path_cstring("the program path", c)).collect::<io::Result<_>>()?,
            argv: argv.iter().map(|a| cstring("an argument", a.as_bytes())).collect::<io::Result<_>>()?,
            envp: env
                .iter()
                .map(|(k, v)| cstring("an environment variable", format!("{k}={v}").as_bytes()))
                .collect::<io::Result<_>>()?,
            cwd: path_cstring("the working directory", cwd)?,
            stdout: path_cstring("the output path", &output.stdout)?,
            stderr: output.stderr.as_deref().map(|p| path_cstring("the error path", p)).transpose()?,
            truncate: output.truncate,
            stdin: File::open("/dev/null")?,
            credentials: None,
            cgroup_procs: Vec::new(),
            cgroup_kill: None,
            cgroup_sweep: None,
            rlimit_data: None,
            chdir_message: format!("quorum: cannot change to the working directory {}: ", cwd.display()).into_bytes(),
            exec_message: format!("quorum: cannot run '{first}' in {}: ", cwd.display()).into_bytes(),
            searched: !first.contains('/'),
            not_found_message: format!("quorum: '{first}' is not found on the job's PATH ({path})\n").into_bytes(),
            status_tmp: path_cstring("the record path", &record.join("status.tmp"))?,
            status: path_cstring("the record path", &record.join("status"))?,
            usage: path_cstring("the record path", &record.join("usage"))?,
            lease: None,
            hostname: None,
            hosts: None,
            umask: DEFAULT_UMASK,
            container: None,
        })
    }

    /// The job runs in this container.
    pub fn container(mut self, enter: crate::container::Enter) -> Prepared {
        self.container = Some(enter);
        self
    }

    /// Runs the job as this user instead of the agent's.
    pub fn run_as(mut self, credentials: Credentials) -> Prepared {
        self.credentials = Some(credentials);
        self
    }

    /// The job's process joins this cgroup before it runs anything.
    pub fn cgroup(mut self, job: &JobCgroup) -> io::Result<Prepared> {
        self.cgroup_procs =
            job.procs_files().iter().map(|p| path_cstring("the cgroup path", p)).collect::<io::Result<_>>()?;
        let first = &job.dirs[0];
        if job.v2 {
            self.cgroup_kill = Some(path_cstring("the cgroup path", &first.join("cgroup.kill"))?);
        } else {
            self.cgroup_sweep = Some(path_cstring("the cgroup path", &first.join("cgroup.procs"))?);
        }
        Ok(self)
    }

    /// Kills the job once the monotonic clock passes both `deadline_ms` and the deadline the agent
    /// last wrote to `lease_file` ([`crate::record::write_lease`]), whatever the agent does.
    pub fn lease(mut self, lease_file: &Path, deadline_ms: u64) -> io::Result<Prepared> {
        self.lease = Some((path_cstring("the lease path", lease_file)?, deadline_ms));
        Ok(self)
    }

    /// The job sees `name` as its host name (a UTS namespace of its own).
    pub fn hostname(mut self, name: &str) -> io::Result<Prepared> {
        self.hostname = Some(cstring("the host name", name.as_bytes())?);
        Ok(self)
    }

    /// With a host name, the job sees `file` as `/etc/hosts` (a mount namespace of its own).
    pub fn hosts(mut self, file: &Path) -> io::Result<Prepared> {
        self.hosts = Some(path_cstring("the hosts file", file)?);
        Ok(self)
    }

    /// The job's processes start with `mask` as their umask.
    pub fn umask(mut self, mask: u32) -> Prepared {
        self.umask = mask & 0o777;
        self
    }

    /// Without a cgroup: caps the job's data segment.
    pub fn rlimit_data(mut self, bytes: u64) -> Prepared {
        self.rlimit_data = Some(bytes);
        self
    }
}

/// How [`Prepared`] travels to a supervisor started by [`spawn_program`]: each field in order,
/// byte strings and lists as a little-endian `u32` length then their contents, numbers as
/// little-endian `u64`, options and flags as a byte 0 or 1 first. The supervisor is this same
/// program, so both ends always agree on the order.
mod handoff {
    use std::ffi::CString;

    #[derive(Default)]
    pub struct Writer(pub Vec<u8>);

    impl Writer {
        pub fn u64(&mut self, v: u64) {
            self.0.extend_from_slice(&v.to_le_bytes());
        }
        pub fn flag(&mut self, v: bool) {
            self.0.push(u8::from(v));
        }
        pub fn bytes(&mut self, b: &[u8]) {
            self.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
            self.0.extend_from_slice(b);
        }
        pub fn list(&mut self, items: &[CString]) {
            self.0.extend_from_slice(&(items.len() as u32).to_le_bytes());
            for i in items {
                self.bytes(i.as_bytes());
            }
        }
        pub fn opt(&mut self, v: Option<&CString>) {
            self.flag(v.is_some());
            if let Some(c) = v {
                self.bytes(c.as_bytes());
            }
        }
    }

    pub struct Reader<'a>(pub &'a [u8]);

    impl Reader<'_> {
        fn take(&mut self, n: usize) -> Option<&[u8]> {
            if self.0.len() < n {
                return None;
            }
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            Some(head)
        }
        fn len(&mut self) -> Option<usize> {
            Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize)
        }
        pub fn u64(&mut self) -> Option<u64> {
            Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
        }
        pub fn flag(&mut self) -> Option<bool> {
            match self.take(1)? {
                [0] => Some(false),
                [1] => Some(true),
                _ => None,
            }
        }
        pub fn bytes(&mut self) -> Option<Vec<u8>> {
            let n = self.len()?;
            Some(self.take(n)?.to_vec())
        }
        pub fn cstring(&mut self) -> Option<CString> {
            CString::new(self.bytes()?).ok()
        }
        pub fn list(&mut self) -> Option<Vec<CString>> {
            let n = self.len()?;
            // Every item takes at least its length's four bytes.
            if n > self.0.len() / 4 {
                return None;
            }
            (0..n).map(|_| self.cstring()).collect()
        }
        pub fn opt(&mut self) -> Option<Option<CString>> {
            if self.flag()? {
                Some(Some(self.cstring()?))
            } else {
                Some(None)
            }
        }
    }
}

impl Prepared {
    fn encode(&self) -> Vec<u8> {
        let mut w = handoff::Writer::default();
        w.list(&self.candidates);
        w.list(&self.argv);
        w.list(&self.envp);
        w.bytes(self.cwd.as_bytes());
        w.bytes(self.stdout.as_bytes());
        w.opt(self.stderr.as_ref());
        w.flag(self.truncate);
        w.flag(self.credentials.is_some());
        if let Some(c) = &self.credentials {
            w.u64(u64::from(c.uid));
            w.u64(u64::from(c.gid));
            w.u64(c.groups.len() as u64);
            for g in &c.groups {
                w.u64(u64::from(*g));
            }
        }
        w.list(&self.cgroup_procs);
        w.opt(self.cgroup_kill.as_ref());
        w.opt(self.cgroup_sweep.as_ref());
        w.flag(self.rlimit_data.is_some());
        w.u64(self.rlimit_data.unwrap_or(0));
        w.bytes(&self.chdir_message);
        w.bytes(&self.exec_message);
        w.bytes(&self.not_found_message);
        w.flag(self.searched);
        w.bytes(self.status_tmp.as_bytes());
        w.bytes(self.status.as_bytes());
        w.bytes(self.usage.as_bytes());
        w.flag(self.lease.is_some());
        if let Some((file, deadline)) = &self.lease {
            w.bytes(file.as_bytes());
            w.u64(*deadline);
        }
        w.opt(self.hostname.as_ref());
        w.opt(self.hosts.as_ref());
        w.u64(u64::from(self.umask));
        w.flag(self.container.is_some());
        if let Some(c) = &self.container {
            w.bytes(c.root.as_bytes());
            w.opt(c.maps.as_ref().map(|m| &m.0));
            w.opt(c.maps.as_ref().map(|m| &m.1));
        }
        w.0
    }

    /// What [`Prepared::encode`] wrote; `None` for anything else, or anything left over.
    fn decode(bytes: &[u8], stdin: File) -> Option<Prepared> {
        let mut r = handoff::Reader(bytes);
        let id = |v: u64| u32::try_from(v).ok();
        let p = Prepared {
            candidates: r.list()?,
            argv: r.list()?,
            envp: r.list()?,
            cwd: r.cstring()?,
            stdout: r.cstring()?,
            stderr: r.opt()?,
            truncate: r.flag()?,
            stdin,
            credentials: if r.flag()? {
                let (uid, gid) = (id(r.u64()?)?, id(r.u64()?)?);
                let n = usize::try_from(r.u64()?).ok().filter(|n| *n <= 65_536)?;
                let groups = (0..n).map(|_| id(r.u64()?)).collect::<Option<_>>()?;
                Some(Credentials { uid, gid, groups })
            } else {
                None
            },
            cgroup_procs: r.list()?,
            cgroup_kill: r.opt()?,
            cgroup_sweep: r.opt()?,
            rlimit_data: {
                let some = r.flag()?;
                let v = r.u64()?;
                some.then_some(v)
            },
            chdir_message: r.bytes()?,
            exec_message: r.bytes()?,
            not_found_message: r.bytes()?,
            searched: r.flag()?,
            status_tmp: r.cstring()?,
            status: r.cstring()?,
            usage: r.cstring()?,
            lease: if r.flag()? { Some((r.cstring()?, r.u64()?)) } else { None },
            hostname: r.opt()?,
            hosts: r.opt()?,
            umask: u32::try_from(r.u64()?).ok().filter(|m| *m <= 0o777)?,
            container: if r.flag()? {
                let root = r.cstring()?;
                let maps = match (r.opt()?, r.opt()?) {
                    (Some(u), Some(g)) => Some((u, g)),
                    (None, None) => None,
                    _ => return None,
                };
                Some(crate::container::Enter { root, maps })
            } else {
                None
            },
        };
        r.0.is_empty().then_some(p)
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

/// The name the supervisor runs under (`ps` shows it with the job's record directory).
const SUPERVISOR_ARG0: &std::ffi::CStr = c"quorum-supervisor";
/// The supervisor's descriptors, as the agent hands them over: where it reports the job's
/// process group, what it is to do (a memfd), and the job's standard input.
const REPORT_FD: RawFd = 3;
const HANDOFF_FD: RawFd = 4;
const STDIN_FD: RawFd = 5;

/// Starts the supervisor, which starts the job. Blocks until the job's exec succeeded or failed
/// (run it off the async threads). On an exec failure the supervisor still records the status.
pub fn spawn(p: &Prepared) -> io::Result<Pids> {
    // The entry point must be linked wherever supervisors are started.
    std::hint::black_box(&SUPERVISOR_ENTRY);
    if let Some(program) = program() {
        match spawn_with(p, Some(&program)) {
            Err(Spawned::Refused) => {
                tracing::warn!(
                    program = %program.to_string_lossy(),
                    "the supervisor program could not be started or is of another build; starting this program as \
                     the supervisor instead"
                );
                use_program(None);
            }
            Err(Spawned::Failed(e)) => return Err(e),
            Ok(pids) => return Ok(pids),
        }
    }
    spawn_with(p, None).map_err(|e| match e {
        Spawned::Failed(e) => e,
        Spawned::Refused => io::Error::other("the job supervisor refused its work"),
    })
}

/// Why a supervisor did not start.
enum Spawned {
    /// `quorum-supervisor` of another build, which did nothing ([`REFUSED`]), or one that could
    /// not be started.
    Refused,
    Failed(io::Error),
}

/// The exit status of a `quorum-supervisor` of another build, which refuses the work before
/// reading it.
const REFUSED: i32 = 125;

/// [`spawn`] with `program` (`None`: this program again).
fn spawn_with(p: &Prepared, program: Option<&std::ffi::CStr>) -> Result<Pids, Spawned> {
    let (report_r, report_w) = pipe().map_err(Spawned::Failed)?;
    let supervisor = match spawn_program(p, &report_w, program) {
        Ok(pid) => pid,
        // No such program (gone since it was found), or none that may run: this program, or a
        // fork of this process where not even that can be started again.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EACCES | libc::ENOEXEC)) => match program {
            Some(_) => return Err(Spawned::Refused),
            None => fork(p, &report_w).map_err(Spawned::Failed)?,
        },
        Err(e) => return Err(Spawned::Failed(e)),
    };
    drop(report_w);
    let mut buf = [0u8; 8];
    let mut reader = File::from(report_r);
    if let Err(e) = reader.read_exact(&mut buf) {
        // Nothing reported: a program that refused the work has exited; anything else is an
        // error (the supervisor is watched and reaped as usual).
        if program.is_some() && exited_with(supervisor, REFUSED) {
            return Err(Spawned::Refused);
        }
        return Err(Spawned::Failed(io::Error::other(format!("the job supervisor did not report: {e}"))));
    }
    let pgid = i32::from_ne_bytes(buf[..4].try_into().expect("4 bytes"));
    Ok(Pids { supervisor, pgid })
}

/// Whether child `pid`, which has closed its end of the report, exited with `code`; reaps it
/// if it has exited (it is waited for only briefly: a supervisor that lives on is left alone).
fn exited_with(pid: i32, code: i32) -> bool {
    for _ in 0..100 {
        let mut status = 0;
        // SAFETY: waitpid writes the status of our own child into `status`.
        match unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } {
            0 => std::thread::sleep(Duration::from_millis(1)),
            r if r == pid => return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == code,
            _ => return false,
        }
    }
    false
}

/// The program started as each job rank's supervisor: `None` for this program again.
/// `quorum-supervisor` beside this program when there is one, until it turns out to be of
/// another build ([`REFUSED`]); [`use_program`] sets it.
static PROGRAM: std::sync::Mutex<Option<Option<CString>>> = std::sync::Mutex::new(None);

fn program() -> Option<CString> {
    let mut program = PROGRAM.lock().unwrap_or_else(|p| p.into_inner());
    program
        .get_or_insert_with(|| beside_this_program().and_then(|p| CString::new(p.as_os_str().as_bytes()).ok()))
        .clone()
}

/// `quorum-supervisor` in the directory of this program, if it is there, may be run, and is
/// as safe from others as this program is: owned, like its directory, by this process's user or
/// root, and writable by no one else (the agent runs it as root for every job; one that another
/// user could replace would be theirs to run as root).
fn beside_this_program() -> Option<PathBuf> {
    beside(&std::env::current_exe().ok()?)
}

/// [`beside_this_program`] for the program at `exe`.
fn beside(exe: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let path = exe.with_file_name(SUPERVISOR_ARG0.to_str().expect("ASCII"));
    // Not there, or not a program: none (one that still cannot be started is passed over then).
    let file = std::fs::metadata(&path).ok().filter(|m| m.is_file() && m.mode() & 0o111 != 0)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let safe = |m: &std::fs::Metadata| (m.uid() == me || m.uid() == 0) && m.mode() & 0o022 == 0;
    if safe(&file) && path.parent().and_then(|d| std::fs::metadata(d).ok()).is_some_and(|m| safe(&m)) {
        return Some(path);
    }
    tracing::warn!(program = %path.display(), "not starting a supervisor program that another user could replace");
    None
}

/// Starts `program` as each job rank's supervisor from now on (`None`: this program again).
pub fn use_program(program: Option<&Path>) {
    let program = program.and_then(|p| CString::new(p.as_os_str().as_bytes()).ok());
    *PROGRAM.lock().unwrap_or_else(|p| p.into_inner()) = Some(program);
}

/// Which build of the supervisor this is ([`REFUSED`]): a hash of the sources of what the agent
/// hands over and the supervisor writes back (agent/build.rs).
const FINGERPRINT: &std::ffi::CStr =
    match std::ffi::CStr::from_bytes_with_nul(concat!(env!("QUORUM_SUPERVISOR_FINGERPRINT"), "\0").as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("a fingerprint has no NUL"),
    };

/// `quorum-supervisor`'s `main`, reached only when it was not started as a supervisor (which
/// [`SUPERVISOR_ENTRY`] takes over before `main`): `--fingerprint` prints which build it is.
pub fn program_main() -> std::process::ExitCode {
    // The entry point must be linked into the program.
    std::hint::black_box(&SUPERVISOR_ENTRY);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let build = FINGERPRINT.to_string_lossy();
    if args == ["--fingerprint"] {
        println!("{build}");
        return std::process::ExitCode::SUCCESS;
    }
    eprintln!(
        "quorum-supervisor: each job rank's supervisor, started by quorum-agent (build {build}); not to be run by hand"
    );
    std::process::ExitCode::from(2)
}

/// A descriptor of ours duplicated at 10 or above (close-on-exec), out of the way of the
/// numbers the supervisor gets.
fn high(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor or -1.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
    if new == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// What `Prepared` says, in a memfd at offset 0.
fn handoff(p: &Prepared) -> io::Result<OwnedFd> {
    // SAFETY: memfd_create takes a NUL-terminated name and flags.
    let fd = unsafe { libc::memfd_create(c"quorum-supervisor".as_ptr(), libc::MFD_CLOEXEC) };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nobody else.
    let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    std::io::Write::write_all(&mut file, &p.encode())?;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0))?;
    Ok(file.into())
}

/// `posix_spawn` of `program` (`None`: this program) as `quorum-supervisor`; its pid. The
/// `quorum-supervisor` program is told which build the work is for.
fn spawn_program(p: &Prepared, report_w: &OwnedFd, program: Option<&std::ffi::CStr>) -> io::Result<i32> {
    let spec = high(handoff(p)?.as_raw_fd())?;
    let report = high(report_w.as_raw_fd())?;
    let stdin = high(p.stdin.as_raw_fd())?;
    let label = CString::new(p.status.as_bytes().strip_suffix(b"/status").unwrap_or(p.status.as_bytes()))
        .map_err(io::Error::other)?;
    let argv = match program {
        Some(_) => [SUPERVISOR_ARG0.as_ptr(), label.as_ptr(), FINGERPRINT.as_ptr(), std::ptr::null()],
        None => [SUPERVISOR_ARG0.as_ptr(), label.as_ptr(), std::ptr::null(), std::ptr::null()],
    };
    let path = program.unwrap_or(c"/proc/self/exe");
    let envp = [std::ptr::null::<libc::c_char>()];
    let check = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(r)) };
    // SAFETY: the file actions and attributes are initialised before use and destroyed after;
    // every pointer handed to posix_spawn lives until it returns.
    unsafe {
        let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        check(libc::posix_spawn_file_actions_init(&mut actions))?;
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        if let Err(e) = check(libc::posix_spawnattr_init(&mut attr)) {
            libc::posix_spawn_file_actions_destroy(&mut actions);
            return Err(e);
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        let mut pid: libc::pid_t = 0;
        let result = (|| {
            for fd in 0..3 {
                let mode = if fd == 0 { libc::O_RDONLY } else { libc::O_WRONLY };
                check(libc::posix_spawn_file_actions_addopen(&mut actions, fd, c"/dev/null".as_ptr(), mode, 0))?;
            }
            for (from, to) in [(&report, REPORT_FD), (&spec, HANDOFF_FD), (&stdin, STDIN_FD)] {
                check(libc::posix_spawn_file_actions_adddup2(&mut actions, from.as_raw_fd(), to))?;
            }
            check(libc::posix_spawnattr_setsigmask(&mut attr, &none))?;
            check(libc::posix_spawnattr_setflags(&mut attr, libc::POSIX_SPAWN_SETSIGMASK as libc::c_short))?;
            check(libc::posix_spawn(
                &mut pid,
                path.as_ptr(),
                &actions,
                &attr,
                argv.as_ptr() as *const *mut libc::c_char,
                envp.as_ptr() as *const *mut libc::c_char,
            ))
        })();
        libc::posix_spawnattr_destroy(&mut attr);
        libc::posix_spawn_file_actions_destroy(&mut actions);
        result.map(|()| pid)
    }
}

/// `execve`'s form of a list: pointers to each string, then a null one.
fn null_terminated(list: &[CString]) -> Vec<*const libc::c_char> {
    list.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}

/// The supervisor as a fork of this process, where this program cannot be started again.
fn fork(p: &Prepared, report_w: &OwnedFd) -> io::Result<i32> {
    let (exec_r, exec_w) = pipe()?;
    let (argv, envp) = (null_terminated(&p.argv), null_terminated(&p.envp));
    let keep = [report_w.as_raw_fd(), exec_r.as_raw_fd(), exec_w.as_raw_fd(), p.stdin.as_raw_fd()];
    // SAFETY: the child runs only async-signal-safe calls on memory prepared above and ends in
    // _exit; the parent only closes descriptors.
    let supervisor = unsafe { libc::fork() };
    if supervisor == -1 {
        return Err(io::Error::last_os_error());
    }
    if supervisor == 0 {
        // SAFETY: see above; this never returns.
        unsafe { supervise(p, &argv, &envp, keep, report_w.as_raw_fd(), exec_r.as_raw_fd(), exec_w.as_raw_fd()) }
    }
    Ok(supervisor)
}

/// Run by the C runtime before `main` in every program that links this module; takes over
/// only in a process started as `quorum-supervisor` by [`spawn_program`].
#[used]
#[link_section = ".init_array"]
static SUPERVISOR_ENTRY: extern "C" fn(libc::c_int, *const *const libc::c_char, *const *const libc::c_char) =
    supervisor_entry;

extern "C" fn supervisor_entry(argc: libc::c_int, argv: *const *const libc::c_char, _env: *const *const libc::c_char) {
    // SAFETY: the C runtime passes the program's argc and argv, which live for the whole run.
    let named = unsafe {
        (argc == 2 || argc == 3)
            && !argv.is_null()
            && !(*argv).is_null()
            && std::ffi::CStr::from_ptr(*argv) == SUPERVISOR_ARG0
    };
    if !named {
        return;
    }
    // Started as `quorum-supervisor`, told which build the work is for: work of another build
    // is refused before it is read (the agent then starts its own program instead).
    // SAFETY: argc counts the pointers in argv.
    if argc == 3 && unsafe { std::ffi::CStr::from_ptr(*argv.add(2)) } != FINGERPRINT {
        // SAFETY: _exit ends the process at once.
        unsafe { libc::_exit(REFUSED) }
    }
    // SAFETY: this process was started by spawn_program with the descriptors it expects;
    // no other thread exists before main.
    unsafe { supervise_handed_over() }
}

/// The supervisor in a process of its own: reads what to do from [`HANDOFF_FD`] and supervises;
/// never returns. A handoff it cannot read is reported as a failed exec with `EINVAL`.
unsafe fn supervise_handed_over() -> ! {
    let mut bytes = Vec::new();
    let read = File::from_raw_fd(HANDOFF_FD).read_to_end(&mut bytes);
    let stdin = File::from_raw_fd(STDIN_FD);
    let prepared = read.ok().and_then(|_| Prepared::decode(&bytes, stdin));
    let (Some(p), Ok((exec_r, exec_w))) = (prepared, pipe()) else {
        let mut report = [0u8; 8];
        report[4..].copy_from_slice(&libc::EINVAL.to_ne_bytes());
        write_all(REPORT_FD, &report);
        libc::_exit(1);
    };
    error_texts();
    let (argv, envp) = (null_terminated(&p.argv), null_terminated(&p.envp));
    let (exec_r, exec_w) = (exec_r.into_raw_fd(), exec_w.into_raw_fd());
    supervise(&p, &argv, &envp, [REPORT_FD, exec_r, exec_w, STDIN_FD], REPORT_FD, exec_r, exec_w)
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
    if value < 0 {
        out[n] = b'-';
        n += 1;
    }
    n += decimal((value as i64).unsigned_abs(), &mut out[n..]);
    out[n] = b'\n';
    n + 1
}

unsafe fn write_status(p: &Prepared, word: &[u8], value: i32) {
    let mut line = [0u8; 48];
    let len = status_line(word, value, &mut line);
    let fd = libc::open(p.status_tmp.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC, 0o600);
    if fd >= 0 {
        write_all(fd, &line[..len]);
        libc::fsync(fd);
        libc::close(fd);
        libc::rename(p.status_tmp.as_ptr(), p.status.as_ptr());
    }
}

/// `USER_US SYSTEM_US MAX_RSS_KB` of the job into the record's `usage` file ([`crate::record::read_usage`]).
/// Async-signal-safe: open, write, close.
unsafe fn write_usage(p: &Prepared, usage: &libc::rusage) {
    let micros = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
    let mut line = [0u8; 72];
    let mut n = 0;
    for value in [micros(usage.ru_utime), micros(usage.ru_stime), usage.ru_maxrss.max(0) as u64] {
        n += decimal(value, &mut line[n..]);
        line[n] = b' ';
        n += 1;
    }
    line[n - 1] = b'\n';
    let fd = libc::open(p.usage.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC, 0o600);
    if fd >= 0 {
        write_all(fd, &line[..n]);
        libc::close(fd);
    }
}

/// Writes `value` in decimal at the start of `out` (at least 20 bytes); returns its length.
fn decimal(mut value: u64, out: &mut [u8]) -> usize {
    let mut digits = [0u8; 20];
    let mut d = 0;
    loop {
        digits[d] = b'0' + (value % 10) as u8;
        d += 1;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    for (i, digit) in digits[..d].iter().rev().enumerate() {
        out[i] = *digit;
    }
    d
}

/// The supervisor process: never returns.
#[allow(clippy::too_many_arguments)]
unsafe fn supervise(
    p: &Prepared,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    mut keep: [RawFd; 4],
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
    // A process of the job whose parent ended (a daemon's double fork, `setsid ... &`) becomes
    // the supervisor's child, not init's: it is reaped here, and what it used counts.
    libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    let job = libc::fork();
    if job == 0 {
        start_job(p, argv, envp, exec_w);
    }
    if job == -1 {
        let errno = *libc::__errno_location();
        let mut report = [0u8; 8];
        report[4..].copy_from_slice(&errno.to_ne_bytes());
        write_all(report_w, &report);
        write_status(p, Step::Exec.word(), errno);
        libc::_exit(0);
    }
    libc::setpgid(job, job);
    libc::close(exec_w);
    // The exec pipe closes on a successful exec; eight bytes (step, errno) mean a step failed.
    let mut failure = [0u8; 8];
    let mut got = 0usize;
    while got < 8 {
        let n = libc::read(exec_r, failure[got..].as_mut_ptr().cast(), 8 - got);
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
    report[4..].copy_from_slice(&failure[4..]);
    write_all(report_w, &report);
    libc::close(report_w);
    let expired = match &p.lease {
        Some((file, deadline)) if got < 8 => watch_lease(job, file, *deadline),
        _ => false,
    };
    if expired {
        kill_everything(p, job);
    }
    let mut status = 0;
    while libc::waitpid(job, &mut status, 0) == -1 && *libc::__errno_location() == libc::EINTR {}
    // Nothing of a finished job outlives it: its process group, and with a cgroup, everything
    // in it (a daemon that left the group too); without one, what was left to the supervisor.
    kill_everything(p, job);
    reap_orphans();
    // What the job used (its main process, every descendant it waited for, and every one that
    // was left to the supervisor), before the status: the status's rename is what tells the
    // agent the job ended.
    if got < 8 {
        // SAFETY: rusage is plain data that getrusage fills in.
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        write_usage(p, &usage);
    }
    if expired {
        write_status(p, b"lease-expired", libc::SIGKILL);
    } else if got == 8 {
        let step = Step::from_code(i32::from_ne_bytes(failure[..4].try_into().expect("4 bytes")));
        write_status(p, step.word(), i32::from_ne_bytes(failure[4..].try_into().expect("4 bytes")));
    } else if libc::WIFSIGNALED(status) {
        write_status(p, b"signaled", libc::WTERMSIG(status));
    } else {
        write_status(p, b"exited", libc::WEXITSTATUS(status));
    }
    libc::_exit(0);
}

/// Kills the job's process group and, with a cgroup, everything in it.
unsafe fn kill_everything(p: &Prepared, job: libc::pid_t) {
    libc::kill(-job, libc::SIGKILL);
    if let Some(kill) = &p.cgroup_kill {
        let fd = libc::open(kill.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            write_all(fd, b"1");
            libc::close(fd);
        }
    }
    if let Some(procs) = &p.cgroup_sweep {
        sweep(procs);
    }
}

/// Kills and reaps the processes of the job left to the supervisor (its subreaper) once the
/// job's main process ended, and what they leave in turn, for at most about five seconds (a
/// process stuck in the kernel); returns at once when there are none. Async-signal-safe.
unsafe fn reap_orphans() {
    for _ in 0..500 {
        loop {
            let reaped = libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG);
            if reaped > 0 || (reaped == -1 && *libc::__errno_location() == libc::EINTR) {
                continue;
            }
            if reaped == -1 {
                return; // No child left.
            }
            break;
        }
        kill_children();
        let pause = libc::timespec { tv_sec: 0, tv_nsec: 10_000_000 };
        libc::nanosleep(&pause, std::ptr::null_mut());
    }
}

/// SIGKILL to each of the supervisor's live children (`/proc/self/task/<pid>/children`; a
/// list too long for one read is finished on the next call). Async-signal-safe.
unsafe fn kill_children() {
    let mut path = [0u8; 64];
    let head = b"/proc/self/task/";
    path[..head.len()].copy_from_slice(head);
    let mut n = head.len();
    n += decimal(libc::getpid() as u64, &mut path[n..]);
    let tail = b"/children\0";
    path[n..n + tail.len()].copy_from_slice(tail);
    let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return;
    }
    let mut text = [0u8; 4096];
    let len = libc::read(fd, text.as_mut_ptr().cast(), text.len());
    libc::close(fd);
    let (mut pid, mut digits) = (0i64, 0);
    for &b in &text[..len.max(0) as usize] {
        if b.is_ascii_digit() {
            pid = pid.saturating_mul(10).saturating_add(i64::from(b - b'0'));
            digits += 1;
        } else {
            if digits > 0 && pid > 1 && pid <= i64::from(i32::MAX) {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            (pid, digits) = (0, 0);
        }
    }
    // The list ends with a space; a read cut in the middle of a number leaves it for next time.
}

/// The monotonic clock in milliseconds (the clock [`std::time::Instant`] reads on Linux, shared
/// by every process of the host). Async-signal-safe.
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1000).saturating_add(ts.tv_nsec as u64 / 1_000_000)
}

/// The deadline in a lease file: milliseconds of the monotonic clock, or `never`. Async-signal-safe.
unsafe fn read_deadline(file: &CString) -> Option<u64> {
    let fd = libc::open(file.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 32];
    let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
    libc::close(fd);
    if n <= 0 {
        return None;
    }
    parse_deadline(&buf[..n as usize])
}

/// `<ms>\n` or `never\n`.
fn parse_deadline(text: &[u8]) -> Option<u64> {
    let text = text.strip_suffix(b"\n").unwrap_or(text);
    if text == b"never" {
        return Some(u64::MAX);
    }
    if text.is_empty() || text.len() > 20 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: u64 = 0;
    for &b in text {
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

/// Waits for the job to end while its lease holds; returns true when the lease ran out first
/// (the job still runs then). The agent renews the lease by rewriting `file`; a paused, hung or
/// dead agent does not, and the job is killed before the leader may start it elsewhere. An
/// unreadable file keeps the last deadline read. Async-signal-safe: waitpid, open, read, poll.
unsafe fn watch_lease(job: libc::pid_t, file: &CString, mut deadline: u64) -> bool {
    let pidfd = libc::syscall(libc::SYS_pidfd_open, job, 0) as i32;
    let ended = loop {
        // WNOWAIT: the status stays for the blocking wait that follows.
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let r = libc::waitid(libc::P_PID, job as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT);
        if r == -1 && *libc::__errno_location() != libc::EINTR {
            break true;
        }
        if r == 0 && info.si_pid() == job {
            break true;
        }
        if let Some(d) = read_deadline(file) {
            deadline = deadline.max(d);
        }
        let now = monotonic_ms();
        if now >= deadline {
            break false;
        }
        // The deadline only moves later: sleep until it (at most a second), or the job's end.
        let wait = (deadline - now).min(1000) as i32;
        if pidfd >= 0 {
            let mut fds = libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 };
            libc::poll(&mut fds, 1, wait);
        } else {
            libc::usleep((wait.min(50) as u32) * 1000);
        }
    };
    if pidfd >= 0 {
        libc::close(pidfd);
    }
    !ended
}

/// Kills every process listed in a cgroup v1 `cgroup.procs` (what escaped the job's process
/// group), a few rounds in case one forked meanwhile. Async-signal-safe: open, read, kill.
unsafe fn sweep(procs: &CString) {
    for _ in 0..5 {
        let fd = libc::open(procs.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return;
        }
        let mut buf = [0u8; 4096];
        let mut killed = false;
        let mut pid: i32 = 0;
        let mut digits = false;
        loop {
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                break;
            }
            for &b in &buf[..n as usize] {
                if b.is_ascii_digit() {
                    pid = pid.saturating_mul(10).saturating_add(i32::from(b - b'0'));
                    digits = true;
                } else if digits {
                    libc::kill(pid, libc::SIGKILL);
                    killed = true;
                    (pid, digits) = (0, false);
                }
            }
        }
        if digits {
            libc::kill(pid, libc::SIGKILL);
            killed = true;
        }
        libc::close(fd);
        if !killed {
            return;
        }
        libc::usleep(20_000);
    }
}

/// Reports a failed step to the supervisor and ends the job's process.
unsafe fn fail(exec_w: RawFd, step: Step, errno: i32) -> ! {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&(step as i32).to_ne_bytes());
    bytes[4..].copy_from_slice(&errno.to_ne_bytes());
    write_all(exec_w, &bytes);
    libc::_exit(127);
}

fn errno() -> i32 {
    // SAFETY: reads this thread's errno.
    unsafe { *libc::__errno_location() }
}

unsafe fn write_error(message: &[u8], errno: i32) {
    write_all(2, message);
    let texts = error_texts();
    match texts.get(errno as usize) {
        Some(text) => write_all(2, text),
        None => write_all(2, b"unknown error\n"),
    }
}

/// How long a job waits for the directory of its output file to appear, in tries
/// [`OUTPUT_DIR_TRY_US`] apart. Workflow clients make that directory right after `sbatch`
/// answers (submitit names it after the job's id, so it cannot exist before): on Slurm, whose
/// launch takes a good part of a second, the directory is there when the job starts; a job
/// dispatched at once would otherwise fail before the client's `mkdir`.
const OUTPUT_DIR_TRIES: u32 = 60;
const OUTPUT_DIR_TRY_US: u32 = 50_000;

/// Opens an output file as the job's user and puts it on `fd`; while a directory of its path
/// does not exist, tries again for [`OUTPUT_DIR_TRIES`] × [`OUTPUT_DIR_TRY_US`] (3 s). The open
/// never blocks: a FIFO that nobody reads fails (ENXIO) instead of holding the launch, and the
/// descriptor is made blocking again for the job.
unsafe fn open_onto(path: &CString, truncate: bool, fd: RawFd) -> bool {
    let mode = if truncate { libc::O_TRUNC } else { libc::O_APPEND };
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY | mode;
    let open = || libc::open(path.as_ptr(), flags, 0o666);
    let mut opened = open();
    let mut tries = 0;
    while opened < 0 && errno() == libc::ENOENT && tries < OUTPUT_DIR_TRIES {
        libc::usleep(OUTPUT_DIR_TRY_US);
        tries += 1;
        opened = open();
    }
    if opened < 0 {
        return false;
    }
    let status = libc::fcntl(opened, libc::F_GETFL);
    if status < 0 || libc::fcntl(opened, libc::F_SETFL, status & !libc::O_NONBLOCK) < 0 {
        libc::close(opened);
        return false;
    }
    let ok = libc::dup2(opened, fd) == fd;
    libc::close(opened);
    ok
}

/// The job's process, between fork and exec: its group, its cgroup or rlimits, its user, its
/// output files, its directory, its program. Never returns.
unsafe fn start_job(p: &Prepared, argv: &[*const libc::c_char], envp: &[*const libc::c_char], exec_w: RawFd) -> ! {
    libc::setpgid(0, 0);
    for procs in &p.cgroup_procs {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
            fail(exec_w, Step::Limits, errno());
        }
        libc::close(fd);
    }
    if let Some(bytes) = p.rlimit_data {
        let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
        if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
            fail(exec_w, Step::Limits, errno());
        }
    }
    if let Some(name) = &p.hostname {
        if !set_hostname(name, p.hosts.as_ref()) {
            fail(exec_w, Step::Limits, errno());
        }
    }
    // In a container, the output files are opened on the node's paths first, as the user (their
    // file-system identity only: the process stays root to enter the container), then entered.
    if let Some(enter) = &p.container {
        if let Some(c) = &p.credentials {
            if libc::setgroups(c.groups.len(), c.groups.as_ptr()) != 0 {
                fail(exec_w, Step::Identity, errno());
            }
            libc::setfsgid(c.gid);
            libc::setfsuid(c.uid);
        }
        libc::umask(p.umask as libc::mode_t);
        open_outputs(p, exec_w);
        libc::setfsuid(0);
        libc::setfsgid(0);
        if !enter.root() {
            fail(exec_w, Step::Limits, errno());
        }
    }
    if let Some(c) = &p.credentials {
        if libc::setgroups(c.groups.len(), c.groups.as_ptr()) != 0
            || libc::setgid(c.gid) != 0
            || libc::setuid(c.uid) != 0
        {
            fail(exec_w, Step::Identity, errno());
        }
    }
    libc::umask(p.umask as libc::mode_t);
    match &p.container {
        Some(enter) => {
            if !enter.user() {
                fail(exec_w, Step::Identity, errno());
            }
        }
        None => open_outputs(p, exec_w),
    }
    if libc::chdir(p.cwd.as_ptr()) == -1 {
        let e = errno();
        write_error(&p.chdir_message, e);
        fail(exec_w, Step::Chdir, e);
    }
    // As execvp: on to the next directory while the program is not there; EACCES is kept.
    let mut failed = libc::ENOENT;
    let mut denied = false;
    for candidate in &p.candidates {
        libc::execve(candidate.as_ptr(), argv.as_ptr(), envp.as_ptr());
        failed = errno();
        match failed {
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR => {}
            _ => break,
        }
    }
    if denied && (failed == libc::ENOENT || failed == libc::ENOTDIR) {
        failed = libc::EACCES;
    }
    if failed == libc::ENOENT && p.searched {
        write_all(2, &p.not_found_message);
    } else {
        write_error(&p.exec_message, failed);
    }
    fail(exec_w, Step::Exec, failed);
}

/// The job's stdin, stdout and stderr. Async-signal-safe.
unsafe fn open_outputs(p: &Prepared, exec_w: RawFd) {
    libc::dup2(p.stdin.as_raw_fd(), 0);
    if !open_onto(&p.stdout, p.truncate, 1) {
        fail(exec_w, Step::Output, errno());
    }
    match &p.stderr {
        Some(path) => {
            if !open_onto(path, p.truncate, 2) {
                fail(exec_w, Step::Output, errno());
            }
        }
        None => {
            libc::dup2(1, 2);
        }
    }
}

/// Enters a UTS namespace of its own named `name`, and with `hosts` a mount namespace of its
/// own whose `/etc/hosts` is that file (bound over it; nothing it mounts reaches the node's
/// namespace). Async-signal-safe: unshare, sethostname, mount.
///
/// # Safety
/// Between fork and exec only; `name` and `hosts` were made before the fork.
pub unsafe fn set_hostname(name: &CString, hosts: Option<&CString>) -> bool {
    if libc::unshare(libc::CLONE_NEWUTS) != 0 || libc::sethostname(name.as_ptr(), name.as_bytes().len()) != 0 {
        return false;
    }
    let Some(hosts) = hosts else { return true };
    let root = c"/";
    let target = c"/etc/hosts";
    libc::unshare(libc::CLONE_NEWNS) == 0
        && libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ) == 0
        && libc::mount(hosts.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) == 0
}

/// Sends a signal to a whole process group; a group that is already gone is fine.
pub fn signal_group(pgid: i32, signal: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) with a negative pid signals a process group; it touches no memory.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{create_record, record_dir, scan, write_pids};
    use quorum_proto::agent::Launch;

    #[test]
    fn the_supervisor_program_beside_is_used_only_when_no_one_else_could_replace_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let set = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        set(dir.path(), 0o755);
        let exe = dir.path().join("quorum-agent");
        assert_eq!(beside(&exe), None, "none there");
        let helper = dir.path().join("quorum-supervisor");
        std::fs::write(&helper, "").unwrap();
        set(&helper, 0o644);
        assert_eq!(beside(&exe), None, "not executable");
        set(&helper, 0o755);
        assert_eq!(beside(&exe), Some(helper.clone()));
        set(&helper, 0o775);
        assert_eq!(beside(&exe), None, "its group may replace it");
        set(&helper, 0o755);
        set(dir.path(), 0o1777);
        assert_eq!(beside(&exe), None, "anyone may put another in its place");
        set(dir.path(), 0o755);
        assert_eq!(beside(&exe), Some(helper));
    }

    #[test]
    fn status_lines_round_trip() {
        let mut buf = [0u8; 48];
        for (word, value, want) in [
            (&b"exited"[..], 0, Status::Exited(0)),
            (b"exited", 255, Status::Exited(255)),
            (b"signaled", 9, Status::Signaled(9)),
            (b"launch-failed", -2, Status::LaunchFailed(Step::Exec, -2)),
            (b"identity-failed", 1, Status::LaunchFailed(Step::Identity, 1)),
            (b"chdir-failed", 2, Status::LaunchFailed(Step::Chdir, 2)),
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
        let out = Output { stdout: dir.path().join("out"), stderr: None, truncate: true };
        let env = vec![("PATH".to_string(), std::env::var("PATH").unwrap())];
        let argv: Vec<String> = ["bash", "-c", "echo hi; sleep 0.3; exit 3"].iter().map(|s| s.to_string()).collect();
        let p = Prepared::new(&argv, &env, dir.path(), &out, &record).unwrap();
        let pids = spawn(&p).unwrap();
        write_pids(&record, pids).unwrap();
        assert!(pids.pgid > 0 && pids.supervisor > 0 && pids.pgid != pids.supervisor);
        // The supervisor is this program started again under its own name, not a fork of it.
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", pids.supervisor)).unwrap();
        let words: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        assert_eq!(words[0], SUPERVISOR_ARG0.to_bytes());
        assert_eq!(words[1], record.as_os_str().as_bytes());
        assert_eq!(
            std::fs::read_link(format!("/proc/{}/exe", pids.supervisor)).unwrap(),
            std::fs::read_link("/proc/self/exe").unwrap()
        );
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

        let out2 = Output { stdout: dir.path().join("out2"), stderr: None, truncate: true };
        let record2 = record_dir(dir.path(), 6, 1);
        std::fs::create_dir_all(&record2).unwrap();
        let missing = Prepared::new(&argv, &env, &dir.path().join("no-such-dir"), &out2, &record2).unwrap();
        let pids = spawn(&missing).unwrap();
        assert_eq!(wait(pids, &record2).await, Status::LaunchFailed(Step::Chdir, libc::ENOENT));
        let text = std::fs::read_to_string(dir.path().join("out2")).unwrap();
        assert!(
            text.contains("cannot change to the working directory") && text.contains("No such file or directory"),
            "{text}"
        );

        // A program not on PATH, and an output file in a directory that does not exist.
        let record3 = record_dir(dir.path(), 7, 1);
        std::fs::create_dir_all(&record3).unwrap();
        let nowhere = vec!["no-such-program-anywhere".to_string()];
        let p = Prepared::new(&nowhere, &env, dir.path(), &out2, &record3).unwrap();
        assert_eq!(wait(spawn(&p).unwrap(), &record3).await, Status::LaunchFailed(Step::Exec, libc::ENOENT));
        let text = std::fs::read_to_string(dir.path().join("out2")).unwrap();
        assert!(text.contains("'no-such-program-anywhere' is not found on the job's PATH"), "{text}");
        let record4 = record_dir(dir.path(), 8, 1);
        std::fs::create_dir_all(&record4).unwrap();
        let bad_out = Output { stdout: dir.path().join("no/such/out"), stderr: None, truncate: true };
        let p = Prepared::new(&argv, &env, dir.path(), &bad_out, &record4).unwrap();
        let began = std::time::Instant::now();
        assert_eq!(wait(spawn(&p).unwrap(), &record4).await, Status::LaunchFailed(Step::Output, libc::ENOENT));
        assert!(began.elapsed() >= Duration::from_secs(3), "it gave up on the directory at once");
    }

    /// A client that makes the output file's directory just after the job was dispatched (as
    /// submitit does, after `sbatch` answers) still gets the job run, its output there.
    #[tokio::test]
    async fn an_output_directory_made_just_after_the_launch_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let record = record_dir(dir.path(), 9, 1);
        std::fs::create_dir_all(&record).unwrap();
        let argv = vec!["sh".to_string(), "-c".to_string(), "echo there".to_string()];
        let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
        let late = dir.path().join("made-late");
        let out = Output { stdout: late.join("out"), stderr: Some(late.join("err")), truncate: false };
        let p = Prepared::new(&argv, &env, dir.path(), &out, &record).unwrap();
        // `spawn` answers once the program is started or has failed to: make the directory
        // meanwhile.
        let maker = std::thread::spawn({
            let late = late.clone();
            move || {
                std::thread::sleep(Duration::from_millis(300));
                std::fs::create_dir(&late).unwrap();
            }
        });
        let pids = spawn(&p).unwrap();
        maker.join().unwrap();
        assert_eq!(wait(pids, &record).await, Status::Exited(0));
        assert_eq!(std::fs::read_to_string(late.join("out")).unwrap(), "there\n");
    }

    #[test]
    fn what_the_supervisor_is_handed_arrives_whole() {
        let dir = tempfile::tempdir().unwrap();
        let out = Output { stdout: dir.path().join("out"), stderr: Some(dir.path().join("err")), truncate: false };
        let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string()), ("A".to_string(), "b c".to_string())];
        let argv: Vec<String> = ["python3", "-c", "print('é')", ""].iter().map(|s| s.to_string()).collect();
        let mut p = Prepared::new(&argv, &env, dir.path(), &out, &dir.path().join("rec"))
            .unwrap()
            .run_as(Credentials { uid: 1001, gid: 1002, groups: vec![1002, 27, 4_000_000_000] })
            .rlimit_data(1 << 40)
            .lease(&dir.path().join("lease"), u64::MAX - 1)
            .unwrap()
            .hostname("node07")
            .unwrap()
            .hosts(&dir.path().join("hosts"))
            .unwrap();
        p.cgroup_procs = vec![CString::new("/sys/fs/cgroup/a/cgroup.procs").unwrap()];
        p.cgroup_kill = Some(CString::new("/sys/fs/cgroup/a/cgroup.kill").unwrap());
        let bytes = p.encode();
        let back = Prepared::decode(&bytes, File::open("/dev/null").unwrap()).unwrap();
        assert_eq!(back.encode(), bytes);
        assert_eq!(back.argv, p.argv);
        assert_eq!(back.envp, p.envp);
        assert_eq!(back.candidates.len(), 2);
        assert_eq!(back.credentials.as_ref().map(|c| c.groups.clone()), Some(vec![1002, 27, 4_000_000_000]));
        assert_eq!((back.rlimit_data, back.truncate, back.searched), (Some(1 << 40), false, true));
        assert_eq!(back.lease.as_ref().map(|l| l.1), Some(u64::MAX - 1));
        assert_eq!((&back.hostname, &back.hosts), (&p.hostname, &p.hosts));
        assert_eq!(back.cgroup_sweep, None);
        // Cut anywhere, or with anything after it, it is refused rather than half read.
        for n in 0..bytes.len() {
            assert!(Prepared::decode(&bytes[..n], File::open("/dev/null").unwrap()).is_none(), "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Prepared::decode(&longer, File::open("/dev/null").unwrap()).is_none());
        // A list claiming more items than bytes.
        assert!(Prepared::decode(&[0xff, 0xff, 0xff, 0xff], File::open("/dev/null").unwrap()).is_none());
    }

    #[test]
    fn lease_deadlines_parse() {
        assert_eq!(parse_deadline(b"12345\n"), Some(12345));
        assert_eq!(parse_deadline(b"never\n"), Some(u64::MAX));
        for bad in [&b""[..], b"\n", b"12a", b"-1", b"99999999999999999999999"] {
            assert_eq!(parse_deadline(bad), None, "{bad:?}");
        }
    }

    /// The dead-man switch: a job whose lease the agent stops renewing is killed by its
    /// supervisor when the deadline passes; one whose lease is renewed runs to its end.
    #[tokio::test]
    async fn a_supervisor_kills_its_job_when_the_lease_is_not_renewed() {
        let dir = tempfile::tempdir().unwrap();
        let lease = crate::record::lease_file(dir.path());
        let env = vec![("PATH".to_string(), std::env::var("PATH").unwrap())];
        let run = |id: u64, seconds: &str, deadline: u64| {
            let record = record_dir(dir.path(), id, 1);
            std::fs::create_dir_all(&record).unwrap();
            let out = Output { stdout: dir.path().join(format!("out{id}")), stderr: None, truncate: true };
            let argv = vec!["sleep".to_string(), seconds.to_string()];
            let p = Prepared::new(&argv, &env, dir.path(), &out, &record).unwrap().lease(&lease, deadline).unwrap();
            (spawn(&p).unwrap(), record)
        };

        // Never renewed: killed at the deadline it started with.
        let start = std::time::Instant::now();
        let (pids, record) = run(1, "30", monotonic_ms() + 300);
        assert_eq!(wait(pids, &record).await, Status::LeaseExpired(libc::SIGKILL));
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(290) && took < Duration::from_secs(5), "{took:?}");

        // Renewed through the file past its first deadline: it ends as it ends.
        crate::record::write_lease(dir.path(), Some(monotonic_ms() + 300)).unwrap();
        let (pids, record) = run(2, "1.2", monotonic_ms() + 300);
        let renew = {
            let spool = dir.path().to_path_buf();
            tokio::spawn(async move {
                loop {
                    crate::record::write_lease(&spool, Some(monotonic_ms() + 300)).unwrap();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        assert_eq!(wait(pids, &record).await, Status::Exited(0));
        renew.abort();

        // The renewals stop (the agent is paused): the file's last deadline ends it.
        let (pids, record) = run(3, "30", monotonic_ms() + 100);
        crate::record::write_lease(dir.path(), Some(monotonic_ms() + 600)).unwrap();
        let start = std::time::Instant::now();
        assert_eq!(wait(pids, &record).await, Status::LeaseExpired(libc::SIGKILL));
        assert!(
            start.elapsed() >= Duration::from_millis(500),
            "the renewed deadline was not kept: {:?}",
            start.elapsed()
        );
    }

    /// As root, the job becomes the user it is given, with that user's groups, and creates its
    /// output file as that user.
    #[tokio::test]
    async fn a_job_runs_as_the_user_it_is_given() {
        if !crate::identity::is_root() {
            eprintln!("skipped: switching users needs root");
            return;
        }
        let nobody = crate::identity::lookup("nobody").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let record = record_dir(dir.path(), 9, 1);
        std::fs::create_dir_all(&record).unwrap();
        let out = Output { stdout: dir.path().join("who"), stderr: None, truncate: true };
        let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
        let argv: Vec<String> = ["sh", "-c", "id -u; id -g; id -G"].iter().map(|s| s.to_string()).collect();
        let creds = Credentials { uid: nobody.uid, gid: nobody.gid, groups: nobody.groups.clone() };
        let p = Prepared::new(&argv, &env, dir.path(), &out, &record).unwrap().run_as(creds);
        assert_eq!(wait(spawn(&p).unwrap(), &record).await, Status::Exited(0));
        let text = std::fs::read_to_string(dir.path().join("who")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[..2], [nobody.uid.to_string(), nobody.gid.to_string()], "{text}");
        assert!(!lines[2].split(' ').any(|g| g == "0"), "root's group kept: {text}");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(dir.path().join("who")).unwrap().uid(), nobody.uid);
    }
}
