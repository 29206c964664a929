//! The site's submit filter, like Slurm's `job_submit` plugins: a program that sees every
//! submit (and every `quorum cron add`) before it is proposed, and may refuse it or amend a few
//! of its fields.
//!
//! It runs with `sh -c COMMAND` as the controller's user, with `QUORUM_SUBMIT_USER` and a
//! minimal `PATH` in its environment and, on its standard input, one JSON object:
//! `{"user": "...", "job": {...}}`, the job as the cluster records it (`name`, `partition`,
//! `nodes`, `ntasks`, `time_limit_s`, `qos`, `account`, `program`, `env`, ...). It answers by its
//! exit status and standard output:
//! - exit 0 with nothing on stdout: the job goes on as it is;
//! - exit 0 with a JSON object: the fields it names are changed, from `name`, `partition`,
//!   `account`, `qos`, `time_limit_s`, `comment`, `nice`, `constraint` and `reservation` (any
//!   other field refuses the submit: the filter asked for what it may not do); the job is then
//!   checked again as any submit is;
//! - any other exit: the submit is refused with what it wrote to stderr (its first 300
//!   characters) as the reason.
//!
//! A filter that does not answer within its timeout refuses the submit: a site that filters
//! submits wants none to slip past it.

use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Status;

pub use crate::config::SubmitFilterConfig;
use crate::model::JobSpec;

/// The most of the filter's stdout read: an amendment is a few fields.
const MAX_ANSWER: u64 = 64 * 1024;

/// What a filter may change.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Amendment {
    name: Option<String>,
    partition: Option<String>,
    account: Option<String>,
    qos: Option<String>,
    time_limit_s: Option<u64>,
    comment: Option<String>,
    nice: Option<i32>,
    constraint: Option<Vec<String>>,
    reservation: Option<String>,
}

impl Amendment {
    fn apply(self, spec: &mut JobSpec) {
        let Amendment { name, partition, account, qos, time_limit_s, comment, nice, constraint, reservation } = self;
        if let Some(v) = name {
            spec.name = v;
        }
        if let Some(v) = partition {
            spec.partition = Some(v);
        }
        if let Some(v) = account {
            spec.account = Some(v);
        }
        if let Some(v) = qos {
            spec.qos = Some(v);
        }
        if let Some(v) = time_limit_s {
            spec.time_limit_s = Some(v);
        }
        if let Some(v) = comment {
            spec.notes.comment = v;
        }
        if let Some(v) = nice {
            spec.nice = v;
        }
        if let Some(v) = constraint {
            spec.constraint = v;
        }
        if let Some(v) = reservation {
            spec.reservation = Some(v);
        }
    }
}

fn refused(why: impl std::fmt::Display) -> Status {
    Status::permission_denied(format!("submit refused by the site's submit filter: {why}"))
}

