//! `sbcast SOURCE DEST`: copies a file to every node of the job's allocation, as Slurm's sbcast
//! does, through the paths a job's user already has: one step per node (`srun --overlap -w NODE
//! -n1`, the step's standard input the file) runs `quorum bcast --receive DEST` there, as the
//! job's user, in the caller's directory. So it writes only where the user may, with the user's
//! own permissions checked by the node's kernel; nothing runs with more. The copy lands whole or
//! not at all (a temporary file beside DEST, renamed), with the source's mode (`-p`: and its
//! times); an existing DEST is kept unless `-f`.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_proto::api;

use crate::commands::Context;

#[derive(Parser, Debug)]
#[command(
    name = "sbcast",
    no_binary_name = true,
    about = "Copy a file to every node of a job's allocation (Quorum's sbcast)"
)]
pub struct SbcastArgs {
    #[command(flatten)]
    controllers: ControllersArg,
    /// Replace DEST where it exists (without it, an existing DEST is an error).
    #[arg(short = 'f', long)]
    force: bool,
    /// Keep the source's modification and access times (its mode is always kept).
    #[arg(short = 'p', long)]
    preserve: bool,
    /// The job whose nodes get the file (default: $SLURM_JOB_ID, the allocation this runs in).
    #[arg(short = 'j', long = "jobid")]
    jobid: Option<String>,
    /// Compress in transit (accepted: the agents' streams carry the file as it is).
    #[arg(short = 'C', long, num_args = 0..=1, default_missing_value = "", require_equals = true)]
    compress: Option<String>,
    /// How many nodes are written to at once (default 8).
    #[arg(short = 'F', long, default_value_t = 8)]
    fanout: usize,
    /// Block size (accepted: the file is streamed in the steps' own blocks).
    #[arg(short = 's', long)]
    size: Option<String>,
    /// Seconds to wait for each node (accepted: each node's step ends with the copy).
    #[arg(short = 't', long)]
    timeout: Option<u64>,
    /// Used on each node by sbcast itself: write standard input to DEST, as the step's user.
    #[arg(long, hide_short_help = true)]
    receive: bool,
    /// With --receive: the file's mode (octal).
    #[arg(long, requires = "receive")]
    mode: Option<String>,
    /// With --receive: its modification and access times (seconds since the epoch).
    #[arg(long, requires = "receive", num_args = 2, value_names = ["MTIME", "ATIME"])]
    times: Vec<i64>,
    /// The file to copy (with --receive: the DEST to write).
    source: Option<PathBuf>,
    /// Where it goes on each node (relative: to this directory there).
    dest: Option<PathBuf>,
}

pub fn main(args: &[String]) -> std::process::ExitCode {
    crate::entry::main_of::<SbcastArgs, _, _>("sbcast", crate::entry::Threads::One, args, run)
}

