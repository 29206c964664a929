//! `sreport` (also `quorum report`): what accounts and users used over a period, from the job
//! history and the queue, as Slurm's sreport reports it: `cluster AccountUtilizationByUser`
//! (the cluster's total, each account's, each of its users') and `user TopUsage` (the users who
//! used most), in CPU minutes by default, `-t Hours` or `Seconds`, and `--tres=cpu,gres/gpu` for
//! GPU time beside CPU time. A job counts for the part of its run inside the period: its
//! allocated CPUs (GPUs) times those seconds; a running job counts up to now.

use std::collections::BTreeMap;

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_client::display::local_time_or;
use quorum_proto::api::{self, JobInfo};

use crate::commands::Context;
use crate::sacct::{midnight, parse_time, table, FormArgs};

#[derive(Parser, Debug)]
#[command(
    name = "sreport",
    no_binary_name = true,
    infer_long_args = true,
    about = "Usage by account and user over a period (Quorum's sreport)"
)]
pub struct SreportArgs {
    #[command(flatten)]
    controllers: ControllersArg,
    #[command(flatten)]
    form: FormArgs,
    /// The unit: Minutes (the default), Hours or Seconds.
    #[arg(short = 't', long = "time", default_value = "Minutes")]
    time: String,
    /// What to count, comma-separated: cpu (the default), gres/gpu.
    #[arg(short = 'T', long = "tres", default_value = "cpu")]
    tres: String,
    /// The report (`cluster AccountUtilizationByUser`, `user TopUsage`) and its options
    /// (`start=`, `end=`, `users=`, `accounts=`, `topcount=`).
    #[arg(trailing_var_arg = true, required = true)]
    words: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Report {
    AccountsByUser,
    TopUsers,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Tres {
    Cpu,
    Gpu,
}

impl Tres {
    fn name(self) -> &'static str {
        match self {
            Tres::Cpu => "cpu",
            Tres::Gpu => "gres/gpu",
        }
    }
}

/// What a report asks for, its words parsed.
#[derive(Debug, PartialEq)]
struct Ask {
    report: Report,
    start_ms: u64,
    end_ms: u64,
    users: Vec<String>,
    accounts: Vec<String>,
    top: usize,
}

/// The report's words: `cluster AccountUtilizationByUser start=... end=...`, as sreport takes
/// them (any case, `key=value` options). Times as sacct takes them; by default yesterday.
fn parse_words(words: &[String], now_ms: u64) -> Result<Ask, String> {
    let (kind, name) = match words {
        [kind, name, ..] => (kind.to_ascii_lowercase(), name.to_ascii_lowercase()),
        _ => return Err("give a report: cluster AccountUtilizationByUser, or user TopUsage".into()),
    };
    let report = match (kind.as_str(), name.as_str()) {
        ("cluster", "accountutilizationbyuser") => Report::AccountsByUser,
        ("user", "topusage") => Report::TopUsers,
        _ => {
            return Err(format!(
                "unknown report '{} {}': this sreport has cluster AccountUtilizationByUser and user TopUsage",
                words[0], words[1]
            ))
        }
    };
    let today = midnight(now_ms);
    let mut ask = Ask {
        report,
        start_ms: today.saturating_sub(86_400_000),
        end_ms: today,
        users: Vec::new(),
        accounts: Vec::new(),
        top: 10,
    };
    let list = |v: &str| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
    for word in &words[2..] {
        let (key, value) = word
            .split_once('=')
            .ok_or_else(|| format!("invalid option '{word}': give KEY=VALUE (start=2026-11-01)"))?;
        match key.to_ascii_lowercase().as_str() {
            "start" => ask.start_ms = parse_time(value, now_ms)?,
            "end" => ask.end_ms = parse_time(value, now_ms)?,
            "users" | "user" => ask.users = list(value),
            "accounts" | "account" => ask.accounts = list(value),
            "topcount" => ask.top = value.parse().map_err(|_| format!("invalid topcount '{value}': give a number"))?,
            other => return Err(format!("unknown option '{other}' (known: start, end, users, accounts, topcount)")),
        }
    }
    if ask.end_ms <= ask.start_ms {
        return Err("the period is empty: give an end after its start".into());
    }
    Ok(ask)
}

/// The seconds of `job`'s run inside `[start, end)`, a running job's up to `now`.
fn overlap_s(job: &JobInfo, start_ms: u64, end_ms: u64, now_ms: u64) -> u64 {
    if job.start_time_ms == 0 {
        return 0;
    }
    let ran_to = if job.end_time_ms == 0 { now_ms } else { job.end_time_ms };
    let (from, to) = (job.start_time_ms.max(start_ms), ran_to.min(end_ms));
    to.saturating_sub(from) / 1000
}

/// Each (account, user)'s TRES-seconds.
type Used = BTreeMap<(String, String), BTreeMap<Tres, u64>>;

/// Each (account, user)'s TRES-seconds in the period.
fn usage(jobs: &[JobInfo], ask: &Ask, tres: &[Tres], now_ms: u64) -> Used {
    let mut out = Used::new();
    for job in jobs {
        if (!ask.users.is_empty() && !ask.users.contains(&job.user))
            || (!ask.accounts.is_empty() && !ask.accounts.contains(&job.account))
        {
            continue;
        }
        let secs = overlap_s(job, ask.start_ms, ask.end_ms, now_ms);
        if secs == 0 {
            continue;
        }
        let per = out.entry((job.account.clone(), job.user.clone())).or_default();
        for &t in tres {
            let count: u64 = match t {
                Tres::Cpu => job.allocation.iter().map(|a| u64::from(a.cpus)).sum(),
                Tres::Gpu => job.allocation.iter().map(|a| a.gpus.len() as u64).sum(),
            };
            *per.entry(t).or_default() += count * secs;
        }
    }
    out
}

/// The report's text: sreport's banner (unless `header` is false), then its table.
fn render(
    ask: &Ask,
    tres: &[Tres],
    unit: (&str, u64),
    rows_in: Vec<Vec<String>>,
    parsable: Option<bool>,
    header: bool,
) -> String {
    let fields: Vec<(&'static str, isize)> = match ask.report {
        Report::AccountsByUser => vec![("Cluster", 9), ("Account", 15), ("Login", 9), ("Proper Name", 15)],
        Report::TopUsers => vec![("Cluster", 9), ("Login", 9), ("Proper Name", 15), ("Account", 15)],
    };
    let mut fields = fields;
    if tres.len() > 1 {
        fields.push(("TRES Name", 14));
    }
    fields.extend([("Used", 9), ("Energy", 8)]);
    let mut out = String::new();
    if header {
        let rule = "-".repeat(80);
        let title = match ask.report {
            Report::AccountsByUser => "Cluster/Account/User Utilization".to_string(),
            Report::TopUsers => format!("Top {} Users", ask.top),
        };
        let what = if tres.len() > 1 { "TRES" } else { "CPU" };
        out += &format!(
            "{rule}\n{title} {} - {} ({} secs)\nUsage reported in {what} {}\n{rule}\n",
            local_time_or(ask.start_ms, ""),
            local_time_or(ask.end_ms.saturating_sub(1000), ""),
            (ask.end_ms - ask.start_ms) / 1000,
            unit.0
        );
    }
    out + &table(&fields, rows_in.into_iter(), parsable, header)
}

/// The rows of the report, from each (account, user)'s TRES-seconds.
fn rows(ask: &Ask, tres: &[Tres], used: &Used, per_unit: u64) -> Vec<Vec<String>> {
    let amount = |secs: u64| ((secs + per_unit / 2) / per_unit).to_string();
    let mut out = Vec::new();
    let mut push = |lead: Vec<String>, per: &BTreeMap<Tres, u64>| {
        for &t in tres {
            let mut row = lead.clone();
            if tres.len() > 1 {
                row.push(t.name().to_string());
            }
            row.push(amount(per.get(&t).copied().unwrap_or(0)));
            row.push("0".into());
            out.push(row);
        }
    };
    let sum = |items: &mut dyn Iterator<Item = &BTreeMap<Tres, u64>>| {
        let mut total: BTreeMap<Tres, u64> = BTreeMap::new();
        for per in items {
            for (t, s) in per {
                *total.entry(*t).or_default() += s;
            }
        }
        total
    };
    let name = |s: &str| s.to_string();
    match ask.report {
        Report::AccountsByUser => {
            push(vec![name("quorum"), name("root"), String::new(), String::new()], &sum(&mut used.values()));
            let accounts: Vec<&String> =
                used.keys().map(|(a, _)| a).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
            for account in accounts {
                let mine = used.iter().filter(|((a, _), _)| a == account);
                push(
                    vec![name("quorum"), account.clone(), String::new(), String::new()],
                    &sum(&mut mine.clone().map(|(_, p)| p)),
                );
                for ((_, user), per) in mine {
                    push(vec![name("quorum"), account.clone(), user.clone(), proper_name(user)], per);
                }
            }
        }
        Report::TopUsers => {
            let mut ranked: Vec<_> = used.iter().collect();
            let first = tres[0];
            ranked.sort_by(|a, b| b.1.get(&first).cmp(&a.1.get(&first)).then(a.0.cmp(b.0)));
            for ((account, user), per) in ranked.into_iter().take(ask.top) {
                push(vec![name("quorum"), user.clone(), proper_name(user), account.clone()], per);
            }
        }
    }
    out
}

/// A user's full name from this host's user database (the comment field), as sreport shows it.
fn proper_name(user: &str) -> String {
    let Ok(c) = std::ffi::CString::new(user) else { return String::new() };
    // SAFETY: getpwnam returns a pointer into static storage or null; this reads it at once,
    // on the one thread that asks.
    unsafe {
        let pw = libc::getpwnam(c.as_ptr());
        if pw.is_null() || (*pw).pw_gecos.is_null() {
            return String::new();
        }
        let gecos = std::ffi::CStr::from_ptr((*pw).pw_gecos).to_string_lossy();
        gecos.split(',').next().unwrap_or_default().to_string()
    }
}

pub async fn run(a: SreportArgs) -> anyhow::Result<u8> {
    let local_now = crate::format::now_ms();
    let ask = parse_words(&a.words, local_now).map_err(anyhow::Error::msg)?;
    let unit = match a.time.to_ascii_lowercase().as_str() {
        "minutes" | "m" => ("Minutes", 60),
        "hours" | "h" => ("Hours", 3600),
        "seconds" | "s" => ("Seconds", 1),
        other => anyhow::bail!("invalid --time '{other}': give Minutes, Hours or Seconds"),
    };
    let mut tres = Vec::new();
    for t in a.tres.split(',').map(str::trim) {
        tres.push(match t.to_ascii_lowercase().as_str() {
            "cpu" => Tres::Cpu,
            "gres/gpu" | "gpu" => Tres::Gpu,
            _ => anyhow::bail!("invalid --tres '{t}': give cpu, gres/gpu or both"),
        });
    }
    tres.dedup();
    let ctx = Context { client: a.controllers.client()?, stale: false };
    // Every job that ran into the period: it ended after its start (or has not ended) and was
    // submitted before its end.
    let req = api::ListJobsRequest {
        history: true,
        ended_after_ms: ask.start_ms,
        submitted_before_ms: ask.end_ms,
        user: if ask.users.len() == 1 { ask.users[0].clone() } else { String::new() },
        ..Default::default()
    };
    let all = ctx.list_all_jobs(req).await?;
    let used = usage(&all.jobs, &ask, &tres, all.now_ms);
    let (parsable, header) = (a.form.parsable(), !a.form.noheader);
    print!("{}", render(&ask, &tres, unit, rows(&ask, &tres, &used, unit.1), parsable, header));
    Ok(0)
}

pub fn main(args: &[String]) -> std::process::ExitCode {
    crate::entry::main_of::<SreportArgs, _, _>("sreport", crate::entry::Threads::One, args, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(user: &str, account: &str, cpus: u32, gpus: u32, start_s: u64, end_s: u64) -> JobInfo {
        JobInfo {
            user: user.into(),
            account: account.into(),
            start_time_ms: start_s * 1000,
            end_time_ms: end_s * 1000,
            allocation: vec![api::NodeAllocation {
                node: "n1".into(),
                cpus,
                mem_mb: 0,
                gpus: (0..gpus).collect(),
                het_group: 0,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn usage_counts_the_part_of_each_run_inside_the_period() {
        let words = |w: &str| w.split_whitespace().map(String::from).collect::<Vec<_>>();
        let mut ask =
            parse_words(&words("cluster AccountUtilizationByUser start=now-1hour end=now"), 7_200_000).unwrap();
        assert_eq!((ask.start_ms, ask.end_ms), (3_600_000, 7_200_000));
        // ada: 4 CPUs for the 1000 s inside (of 2000); bob: 2 CPUs and a GPU, 600 s, running.
        let jobs = [
            job("ada", "physics", 4, 0, 2_600, 4_600),
            job("bob", "physics", 2, 1, 6_600, 0),
            job("cy", "bio", 1, 0, 100, 200),
        ];
        let tres = [Tres::Cpu, Tres::Gpu];
        let used = usage(&jobs, &ask, &tres, 7_200_000);
        assert_eq!(used.len(), 2, "cy's job ran before the period: {used:?}");
        let got = rows(&ask, &tres, &used, 1);
        let text: Vec<String> = got.iter().map(|r| r.join("|")).collect();
        assert_eq!(
            text,
            [
                "quorum|root|||cpu|5200|0",
                "quorum|root|||gres/gpu|600|0",
                "quorum|physics|||cpu|5200|0",
                "quorum|physics|||gres/gpu|600|0",
                format!("quorum|physics|ada|{}|cpu|4000|0", proper_name("ada")).as_str(),
                format!("quorum|physics|ada|{}|gres/gpu|0|0", proper_name("ada")).as_str(),
                format!("quorum|physics|bob|{}|cpu|1200|0", proper_name("bob")).as_str(),
                format!("quorum|physics|bob|{}|gres/gpu|600|0", proper_name("bob")).as_str(),
            ]
        );
        ask.report = Report::TopUsers;
        ask.top = 1;
        let top = rows(&ask, &[Tres::Cpu], &used, 60);
        assert_eq!(
            top,
            [vec!["quorum".to_string(), "ada".into(), proper_name("ada"), "physics".into(), "67".into(), "0".into()]]
        );
        let out = render(&ask, &[Tres::Cpu], ("Minutes", 60), top, Some(false), true);
        assert!(
            out.contains("\nTop 1 Users ") && out.contains(" (3600 secs)\nUsage reported in CPU Minutes\n"),
            "{out}"
        );
        let line =
            format!("Cluster|Login|Proper Name|Account|Used|Energy\nquorum|ada|{}|physics|67|0\n", proper_name("ada"));
        assert!(out.ends_with(&line), "{out}");
        assert!(parse_words(&words("job SizesByAccount"), 0).unwrap_err().contains("unknown report"));
        assert!(parse_words(&words("user topusage start=2026-11-02 end=2026-11-01"), 0).unwrap_err().contains("empty"));
        assert!(parse_words(&words("user topusage colour=blue"), 0).unwrap_err().contains("unknown option 'colour'"));
    }
}
