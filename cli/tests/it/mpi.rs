//! MPI programs as HPC users start them, with Debian's real MPI libraries (MPICH 4, Open MPI 4)
//! on two nodes of agent processes: direct launch by `srun --mpi=pmi2` (the agents serve PMI and
//! carry fences between nodes), and `mpirun`/`mpiexec` inside `salloc` and `sbatch` (Open MPI's and
//! MPICH's Slurm launchers start their daemons with `srun` and the options they pass).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use quorum_dev::cluster::{DevCluster, DevOptions};
use quorum_model::mpi::Mpi;

const T: Duration = Duration::from_secs(90);

/// Rank, size, host, an MPI_Allreduce of rank + 1 and a barrier; with an argument N, rank N
/// exits with code 7 after the reduction while the others wait in a barrier that never ends.
const PROGRAM: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    long mine = rank + 1, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (argc > 1 && rank == atoi(argv[1])) {
        fflush(stdout);
        _exit(7);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const char *node = getenv("SLURMD_NODENAME");
    printf("rank %d size %d host %s node %s sum %ld\n", rank, size, host, node ? node : "-", sum);
    MPI_Finalize();
    return 0;
}
"#;

/// The program built with `compiler` (mpicc.mpich, mpicc.openmpi) into `dir`.
fn build(dir: &Path, compiler: &str, name: &str) -> PathBuf {
    let source = dir.join("allreduce.c");
    std::fs::write(&source, PROGRAM).unwrap();
    let out = dir.join(name);
    let built = Command::new(compiler).arg("-o").arg(&out).arg(&source).output().unwrap_or_else(|e| {
        panic!("{compiler}: {e} (install mpich, libmpich-dev, openmpi-bin and libopenmpi-dev: scripts/install-build-deps.sh)")
    });
    assert!(built.status.success(), "{compiler}: {}", String::from_utf8_lossy(&built.stderr));
    out
}

fn options(mpi_default: Mpi) -> DevOptions {
    resolvable_nodes(&["node01", "node02"]);
    DevOptions {
        quorum_program: Some(env!("CARGO_BIN_EXE_quorum").into()),
        agent_binary: Some(agent_binary()),
        cpus_per_agent: 4,
        mpi_default,
        ..DevOptions::for_tests()
    }
}

/// A directory holding the Slurm commands as links to `quorum`.
fn slurm_bin() -> tempfile::TempDir {
    let bin = tempfile::tempdir().unwrap();
    for name in ["srun", "salloc", "sbatch", "scontrol", "squeue"] {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_quorum"), bin.path().join(name)).unwrap();
    }
    bin
}

