//! `sprio`: pending jobs' priorities and their weighted factors, as Slurm's prints them (a
//! column for each factor whose weight is not zero; `-l` all of them, `-n` the factors
//! normalized, `-w` the weights), in job id order or `-S`'s (`-S -Y`: highest priority first).

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_model::TresWeights;
use quorum_proto::api::{self, JobPriority, PriorityResponse};

use crate::commands::Context;

#[derive(Parser, Debug)]
#[command(
    name = "sprio",
    no_binary_name = true,
    infer_long_args = true,
    disable_help_flag = true,
    about = "Pending jobs' priorities (Quorum's sprio)"
)]
pub struct SprioArgs {
    #[command(flatten)]
    controllers: ControllersArg,
    /// No header line.
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    /// Only these jobs.
    #[arg(short = 'j', long = "jobs", value_delimiter = ',')]
    jobs: Vec<u64>,
    /// Only these users' jobs.
    #[arg(short = 'u', long = "user", value_delimiter = ',')]
    users: Vec<String>,
    /// Only these partitions' jobs.
    #[arg(short = 'p', long = "partition", value_delimiter = ',')]
    partitions: Vec<String>,
    /// Every factor, with the user and nice.
    #[arg(short = 'l', long = "long")]
    long: bool,
    /// The factors normalized (0 to 1), not weighted.
    #[arg(short = 'n', long = "norm")]
    norm: bool,
    /// The weights only.
    #[arg(short = 'w', long = "weights")]
    weights: bool,
    /// The order of the jobs: sprio's field letters, each `+` (increasing, the default) or `-`
    /// (decreasing), comma-separated: `i` job id (the default), `r` partition, `u` user, `Y`
    /// priority, `A` age, `F` fairshare, `J` job size, `P` partition factor, `Q` QOS, `N` nice.
    #[arg(short = 'S', long = "sort", allow_hyphen_values = true)]
    sort: Option<String>,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
}

pub fn main(args: &[String]) -> std::process::ExitCode {
    crate::entry::main_of::<SprioArgs, _, _>("sprio", crate::entry::Threads::One, args, run)
}

/// A factor column: its header, weight, and value in a job.
struct Factor {
    header: &'static str,
    weight: u32,
    value: fn(&JobPriority) -> f64,
}

fn factors(r: &PriorityResponse) -> [Factor; 5] {
    [
        Factor { header: "AGE", weight: r.weight_age, value: |j| j.age },
        Factor { header: "FAIRSHARE", weight: r.weight_fairshare, value: |j| j.fairshare },
        Factor { header: "JOBSIZE", weight: r.weight_job_size, value: |j| j.job_size },
        Factor { header: "PARTITION", weight: r.weight_partition, value: |j| j.partition_factor },
        Factor { header: "QOS", weight: r.weight_qos, value: |j| j.qos },
    ]
}

/// The TRES that weigh (`PriorityWeightTRES`): each one's index in the answer, name and weight.
fn weighing_tres(r: &PriorityResponse) -> Vec<(usize, &str, u32)> {
    let names = r.tres_names.iter().map(String::as_str);
    names
        .zip(r.weight_tres.iter().copied())
        .enumerate()
        .filter(|(_, (_, w))| *w > 0)
        .map(|(i, (n, w))| (i, n, w))
        .collect()
}

/// A job's TRES cell: each weighing TRES's weighted factor (`-n`: the factor itself), as
/// Slurm's `%T` (`%t`) prints them: `cpu=12,gres/gpu=300`, leaving out those that add nothing
/// (a job without GPUs shows no `gres/gpu`), as Slurm's sprio does. `weighing`: [`weighing_tres`].
fn tres_cell(weighing: &[(usize, &str, u32)], j: &JobPriority, norm: bool) -> String {
    let factors = weighing.iter().map(|&(i, name, w)| (name, w, j.tres.get(i).copied().unwrap_or(0.0)));
    let cells = factors.filter(|(_, w, f)| f * f64::from(*w) != 0.0).map(|(name, w, f)| {
        if norm {
            format!("{name}={f:.2}")
        } else {
            format!("{name}={:.0}", f * f64::from(w))
        }
    });
    cells.collect::<Vec<_>>().join(",")
}

/// The sum of every weight, the factors' and the TRES': what a normalised priority divides by
/// (at least 1), in `sprio -n` as in squeue's `%p`.
pub(crate) fn total_weight(r: &PriorityResponse) -> f64 {
    let factors = [r.weight_age, r.weight_fairshare, r.weight_job_size, r.weight_partition, r.weight_qos];
    let all = factors.iter().chain(&r.weight_tres).map(|w| f64::from(*w)).sum::<f64>();
    all.max(1.0)
}

