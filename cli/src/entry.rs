//! How each Slurm command's `main` runs (`srun`, `salloc`, `sbatch`, `scancel`, `squeue`,
//! `sacct`): its arguments parsed, its work done on a runtime of its own, its errors printed
//! under its name.

use std::process::ExitCode;

/// How many threads a command's runtime has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threads {
    /// One: a command that sends a request or a few (`sbatch`, `squeue`, ...). Worker threads to
    /// start and wake would be a third of its CPU, which workflow managers running one `sbatch`
    /// per job pay for every job.
    One,
    /// Two workers besides the caller: `srun` and `salloc`, which relay standard input, output
    /// and signals while their steps run.
    Workers,
}

/// Runs a Slurm command's `main`: parses `args` as `A` (help, and errors, as clap prints them),
/// runs `run` on a runtime of its own, and exits with the code it gives, or with 1 after
/// `NAME: error: ...`. The runtime's tasks are not waited for (`srun`'s read of its standard
/// input may still wait for a key).
pub fn main_of<A, F, Fut>(name: &str, threads: Threads, args: &[String], run: F) -> ExitCode
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
    let runtime = match threads {
        Threads::One => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        Threads::Workers => tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build(),
    };
    let result = match runtime {
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