/// `program ARGS` in `dir` with the cluster's environment and the Slurm commands first on PATH:
/// (exit code, stdout, stderr).
fn run(cluster: &DevCluster, bin: &Path, dir: &Path, program: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(bin.join(program))
        .args(args)
        .envs(cluster.env())
        .env("PATH", path)
        // Open MPI refuses root unless told twice; the tests run as root, as CI does.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The ranks' lines of one run of 4 ranks on node01 and node02, 2 each: every rank once, each
/// of size 4 with the right sum, on the node (its host name) its rank says (blocks of 2). Ranks
/// that srun started are also told their node (`SLURMD_NODENAME`); `mpirun` passes its own
/// environment on to the ranks it starts, as it does on Slurm.
fn assert_world(out: &str, err: &str) {
    let mut ranks: Vec<(u32, String)> = Vec::new();
    for line in out.lines().filter(|l| l.starts_with("rank ")) {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((w[3], w[9]), ("4", "10"), "size and sum: {line}\n{out}\n{err}");
        ranks.push((w[1].parse().unwrap(), w[5].to_string()));
    }
    ranks.sort();
    let expected: Vec<(u32, String)> =
        [(0, "node01"), (1, "node01"), (2, "node02"), (3, "node02")].map(|(r, n)| (r, n.to_string())).to_vec();
    assert_eq!(ranks, expected, "stdout:\n{out}\nstderr:\n{err}");
}

/// `srun --mpi=pmi2` starts MPICH's ranks as one world across both nodes; the cluster's
/// MpiDefault (pmi2 here) applies without `--mpi`, and `--mpi=none` starts singletons; a rank
/// that fails with `--kill-on-bad-exit` ends the step with its code; a task that sends its PMI
/// server garbage harms no one else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srun_direct_launch_serves_pmi2_to_mpich_across_nodes() {
    let cluster = cluster(options(Mpi::Pmi2)).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let bin = slurm_bin();
    build(dir.path(), "mpicc.mpich", "allreduce_mpich");

    let (code, out, err) = run(&cluster, bin.path(), dir.path(), "srun", &["--mpi=list"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("pmi2") && out.contains("none"), "{out}");

    let salloc =
        |cmd: &str| run(&cluster, bin.path(), dir.path(), "salloc", &["-N2", "--ntasks-per-node=2", "bash", "-c", cmd]);
    let (code, out, err) = salloc("srun --mpi=pmi2 -N2 -n4 ./allreduce_mpich");
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_world(&out, &err);
    for line in out.lines().filter(|l| l.starts_with("rank ")) {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w[5], w[7], "srun tells each rank its node: {line}");
    }
    // MpiDefault=pmi2: srun without --mpi.
    let (code, out, err) = salloc("srun ./allreduce_mpich");
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_world(&out, &err);
    // --mpi=none: four worlds of one, as without PMI.
    let (code, out, err) = salloc("srun --mpi=none ./allreduce_mpich");
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(out.lines().filter(|l| l.contains(" size 1 ")).count(), 4, "{out}\n{err}");

    // Rank 3 exits 7 after the reduction; the others wait in a barrier until srun ends the step.
    let started = std::time::Instant::now();
    let (code, out, err) = salloc("srun --mpi=pmi2 --kill-on-bad-exit ./allreduce_mpich 3; echo srun=$?");
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("srun=7"), "{out}\n{err}");
    assert!(started.elapsed() < T);

    // A task that feeds its PMI server an endless line, then one that speaks out of turn: each
    // loses its own connection; the agents serve the next step as before.
    let hostile = "printf 'cmd=init pmi_version=2 pmi_subversion=0\\n' >&\\$PMI_FD; head -c 100000 /dev/zero | tr '\\0' 9 >&\\$PMI_FD; echo alive";
    let (code, out, err) = salloc(&format!(
        "srun --mpi=pmi2 -n1 bash -c \"{hostile}\"; srun --mpi=pmi2 -n1 bash -c 'echo cmd=barrier_out >&$PMI_FD; echo alive'; srun --mpi=pmi2 ./allreduce_mpich"
    ));
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(out.lines().filter(|l| *l == "alive").count(), 2, "{out}\n{err}");
    assert_world(&out, &err);

    // What the cluster does not offer is named.
    let (code, _, err) = salloc("srun --mpi=cray_shasta true");
    assert_ne!(code, Some(0));
    assert!(err.contains("--mpi=cray_shasta") && err.contains("pmi2"), "{err}");
    cluster.shutdown().await;
}

/// `mpirun` (Open MPI) and `mpiexec` (MPICH's hydra) inside `salloc` and in a batch script find
/// the allocation and start their daemons through `srun` with the options they pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpirun_and_mpiexec_run_inside_allocations() {
    let cluster = cluster(options(Mpi::None)).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let bin = slurm_bin();
    build(dir.path(), "mpicc.mpich", "allreduce_mpich");
    build(dir.path(), "mpicc.openmpi", "allreduce_ompi");

    for launcher in ["mpirun.openmpi ./allreduce_ompi", "mpiexec.mpich ./allreduce_mpich"] {
        let (code, out, err) =
            run(&cluster, bin.path(), dir.path(), "salloc", &["-N2", "--ntasks-per-node=2", "bash", "-c", launcher]);
        assert_eq!(code, Some(0), "{launcher}:\n{out}\n{err}");
        assert_world(&out, &err);
    }

    let script = "#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=2\n\
                  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n\
                  mpirun.openmpi ./allreduce_ompi > ompi.out\n\
                  mpiexec.mpich ./allreduce_mpich > mpich.out\n\
                  srun --mpi=pmi2 ./allreduce_mpich > direct.out\n";
    std::fs::write(dir.path().join("job.sh"), script).unwrap();
    let (code, out, err) = run(&cluster, bin.path(), dir.path(), "sbatch", &["-o", "batch.out", "job.sh"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let id: u64 = out.split_whitespace().last().unwrap().parse().unwrap();
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"], T).await;
    let log = std::fs::read_to_string(dir.path().join("batch.out")).unwrap_or_default();
    assert_eq!(j.state, "COMPLETED", "{j:?}\n{log}");
    for name in ["ompi.out", "mpich.out", "direct.out"] {
        let out = std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert_world(&out, &format!("{name}; the job's output:\n{log}"));
    }
    cluster.shutdown().await;
}