fn render(r: &PriorityResponse, jobs: &[&JobPriority], a: &SprioArgs) -> String {
    let shown: Vec<Factor> = factors(r).into_iter().filter(|f| a.long || f.weight > 0).collect();
    // The TRES column, as Slurm's `%20T`, when some TRES weighs.
    let weighing = weighing_tres(r);
    let tres = !weighing.is_empty();
    let mut out = String::new();
    let mut line = |cells: Vec<String>| {
        out.push_str(cells.join(" ").trim_end());
        out.push('\n');
    };
    let head = |user: bool| {
        let mut cells = vec![format!("{:>15}", "JOBID"), format!("{:<9}", "PARTITION")];
        if user {
            cells.push(format!("{:>8}", "USER"));
        }
        cells.push(format!("{:>10}", "PRIORITY"));
        cells.push(format!("{:>10}", "SITE"));
        cells.extend(shown.iter().map(|f| format!("{:>10}", f.header)));
        if user {
            cells.push(format!("{:>10}", "NICE"));
        }
        if tres {
            cells.push(format!("{:<20}", "TRES"));
        }
        cells
    };
    if a.weights {
        if !a.noheader {
            line(head(false));
        }
        let mut cells =
            vec![format!("{:>15}", "Weights"), format!("{:<9}", ""), format!("{:>10}", ""), format!("{:>10}", 1)];
        cells.extend(shown.iter().map(|f| format!("{:>10}", f.weight)));
        if tres {
            // As Slurm prints `PriorityWeightTRES` there: as `scontrol show config` does.
            let name = |n: &str| TresWeights::config_name(n).map_or_else(|| n.to_string(), str::to_string);
            let weights = weighing.iter().map(|&(_, n, w)| format!("{}={w}", name(n)));
            cells.push(format!("{:<20}", weights.collect::<Vec<_>>().join(",")));
        }
        line(cells);
        return out;
    }
    if !a.noheader {
        line(head(a.long));
    }
    for j in jobs {
        let mut cells = vec![format!("{:>15}", j.job_id), format!("{:<9}", cut(&j.partition, 9))];
        if a.long {
            cells.push(format!("{:>8}", cut(&j.user, 8)));
        }
        if a.norm {
            cells.push(format!("{:>10.7}", j.total / total_weight(r)));
        } else {
            cells.push(format!("{:>10.0}", j.total));
        }
        cells.push(format!("{:>10}", 0));
        for f in &shown {
            let v = (f.value)(j);
            cells.push(if a.norm { format!("{v:>10.7}") } else { format!("{:>10.0}", v * f64::from(f.weight)) });
        }
        if a.long {
            cells.push(format!("{:>10}", j.nice));
        }
        if tres {
            cells.push(format!("{:<20}", tres_cell(&weighing, j, a.norm)));
        }
        line(cells);
    }
    out
}

/// Reads `-S` and puts `jobs` in its order (jobs equal on every key stay in job id order).
fn sort_jobs(jobs: &mut [&JobPriority], sort: &str) -> Result<(), String> {
    enum Key {
        Number(fn(&JobPriority) -> f64),
        Text(fn(&JobPriority) -> &str),
    }
    let mut keys = Vec::new();
    for part in sort.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (decreasing, rest) = match part.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, part.strip_prefix('+').unwrap_or(part)),
        };
        let key = match rest.strip_prefix('%').unwrap_or(rest) {
            "i" => Key::Number(|j| j.job_id as f64),
            "r" => Key::Text(|j| &j.partition),
            "u" => Key::Text(|j| &j.user),
            "Y" | "y" => Key::Number(|j| j.total),
            "A" | "a" => Key::Number(|j| j.age),
            "F" | "f" => Key::Number(|j| j.fairshare),
            "J" | "j" => Key::Number(|j| j.job_size),
            "P" | "p" => Key::Number(|j| j.partition_factor),
            "Q" | "q" => Key::Number(|j| j.qos),
            "N" => Key::Number(|j| f64::from(j.nice)),
            _ => return Err(format!("invalid --sort key '{part}' (fields: i r u Y A F J P Q N)")),
        };
        keys.push((key, decreasing));
    }
    jobs.sort_by(|a, b| {
        for (key, decreasing) in &keys {
            let order = match key {
                Key::Number(f) => f(a).total_cmp(&f(b)),
                Key::Text(f) => f(a).cmp(f(b)),
            };
            let order = if *decreasing { order.reverse() } else { order };
            if order.is_ne() {
                return order;
            }
        }
        std::cmp::Ordering::Equal
    });
    Ok(())
}

fn cut(text: &str, width: usize) -> String {
    quorum_client::display::escape(text).chars().take(width).collect()
}

