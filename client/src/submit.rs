//! `quorum submit`: options from the command line and from `#SBATCH` lines in a batch script,
//! validated and turned into the API's job spec. Command-line options win over the script's, as
//! with sbatch. Every error names the bad value, and for a script line, the line.

use std::path::{Path, PathBuf};

use clap::Parser;
use quorum_model::parse;
use quorum_proto::api;

/// The options a job takes, on the command line or in `#SBATCH` lines.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct SubmitOpts {
    /// Job name.
    #[arg(short = 'J', long = "job-name")]
    pub job_name: Option<String>,
    /// Partition (default: the cluster's default partition).
    #[arg(short = 'p', long)]
    pub partition: Option<String>,
    /// Number of nodes, all allocated together.
    #[arg(short = 'N', long)]
    pub nodes: Option<u32>,
    /// Number of tasks (default: one per node).
    #[arg(short = 'n', long)]
    pub ntasks: Option<u32>,
    /// CPUs per task.
    #[arg(short = 'c', long = "cpus-per-task")]
    pub cpus_per_task: Option<u32>,
    /// Memory per node, like 4G or 512M.
    #[arg(long)]
    pub mem: Option<String>,
    /// GPUs for the whole job: [type:]N, spread evenly over the nodes.
    #[arg(long)]
    pub gpus: Option<String>,
    /// Generic resources per node: gpu:[type:]N.
    #[arg(long)]
    pub gres: Option<String>,
    /// Time limit: minutes, [H:]M:S, or D-H[:M[:S]].
    #[arg(short = 't', long)]
    pub time: Option<String>,
    /// Standard output file (default quorum-%j.out in the working directory).
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// Standard error file (default: with the output).
    #[arg(short = 'e', long)]
    pub error: Option<String>,
    /// Working directory (default: where you submit from).
    #[arg(short = 'D', long)]
    pub chdir: Option<String>,
    /// Wait for other jobs: afterok:ID[:ID...],afterany:ID,afternotok:ID,after:ID,singleton.
    #[arg(short = 'd', long)]
    pub dependency: Option<String>,
    /// Not before: now+N[s|m|h|d] or YYYY-MM-DDTHH:MM[:SS] (UTC).
    #[arg(long)]
    pub begin: Option<String>,
    /// Submit held; `quorum release` lets it run.
    #[arg(short = 'H', long)]
    pub hold: bool,
    /// Quality of service.
    #[arg(short = 'q', long)]
    pub qos: Option<String>,
    /// Account to charge (default: your first account).
    #[arg(short = 'A', long)]
    pub account: Option<String>,
    /// Lower the priority by this much (negative: raise it; root only).
    #[arg(long, allow_hyphen_values = true)]
    pub nice: Option<i32>,
    /// Node features required, `a&b` or `a,b`.
    #[arg(short = 'C', long)]
    pub constraint: Option<String>,
    /// Whole nodes only.
    #[arg(long)]
    pub exclusive: bool,
    /// Back to the queue if a node it runs on fails (default: it ends NODE_FAIL).
    #[arg(long, conflicts_with = "no_requeue")]
    pub requeue: bool,
    /// End NODE_FAIL if a node it runs on fails (the default; overrides a script's --requeue).
    #[arg(long)]
    pub no_requeue: bool,
    /// `[B:]SIG[@SECONDS]`: send SIG that many seconds (60) before the time limit, to the batch
    /// shell only with `B:`.
    #[arg(long)]
    pub signal: Option<String>,
    /// Which of your environment variables the job gets: `ALL` (the default), `NONE` (only
    /// `SLURM_*` and `QUORUM_*` ones), or a list of names and `NAME=value` settings, with `ALL` in
    /// the list to keep everything else too (`ALL,OMP_NUM_THREADS=4`).
    #[arg(long)]
    pub export: Option<String>,
    /// A job array: one job per task id, such as `0-15`, `1,3,5`, `0-99:10`, with `%N` at the
    /// end to run at most N at once (`0-15%4`).
    #[arg(short = 'a', long)]
    pub array: Option<String>,
    /// Run the script (or command) on every node of the allocation, each copy its node's rank
    /// in `SLURM_PROCID`, instead of once on the first node with `srun` starting what runs on
    /// the others (the default, as Slurm does).
    #[arg(long)]
    pub every_node: bool,
}

#[derive(Parser, Debug)]
#[command(no_binary_name = true, disable_help_flag = true, disable_version_flag = true)]
struct SbatchLine {
    #[command(flatten)]
    opts: SubmitOpts,
}

