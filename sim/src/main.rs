//! `quorum-sim`: runs seeds of the deterministic simulation and prints each verdict (see
//! `jepsen/README.md`, "The simulator").

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use quorum_sim::{Bug, Fault, Mix, Options};

#[derive(Parser)]
#[command(
    name = "quorum-sim",
    about = "A deterministic simulation of Quorum's control plane, judged by jepsen's checkers"
)]
struct Args {
    /// Runs this seed.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Runs seeds A..B (B excluded).
    #[arg(long, value_parser = parse_range)]
    seeds: Option<(u64, u64)>,
    /// Simulated seconds of clients and faults.
    #[arg(long, default_value_t = 20.0)]
    time: f64,
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=7))]
    replicas: u8,
    /// The faults to choose from (default: all).
    #[arg(long, value_delimiter = ',', value_enum)]
    faults: Option<Vec<Fault>>,
    /// No faults at all.
    #[arg(long, conflicts_with = "faults")]
    no_faults: bool,
    /// Runs a deliberately broken build of the simulated shells.
    #[arg(long, value_enum)]
    bug: Option<Bug>,
    /// Chance that a message is lost.
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// Chance that a Raft message is delivered twice.
    #[arg(long, default_value_t = 0.02)]
    duplicate: f64,
    /// Prints every line of the trace.
    #[arg(long)]
    trace: bool,
    /// Which workload: `full` (every feature it has), or an earlier one, whose seeds replay as
    /// they ran when it was all there was: `multi-node` (before job arrays), `single-node`.
    #[arg(long, value_enum, default_value_t = Mix::Full)]
    workload: Mix,
    /// The same as `--workload single-node`.
    #[arg(long, conflicts_with = "workload")]
    single_node: bool,
    /// Ended jobs stay in the queue (no job history): the seeds of the whole workload found
    /// before the simulator had the history replay as they ran.
    #[arg(long)]
    no_history: bool,
    /// A job of steps runs as one job as long as its steps (no `srun`): the seeds of the whole
    /// workload found before the simulator had steps replay as they ran.
    #[arg(long)]
    no_steps: bool,
    /// With --seeds: stops at the first seed that finds a violation.
    #[arg(long)]
    first: bool,
}

fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s.split_once("..").ok_or_else(|| format!("'{s}' is not a range A..B"))?;
    let a: u64 = a.parse().map_err(|_| format!("'{a}' is not a seed"))?;
    let b: u64 = b.parse().map_err(|_| format!("'{b}' is not a seed"))?;
    if b <= a {
        return Err(format!("the range {a}..{b} is empty"));
    }
    Ok((a, b))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (from, to) = match (args.seed, args.seeds) {
        (Some(s), _) => (s, s + 1),
        (None, Some(r)) => r,
        (None, None) => (1, 2),
    };
    let (mut invalid, mut runs) = (0u64, 0u64);
    let began = Instant::now();
    let mut simulated = 0.0;
    for seed in from..to {
        let mut opts = Options::new(seed);
        opts.time_s = args.time;
        opts.replicas = usize::from(args.replicas);
        opts.bug = args.bug;
        opts.loss = args.loss;
        opts.duplicate = args.duplicate;
        opts.verbose = args.trace;
        opts.workload = workload(&args);
        opts.history = !args.no_history;
        opts.steps = !args.no_steps;
        if args.no_faults {
            opts.faults.clear();
        } else if let Some(f) = &args.faults {
            opts.faults = f.clone();
        }
        let report = match quorum_sim::run(opts) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("seed {seed}: {e:#}");
                return ExitCode::from(2);
            }
        };
        simulated += report.simulated.as_secs_f64();
        runs += 1;
        println!("{}", report.line());
        if !report.valid() {
            invalid += 1;
            for p in &report.problems {
                println!("  {p}");
            }
            println!("  replay: {}", replay(&args, seed));
            if args.first {
                break;
            }
        }
    }
    let wall = began.elapsed().as_secs_f64();
    if to - from > 1 {
        println!(
            "{runs} seeds, {invalid} invalid; {:.0} simulated s in {wall:.1} s ({:.1} simulated s per s, {:.1} seeds per minute)",
            simulated,
            simulated / wall,
            runs as f64 * 60.0 / wall
        );
    }
    if invalid > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn workload(args: &Args) -> Mix {
    match args.single_node {
        true => Mix::SingleNode,
        false => args.workload,
    }
}

/// The command that replays one seed of this invocation.
fn replay(args: &Args, seed: u64) -> String {
    let mut cmd = format!("jepsen/sim --seed {seed} --time {}", args.time);
    if args.replicas != 3 {
        cmd.push_str(&format!(" --replicas {}", args.replicas));
    }
    if args.no_faults {
        cmd.push_str(" --no-faults");
    }
    if workload(args) != Mix::Full {
        let name =
            clap::ValueEnum::to_possible_value(&workload(args)).map_or(String::new(), |v| v.get_name().to_string());
        cmd.push_str(&format!(" --workload {name}"));
    }
    if args.no_history && workload(args) == Mix::Full {
        cmd.push_str(" --no-history");
    }
    if args.no_steps && workload(args) == Mix::Full {
        cmd.push_str(" --no-steps");
    }
    if let Some(f) = &args.faults {
        let names: Vec<String> = f
            .iter()
            .map(|f| clap::ValueEnum::to_possible_value(f).map_or(String::new(), |v| v.get_name().to_string()))
            .collect();
        cmd.push_str(&format!(" --faults {}", names.join(",")));
    }
    if let Some(b) = args.bug {
        cmd.push_str(&format!(
            " --bug {}",
            clap::ValueEnum::to_possible_value(&b).map_or(String::new(), |v| v.get_name().to_string())
        ));
    }
    if args.loss != 0.01 {
        cmd.push_str(&format!(" --loss {}", args.loss));
    }
    if args.duplicate != 0.02 {
        cmd.push_str(&format!(" --duplicate {}", args.duplicate));
    }
    cmd
}
