//! Slurm's own command names, as scripts and workflow tools call them: `sbatch`, `scancel`,
//! `squeue`, `sacct`, `sinfo`, `scontrol`, and submitit driving them.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use common::*;
use quorum_dev::cluster::DevOptions;

const T: Duration = Duration::from_secs(30);

/// `name` as a link to `quorum` in `dir`, as `quorum install-slurm-commands` makes it.
pub(crate) fn slurm_command(dir: &Path, name: &str) -> std::path::PathBuf {
    let link = dir.join(name);
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_quorum"), &link).unwrap();
    }
    link
}

/// A cluster with its agents connected, a client, a working directory, and a directory for the
/// Slurm commands' links (a login host).
async fn site(opts: DevOptions) -> (quorum_dev::cluster::DevCluster, quorum_client::client::Client, TempDir, TempDir) {
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    (cluster, c, tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap())
}

/// `name ARGS` (a Slurm command in `bin`), which must succeed: its output.
fn ok(cluster: &quorum_dev::cluster::DevCluster, dir: &Path, bin: &Path, name: &str, args: &[&str]) -> String {
    let (code, out, err) = run_command(cluster, dir, &slurm_command(bin, name), args, "");
    assert_eq!(code, Some(0), "{name} {args:?}: {err}");
    out
}

/// `sbatch --parsable ARGS`, which must succeed: the job's id.
fn sbatch_id(cluster: &quorum_dev::cluster::DevCluster, dir: &Path, bin: &Path, args: &[&str]) -> u64 {
    let args: Vec<&str> = ["--parsable"].iter().chain(args).copied().collect();
    let out = ok(cluster, dir, bin, "sbatch", &args);
    out.trim().parse().unwrap_or_else(|_| panic!("sbatch printed {out:?}"))
}

