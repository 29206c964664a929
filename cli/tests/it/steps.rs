//! Slurm's execution model with real agent processes on two nodes: a batch script runs once, on
//! its job's first node; `srun` inside it starts steps whose tasks each node's agent runs, with
//! their ranks, GPUs and output coming back to srun; steps run side by side, wait for each
//! other's CPUs, fail at once when the allocation can never hold them, end together with
//! `--kill-on-bad-exit`, and die with their job.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use quorum_dev::cluster::{DevCluster, DevOptions};

const T: Duration = Duration::from_secs(60);

/// Two nodes as agent processes (so a task's parent process tells its node), `srun` and
/// `scontrol` on the jobs' PATH, node names that resolve.
fn options() -> DevOptions {
    resolvable_nodes(&["node01", "node02"]);
    DevOptions {
        quorum_program: Some(env!("CARGO_BIN_EXE_quorum").into()),
        agent_binary: Some(agent_binary()),
        cpus_per_agent: 4,
        gpus_per_agent: 2,
        ..DevOptions::for_tests()
    }
}

/// Submits `script` with `quorum submit ARGS script`, as a user would; its job id.
fn submit_script(cluster: &DevCluster, dir: &Path, args: &[&str], script: &str) -> u64 {
    std::fs::write(dir.join("job.sh"), script).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quorum"))
        .arg("submit")
        .args(args)
        .arg("job.sh")
        .envs(cluster.env())
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).split_whitespace().last().unwrap().parse().unwrap()
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The parent process of `pid`, from /proc.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_script_runs_once_on_the_first_node_and_srun_spreads_tasks_over_the_allocation() {
    let cluster = cluster(options()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let agents: Vec<u32> = (0..2).map(|i| cluster.agent_pid(i).unwrap()).collect();
    // Each task also reports its parent: the agent that started it.
    let task_line = r#"echo $SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID $(hostname) $SLURMD_NODENAME "[$CUDA_VISIBLE_DEVICES]" $SLURM_STEP_ID $SLURM_STEP_NUM_TASKS $SLURM_STEP_NUM_NODES $SLURM_STEP_NODELIST $SLURM_TASKS_PER_NODE $PPID $GPU_DEVICE_ORDINAL $SLURM_STEP_GPUS"#;
    let script = format!(
        "#!/bin/bash\n\
         hostname >> batch-hosts\n\
         echo $SLURM_PROCID $SLURM_NODEID >> batch-ids\n\
         srun -N2 hostname | sort > srun-hosts\n\
         srun --ntasks-per-node=2 --gpus-per-task=1 bash -c '{task_line}' > ranks\n\
         srun hostname | sort | uniq -c | awk '{{print $1, $2}}' > default-tasks\n\
         srun -l -n2 -w node02 echo hi | sort > labelled\n\
         echo done >> batch-hosts\n"
    );
    let id = submit_script(&cluster, dir.path(), &["-N", "2", "-n", "4", "--gres=gpu:2", "-o", "out-%j"], &script);
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    let out = std::fs::read_to_string(dir.path().join(format!("out-{id}"))).unwrap_or_default();
    assert_eq!(j.state, "COMPLETED", "{j:?}\noutput:\n{out}");

    // The script ran once, on the first node, as the batch step (rank 0).
    assert_eq!(read(dir.path(), "batch-hosts"), "node01\ndone\n", "output:\n{out}");
    assert_eq!(read(dir.path(), "batch-ids").trim(), "0 0");
    // `srun -N2 hostname`: each node once (in any order: the tasks write at once).
    assert_eq!(read(dir.path(), "srun-hosts"), "node01\nnode02\n", "output:\n{out}");
    // Without a shape, a step runs the job's tasks (-n 4): two per node.
    assert_eq!(read(dir.path(), "default-tasks"), "2 node01\n2 node02\n");
    assert_eq!(read(dir.path(), "labelled"), "0: hi\n1: hi\n");

    // Two tasks per node, one GPU each: ranks 0-3 over local ids 0-1, each task started by the
    // agent of the node it claims, each with a GPU of its own among its node's.
    let mut rows: Vec<Vec<String>> =
        read(dir.path(), "ranks").lines().map(|l| l.split_whitespace().map(str::to_string).collect()).collect();
    rows.sort_by_key(|r| r[0].parse::<u32>().unwrap());
    assert_eq!(rows.len(), 4, "{rows:?}");
    let nodes = ["node01", "node02"];
    let mut gpus_seen = std::collections::HashSet::new();
    for (rank, row) in rows.iter().enumerate() {
        let node = rank / 2;
        assert_eq!(row[0], rank.to_string(), "{row:?}");
        assert_eq!(row[1], (rank % 2).to_string(), "SLURM_LOCALID: {row:?}");
        assert_eq!(row[2], node.to_string(), "SLURM_NODEID: {row:?}");
        assert_eq!(
            (row[3].as_str(), row[4].as_str()),
            (nodes[node], nodes[node]),
            "hostname, SLURMD_NODENAME: {row:?}"
        );
        let gpu = row[5].trim_matches(['[', ']']);
        assert!(!gpu.is_empty() && !gpu.contains(','), "one GPU per task: {row:?}");
        let alloc = &j.allocation.iter().find(|a| a.node == nodes[node]).unwrap().gpus;
        assert!(alloc.contains(&gpu.parse().unwrap()), "GPU {gpu} is not among {alloc:?} on {}", nodes[node]);
        assert!(gpus_seen.insert((node, gpu.to_string())), "GPU {gpu} on {} given twice", nodes[node]);
        assert_eq!(&row[6..11], ["1", "4", "2", "node[01-02]", "2(x2)"], "the step's variables: {row:?}");
        let parent: u32 = row[11].parse().unwrap();
        assert_eq!(parent, agents[node], "task {rank} was not started by {}'s agent", nodes[node]);
        // GPU_DEVICE_ORDINAL is the task's GPU too; SLURM_STEP_GPUS the step's on its node.
        assert_eq!(row.get(12).map(String::as_str), Some(gpu), "GPU_DEVICE_ORDINAL: {row:?}");
        let mut step_gpus: Vec<u32> = row[13].split(',').map(|g| g.parse().unwrap()).collect();
        step_gpus.sort_unstable();
        let mut alloc_sorted = alloc.to_vec();
        alloc_sorted.sort_unstable();
        assert_eq!(step_gpus, alloc_sorted, "SLURM_STEP_GPUS: {row:?}");
    }

    // The steps are recorded with their nodes, tasks and exits, and shown.
    let show = quorum(&cluster.controllers_env(), dir.path(), &["show", &id.to_string()]).success();
    for step in [format!("{id}.0"), format!("{id}.1"), format!("{id}.3")] {
        assert!(show.contains(&step), "step {step} is not shown:\n{show}");
    }
    assert!(show.contains("NodeList=node02") && show.contains("NTasks=4"), "{show}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_share_the_allocation_wait_for_each_other_and_fail_or_end_together() {
    let cluster = cluster(options()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    // One CPU per node: two one-task-per-node steps at once must take turns, unless they
    // overlap; a step of 9 tasks can never fit.
    let stamp = r#"bash -c 'echo $(date +%s%N) start; sleep 1; echo $(date +%s%N) end'"#;
    let script = format!(
        "#!/bin/bash\n\
         srun -N2 {stamp} > a 2> a.err &\n\
         srun -N2 {stamp} > b 2> b.err &\n\
         wait\n\
         srun -N2 --overlap {stamp} > c &\n\
         srun -N2 --overlap {stamp} > d &\n\
         wait\n\
         srun -n 9 true 2> too-large; echo $? > too-large.rc\n\
         start=$(date +%s)\n\
         srun -K -n2 bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 3; fi; sleep 60' 2> kill.err; echo $? $(( $(date +%s) - start )) > kill.rc\n\
         srun -n2 bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 3; fi; sleep 1; echo finished' > rest.out 2> rest.err; echo $? > rest.rc\n"
    );
    let id = submit_script(&cluster, dir.path(), &["-N", "2", "-o", "out-%j"], &script);
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T * 2).await;
    let out = std::fs::read_to_string(dir.path().join(format!("out-{id}"))).unwrap_or_default();
    assert_eq!(j.state, "COMPLETED", "{j:?}\n{out}");

    let span = |name: &str| -> (u128, u128) {
        let text = read(dir.path(), name);
        let times = |word: &str| -> Vec<u128> {
            text.lines().filter(|l| l.ends_with(word)).map(|l| l.split(' ').next().unwrap().parse().unwrap()).collect()
        };
        (*times("start").iter().min().unwrap(), *times("end").iter().max().unwrap())
    };
    let (a, b) = (span("a"), span("b"));
    assert!(a.1 <= b.0 || b.1 <= a.0, "two steps held the same CPUs at once: {a:?} {b:?}");
    let waited = read(dir.path(), "a.err") + &read(dir.path(), "b.err");
    assert!(waited.contains("step creation temporarily disabled"), "the second step did not say it waits: {waited}");
    let (c_, d) = (span("c"), span("d"));
    assert!(c_.0 < d.1 && d.0 < c_.1, "--overlap steps did not run at once: {c_:?} {d:?}");

    assert_eq!(read(dir.path(), "too-large.rc").trim(), "1");
    let too_large = read(dir.path(), "too-large");
    assert!(too_large.contains("cannot run this step") && too_large.contains("5 CPUs on a node"), "{too_large}");

    // --kill-on-bad-exit: the failing task's code, the other task killed long before its 60 s.
    let kill = read(dir.path(), "kill.rc");
    let (code, secs) = kill.trim().split_once(' ').unwrap();
    assert_eq!(code, "3", "{kill} {}", read(dir.path(), "kill.err"));
    assert!(secs.parse::<u64>().unwrap() < 30, "the other task was not killed: {kill}");
    // Without it the other task finishes, and srun still exits with the failure.
    assert_eq!(read(dir.path(), "rest.out"), "finished\n");
    assert_eq!(read(dir.path(), "rest.rc").trim(), "3");
    assert!(read(dir.path(), "rest.err").contains("task 1: Exited with exit code 3"));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launcher_finds_its_head_node_and_cancelling_the_job_kills_every_steps_tasks() {
    let cluster = cluster(options()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    // A torchrun-style rendezvous: the head (rank 0, on the first node of `scontrol show
    // hostnames`) listens on its node's address; every rank connects there and says who it is.
    let rendezvous = r#"
use IO::Socket::INET;
my ($head, $rank, $n) = ($ENV{HEAD}, $ENV{SLURM_PROCID}, $ENV{SLURM_STEP_NUM_TASKS});
if ($rank == 0) {
  my $l = IO::Socket::INET->new(LocalAddr => "$head:29511", Listen => 8, ReuseAddr => 1) or die "listen $head: $!";
  open(my $ready, '>', 'head-ready'); close($ready);
  my @seen = ("rank 0 on $ENV{SLURMD_NODENAME}");
  for (2..$n) { my $c = $l->accept; my $line = <$c>; chomp $line; push @seen, $line; }
  print join("\n", sort @seen), "\n";
} else {
  select(undef, undef, undef, 0.05) until -e 'head-ready';
  my $c = IO::Socket::INET->new(PeerAddr => "$head:29511") or die "connect $head: $!";
  print $c "rank $rank on $ENV{SLURMD_NODENAME}\n";
}
"#;
    std::fs::write(dir.path().join("rendezvous.pl"), rendezvous).unwrap();
    let script = "#!/bin/bash\n\
         export HEAD=$(scontrol show hostnames | head -1)\n\
         echo $HEAD > head\n\
         srun -N2 -n2 --overlap perl rendezvous.pl > rendezvous.out\n\
         srun -N2 --overlap bash -c 'echo $$ > task-$SLURMD_NODENAME.pid; exec sleep 300' &\n\
         sleep 300\n";
    let id = submit_script(&cluster, dir.path(), &["-N", "2", "-o", "out-%j"], script);
    let pid_of = |node: &str| -> Option<i32> {
        std::fs::read_to_string(dir.path().join(format!("task-{node}.pid"))).ok()?.trim().parse().ok()
    };
    let pids = wait_for(T, "both step tasks running", || async {
        match (pid_of("node01"), pid_of("node02")) {
            (Some(a), Some(b)) => Some([a, b]),
            _ => None,
        }
    })
    .await;
    assert_eq!(read(dir.path(), "head").trim(), "node01");
    let seen = read(dir.path(), "rendezvous.out");
    assert!(seen.contains("rank 1 on node02"), "the worker did not reach the head on node01: {seen}");
    assert_eq!(seen, "rank 0 on node01\nrank 1 on node02\n");
    for (pid, agent) in pids.iter().zip(0..2) {
        assert_eq!(parent_of(*pid as u32), cluster.agent_pid(agent), "task {pid} is not its node's agent's child");
    }
    let started = Instant::now();
    cancel(&c, id).await;
    wait_state(&c, id, &["CANCELLED"], T).await;
    for pid in pids {
        wait_for(T, "the step's task killed with its job", || async move {
            // SAFETY: kill with signal 0 only checks that the process exists.
            (unsafe { libc::kill(pid, 0) } != 0).then_some(())
        })
        .await;
    }
    assert!(started.elapsed() < T);
    cluster.shutdown().await;
}

/// `name` (srun, salloc) as a link to `quorum` in `dir`, as `quorum install-slurm-commands`
/// makes them on a login node.
fn slurm_command(dir: &Path, name: &str) -> std::path::PathBuf {
    let link = dir.join(name);
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_quorum"), &link).unwrap();
    }
    link
}

/// On replicas still at feature level 9, which launch a step only once its entry has committed
/// (the other tests launch it as it commits); the shells and tasks are told the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn salloc_holds_an_allocation_for_its_command_and_srun_from_outside_takes_one_for_its_step() {
    let cluster = cluster(DevOptions { emulate_levels: vec![(0, 9), (1, 9), (2, 9)], ..options() }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let leader = &cluster.addrs[cluster.leader().unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let (salloc, srun) = (slurm_command(bin.path(), "salloc"), slurm_command(bin.path(), "srun"));
    let path = format!("{}:{}", bin.path().display(), std::env::var("PATH").unwrap_or_default());
    let run = |program: &Path, args: &[&str]| {
        let out = Command::new(program)
            .args(args)
            .envs(cluster.env())
            .env("PATH", &path)
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    // salloc runs its command here with the allocation's variables; srun inside it starts steps
    // on the allocation's nodes.
    let (code, out, err) = run(
        &salloc,
        &[
            "-N2",
            "bash",
            "-c",
            "echo $SLURM_JOB_ID $SLURM_JOB_NUM_NODES $SLURM_JOB_NODELIST $QUORUM_LEADER; srun hostname; exit 4",
        ],
    );
    assert_eq!(code, Some(4), "{out}\n{err}");
    let mut lines = out.lines();
    let first: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&first[1..], ["2", "node[01-02]", leader.as_str()], "{out}");
    // Each node once, in whichever order the tasks wrote.
    let mut hosts: Vec<&str> = lines.collect();
    hosts.sort();
    assert_eq!(hosts, ["node01", "node02"], "{out}\n{err}");
    assert!(err.contains("Granted job allocation") && err.contains("Relinquishing job allocation"), "{err}");
    let id: u64 = first[0].parse().unwrap();
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!((j.state.as_str(), j.exit_code), ("FAILED", 4), "the allocation ends with its command: {j:?}");
    assert_eq!(j.steps.len(), 1, "{j:?}");

    // srun from outside a job: an allocation of its own, ended with the step's exit code.
    let (code, out, err) =
        run(&srun, &["-N2", "-l", "bash", "-c", "echo $SLURM_JOB_ID $SLURMD_NODENAME $QUORUM_LEADER"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let mut rows: Vec<&str> = out.lines().collect();
    rows.sort();
    assert_eq!(rows.len(), 2, "{out}");
    let job: u64 = rows[0].split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(rows, [format!("0: {job} node01 {leader}"), format!("1: {job} node02 {leader}")]);
    let j = wait_state(&c, job, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    assert_eq!(j.steps[0].nodelist, "node[01-02]");
    let (code, _, err) = run(&srun, &["-n1", "false"]);
    assert_eq!(code, Some(1), "{err}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srun_pty_gives_task_zero_a_terminal_that_srun_s_own_drives() {
    use std::io::{Read, Write};
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let cluster = cluster(options()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let srun = slurm_command(dir.path(), "srun");
    // srun's own terminal, 30 rows by 100 columns, as a user's would be.
    let (mut master, mut slave) = (-1, -1);
    let size = libc::winsize { ws_row: 30, ws_col: 100, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: openpty writes two descriptors; the name and termios may be null.
    assert_eq!(unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size) }, 0);
    // SAFETY: both were just opened and are ours.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut command = Command::new(&srun);
    command
        .args(["--pty", "bash", "--norc", "--noprofile"])
        .envs(cluster.env())
        .current_dir(dir.path())
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave.try_clone().unwrap());
    // SAFETY: setsid and ioctl between fork and exec: srun gets the terminal as its own.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            libc::ioctl(0, libc::TIOCSCTTY, 0);
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    // Only srun holds its terminal now: the reader sees its end when srun ends.
    drop(command);
    drop(slave);
    let mut writer = std::fs::File::from(master.try_clone().unwrap());
    writer.write_all(b"tty; stty size; echo $((6*7)) $SLURM_STEP_NUM_TASKS; exit 3\n").unwrap();
    let reader = std::thread::spawn(move || {
        let mut file = std::fs::File::from(master);
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // Until srun and its terminal close (EIO), or a minute.
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            match file.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    });
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
    let out = reader.join().unwrap();
    assert_eq!(status.code(), Some(3), "srun exits with the shell's code:\n{out}");
    assert!(out.contains("/dev/pts/"), "the task's stdin is a terminal:\n{out}");
    assert!(out.contains("30 100"), "its size is srun's terminal's:\n{out}");
    assert!(out.contains("42 1"), "{out}");
    cluster.shutdown().await;
}

/// The seconds of a sacct CPU time: `MM:SS.mmm`, `HH:MM:SS`, `D-HH:MM:SS`.
fn cpu_seconds(text: &str) -> f64 {
    let (days, rest) = text.split_once('-').map_or((0.0, text), |(d, r)| (d.parse().unwrap(), r));
    days * 86_400.0 + rest.split(':').fold(0.0, |acc, part| acc * 60.0 + part.parse::<f64>().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_step_records_what_its_tasks_used_and_sacct_shows_it_per_step() {
    let cluster = cluster(options()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    // Each task holds 96 MiB it wrote, and burns a second of CPU.
    std::fs::write(
        dir.path().join("burn.py"),
        "import time\nheld = b'x' * (96 << 20)\nwhile time.process_time() < 1.0:\n    pass\n",
    )
    .unwrap();
    let script = "#!/bin/bash\nsrun -N2 -n2 python3 burn.py\nsrun -n1 true\n";
    let id = submit_script(&cluster, dir.path(), &["-N", "2", "-o", "out-%j"], script);
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    let out = std::fs::read_to_string(dir.path().join(format!("out-{id}"))).unwrap_or_default();
    assert_eq!(j.state, "COMPLETED", "{out}");
    // The script's node decides the job's end; what the other node used is added when its
    // report lands, which may be a moment later. Read the job once that has stopped changing.
    let mut j = job(&c, id).await;
    loop {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let again = job(&c, id).await;
        if again.usage == j.usage {
            break;
        }
        j = again;
    }
    let used = |u: Option<&quorum_proto::api::JobUsage>| {
        let u = u.expect("usage recorded");
        ((u.cpu_user_us + u.cpu_system_us) as f64 / 1e6, u.max_rss_kb / 1024)
    };
    // Two tasks of a second each (and Python's start), the larger of two 96 MiB tasks.
    let (cpu, rss_mib) = used(j.steps[0].usage.as_ref());
    assert!((2.0..2.6).contains(&cpu), "step 0 used {cpu} s of CPU");
    assert!((96..130).contains(&rss_mib), "step 0's largest task held {rss_mib} MiB");
    let (cpu_true, _) = used(j.steps[1].usage.as_ref());
    assert!(cpu_true < 0.2, "step 1 (true) used {cpu_true} s");
    // The job: its script (srun's own CPU, little) and its steps together.
    let (total, _) = used(j.usage.as_ref());
    let (script_cpu, _) = used(j.batch_usage.as_ref());
    assert!(total >= cpu + cpu_true && (total - script_cpu - cpu - cpu_true).abs() < 0.01, "{j:?}");

    let table = quorum(
        &cluster.controllers_env(),
        dir.path(),
        &["acct", "-j", &id.to_string(), "-P", "-o", "JobID,TotalCPU,MaxRSS"],
    )
    .success();
    let line = |name: &str| -> Vec<String> {
        let line =
            table.lines().find(|l| l.starts_with(&format!("{name}|"))).unwrap_or_else(|| panic!("{name}:\n{table}"));
        line.split('|').map(str::to_string).collect()
    };
    let step0 = line(&format!("{id}.0"));
    assert!((cpu_seconds(&step0[1]) - cpu).abs() < 0.01, "{table}");
    assert_eq!(step0[2], format!("{}K", j.steps[0].usage.unwrap().max_rss_kb), "{table}");
    assert!((cpu_seconds(&line(&id.to_string())[1]) - total).abs() < 0.01, "{table}");
    assert!((cpu_seconds(&line(&format!("{id}.batch"))[1]) - script_cpu).abs() < 0.01, "{table}");

    // The same as JSON, in the shape of Slurm's sacct --json.
    let text = quorum(&cluster.controllers_env(), dir.path(), &["acct", "-j", &id.to_string(), "--json"]).success();
    let doc: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let jobs = doc["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 1, "{text}");
    let job = &jobs[0];
    assert_eq!((job["job_id"].as_u64(), job["state"]["current"].as_str()), (Some(id), Some("COMPLETED")));
    assert_eq!(
        (job["exit_code"]["status"].as_str(), job["exit_code"]["return_code"].as_i64()),
        (Some("SUCCESS"), Some(0))
    );
    assert_eq!(job["allocation_nodes"].as_u64(), Some(2));
    let seconds = |t: &serde_json::Value| t["seconds"].as_f64().unwrap() + t["microseconds"].as_f64().unwrap() / 1e6;
    let listed = seconds(&job["time"]["total"]);
    assert!(
        (listed - total).abs() < 1e-6,
        "sacct --json says {listed} s, the job's record said {total} s: {j:?}\n{text}"
    );
    let ids: Vec<&str> = job["steps"].as_array().unwrap().iter().map(|s| s["step"]["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [format!("{id}.batch"), format!("{id}.0"), format!("{id}.1")]);
    let step = &job["steps"][1];
    assert!((seconds(&step["time"]["total"]) - cpu).abs() < 1e-6, "{text}");
    assert_eq!((step["tasks"]["count"].as_u64(), step["nodes"]["count"].as_u64()), (Some(2), Some(2)));
    let max_rss = &step["tres"]["requested"]["max"][0];
    assert_eq!(
        (max_rss["type"].as_str(), max_rss["count"].as_u64()),
        (Some("mem"), Some(j.steps[0].usage.unwrap().max_rss_kb * 1024))
    );
    cluster.shutdown().await;
}

/// Submits `script` (as `het.sh` in `dir`) with `sbatch` as root until the cluster takes it (a
/// new kind of job waits for every replica's feature level); its job id.
async fn sbatch_once_taken(cluster: &DevCluster, bin: &Path, dir: &Path, script: &str) -> u64 {
    std::fs::write(dir.join("het.sh"), script).unwrap();
    let sbatch = slurm_command(bin, "sbatch");
    wait_for(T, "the heterogeneous job submitted", || async {
        let out = program_as(&sbatch, &cluster.controllers_env(), Some("root"), dir, &["het.sh"]);
        out.stdout.split_whitespace().last().and_then(|w| w.parse().ok())
    })
    .await
}

/// A heterogeneous job (`#SBATCH hetjob`): its components start together on nodes of their own
/// (a 3-CPU launcher cannot share a 4-CPU node with 2 workers of 2 CPUs), its script runs once,
/// on component 0's node, told of each component (`SLURM_*_HET_GROUP_K`, component 0's as its
/// own); `srun` runs on component 0, `srun --het-group=1` on component 1 with its tasks;
/// `squeue` lists `ID+0` and `ID+1`, `scontrol` a record for each; acting on `ID+1` alone is
/// refused naming the job; and `sbatch A : B` submits the same shape from the command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heterogeneous_job_runs_its_script_once_and_its_steps_on_the_components_they_name() {
    let cluster = cluster(options()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let slurm = |name: &str, args: &[&str]| slurm_as(&cluster, bin.path(), name, "root", args);
    let script = "#!/bin/bash\n\
         #SBATCH -N1 -n1 -c3 --mem=500M -o out-%j\n\
         #SBATCH hetjob\n\
         #SBATCH -N1 -n2 -c2 --mem=300M\n\
         echo $SLURMD_NODENAME >> batch-hosts\n\
         env | grep -E '^SLURM_(HET_SIZE|JOB_ID|JOB_NUM_NODES|JOB_NODELIST|NTASKS|JOB_ID_HET_GROUP_1|JOB_NODELIST_HET_GROUP_[01]|NTASKS_HET_GROUP_1|CPUS_PER_TASK_HET_GROUP_1|MEM_PER_NODE_HET_GROUP_1)=' | sort > env\n\
         srun bash -c 'echo g0 $SLURMD_NODENAME $SLURM_PROCID' > g0\n\
         srun --het-group=1 bash -c 'echo g1 $SLURMD_NODENAME $SLURM_PROCID $SLURM_JOB_NODELIST' | sort > g1\n\
         while [ ! -e go ]; do sleep 0.2; done\n";
    // Heterogeneous jobs are taken once every replica has told its feature level (25).
    let id = sbatch_once_taken(&cluster, bin.path(), dir.path(), script).await;
    let j = wait_state(&c, id, &["RUNNING"], T).await;
    let groups: Vec<(String, u32, u32)> = j.allocation.iter().map(|a| (a.node.clone(), a.cpus, a.het_group)).collect();
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert_ne!(groups[0].0, groups[1].0, "no node holds two components: {groups:?}");
    assert_eq!((groups[0].1, groups[0].2, groups[1].1, groups[1].2), (3, 0, 4, 1), "{groups:?}");
    let (launcher, workers) = (groups[0].0.clone(), groups[1].0.clone());

    let listed = slurm("squeue", &["-h", "-o", "%i %D %C %N"]).success();
    assert_eq!(listed, format!("{id}+0 1 3 {launcher}\n{id}+1 1 4 {workers}\n"));
    let shown = slurm("scontrol", &["show", "job", &id.to_string(), "-o"]).success();
    let records: Vec<&str> = shown.lines().collect();
    assert_eq!(records.len(), 2, "{shown}");
    assert!(records[1].starts_with(&format!("JobId={} HetJobId={id} HetJobOffset=1 ", id + 1)), "{shown}");
    assert!(records[1].contains(&format!("HetJobIdSet={id}-{}", id + 1)), "{shown}");
    let refused = slurm("scancel", &[&format!("{id}+1")]);
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains(&format!("component 1 of heterogeneous job {id}")), "{refused:?}");

    std::fs::write(dir.path().join("go"), "").unwrap();
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    let out = std::fs::read_to_string(dir.path().join(format!("out-{id}"))).unwrap_or_default();
    assert_eq!(j.state, "COMPLETED", "{j:?}\noutput:\n{out}");
    assert_eq!(read(dir.path(), "batch-hosts"), format!("{launcher}\n"), "the script ran once, on component 0's node");
    let env = read(dir.path(), "env");
    for want in [
        "SLURM_HET_SIZE=2".to_string(),
        format!("SLURM_JOB_ID={id}"),
        format!("SLURM_JOB_ID_HET_GROUP_1={}", id + 1),
        format!("SLURM_JOB_NODELIST={launcher}"),
        format!("SLURM_JOB_NODELIST_HET_GROUP_0={launcher}"),
        format!("SLURM_JOB_NODELIST_HET_GROUP_1={workers}"),
        "SLURM_JOB_NUM_NODES=1".to_string(),
        "SLURM_NTASKS=1".to_string(),
        "SLURM_NTASKS_HET_GROUP_1=2".to_string(),
        "SLURM_CPUS_PER_TASK_HET_GROUP_1=2".to_string(),
        "SLURM_MEM_PER_NODE_HET_GROUP_1=300".to_string(),
    ] {
        assert!(env.lines().any(|l| l == want), "{want} missing:\n{env}");
    }
    assert_eq!(read(dir.path(), "g0"), format!("g0 {launcher} 0\n"), "output:\n{out}");
    assert_eq!(
        read(dir.path(), "g1"),
        format!("g1 {workers} 0 {workers}\ng1 {workers} 1 {workers}\n"),
        "component 1's two tasks on its node:\n{out}"
    );

    // The same shape from the command line: `sbatch A : B --wrap`, and a component that can
    // never fit is refused by number.
    let wrapped = slurm("sbatch", &["--parsable", "-n1", "-c3", ":", "-n2", "-c2", "--wrap", "true"]).success();
    let id: u64 = wrapped.trim().parse().unwrap_or_else(|_| panic!("{wrapped}"));
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    assert_eq!(j.allocation.iter().map(|a| (a.cpus, a.het_group)).collect::<Vec<_>>(), vec![(3, 0), (4, 1)]);
    let never = slurm("sbatch", &["-n1", ":", "-c64", "--wrap", "true"]);
    assert_ne!(never.code, 0);
    assert!(never.stderr.contains("component 1"), "{never:?}");
}

/// A heterogeneous job whose components ask for partitions of their own (`-p` after `#SBATCH
/// hetjob`, or in `sbatch A : B`) runs each component on its partition's nodes, tells each
/// its partition (`SLURM_JOB_PARTITION_HET_GROUP_K`, and a step on a component its own), and
/// `squeue` lists each component in its partition; a component in a partition the cluster lacks
/// is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heterogeneous_components_run_in_their_own_partitions() {
    let part = |name: &str, nodes: &str| quorum_control::config::PartitionConfig {
        name: name.into(),
        nodes: nodes.into(),
        ..Default::default()
    };
    let opts = DevOptions { extra_partitions: vec![part("small", "node01"), part("highmem", "node02")], ..options() };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let slurm = |name: &str, args: &[&str]| slurm_as(&cluster, bin.path(), name, "root", args);
    let script = "#!/bin/bash\n\
         #SBATCH -p small -N1 -n1 -o out-%j\n\
         #SBATCH hetjob\n\
         #SBATCH -p highmem -N1 -n2\n\
         env | grep -E '^SLURM_JOB_PARTITION(_HET_GROUP_[01])?=' | sort > parts\n\
         srun --het-group=1 bash -c 'echo $SLURMD_NODENAME $SLURM_JOB_PARTITION' | sort > g1\n\
         while [ ! -e go ]; do sleep 0.2; done\n";
    // Taken once every replica has told its feature level (30).
    let id = sbatch_once_taken(&cluster, bin.path(), dir.path(), script).await;
    let j = wait_state(&c, id, &["RUNNING"], T).await;
    let groups: Vec<(String, u32)> = j.allocation.iter().map(|a| (a.node.clone(), a.het_group)).collect();
    assert_eq!(groups, vec![("node01".to_string(), 0), ("node02".to_string(), 1)], "{j:?}");
    // In Slurm's order (`-S P,t,-p`: by partition first), and by id with `-S i`.
    let listed = slurm("squeue", &["-h", "-o", "%i %P %N"]).success();
    assert_eq!(listed, format!("{id}+1 highmem node02\n{id}+0 small node01\n"));
    let listed = slurm("squeue", &["-h", "-S", "i", "-o", "%i %P %N"]).success();
    assert_eq!(listed, format!("{id}+0 small node01\n{id}+1 highmem node02\n"));
    std::fs::write(dir.path().join("go"), "").unwrap();
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    let out = std::fs::read_to_string(dir.path().join(format!("out-{id}"))).unwrap_or_default();
    assert_eq!(j.state, "COMPLETED", "{j:?}\noutput:\n{out}");
    assert_eq!(
        read(dir.path(), "parts"),
        "SLURM_JOB_PARTITION=small\nSLURM_JOB_PARTITION_HET_GROUP_0=small\nSLURM_JOB_PARTITION_HET_GROUP_1=highmem\n"
    );
    assert_eq!(read(dir.path(), "g1"), "node02 highmem\nnode02 highmem\n", "output:\n{out}");

    // The other way round, from the command line: the partitions, not the order, decide.
    let wrapped =
        slurm("sbatch", &["--parsable", "-p", "highmem", "-n1", ":", "-p", "small", "-n1", "--wrap", "true"]).success();
    let id: u64 = wrapped.trim().parse().unwrap_or_else(|_| panic!("{wrapped}"));
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    assert_eq!(j.state, "COMPLETED", "{j:?}");
    let groups: Vec<(String, u32)> = j.allocation.iter().map(|a| (a.node.clone(), a.het_group)).collect();
    assert_eq!(groups, vec![("node02".to_string(), 0), ("node01".to_string(), 1)], "{j:?}");
    // Two components of one node each cannot share highmem's one node.
    let never = slurm("sbatch", &["-p", "highmem", "-n1", ":", "-p", "highmem", "-n1", "--wrap", "true"]);
    assert_ne!(never.code, 0);
    assert!(never.stderr.contains("highmem"), "{never:?}");
    let unknown = slurm("sbatch", &["-n1", ":", "-p", "nosuch", "-n1", "--wrap", "true"]);
    assert_ne!(unknown.code, 0);
    assert!(unknown.stderr.contains("'nosuch'"), "{unknown:?}");
    cluster.shutdown().await;
}

/// `--overcommit` on an allocation: it holds one task's CPUs per node whatever `-n` says, as
/// Slurm allocates it (8 tasks on a 4-CPU node), tells its processes `SLURM_OVERCOMMIT=1`, and
/// its steps run all their tasks on those CPUs; without it, the same request never fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overcommitted_allocation_holds_one_tasks_cpus_per_node() {
    let cluster = cluster(options()).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let slurm = |name: &str, args: &[&str]| slurm_as(&cluster, bin.path(), name, "root", args);
    let (scontrol, srun) = (slurm_command(bin.path(), "scontrol"), slurm_command(bin.path(), "srun"));
    let cmd = format!(
        "echo ntasks=$SLURM_NTASKS oc=$SLURM_OVERCOMMIT tpn=$SLURM_TASKS_PER_NODE; \
         {} show job $SLURM_JOB_ID | grep -o 'NumCPUs=[0-9][0-9]*'; {} hostname | wc -l",
        scontrol.display(),
        srun.display()
    );
    let out = wait_for(T, "the overcommitted allocation", || async {
        let run = slurm("salloc", &["-O", "-N1", "-n8", "bash", "-c", &cmd]);
        (run.code == 0).then_some(run.stdout)
    })
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["ntasks=8 oc=1 tpn=8", "NumCPUs=1", "8"], "{out}");

    std::fs::write(dir.path().join("oc.sh"), format!("#!/bin/bash\n#SBATCH -O -N1 -n8 -o oc.out\n{cmd}\n")).unwrap();
    let sbatch = slurm_command(bin.path(), "sbatch");
    let run = program_as(&sbatch, &cluster.controllers_env(), Some("root"), dir.path(), &["--parsable", "oc.sh"]);
    let id: u64 = run.stdout.trim().parse().unwrap_or_else(|_| panic!("{run:?}"));
    let j = wait_state(&c, id, &["COMPLETED", "FAILED", "CANCELLED"], T).await;
    let out = read(dir.path(), "oc.out");
    assert_eq!(j.state, "COMPLETED", "{j:?}\n{out}");
    assert_eq!(out.lines().collect::<Vec<_>>(), ["ntasks=8 oc=1 tpn=8", "NumCPUs=1", "8"], "{out}");

    // Without -O, 8 tasks of one CPU never fit a node of 4.
    let never = slurm("sbatch", &["-N1", "-n8", "--wrap", "true"]);
    assert_ne!(never.code, 0, "{never:?}");
    cluster.shutdown().await;
}