impl SubmitOpts {
    /// `self`, with every option it lacks taken from `other`.
    fn or(self, other: SubmitOpts) -> SubmitOpts {
        SubmitOpts {
            job_name: self.job_name.or(other.job_name),
            partition: self.partition.or(other.partition),
            nodes: self.nodes.or(other.nodes),
            ntasks: self.ntasks.or(other.ntasks),
            cpus_per_task: self.cpus_per_task.or(other.cpus_per_task),
            mem: self.mem.or(other.mem),
            gpus: self.gpus.or(other.gpus),
            gres: self.gres.or(other.gres),
            time: self.time.or(other.time),
            output: self.output.or(other.output),
            error: self.error.or(other.error),
            chdir: self.chdir.or(other.chdir),
            dependency: self.dependency.or(other.dependency),
            begin: self.begin.or(other.begin),
            hold: self.hold || other.hold,
            qos: self.qos.or(other.qos),
            account: self.account.or(other.account),
            nice: self.nice.or(other.nice),
            constraint: self.constraint.or(other.constraint),
            exclusive: self.exclusive || other.exclusive,
            requeue: self.requeue || (other.requeue && !self.no_requeue),
            no_requeue: self.no_requeue || (other.no_requeue && !self.requeue),
            signal: self.signal.or(other.signal),
            export: self.export.or(other.export),
            array: self.array.or(other.array),
            every_node: self.every_node || other.every_node,
        }
    }

    /// Checks the values that have a format, so that a bad one is reported where it was written.
    fn check_values(&self) -> Result<(), String> {
        if let Some(m) = &self.mem {
            parse::parse_mem_mb(m).map_err(|e| e.to_string())?;
        }
        if let Some(t) = &self.time {
            parse::parse_time_limit(t).map_err(|e| e.to_string())?;
        }
        if let Some(g) = &self.gpus {
            parse_gpu_count(g, "--gpus")?;
        }
        if let Some(g) = &self.gres {
            parse_gres(g)?;
        }
        if let Some(d) = &self.dependency {
            quorum_model::parse_dependencies(d)?;
        }
        if let Some(b) = &self.begin {
            parse_begin(b, 0)?;
        }
        if let Some(e) = &self.export {
            apply_export(e, Vec::new())?;
        }
        if let Some(a) = &self.array {
            quorum_model::ArraySpec::parse(a)?;
        }
        for (what, v) in [("--nodes", self.nodes), ("--ntasks", self.ntasks), ("--cpus-per-task", self.cpus_per_task)] {
            if v == Some(0) {
                return Err(format!("invalid {what} '0': must be at least 1"));
            }
        }
        Ok(())
    }
}

/// The environment the job gets from the submit environment `env`, as `--export` says.
pub fn apply_export(export: &str, env: Vec<(String, String)>) -> Result<Vec<(String, String)>, String> {
    let ours = |name: &str| name.starts_with("SLURM_") || name.starts_with("QUORUM_");
    match export.trim() {
        "ALL" | "" => return Ok(env),
        "NONE" => return Ok(env.into_iter().filter(|(k, _)| ours(k)).collect()),
        _ => {}
    }
    let mut items = Vec::new();
    for item in export.split(',').map(str::trim) {
        let (name, value) = match item.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (item, None),
        };
        if item == "ALL" || item == "NONE" {
            items.push((item, None));
            continue;
        }
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "invalid --export '{export}': '{item}' is not a variable name or NAME=value (give ALL, NONE or a list)"
            ));
        }
        items.push((name, value));
    }
    if items.iter().any(|(n, _)| *n == "NONE") {
        return Err(format!("invalid --export '{export}': NONE cannot be part of a list"));
    }
    let all = items.iter().any(|(n, _)| *n == "ALL");
    let mut out: Vec<(String, String)> =
        if all { env.clone() } else { env.iter().filter(|(k, _)| ours(k)).cloned().collect() };
    for (name, value) in items.into_iter().filter(|(n, _)| *n != "ALL") {
        let value = match value {
            Some(v) => Some(v.to_string()),
            None => env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
        };
        out.retain(|(k, _)| k != name);
        if let Some(v) = value {
            out.push((name.to_string(), v));
        }
    }
    Ok(out)
}

