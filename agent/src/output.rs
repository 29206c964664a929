//! A job's output files: the patterns (`%j`, `%x`, `%N`, ...) expanded as Slurm does, where
//! they are, and reading them for `quorum logs`.

use std::path::{Path, PathBuf};

use quorum_proto::agent::{Launch, OutputChunk, ReadOutput};
use quorum_proto::api::JobSpec;

use crate::{identity, Agent};

/// What `%a` stands for in a job that is no task of an array (Slurm's NO_VAL).
const NO_ARRAY_TASK: &str = "4294967294";

/// The widest zero padding a pattern may ask for (`%5j`).
const MAX_PAD: usize = 10;

/// Expands `%j` (job id), `%x` (name), `%u` (user), `%N` (node), `%A`/`%a` (the array's id and
/// the task id, for a task of a job array; for any other job, as Slurm does, its id and
/// 4294967294), what the batch step is among steps as Slurm names it (`%J` the job id, `%s`
/// "batch", `%n` and `%t` 0) and `%%`; a width between `%` and a number's letter pads it with
/// zeros (`%5j`: 00042).
pub fn expand_pattern(pattern: &str, launch: &Launch, node: &str) -> String {
    let name = launch.spec.as_ref().map(|s| s.name.as_str()).unwrap_or("");
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut width = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            width.push(*d);
            chars.next();
        }
        let width = width.parse::<usize>().unwrap_or(0).min(MAX_PAD);
        let number = |n: u64| format!("{n:0width$}");
        match chars.next() {
            Some('j') | Some('J') => out.push_str(&number(launch.job_id)),
            Some('A') => out.push_str(&number(launch.array.as_ref().map_or(launch.job_id, |a| a.array_job_id))),
            Some('a') => match &launch.array {
                Some(a) => out.push_str(&number(a.task_id.into())),
                None => out.push_str(NO_ARRAY_TASK),
            },
            Some('s') => out.push_str("batch"),
            Some('n') | Some('t') => out.push_str(&number(0)),
            Some('x') => out.push_str(name),
            Some('u') => out.push_str(&launch.user),
            Some('N') => out.push_str(node),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Where a rank's output goes, and its error output when it has a file of its own.
pub fn output_paths(launch: &Launch, spec: &JobSpec, node: &str) -> (PathBuf, Option<PathBuf>) {
    let work_dir = Path::new(&spec.work_dir);
    let stdout_pattern = if spec.stdout.is_empty() { "quorum-%j.out" } else { spec.stdout.as_str() };
    let stdout = resolve(work_dir, &expand_pattern(stdout_pattern, launch, node));
    let stderr = (!spec.stderr.is_empty()).then(|| resolve(work_dir, &expand_pattern(&spec.stderr, launch, node)));
    (stdout, stderr)
}

/// How many reads of output files may be under way on one node at once. Each runs on a thread of
/// its own (never on the runtime's blocking pool, which launches need); a read past the cap is
/// refused at once, so that opens stuck on a user's path (a hung file system) cannot pile up.
pub const MAX_OUTPUT_READS: usize = 16;

/// How long `quorum logs` waits for a read; a read still stuck then keeps its place under
/// [`MAX_OUTPUT_READS`] until its open returns.
pub const OUTPUT_READ_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads part of a job's output file for `quorum logs`. The path is the user's to choose, so the
/// file is opened as the job's user ([`crate::as_user::read_as`]): the agent reads for them only
/// what they could
/// read themselves, and answers only what they would have seen. The open never blocks (a FIFO is
/// refused), only a regular file is read, and the read is bounded in time and in number
/// ([`MAX_OUTPUT_READS`], [`OUTPUT_READ_DEADLINE`]).
pub async fn read_output(agent: std::sync::Arc<Agent>, r: ReadOutput) -> OutputChunk {
    static READS: std::sync::OnceLock<std::sync::Arc<tokio::sync::Semaphore>> = std::sync::OnceLock::new();
    let reads = READS.get_or_init(|| std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_OUTPUT_READS)));
    let mut chunk = OutputChunk { request_id: r.request_id, ..Default::default() };
    let Some((launch, spec)) = r.launch.as_ref().and_then(|l| l.spec.as_ref().map(|s| (l, s))) else {
        chunk.error = "the request names no job".into();
        return chunk;
    };
    if let Err(e) = crate::grants::verify_launch(&agent, launch) {
        chunk.error = format!("read refused: {e}");
        return chunk;
    }
    let (stdout, stderr) = output_paths(launch, spec, &agent.config.name);
    let path = if r.stderr { stderr.unwrap_or(stdout) } else { stdout };
    chunk.path = path.display().to_string();
    let account = match identity::job_account(agent.config.switch_user, &launch.user) {
        Ok(a) => a,
        Err(e) => {
            chunk.error = e;
            return chunk;
        }
    };
    let Ok(permit) = reads.clone().try_acquire_owned() else {
        chunk.error =
            format!("node {} is busy reading {MAX_OUTPUT_READS} output files; try again shortly", agent.config.name);
        return chunk;
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (offset, max_bytes) = (r.offset, r.max_bytes);
    let thread = std::thread::Builder::new().name("quorum-output-read".into()).spawn(move || {
        let read = crate::as_user::read_as(account.as_ref(), &path, offset, max_bytes);
        drop(permit);
        let _ = tx.send(read);
    });
    if let Err(e) = thread {
        chunk.error = format!("cannot read the output file: {e}");
        return chunk;
    }
    match tokio::time::timeout(OUTPUT_READ_DEADLINE, rx).await {
        Ok(Ok(Ok(data))) => chunk.data = data,
        Ok(Ok(Err(e))) => chunk.error = e,
        Ok(Err(_)) => chunk.error = "the read of the output file ended without an answer".into(),
        Err(_) => {
            chunk.error = format!("reading {} took more than {OUTPUT_READ_DEADLINE:?}", chunk.path);
        }
    }
    chunk
}

