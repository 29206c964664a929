//! `quorum-jepsen`: see `jepsen/README.md`. `jepsen/run` builds the binaries and calls this.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use quorum_jepsen::cluster::Binaries;
use quorum_jepsen::nemesis::{KINDS, NOT_IN_ALL};
use quorum_jepsen::run::{run, Options, Verdict};

#[derive(Parser)]
#[command(version, about = "Randomized faults against a real Quorum cluster, judged by history checkers")]
struct Args {
    /// The seed of the run's faults and operations (default: from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// How long clients and faults run, like 60s or 2m.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    time: Duration,
    /// Faults, comma-separated, or `all`: partition, one-way, isolate-leader, kill, lose-unsynced,
    /// kill-agent, pause, clock, clock-rate, crash-point, transfer, all-down, membership,
    /// slow-disk, upgrade;
    /// freeze-node only by name (it finds a known bound, RESULTS.md); `none` for a run without
    /// faults.
    #[arg(long, default_value = "all")]
    nemesis: String,
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    #[arg(long, default_value_t = 3)]
    agents: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 5)]
    workers: usize,
    /// Where the run keeps its cluster's data, logs and history (default:
    /// /tmp/quorum-jepsen/seed-N). Removed after a valid run unless --keep.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Where quorum-controller and quorum-agent are (default: beside this program).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// The previous release's quorum-controller and quorum-agent (`jepsen/build-old TAG`
    /// builds them): the upgrade nemesis rolls the cluster onto them and back. Without it, the
    /// upgrade nemesis restarts each daemon on this release.
    #[arg(long)]
    old_bin_dir: Option<PathBuf>,
    #[arg(long)]
    keep: bool,
    /// Runs this many seeds one after another (seed, seed+1, ...), one line each.
    #[arg(long, default_value_t = 1)]
    runs: u64,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().map_err(|_| format!("invalid duration '{s}': give seconds, like 60s or 2m"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        _ => Err(format!("invalid duration '{s}': the unit is s or m")),
    }
}

fn nemeses(s: &str) -> Result<Vec<String>, String> {
    match s.trim() {
        "all" => Ok(KINDS.iter().filter(|k| !NOT_IN_ALL.contains(k)).map(|k| k.to_string()).collect()),
        "none" => Ok(Vec::new()),
        list => list
            .split(',')
            .map(|k| match KINDS.contains(&k.trim()) {
                true => Ok(k.trim().to_string()),
                false => Err(format!("unknown nemesis '{k}': the kinds are {}", KINDS.join(", "))),
            })
            .collect(),
    }
}

fn line(v: &Verdict, time: Duration) -> String {
    format!(
        "seed {} ({}s): {} — {} operations ({} ok, {} unknown), {} faults, served again {:.1}s after the last heal",
        v.seed,
        time.as_secs(),
        if v.valid() { "VALID".to_string() } else { format!("INVALID ({} violations)", v.problems.len()) },
        v.ops,
        v.ok,
        v.unknown,
        v.faults.len(),
        v.recovery.as_secs_f64()
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let kinds = match nemeses(&args.nemesis) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("quorum-jepsen: {e}");
            return ExitCode::from(2);
        }
    };
    let bin_dir = args.bin_dir.clone().unwrap_or_else(|| {
        std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.to_path_buf())).unwrap_or_default()
    });
    let bins = match Binaries::in_dir(&bin_dir) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("quorum-jepsen: {e}");
            return ExitCode::from(2);
        }
    };
    let old_bins = match args.old_bin_dir.as_deref().map(Binaries::in_dir).transpose() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("quorum-jepsen: --old-bin-dir: {e}");
            return ExitCode::from(2);
        }
    };
    let first = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(1)
    });
    let mut failed = 0;
    for seed in first..first + args.runs {
        let dir = match &args.dir {
            Some(d) if args.runs == 1 => d.clone(),
            Some(d) => d.join(format!("seed-{seed}")),
            None => PathBuf::from(format!("/tmp/quorum-jepsen/seed-{seed}")),
        };
        let _ = std::fs::remove_dir_all(&dir);
        let opts = Options {
            seed,
            time: args.time,
            nemeses: kinds.clone(),
            replicas: args.replicas,
            agents: args.agents,
            workers: args.workers,
            dir: dir.clone(),
            bins: bins.clone(),
            old_bins: old_bins.clone(),
        };
        eprintln!(
            "quorum-jepsen: seed {seed}, {}s, nemesis {}, in {}",
            args.time.as_secs(),
            args.nemesis,
            dir.display()
        );
        match run(&opts).await {
            Ok(v) => {
                println!("{}", line(&v, args.time));
                for f in &v.faults {
                    eprintln!("  fault: {f}");
                }
                for p in &v.problems {
                    println!("  {p}");
                }
                if v.valid() && !args.keep {
                    let _ = std::fs::remove_dir_all(&dir);
                } else {
                    let _ = std::fs::write(
                        dir.join("verdict.txt"),
                        format!("{}\n{}\n", line(&v, args.time), v.problems.join("\n")),
                    );
                    eprintln!("  kept: {} (history.jsonl, schedule.txt, logs)", dir.display());
                }
                failed += u32::from(!v.valid());
            }
            Err(e) => {
                println!("seed {seed}: the run itself failed: {e:#}");
                eprintln!("  kept: {}", dir.display());
                failed += 1;
            }
        }
    }
    match failed {
        0 => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    }
}
