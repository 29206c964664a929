//! `scontrol`: `show job|node|partition [NAME]` as Slurm prints them (`Key=Value`, a record's
//! lines indented under its first, or one line each with `-o`), `hold`, `release` and
//! `requeue` of jobs, and `show hostnames|hostlist|hostlistsorted`, which batch scripts use to
//! find their nodes, and `update JobId=... KEY=VALUE...` (as `quorum update`) and `update
//! NodeName=... State=DRAIN|RESUME [Reason=...]` (as `quorum admin drain|resume`).

use std::process::ExitCode;

use clap::Parser;
use quorum_client::client::{Client, ControllersArg, JobRef};
use quorum_client::display::{self, null_or};
use quorum_model::hostlist;
use quorum_model::parse::format_duration;
use quorum_proto::api::{self, JobInfo, NodeInfo, PartitionInfo};

use crate::commands::hold::{control, Action};
use crate::commands::Context;

/// `scontrol ARGS...`.
pub fn main(args: &[String]) -> ExitCode {
    // `-o`/`--oneliner` and `-d`/`--details` may come anywhere, as Slurm's take them.
    let one_line = args.iter().any(|a| a == "-o" || a == "--oneliner");
    let words: Vec<String> =
        args.iter().filter(|a| !matches!(a.as_str(), "-o" | "--oneliner" | "-d" | "--details")).cloned().collect();
    let lower: Vec<String> = words.iter().map(|w| w.to_ascii_lowercase()).collect();
    let result = match (lower.first().map(String::as_str), lower.get(1).map(String::as_str)) {
        (Some("show"), Some(e)) if e.starts_with("hostname") || e == "hostlist" || e == "hostlistsorted" => {
            hosts(e, words.get(2))
        }
        (Some("show"), Some(entity)) => {
            let entity = entity.to_string();
            let name = words.get(2).cloned();
            on_runtime(move |client| async move { show(client, &entity, name, one_line).await })
        }
        (Some(verb @ ("hold" | "uhold" | "release" | "requeue" | "suspend" | "resume")), _) if words.len() > 1 => {
            let action = match verb {
                "release" => Action::Release,
                "requeue" => Action::Requeue,
                "suspend" => Action::Suspend,
                "resume" => Action::Resume,
                _ => Action::Hold,
            };
            let jobs = words[1..].to_vec();
            on_runtime(move |client| async move { act(client, jobs, action).await })
        }
        // `create partition PartitionName=NAME ...` or `create PartitionName=NAME ...`.
        (Some("create"), Some(e)) if e.starts_with("partition") => {
            let words = words[if e == "partition" { 2 } else { 1 }..].to_vec();
            on_runtime(move |client| async move { partition(client, words, true).await })
        }
        (Some("update"), _) if lower.iter().any(|w| w.starts_with("partitionname=")) => {
            let words = words[1..].to_vec();
            on_runtime(move |client| async move { partition(client, words, false).await })
        }
        (Some("delete"), Some(e)) if e.starts_with("partition") => {
            // `delete PartitionName=NAME`, or `delete partition NAME`.
            let name = match words[1].split_once('=') {
                Some((_, v)) => Some(v.to_string()),
                None => words.get(2).cloned(),
            };
            match name {
                Some(name) => on_runtime(move |client| async move {
                    let ctx = Context { client, stale: false };
                    let req = api::DeletePartitionRequest { name };
                    ctx.send(req, |mut c, r| async move { c.delete_partition(r).await })
                        .await
                        .map_err(|e| format!("{e:#}"))?;
                    Ok(String::new())
                }),
                None => Err("delete: name the partition: delete PartitionName=NAME".to_string()),
            }
        }
        (Some("create"), Some(e)) if e.starts_with("res") => {
            let words = words[2..].to_vec();
            on_runtime(move |client| async move { reservation(client, words, false).await })
        }
        (Some("update"), _) if lower.iter().any(|w| w.starts_with("reservationname=")) => {
            let words = words[1..].to_vec();
            on_runtime(move |client| async move { reservation(client, words, true).await })
        }
        (Some("delete"), Some(_)) => {
            // `delete ReservationName=NAME`, or `delete reservation NAME`.
            let name = match words[1].split_once('=') {
                Some((k, v)) if k.eq_ignore_ascii_case("reservationname") => Some(v.to_string()),
                _ if lower[1].starts_with("res") => words.get(2).cloned(),
                _ => None,
            };
            match name {
                Some(name) => on_runtime(move |client| async move {
                    let ctx = Context { client, stale: false };
                    crate::commands::reservation::delete(&ctx, &name).await
                }),
                None => Err("delete: name the reservation: delete ReservationName=NAME".to_string()),
            }
        }
        (Some("update"), _) if words.len() > 1 => {
            let words = words[1..].to_vec();
            on_runtime(move |client| async move { update(client, words).await })
        }
        _ => Err(format!(
            "'{}' is not supported: Quorum's scontrol supports {}",
            args.join(" "),
            FORMS.iter().map(|(form, _)| *form).collect::<Vec<_>>().join(", ")
        )),
    };
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("scontrol: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What this scontrol answers to: each form, and what it does. Its error for
/// anything else lists the forms, and its man page ([`command`]) describes them.
const FORMS: &[(&str, &str)] = &[
    ("show job|node|partition|reservation [NAME]", "Print jobs, nodes, partitions or reservations as Slurm's Key=Value records (-o: one line each; -d is accepted)."),
    ("show hostnames|hostlist|hostlistsorted [LIST]", "Expand a host list into names, one a line (SLURM_JOB_NODELIST without a list), or fold names into a list."),
    ("hold|uhold|release|requeue|suspend|resume JOBS", "Hold or release pending jobs, send running ones back to the queue, freeze or thaw them (operators); jobs by id or array task (12_3), comma-separated or several."),
    ("update JobId=JOBS KEY=VALUE...", "Change jobs as `quorum update` does (TimeLimit, Partition, QOS, Account, Nice, NumNodes, Name, Comment, Dependency, ...)."),
    ("update NodeName=NODES State=DRAIN|DOWN|RESUME [Reason=TEXT] [Weight=N] [Features=LIST]", "Drain, down or resume nodes, set their weight (lower first) or the features in force (operators)."),
    ("create partition PartitionName=NAME KEY=VALUE...", "Create a partition (admins): Nodes, Default, State (UP, DOWN, DRAIN, INACTIVE), MaxTime, DefaultTime, DefMemPerCPU, PriorityTier, MaxNodes, OverSubscribe, PreemptMode, GraceTime, AllowAccounts, DenyAccounts, AllowQos, DenyQos."),
    ("update PartitionName=NAME KEY=VALUE...", "Change a partition; what is not named stays."),
    ("delete PartitionName=NAME", "Delete a partition (refused while a job pending or running is in it)."),
    ("create reservation KEY=VALUE...", "Create an advance reservation (ReservationName, StartTime, Duration or EndTime, Nodes or NodeCnt, PartitionName, Users, Accounts, Flags), as `quorum reservation create`."),
    ("update ReservationName=NAME KEY=VALUE...", "Change a reservation."),
    ("delete ReservationName=NAME", "Delete a reservation (refused while a job is in it)."),
];

/// scontrol's words as a parser, for its man page and the manual's checks: a subcommand per
/// verb of [`FORMS`], its forms as its description. (scontrol itself reads its words as
/// Slurm's does, case-insensitively, with `-o` anywhere; see [`main`].)
pub fn command() -> clap::Command {
    let mut cmd = clap::Command::new("scontrol")
        .about("Show and change jobs, nodes, partitions and reservations (Quorum's scontrol)")
        .arg(
            clap::Arg::new("oneliner")
                .short('o')
                .long("oneliner")
                .global(true)
                .action(clap::ArgAction::SetTrue)
                .help("One line per record."),
        )
        .arg(
            clap::Arg::new("details")
                .short('d')
                .long("details")
                .global(true)
                .action(clap::ArgAction::SetTrue)
                .help("Accepted, as Slurm's; records are shown whole."),
        )
        .subcommand_required(true);
    let mut verbs: Vec<&str> = Vec::new();
    for (form, _) in FORMS {
        for verb in form.split(' ').next().unwrap_or_default().split('|') {
            if !verbs.contains(&verb) {
                verbs.push(verb);
            }
        }
    }
    for verb in verbs {
        let forms: Vec<_> = FORMS
            .iter()
            .filter(|(form, _)| form.split(' ').next().is_some_and(|w| w.split('|').any(|x| x == verb)))
            .collect();
        let about = forms.iter().map(|(form, what)| format!("{form}: {what}")).collect::<Vec<_>>().join("\n");
        let words = clap::Arg::new("words").num_args(1..).required(true).help("The words of the forms above.");
        cmd = cmd.subcommand(clap::Command::new(verb).about(about).arg(words));
    }
    cmd
}

/// The controllers as the environment names them (scontrol's words are not clap's).
#[derive(clap::Parser)]
#[command(no_binary_name = true)]
struct FromEnv {
    #[command(flatten)]
    controllers: ControllersArg,
}

/// Runs `f` with a client of the cluster on a runtime of its own.
fn on_runtime<F, Fut>(f: F) -> Result<String, String>
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let from_env = FromEnv::try_parse_from(Vec::<String>::new()).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?;
    let out = rt.block_on(async move {
        let client = from_env.controllers.client().map_err(|e| format!("{e:#}"))?;
        f(client).await
    });
    rt.shutdown_background();
    out
}

/// `hold|release|requeue JOB[,JOB...] ...`: each job by id or as an array task (`12_3`).
async fn act(client: Client, jobs: Vec<String>, action: Action) -> Result<String, String> {
    let ctx = Context { client, stale: false };
    let mut ids = Vec::new();
    for word in jobs.iter().flat_map(|w| w.split(',')).filter(|w| !w.is_empty()) {
        let job: JobRef = word.parse()?;
        ids.push(match job.task {
            None => job.id,
            Some(task) => job_info(&ctx, job.id, Some(task)).await?.id,
        });
    }
    let errors = control(&ctx, ids, action).await.map_err(|e| format!("{e:#}"))?;
    if errors.is_empty() {
        Ok(String::new())
    } else {
        Err(errors.join("\nscontrol: error: "))
    }
}

/// `update JobId=JOBS KEY=VALUE...` or `update NodeName=NODES State=DRAIN Reason=TEXT|RESUME`,
/// the entity's word anywhere among the others, as Slurm takes them.
async fn reservation(client: Client, words: Vec<String>, update: bool) -> Result<String, String> {
    let ctx = Context { client, stale: false };
    crate::commands::reservation::create(&ctx, &words, update).await
}

/// `create|update PartitionName=NAME KEY=VALUE...`; the leader reads the settings, as it reads
/// a partition of the configuration.
async fn partition(client: Client, words: Vec<String>, create: bool) -> Result<String, String> {
    let ctx = Context { client, stale: false };
    let mut name = None;
    let mut settings = Vec::new();
    for w in &words {
        let Some((k, v)) = w.split_once('=') else {
            return Err(format!("'{w}' is not KEY=VALUE"));
        };
        if k.eq_ignore_ascii_case("partitionname") {
            name = Some(v.to_string());
        } else {
            settings.push(api::ConfigEntry { key: k.to_string(), value: v.to_string() });
        }
    }
    let Some(name) = name else {
        return Err("name the partition: PartitionName=NAME".to_string());
    };
    let req = api::PutPartitionRequest { name, create, settings };
    ctx.send(req, |mut c, r| async move { c.put_partition(r).await }).await.map_err(|e| format!("{e:#}"))?;
    Ok(String::new())
}

async fn update(client: Client, words: Vec<String>) -> Result<String, String> {
    let ctx = Context { client, stale: false };
    let key = |w: &String| w.split_once('=').map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()));
    let entity = words.iter().position(|w| key(w).is_some_and(|(k, _)| matches!(k.as_str(), "jobid" | "nodename")));
    let Some(at) = entity else {
        return Err("update: name JobId=JOBS, NodeName=NODES, PartitionName=NAME or ReservationName=NAME".to_string());
    };
    let (which, names) = key(&words[at]).expect("found above");
    let rest: Vec<String> = words.iter().enumerate().filter(|(i, _)| *i != at).map(|(_, w)| w.clone()).collect();
    if which == "jobid" {
        let errors = crate::commands::update::update(&ctx, &names, &rest).await.map_err(|e| format!("{e:#}"))?;
        return if errors.is_empty() { Ok(String::new()) } else { Err(errors.join("\nscontrol: error: ")) };
    }
    let (mut state, mut reason, mut weight, mut features) = (None, None, None, None);
    for word in &rest {
        match key(word) {
            Some((k, v)) if k == "state" => state = Some(v.to_ascii_lowercase()),
            Some((k, v)) if k == "reason" => reason = Some(v),
            Some((k, v)) if k == "weight" => {
                weight = Some(v.parse::<u32>().map_err(|_| format!("Weight={v}: not a whole number"))?)
            }
            Some((k, v)) if matches!(k.as_str(), "features" | "availablefeatures" | "activefeatures") => {
                features = Some(v)
            }
            _ => {
                return Err(format!(
                    "update of a node: '{word}' is not supported (State=DRAIN|DOWN|RESUME, Reason=TEXT, Weight=N, Features=LIST)"
                ))
            }
        }
    }
    let nodes = hostlist::expand(&names).map_err(|e| format!("NodeName={names}: {e}"))?;
    let with_reason = |what: &str| match &reason {
        Some(r) if !r.is_empty() => Ok(r.clone()),
        _ => Err(format!("you must specify a reason when changing a node's state to {what}")),
    };
    let (drain, down) = match state.as_deref() {
        Some("drain") => (Some(Some(with_reason("DRAIN")?)), None),
        Some("down") => (None, Some(with_reason("DOWN")?)),
        Some("resume" | "undrain") => (Some(None), None),
        None if weight.is_some() || features.is_some() => (None, None),
        other => {
            return Err(format!(
                "update of a node: State={} is not supported (DRAIN or DOWN with a Reason, or RESUME)",
                other.unwrap_or("")
            ))
        }
    };
    if weight.is_some() || features.is_some() || down.is_some() {
        let req = api::UpdateNodesRequest { nodes: nodes.clone(), weight, features, down_reason: down };
        ctx.send(req, |mut c, r| async move { c.update_nodes(r).await }).await.map_err(|e| format!("{e:#}"))?;
    }
    if let Some(drain) = drain {
        crate::commands::admin::nodes::set_drained_quietly(&ctx, nodes, drain).await.map_err(|e| format!("{e:#}"))?;
    }
    Ok(String::new())
}