fn resolve(work_dir: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        work_dir.join(p)
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use quorum_proto::agent::Launch;
    use quorum_proto::api::JobSpec;

    /// A launch of job 42 (`train`, two tasks of three CPUs) on rank 1 of `gpu[03-04]` with GPUs 2 and 5.
    pub(crate) fn launch() -> Launch {
        Launch {
            job_id: 42,
            token: 7,
            spec: Some(JobSpec {
                name: "train".into(),
                partition: "gpu".into(),
                ntasks: 2,
                cpus_per_task: 3,
                submit_dir: "/home/a".into(),
                ..Default::default()
            }),
            user: "alice".into(),
            nodelist: "gpu[03-04]".into(),
            node_rank: 1,
            num_nodes: 2,
            gpus: vec![2, 5],
            ..Default::default()
        }
    }

    /// Task 7 (job 45) of array 40, whose tasks are 0-7, otherwise as [`launch`].
    pub(crate) fn array_task() -> Launch {
        Launch {
            job_id: 45,
            array: Some(quorum_proto::api::ArrayTask {
                array_job_id: 40,
                task_id: 7,
                count: 8,
                min: 0,
                max: 7,
                throttle: 0,
            }),
            ..launch()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{array_task, launch};
    use super::*;

    #[test]
    fn output_patterns() {
        let l = launch();
        assert_eq!(expand_pattern("%x-%j.%u.%N.out", &l, "gpu04"), "train-42.alice.gpu04.out");
        assert_eq!(expand_pattern("100%%-%q", &l, "n"), "100%-%q");
        assert_eq!(expand_pattern("%A_%a", &l, "n"), "42_4294967294");
        // As Slurm 22.05 names its batch step's files (`-o pat-%J-%s-%n-%t-%5j.out`).
        assert_eq!(expand_pattern("pat-%J-%s-%n-%t-%5j.out", &l, "n"), "pat-42-batch-0-0-00042.out");
        assert_eq!(expand_pattern("%3x-%99j", &l, "n"), "train-0000000042");
        let task = array_task();
        assert_eq!(expand_pattern("%x-%A_%a.out", &task, "n"), "train-40_7.out");
    }

    /// Read as the job's user, a path answers what that user would find out alone: root's
    /// private file and a missing one alike, a FIFO at once, and their own file in full.
    #[test]
    fn a_read_is_made_as_the_jobs_user_and_never_blocks() {
        use std::os::unix::fs::PermissionsExt;
        if !identity::is_root() {
            eprintln!("skipped: reading as another user needs root");
            return;
        }
        let Ok(nobody) = identity::lookup("nobody") else {
            eprintln!("skipped: no user 'nobody' here");
            return;
        };
        // Each read on a thread of its own, as the agent makes them: the switch holds for the
        // rest of its thread.
        let read_as = |who: Option<&identity::Account>, path: &Path, offset: u64, max: u32| {
            let (who, path) = (who.cloned(), path.to_path_buf());
            std::thread::spawn(move || crate::as_user::read_as(who.as_ref(), &path, offset, max)).join().unwrap()
        };
        let private = tempfile::tempdir().unwrap();
        std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(private.path().join("there"), "root's").unwrap();
        let there = read_as(Some(&nobody), &private.path().join("there"), 0, 100).unwrap_err();
        let missing = read_as(Some(&nobody), &private.path().join("missing"), 0, 100).unwrap_err();
        assert!(there.contains("Permission denied"), "{there}");
        assert_eq!(there.replace("there", "X"), missing.replace("missing", "X"), "the answers tell the files apart");
        // Root itself (no switch) reads it: the refusal above is the user's, not a missing file.
        assert_eq!(read_as(None, &private.path().join("there"), 0, 100).unwrap(), b"root's");

        let open = tempfile::tempdir().unwrap();
        std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let fifo = open.path().join("out");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        let started = std::time::Instant::now();
        let e = read_as(Some(&nobody), &fifo, 0, 100).unwrap_err();
        assert!(e.contains("is not a regular file"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "the open blocked");

        let own = open.path().join("own.out");
        std::fs::write(&own, "0123456789").unwrap();
        std::os::unix::fs::chown(&own, Some(nobody.uid), Some(nobody.gid)).unwrap();
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_as(Some(&nobody), &own, 3, 4).unwrap(), b"3456");
    }
}
