//! `quorum submit`: a batch script or a command, like sbatch.

use std::process::ExitCode;

use quorum_client::submit::{
    build_spec, component_options, component_spec, merged_options, nodes_for_tasks, script_sections,
    submit_environment, NodeCount, Payload, SubmitOpts,
};
use quorum_proto::api;

use super::{current_user, Context};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    opts: Box<SubmitOpts>,
    /// A batch script; its #SBATCH lines are read for options.
    script: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true)]
    command: Vec<String>,
}

/// What a submit runs: a script (read here) or a command.
pub fn payload_of(script: Option<String>, command: Vec<String>) -> anyhow::Result<Payload> {
    Ok(match (script, command.is_empty()) {
        (Some(_), false) => anyhow::bail!("give a script or -- COMMAND, not both"),
        (Some(path), true) => {
            let text =
                std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("cannot read script '{path}': {e}"))?;
            Payload::Script { path, text }
        }
        (None, false) => Payload::Command(command),
        (None, true) => anyhow::bail!("nothing to run: give a script or -- COMMAND [ARGS...]"),
    })
}

pub async fn run(ctx: &Context, Args { opts, script, command }: Args) -> anyhow::Result<ExitCode> {
    let payload = payload_of(script, command)?;
    let submitted = submit(ctx, *opts, Vec::new(), payload, Vec::new(), "quorum", None, false).await?;
    println!("Submitted job {}", submitted.id);
    if submitted.wait {
        return Ok(ExitCode::from(wait_for_end(ctx, submitted.id).await?));
    }
    Ok(ExitCode::SUCCESS)
}

/// A submitted job, and whether its submitter waits for it (`--wait`); for a check only
/// (`--test-only`, id 0), the cluster's answer: the spec as the job would have it, and when and
/// where it would start.
pub struct Submitted {
    pub id: u64,
    pub wait: bool,
    pub test: Option<api::SubmitJobResponse>,
}

