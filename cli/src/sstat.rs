//! `sstat`: what a running job uses now, as Slurm's sstat reports it: a line for the job's batch
//! step (`12.batch`: its script and every process of its process group, on each of its nodes),
//! with `-o` field names, `--parsable2`/`-P`, `-p`, `-n`. Each node's agent reads it from `/proc`
//! when asked; `sacct` has what an ended job used.

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_proto::api;

use crate::commands::Context;
use crate::sacct::{cpu_time, parse_fields_of, table, ReportArgs};

/// Fields `-o` may name, with their widths in a table.
const FIELDS: &[(&str, usize)] = &[
    ("JobID", 12),
    ("NTasks", 8),
    ("Nodelist", 20),
    ("AveCPU", 10),
    ("MinCPU", 10),
    ("MinCPUNode", 10),
    ("TotalCPU", 10),
    ("MaxRSS", 10),
    ("MaxRSSNode", 10),
    ("AveRSS", 10),
];

const DEFAULT_FIELDS: &str = "JobID,NTasks,AveCPU,MaxRSS,MaxRSSNode,AveRSS";

#[derive(Parser, Debug)]
#[command(
    name = "sstat",
    no_binary_name = true,
    infer_long_args = true,
    about = "What running jobs use now (Quorum's sstat)"
)]
pub struct SstatArgs {
    #[command(flatten)]
    controllers: ControllersArg,
    /// The jobs (comma-separated: 12, or 12.batch).
    #[arg(short = 'j', long = "jobs", value_delimiter = ',', required = true)]
    jobs: Vec<String>,
    #[command(flatten)]
    report: ReportArgs,
}

/// One job's line.
fn value(field: &str, id: u64, nodes: &[api::NodeUsage]) -> String {
    let cpu = |n: &api::NodeUsage| n.usage.as_ref().map_or(0, |u| u.cpu_user_us + u.cpu_system_us);
    let rss = |n: &api::NodeUsage| n.usage.as_ref().map_or(0, |u| u.max_rss_kb);
    let tasks: u64 = nodes.iter().map(|n| u64::from(n.processes)).sum();
    let total: u64 = nodes.iter().map(cpu).sum();
    let min = nodes.iter().min_by_key(|n| cpu(n));
    let max_rss = nodes.iter().max_by_key(|n| rss(n));
    match field {
        "JobID" => format!("{id}.batch"),
        "NTasks" => tasks.to_string(),
        "Nodelist" => {
            let names: Vec<String> = nodes.iter().map(|n| n.node.clone()).collect();
            quorum_model::hostlist::compress(&names)
        }
        "AveCPU" => cpu_time(total / tasks.max(1)),
        "MinCPU" => min.map_or_else(String::new, |n| cpu_time(cpu(n))),
        "MinCPUNode" => min.map_or_else(String::new, |n| n.node.clone()),
        "TotalCPU" => cpu_time(total),
        "MaxRSS" => max_rss.map_or_else(String::new, |n| format!("{}K", rss(n))),
        "MaxRSSNode" => max_rss.map_or_else(String::new, |n| n.node.clone()),
        "AveRSS" => format!("{}K", nodes.iter().map(|n| n.rss_kb).sum::<u64>() / tasks.max(1)),
        _ => String::new(),
    }
}

pub async fn run(a: SstatArgs) -> anyhow::Result<u8> {
    let format = a.report.format.as_deref().unwrap_or(DEFAULT_FIELDS);
    let fields = parse_fields_of(format, FIELDS).map_err(anyhow::Error::msg)?;
    let mut ids = Vec::new();
    for j in &a.jobs {
        let id = j.trim().strip_suffix(".batch").unwrap_or(j.trim());
        ids.push(
            id.parse::<u64>()
                .map_err(|_| anyhow::anyhow!("invalid job '{j}': give a job id such as 12 or 12.batch"))?,
        );
    }
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let mut rows = Vec::new();
    for id in ids {
        let req = api::JobUsageRequest { job_id: id };
        let answer = ctx.send(req, |mut c, r| async move { c.job_usage(r).await }).await?;
        rows.push(fields.iter().map(|(f, _)| value(f, id, &answer.nodes)).collect());
    }
    print!("{}", table(&fields, rows.into_iter(), a.report.form.parsable(), !a.report.form.noheader));
    Ok(0)
}

pub fn main(args: &[String]) -> std::process::ExitCode {
    crate::entry::main_of::<SstatArgs, _, _>("sstat", crate::entry::Threads::One, args, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_sums_and_averages_the_nodes_as_sstat_does() {
        let node = |name: &str, cpu_us, hwm, rss, processes| api::NodeUsage {
            node: name.into(),
            usage: Some(api::JobUsage { cpu_user_us: cpu_us, cpu_system_us: 0, max_rss_kb: hwm, ..Default::default() }),
            rss_kb: rss,
            processes,
        };
        let nodes = [node("n1", 3_000_000, 500, 400, 2), node("n2", 1_000_000, 900, 200, 1)];
        let line: Vec<String> = [
            "JobID",
            "NTasks",
            "Nodelist",
            "AveCPU",
            "MinCPU",
            "MinCPUNode",
            "TotalCPU",
            "MaxRSS",
            "MaxRSSNode",
            "AveRSS",
        ]
        .iter()
        .map(|f| value(f, 12, &nodes))
        .collect();
        assert_eq!(
            line,
            ["12.batch", "3", "n[1-2]", "00:01.333", "00:01.000", "n2", "00:04.000", "900K", "n2", "200K"]
        );
        assert!(parse_fields_of("JobID,Bogus", FIELDS).unwrap_err().contains("'Bogus'"));
    }
}
