//! The Slurm commands `quorum` answers to when it is called by their names (one multi-call
//! program; `quorum install-slurm-commands DIR` makes the links). So far: `sbatch`
//! ([`crate::sbatch`]), `scancel` ([`crate::scancel`]), `squeue` ([`crate::squeue`]), `sacct` ([`crate::sacct`]), `srun` (job steps,
//! [`crate::srun`]), `salloc` ([`crate::salloc`]), and `scontrol show
//! hostnames|hostlist|hostlistsorted`, which batch scripts use to find their nodes.

use std::path::Path;
use std::process::ExitCode;

use quorum_model::hostlist;

/// The names linked by `quorum install-slurm-commands`.
pub const NAMES: &[&str] = &["sacct", "sbatch", "scancel", "scontrol", "squeue", "srun", "salloc"];

/// Runs the Slurm command `name` with `args` (without the program name), if `quorum` knows it.
pub fn run(name: &str, args: &[String]) -> Option<ExitCode> {
    let result = match name {
        "scontrol" => scontrol(args),
        "srun" => return Some(crate::srun::main(args)),
        "sbatch" => return Some(crate::sbatch::main(args)),
        "scancel" => return Some(crate::scancel::main(args)),
        "squeue" => return Some(crate::squeue::main(args)),
        "sacct" => return Some(crate::sacct::main(args)),
        "salloc" => return Some(crate::salloc::main(args)),
        _ => return None,
    };
    Some(match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name}: error: {e}");
            ExitCode::FAILURE
        }
    })
}

/// `scontrol show hostnames [LIST]`, `show hostlist LIST`, `show hostlistsorted LIST`. Without a
/// list, `hostnames` reads `SLURM_JOB_NODELIST`, as Slurm's does.
fn scontrol(args: &[String]) -> Result<String, String> {
    let words: Vec<String> = args.iter().map(|a| a.to_ascii_lowercase()).collect();
    let supported = "Quorum's scontrol supports `show hostnames [LIST]`, `show hostlist LIST` and `show hostlistsorted LIST`; use `quorum` for the rest";
    let (Some("show"), Some(entity)) = (words.first().map(String::as_str), words.get(1).map(String::as_str)) else {
        return Err(format!("'{}' is not supported: {supported}", args.join(" ")));
    };
    let list = match args.get(2) {
        Some(list) => list.clone(),
        None if entity.starts_with("hostname") => std::env::var("SLURM_JOB_NODELIST").unwrap_or_default(),
        None => String::new(),
    };
    if list.trim().is_empty() {
        return Err("host list is empty".into());
    }
    let names = hostlist::expand(list.trim()).map_err(|e| format!("invalid host list '{list}': {e}"))?;
    match entity {
        "hostnames" | "hostname" => Ok(names.iter().map(|n| format!("{n}\n")).collect()),
        "hostlist" => Ok(format!("{}\n", hostlist::compress(&names))),
        "hostlistsorted" => {
            let mut names = names;
            names.sort_by(|a, b| natural_key(a).cmp(&natural_key(b)));
            Ok(format!("{}\n", hostlist::compress(&names)))
        }
        other => Err(format!("'show {other}' is not supported: {supported}")),
    }
}

/// A host name as (prefix, number, the name): `n10` after `n9`.
fn natural_key(name: &str) -> (&str, u64, &str) {
    let digits = name.len() - name.bytes().rev().take_while(u8::is_ascii_digit).count();
    let (prefix, number) = name.split_at(digits);
    (prefix, number.parse().unwrap_or(0), name)
}

/// Links each Slurm command name in `dir` to this program (replacing what links there).
pub fn install(dir: &Path) -> anyhow::Result<ExitCode> {
    let program = std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot find this program: {e}"))?;
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    for name in NAMES {
        let link = dir.join(name);
        match std::fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(&link)?,
            Ok(_) => anyhow::bail!("{} exists and is not a link: not replaced", link.display()),
            Err(_) => {}
        }
        std::os::unix::fs::symlink(&program, &link)
            .map_err(|e| anyhow::anyhow!("cannot link {}: {e}", link.display()))?;
        println!("{} -> {}", link.display(), program.display());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn scontrol_shows_host_names_and_lists() {
        assert_eq!(scontrol(&args("show hostnames gpu[01-03],cpu7")).unwrap(), "gpu01\ngpu02\ngpu03\ncpu7\n");
        assert_eq!(scontrol(&args("SHOW HOSTNAMES n1")).unwrap(), "n1\n");
        assert_eq!(scontrol(&args("show hostlist n1,n2,n3,n5")).unwrap(), "n[1-3,5]\n");
        assert_eq!(scontrol(&args("show hostlistsorted n10,n9,n1")).unwrap(), "n[1,9-10]\n");
        assert!(scontrol(&args("show hostlist")).unwrap_err().contains("host list is empty"));
        assert!(scontrol(&args("show hostnames n[1-")).unwrap_err().contains("invalid host list 'n[1-'"));
        assert!(scontrol(&args("show job 5")).unwrap_err().contains("not supported"));
        assert!(scontrol(&args("update")).unwrap_err().contains("not supported"));
    }
}