async fn job_info(ctx: &Context, id: u64, task: Option<u32>) -> Result<JobInfo, String> {
    let req = api::GetJobRequest { job_id: id, stale: false, array_task_id: task };
    let r = ctx.send(req, |mut c, r| async move { c.get_job(r).await }).await.map_err(|e| format!("{e:#}"))?;
    r.job.ok_or_else(|| "empty answer".to_string())
}

/// `scontrol show config` as Slurm prints it: a dated first line, then `Key = Value` with the
/// keys in one column (only `key` when one is named, matched in any case).
fn config_text(entries: &[api::ConfigEntry], now_ms: u64, key: Option<&str>) -> String {
    let mut out = format!("Configuration data as of {}\n", quorum_client::display::local_time_or(now_ms, "Unknown"));
    for e in entries.iter().filter(|e| key.is_none_or(|k| e.key.eq_ignore_ascii_case(k))) {
        out.push_str(&format!("{:<23} = {}\n", e.key, e.value));
    }
    out
}

async fn show(client: Client, entity: &str, name: Option<String>, one_line: bool) -> Result<String, String> {
    let ctx = Context { client, stale: false };
    let records: Vec<Vec<String>> = match entity {
        "job" | "jobs" | "jobid" => {
            let now = crate::format::now_ms();
            let jobs = match &name {
                Some(n) => {
                    let job: JobRef = n.parse()?;
                    vec![job_info(&ctx, job.id, job.task).await?]
                }
                None => {
                    let req = api::ListJobsRequest::default();
                    ctx.list_all_jobs(req).await.map_err(|e| format!("{e:#}"))?.jobs
                }
            };
            if jobs.is_empty() {
                return Ok("No jobs in the system\n".into());
            }
            let priorities = ctx.pending_priorities(&jobs).await;
            jobs.iter().flat_map(|j| job_records(j, now, priorities.get(&j.id).copied(), one_line)).collect()
        }
        "node" | "nodes" | "nodename" | "partition" | "partitions" | "partitionname" => {
            let r = ctx
                .send(api::ListNodesRequest { stale: false }, |mut c, r| async move { c.list_nodes(r).await })
                .await
                .map_err(|e| format!("{e:#}"))?;
            if entity.starts_with("node") {
                let names = match &name {
                    Some(list) => Some(hostlist::expand(list).map_err(|e| format!("invalid node list '{list}': {e}"))?),
                    None => None,
                };
                let nodes: Vec<&NodeInfo> =
                    r.nodes.iter().filter(|n| names.as_ref().is_none_or(|names| names.contains(&n.name))).collect();
                if let (Some(list), true) = (&name, nodes.is_empty()) {
                    return Err(format!("Node {list} not found"));
                }
                nodes.into_iter().map(node_record).collect()
            } else {
                let parts: Vec<&PartitionInfo> =
                    r.partitions.iter().filter(|p| name.as_ref().is_none_or(|n| &p.name == n)).collect();
                if let (Some(n), true) = (&name, parts.is_empty()) {
                    return Err(format!("Partition {n} not found"));
                }
                parts.into_iter().map(|p| partition_record(p, &r.nodes)).collect()
            }
        }
        "license" | "licenses" | "licensename" | "lic" => {
            let r = ctx
                .send(api::ListNodesRequest { stale: false }, |mut c, r| async move { c.list_nodes(r).await })
                .await
                .map_err(|e| format!("{e:#}"))?;
            let lics: Vec<&api::LicenseInfo> =
                r.licenses.iter().filter(|l| name.as_ref().is_none_or(|n| &l.name == n)).collect();
            if lics.is_empty() {
                return Ok(match &name {
                    Some(n) => format!("License {n} not found\n"),
                    None => "No licenses configured in Slurm.\n".into(),
                });
            }
            lics.into_iter()
                .map(|l| {
                    vec![
                        format!("LicenseName={}", l.name),
                        format!(
                            "Total={} Used={} Free={} Reserved=0 Remote=no",
                            l.total,
                            l.used,
                            l.total.saturating_sub(l.used)
                        ),
                    ]
                })
                .collect()
        }
        "reservation" | "reservations" | "res" | "reservationname" => {
            return crate::commands::reservation::show(&ctx, name.as_deref(), one_line).await;
        }
        "config" | "conf" | "configuration" => {
            let r = ctx
                .send(api::ConfigRequest {}, |mut c, r| async move { c.config(r).await })
                .await
                .map_err(|e| format!("{e:#}"))?;
            return Ok(config_text(&r.entries, crate::format::now_ms(), name.as_deref()));
        }
        other => {
            return Err(format!(
                "'show {other}' is not supported: show job, node, partition, licenses, reservation or config"
            ))
        }
    };
    Ok(records.iter().map(|lines| record_text(lines, one_line)).collect())
}

