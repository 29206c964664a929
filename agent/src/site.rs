//! The site's own programs on a node: the health check, and Slurm's `Prolog` and `Epilog` run
//! as the agent's user (root on a real node) on every node of a job, before it starts there and
//! after it ends there. A failing prolog sends the job back to the queue and drains the node; a
//! failing epilog drains the node. A run's failure is told in one line: its output, and how it
//! ended.

use std::time::Duration;

use quorum_proto::agent::Launch;

/// How long a health check may run before it counts as failed.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// The prolog and epilog of a node (`sh -c` command lines), and how long either may run.
#[derive(Clone, Debug)]
pub struct JobScripts {
    pub prolog: Option<String>,
    pub epilog: Option<String>,
    /// Past it the program is killed and counts as failed (`PrologEpilogTimeout`).
    pub timeout: Duration,
}

impl Default for JobScripts {
    fn default() -> Self {
        JobScripts { prolog: None, epilog: None, timeout: Duration::from_secs(120) }
    }
}

/// Which of the two runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    Prolog,
    Epilog,
}

impl Context {
    pub fn name(self) -> &'static str {
        match self {
            Context::Prolog => "prolog",
            Context::Epilog => "epilog",
        }
    }
}

/// The variables Slurm gives its prolog and epilog: the job, its user, its nodes and this
/// node's GPUs; the epilog also the job's exit code.
pub fn environment(launch: &Launch, node: &str, context: Context, exit_code: Option<i32>) -> Vec<(String, String)> {
    let spec = launch.spec.as_ref();
    let gpus = launch.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",");
    let mut env = vec![
        ("PATH".to_string(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()),
        ("SLURM_SCRIPT_CONTEXT".into(), format!("{}_slurmd", context.name())),
        ("SLURM_JOB_ID".into(), launch.job_id.to_string()),
        ("SLURM_JOBID".into(), launch.job_id.to_string()),
        ("SLURM_JOB_USER".into(), launch.user.clone()),
        ("SLURM_JOB_NODELIST".into(), launch.nodelist.clone()),
        ("SLURMD_NODENAME".into(), node.to_string()),
        ("SLURM_JOB_PARTITION".into(), spec.map(|s| s.partition.clone()).unwrap_or_default()),
        ("SLURM_JOB_ACCOUNT".into(), spec.map(|s| s.account.clone()).unwrap_or_default()),
        ("SLURM_JOB_GPUS".into(), gpus.clone()),
        ("CUDA_VISIBLE_DEVICES".into(), gpus),
        ("QUORUM_JOB_ID".into(), launch.job_id.to_string()),
    ];
    if let Ok(Some(a)) = crate::identity::job_account(true, &launch.user) {
        env.push(("SLURM_JOB_UID".into(), a.uid.to_string()));
        env.push(("SLURM_JOB_GID".into(), a.gid.to_string()));
    }
    if let Some(code) = exit_code {
        env.push(("SLURM_JOB_EXIT_CODE".into(), code.to_string()));
    }
    env
}

/// Runs `command` with `sh -c` and only `env` (the agent's own environment when `None`), for at
/// most `timeout`: `Ok` when it exits 0, otherwise what it printed (whitespace folded, at most
/// 200 characters) and how it ended.
pub async fn run(command: &str, env: Option<&[(String, String)]>, timeout: Duration) -> Result<(), String> {
    let mut sh = tokio::process::Command::new("sh");
    sh.arg("-c").arg(command).stdin(std::process::Stdio::null()).kill_on_drop(true);
    if let Some(env) = env {
        sh.env_clear().envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    }
    let run = sh.output();
    match tokio::time::timeout(timeout, run).await {
        Err(_) => Err(format!("timed out after {}s", timeout.as_secs())),
        Ok(Err(e)) => Err(format!("cannot run '{command}': {e}")),
        Ok(Ok(out)) if out.status.success() => Ok(()),
        Ok(Ok(out)) => {
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
            let text: String = text.chars().take(200).collect();
            let status = out.status.code().map_or_else(|| "a signal".to_string(), |c| format!("exit {c}"));
            Err(if text.is_empty() { status } else { format!("{text} ({status})") })
        }
    }
}

/// Runs the node's prolog or epilog for `launch`, if it has one: `Some(reason)` to drain the
/// node with when it failed.
pub async fn around_job(
    scripts: &JobScripts,
    launch: &Launch,
    node: &str,
    context: Context,
    exit_code: Option<i32>,
) -> Option<String> {
    let command = match context {
        Context::Prolog => scripts.prolog.as_deref()?,
        Context::Epilog => scripts.epilog.as_deref()?,
    };
    let env = environment(launch, node, context, exit_code);
    match run(command, Some(&env), scripts.timeout).await {
        Ok(()) => None,
        Err(failure) => {
            tracing::warn!(job = launch.job_id, context = context.name(), %failure, "the node's {} failed", context.name());
            Some(format!("{} failed for job {}: {failure}", context.name(), launch.job_id))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failing_program_is_told_in_one_line_with_how_it_ended() {
        let env = vec![("X".to_string(), "seen".to_string())];
        let env = Some(env.as_slice());
        assert_eq!(run("test \"$X\" = seen && test -z \"$HOME\"", env, Duration::from_secs(5)).await, Ok(()));
        let e = run("echo 'no\n  scratch'; echo space >&2; exit 3", env, Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(e, "no scratch space (exit 3)");
        let e = run("sleep 5", env, Duration::from_millis(200)).await.unwrap_err();
        assert_eq!(e, "timed out after 0s");
        let launch = Launch {
            job_id: 7,
            user: "root".into(),
            nodelist: "n[1-2]".into(),
            gpus: vec![0, 2],
            ..Default::default()
        };
        let scripts = JobScripts {
            prolog: Some("test \"$SLURM_JOB_ID $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES $SLURM_SCRIPT_CONTEXT\" = '7 n2 0,2 prolog_slurmd'".into()),
            epilog: Some("echo exit $SLURM_JOB_EXIT_CODE; exit 1".into()),
            timeout: Duration::from_secs(5),
        };
        assert_eq!(around_job(&scripts, &launch, "n2", Context::Prolog, None).await, None);
        assert_eq!(
            around_job(&scripts, &launch, "n2", Context::Epilog, Some(4)).await.as_deref(),
            Some("epilog failed for job 7: exit 4 (exit 1)")
        );
        let none = JobScripts::default();
        assert_eq!(around_job(&none, &launch, "n2", Context::Epilog, Some(4)).await, None);
    }
}
