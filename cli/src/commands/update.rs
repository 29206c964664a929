//! `quorum update JOB[,JOB...] KEY=VALUE...`: changes jobs after their submit, as `scontrol
//! update JobId=JOB KEY=VALUE...` does (the same keys): a running job its time limit, name and
//! comment; a pending one also its partition, QOS, account, nice, dependencies and node count.
//! Only operators raise a time limit.

use std::collections::HashMap;
use std::process::ExitCode;

use quorum_client::client::JobRef;
use quorum_model::update::JobUpdate;
use quorum_proto::api;

use super::Context;

#[derive(clap::Args)]
pub struct Args {
    /// The jobs, by id, comma-separated (`12`, `12,13`, an array task `12_3`); an array's id
    /// changes each of its tasks not yet ended.
    job: String,
    /// What to change, as scontrol names it: TimeLimit=MINUTES|[D-]H:M:S|+TIME|-TIME,
    /// Partition=, QOS=, Account=, Nice=, Dependency=, JobName=, Comment=, NumNodes=.
    #[arg(required = true)]
    changes: Vec<String>,
}

pub async fn run(ctx: &Context, Args { job, changes }: Args) -> anyhow::Result<ExitCode> {
    let errors = update(ctx, &job, &changes).await?;
    for e in &errors {
        eprintln!("quorum: error: {e}");
    }
    Ok(if errors.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Changes each job of `jobs` (ids, comma-separated) as `words` (`KEY=VALUE`) say; the error of
/// each job it failed for. Words that do not read are refused before anything is sent.
pub async fn update(ctx: &Context, jobs: &str, words: &[String]) -> anyhow::Result<Vec<String>> {
    JobUpdate::from_words(words.iter().map(String::as_str)).map_err(anyhow::Error::msg)?;
    let changes: HashMap<String, String> =
        words.iter().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let mut job_ids = Vec::new();
    for word in jobs.split(',').filter(|w| !w.is_empty()) {
        let job: JobRef = word.parse().map_err(anyhow::Error::msg)?;
        job_ids.push(match job.task {
            None => job.id,
            Some(task) => {
                let req = api::GetJobRequest { job_id: job.id, stale: false, array_task_id: Some(task) };
                let r = ctx.send(req, |mut c, r| async move { c.get_job(r).await }).await?;
                r.job.ok_or_else(|| anyhow::anyhow!("empty answer for job {word}"))?.id
            }
        });
    }
    if job_ids.is_empty() {
        anyhow::bail!("no job named in '{jobs}'");
    }
    let req = api::UpdateJobRequest { job_ids, changes };
    let r = ctx.send(req, |mut c, r| async move { c.update_job(r).await }).await?;
    Ok(r.results.into_iter().filter(|r| !r.ok).map(|r| r.error).collect())
}