/// A record as Slurm prints it: the first line, the rest indented by three spaces, and a blank
/// line after; or all on one line.
fn record_text(lines: &[String], one_line: bool) -> String {
    if one_line {
        return format!("{}\n", lines.join(" "));
    }
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        if i > 0 {
            out.push_str("   ");
        }
        out.push_str(l);
        out.push('\n');
    }
    out.push('\n');
    out
}

/// A job's records (one per component of a heterogeneous job), each its lines, from `quorum
/// show`'s: its steps are left out of a one-line record.
fn job_records(j: &JobInfo, now: u64, priority: Option<u64>, one_line: bool) -> Vec<Vec<String>> {
    let mut records = vec![Vec::new()];
    for line in display::show_job(j, now, priority).lines().map(str::trim) {
        match line {
            "" => records.push(Vec::new()),
            l if one_line && l.starts_with("StepId=") => {}
            l => records.last_mut().expect("one record at least").push(l.to_string()),
        }
    }
    records.retain(|r| !r.is_empty());
    records
}

/// A node's state as Slurm's `scontrol` writes it: `IDLE`, `MIXED+DRAIN`, `DOWN*`.
fn node_state(n: &NodeInfo) -> String {
    let base = match (n.state.as_str(), n.alloc_cpus) {
        ("drain", 0) => "IDLE+DRAIN".to_string(),
        ("drain", _) => "MIXED+DRAIN".to_string(),
        (s, _) => s.to_ascii_uppercase(),
    };
    if n.connected {
        base
    } else {
        match base.split_once('+') {
            Some((a, b)) => format!("{a}*+{b}"),
            None => format!("{base}*"),
        }
    }
}

