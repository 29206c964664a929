//! How each Slurm command's `main` runs (`srun`, `salloc`, `sbatch`, `scancel`, `squeue`,
//! `sacct`): its arguments parsed, its work done on a runtime of its own, its errors printed
//! under its name.

use std::process::ExitCode;

/// Runs a Slurm command's `main`: parses `args` as `A` (help, and errors, as clap prints them),
/// runs `run` on a runtime of its own, and exits with the code it gives, or with 1 after
/// `NAME: error: ...`. The runtime's tasks are not waited for (`srun`'s read of its standard
/// input may still wait for a key).
pub fn main_of<A, F, Fut>(name: &str, args: &[String], run: F) -> ExitCode
where
    A: clap::Parser,
    F: FnOnce(A) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<u8>>,
{
    let parsed = match A::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(1) } else { ExitCode::SUCCESS };
        }
    };
    let result = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => {
            let result = rt.block_on(run(parsed));
            rt.shutdown_background();
            result
        }
        Err(e) => Err(anyhow::anyhow!("starting the async runtime: {e}")),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("{name}: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