/// The spec a submit of `payload` with `opts` sends (see [`submit`]), and what building it said.
pub async fn prepare(
    ctx: &Context,
    opts: SubmitOpts,
    het: Vec<SubmitOpts>,
    payload: Payload,
    script_args: Vec<String>,
    default_output: Option<&str>,
) -> anyhow::Result<(api::JobSpec, quorum_client::submit::Built)> {
    let cwd = std::env::current_dir()?;
    let mut opts = opts;
    let merged = merged_options(&opts, &payload).map_err(anyhow::Error::msg)?;
    let task_count_alone = merged.ntasks.is_some_and(|t| t > 1) && nodes_for_tasks(&merged, u32::MAX).is_some();
    if task_count_alone || merged.mem_is_all() {
        let nodes = partition_nodes(ctx, merged.partition.as_deref()).await?;
        if task_count_alone {
            // Only a task count: as many nodes of the partition as its tasks need.
            if let Some(cpus) = nodes.iter().map(|n| n.cpus).max() {
                opts.nodes = nodes_for_tasks(&merged, cpus).map(NodeCount::exact);
            }
        }
        if merged.mem_is_all() {
            // All of each node's memory: the partition's smallest node's, so that any of its
            // nodes can hold the job (on nodes alike, all of it, as Slurm gives).
            let smallest = nodes.iter().map(|n| n.mem_mb).min().ok_or_else(|| {
                anyhow::anyhow!("--mem=0 (all of each node's memory): the partition has no registered nodes yet")
            })?;
            opts.mem = Some(format!("{smallest}M"));
        }
    }
    // A heterogeneous job's other components: `sbatch A : B`, and `#SBATCH hetjob` sections.
    let sections = match &payload {
        Payload::Script { path, text } => script_sections(path, text).map_err(anyhow::Error::msg)?,
        Payload::Command(_) => Vec::new(),
    };
    let mut components =
        component_options(&merged, het, sections.into_iter().skip(1).collect()).map_err(anyhow::Error::msg)?;
    if components.iter().any(|c| c.ntasks.is_some_and(|t| t > 1) && nodes_for_tasks(c, u32::MAX).is_some()) {
        let nodes = partition_nodes(ctx, merged.partition.as_deref()).await?;
        if let Some(cpus) = nodes.iter().map(|n| n.cpus).max() {
            for c in &mut components {
                if let Some(n) = nodes_for_tasks(c, cpus) {
                    c.nodes = Some(NodeCount::exact(n));
                }
            }
        }
    }
    let het = components
        .into_iter()
        .enumerate()
        .map(|(k, c)| component_spec(c, &cwd).map_err(|e| anyhow::anyhow!("component {} of the job: {e}", k + 1)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let built = build_spec(opts, payload, &cwd, submit_environment()).map_err(anyhow::Error::msg)?;
    let mut spec = built.spec.clone();
    spec.het = het;
    if !script_args.is_empty() {
        // The script's arguments ride in argv beside it.
        spec.argv = script_args;
    }
    if let (Some(pattern), true) = (default_output, spec.stdout.is_empty()) {
        spec.stdout = if spec.array.is_empty() { pattern.to_string() } else { pattern.replace("%j", "%A_%a") };
    }
    Ok((spec, built))
}

/// Submits `payload` (a script with `script_args`, or a command) with `opts` as this user, from
/// this directory and environment, telling the options accepted but not honoured on stderr as
/// `who`'s. `default_output` is the output pattern when none is given (`None`: the cluster's);
/// for an array, `%j` in it becomes `%A_%a`. `het`: the options of a heterogeneous job's
/// components after the first, from the command line (`sbatch A : B script`).
#[allow(clippy::too_many_arguments)]
pub async fn submit(
    ctx: &Context,
    opts: SubmitOpts,
    het: Vec<SubmitOpts>,
    payload: Payload,
    script_args: Vec<String>,
    who: &str,
    default_output: Option<&str>,
    test_only: bool,
) -> anyhow::Result<Submitted> {
    let (spec, built) = prepare(ctx, opts, het, payload, script_args, default_output).await?;
    let req = api::SubmitJobRequest {
        spec: Some(spec),
        user: current_user(),
        request_id: uuid::Uuid::new_v4().to_string(),
        test_only,
        run_as: built.run_as.clone().unwrap_or_default(),
    };
    let r = ctx.send(req, |mut c, r| async move { c.submit_job(r).await }).await?;
    for w in &built.warnings {
        eprintln!("{who}: warning: {w}");
    }
    let (id, test) = if r.admitted.is_some() { (0, Some(r)) } else { (r.job_id, None) };
    Ok(Submitted { id, wait: built.wait, test })
}

/// The registered nodes of `partition` (the default one when `None`).
async fn partition_nodes(ctx: &Context, partition: Option<&str>) -> anyhow::Result<Vec<api::NodeInfo>> {
    let r = ctx.send(api::ListNodesRequest { stale: false }, |mut c, r| async move { c.list_nodes(r).await }).await?;
    let Some(name) =
        partition.map(str::to_string).or_else(|| r.partitions.iter().find(|p| p.default).map(|p| p.name.clone()))
    else {
        return Ok(Vec::new());
    };
    Ok(r.nodes.into_iter().filter(|n| n.partitions.contains(&name)).collect())
}

/// Waits until job `id` (every task, for an array) has ended; its exit code, as `sbatch --wait`
/// exits with: the highest of an array's tasks, and 1 for a job that ended without one (it was
/// cancelled, timed out or failed to launch).
pub async fn wait_for_end(ctx: &Context, id: u64) -> anyhow::Result<u8> {
    let page = |after: u64, limit: u32| api::ListJobsRequest { after, limit, ..Default::default() };
    let first = ctx.send(page(id.saturating_sub(1), 1), |mut c, r| async move { c.list_jobs(r).await }).await?;
    let Some(head) = first.jobs.into_iter().find(|j| j.id == id) else {
        anyhow::bail!("job {id} is no longer known to the cluster");
    };
    // An array's tasks have consecutive ids from the array's.
    let count = head.array.as_ref().filter(|a| a.array_job_id == id).map_or(1, |a| a.count);
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        let mut jobs = Vec::new();
        let mut after = id.saturating_sub(1);
        loop {
            let r = ctx.send(page(after, count), |mut c, r| async move { c.list_jobs(r).await }).await?;
            jobs.extend(r.jobs.into_iter().filter(|j| j.id < id + u64::from(count)));
            if r.next_after == 0 || r.next_after >= id + u64::from(count) - 1 || jobs.len() >= count as usize {
                break;
            }
            after = r.next_after;
        }
        let mine: Vec<&api::JobInfo> = jobs.iter().collect();
        let active = |j: &&api::JobInfo| matches!(j.state.as_str(), "PENDING" | "RUNNING");
        if !mine.is_empty() && !mine.iter().any(active) {
            return Ok(mine.iter().map(|j| exit_status(j)).max().unwrap_or(1));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_secs(2));
    }
}

/// The exit status a shell would report for a finished job.
fn exit_status(j: &api::JobInfo) -> u8 {
    match j.state.as_str() {
        "COMPLETED" => 0,
        _ if j.has_exit_code && j.exit_code > 0 => j.exit_code.min(255) as u8,
        _ => 1,
    }
}
