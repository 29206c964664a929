//! `quorum simulate`: replays an SWF trace through the production scheduler in virtual time and
//! reports the schedule's quality, beside what the real machine did when the trace records it.

use std::fmt::Write;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use quorum_control::config::ClusterSettings;
use quorum_control::model::parse::{format_duration, parse_time_limit};
use quorum_control::model::reservation::ResvRequest;
use quorum_control::model::BackfillOrder;
use quorum_control::sim::metrics::{Metrics, Report};
use quorum_control::sim::swf::{self, Trace};
use quorum_control::sim::{svg, Estimates, PolicyName, Progress, SimOptions, SimResult, Simulation};

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// A workload trace in the Standard Workload Format, plain or gzipped.
    pub trace: PathBuf,
    /// fcfs, easy, conservative, multifactor or sjf (default: the config's scheduler section,
    /// or easy without a config).
    #[arg(long, value_parser = |s: &str| s.parse::<PolicyName>())]
    pub policy: Option<PolicyName>,
    /// Nodes of the machine (default: the trace's MaxNodes header).
    #[arg(long)]
    pub nodes: Option<u32>,
    /// CPUs per node (default: MaxProcs / MaxNodes from the header, or 1).
    #[arg(long)]
    pub cpus_per_node: Option<u32>,
    /// Give every job whole nodes instead of just its processors.
    #[arg(long)]
    pub whole_nodes: bool,
    /// A controller config file: partitions, [scheduler] weights, QOS, accounts, switches.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Conservative backfill: how many blocked jobs get reservations (default: all).
    #[arg(long)]
    pub reservations: Option<u32>,
    /// An advance reservation, in scontrol's words, made before the first job: "ReservationName=m
    /// StartTime=now+2days Duration=4:00:00 NodeCnt=16 Users=root Flags=MAINT,WEEKLY" (now: the
    /// trace's start). The trace's jobs keep off its nodes over its windows. Repeatable.
    #[arg(long, value_name = "WORDS")]
    pub reserve: Vec<String>,
    /// Let a job that runs past its requested time run its recorded time instead of killing it.
    #[arg(long)]
    pub no_kill: bool,
    /// Backfill on run times predicted from each user's last two jobs (capped by the time
    /// limit) instead of the limits, as `[scheduler] predict = true` does.
    #[arg(long)]
    pub predict: bool,
    /// In what order backfill tries the jobs behind the reservation(s): `priority` (the
    /// queue's) or `shortest` (shortest planned run time first: with --predict, Tsafrir et al.'s
    /// EASY++), as `[scheduler] backfill_order` does (default: the config's, or shortest).
    #[arg(long, value_name = "ORDER", value_parser = quorum_control::config::parse_backfill_order)]
    pub backfill_order: Option<BackfillOrder>,
    /// Estimate every waiting job's start after every cycle, and report how close the
    /// estimates came (the one at submit, and the last before the start): `forecasts` (the
    /// default) as the leader shows them, on predicted run times whatever the schedule is
    /// planned on; `schedule` on what the schedule is planned on (limits, unless --predict).
    #[arg(long, value_name = "ON", num_args = 0..=1, default_missing_value = "forecasts", value_parser = parse_estimates)]
    pub estimates: Option<Estimates>,
    /// Replay from the job with this number.
    #[arg(long)]
    pub from: Option<u64>,
    /// Replay this many jobs.
    #[arg(long)]
    pub count: Option<usize>,
    /// Print the results as JSON (the keys are in the manual's simulator page).
    #[arg(long)]
    pub json: bool,
    /// Draw the schedule (nodes × time) to this SVG file.
    #[arg(long)]
    pub gantt: Option<PathBuf>,
    /// Where the Gantt window starts, as time since the trace's start ([days-]hh:mm:ss;
    /// default: the first replayed submit).
    #[arg(long)]
    pub gantt_from: Option<String>,
    /// How long the Gantt window is.
    #[arg(long, default_value = "2-00:00:00")]
    pub gantt_span: String,
    /// Write every replayed job's schedule to this CSV file, one line per job in trace order:
    /// its number, user, processors, submit, start, end, wait, recorded run time and limit (s;
    /// start, end and wait empty for a job that never started), whether it was killed at its
    /// limit, and its start estimates (with --estimates).
    #[arg(long, value_name = "FILE")]
    pub jobs: Option<PathBuf>,
    /// Draw queue length and utilization over time to this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// No progress line on standard error.
    #[arg(long, short)]
    pub quiet: bool,
}

