//! `sbcast SOURCE DEST`: copies a file to every node of the job's allocation, as Slurm's sbcast
//! does, through the paths a job's user already has: on each node, steps (`srun --overlap -w
//! NODE -n1`, each step's standard input a part of the file of at most [`PART`] bytes, under the
//! agent's bound on a task's unread input) run `quorum bcast --receive DEST` there, as the job's
//! user, in the caller's directory. So it writes only where the user may, with the user's own
//! permissions checked by the node's kernel; nothing runs with more. Each part's length is
//! checked as it lands, and the whole file's at the end: the copy lands whole or not at all (a
//! temporary file beside DEST, renamed), with the source's mode (`-p`: and its times); an
//! existing DEST is kept unless `-f`.

use std::io::{Read, Write};
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
    /// With --receive: this part's place in the file, its length, and the file's (bytes).
    #[arg(long, requires = "receive", num_args = 3, value_names = ["OFFSET", "LENGTH", "SIZE"])]
    part: Vec<u64>,
    /// With --receive: the name this copy's temporary file shares across its parts.
    #[arg(long = "copy-id", requires = "receive")]
    copy_id: Option<String>,
    /// With --receive: the copy failed; remove its temporary file.
    #[arg(long, requires = "receive")]
    abandon: bool,
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
        if a.abandon {
            let id = a.copy_id.as_deref().ok_or_else(|| anyhow::anyhow!("--abandon needs --copy-id"))?;
            let _ = std::fs::remove_file(temp_of(dest, id)?);
            return Ok(0);
        }
        let [offset, length, size] = a.part[..] else { anyhow::bail!("--receive needs --part OFFSET LENGTH SIZE") };
        let token = a.copy_id.as_deref().ok_or_else(|| anyhow::anyhow!("--receive needs --copy-id"))?;
        let part = Part { offset, length, size, token };
        receive(dest, a.force, a.mode.as_deref(), &a.times, &part)?;
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
    let program = std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot find this program: {e}"))?;
    let size = meta.len();
    let mut failed = 0;
    for batch in nodes.chunks(a.fanout.max(1)) {
        // Each node's parts in order, the nodes side by side.
        let results: Vec<(String, Result<(), String>)> = std::thread::scope(|scope| {
            let sends: Vec<_> = batch
                .iter()
                .map(|node| {
                    let (program, args) = (&program, &receive_args);
                    scope.spawn(move || (node.clone(), send(program, job, node, args, source, dest, size)))
                })
                .collect();
            sends.into_iter().map(|h| h.join().unwrap_or_else(|_| (String::new(), Err("panicked".into())))).collect()
        });
        for (node, result) in results {
            if let Err(why) = result {
                failed += 1;
                eprintln!("sbcast: error: {node}: {}", why.trim_start_matches("sbcast: error: "));
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

/// The most bytes one step carries: under the 4 MiB of a task's input an agent holds unread.
pub const PART: u64 = 3 << 20;

/// `source` to `node`, part by part: one step each, the receiver's words on failure.
fn send(
    program: &Path,
    job: u64,
    node: &str,
    args: &[String],
    source: &Path,
    dest: &Path,
    size: u64,
) -> Result<(), String> {
    let mut file = std::fs::File::open(source).map_err(|e| format!("cannot read {}: {e}", source.display()))?;
    let mut offset = 0;
    // One temporary file per copy and node: nodes that share DEST's file system each make their
    // own (and each puts its own whole copy in place).
    let id = format!("{job}.{}.{node}", std::process::id());
    loop {
        let length = PART.min(size - offset);
        let mut buf = vec![0u8; length as usize];
        // The parts in order: each read goes on where the last ended.
        file.read_exact(&mut buf).map_err(|e| format!("cannot read {}: {e}", source.display()))?;
        let mut all = args.to_vec();
        all.extend(["--copy-id".into(), id.clone()]);
        all.extend(["--part".into(), offset.to_string(), length.to_string(), size.to_string()]);
        all.extend(["--".into(), dest.display().to_string()]);
        let mut child = step(program, job, node, &all).map_err(|e| format!("cannot start srun: {e}"))?;
        let mut input = child.stdin.take().ok_or("srun has no standard input")?;
        // Written from here while srun runs; its end closes the task's input.
        let writer = std::thread::spawn(move || input.write_all(&buf));
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let _ = writer.join();
        if !out.status.success() {
            // What earlier parts wrote goes too (a failed part removes it itself, when it ran).
            if offset > 0 {
                let mut abandon: Vec<String> =
                    ["bcast", "--receive", "--abandon", "--copy-id"].map(String::from).to_vec();
                abandon.extend([id.clone(), "--".into(), dest.display().to_string()]);
                if let Ok(mut cleanup) = step(program, job, node, &abandon) {
                    drop(cleanup.stdin.take());
                    let _ = cleanup.wait();
                }
            }
            let said = String::from_utf8_lossy(&out.stderr);
            // The receiver's own words (`sbcast: error: ...`), without srun's about the task.
            let why: Vec<&str> = said.lines().filter(|l| !l.starts_with("srun: ")).collect();
            return Err(if why.is_empty() { said.trim().to_string() } else { why.join("; ") });
        }
        offset += length;
        if offset >= size {
            return Ok(());
        }
    }
}

/// `srun --jobid JOB --overlap -w NODE -N1 -n1 -Q PROGRAM ARGS`, its standard input a pipe.
fn step(program: &Path, job: u64, node: &str, args: &[String]) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(program)
        .arg0("srun")
        .args(["--jobid", &job.to_string(), "--overlap", "-w", node, "-N1", "-n1", "-Q", "--export=ALL"])
        .arg(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
}

/// Where one part goes: its place and length, the whole file's size, and the copy's token.
struct Part<'a> {
    offset: u64,
    length: u64,
    size: u64,
    token: &'a str,
}

/// The temporary file of copy `id` of `dest`, beside it.
fn temp_of(dest: &Path, id: &str) -> anyhow::Result<PathBuf> {
    let name = dest.file_name().ok_or_else(|| anyhow::anyhow!("{} names no file", dest.display()))?;
    if id.contains('/') || id.len() > 300 {
        anyhow::bail!("invalid --copy-id");
    }
    let dir = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Ok(dir.join(format!(".{}.sbcast.{id}", name.to_string_lossy())))
}

/// On a node: standard input, one part of the file, into the copy's temporary file beside
/// `dest` (made by the first part, as the step's user, with the user's rights); the last part
/// gives it `mode` and `times` and puts it in place (without `force`, only where nothing is).
/// A part that is not all there (or out of order) ends the copy, its temporary file removed.
fn receive(dest: &Path, force: bool, mode: Option<&str>, times: &[i64], part: &Part) -> anyhow::Result<()> {
    let mode = match mode {
        Some(m) => u32::from_str_radix(m, 8).map_err(|_| anyhow::anyhow!("invalid --mode '{m}'"))? & 0o777,
        None => 0o644,
    };
    let temp = temp_of(dest, part.token)?;
    if !force && part.offset == 0 && std::fs::symlink_metadata(dest).is_ok() {
        anyhow::bail!("{} exists (--force replaces it)", dest.display());
    }
    let opened = if part.offset == 0 {
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temp)
    } else {
        std::fs::OpenOptions::new().append(true).custom_flags(libc::O_NOFOLLOW).open(&temp)
    };
    let mut file = opened.map_err(|e| anyhow::anyhow!("cannot write {}: {e}", dest.display()))?;
    let written = (|| -> std::io::Result<()> {
        let at = file.metadata()?.len();
        if at != part.offset {
            return Err(std::io::Error::other(format!("a part for byte {} came when {at} were there", part.offset)));
        }
        let got = std::io::copy(&mut std::io::stdin().lock().take(part.length.saturating_add(1)), &mut file)?;
        if got != part.length {
            return Err(std::io::Error::other(format!("{got} of a part's {} bytes came", part.length)));
        }
        if part.offset.saturating_add(part.length) < part.size {
            return Ok(());
        }
        file.flush()?;
        if file.metadata()?.len() != part.size {
            return Err(std::io::Error::other("the copy's length is not the file's"));
        }
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
        let r =
            SbcastArgs::try_parse_from(["--receive", "--part", "0", "3", "3", "--copy-id", "1.2", "--", "x"]).unwrap();
        assert_eq!(
            (r.part, r.copy_id.as_deref(), r.source.as_deref()),
            (vec![0, 3, 3], Some("1.2"), Some(Path::new("x")))
        );
        assert!(a.force && a.preserve && a.fanout == 2);
        assert_eq!(a.dest.as_deref(), Some(Path::new("/tmp/app")));
        assert!(SbcastArgs::try_parse_from(["--mode", "755", "x"]).is_err(), "--mode only with --receive");
    }

    #[test]
    fn a_copy_lands_whole_with_its_mode_and_keeps_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("kept");
        std::fs::write(&dest, "old").unwrap();
        let part = Part { offset: 0, length: 3, size: 3, token: "1.2" };
        let e = receive(&dest, false, Some("755"), &[], &part).unwrap_err().to_string();
        assert!(e.contains("exists") && e.contains("--force"), "{e}");
        assert_eq!(std::fs::read_to_string(&dest).unwrap(), "old");
        assert!(receive(Path::new("/"), false, None, &[], &part).unwrap_err().to_string().contains("names no file"));
        let bad = Part { token: "../x", ..part };
        assert!(receive(&dest, true, None, &[], &bad).unwrap_err().to_string().contains("--copy-id"));
        // A later part with no first one before it: refused, nothing left behind.
        let later = Part { offset: 3, length: 3, size: 6, token: "1.2" };
        assert!(receive(&dir.path().join("new"), false, None, &[], &later).is_err());
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left");
    }
}