/// Runs the filter on `spec`, submitted by `user`: the spec to go on with, or the refusal.
pub async fn filter(config: &SubmitFilterConfig, user: &str, mut spec: JobSpec) -> Result<JobSpec, Status> {
    let input = serde_json::to_vec(&serde_json::json!({ "user": user, "job": &spec }))
        .map_err(|e| Status::internal(format!("the job for the submit filter: {e}")))?;
    let timeout = Duration::from_millis(config.timeout_ms.max(1));
    let run = async {
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&config.command)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("QUORUM_SUBMIT_USER", user)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut stdin = child.stdin.take().expect("piped");
        let (stdout, stderr) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
        // A filter may answer without reading all of its input: a closed pipe is no error.
        let write = async move {
            let _ = stdin.write_all(&input).await;
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (mut stdout, mut stderr) = (stdout.take(MAX_ANSWER), stderr.take(MAX_ANSWER));
        let read_out = stdout.read_to_end(&mut out);
        let read_err = stderr.read_to_end(&mut err);
        let (_, read_out, read_err) = tokio::join!(write, read_out, read_err);
        read_out?;
        read_err?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, out, err))
    };
    let (status, out, err) = match tokio::time::timeout(timeout, run).await {
        Err(_) => return Err(refused(format!("it did not answer within {} ms", timeout.as_millis()))),
        Ok(Err(e)) => return Err(refused(format!("cannot run '{}': {e}", config.command))),
        Ok(Ok(answer)) => answer,
    };
    if !status.success() {
        let said = String::from_utf8_lossy(&err);
        let said: String = said.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(300).collect();
        let how = status.code().map_or_else(|| "a signal".to_string(), |c| format!("exit {c}"));
        return Err(refused(if said.is_empty() { how } else { said }));
    }
    let answer = String::from_utf8_lossy(&out);
    if answer.trim().is_empty() {
        return Ok(spec);
    }
    let amendment: Amendment = serde_json::from_str(answer.trim())
        .map_err(|e| refused(format!("it answered what it may not (only name, partition, account, qos, time_limit_s, comment, nice, constraint and reservation may change): {e}")))?;
    amendment.apply(&mut spec);
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(command: &str) -> SubmitFilterConfig {
        SubmitFilterConfig { command: command.into(), timeout_ms: 2_000 }
    }

    fn job() -> JobSpec {
        JobSpec {
            name: "train".into(),
            nodes: 1,
            ntasks: 1,
            cpus_per_task: 1,
            program: crate::model::Program::Script("#!/bin/sh\ntrue\n".into()),
            ..Default::default()
        }
    }

    /// The site's rules as a real shell program: every job needs a time limit, GPU jobs go to
    /// the gpu partition, and each job is marked as filtered.
    const SITE: &str = r#"input=$(cat)
case "$input" in *'"time_limit_s":null'*) echo "every job needs a --time limit;" >&2; echo " ask with -t" >&2; exit 1;; esac
case "$input" in *'"gpus_per_node":0'*) part='';; *) part=',"partition":"gpu"';; esac
test "$QUORUM_SUBMIT_USER" = alice || { echo "who is $QUORUM_SUBMIT_USER?" >&2; exit 2; }
echo "{\"comment\":\"filtered for $QUORUM_SUBMIT_USER\"$part}""#;

    #[tokio::test]
    async fn the_filter_refuses_or_amends_with_its_own_words() {
        let site = config(SITE);
        let e = filter(&site, "alice", job()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            e.message(),
            "submit refused by the site's submit filter: every job needs a --time limit; ask with -t"
        );
        let timed = JobSpec { time_limit_s: Some(600), ..job() };
        let out = filter(&site, "alice", timed.clone()).await.unwrap();
        assert_eq!((out.notes.comment.as_str(), out.partition.as_deref()), ("filtered for alice", None));
        let gpu = JobSpec { gpus_per_node: 2, ..timed.clone() };
        assert_eq!(filter(&site, "alice", gpu).await.unwrap().partition.as_deref(), Some("gpu"));
        let e = filter(&site, "mallory", timed.clone()).await.unwrap_err();
        assert!(e.message().ends_with("who is mallory?"), "{}", e.message());

        // Silence is consent; a change it may not make, or no answer in time, refuses.
        assert_eq!(filter(&config("cat > /dev/null"), "alice", timed.clone()).await.unwrap(), timed);
        assert_eq!(filter(&config("true"), "alice", timed.clone()).await.unwrap(), timed, "input unread");
        let e = filter(&config(r#"echo '{"env":{}}'"#), "alice", timed.clone()).await.unwrap_err();
        assert!(e.message().contains("answered what it may not") && e.message().contains("env"), "{}", e.message());
        let slow = SubmitFilterConfig { command: "sleep 5".into(), timeout_ms: 200 };
        let e = filter(&slow, "alice", timed.clone()).await.unwrap_err();
        assert!(e.message().ends_with("it did not answer within 200 ms"), "{}", e.message());
        let e = filter(&config("exit 7"), "alice", timed).await.unwrap_err();
        assert!(e.message().ends_with(": exit 7"), "{}", e.message());
    }
}
