//! The Slurm commands `quorum` answers to when it is called by their names (one multi-call
//! program; `quorum install-slurm-commands DIR` makes the links): `sbatch` ([`crate::sbatch`]),
//! `sbcast` ([`crate::sbcast`]), `scancel` ([`crate::scancel`]), `squeue` ([`crate::squeue`]), `sinfo` ([`crate::sinfo`]),
//! `sacct` ([`crate::sacct`]), `sacctmgr` ([`crate::sacctmgr`]), `scontrol` ([`crate::scontrol`]), `sprio` ([`crate::sprio`]),
//! `sshare` ([`crate::sshare`]), `sstat` ([`crate::sstat`]), `seff` ([`crate::seff`]),
//! `sreport` ([`crate::sreport`]), `srun` (job steps,
//! [`crate::srun`]) and `salloc` ([`crate::salloc`]).

use std::path::Path;
use std::process::ExitCode;

/// A Slurm command's `main`: its arguments, without the program's name.
type Main = fn(&[String]) -> ExitCode;

/// Each Slurm command `quorum` answers to, with its `main`: what `quorum install-slurm-commands`
/// links, what [`run`] runs, and what gets a man page, from this one table.
const MAINS: &[(&str, Main)] = &[
    ("sacct", crate::sacct::main),
    ("sacctmgr", crate::sacctmgr::main),
    ("salloc", crate::salloc::main),
    ("sbatch", crate::sbatch::main),
    ("sbcast", crate::sbcast::main),
    ("scancel", crate::scancel::main),
    ("scontrol", crate::scontrol::main),
    ("seff", crate::seff::main),
    ("sinfo", crate::sinfo::main),
    ("sprio", crate::sprio::main),
    ("squeue", crate::squeue::main),
    ("sreport", crate::sreport::main),
    ("srun", crate::srun::main),
    ("sshare", crate::sshare::main),
    ("sstat", crate::sstat::main),
];

/// The Slurm command names, as linked.
pub fn names() -> impl Iterator<Item = &'static str> {
    MAINS.iter().map(|(name, _)| *name)
}

/// Runs the Slurm command `name` with `args` (without the program name), if `quorum` knows it.
pub fn run(name: &str, args: &[String]) -> Option<ExitCode> {
    MAINS.iter().find(|(n, _)| *n == name).map(|(_, main)| main(args))
}

/// The parser of the Slurm command `name`, under that name: what its man page is made from, and
/// what the manual's commands are checked against. Each takes its arguments without the
/// program's name, as [`run`] passes them.
pub fn command(name: &str) -> Option<clap::Command> {
    use clap::CommandFactory;
    let name = names().find(|n| *n == name)?;
    let cmd = match name {
        "sacct" => crate::sacct::SacctArgs::command(),
        "sacctmgr" => crate::sacctmgr::SacctmgrArgs::command(),
        "sbatch" => crate::sbatch::SbatchArgs::command(),
        "sbcast" => crate::sbcast::SbcastArgs::command(),
        "scancel" => crate::scancel::ScancelArgs::command(),
        "scontrol" => crate::scontrol::command(),
        "seff" => crate::seff::SeffArgs::command(),
        "sinfo" => crate::sinfo::SinfoArgs::command(),
        "sprio" => crate::sprio::SprioArgs::command(),
        "squeue" => crate::squeue::SqueueArgs::command(),
        "srun" => crate::srun::SrunArgs::command(),
        "salloc" => crate::salloc::SallocArgs::command(),
        "sshare" => crate::sshare::SshareArgs::command(),
        "sstat" => crate::sstat::SstatArgs::command(),
        "sreport" => crate::sreport::SreportArgs::command(),
        _ => return None,
    };
    Some(cmd.name(name).display_name(name).bin_name(name).no_binary_name(true))
}

/// Links each Slurm command name in `dir` to this program (replacing what links there).
pub fn install(dir: &Path) -> anyhow::Result<ExitCode> {
    let program = std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot find this program: {e}"))?;
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    for name in names() {
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
