//! The Slurm commands `quorum` answers to when it is called by their names (one multi-call
//! program; `quorum install-slurm-commands DIR` makes the links): `sbatch` ([`crate::sbatch`]),
//! `scancel` ([`crate::scancel`]), `squeue` ([`crate::squeue`]), `sinfo` ([`crate::sinfo`]),
//! `sacct` ([`crate::sacct`]), `scontrol` ([`crate::scontrol`]), `sprio` ([`crate::sprio`]),
//! `sshare` ([`crate::sshare`]), `sstat` ([`crate::sstat`]), `seff` ([`crate::seff`]), `sreport` ([`crate::sreport`]), `srun` (job steps,
//! [`crate::srun`]) and `salloc` ([`crate::salloc`]).

use std::path::Path;
use std::process::ExitCode;

/// The names linked by `quorum install-slurm-commands`.
pub const NAMES: &[&str] = &[
    "sacct", "sbatch", "scancel", "scontrol", "seff", "sinfo", "sprio", "squeue", "srun", "salloc", "sshare", "sstat",
];

/// Runs the Slurm command `name` with `args` (without the program name), if `quorum` knows it.
pub fn run(name: &str, args: &[String]) -> Option<ExitCode> {
    Some(match name {
        "scontrol" => crate::scontrol::main(args),
        "srun" => crate::srun::main(args),
        "sbatch" => crate::sbatch::main(args),
        "scancel" => crate::scancel::main(args),
        "squeue" => crate::squeue::main(args),
        "sinfo" => crate::sinfo::main(args),
        "sprio" => crate::sprio::main(args),
        "sshare" => crate::sshare::main(args),
        "sacct" => crate::sacct::main(args),
        "sstat" => crate::sstat::main(args),
        "seff" => crate::seff::main(args),
        "sreport" => crate::sreport::main(args),
        "salloc" => crate::salloc::main(args),
        _ => return None,
    })
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