pub async fn run(a: SbcastArgs) -> anyhow::Result<u8> {
    if a.receive {
        let dest = a.source.as_deref().ok_or_else(|| anyhow::anyhow!("--receive needs DEST"))?;
        receive(dest, a.force, a.mode.as_deref(), &a.times)?;
        return Ok(0);
    }
    let (Some(source), Some(dest)) = (&a.source, &a.dest) else {
        anyhow::bail!("give SOURCE and DEST: sbcast [-f] [-p] SOURCE DEST");
    };
    let job = match a.jobid.clone().or_else(|| std::env::var("SLURM_JOB_ID").ok()) {
        Some(j) => j.trim().parse::<u64>().map_err(|_| anyhow::anyhow!("invalid job id '{j}'"))?,
        None => anyhow::bail!("sbcast runs inside a job's allocation (salloc, sbatch), or give --jobid"),
    };
    let meta = std::fs::metadata(source).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", source.display()))?;
    if !meta.is_file() {
        anyhow::bail!("{} is not a regular file", source.display());
    }
    // Every node of the allocation, from the job as the controllers have it.
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let req = api::GetJobRequest { job_id: job, stale: false, array_task_id: None };
    let info = ctx.send(req, |mut c, r| async move { c.get_job(r).await }).await?;
    let info = info.job.ok_or_else(|| anyhow::anyhow!("job {job} is not known"))?;
    if info.state != "RUNNING" {
        anyhow::bail!("job {job} is {}: sbcast copies to a running job's nodes", info.state);
    }
    let nodes: Vec<String> = info.allocation.iter().map(|n| n.node.clone()).collect();
    let mut receive_args = vec!["bcast".to_string(), "--receive".to_string()];
    if a.force {
        receive_args.push("--force".into());
    }
    receive_args.extend(["--mode".into(), format!("{:o}", meta.mode() & 0o777)]);
    if a.preserve {
        receive_args.extend(["--times".into(), meta.mtime().to_string(), meta.atime().to_string()]);
    }
    receive_args.extend(["--".into(), dest.display().to_string()]);
    let program = std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot find this program: {e}"))?;
    let mut failed = 0;
    for batch in nodes.chunks(a.fanout.max(1)) {
        let mut children = Vec::new();
        for node in batch {
            let file =
                std::fs::File::open(source).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", source.display()))?;
            let child = step(&program, job, node, &receive_args, file)
                .map_err(|e| anyhow::anyhow!("cannot start srun for {node}: {e}"))?;
            children.push((node, child));
        }
        for (node, child) in children {
            let out = child.wait_with_output()?;
            if !out.status.success() {
                failed += 1;
                let said = String::from_utf8_lossy(&out.stderr);
                // The receiver's own words (`sbcast: error: ...`), without srun's about the task.
                let why: Vec<&str> = said.lines().filter(|l| !l.starts_with("srun: ")).collect();
                let why = if why.is_empty() { said.trim().to_string() } else { why.join("; ") };
                eprintln!("sbcast: error: {node}: {}", why.trim_start_matches("sbcast: error: "));
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

/// `srun --jobid JOB --overlap -w NODE -N1 -n1 -Q PROGRAM ARGS` with `input` as its standard input.
fn step(
    program: &Path,
    job: u64,
    node: &str,
    args: &[String],
    input: std::fs::File,
) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(program)
        .arg0("srun")
        .args(["--jobid", &job.to_string(), "--overlap", "-w", node, "-N1", "-n1", "-Q", "--export=ALL"])
        .arg(program)
        .args(args)
        .stdin(input)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
}

/// On a node: standard input into `dest`, whole: a temporary file beside it (created by this
/// process, so as the step's user, with the user's rights), given `mode` and `times`, then put in
/// place (without `force`, only where nothing is).
fn receive(dest: &Path, force: bool, mode: Option<&str>, times: &[i64]) -> anyhow::Result<()> {
    let mode = match mode {
        Some(m) => u32::from_str_radix(m, 8).map_err(|_| anyhow::anyhow!("invalid --mode '{m}'"))? & 0o777,
        None => 0o644,
    };
    let name = dest.file_name().ok_or_else(|| anyhow::anyhow!("{} names no file", dest.display()))?;
    let dir = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !force && std::fs::symlink_metadata(dest).is_ok() {
        anyhow::bail!("{} exists (--force replaces it)", dest.display());
    }
    let temp = dir.join(format!(".{}.sbcast.{}", name.to_string_lossy(), std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", dest.display()))?;
    let written = (|| -> std::io::Result<()> {
        std::io::copy(&mut std::io::stdin().lock(), &mut file)?;
        file.flush()?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        if let [mtime, atime] = times {
            let at = |s: i64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s.max(0) as u64);
            file.set_times(std::fs::FileTimes::new().set_modified(at(*mtime)).set_accessed(at(*atime)))?;
        }
        file.sync_all()?;
        if force {
            std::fs::rename(&temp, dest)
        } else {
            // A link fails where something already is: no check-then-write race.
            std::fs::hard_link(&temp, dest).and_then(|()| std::fs::remove_file(&temp))
        }
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        anyhow::bail!("cannot write {}: {e}", dest.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbcast_reads_slurms_options() {
        let a = SbcastArgs::try_parse_from(["-f", "-p", "--compress=lz4", "-F", "2", "app", "/tmp/app"]).unwrap();
        assert!(a.force && a.preserve && a.fanout == 2);
        assert_eq!(a.dest.as_deref(), Some(Path::new("/tmp/app")));
        assert!(SbcastArgs::try_parse_from(["--mode", "755", "x"]).is_err(), "--mode only with --receive");
    }

    #[test]
    fn a_copy_lands_whole_with_its_mode_and_keeps_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("kept");
        std::fs::write(&dest, "old").unwrap();
        let e = receive(&dest, false, Some("755"), &[]).unwrap_err().to_string();
        assert!(e.contains("exists") && e.contains("--force"), "{e}");
        assert_eq!(std::fs::read_to_string(&dest).unwrap(), "old");
        assert!(receive(Path::new("/"), false, None, &[]).unwrap_err().to_string().contains("names no file"));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left");
    }
}
