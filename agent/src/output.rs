//! A job's output files: the patterns (`%j`, `%x`, `%N`, ...) expanded as Slurm does, where
//! they are, and reading them for `quorum logs`.

use std::path::{Path, PathBuf};

use quorum_proto::agent::{Launch, OutputChunk, ReadOutput};
use quorum_proto::api::JobSpec;

use crate::{identity, Agent};

/// What `%a` stands for in a job that is no task of an array (Slurm's NO_VAL).
const NO_ARRAY_TASK: &str = "4294967294";

/// Expands `%j` (job id), `%x` (name), `%u` (user), `%N` (node), `%A`/`%a` (the array's id and
/// the task id, for a task of a job array; for any other job, as Slurm does, its id and
/// 4294967294) and `%%`.
pub fn expand_pattern(pattern: &str, launch: &Launch, node: &str) -> String {
    let name = launch.spec.as_ref().map(|s| s.name.as_str()).unwrap_or("");
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('j') => out.push_str(&launch.job_id.to_string()),
            Some('A') => out.push_str(&launch.array.as_ref().map_or(launch.job_id, |a| a.array_job_id).to_string()),
            Some('a') => match &launch.array {
                Some(a) => out.push_str(&a.task_id.to_string()),
                None => out.push_str(NO_ARRAY_TASK),
            },
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

/// Reads part of a job's output file for `quorum logs` (blocking). An agent that runs jobs as
/// their users reads only a file that the job's user owns: the path is the user's to choose,
/// and the agent must not read for them what they could not.
pub fn read_output(agent: &Agent, r: &ReadOutput) -> OutputChunk {
    use std::io::{Read, Seek, SeekFrom};
    let mut chunk = OutputChunk { request_id: r.request_id, ..Default::default() };
    let Some((launch, spec)) = r.launch.as_ref().and_then(|l| l.spec.as_ref().map(|s| (l, s))) else {
        chunk.error = "the request names no job".into();
        return chunk;
    };
    if let Err(e) = crate::grants::verify_launch(agent, launch) {
        chunk.error = format!("read refused: {e}");
        return chunk;
    }
    let (stdout, stderr) = output_paths(launch, spec, &agent.config.name);
    let path = if r.stderr { stderr.unwrap_or(stdout) } else { stdout };
    chunk.path = path.display().to_string();
    let read = || -> Result<Vec<u8>, String> {
        let mut file = std::fs::File::open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        if let Ok(Some(account)) = identity::job_account(agent.config.switch_user, &launch.user) {
            use std::os::unix::fs::MetadataExt;
            let owner = file.metadata().map_err(|e| e.to_string())?.uid();
            if owner != account.uid {
                return Err(format!(
                    "{} belongs to uid {owner}, not to the job's user {} (uid {})",
                    path.display(),
                    account.name,
                    account.uid
                ));
            }
        }
        file.seek(SeekFrom::Start(r.offset)).map_err(|e| e.to_string())?;
        let mut data = Vec::new();
        file.take(u64::from(r.max_bytes)).read_to_end(&mut data).map_err(|e| e.to_string())?;
        Ok(data)
    };
    match read() {
        Ok(data) => chunk.data = data,
        Err(e) => chunk.error = e,
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
        let task = array_task();
        assert_eq!(expand_pattern("%x-%A_%a.out", &task, "n"), "train-40_7.out");
    }
}
