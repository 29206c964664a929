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
/// exits with code 7 after the reduction while the others wait in a barrier that never ends
/// (with a second argument `abort`, it calls MPI_Abort with code 5 instead).
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
        if (argc > 2) MPI_Abort(MPI_COMM_WORLD, 5);
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
    assert_layout(out, err, [(0, "node01"), (1, "node01"), (2, "node02"), (3, "node02")]);
}

/// As [`assert_world`], with the ranks numbered round-robin over the nodes
/// (`--distribution=cyclic`).
fn assert_cyclic_world(out: &str, err: &str) {
    assert_layout(out, err, [(0, "node01"), (1, "node02"), (2, "node01"), (3, "node02")]);
}

fn assert_layout(out: &str, err: &str, layout: [(u32, &str); 4]) {
    let mut ranks: Vec<(u32, String)> = Vec::new();
    for line in out.lines().filter(|l| l.starts_with("rank ")) {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((w[3], w[9]), ("4", "10"), "size and sum: {line}\n{out}\n{err}");
        ranks.push((w[1].parse().unwrap(), w[5].to_string()));
    }
    ranks.sort();
    let expected: Vec<(u32, String)> = layout.map(|(r, n)| (r, n.to_string())).to_vec();
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
    // Cyclic: ranks 0 and 2 on the first node, 1 and 3 on the second, and MPICH's map of
    // which ranks share a node (PMI_process_mapping) says so: its reduction and barrier run.
    let (code, out, err) = salloc("srun --mpi=pmi2 -m cyclic -N2 -n4 ./allreduce_mpich");
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_cyclic_world(&out, &err);
    // Also from SLURM_DISTRIBUTION, which salloc -m sets; each task's output file is named
    // after its own node, and tasks see the distribution asked for.
    let (code, out, err) = run(
        &cluster,
        bin.path(),
        dir.path(),
        "salloc",
        &[
            "-N2",
            "--ntasks-per-node=2",
            "-m",
            "cyclic",
            "bash",
            "-c",
            "srun --mpi=none -n4 -o 'task.%t.%N' bash -c 'echo $SLURM_PROCID $SLURM_LOCALID $SLURMD_NODENAME $SLURM_DISTRIBUTION'",
        ],
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    for (task, local, node) in [(0, 0, "node01"), (1, 0, "node02"), (2, 1, "node01"), (3, 1, "node02")] {
        let file = dir.path().join(format!("task.{task}.{node}"));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}\n{out}\n{err}", file.display()));
        assert_eq!(text.trim(), format!("{task} {local} {node} cyclic"));
    }
    let (code, _, err) = salloc("srun -m diagonal true");
    assert_ne!(code, Some(0));
    assert!(err.contains("invalid --distribution 'diagonal'"), "{err}");
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

/// `srun --mpi=pmix` starts Open MPI's ranks as one world across both nodes through each node's
/// PMIx server (OpenPMIx, run by the agent as the job's user); the step's namespace carries its
/// secret and the tasks do not see the secret's variable; MPI_Abort ends the step; a task that
/// sends its server garbage harms no later step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srun_direct_launch_serves_pmix_to_open_mpi_across_nodes() {
    let cluster = cluster(options(Mpi::None)).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let bin = slurm_bin();
    build(dir.path(), "mpicc.openmpi", "allreduce_ompi");

    let (code, out, err) = run(&cluster, bin.path(), dir.path(), "srun", &["--mpi=list"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\tpmix") && out.contains("pmix_v4"), "{out}");

    let salloc =
        |cmd: &str| run(&cluster, bin.path(), dir.path(), "salloc", &["-N2", "--ntasks-per-node=2", "bash", "-c", cmd]);
    let (code, out, err) = salloc("srun --mpi=pmix -N2 -n4 ./allreduce_ompi");
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_world(&out, &err);
    for line in out.lines().filter(|l| l.starts_with("rank ")) {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w[5], w[7], "srun tells each rank its node: {line}");
    }
    // Cyclic: Open MPI's node and process maps (PMIx_generate_ppn) and local ranks follow it.
    let (code, out, err) = salloc("srun --mpi=pmix --distribution=cyclic ./allreduce_ompi");
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_cyclic_world(&out, &err);
    // Slurm's versioned name, twice in a row on the same agents.
    let (code, out, err) = salloc("srun --mpi=pmix_v4 ./allreduce_ompi && srun --mpi=pmix ./allreduce_ompi");
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert_eq!(out.lines().filter(|l| l.starts_with("rank ")).count(), 8, "{out}\n{err}");

    // The namespace is the step's and its secret's; the secret's variable is not the task's.
    let (code, out, err) = salloc(
        "srun --mpi=pmix -N1 -n1 bash -c 'echo ns=$PMIX_NAMESPACE rank=$PMIX_RANK secret=${QUORUM_PMIX_SECRET:-none}'",
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    let line = out.lines().find(|l| l.starts_with("ns=")).unwrap_or_else(|| panic!("{out}\n{err}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    let ns: Vec<&str> = w[0].trim_start_matches("ns=").split('.').collect();
    assert_eq!(ns.len(), 4, "{line}");
    assert_eq!((ns[0], ns[2]), ("quorum", "0"), "{line}");
    assert!(ns[3].len() == 32 && ns[3].bytes().all(|b| b.is_ascii_hexdigit()), "{line}");
    assert_eq!(&w[1..], ["rank=0", "secret=none"], "{line}");

    // Rank 3 calls MPI_Abort: its server tells the agent, which kills the step's tasks there;
    // --kill-on-bad-exit ends the rest.
    let started = std::time::Instant::now();
    let (code, out, err) = salloc("srun --mpi=pmix --kill-on-bad-exit ./allreduce_ompi 3 abort; echo srun=$?");
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(!out.contains("srun=0") && out.contains("srun="), "{out}\n{err}");
    assert!(err.contains("PMIx_Abort"), "{out}\n{err}");
    assert!(started.elapsed() < T);

    // A task that sends its server garbage on the server's own connection: the next step runs.
    let hostile =
        "port=${PMIX_SERVER_URI4##*:}; exec 3<>/dev/tcp/127.0.0.1/$port; head -c 200000 /dev/urandom >&3; echo alive";
    let (code, out, err) =
        salloc(&format!("srun --mpi=pmix -n1 bash -c '{hostile}'; srun --mpi=pmix ./allreduce_ompi"));
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.lines().any(|l| l == "alive"), "{out}\n{err}");
    assert_world(&out, &err);
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
                  srun --mpi=pmi2 ./allreduce_mpich > direct.out\n\
                  getent hosts node02 > hosts.out\n\
                  srun -N2 -n2 bash -c 'echo $(hostname) $(grep -c \"^# quorum dev\" /etc/hosts) $(getent hosts node01)' | sort >> hosts.out\n";
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
    // Inside the job (the batch step and each step's tasks) the nodes' names resolve through
    // the cluster's own /etc/hosts, which the host's is not.
    let hosts = std::fs::read_to_string(dir.path().join("hosts.out")).unwrap();
    let lines: Vec<Vec<&str>> = hosts.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        lines,
        [
            vec!["127.0.1.2", "node02"],
            vec!["node01", "1", "127.0.1.1", "node01"],
            vec!["node02", "1", "127.0.1.1", "node01"]
        ],
        "{hosts}\n{log}"
    );
    assert!(!std::fs::read_to_string("/etc/hosts").unwrap().contains("# quorum dev"));
    cluster.shutdown().await;
}

/// The cores (socket, core) of `cpus`, from this host's sysfs (where the agents run).
fn cores_of(cpus: &[u32]) -> std::collections::BTreeSet<(String, String)> {
    let read = |c: u32, f: &str| {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{c}/topology/{f}"))
            .unwrap_or_else(|_| c.to_string())
    };
    cpus.iter().map(|c| (read(*c, "physical_package_id"), read(*c, "core_id"))).collect()
}

/// `srun --cpu-bind` binds each task to its own CPUs within the job's (what the kernel says a
/// task may run on, `Cpus_allowed_list`, against what an unbound step of the job may): `threads`
/// one CPU each, `cores` a core each, `verbose` says so in Slurm's words; `SLURM_CPU_BIND*` tell
/// the task; a `map_cpu` naming a CPU that is not the job's ends that task with the reason; an
/// unknown type is refused before anything runs. `srun -O` runs more tasks than the job has CPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srun_binds_tasks_to_cpus_within_the_jobs() {
    let cluster = cluster(options(Mpi::None)).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let bin = slurm_bin();
    let allowed = "grep Cpus_allowed_list /proc/self/status | cut -f2";
    let script = format!(
        "srun -n1 --overlap bash -c 'echo job $({allowed})'; \
         srun -n2 --cpu-bind=threads bash -c 'echo threads $SLURM_PROCID $({allowed}) $SLURM_CPU_BIND_TYPE'; \
         srun -n2 --cpu-bind=verbose,cores bash -c 'echo cores $SLURM_PROCID $({allowed}) $SLURM_CPU_BIND_LIST'; \
         srun -O -n6 bash -c 'echo over $SLURM_PROCID'; srun -n6 true; echo plain=$?"
    );
    let (code, out, err) = run(&cluster, bin.path(), dir.path(), "salloc", &["-N1", "-n2", "bash", "-c", &script]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let set = |text: &str| quorum_model::cpu_bind::parse_list(text).unwrap_or_else(|| panic!("a CPU list: {text}"));
    let job_line = out.lines().find(|l| l.starts_with("job ")).unwrap_or_else(|| panic!("{out}\n{err}"));
    let job = set(job_line.split_whitespace().nth(1).unwrap());
    let tasks = |kind: &str| -> Vec<(Vec<u32>, String)> {
        let mut lines: Vec<Vec<&str>> = out
            .lines()
            .filter(|l| l.starts_with(&format!("{kind} ")))
            .map(|l| l.split_whitespace().collect())
            .collect();
        lines.sort();
        assert_eq!(lines.len(), 2, "{out}\n{err}");
        lines.iter().map(|w| (set(w[2]), w[3].to_string())).collect()
    };
    let threads = tasks("threads");
    for (cpus, kind) in &threads {
        assert_eq!(cpus.len(), 1, "one CPU each: {out}");
        assert!(cpus.iter().all(|c| job.contains(c)), "within the job's {job:?}: {out}");
        assert_eq!(kind, "threads,");
    }
    if job.len() >= 2 {
        assert_ne!(threads[0].0, threads[1].0, "a CPU of its own: {out}");
    }
    let cores = tasks("cores");
    for (cpus, mask) in &cores {
        assert!(!cpus.is_empty() && cpus.iter().all(|c| job.contains(c)), "within the job's {job:?}: {out}");
        assert_eq!(mask, &quorum_model::cpu_bind::mask_text(cpus), "{out}");
        assert_eq!(cores_of(cpus).len(), 1, "one core: {out}");
    }
    if cores_of(&job).len() >= 2 {
        assert_ne!(cores_of(&cores[0].0), cores_of(&cores[1].0), "a core of its own: {out}");
    }
    // --overcommit: six tasks on the job's two CPUs; without it, refused for want of CPUs.
    assert_eq!(out.lines().filter(|l| l.starts_with("over ")).count(), 6, "{out}\n{err}");
    assert!(out.contains("plain=1") && err.contains("6 CPUs on a node"), "{out}\n{err}");
    for task in 0..2 {
        let said = format!("cpu-bind=MASK - node01, task {task:2} {task:2} [");
        assert!(err.lines().any(|l| l.starts_with(&said) && l.ends_with(" set")), "{said}: {err}");
    }

    // A CPU the job does not have: that task fails, saying which and what the job has.
    let (code, out, err) =
        run(&cluster, bin.path(), dir.path(), "salloc", &["-N1", "-n1", "srun", "--cpu-bind=map_cpu:16000", "true"]);
    assert_ne!(code, Some(0), "{out}");
    assert!(err.contains("CPU 16000 of --cpu-bind is not one of the job's CPUs"), "{err}");
    let (code, _, err) = run(&cluster, bin.path(), dir.path(), "salloc", &["-N1", "srun", "--cpu-bind=bogus", "true"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("unknown type 'bogus'"), "{err}");
    cluster.shutdown().await;
}

/// `salloc ARGS` run by Unix user `user` in `dir`, the Slurm commands (a copy every user may run)
/// first on its PATH: (exit code, stdout, stderr).
fn salloc_as(cluster: &DevCluster, user: &str, dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    ensure_user(user);
    let bin = quorum_bin().parent().unwrap();
    let out = Command::new("runuser")
        .args(["-u", user, "--"])
        .arg(bin.join("salloc"))
        .args(args)
        .envs(cluster.env())
        .env("PATH", format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display()))
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `sbcast` copies a file to every node of the allocation as the job's user, with the source's
/// mode (and with `-p` its time): one step on each node writes it (sacct shows them); a path the
/// user may not write is refused with the node and the reason; an existing file is kept without
/// `-f`; `srun --bcast` runs the copy it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sbcast_copies_a_file_to_every_node_as_the_jobs_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let cluster = cluster(DevOptions { quorum_program: Some(quorum_bin().to_path_buf()), ..options(Mpi::None) }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let tool = dir.path().join("tool.sh");
    std::fs::write(&tool, "#!/bin/sh\necho tool $SLURMD_NODENAME $(id -un) $0\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o750)).unwrap();
    let when = std::fs::File::options().write(true).open(&tool).unwrap();
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    when.set_times(std::fs::FileTimes::new().set_modified(an_hour_ago)).unwrap();
    ensure_user("alice");
    let uid = quorum_auth::users::by_name("alice").unwrap().uid;
    std::os::unix::fs::chown(&tool, Some(uid), None).unwrap();

    // More than one part (a step's input carries at most 3 MiB), so parts must come whole and
    // in order.
    let big: Vec<u8> = (0..7_340_033u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(dir.path().join("big.bin"), &big).unwrap();
    let script = "sbcast -f -p tool.sh copy/tool && sacct -j $SLURM_JOB_ID -P -n -o JobID,NodeList,State; \
                  sbcast -f big.bin copy/big.bin; echo big=$?; \
                  sbcast tool.sh copy/tool; echo kept=$?; \
                  sbcast tool.sh /root/tool; echo denied=$?; \
                  srun --bcast=copy/run.sh ./tool.sh";
    std::fs::create_dir(dir.path().join("copy")).unwrap();
    std::fs::set_permissions(dir.path().join("copy"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, out, err) =
        salloc_as(&cluster, "alice", dir.path(), &["-N2", "--ntasks-per-node=1", "bash", "-c", script]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let copy = std::fs::metadata(dir.path().join("copy/tool")).unwrap();
    assert_eq!((copy.mode() & 0o777, copy.uid()), (0o750, uid), "the source's mode, written as alice");
    assert_eq!(copy.mtime(), std::fs::metadata(&tool).unwrap().mtime(), "-p keeps its time");
    assert_eq!(std::fs::read(dir.path().join("copy/tool")).unwrap(), std::fs::read(&tool).unwrap());
    // One step on each node wrote it.
    let steps: Vec<&str> = out.lines().filter(|l| l.contains('.') && l.ends_with("|COMPLETED")).collect();
    for node in ["node01", "node02"] {
        assert!(steps.iter().any(|l| l.contains(&format!("|{node}|"))), "a step on {node}: {out}");
    }
    assert!(out.contains("big=0"), "{out}\n{err}");
    assert!(std::fs::read(dir.path().join("copy/big.bin")).unwrap() == big, "the 7 MiB copy is the file");
    assert!(out.contains("kept=1") && err.contains("exists (--force replaces it)"), "{out}\n{err}");
    assert!(out.contains("denied=1"), "{out}");
    assert!(
        err.lines().any(|l| l.starts_with("sbcast: error: node0")
            && l.contains("/root/tool")
            && l.contains("Permission denied")),
        "{err}"
    );
    let mut ran: Vec<&str> = out.lines().filter(|l| l.starts_with("tool ")).collect();
    ran.sort_unstable();
    let path = format!("{}/copy/run.sh", dir.path().display());
    assert_eq!(ran, [format!("tool node01 alice {path}"), format!("tool node02 alice {path}")], "{out}\n{err}");
    cluster.shutdown().await;
}
