//! `scancel`: cancels jobs, or only signals them, as Slurm's scancel does. Jobs are named by id
//! (an array's id cancels every task of it), by array task (`12_3`, `12_[1-5,7]`), or chosen by
//! user, name, state and partition; given both, the filters narrow the ids. It prints nothing
//! when every job was cancelled, and an error for each one that was not.

use clap::Parser;
use quorum_client::client::{ControllersArg, JobRef};
use quorum_proto::api;

use crate::commands::{current_user, status_error, Context};

#[derive(Parser, Debug)]
#[command(name = "scancel", no_binary_name = true, infer_long_args = true, about = "Cancel jobs (Quorum's scancel)")]
pub struct ScancelArgs {
    #[command(flatten)]
    controllers: ControllersArg,
    /// Only send this signal (USR1, SIGUSR1, 10) to the jobs' processes; they are not cancelled.
    #[arg(short = 's', long)]
    signal: Option<String>,
    /// Only this user's jobs.
    #[arg(short = 'u', long)]
    user: Option<String>,
    /// Only your own jobs.
    #[arg(long)]
    me: bool,
    /// Only jobs of this name.
    #[arg(short = 'n', long = "name", visible_alias = "jobname")]
    name: Option<String>,
    /// Only jobs in this state: PENDING (PD) or RUNNING (R).
    #[arg(short = 't', long)]
    state: Option<String>,
    /// Only jobs of this partition.
    #[arg(short = 'p', long)]
    partition: Option<String>,
    /// Jobs: 12, 12_3 (a task of array 12), 12_[1-5,7] (several).
    jobs: Vec<String>,
}

/// `12`, `12_3` or `12_[1-5,7]`: the job (or array) ids and the array tasks they name.
fn job_refs(text: &str) -> Result<Vec<JobRef>, String> {
    let bad = || format!("invalid job id '{text}': give 12, 12_3 or 12_[1-5]");
    match text.trim().split_once('_') {
        Some((id, tasks)) if tasks.starts_with('[') && tasks.ends_with(']') => {
            let id: u64 = id.parse().map_err(|_| bad())?;
            let spec = quorum_model::ArraySpec::parse(&tasks[1..tasks.len() - 1]).map_err(|_| bad())?;
            Ok(spec.tasks().into_iter().map(|task| JobRef { id, task: Some(task) }).collect())
        }
        // A job, an array task, or a component of a heterogeneous job (its error names which).
        _ => Ok(vec![text.parse::<JobRef>().map_err(|e| if e.contains("heterogeneous") { e } else { bad() })?]),
    }
}

/// Slurm's state names and their short forms, as scancel takes them.
fn state_name(text: &str) -> Result<&'static str, String> {
    match text.trim().to_ascii_uppercase().as_str() {
        "PENDING" | "PD" => Ok("PENDING"),
        "RUNNING" | "R" => Ok("RUNNING"),
        _ => Err(format!("invalid --state '{text}': give PENDING (PD) or RUNNING (R)")),
    }
}

pub async fn run(a: ScancelArgs) -> anyhow::Result<u8> {
    let mut refs = Vec::new();
    for j in &a.jobs {
        refs.extend(job_refs(j).map_err(anyhow::Error::msg)?);
    }
    let user = if a.me { Some(current_user()) } else { a.user.clone() };
    let states = a.state.as_deref().map(state_name).transpose().map_err(anyhow::Error::msg)?;
    let filtered = user.is_some() || states.is_some() || a.name.is_some() || a.partition.is_some();
    if refs.is_empty() && !filtered {
        anyhow::bail!("no job identification provided: name jobs, or choose them with -u, -n, -t or -p");
    }
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let (mut job_ids, mut task_job_ids) = (Vec::new(), Vec::new());
    if filtered {
        // The active jobs the filters choose, each cancelled alone (a task of an array is a job).
        let req = api::ListJobsRequest {
            states: states
                .map_or_else(|| vec!["PENDING".into(), "RUNNING".into(), "SUSPENDED".into()], |s| vec![s.into()]),
            user: user.unwrap_or_default(),
            ..Default::default()
        };
        for j in ctx.list_all_jobs(req).await?.jobs {
            if (refs.is_empty() || refs.iter().any(|r| r.names(&j)))
                && a.name.as_ref().is_none_or(|n| *n == j.name)
                && a.partition.as_ref().is_none_or(|p| *p == j.partition)
            {
                task_job_ids.push(j.id);
            }
        }
        if task_job_ids.is_empty() {
            return Ok(0);
        }
    } else {
        for r in refs {
            match r.task {
                None => job_ids.push(r.id),
                Some(_) => match r.resolve(&ctx.client).await {
                    Ok(id) => task_job_ids.push(id),
                    Err(e) => {
                        eprintln!(
                            "scancel: error: Kill job error on job id {}_{}: {}",
                            r.id,
                            r.task.unwrap_or(0),
                            status_error(e)
                        );
                        return Ok(1);
                    }
                },
            }
        }
    }
    let req = api::CancelJobRequest {
        job_ids,
        task_job_ids,
        user: current_user(),
        signal: a.signal.unwrap_or_default(),
        ..Default::default()
    };
    let r = ctx.send(req, |mut c, r| async move { c.cancel_job(r).await }).await?;
    let mut code = 0;
    for res in r.results.iter().filter(|res| !res.ok) {
        eprintln!("scancel: error: Kill job error on job id {}: {}", res.job_id, res.error);
        code = 1;
    }
    Ok(code)
}

pub fn main(args: &[String]) -> std::process::ExitCode {
    crate::entry::main_of::<ScancelArgs, _, _>("scancel", crate::entry::Threads::One, args, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_named_as_scancel_names_them() {
        let names = |t: &str| job_refs(t).map(|v| v.iter().map(|r| (r.id, r.task)).collect::<Vec<_>>());
        assert_eq!(names("12"), Ok(vec![(12, None)]));
        assert_eq!(names("12_3"), Ok(vec![(12, Some(3))]));
        assert_eq!(names("12_[1-3,7]"), Ok(vec![(12, Some(1)), (12, Some(2)), (12, Some(3)), (12, Some(7))]));
        assert!(names("12_[x]").unwrap_err().contains("invalid job id '12_[x]'"));
        assert!(names("twelve").is_err());
        // A heterogeneous job by its component 0; another component alone is refused by name.
        assert_eq!(names("12+0"), Ok(vec![(12, None)]));
        assert!(names("12+1").unwrap_err().contains("component 1 of heterogeneous job 12"));
        assert_eq!(state_name("pd"), Ok("PENDING"));
        assert_eq!(state_name("RUNNING"), Ok("RUNNING"));
        assert!(state_name("done").unwrap_err().contains("--state 'done'"));
    }
}
