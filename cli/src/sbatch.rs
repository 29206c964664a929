//! `sbatch`: Slurm's batch submit, the same submit as `quorum submit` underneath, answering as
//! Slurm's does: `Submitted batch job N`, or only `N` with `--parsable` (what workflow tools
//! read). The script comes from its file, from standard input when none is named, or from
//! `--wrap`; long options may be shortened to any unambiguous prefix, as Slurm's getopt allows.
//! Output goes to `slurm-%j.out` unless the script says otherwise, and `-W` waits for the job
//! and exits with its exit code.

use std::io::Read;
use std::process::ExitCode;

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_client::submit::{Payload, SubmitOpts};

use crate::commands::submit::{submit, wait_for_end};
use crate::commands::Context;

#[derive(Parser, Debug)]
#[command(
    name = "sbatch",
    no_binary_name = true,
    infer_long_args = true,
    about = "Submit a batch script (Quorum's sbatch)"
)]
pub struct SbatchArgs {
    #[command(flatten)]
    opts: Box<SubmitOpts>,
    #[command(flatten)]
    controllers: ControllersArg,
    /// Print only the job's id, for scripts.
    #[arg(long)]
    parsable: bool,
    /// Print nothing but errors (and warnings).
    #[arg(short = 'Q', long)]
    quiet: bool,
    /// Check the script and options as a submit would, and say what the job would get;
    /// nothing is submitted.
    #[arg(long)]
    test_only: bool,
    /// Run this command line as the job's script, under /bin/sh.
    #[arg(long, conflicts_with = "script")]
    wrap: Option<String>,
    /// The batch script (standard input when none is named).
    script: Option<String>,
    /// Arguments for the script.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    script_args: Vec<String>,
}

pub fn main(args: &[String]) -> ExitCode {
    let (components, rest) = match split_components(args) {
        Ok(split) => split,
        Err(e) => {
            eprintln!("sbatch: error: {e}");
            return ExitCode::from(1);
        }
    };
    crate::entry::main_of::<SbatchArgs, _, _>("sbatch", crate::entry::Threads::One, &rest, move |a| run(a, components))
}

/// `sbatch A : B : C script`: the options of every component but the last (each `:` before the
/// script separates two), and the arguments of the last, with the script and its arguments. A
/// `:` after the script is one of its arguments.
fn split_components(args: &[String]) -> anyhow::Result<(Vec<SbatchArgs>, Vec<String>)> {
    let mut components = Vec::new();
    let mut start = 0;
    while let Some(at) = args[start..].iter().position(|a| a == ":").map(|i| start + i) {
        let group = &args[start..at];
        let parsed = SbatchArgs::try_parse_from(group).map_err(|e| {
            let msg = e.to_string();
            anyhow::anyhow!(
                "component {} of the heterogeneous job: {}",
                components.len(),
                msg.lines().next().unwrap_or("invalid option").trim_start_matches("error: ")
            )
        })?;
        if parsed.script.is_some() || parsed.wrap.is_some() {
            break;
        }
        components.push(parsed);
        start = at + 1;
    }
    Ok((components, args[start..].to_vec()))
}

async fn run(mut a: SbatchArgs, earlier: Vec<SbatchArgs>) -> anyhow::Result<u8> {
    // What sbatch itself is told applies from any component's options.
    for e in &earlier {
        (a.parsable, a.quiet, a.test_only) = (a.parsable || e.parsable, a.quiet || e.quiet, a.test_only || e.test_only);
    }
    let mut components: Vec<SubmitOpts> = earlier.into_iter().map(|e| *e.opts).collect();
    let payload = match (a.wrap, a.script) {
        (Some(command), _) => Payload::Script {
            path: "wrap".into(),
            text: format!("#!/bin/sh\n# This script was made by sbatch --wrap.\n\n{command}\n"),
        },
        (None, Some(path)) => {
            let text =
                std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("cannot read script '{path}': {e}"))?;
            Payload::Script { path, text }
        }
        (None, None) => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| anyhow::anyhow!("cannot read the script from standard input: {e}"))?;
            if text.trim().is_empty() {
                anyhow::bail!("no script: name a file, pass one on standard input, or use --wrap");
            }
            Payload::Script { path: "sbatch".into(), text }
        }
    };
    let ctx = Context { client: a.controllers.client()?, stale: false };
    // With `A : B script`, the options before the first `:` are component 0's.
    components.push(*a.opts);
    let first = components.remove(0);
    let submitted =
        submit(&ctx, first, components, payload, a.script_args, "sbatch", Some(DEFAULT_OUTPUT), a.test_only).await?;
    if let Some(test) = &submitted.test {
        eprint!("{}", would_start(test));
        return Ok(0);
    }
    let id = submitted.id;
    if a.parsable {
        println!("{id}");
    } else if !a.quiet {
        println!("Submitted batch job {id}");
    }
    if submitted.wait {
        return wait_for_end(&ctx, id).await;
    }
    Ok(0)
}

/// What `--test-only` says: Slurm's line (`Job N to start at T using C processors on nodes L in
/// partition P`, the id the job would get), then what the job would be given.
fn would_start(r: &quorum_proto::api::SubmitJobResponse) -> String {
    let s = r.admitted.clone().unwrap_or_default();
    let processors = u64::from(s.ntasks) * u64::from(s.cpus_per_task.max(1));
    let when = if r.expected_start_ms == 0 {
        format!(
            "sbatch: Job {} is not expected to start within a year against the running jobs ({})\n",
            r.would_be_id, r.waiting_reason
        )
    } else {
        format!(
            "sbatch: Job {} to start at {} using {processors} processors on nodes {} in partition {}\n",
            r.would_be_id,
            quorum_client::display::local_time(r.expected_start_ms),
            r.expected_nodes,
            s.partition
        )
    };
    let gpus = match (s.gpus_per_node, s.gpu_type.as_str()) {
        (0, _) => String::new(),
        (n, "") => format!(", {n} GPUs"),
        (n, t) => format!(", {n} GPUs of type {t}"),
    };
    let limit = match s.time_limit_s {
        0 => "UNLIMITED".to_string(),
        t => quorum_model::parse::format_duration(t),
    };
    format!(
        "{when}sbatch: it would have {} nodes, {} tasks, {processors} processors; per node {} memory{gpus}; time limit {limit}. Nothing was submitted\n",
        s.nodes,
        s.ntasks,
        quorum_model::parse::format_mem_mb(s.mem_per_node_mb)
    )
}

/// Slurm's output file when a script names none (`slurm-%A_%a.out` for an array's tasks), in
/// the job's working directory.
const DEFAULT_OUTPUT: &str = "slurm-%j.out";

#[cfg(test)]
mod het_tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn colons_before_the_script_separate_components_and_after_it_are_its_arguments() {
        let (earlier, rest) = split_components(&args("--parsable -n1 -c3 : -N2 -n4 : -n1 job.sh a : b")).unwrap();
        assert_eq!(earlier.len(), 2);
        assert!(earlier[0].parsable);
        assert_eq!((earlier[0].opts.ntasks, earlier[0].opts.cpus_per_task), (Some(1), Some(3)));
        assert_eq!(earlier[1].opts.ntasks, Some(4));
        assert_eq!(rest, args("-n1 job.sh a : b"));
        let (earlier, rest) = split_components(&args("-n1 job.sh : x")).unwrap();
        assert!(earlier.is_empty(), "a colon after the script is its argument");
        assert_eq!(rest, args("-n1 job.sh : x"));
        let e = split_components(&args("-n1 --bogus : -n2 job.sh")).unwrap_err().to_string();
        assert!(e.contains("component 0"), "{e}");
    }
}