fn node_record(n: &NodeInfo) -> Vec<String> {
    let gres = crate::sinfo::gres(n);
    let mut lines = vec![
        format!("NodeName={}", n.name),
        format!("CPUAlloc={} CPUTot={}", n.alloc_cpus, n.cpus),
        format!("AvailableFeatures={}", null_or(&n.features.join(","))),
        format!("ActiveFeatures={}", null_or(&n.features.join(","))),
        format!("Gres={gres}"),
        format!("RealMemory={} AllocMem={}", n.mem_mb, n.alloc_mem_mb),
        format!("State={} Weight={}", node_state(n), n.weight.max(1)),
        format!("Partitions={}", n.partitions.join(",")),
        format!(
            "CfgTRES=cpu={},mem={}M{} AllocTRES={}",
            n.cpus,
            n.mem_mb,
            if n.gpus > 0 { format!(",gres/gpu={}", n.gpus) } else { String::new() },
            alloc_tres(n)
        ),
        format!("Version={}", if n.agent_version.is_empty() { "(null)" } else { &n.agent_version }),
    ];
    if !n.reason.is_empty() {
        lines.push(format!("Reason={}", n.reason));
    }
    lines
}

fn alloc_tres(n: &NodeInfo) -> String {
    let mut parts = Vec::new();
    if n.alloc_cpus > 0 {
        parts.push(format!("cpu={}", n.alloc_cpus));
    }
    if n.alloc_mem_mb > 0 {
        parts.push(format!("mem={}M", n.alloc_mem_mb));
    }
    if n.alloc_gpus > 0 {
        parts.push(format!("gres/gpu={}", n.alloc_gpus));
    }
    parts.join(",")
}