/// Runs `program ARGS` in `dir` against `cluster` with `stdin`: its exit code, stdout, stderr.
fn run_command(
    cluster: &quorum_dev::cluster::DevCluster,
    dir: &Path,
    program: &Path,
    args: &[&str],
    stdin: &str,
) -> (Option<i32>, String, String) {
    let mut child = Command::new(program)
        .args(args)
        .envs(cluster.env())
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sbatch_takes_a_script_from_a_file_stdin_or_wrap_and_answers_as_slurm_does() {
    let (cluster, c, dir, bin) = site(DevOptions { cpus_per_agent: 4, ..DevOptions::for_tests() }).await;
    let sbatch = slurm_command(bin.path(), "sbatch");
    let run = |args: &[&str], stdin: &str| run_command(&cluster, dir.path(), &sbatch, args, stdin);

    // A script whose directives use Slurm's other spellings and shortened long options.
    std::fs::write(
        dir.path().join("job.sh"),
        "#!/bin/bash\n#SBATCH --job=train -N 2 --ntasks-per-node=2 --mem-per-cpu=100 -t 1:00\n#SBATCH --out=train-%j.out # the log\necho $SLURM_NTASKS $SLURM_JOB_NAME\n",
    )
    .unwrap();
    let (code, out, err) = run(&["--parsable", "job.sh"], "");
    assert_eq!(code, Some(0), "{out}\n{err}");
    let id: u64 = out.trim().parse().unwrap_or_else(|_| panic!("--parsable printed more than the id: {out:?}"));
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    let spec = j.spec.clone().unwrap();
    assert_eq!((spec.nodes, spec.ntasks, spec.mem_per_node_mb, spec.time_limit_s), (2, 4, 200, 60), "{spec:?}");
    let log = std::fs::read_to_string(dir.path().join(format!("train-{id}.out"))).unwrap();
    assert_eq!(log, "4 train\n");

    // The script on standard input; the answer Slurm gives.
    let (code, out, err) = run(&[], "#!/bin/sh\necho from-stdin > stdin.txt\n");
    assert_eq!(code, Some(0), "{err}");
    let id: u64 = out
        .trim()
        .strip_prefix("Submitted batch job ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out:?}"));
    wait_state(&c, id, &["COMPLETED"], T).await;
    assert_eq!(std::fs::read_to_string(dir.path().join("stdin.txt")).unwrap(), "from-stdin\n");

    // --wrap: a command line as the script.
    let (code, out, err) = run(&["--parsable", "--wrap", "echo wrapped $SLURM_JOB_ID > wrapped.txt"], "");
    assert_eq!(code, Some(0), "{err}");
    let id: u64 = out.trim().parse().unwrap();
    wait_state(&c, id, &["COMPLETED"], T).await;
    assert_eq!(std::fs::read_to_string(dir.path().join("wrapped.txt")).unwrap(), format!("wrapped {id}\n"));

    // Arguments after the script are its $1, $2, ...
    std::fs::write(dir.path().join("args.sh"), "#!/bin/bash\necho \"$1|$2|$#\" > args.txt\n").unwrap();
    let (code, out, err) = run(&["--parsable", "args.sh", "a b", "--c"], "");
    assert_eq!(code, Some(0), "{err}");
    wait_state(&c, out.trim().parse().unwrap(), &["COMPLETED"], T).await;
    assert_eq!(std::fs::read_to_string(dir.path().join("args.txt")).unwrap(), "a b|--c|2\n");

    // Slurm's other dependency forms: aftercorr pairs the tasks of two arrays by task id, '?'
    // needs any one of its dependencies, +MINUTES delays an `after`.
    let (d, b) = (dir.path(), bin.path());
    let first = sbatch_id(
        &cluster,
        d,
        b,
        &["--array=1-2", "--wrap", "sleep 1; echo $SLURM_ARRAY_TASK_ID > a-$SLURM_ARRAY_TASK_ID"],
    );
    let corr = format!("aftercorr:{first}");
    let second = sbatch_id(
        &cluster,
        d,
        b,
        &["--array=1-2", "-d", &corr, "--wrap", "cat a-$SLURM_ARRAY_TASK_ID > b-$SLURM_ARRAY_TASK_ID"],
    );
    let either = format!("afternotok:{first}?afterany:{second}");
    let last = sbatch_id(&cluster, d, b, &["-d", &either, "--wrap", "ls b-1 b-2 > either"]);
    let delayed = format!("after:{first}+60");
    let later = sbatch_id(&cluster, d, b, &["-d", &delayed, "--wrap", "true"]);
    let shown = ok(&cluster, d, b, "squeue", &["-h", "-o", "%A|%E", "-j", &format!("{second},{last},{later}")]);
    for want in [format!("{second}|{corr}"), format!("{last}|{either}"), format!("{later}|{delayed}")] {
        assert!(shown.lines().any(|l| l == want), "{want} not in:\n{shown}");
    }
    let j = wait_state(&c, last, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    assert_eq!(std::fs::read_to_string(d.join("either")).unwrap(), "b-1\nb-2\n");
    for task in [1, 2] {
        assert_eq!(std::fs::read_to_string(d.join(format!("b-{task}"))).unwrap(), format!("{task}\n"));
    }
    let shown = ok(&cluster, d, b, "squeue", &["-h", "-o", "%T %r", "-j", &later.to_string()]);
    assert_eq!(shown.trim(), "PENDING Dependency", "an hour after the array started");
    ok(&cluster, d, b, "scancel", &[&later.to_string()]);
    // --kill-on-invalid-dep=yes: cancelled once the dependency can never be met, the reason
    // kept; without it the job waits to be cancelled.
    let failing = sbatch_id(&cluster, d, b, &["--wrap", "exit 1"]);
    let on_failure = format!("afterok:{failing}");
    let killed = sbatch_id(&cluster, d, b, &["--kill-on-invalid-dep=yes", "-d", &on_failure, "--wrap", "true"]);
    let kept = sbatch_id(&cluster, d, b, &["-d", &on_failure, "--wrap", "true"]);
    let j = wait_state(&c, killed, &["CANCELLED", "COMPLETED"], T).await;
    assert_eq!((j.state.as_str(), j.reason.as_str()), ("CANCELLED", "DependencyNeverSatisfied"), "{j:?}");
    // Its reason comes with the next scheduling cycle, which may follow the other's cancel.
    wait_for(T, "the kept job's reason", || async {
        let shown = ok(&cluster, d, b, "squeue", &["-h", "-o", "%T %r", "-j", &kept.to_string()]);
        (shown.trim() == "PENDING DependencyNeverSatisfied").then_some(())
    })
    .await;
    ok(&cluster, d, b, "scancel", &[&kept.to_string()]);

    // What is refused names itself, and creates nothing.
    let before = all_jobs(&c).await.len();
    std::fs::write(dir.path().join("bad.sh"), "#!/bin/bash\n#SBATCH -N 1\n#SBATCH --frobnicate=3\ntrue\n").unwrap();
    for (args, says) in [
        (vec!["--frobnicate", "job.sh"], "--frobnicate"),
        (vec!["--gpus-per=1", "job.sh"], "--gpus-per"),
        (vec!["bad.sh"], "bad.sh line 3: '#SBATCH --frobnicate=3'"),
        (vec!["--mem=1G", "--mem-per-cpu=1G", "job.sh"], "give one way of asking for memory"),
        (vec!["--wrap", "true", "an-argument"], "'--wrap <WRAP>' cannot be used with '[SCRIPT]'"),
        (vec!["-d", "after:1+soon", "job.sh"], "'+soon' is not a number of minutes"),
    ] {
        let (code, out, err) = run(&args, "");
        assert_eq!(code, Some(1), "sbatch {args:?}: {out}\n{err}");
        assert!(err.contains(says), "sbatch {args:?}: {err}");
    }
    assert_eq!(all_jobs(&c).await.len(), before, "a refused submit created a job");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scancel_cancels_by_id_array_task_and_filter_and_names_what_it_cannot() {
    let (cluster, c, dir, bin) = site(DevOptions::for_tests()).await;
    let scancel = slurm_command(bin.path(), "scancel");
    // Held jobs stay PENDING until cancelled.
    let submit = |args: &[&str]| -> u64 {
        let args: Vec<&str> = ["-H", "--wrap", "sleep 100"].iter().chain(args).copied().collect();
        sbatch_id(&cluster, dir.path(), bin.path(), &args)
    };
    let scancel = |args: &[&str]| run_command(&cluster, dir.path(), &scancel, args, "");
    let (alpha, beta, gamma) =
        (submit(&["-J", "alpha"]), submit(&["-J", "beta"]), submit(&["-J", "gamma", "--array=0-3"]));
    let states = |ids: Vec<u64>| {
        let c = &c;
        async move {
            let mut out = Vec::new();
            for id in ids {
                out.push(job(c, id).await.state);
            }
            out
        }
    };

    assert_eq!(scancel(&[&beta.to_string()]), (Some(0), String::new(), String::new()));
    assert_eq!(states(vec![beta]).await, ["CANCELLED"]);
    // Two tasks of the array, by Slurm's bracket syntax; the others stay.
    assert_eq!(scancel(&[&format!("{gamma}_[1-2]")]).0, Some(0));
    assert_eq!(states((gamma..gamma + 4).collect()).await, ["PENDING", "CANCELLED", "CANCELLED", "PENDING"]);
    // By name and state: only alpha.
    assert_eq!(scancel(&["-n", "alpha", "-t", "PD"]).0, Some(0));
    assert_eq!(states(vec![alpha, gamma]).await, ["CANCELLED", "PENDING"]);
    // Filters narrow the ids named: the array's tasks of another name stay.
    assert_eq!(scancel(&["--name=other", &gamma.to_string()]).0, Some(0));
    assert_eq!(states(vec![gamma, gamma + 3]).await, ["PENDING", "PENDING"]);
    // Every job of mine.
    assert_eq!(scancel(&["--me"]).0, Some(0));
    assert_eq!(states(vec![gamma, gamma + 3]).await, ["CANCELLED", "CANCELLED"]);

    // What it cannot do is named, with a failing exit code.
    let (code, _, err) = scancel(&["999999"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("scancel: error: Kill job error on job id 999999"), "{err}");
    let (code, _, err) = scancel(&[]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no job identification provided"), "{err}");
    let (code, _, err) = scancel(&["12x"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("invalid job id '12x'"), "{err}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squeue_prints_the_fields_and_lines_that_tools_parse() {
    let (cluster, c, dir, bin) = site(DevOptions::for_tests()).await;
    let submit = |args: &[&str]| sbatch_id(&cluster, dir.path(), bin.path(), args);
    let squeue = |args: &[&str]| ok(&cluster, dir.path(), bin.path(), "squeue", args);
    let done = submit(&["--wrap", "true"]);
    wait_state(&c, done, &["COMPLETED"], T).await;
    let held = submit(&["-H", "-J", "held", "--wrap", "sleep 100"]);
    let array = submit(&["-H", "-J", "arr", "--array=0-3%2", "--wrap", "sleep 100"]);
    let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap();

    // The active queue: a finished job is not in it; the array's pending tasks share a line.
    assert_eq!(
        squeue(&["-h", "-o", "%i|%T|%j|%t|%R|%u"]),
        format!(
            "{held}|PENDING|held|PD|(JobHeldUser)|{u}\n{array}_[0-3%2]|PENDING|arr|PD|(JobHeldUser)|{u}\n",
            u = user.trim()
        )
    );
    assert!(squeue(&[])
        .starts_with("             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)\n"));
    // One line per task with -r; a job named with -j is shown whatever its state.
    assert_eq!(
        squeue(&["-r", "-h", "-j", &array.to_string(), "-o", "%i %K %A"]),
        (0..4).map(|t| format!("{array}_{t} {t} {}\n", array + t)).collect::<String>()
    );
    // One task named alone is one task's line, as on Slurm: `12_3`, not `12_[3]`.
    assert_eq!(squeue(&["-h", "-j", &format!("{array}_2"), "-o", "%i %K"]), format!("{array}_2 2\n"));
    assert_eq!(
        squeue(&["-h", "-j", &format!("{array}_1,{array}_3"), "-o", "%i %K"]),
        format!("{array}_[1,3%2] 1,3%2\n")
    );
    // A pending job's record shows its priority as the scheduler ranks it (held: 0, as Slurm's).
    let scontrol = |args: &[&str]| ok(&cluster, dir.path(), bin.path(), "scontrol", args);
    let shown = scontrol(&["show", "job", &held.to_string()]);
    assert!(shown.contains("\n   Priority=0 Nice=0 Account="), "{shown}");
    let waiting = submit(&["--begin=now+1hour", "--wrap", "true"]);
    let shown = scontrol(&["-o", "show", "job", &waiting.to_string()]);
    let priority: u64 = shown.split(" Priority=").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    assert!(priority > 0, "{shown}");
    // The same figure sprio gives (the age factor may have grown a little in between).
    let sprio = ok(&cluster, dir.path(), bin.path(), "sprio", &["-h", "-j", &waiting.to_string()]);
    let cells: Vec<&str> = sprio.split_whitespace().collect();
    assert_eq!(cells[0], waiting.to_string(), "{sprio}");
    assert!(cells[2].parse::<u64>().unwrap().abs_diff(priority) <= 5, "{sprio} against {priority}");
    assert_eq!(squeue(&["--noheader", "--jobs", &done.to_string(), "--format", "%T"]), "COMPLETED\n");
    assert_eq!(squeue(&["-h", "-n", "held", "--me", "-t", "PD", "-o", "%A"]), format!("{held}\n"));
    assert_eq!(squeue(&["-h", "-t", "R"]), "");
    assert_eq!(
        squeue(&["-O", "JobID:8,Name:6,State:5", "-j", &held.to_string()]),
        format!("JOBID   NAME  STATE\n{held:<8}held  PENDI\n"),
        "-O pads each field to its width, nothing between"
    );
    // A field it does not know is named; so is a sort key.
    let (code, _, err) = run_command(&cluster, dir.path(), &bin.path().join("squeue"), &["-o", "%z"], "");
    assert_eq!(code, Some(1));
    assert!(err.contains("%z is not a field"), "{err}");
    let (code, _, err) = run_command(&cluster, dir.path(), &bin.path().join("squeue"), &["-S", "P,zz"], "");
    assert_eq!(code, Some(1));
    assert!(err.contains("invalid --sort key 'zz'"), "{err}");
    // Pending jobs in Slurm's order, highest priority first (an operator's --priority sets it),
    // with %Q the figure sprio gives; held jobs last (priority 0); -S for another order.
    // (Above any computed priority: the weights sum to far less.)
    let prioritized: Vec<u64> = ["1000000000", "2000000000", "3000000000"]
        .iter()
        .map(|p| submit(&["--begin=now+1hour", &format!("--priority={p}"), "--wrap", "true"]))
        .collect();
    let (low, mid, high) = (prioritized[0], prioritized[1], prioritized[2]);
    let order = squeue(&["-h", "-t", "PD", "-o", "%i %Q"]);
    let lines: Vec<&str> = order.lines().collect();
    assert_eq!(
        lines[..3],
        [format!("{high} 3000000000"), format!("{mid} 2000000000"), format!("{low} 1000000000")],
        "{order}"
    );
    assert!(lines.iter().position(|l| l.starts_with(&format!("{held} "))) > Some(2), "{order}");
    assert_eq!(
        squeue(&["-h", "-j", &format!("{low},{mid},{high}"), "-S", "i", "-o", "%i"]),
        format!("{low}\n{mid}\n{high}\n")
    );
    let sprio =
        ok(&cluster, dir.path(), bin.path(), "sprio", &["-h", "-S", "-Y", "-j", &format!("{low},{mid},{high}")]);
    let ids: Vec<&str> = sprio.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(ids, [high.to_string(), mid.to_string(), low.to_string()], "{sprio}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sacct_reports_jobs_and_steps_in_the_parsable_form_tools_read() {
    let opts = DevOptions { quorum_program: Some(env!("CARGO_BIN_EXE_quorum").into()), ..DevOptions::for_tests() };
    let (cluster, c, dir, bin) = site(opts).await;
    let submit = |args: &[&str]| sbatch_id(&cluster, dir.path(), bin.path(), args);
    let sacct = |args: &[&str]| ok(&cluster, dir.path(), bin.path(), "sacct", args);
    let good = submit(&["--wrap", "srun true"]);
    let failed = submit(&["--wrap", "exit 3"]);
    let array = submit(&["-H", "--array=0-2", "--wrap", "true"]);
    wait_state(&c, good, &["COMPLETED"], T).await;
    wait_state(&c, failed, &["FAILED"], T).await;

    // What submitit asks: the job, its script's step and its srun step, with a header, `|`
    // between fields.
    assert_eq!(
        sacct(&["-j", &good.to_string(), "-o", "JobID,State,ExitCode", "--parsable2"]),
        format!("JobID|State|ExitCode\n{good}|COMPLETED|0:0\n{good}.batch|COMPLETED|0:0\n{good}.0|COMPLETED|0:0\n")
    );
    assert_eq!(
        sacct(&["-n", "-P", "-j", &failed.to_string(), "-o", "JobID,JobName,State,ExitCode,NNodes"]),
        format!("{failed}|wrap|FAILED|3:0|1\n{failed}.batch|batch|FAILED|3:0|1\n")
    );
    assert_eq!(
        sacct(&["-X", "-n", "-P", "-j", &format!("{good},{failed},{array}"), "-o", "JobID,State,ExitCode"]),
        format!("{good}|COMPLETED|0:0\n{failed}|FAILED|3:0\n{array}_[0-2]|PENDING|0:0\n")
    );
    // Why it ended, as Slurm's controller sets it, in squeue and scontrol; not in sacct, whose
    // Reason is a waiting one (none here).
    let cmd = |name: &str, args: &[&str]| ok(&cluster, dir.path(), bin.path(), name, args);
    assert_eq!(
        cmd("squeue", &["-h", "-t", "failed", "-o", "%i %T %r", "-j", &failed.to_string()]),
        format!("{failed} FAILED NonZeroExitCode\n")
    );
    let shown = cmd("scontrol", &["-o", "show", "job", &failed.to_string()]);
    assert!(shown.contains(" JobState=FAILED Reason=NonZeroExitCode "), "{shown}");
    assert_eq!(sacct(&["-X", "-n", "-P", "-j", &failed.to_string(), "-o", "JobID,Reason"]), format!("{failed}|None\n"));
    // Who cancelled a job, by uid, as Slurm's sacct says it.
    ok(&cluster, dir.path(), bin.path(), "scancel", &[&format!("{array}_1")]);
    let uid = quorum_auth::users::current().unwrap().uid;
    assert_eq!(
        sacct(&["-X", "-n", "-P", "-j", &format!("{array}_1"), "-o", "JobID,State"]),
        format!("{array}_1|CANCELLED by {uid}\n")
    );
    // The caller's own jobs since midnight, with sacct's table by default.
    let table = sacct(&["-X"]);
    let mut rows = table.lines();
    assert_eq!(
        rows.next().unwrap().split_whitespace().collect::<Vec<_>>(),
        ["JobID", "JobName", "Partition", "Account", "AllocCPUS", "State", "ExitCode"]
    );
    assert!(rows.next().unwrap().starts_with("------------ ----------"));
    let rows: Vec<&str> = rows.collect();
    assert_eq!(rows.len(), 4, "{table}");
    // A value longer than its column ends in `+`, as sacct's.
    assert!(rows[3].starts_with(&format!("{array}_1 ")) && rows[3].contains(" CANCELLED+ "), "{table}");
    let (code, _, err) = run_command(&cluster, dir.path(), &bin.path().join("sacct"), &["-o", "JobID,Bogus"], "");
    assert_eq!(code, Some(1));
    assert!(err.contains("invalid --format field 'Bogus'"), "{err}");
    cluster.shutdown().await;
}

/// A Python with submitit (from PyPI).
fn submitit_python() -> String {
    pypi_python("submitit", "1.5.4", "submitit")
}

/// submitit's Slurm executor, unmodified, submits Python functions to Quorum through the Slurm
/// commands and gets their results back: it parses `Submitted batch job N`, passes `--wckey`,
/// `--open-mode=append` and `--signal=USR1@90`, runs `srun --unbuffered --output ...%j_%t...`,
/// and reads states with `sacct -o JobID,State,NodeList --parsable2`, array rows included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submitit_runs_python_functions_through_the_slurm_commands() {
    let python = submitit_python();
    let (cluster, _c, dir, bin) = site(DevOptions { cpus_per_agent: 4, ..DevOptions::for_tests() }).await;
    for name in ["sbatch", "srun", "sacct", "scancel", "scontrol", "squeue", "sinfo"] {
        slurm_command(bin.path(), name);
    }
    let path = format!("{}:{}", bin.path().display(), std::env::var("PATH").unwrap_or_default());
    let env: Vec<(String, String)> = cluster.env().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let (work, folder) = (dir.path().to_path_buf(), dir.path().join("jobs/%j"));
    let out = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .args(["300", &python, concat!(env!("CARGO_MANIFEST_DIR"), "/tests/submitit/driver.py")])
            .arg(&folder)
            .envs(env)
            .env("PATH", path)
            .current_dir(work)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "submitit failed:\n{stdout}\n{stderr}");
    let got: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let single = got["single_id"].as_str().unwrap().to_string();
    assert_eq!(got["single"], serde_json::json!({"sum": 5, "job_id": single, "rank": 0, "tasks": 1}), "{got}");
    assert_eq!(got["single_state"], "COMPLETED");
    assert_eq!(got["failing"], "FailedJobError: True", "the job's exception comes back");
    assert_eq!(got["array"], serde_json::json!([11, 22, 33]));
    let ids: Vec<&str> = got["array_ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let array = ids[0].split('_').next().unwrap();
    assert_eq!(ids, [0, 1, 2].map(|t| format!("{array}_{t}")));
    assert_eq!(got["array_states"], serde_json::json!(["COMPLETED", "COMPLETED", "COMPLETED"]));
    cluster.shutdown().await;
}

/// A Python with Snakemake and its Slurm executor plugin (from PyPI).
fn snakemake_python() -> String {
    pypi_python_with(
        "snakemake",
        "9.27.1",
        "snakemake_executor_plugin_slurm",
        &["snakemake-executor-plugin-slurm==2.8.0"],
    )
}

/// Four rules fanned out and one gathering them; each writes what its job was told (`set -u`, as
/// Snakemake's shell runs, fails on a variable the step lacks).
const SNAKEFILE: &str = r#"SAMPLES = ["a", "b", "c", "d"]

rule all:
    input: "gathered.txt"

rule part:
    output: "parts/{s}.txt"
    shell: "echo {wildcards.s} $SLURMD_NODENAME $SLURM_JOB_ID $SLURM_JOB_ACCOUNT > {output}"

rule gather:
    input: expand("parts/{s}.txt", s=SAMPLES)
    output: "gathered.txt"
    shell: "cat {input} > {output}; echo gather $SLURM_JOB_ID $SLURM_JOB_ACCOUNT >> {output}"
"#;

/// Snakemake's Slurm executor (plugin 2.8), unmodified, runs a workflow to the end: it checks the
/// account with `sacctmgr -n -s list user NAME format=account%256`, reads `MinJobAge` and
/// `MaxArraySize` from `scontrol show config`, submits each rule with `sbatch --parsable`, runs
/// it in the job with `srun -n1 --cpu-bind=q`, and polls `sacct -X --parsable2 --clusters all
/// --name RUN` until every job has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snakemake_runs_a_workflow_through_its_slurm_executor() {
    let python = snakemake_python();
    let (cluster, _c, dir, bin) = site(DevOptions { cpus_per_agent: 4, ..DevOptions::for_tests() }).await;
    for name in ["sbatch", "srun", "sacct", "sacctmgr", "scancel", "scontrol", "squeue", "sinfo", "sshare"] {
        slurm_command(bin.path(), name);
    }
    let made = Command::new(env!("CARGO_BIN_EXE_quorum"))
        .args(["admin", "account", "lab", "--users", "root"])
        .envs(cluster.env())
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    // What the executor reads, as it reads it.
    assert_eq!(
        ok(&cluster, dir.path(), bin.path(), "sacctmgr", &["-n", "-s", "list", "user", "root", "format=account%256"])
            .trim(),
        "lab"
    );
    let config = ok(&cluster, dir.path(), bin.path(), "scontrol", &["show", "config"]);
    assert!(config.lines().any(|l| l == "MinJobAge               = 300 sec"), "{config}");
    std::fs::write(dir.path().join("Snakefile"), SNAKEFILE).unwrap();
    let snakemake = Path::new(&python).with_file_name("snakemake");
    let path = format!(
        "{}:{}:{}",
        bin.path().display(),
        snakemake.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let env: Vec<(String, String)> = cluster.env().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let work = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("timeout")
            .arg("600")
            .arg(&snakemake)
            .args(["--executor", "slurm", "--jobs", "4", "--default-resources", "slurm_account=lab", "mem_mb=500"])
            .args(["runtime=5", "--slurm-init-seconds-before-status-checks", "1"])
            .envs(env)
            .env("PATH", path)
            .current_dir(work)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "snakemake failed:\n{stdout}\n{stderr}");
    let gathered = std::fs::read_to_string(dir.path().join("gathered.txt")).unwrap();
    let lines: Vec<Vec<&str>> = gathered.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines.len(), 5, "{gathered}");
    let mut ids: Vec<&str> = lines.iter().map(|w| w[w.len() - 2]).collect();
    for (line, sample) in lines.iter().zip(["a", "b", "c", "d"]) {
        assert_eq!((line[0], line.len(), line[3]), (sample, 4, "lab"), "{gathered}");
        assert!(line[1].starts_with("node0"), "{gathered}");
    }
    assert_eq!(lines[4][0], "gather");
    // Each rule a job of its own, and every one COMPLETED as sacct tells it.
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 5, "{gathered}");
    let states = ok(
        &cluster,
        dir.path(),
        bin.path(),
        "sacct",
        &["-X", "-P", "-n", "-a", "-S", "now-1day", "-o", "JobIDRaw,State,Account"],
    );
    for id in ids {
        assert!(states.lines().any(|l| l == format!("{id}|COMPLETED|lab")), "{id}: {states}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sinfo_scontrol_and_the_options_scripts_use_answer_as_slurm_does() {
    let (cluster, c, dir, bin) = site(DevOptions { cpus_per_agent: 4, ..DevOptions::for_tests() }).await;
    let submit = |args: &[&str]| sbatch_id(&cluster, dir.path(), bin.path(), args);
    let cmd = |name: &str, args: &[&str]| ok(&cluster, dir.path(), bin.path(), name, args);
    let sbatch = slurm_command(bin.path(), "sbatch");
    let refused = |args: &[&str]| run_command(&cluster, dir.path(), &sbatch, args, "");
    assert_eq!(cmd("sinfo", &["-h", "-o", "%P|%a|%D|%t|%N|%c"]), "gpu*|up|2|idle|node[01-02]|4\n");

    // Notes, a node named, and an option accepted with a warning that names it.
    let (code, out, err) = refused(&[
        "--parsable",
        "-w",
        "node02",
        "--comment=a b",
        "--wckey=w",
        "--mail-type=END",
        "--hint=nomultithread",
        "--wrap",
        "sleep 100",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("sbatch: warning: --hint=nomultithread is accepted but not honoured"), "{err}");
    let noted: u64 = out.trim().parse().unwrap();
    assert_eq!(wait_state(&c, noted, &["RUNNING"], T).await.nodelist, "node02");
    let elsewhere = submit(&["-x", "node02", "--wrap", "sleep 100"]);
    assert_eq!(wait_state(&c, elsewhere, &["RUNNING"], T).await.nodelist, "node01");
    // A node list shorter than the job: those nodes and others, as Slurm's.
    let partial = submit(&["-N", "2", "-w", "node02", "--wrap", "true"]);
    assert_eq!(wait_state(&c, partial, &["COMPLETED"], T).await.nodelist, "node[01-02]");
    assert_eq!(
        cmd("squeue", &["-h", "-j", &noted.to_string(), "-o", "%i|%k|%w|%N"]),
        format!("{noted}|a b|w|node02\n")
    );
    assert_eq!(
        cmd("sacct", &["-j", &noted.to_string(), "-X", "-o", "JobID,Comment,WCKey", "--parsable2"]),
        format!("JobID|Comment|WCKey\n{noted}|a b|w\n")
    );
    assert_eq!(cmd("sinfo", &["-h", "-N", "-o", "%N|%t|%C"]), "node01|mix|1/3/0/4\nnode02|mix|1/3/0/4\n");
    assert_eq!(cmd("sinfo", &["-h", "-s", "-o", "%P %F"]), "gpu* 2/0/0/2\n");

    // scontrol: records as Slurm prints them, each on one line with -o.
    let shown = cmd("scontrol", &["show", "job", &noted.to_string()]);
    let me = quorum_auth::users::current().unwrap();
    let group = quorum_auth::users::group(&me.gid.to_string()).unwrap();
    assert!(
        shown.starts_with(&format!(
            "JobId={noted} JobName=wrap\n   UserId={}({}) GroupId={}({}) Partition=",
            me.name, me.uid, group.name, group.gid
        )),
        "{shown}"
    );
    assert!(
        shown.contains(
            "\n   ReqNodeList=node02 ExcNodeList=(null) Features=(null)\n   OverSubscribe=OK Licenses=(null)\n   Comment=a b WCKey=w MailType=END\n"
        ),
        "{shown}"
    );
    let one = cmd("scontrol", &["-o", "show", "job", &elsewhere.to_string()]);
    assert!(one.starts_with(&format!("JobId={elsewhere} JobName=wrap UserId=")), "{one}");
    assert!(one.lines().count() == 1 && one.contains(" ExcNodeList=node02 "), "{one}");
    // Times as Slurm writes them: local, no zone; a job not yet ended ends `Unknown`.
    let submitted = one.split(" SubmitTime=").nth(1).and_then(|r| r.split(' ').next()).unwrap();
    assert!(submitted.len() == 19 && submitted.as_bytes()[10] == b'T' && !submitted.ends_with('Z'), "{one}");
    assert!(one.contains(" EndTime=Unknown"), "{one}");
    let node = cmd("scontrol", &["show", "node", "node02"]);
    assert!(
        node.starts_with("NodeName=node02\n   CPUAlloc=1 CPUTot=4\n") && node.contains("   State=MIXED Weight=1\n"),
        "{node}"
    );
    let part = cmd("scontrol", &["show", "partition", "gpu", "-o"]);
    assert!(
        part.starts_with("PartitionName=gpu AllowGroups=ALL")
            && part.contains(" Default=YES ")
            && part.contains(" Nodes=node[01-02] "),
        "{part}"
    );

    // Requeue: the running job stops and starts again; its output, opened for appending, keeps
    // both runs, and the second knows it is one.
    cmd("scancel", &[&noted.to_string(), &elsewhere.to_string()]);
    let again = submit(&[
        "--open-mode=append",
        "-o",
        "again-%j.out",
        "--wrap",
        "echo run ${SLURM_RESTART_COUNT:-0}; sleep 100",
    ]);
    let log = dir.path().join(format!("again-{again}.out"));
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for(T, "the first run's line", || async { (read() == "run 0\n").then_some(()) }).await;
    cmd("scontrol", &["requeue", &again.to_string()]);
    wait_for(T, "the second run's line", || async { (read() == "run 0\nrun 1\n").then_some(()) }).await;
    assert_eq!(job(&c, again).await.requeues, 1);
    cmd("scancel", &[&again.to_string()]);
    // Hold and release a pending job.
    let held = submit(&["-H", "--wrap", "true"]);
    cmd("scontrol", &["release", &held.to_string()]);
    assert_eq!(wait_state(&c, held, &["COMPLETED", "FAILED"], T).await.state, "COMPLETED");
    assert!(
        std::path::Path::new(&dir.path().join(format!("slurm-{held}.out"))).exists(),
        "Slurm's default output file"
    );
    let (code, _, err) =
        run_command(&cluster, dir.path(), &slurm_command(bin.path(), "scontrol"), &["requeue", &held.to_string()], "");
    assert_eq!(code, Some(1));
    assert!(err.contains(&format!("scontrol: error: job {held} has already finished (COMPLETED)")), "{err}");

    // -W waits and exits with the job's code.
    let (code, out, _) = refused(&["-W", "--wrap", "exit 3"]);
    assert_eq!(code, Some(3), "{out}");

    // --test-only checks as a submit does and creates nothing; GPU types match in any case.
    let before = all_jobs(&c).await.len();
    let (code, _, err) = refused(&["--test-only", "--gres=gpu:H100:2", "-n", "6", "--wrap", "true"]);
    assert_eq!(code, Some(0), "{err}");
    let next = all_jobs(&c).await.iter().map(|j| j.id).max().unwrap() + 1;
    let line = err.lines().next().unwrap_or_default();
    assert!(
        line.starts_with(&format!("sbatch: Job {next} to start at 20"))
            && line.ends_with(" using 6 processors on nodes node[01-02] in partition gpu"),
        "{err}"
    );
    assert!(
        err.contains("\nsbatch: it would have 2 nodes, 6 tasks, 6 processors; per node 3G memory, 2 GPUs of type h100"),
        "{err}"
    );
    let (code, _, err) = refused(&["--test-only", "-C", "nosuch", "--wrap", "true"]);
    assert!(code == Some(1) && err.contains("have the features nosuch"), "{err}");
    assert_eq!(all_jobs(&c).await.len(), before, "--test-only created a job");
    assert_eq!(cmd("sprio", &["-w", "-h"]).split_whitespace().next(), Some("Weights"));
    assert!(cmd("sshare", &[]).starts_with("Account                    User  RawShares"));

    // What this cluster cannot give is refused at submit, named, and creates nothing.
    for (args, says) in [
        (vec!["-C", "nosuch", "--wrap", "true"], "0 of the 2 nodes of partition 'gpu' have the features nosuch"),
        (vec!["-w", "node09", "--wrap", "true"], "node 'node09' is not in partition 'gpu'"),
        (vec!["--licenses=matlab", "--wrap", "true"], "this cluster has no licenses; 'matlab' is none of them"),
        (vec!["--bogus", "--wrap", "true"], "--bogus"),
    ] {
        let (code, out, err) = refused(&args);
        assert_eq!(code, Some(1), "sbatch {args:?}: {out}\n{err}");
        assert!(err.contains(says), "sbatch {args:?}: {err}");
    }
    assert_eq!(all_jobs(&c).await.len(), before, "a refused submit created a job");
    cluster.shutdown().await;
}

/// What `scontrol show job -o` says a job asks for: nodes, tasks, CPUs, GPUs, memory (MB) and
/// time limit (s), from its `TRES=`, `NumTasks=` and `TimeLimit=` (the same fields
/// benches/slurm-scripts.sh reads from Slurm's).
fn asked(line: &str) -> [u64; 6] {
    let field = |key: &str| {
        line.split_whitespace().find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('='))).unwrap_or("")
    };
    let tres: Vec<(&str, &str)> = field("TRES").split(',').filter_map(|kv| kv.split_once('=')).collect();
    let tres = |k: &str| tres.iter().find(|(key, _)| *key == k).map_or("0", |(_, v)| v);
    let mb = |v: &str| {
        let (n, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len()));
        let n: f64 = n.parse().unwrap_or(0.0);
        (n * match unit {
            "K" => 1.0 / 1024.0,
            "G" => 1024.0,
            "T" => 1024.0 * 1024.0,
            _ => 1.0,
        })
        .round() as u64
    };
    let secs = |t: &str| -> u64 {
        if t == "UNLIMITED" || t.is_empty() {
            return 0;
        }
        let (days, rest) = t.split_once('-').map_or((0, t), |(d, r)| (d.parse().unwrap(), r));
        let mut parts: Vec<u64> = rest.split(':').map(|p| p.parse().unwrap()).collect();
        while parts.len() < 3 {
            parts.insert(0, 0);
        }
        days * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    };
    [
        tres("node").parse().unwrap_or(0),
        field("NumTasks").parse().unwrap_or(0),
        tres("cpu").parse().unwrap_or(0),
        tres("gres/gpu").parse().unwrap_or(0),
        mb(tres("mem")),
        secs(field("TimeLimit")),
    ]
}

/// Where Quorum reads a script of the collection otherwise than Slurm 22.05 does, and why. Every
/// other script that Slurm accepts, Quorum accepts with the same nodes, tasks, CPUs, GPUs, memory
/// and time limit; every script Slurm refuses, Quorum refuses.
const DIFFERENCES: &[(&str, &str)] = &[
    ("04-mpi-ntasks.sh", "Quorum fixes the nodes a task count needs (2) at submit; Slurm records at least 1 and finds more when the job starts"),
    ("23-cpus-per-gpu.sh", "Quorum counts --cpus-per-gpu at submit (6 CPUs, and memory per CPU for them); Slurm records 1 CPU per task until it allocates"),
    ("28-too-long.sh", "a time limit above the partition's is refused at submit; Slurm queues the job"),
    ("35-nodes-and-ntasks.sh", "--mem-per-cpu gives every node the busiest node's memory (2000M); Slurm counts each node's CPUs (1500M)"),
];

/// The collection of scripts in cli/tests/scripts/ (directive lines as public batch scripts
/// write them) reads as Slurm read it: slurm.tsv holds what Slurm 22.05 recorded for each, held,
/// on a configuration that matches this dev cluster's (benches/slurm-scripts.sh made it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_collection_reads_as_slurm_reads_it() {
    let (cluster, _c, dir, bin) = site(DevOptions::for_tests()).await;
    let scripts = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts"));
    let recorded = std::fs::read_to_string(scripts.join("slurm.tsv")).unwrap();
    let (sbatch, scontrol) = (slurm_command(bin.path(), "sbatch"), slurm_command(bin.path(), "scontrol"));
    let mut checked = 0;
    for line in recorded.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        let (name, slurm_ok) = (cols[0], cols[1] == "ok");
        let script = scripts.join(name).display().to_string();
        let (code, out, err) = run_command(&cluster, dir.path(), &sbatch, &["-H", "--parsable", &script], "");
        let quorum = if code == Some(0) {
            let id = out.trim().to_string();
            let shown = run_command(&cluster, dir.path(), &scontrol, &["-o", "show", "job", &id], "").1;
            ok(&cluster, dir.path(), bin.path(), "scancel", &[&id]);
            Some(asked(&shown))
        } else {
            None
        };
        let slurm: Option<[u64; 6]> =
            slurm_ok.then(|| std::array::from_fn(|i| cols[2 + i].parse().unwrap_or_else(|_| panic!("{line}"))));
        let known = DIFFERENCES.iter().find(|(n, _)| *n == name);
        match known {
            None => assert_eq!(quorum, slurm, "{name}: Quorum read {quorum:?} ({err}), Slurm {slurm:?}"),
            Some((_, why)) => {
                assert_ne!(quorum, slurm, "{name} now reads as Slurm's: drop it from DIFFERENCES ({why})")
            }
        }
        checked += 1;
    }
    assert!(checked >= 30, "{checked} scripts");
    cluster.shutdown().await;
}

/// What a site configures: `--mail-type` mails through the replicas' `mail_program`, called as
/// Slurm calls its MailProg (`PROGRAM -s SUBJECT RECIPIENT`, the job in `SLURM_JOB_*`): once per
/// change, to `--mail-user` or else the job's user; a job that asked for nothing is not mailed
/// about. `--licenses` counts the configured licenses across the cluster.
/// `weight_tres` (Slurm's `PriorityWeightTRES`): each resource a waiting job asks for adds its
/// weight times the job's share of what the partition holds of it; `sprio` shows them in its
/// TRES column (`-w` the weights), `scontrol show config` the setting, and the priorities follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tres_weights_raise_the_priority_of_what_a_job_asks_for_as_slurms_do() {
    let scheduler = quorum_control::config::SchedulerConfig {
        weight_tres: Some("CPU=1000,GRES/gpu=4000".into()),
        ..Default::default()
    };
    let (cluster, _c, dir, bin) = site(DevOptions { scheduler, ..DevOptions::for_tests() }).await;
    let (d, b) = (dir.path(), bin.path());
    // The weights reach the replicated policy once every replica is known at level 36.
    let weights = wait_for(T, "the TRES weights in sprio -w", || async {
        let w = ok(&cluster, d, b, "sprio", &["-w", "-h"]);
        w.contains("CPU=").then_some(w)
    })
    .await;
    assert!(weights.trim_end().ends_with(" CPU=1000,GRES/gpu=4000"), "{weights}");
    let config = ok(&cluster, d, b, "scontrol", &["show", "config"]);
    let line = config.lines().find(|l| l.starts_with("PriorityWeightTRES")).unwrap_or_default();
    assert!(line.ends_with("= CPU=1000,GRES/gpu=4000"), "{config}");
    // The partition: 16 CPUs and 8 GPUs. Four CPUs and two GPUs; eight CPUs.
    let gpus = sbatch_id(&cluster, d, b, &["--begin=now+1hour", "-n", "4", "--gres=gpu:2", "--wrap", "true"]);
    let cpus = sbatch_id(&cluster, d, b, &["--begin=now+1hour", "-n", "8", "--wrap", "true"]);
    let sprio = ok(&cluster, d, b, "sprio", &["-h", "-j", &format!("{gpus},{cpus}")]);
    let rows: Vec<Vec<&str>> = sprio.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 2, "{sprio}");
    assert_eq!((rows[0][0], rows[0].last().copied()), (gpus.to_string().as_str(), Some("cpu=250,gres/gpu=1000")));
    assert_eq!((rows[1][0], rows[1].last().copied()), (cpus.to_string().as_str(), Some("cpu=500")));
    let norm = ok(&cluster, d, b, "sprio", &["-h", "-n", "-j", &gpus.to_string()]);
    assert!(norm.trim_end().ends_with(" cpu=0.25,gres/gpu=0.25"), "{norm}");
    // The GPU job ranks above the other by what its GPUs add less what its fewer CPUs do (750),
    // less its larger job size (favour small: 167): their other factors are equal, but for a
    // moment's age.
    let priority = |row: &Vec<&str>| row[2].parse::<f64>().unwrap();
    let ahead = priority(&rows[0]) - priority(&rows[1]);
    assert!((ahead - 583.0).abs() < 5.0, "{ahead}: {sprio}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mail_and_licenses_follow_the_site_configuration() {
    use std::os::unix::fs::PermissionsExt;
    let mailbox = tempfile::tempdir().unwrap();
    let sent = mailbox.path().join("sent");
    let program = mailbox.path().join("mail");
    std::fs::write(
        &program,
        format!("#!/bin/sh\necho \"$SLURM_JOB_ID $SLURM_JOB_MAIL_TYPE|$1|$2|$3|$#\" >> {}\n", sent.display()),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let licenses = [("matlab".to_string(), 1)].into();
    let (cluster, c, dir, bin) =
        site(DevOptions { mail_program: Some(program), licenses, ..DevOptions::for_tests() }).await;
    let (d, b) = (dir.path(), bin.path());
    let told = sbatch_id(
        &cluster,
        d,
        b,
        &["-J", "told", "--mail-type=BEGIN,END", "--mail-user=ada@example.org", "--wrap", "true"],
    );
    let failing = sbatch_id(&cluster, d, b, &["-J", "failing", "--mail-type=fail", "--wrap", "exit 3"]);
    let quiet = sbatch_id(&cluster, d, b, &["-J", "quiet", "--wrap", "true"]);
    for id in [told, failing, quiet] {
        wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    }
    // A last job, mailed about once it ends: the mails go out in the order the leader sees the
    // changes, so a mail for the quiet job, or a second one for the others, would be in by then.
    let last = sbatch_id(&cluster, d, b, &["-J", "last", "--mail-type=END", "--wrap", "true"]);
    wait_state(&c, last, &["COMPLETED"], T).await;
    let read = || std::fs::read_to_string(&sent).unwrap_or_default();
    let marker = format!("{last} Ended|");
    wait_for(T, "four mails, the last job's among them", || async {
        let text = read();
        (text.lines().count() >= 4 && text.lines().any(|l| l.starts_with(&marker))).then_some(())
    })
    .await;
    let text = read();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with(&marker)).collect();
    assert_eq!(lines.len(), 3, "{text}");
    let of = |id: u64| lines.iter().filter(|l| l.starts_with(&format!("{id} "))).copied().collect::<Vec<_>>();
    let told_mail = of(told);
    assert_eq!(told_mail.len(), 2, "{text}");
    assert!(
        told_mail[0].starts_with(&format!("{told} Began|-s|Slurm Job_id={told} Name=told Began, Queued time 00:00:")),
        "{text}"
    );
    assert!(told_mail[0].ends_with("|ada@example.org|3"), "{text}");
    assert!(
        told_mail[1].starts_with(&format!("{told} Ended|-s|Slurm Job_id={told} Name=told Ended, Run time 00:00:"))
            && told_mail[1].ends_with(", COMPLETED, ExitCode 0|ada@example.org|3"),
        "{text}"
    );
    let failed = of(failing);
    assert_eq!(failed.len(), 1, "{text}");
    assert!(
        failed[0].contains("Name=failing Failed, Run time ") && failed[0].ends_with(", FAILED, ExitCode 3|root|3"),
        "{text}"
    );
    assert!(of(quiet).is_empty(), "{text}");
    // A type Slurm does not know is refused at submit, naming it.
    let (code, _, err) =
        run_command(&cluster, d, &slurm_command(b, "sbatch"), &["--mail-type=BEGIN,SOMETIMES", "--wrap", "true"], "");
    assert_eq!(code, Some(1));
    assert!(err.contains("unknown type 'SOMETIMES'"), "{err}");

    // One matlab license: the second job waits for it, as Slurm's does. (The leader records
    // the configured licenses once it knows every replica applies them.)
    wait_for(T, "the configured licenses", || {
        let (cluster, d, b) = (&cluster, d, b);
        async move { ok(cluster, d, b, "scontrol", &["show", "licenses"]).contains("LicenseName=matlab").then_some(()) }
    })
    .await;
    let first = sbatch_id(&cluster, d, b, &["-L", "matlab", "--wrap", "sleep 2"]);
    wait_state(&c, first, &["RUNNING"], T).await;
    let second = sbatch_id(&cluster, d, b, &["--licenses=matlab:1", "--wrap", "true"]);
    let lic = ok(&cluster, d, b, "scontrol", &["show", "licenses"]);
    assert_eq!(lic, "LicenseName=matlab\n   Total=1 Used=1 Free=0 Reserved=0 Remote=no\n\n");
    wait_for(T, "the second job waiting for the license", || {
        let (cluster, d, b) = (&cluster, d, b);
        async move {
            let r = ok(cluster, d, b, "squeue", &["-h", "-o", "%T %r", "-j", &second.to_string()]);
            (r.trim() == "PENDING Licenses").then_some(())
        }
    })
    .await;
    let shown = ok(&cluster, d, b, "scontrol", &["show", "job", &second.to_string()]);
    assert!(shown.contains("Licenses=matlab:1"), "{shown}");
    assert_eq!(wait_state(&c, second, &["COMPLETED", "FAILED"], T).await.state, "COMPLETED");
    for (args, says) in [
        (["-L", "abaqus"], "this cluster has no license 'abaqus' (it has matlab)"),
        (["-L", "matlab:2"], "2 of license 'matlab', of which the cluster has 1"),
    ] {
        let mut args = args.to_vec();
        args.extend(["--wrap", "true"]);
        let (code, _, err) = run_command(&cluster, d, &slurm_command(b, "sbatch"), &args, "");
        assert_eq!(code, Some(1), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraint_node_counts_pick_that_many_nodes_of_each_feature() {
    // node01-node02 on rack1, node03-node04 on rack2.
    let racks = |r: &str| vec![r.to_string()];
    let node_features = vec![racks("rack1"), racks("rack1"), racks("rack2"), racks("rack2")];
    let cluster = cluster(DevOptions { agents: 4, node_features, ..DevOptions::for_tests() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 4).await;
    let (dir, bin) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (d, b) = (dir.path(), bin.path());
    // No node count given: the job gets the three nodes its features count, and Slurm's
    // Features= shows them as written.
    let id = sbatch_id(&cluster, d, b, &["-C", "[rack1*1&rack2*2]", "--wrap", "true"]);
    wait_state(&c, id, &["COMPLETED"], T).await;
    let show = ok(&cluster, d, b, "scontrol", &["show", "job", "-o", &id.to_string()]);
    assert!(show.contains(" NumNodes=3 ") && show.contains(" Features=[rack1*1&rack2*2] "), "{show}");
    let nodes = quorum_model::hostlist::expand(&job(&c, id).await.nodelist).unwrap();
    assert_eq!(nodes.iter().filter(|n| ["node01", "node02"].contains(&n.as_str())).count(), 1, "{nodes:?}");
    assert!(nodes.contains(&"node03".to_string()) && nodes.contains(&"node04".to_string()), "{nodes:?}");
    // Four nodes, two of them on rack2: the others may be anything, so all four.
    let test_only =
        run_command(&cluster, d, &slurm_command(b, "sbatch"), &["--test-only", "-C", "rack2*2", "--wrap", "true"], "");
    assert!(test_only.2.contains(" on nodes node[03-04] "), "{test_only:?}");
    let id = sbatch_id(&cluster, d, b, &["-N", "4", "-C", "rack2*2", "--wrap", "true"]);
    assert_eq!(wait_state(&c, id, &["COMPLETED"], T).await.nodelist, "node[01-04]");
    // What the cluster cannot give, or the options do not say, is refused, naming it.
    for (args, says) in [
        (vec!["-C", "rack1*3", "--wrap", "true"], "have the features rack1*3: 3 with 'rack1' asked, 2 have it"),
        (vec!["-N", "2", "-C", "[rack1*2&rack2*2]", "--wrap", "true"], "which counts 4 nodes"),
        (vec!["-C", "rack1*2|rack2", "--wrap", "true"], "joined by & only, not |"),
    ] {
        let (code, out, err) = run_command(&cluster, d, &slurm_command(b, "sbatch"), &args, "");
        assert_eq!(code, Some(1), "sbatch {args:?}: {out}\n{err}");
        assert!(err.contains(says), "sbatch {args:?}: {err}");
    }
    cluster.shutdown().await;
}

/// `sacctmgr add|modify|delete` in Slurm's syntax, as sites script it: an account and a user in
/// it with their fairshare, then changed and taken out, each read back with `sacctmgr show`; a
/// change not confirmed is discarded; another user may not change accounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sacctmgr_adds_modifies_and_deletes_as_slurms_does() {
    let (cluster, _c, dir, bin) = site(DevOptions::for_tests()).await;
    let sacctmgr = |args: &[&str]| ok(&cluster, dir.path(), bin.path(), "sacctmgr", args);
    let out = sacctmgr(&["-i", "add", "account", "lab", "parent=root", "fairshare=10", "maxjobs=4"]);
    assert!(out.contains("Adding Account(s)") && out.contains("lab"), "{out}");
    sacctmgr(&["-i", "add", "user", "alice", "account=lab", "fairshare=3"]);
    sacctmgr(&["-i", "add", "qos", "high", "priority=100", "maxjobsperuser=2"]);
    let assoc = |cluster: &quorum_dev::cluster::DevCluster| {
        let (code, out, err) = run_command(
            cluster,
            dir.path(),
            &slurm_command(bin.path(), "sacctmgr"),
            &["-P", "-n", "show", "assoc", "where", "account=lab", "format=account,user,fairshare,maxjobs"],
            "",
        );
        assert_eq!(code, Some(0), "{err}");
        out
    };
    assert_eq!(assoc(&cluster), "lab||10|4\nlab|alice|3|\n");
    let qos = sacctmgr(&["-P", "-n", "show", "qos", "format=name,priority,maxjobspu"]);
    assert!(qos.lines().any(|l| l == "high|100|2"), "{qos}");

    sacctmgr(&["-i", "modify", "user", "where", "name=alice", "account=lab", "set", "fairshare=5"]);
    sacctmgr(&["-i", "modify", "account", "where", "name=lab", "set", "maxjobs=-1", "qos=+high"]);
    assert_eq!(assoc(&cluster), "lab||10|\nlab|alice|5|\n");

    // Not confirmed: nothing changes.
    let (code, out, _) = run_command(
        &cluster,
        dir.path(),
        &slurm_command(bin.path(), "sacctmgr"),
        &["delete", "user", "alice", "account=lab"],
        "n\n",
    );
    assert_eq!(code, Some(1));
    assert!(out.contains("Changes Discarded"), "{out}");
    assert_eq!(assoc(&cluster), "lab||10|\nlab|alice|5|\n");
    let (code, _, err) = run_command(
        &cluster,
        dir.path(),
        &slurm_command(bin.path(), "sacctmgr"),
        &["delete", "user", "alice", "account=lab"],
        "y\n",
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(assoc(&cluster), "lab||10|\n");

    // What is not kept is refused by name; a user who is not an admin changes nothing.
    let (code, _, err) = run_command(
        &cluster,
        dir.path(),
        &slurm_command(bin.path(), "sacctmgr"),
        &["-i", "add", "account", "x", "wckey=a"],
        "",
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("wckey="), "{err}");
    ensure_user("mallory");
    let denied = slurm_as(&cluster, bin.path(), "sacctmgr", "mallory", &["-i", "add", "account", "evil"]);
    assert_ne!(denied.code, 0);
    assert!(denied.stderr.contains("admin"), "{denied:?}");
    cluster.shutdown().await;
}