/// `[type:]N` → (type, N).
fn parse_gpu_count(value: &str, what: &str) -> Result<(Option<String>, u32), String> {
    let (ty, n) = match value.rsplit_once(':') {
        Some((t, n)) => (Some(t.to_string()), n),
        None => (None, value),
    };
    let n: u32 = n.parse().map_err(|_| format!("invalid {what} '{value}': expected [type:]count such as h100:2"))?;
    if ty.as_deref().is_some_and(|t| t.is_empty() || t.contains(':')) {
        return Err(format!("invalid {what} '{value}': expected [type:]count such as h100:2"));
    }
    Ok((ty, n))
}

/// `gpu:[type:]N` → (type, N per node).
fn parse_gres(value: &str) -> Result<(Option<String>, u32), String> {
    match value.strip_prefix("gpu:") {
        Some(rest) => parse_gpu_count(rest, "--gres"),
        None if value == "gpu" => Ok((None, 1)),
        None => Err(format!("invalid --gres '{value}': only gpu:[type:]count is supported")),
    }
}

/// Parses `--begin`: `now+N[s|m|h|d]` (seconds by default) or `YYYY-MM-DDTHH:MM[:SS]` in UTC;
/// returns milliseconds since the epoch.
pub fn parse_begin(value: &str, now_ms: u64) -> Result<u64, String> {
    let bad = || format!("invalid --begin '{value}': expected now+N[s|m|h|d] or YYYY-MM-DDTHH:MM[:SS]");
    if let Some(rest) = value.strip_prefix("now+") {
        let (num, unit) = rest.split_at(rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len()));
        let n: u64 = num.parse().map_err(|_| bad())?;
        let secs = match unit {
            "" | "s" | "seconds" => n,
            "m" | "minutes" => n * 60,
            "h" | "hours" => n * 3600,
            "d" | "days" => n * 86400,
            _ => return Err(bad()),
        };
        return Ok(now_ms + secs * 1000);
    }
    if value == "now" {
        return Ok(now_ms);
    }
    let (date, time) = value.split_once('T').ok_or_else(bad)?;
    let d: Vec<i64> = date.split('-').map(|p| p.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    let t: Vec<i64> = time.split(':').map(|p| p.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
    if d.len() != 3 || !(2..=3).contains(&t.len()) {
        return Err(bad());
    }
    let (y, m, day) = (d[0], d[1], d[2]);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || !(0..24).contains(&t[0]) || !(0..60).contains(&t[1]) {
        return Err(bad());
    }
    // Days since the epoch from a civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86400 + t[0] * 3600 + t[1] * 60 + t.get(2).copied().unwrap_or(0);
    u64::try_from(secs * 1000).map_err(|_| bad())
}

/// Splits a directive line into words, honouring single and double quotes and stopping at a
/// `#` that starts a word (a trailing comment).
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None if c == '#' && !in_word => break,
            None => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return Err("unterminated quote".into());
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// The options in a script's `#SBATCH` (or `#QUORUM`) lines, read like sbatch does: from the
/// top, until the first line that is neither blank nor a comment.
pub fn script_options(path: &str, script: &str) -> Result<SubmitOpts, String> {
    let mut opts = SubmitOpts::default();
    for (i, line) in script.lines().enumerate() {
        let trimmed = line.trim();
        if i == 0 && trimmed.starts_with("#!") {
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        if !trimmed.starts_with('#') {
            break;
        }
        let rest = match trimmed.strip_prefix("#SBATCH").or_else(|| trimmed.strip_prefix("#QUORUM")) {
            Some(r) if r.is_empty() || r.starts_with(char::is_whitespace) => r,
            _ => continue,
        };
        let at = |msg: String| format!("{path} line {}: '{trimmed}': {msg}", i + 1);
        let tokens = words(rest).map_err(at)?;
        let parsed = SbatchLine::try_parse_from(&tokens).map_err(|e| {
            let msg = e.to_string();
            at(msg.lines().next().unwrap_or("invalid option").trim_start_matches("error: ").to_string())
        })?;
        parsed.opts.check_values().map_err(at)?;
        // A later line overrides an earlier one.
        opts = parsed.opts.or(opts);
    }
    Ok(opts)
}

/// What to run: a script file or a command line.
pub enum Payload {
    Script { path: String, text: String },
    Command(Vec<String>),
}

/// Builds the job spec from the merged options. `cwd` is where the user submits from.
pub fn build_spec(
    cli: SubmitOpts,
    payload: Payload,
    cwd: &Path,
    env: Vec<(String, String)>,
) -> Result<api::JobSpec, String> {
    cli.check_values()?;
    let (opts, argv, script, default_name) = match payload {
        Payload::Script { path, text } => {
            let from_script = script_options(&path, &text)?;
            let name = Path::new(&path)
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_else(|| "script".into());
            (cli.or(from_script), Vec::new(), text, name)
        }
        Payload::Command(argv) => {
            if argv.is_empty() || argv[0].trim().is_empty() {
                return Err("empty command: give a script or -- COMMAND [ARGS...]".into());
            }
            let name = Path::new(&argv[0])
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_else(|| argv[0].clone());
            (cli, argv, String::new(), name)
        }
    };
    let nodes = opts.nodes.unwrap_or(1);
    let ntasks = opts.ntasks.unwrap_or(nodes);
    if ntasks < nodes {
        return Err(format!("invalid --ntasks '{ntasks}': fewer tasks than the {nodes} nodes requested"));
    }
    let (gpu_type, gpus_per_node) = match (&opts.gpus, &opts.gres) {
        (Some(_), Some(_)) => return Err("give --gpus or --gres=gpu:..., not both".into()),
        (Some(g), None) => {
            let (ty, total) = parse_gpu_count(g, "--gpus")?;
            if total % nodes != 0 {
                return Err(format!("invalid --gpus '{g}': {total} GPUs do not spread evenly over {nodes} nodes"));
            }
            (ty, total / nodes)
        }
        (None, Some(g)) => parse_gres(g)?,
        (None, None) => (None, 0),
    };
    let work_dir: PathBuf = match &opts.chdir {
        Some(d) if Path::new(d).is_absolute() => PathBuf::from(d),
        Some(d) => cwd.join(d),
        None => cwd.to_path_buf(),
    };
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let begin_time_ms = match &opts.begin {
        Some(b) => parse_begin(b, now_ms)?,
        None => 0,
    };
    let env = apply_export(opts.export.as_deref().unwrap_or("ALL"), env)?;
    Ok(api::JobSpec {
        dependency: opts.dependency.clone().unwrap_or_default(),
        begin_time_ms,
        hold: opts.hold,
        qos: opts.qos.clone().unwrap_or_default(),
        account: opts.account.clone().unwrap_or_default(),
        nice: opts.nice.unwrap_or(0),
        constraint: opts
            .constraint
            .as_deref()
            .map(|c| c.split(['&', ',']).map(|f| f.trim().to_string()).filter(|f| !f.is_empty()).collect())
            .unwrap_or_default(),
        exclusive: opts.exclusive,
        requeue: opts.requeue,
        signal: opts.signal.clone().unwrap_or_default(),
        array: opts.array.clone().unwrap_or_default(),
        name: opts.job_name.unwrap_or(default_name),
        partition: opts.partition.unwrap_or_default(),
        nodes,
        ntasks,
        cpus_per_task: opts.cpus_per_task.unwrap_or(1),
        mem_per_node_mb: opts
            .mem
            .as_deref()
            .map(parse::parse_mem_mb)
            .transpose()
            .map_err(|e| e.to_string())?
            .unwrap_or(0),
        gpus_per_node,
        gpu_type: gpu_type.unwrap_or_default(),
        time_limit_s: match &opts.time {
            Some(t) => parse::parse_time_limit(t).map_err(|e| e.to_string())?.unwrap_or(0),
            None => 0,
        },
        argv,
        script,
        work_dir: work_dir.display().to_string(),
        stdout: opts.output.unwrap_or_default(),
        stderr: opts.error.unwrap_or_default(),
        env: env.into_iter().map(|(name, value)| api::EnvVar { name, value }).collect(),
        submit_dir: cwd.display().to_string(),
        every_node: opts.every_node,
        interactive: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script_spec(text: &str, cli: SubmitOpts) -> Result<api::JobSpec, String> {
        build_spec(cli, Payload::Script { path: "job.sh".into(), text: text.into() }, Path::new("/home/a"), vec![])
    }

    #[test]
    fn sbatch_lines_are_read_until_the_first_command() {
        let text = "#!/bin/bash\n#SBATCH -J train\n#SBATCH --nodes=2 -n 4\n# a comment\n#SBATCH --gres=gpu:h100:2 --mem 8G\n#SBATCH -t 1:00:00 -o out-%j.txt # trailing\n\necho hi\n#SBATCH -p ignored\n";
        let s = script_spec(text, SubmitOpts::default()).unwrap();
        assert_eq!(s.name, "train");
        assert_eq!((s.nodes, s.ntasks), (2, 4));
        assert_eq!((s.gpu_type.as_str(), s.gpus_per_node), ("h100", 2));
        assert_eq!(s.mem_per_node_mb, 8192);
        assert_eq!(s.time_limit_s, 3600);
        assert_eq!(s.stdout, "out-%j.txt");
        assert_eq!(s.partition, "", "directives after the first command are ignored");
        assert_eq!(s.work_dir, "/home/a");
        // The command line wins.
        let cli = SubmitOpts { job_name: Some("other".into()), ..Default::default() };
        assert_eq!(script_spec(text, cli).unwrap().name, "other");
        // --requeue from the script, unless the command line says --no-requeue.
        assert!(!script_spec(text, SubmitOpts::default()).unwrap().requeue);
        let requeued = text.replace("#SBATCH -J train", "#SBATCH -J train --requeue");
        assert!(script_spec(&requeued, SubmitOpts::default()).unwrap().requeue);
        let warned = text.replace("#SBATCH -J train", "#SBATCH -J train --signal=B:USR1@30");
        assert_eq!(script_spec(&warned, SubmitOpts::default()).unwrap().signal, "B:USR1@30");
        let cli = SubmitOpts { no_requeue: true, ..Default::default() };
        assert!(!script_spec(&requeued, cli).unwrap().requeue);
    }

    #[test]
    fn a_bad_sbatch_line_is_named() {
        let e =
            script_spec("#!/bin/bash\n#SBATCH -J x\n#SBATCH --mem=lots\necho\n", SubmitOpts::default()).unwrap_err();
        assert!(e.contains("job.sh line 3") && e.contains("invalid memory size 'lots'"), "{e}");
        let e = script_spec("#SBATCH --frobnicate\n", SubmitOpts::default()).unwrap_err();
        assert!(e.contains("line 1") && e.contains("--frobnicate"), "{e}");
        let e = script_spec("#SBATCH -t 1:2:3:4\n", SubmitOpts::default()).unwrap_err();
        assert!(e.contains("invalid time '1:2:3:4'"), "{e}");
    }

    #[test]
    fn export_takes_all_none_or_a_list() {
        let env = || {
            vec![
                ("HOME".to_string(), "/home/a".to_string()),
                ("SLURM_CONF".to_string(), "/etc/slurm.conf".to_string()),
                ("OMP_NUM_THREADS".to_string(), "8".to_string()),
            ]
        };
        let names = |v: Vec<(String, String)>| v.into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
        assert_eq!(apply_export("ALL", env()).unwrap(), env());
        assert_eq!(names(apply_export("NONE", env()).unwrap()), ["SLURM_CONF=/etc/slurm.conf"]);
        assert_eq!(
            names(apply_export("HOME,FOO=bar,MISSING", env()).unwrap()),
            ["SLURM_CONF=/etc/slurm.conf", "HOME=/home/a", "FOO=bar"]
        );
        assert_eq!(
            names(apply_export("ALL,OMP_NUM_THREADS=2", env()).unwrap()),
            ["HOME=/home/a", "SLURM_CONF=/etc/slurm.conf", "OMP_NUM_THREADS=2"]
        );
        assert!(apply_export("HOME,1BAD", env()).unwrap_err().contains("'1BAD' is not a variable name"));
        assert!(apply_export("NONE,HOME", env()).unwrap_err().contains("NONE cannot be part of a list"));
        let cli = SubmitOpts { export: Some("A=1,,B".into()), ..Default::default() };
        let err = build_spec(cli, Payload::Command(vec!["x".into()]), Path::new("/"), env()).unwrap_err();
        assert!(err.contains("invalid --export 'A=1,,B': '' is not a variable name"), "{err}");
        let cli = SubmitOpts { export: Some("NONE".into()), ..Default::default() };
        let spec = build_spec(cli, Payload::Command(vec!["x".into()]), Path::new("/"), env()).unwrap();
        assert_eq!(spec.env.len(), 1);
    }

    #[test]
    fn gpus_spread_over_nodes() {
        let cli = SubmitOpts { nodes: Some(2), gpus: Some("a100:8".into()), ..Default::default() };
        let s = build_spec(cli, Payload::Command(vec!["x".into()]), Path::new("/"), vec![]).unwrap();
        assert_eq!((s.gpus_per_node, s.gpu_type.as_str()), (4, "a100"));
        let cli = SubmitOpts { nodes: Some(2), gpus: Some("3".into()), ..Default::default() };
        assert!(build_spec(cli, Payload::Command(vec!["x".into()]), Path::new("/"), vec![])
            .unwrap_err()
            .contains("do not spread evenly"));
        assert!(build_spec(SubmitOpts::default(), Payload::Command(vec![]), Path::new("/"), vec![])
            .unwrap_err()
            .contains("empty command"));
    }
}