fn partition_record(p: &PartitionInfo, nodes: &[NodeInfo]) -> Vec<String> {
    let members: Vec<&NodeInfo> = nodes.iter().filter(|n| n.partitions.contains(&p.name)).collect();
    let limit = |s: u64, none: &str| if s == 0 { none.to_string() } else { format_duration(s) };
    vec![
        format!("PartitionName={}", p.name),
        {
            let list = |l: &[String]| if l.is_empty() { "ALL".to_string() } else { l.join(",") };
            let mut line = format!("AllowGroups=ALL AllowAccounts={}", list(&p.allow_accounts));
            if !p.deny_accounts.is_empty() {
                line.push_str(&format!(" DenyAccounts={}", p.deny_accounts.join(",")));
            }
            line.push_str(&format!(" AllowQos={}", list(&p.allow_qos)));
            if !p.deny_qos.is_empty() {
                line.push_str(&format!(" DenyQos={}", p.deny_qos.join(",")));
            }
            line
        },
        format!("Default={}", if p.default { "YES" } else { "NO" }),
        format!(
            "DefaultTime={} MaxNodes={} MaxTime={}",
            limit(p.default_time_s, "NONE"),
            if p.max_nodes == 0 { "UNLIMITED".to_string() } else { p.max_nodes.to_string() },
            limit(p.max_time_s, "UNLIMITED")
        ),
        format!("Nodes={}", p.nodes),
        format!("PriorityTier={} OverSubscribe={}", p.priority_tier, crate::sinfo::oversubscribe(p)),
        format!(
            "GraceTime={} PreemptMode={}",
            p.grace_time_s,
            if p.preempt_mode.is_empty() { "OFF" } else { &p.preempt_mode }
        ),
        format!(
            "State={} TotalCPUs={} TotalNodes={}",
            if p.state.is_empty() { "UP" } else { &p.state },
            members.iter().map(|n| u64::from(n.cpus)).sum::<u64>(),
            members.len()
        ),
        format!("DefMemPerCPU={}", p.default_mem_per_cpu_mb),
    ]
}