pub async fn run(a: SprioArgs) -> anyhow::Result<u8> {
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let req = api::PriorityRequest { job_ids: a.jobs.clone() };
    let r = ctx.send(req, |mut c, r| async move { c.priorities(r).await }).await?;
    let mut jobs: Vec<&JobPriority> = r
        .jobs
        .iter()
        .filter(|j| a.jobs.is_empty() || a.jobs.contains(&j.job_id))
        .filter(|j| a.users.is_empty() || a.users.contains(&j.user))
        .filter(|j| a.partitions.is_empty() || a.partitions.contains(&j.partition))
        .collect();
    jobs.sort_by_key(|j| j.job_id);
    sort_jobs(&mut jobs, a.sort.as_deref().unwrap_or("i")).map_err(anyhow::Error::msg)?;
    print!("{}", render(&r, &jobs, &a));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_follow_the_weights_as_slurms_do() {
        let r = PriorityResponse {
            jobs: vec![JobPriority {
                job_id: 7,
                partition: "gpu".into(),
                user: "alice".into(),
                total: 1500.0,
                age: 0.5,
                job_size: 0.25,
                ..Default::default()
            }],
            weight_age: 1000,
            weight_job_size: 2000,
            ..Default::default()
        };
        let args = |extra: &[&str]| SprioArgs::try_parse_from(extra).unwrap();
        let jobs: Vec<&JobPriority> = r.jobs.iter().collect();
        assert_eq!(
            render(&r, &jobs, &args(&[])),
            "          JOBID PARTITION   PRIORITY       SITE        AGE    JOBSIZE\n              7 gpu             1500          0        500        500\n"
        );
        let long = render(&r, &jobs, &args(&["-l", "-h"]));
        assert_eq!(long, "              7 gpu          alice       1500          0        500          0        500          0          0          0\n");
        // -S: highest priority first, then by user.
        let three = [(3, "bob", 10.0), (4, "alice", 30.0), (5, "carol", 10.0)]
            .map(|(job_id, user, total)| JobPriority { job_id, user: user.into(), total, ..Default::default() });
        let mut sorted: Vec<&JobPriority> = three.iter().collect();
        sort_jobs(&mut sorted, "-Y,u").unwrap();
        assert_eq!(sorted.iter().map(|j| j.job_id).collect::<Vec<_>>(), [4, 3, 5]);
        sort_jobs(&mut sorted, "i").unwrap();
        assert_eq!(sorted.iter().map(|j| j.job_id).collect::<Vec<_>>(), [3, 4, 5]);
        assert!(sort_jobs(&mut sorted, "Z").unwrap_err().contains("'Z'"));
        assert_eq!(args(&["-S", "-Y"]).sort.as_deref(), Some("-Y"), "-S takes a decreasing key");
        assert_eq!(
            render(&r, &jobs, &args(&["-w"])),
            "          JOBID PARTITION   PRIORITY       SITE        AGE    JOBSIZE\n        Weights                               1       1000       2000\n"
        );
    }

    /// `PriorityWeightTRES`: a TRES column, as Slurm's `%20T`, of the weighted factors of the
    /// TRES that weigh (`-n`: the factors; `-w`: the weights); none when none weighs.
    #[test]
    fn a_tres_column_shows_the_weighted_tres_factors() {
        let names = ["cpu", "mem", "node", "gres/gpu"].map(String::from).to_vec();
        let r = PriorityResponse {
            jobs: vec![JobPriority {
                job_id: 9,
                partition: "gpu".into(),
                total: 1800.0,
                age: 0.5,
                tres: vec![0.25, 0.0, 0.5, 0.3],
                ..Default::default()
            }],
            weight_age: 1000,
            tres_names: names.clone(),
            weight_tres: vec![1000, 0, 0, 4000],
            ..Default::default()
        };
        let args = |extra: &[&str]| SprioArgs::try_parse_from(extra).unwrap();
        let jobs: Vec<&JobPriority> = r.jobs.iter().collect();
        assert_eq!(
            render(&r, &jobs, &args(&[])),
            "          JOBID PARTITION   PRIORITY       SITE        AGE TRES\n              9 gpu             1800          0        500 cpu=250,gres/gpu=1200\n"
        );
        assert_eq!(
            render(&r, &jobs, &args(&["-n", "-h"])),
            "              9 gpu        0.3000000          0  0.5000000 cpu=0.25,gres/gpu=0.30\n"
        );
        assert_eq!(
            render(&r, &jobs, &args(&["-w", "-h"])),
            "        Weights                               1       1000 CPU=1000,GRES/gpu=4000\n"
        );
        // A weighing TRES the job does not ask for is left out, as Slurm's sprio leaves it.
        let cpus_only = JobPriority { tres: vec![0.25, 0.0, 0.5, 0.0], ..r.jobs[0].clone() };
        let row = render(&r, &[&cpus_only], &args(&["-h"]));
        assert!(row.trim_end().ends_with(" cpu=250"), "{row}");
        let none = PriorityResponse { weight_tres: vec![0; 4], ..r.clone() };
        assert!(!render(&none, &jobs, &args(&[])).contains("TRES"));
    }
}