fn duration_arg(flag: &str, v: &str) -> anyhow::Result<u64> {
    match parse_time_limit(v) {
        Ok(Some(s)) => Ok(s),
        Ok(None) => anyhow::bail!("{flag} {v}: give a finite time"),
        Err(e) => anyhow::bail!("{flag}: {e}"),
    }
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let gantt_span = duration_arg("--gantt-span", &args.gantt_span)?;
    let gantt_from = args.gantt_from.as_deref().map(|v| duration_arg("--gantt-from", v)).transpose()?;
    let settings = match &args.config {
        Some(path) => Some(ClusterSettings::load(path)?),
        None => None,
    };
    // Simulated time starts at 0: `now` is the trace's start.
    let time =
        |key: &str, value: &str| quorum_client::submit::parse_begin(value, 0).map_err(|e| e.replace("--begin", key));
    let reserve = args
        .reserve
        .iter()
        .map(|w| {
            let words: Vec<String> = w.split_whitespace().map(String::from).collect();
            ResvRequest::from_words(&words, &time).map_err(|e| anyhow::anyhow!("--reserve '{w}': {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    let trace = swf::read(&args.trace)?;
    let opts = SimOptions {
        nodes: args.nodes,
        cpus_per_node: args.cpus_per_node,
        whole_nodes: args.whole_nodes,
        policy: args.policy,
        reservations: args.reservations,
        settings,
        no_kill: args.no_kill,
        from: args.from,
        count: args.count,
        samples: args.plot.is_some(),
        reserve,
        predict: args.predict,
        backfill_order: args.backfill_order,
        estimates: args.estimates,
    };
    let sim = Simulation::new(&trace, &opts)?;
    let show_progress = !args.quiet;
    let tty = std::io::stderr().is_terminal();
    let mut last = Instant::now();
    let mut printed = false;
    let result = sim.run(&mut |p: &Progress| {
        if show_progress && last.elapsed() >= Duration::from_secs(if tty { 1 } else { 5 }) {
            last = Instant::now();
            let line = progress_line(p, started.elapsed());
            if tty {
                eprint!("\r{line}\x1b[K");
            } else {
                eprintln!("{line}");
            }
            printed = true;
        }
    });
    if printed && tty {
        eprintln!();
    }
    if show_progress {
        eprintln!(
            "simulate: {} jobs replayed in {:.2} s ({} scheduling cycles)",
            result.jobs.len(),
            started.elapsed().as_secs_f64(),
            result.cycles
        );
    }
    let report = Report::of(&result);
    let name = args.trace.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json(&name, &trace, &result, &report))?);
    } else {
        print!("{}", table(&name, &trace, &result, &report));
    }
    if let Some(path) = &args.gantt {
        let from = gantt_from.unwrap_or_else(|| result.jobs.first().map_or(0, |j| j.submit_s));
        std::fs::write(path, svg::gantt(&result, from, from.saturating_add(gantt_span)))
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.jobs {
        std::fs::write(path, jobs_csv(&result)).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, svg::plot(&result)).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

/// `--jobs`: the schedule, job by job.
fn jobs_csv(r: &SimResult) -> String {
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    let mut out = String::from(
        "number,user,procs,submit_s,start_s,end_s,wait_s,run_s,limit_s,killed,estimate_at_submit_s,estimate_last_s\n",
    );
    for j in &r.jobs {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            j.number,
            j.user,
            j.procs,
            j.submit_s,
            opt(j.start_s),
            opt(j.end_s),
            opt(j.wait_s()),
            j.run_s,
            j.limit_s,
            j.killed,
            opt(j.estimate_at_submit_s),
            opt(j.estimate_last_s)
        );
    }
    out
}

fn progress_line(p: &Progress, elapsed: Duration) -> String {
    format!(
        "simulate: {}/{} jobs submitted, {} done, {} waiting, virtual time {}, {} cycles, {:.0} s",
        p.submitted,
        p.total,
        p.ended,
        p.pending,
        format_duration(p.t_s),
        p.cycles,
        elapsed.as_secs_f64()
    )
}

fn json(name: &str, trace: &Trace, r: &SimResult, report: &Report) -> serde_json::Value {
    let mut v = serde_json::to_value(report).expect("a report serializes");
    let obj = v.as_object_mut().expect("an object");
    obj.insert("trace".into(), name.into());
    obj.insert("trace_jobs".into(), trace.jobs.len().into());
    obj.insert("policy".into(), r.policy_name.clone().into());
    obj.insert("machine".into(), serde_json::to_value(&r.machine).expect("serializes"));
    obj.insert("cycles".into(), r.cycles.into());
    obj.insert("reservations".into(), r.reservations.iter().map(|v| v.name.clone()).collect());
    obj.insert("skipped".into(), serde_json::to_value(&r.skipped).expect("serializes"));
    obj.insert(
        "rejected".into(),
        r.rejected.iter().map(|(n, why)| serde_json::json!({"job": n, "reason": why})).collect(),
    );
    v
}

fn hms(s: f64) -> String {
    format!("{} ({s:.0} s)", format_duration(s.round() as u64))
}

fn table(name: &str, trace: &Trace, r: &SimResult, report: &Report) -> String {
    let mut out = String::new();
    let m = &r.machine;
    let p = &r.policy;
    let _ = writeln!(out, "trace        {name}: {} records, {} replayed", trace.jobs.len(), r.jobs.len());
    let _ = writeln!(
        out,
        "machine      {} nodes × {} CPUs ({} CPUs), {} allocation",
        m.nodes,
        m.cpus_per_node,
        m.total_cpus(),
        if m.whole_nodes { "whole-node" } else { "per-processor" }
    );
    let _ = writeln!(
        out,
        "policy       {} ({:?} order, {:?} backfill{}, bf_window {}){}",
        r.policy_name,
        p.ordering,
        p.backfill,
        if p.backfill == quorum_control::model::BackfillMode::Conservative {
            format!(
                " with {} reservations",
                if p.reservations == u32::MAX { "all".into() } else { p.reservations.to_string() }
            )
        } else {
            String::new()
        },
        format_duration(p.bf_window_s),
        match (p.predict, p.backfill_order) {
            (false, BackfillOrder::Priority) => "",
            (true, BackfillOrder::Priority) => ", on predicted run times",
            (false, BackfillOrder::Shortest) => ", backfill shortest limit first",
            (true, BackfillOrder::Shortest) => ", on predicted run times, backfill shortest first",
        }
    );
    for v in &r.reservations {
        let names: Vec<&str> = v.nodes.iter().map(String::as_str).collect();
        let _ = writeln!(
            out,
            "reserved     {}: {} from {} for {}{}",
            v.name,
            quorum_control::model::hostlist::compress(&names),
            format_duration(v.start_ms / 1000),
            v.duration_ms().map_or_else(|| "ever".to_string(), |d| format_duration(d / 1000)),
            match v.flags.names().join(",") {
                f if f.is_empty() => String::new(),
                f => format!(" ({f})"),
            }
        );
    }
    for (why, n) in &r.skipped {
        let _ = writeln!(out, "skipped      {n} records: {why}");
    }
    if !r.rejected.is_empty() {
        let (job, why) = &r.rejected[0];
        let _ = writeln!(out, "rejected     {} jobs at submit; the first, job {job}: {why}", r.rejected.len());
    }
    if report.never_started > 0 {
        let _ = writeln!(out, "never ran    {} jobs", report.never_started);
    }
    let _ = writeln!(out, "killed       {} jobs at their time limit", report.killed_at_limit);
    if report.preemptions > 0 {
        let _ = writeln!(out, "preempted    {} times ({} jobs)", report.preemptions, report.preempted_jobs);
    }
    out.push('\n');
    let s = &report.simulated;
    let rec = report.recorded.as_ref();
    let _ = writeln!(out, "{:<14} {:>26} {:>26}", "", "simulated", if rec.is_some() { "recorded" } else { "" });
    let row = |out: &mut String, label: &str, f: &dyn Fn(&Metrics) -> String| {
        let _ = writeln!(out, "{label:<14} {:>26} {:>26}", f(s), rec.map(f).unwrap_or_default());
    };
    row(&mut out, "jobs", &|m| m.jobs.to_string());
    row(&mut out, "makespan", &|m| hms(m.makespan_s as f64));
    row(&mut out, "utilization", &|m| format!("{:.1}%", m.utilization * 100.0));
    row(&mut out, "wait mean", &|m| hms(m.wait_mean_s));
    row(&mut out, "wait median", &|m| hms(m.wait_median_s as f64));
    row(&mut out, "wait p95", &|m| hms(m.wait_p95_s as f64));
    row(&mut out, "wait p99", &|m| hms(m.wait_p99_s as f64));
    row(&mut out, "wait max", &|m| hms(m.wait_max_s as f64));
    row(&mut out, "bsld mean", &|m| format!("{:.2}", m.bsld_mean));
    out.push('\n');
    if let Some(e) = &report.estimates {
        let _ = writeln!(
            out,
            "start estimates of the jobs that waited {} or more (|estimate - start|)",
            format_duration(quorum_control::sim::metrics::ESTIMATED_WAIT_S)
        );
        let _ =
            writeln!(out, "{:<14} {:>7} {:>26} {:>26} {:>26} {:>8}", "", "jobs", "mean", "median", "p90", "≤10 min");
        for (label, k) in [("at submit", &e.at_submit), ("last", &e.last)] {
            let _ = writeln!(
                out,
                "{label:<14} {:>7} {:>26} {:>26} {:>26} {:>7.1}%",
                k.jobs,
                hms(k.mean_abs_s),
                hms(k.median_abs_s as f64),
                hms(k.p90_abs_s as f64),
                k.within_10_min * 100.0
            );
        }
        out.push('\n');
    }
    let mut users: Vec<(&String, usize)> = s.per_user.iter().map(|(u, m)| (u, m.jobs)).collect();
    users.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let _ = writeln!(out, "mean wait of the {} busiest users (of {}; all in --json)", users.len().min(10), users.len());
    let _ = writeln!(
        out,
        "{:<14} {:>6} {:>19} {:>19}",
        "user",
        "jobs",
        "simulated",
        if rec.is_some() { "recorded" } else { "" }
    );
    for (u, jobs) in users.into_iter().take(10) {
        let recorded = rec.and_then(|m| m.per_user.get(u)).map(|m| format_duration(m.wait_mean_s.round() as u64));
        let _ = writeln!(
            out,
            "{u:<14} {jobs:>6} {:>19} {:>19}",
            format_duration(s.per_user[u].wait_mean_s.round() as u64),
            recorded.unwrap_or_default()
        );
    }
    out
}

/// `--estimates`' value: `forecasts` or `schedule`.
fn parse_estimates(text: &str) -> Result<Estimates, String> {
    match text {
        "forecasts" => Ok(Estimates::Forecasts),
        "schedule" => Ok(Estimates::Schedule),
        other => Err(format!("unknown estimates '{other}' (forecasts, schedule)")),
    }
}