/// `show hostnames [LIST]`, `show hostlist LIST`, `show hostlistsorted LIST`. Without a list,
/// `hostnames` reads `SLURM_JOB_NODELIST`, as Slurm's does.
fn hosts(entity: &str, list: Option<&String>) -> Result<String, String> {
    let list = match list {
        Some(list) => list.clone(),
        None if entity.starts_with("hostname") => std::env::var("SLURM_JOB_NODELIST").unwrap_or_default(),
        None => String::new(),
    };
    if list.trim().is_empty() {
        return Err("host list is empty".into());
    }
    let names = hostlist::expand(list.trim()).map_err(|e| format!("invalid host list '{list}': {e}"))?;
    match entity {
        "hostlist" => Ok(format!("{}\n", hostlist::compress(&names))),
        "hostlistsorted" => {
            let mut names = names;
            names.sort_by(|a, b| natural_key(a).cmp(&natural_key(b)));
            Ok(format!("{}\n", hostlist::compress(&names)))
        }
        _ => Ok(names.iter().map(|n| format!("{n}\n")).collect()),
    }
}

/// A host name as (prefix, number, the name): `n10` after `n9`.
fn natural_key(name: &str) -> (&str, u64, &str) {
    let digits = name.len() - name.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (prefix, number) = name.split_at(digits);
    (prefix, number.parse().unwrap_or(0), name)
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_configuration_prints_as_slurms_does() {
        let entry = |k: &str, v: &str| api::ConfigEntry { key: k.into(), value: v.into() };
        let all = [entry("MinJobAge", "300 sec"), entry("PriorityWeightFairshare", "10000")];
        let text = super::config_text(&all, 1, None);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("Configuration data as of "), "{text}");
        assert_eq!(lines[1], "MinJobAge               = 300 sec");
        assert_eq!(lines[2], "PriorityWeightFairshare = 10000");
        assert_eq!(super::config_text(&all, 1, Some("minjobage")).lines().count(), 2);
    }

    use super::*;

    #[test]
    fn host_names_and_lists() {
        let list = |s: &str| Some(s.to_string());
        assert_eq!(hosts("hostnames", list("gpu[01-03],cpu7").as_ref()).unwrap(), "gpu01\ngpu02\ngpu03\ncpu7\n");
        assert_eq!(hosts("hostlist", list("n1,n2,n3,n5").as_ref()).unwrap(), "n[1-3,5]\n");
        assert_eq!(hosts("hostlistsorted", list("n10,n9,n1").as_ref()).unwrap(), "n[1,9-10]\n");
        assert!(hosts("hostlist", None).unwrap_err().contains("host list is empty"));
        assert!(hosts("hostnames", list("n[1-").as_ref()).unwrap_err().contains("invalid host list 'n[1-'"));
    }

    #[test]
    fn records_print_as_slurm_prints_them() {
        let lines = vec!["PartitionName=gpu".to_string(), "Default=YES".to_string()];
        assert_eq!(record_text(&lines, false), "PartitionName=gpu\n   Default=YES\n\n");
        assert_eq!(record_text(&lines, true), "PartitionName=gpu Default=YES\n");
        let n = NodeInfo {
            name: "node01".into(),
            state: "drain".into(),
            alloc_cpus: 2,
            cpus: 8,
            connected: false,
            ..Default::default()
        };
        assert_eq!(node_state(&n), "MIXED*+DRAIN");
        let p = PartitionInfo {
            name: "gpu".into(),
            default: true,
            max_time_s: 3600,
            nodes: "node[01-02]".into(),
            ..Default::default()
        };
        let text =
            record_text(&partition_record(&p, &[NodeInfo { partitions: vec!["gpu".into()], cpus: 8, ..n }]), true);
        assert!(
            text.contains("Default=YES DefaultTime=NONE MaxNodes=UNLIMITED MaxTime=1:00:00 Nodes=node[01-02]"),
            "{text}"
        );
        assert!(text.contains("TotalCPUs=8 TotalNodes=1"), "{text}");
        assert!(text.contains("AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL Default=YES"), "{text}");
        let owned = PartitionInfo {
            allow_accounts: vec!["lab".into(), "ops".into()],
            deny_qos: vec!["scavenger".into()],
            ..p.clone()
        };
        let text = record_text(&partition_record(&owned, &[]), true);
        assert!(text.contains("AllowAccounts=lab,ops AllowQos=ALL DenyQos=scavenger Default=YES"), "{text}");
        let scavenger = PartitionInfo { preempt_mode: "SUSPEND".into(), grace_time_s: 30, ..p.clone() };
        let text = record_text(&partition_record(&scavenger, &[]), true);
        assert!(text.contains("GraceTime=30 PreemptMode=SUSPEND"), "{text}");
        assert!(record_text(&partition_record(&p, &[]), true).contains("GraceTime=0 PreemptMode=OFF"));
    }
}
