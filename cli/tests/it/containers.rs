//! Jobs and steps in containers, as pyxis runs them (issue 58), against a real OCI registry
//! (Debian's `docker-registry`, TLS from this test's own CA, htpasswd logins) holding an image
//! this test builds from `busybox-static` with `umoci` and pushes with `skopeo`: nothing here
//! comes from the internet, and nothing stands in for the registry, the namespaces or overlayfs.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::common::*;
use quorum_dev::cluster::{DevCluster, DevOptions};

const T: Duration = Duration::from_secs(90);
const USER: &str = "puller";
const PASSWORD: &str = "layers-only";

/// What the test needs of the machine: root, and the tools a node with containers has.
fn ready() -> bool {
    if !quorum_agent::identity::is_root() {
        eprintln!("skipped: containers need a root agent, and the test makes Unix users");
        return false;
    }
    let missing: Vec<&str> = ["docker-registry", "skopeo", "umoci", "mksquashfs", "squashfuse", "htpasswd", "openssl"]
        .into_iter()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    assert!(missing.is_empty(), "missing {missing:?}: scripts/install-build-deps.sh installs them");
    assert!(Path::new("/bin/busybox").exists(), "busybox-static is not installed");
    for u in ["alice", "mallory"] {
        ensure_user(u);
    }
    true
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A registry on loopback with TLS and a login, its log, and the CA that signed its certificate.
struct Registry {
    port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    fn start() -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        run(Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=quorum test CA", "-keyout"])
            .arg(d.join("ca.key"))
            .arg("-out")
            .arg(d.join("ca.pem")));
        run(Command::new("openssl")
            .args([
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
            ])
            .arg(d.join("key.pem"))
            .arg("-out")
            .arg(d.join("req.pem")));
        std::fs::write(d.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-in"])
            .arg(d.join("req.pem"))
            .arg("-CA")
            .arg(d.join("ca.pem"))
            .arg("-CAkey")
            .arg(d.join("ca.key"))
            .args(["-CAcreateserial", "-extfile"])
            .arg(d.join("ext.cnf"))
            .arg("-out")
            .arg(d.join("cert.pem")));
        // skopeo's certificate directory: the CA as a .crt.
        std::fs::create_dir(d.join("certs")).unwrap();
        std::fs::copy(d.join("ca.pem"), d.join("certs/ca.crt")).unwrap();
        let htpasswd = run(Command::new("htpasswd").args(["-Bbn", USER, PASSWORD]));
        std::fs::write(d.join("htpasswd"), htpasswd).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n\
             http:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {root}/cert.pem\n    key: {root}/key.pem\n\
             auth:\n  htpasswd:\n    realm: quorum-test\n    path: {root}/htpasswd\n",
            root = d.display()
        );
        std::fs::write(d.join("config.yml"), config).unwrap();
        let log = std::fs::File::create(d.join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(d.join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry");
        let r = Registry { port, dir, child };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (code, _) =
                curl(&format!("https://127.0.0.1:{port}/v2/"), &["--cacert", &r.ca().display().to_string()]);
            if code == 401 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the registry did not start: {}", r.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        r
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// `127.0.0.1:PORT#test/busybox:TAG`, as `--container-image` takes it.
    fn image(&self, tag: &str) -> String {
        format!("127.0.0.1:{}#test/busybox:{tag}", self.port)
    }

    /// How many times a blob was fetched whole (a pull of it, not a check).
    fn blob_gets(&self, digest: &str) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains(&format!("\"GET /v2/test/busybox/blobs/{digest}")) && l.contains("\" 200 "))
            .count()
    }

    /// Pushes tag `tag` of the OCI layout `layout`.
    fn push(&self, layout: &Path, tag: &str) {
        run(Command::new("skopeo")
            .args(["copy", "--quiet", "--dest-creds", &format!("{USER}:{PASSWORD}"), "--dest-cert-dir"])
            .arg(self.dir.path().join("certs"))
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://127.0.0.1:{}/test/busybox:{tag}", self.port)));
    }

    /// The layers' digests of `tag`, bottom first.
    fn layers(&self, tag: &str) -> Vec<String> {
        let raw = run(Command::new("skopeo")
            .args(["inspect", "--raw", "--creds", &format!("{USER}:{PASSWORD}"), "--cert-dir"])
            .arg(self.dir.path().join("certs"))
            .arg(format!("docker://127.0.0.1:{}/test/busybox:{tag}", self.port)));
        let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
        v["layers"].as_array().unwrap().iter().map(|l| l["digest"].as_str().unwrap().to_string()).collect()
    }

    /// The blob file the registry serves for `digest`.
    fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir.path().join(format!("data/docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }
}

/// The test image: busybox-static and an os-release of its own, working directory /srv, `PATH`
/// and one variable of its own; tag `1` is that, tag `2` adds a layer over it.
fn build_image(dir: &Path) -> PathBuf {
    let layout = dir.join("layout");
    let bundle = dir.join("bundle");
    run(Command::new("umoci").args(["init", "--layout"]).arg(&layout));
    run(Command::new("umoci").args(["new", "--image"]).arg(format!("{}:1", layout.display())));
    run(Command::new("umoci").args(["unpack", "--image"]).arg(format!("{}:1", layout.display())).arg(&bundle));
    let rootfs = bundle.join("rootfs");
    for d in ["bin", "etc", "tmp", "srv"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    for applet in [
        "sh", "cat", "id", "ls", "touch", "echo", "env", "pwd", "stat", "dd", "sleep", "mkdir", "hostname", "true",
        "false", "grep",
    ] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    std::fs::write(rootfs.join("etc/os-release"), "NAME=\"Quorum test image\"\nID=quorum-test\n").unwrap();
    run(Command::new("umoci").args(["repack", "--image"]).arg(format!("{}:1", layout.display())).arg(&bundle));
    run(Command::new("umoci").args(["config", "--image"]).arg(format!("{}:1", layout.display())).args([
        "--config.env=PATH=/bin",
        "--config.env=IMAGE_VAR=from-the-image",
        "--config.workingdir=/srv",
        "--config.entrypoint=/bin/env",
        "--config.entrypoint=FROM_ENTRYPOINT=yes",
    ]));
    // Tag 2: one more layer on the same base.
    let second = dir.join("bundle2");
    run(Command::new("umoci").args(["unpack", "--image"]).arg(format!("{}:1", layout.display())).arg(&second));
    std::fs::write(second.join("rootfs/etc/version"), "2\n").unwrap();
    run(Command::new("umoci").args(["repack", "--image"]).arg(format!("{}:2", layout.display())).arg(&second));
    layout
}

/// A registry with the test image pushed, a directory alice may use, and her credentials file.
struct Setup {
    registry: Registry,
    dir: tempfile::TempDir,
    layout: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let registry = Registry::start();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let layout = build_image(dir.path());
        registry.push(&layout, "1");
        registry.push(&layout, "2");
        let s = Setup { registry, dir, layout };
        for (user, password) in [("alice", PASSWORD), ("mallory", "not-the-password")] {
            let home = s.home(user);
            std::fs::create_dir_all(&home).unwrap();
            std::fs::write(
                home.join(".credentials"),
                format!("machine 127.0.0.1:{} login {USER} password {password}\n", s.registry.port),
            )
            .unwrap();
            chown_tree(&home, user);
        }
        s
    }

    /// A directory of `user`'s own (their enroot configuration directory too).
    fn home(&self, user: &str) -> PathBuf {
        self.dir.path().join(user)
    }

    fn containers(&self) -> quorum_agent::container::ContainerConfig {
        quorum_agent::container::ContainerConfig { registry_ca: vec![self.registry.ca()], ..Default::default() }
    }
}

fn chown_tree(path: &Path, user: &str) {
    run(Command::new("chown").arg("-R").arg(user).arg(path));
}

fn uid(user: &str) -> u32 {
    quorum_auth::users::by_name(user).unwrap().uid
}

/// `quorum` under a Slurm command's name, where every user may run it.
fn slurm_command(name: &str) -> PathBuf {
    quorum_bin().with_file_name(name)
}

/// `NAME ARGS` (srun, sbatch) as `user` in their directory, with their enroot configuration.
fn as_user(cluster: &DevCluster, s: &Setup, user: &str, name: &str, args: &[&str]) -> Run {
    as_user_with(cluster, s, user, name, args, &[])
}

/// [`as_user`] with `env` too.
fn as_user_with(cluster: &DevCluster, s: &Setup, user: &str, name: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let home = s.home(user);
    let out = Command::new("runuser")
        .args(["-u", user, "--"])
        .arg(slurm_command(name))
        .args(args)
        .envs(cluster.env())
        .envs(env.iter().copied())
        .env("ENROOT_CONFIG_PATH", &home)
        .current_dir(&home)
        .output()
        .expect("runuser");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn start(s: &Setup, opts: DevOptions) -> DevCluster {
    let agents = opts.agents;
    let cluster = cluster(DevOptions { containers: s.containers(), switch_user: true, ..opts }).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, agents).await;
    cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_runs_in_its_image_as_its_user() {
    if !ready() {
        return;
    }
    let s = Setup::new();
    let cluster = start(&s, DevOptions { agents: 1, ..DevOptions::for_tests() }).await;
    let image = s.registry.image("1");
    let image_arg = format!("--container-image={image}");
    // The image's file, not the node's.
    let out = as_user(&cluster, &s, "alice", "srun", &[&image_arg, "cat", "/etc/os-release"]).success();
    assert_eq!(out, "NAME=\"Quorum test image\"\nID=quorum-test\n");
    // The user's own uid inside, the image's working directory and variables (PATH too), the
    // job's own variables over the image's.
    let probe = "id -u; id -g; pwd; echo $IMAGE_VAR $PATH; echo $SLURM_JOB_ID; ls /";
    let out = as_user(&cluster, &s, "alice", "srun", &[&image_arg, "sh", "-c", probe]).success();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], uid("alice").to_string(), "{out}");
    assert_eq!(lines[1], quorum_auth::users::by_name("alice").unwrap().gid.to_string(), "{out}");
    assert_eq!(lines[2], "/srv", "{out}");
    assert_eq!(lines[3], "from-the-image /bin", "{out}");
    assert!(lines[4].parse::<u64>().is_ok(), "{out}");
    // Nothing of the node's root: only the image's directories and the mount points.
    let root: Vec<&str> = lines[5..].iter().flat_map(|l| l.split_whitespace()).collect();
    assert!(!root.contains(&"home") && !root.contains(&"usr") && root.contains(&"bin"), "{out}");
    // --container-entrypoint runs the image's first; --container-env keeps the job's value.
    let probe = "echo entry=$FROM_ENTRYPOINT var=$IMAGE_VAR";
    let env = [("IMAGE_VAR", "from-the-job")];
    let plain = as_user_with(&cluster, &s, "alice", "srun", &[&image_arg, "sh", "-c", probe], &env).success();
    assert_eq!(plain, "entry= var=from-the-image\n");
    let args = [image_arg.as_str(), "--container-entrypoint", "--container-env=IMAGE_VAR", "sh", "-c", probe];
    let kept = as_user_with(&cluster, &s, "alice", "srun", &args, &env).success();
    assert_eq!(kept, "entry=yes var=from-the-job\n");
    // Root inside with --container-remap-root, and still alice outside: a file made on a mount
    // is hers. --container-workdir is where it starts.
    let shared = s.home("alice").join("shared");
    std::fs::create_dir(&shared).unwrap();
    chown_tree(&shared, "alice");
    let mount = format!("--container-mounts={}:/mnt/out", shared.display());
    let out = as_user(
        &cluster,
        &s,
        "alice",
        "srun",
        &[
            &image_arg,
            "--container-remap-root",
            &mount,
            "--container-workdir=/mnt/out",
            "sh",
            "-c",
            "id -u; pwd; touch made",
        ],
    )
    .success();
    assert_eq!(out, "0\n/mnt/out\n");
    assert_eq!(std::fs::metadata(shared.join("made")).unwrap().uid(), uid("alice"));
    // A mount of what the user may not read shows nothing: /root is root's.
    let secret = s.dir.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(secret.join("key"), "root only").unwrap();
    let steal = format!("--container-mounts={}:/mnt/s", secret.display());
    let refused = as_user(&cluster, &s, "mallory", "srun", &[&image_arg, &steal, "cat", "/mnt/s/key"]);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(!refused.stdout.contains("root only"), "{refused:?}");
    // And a set-user-ID file in the image grants nothing: no_new_privs and one mapped uid.
    let status = as_user(&cluster, &s, "alice", "srun", &[&image_arg, "cat", "/proc/self/status"]).success();
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_pulls_an_image_once_for_all_its_tasks_and_users() {
    if !ready() {
        return;
    }
    let s = Setup::new();
    let cluster = start(&s, DevOptions { agents: 2, ..DevOptions::for_tests() }).await;
    let image_arg = format!("--container-image={}", s.registry.image("1"));
    let layers = s.registry.layers("1");
    assert_eq!(layers.len(), 1, "{layers:?}");
    let out =
        as_user(&cluster, &s, "alice", "srun", &["-N2", "-n4", "-l", &image_arg, "cat", "/etc/os-release"]).success();
    assert_eq!(out.lines().filter(|l| l.contains("Quorum test image")).count(), 4, "{out}");
    // Two nodes: two pulls of the layer, whatever the tasks.
    assert_eq!(s.registry.blob_gets(&layers[0]), 2, "{}", s.registry.log());
    // Again, and tag 2 over the same base: the base comes from the caches; tag 2's own layer once a node.
    as_user(&cluster, &s, "alice", "srun", &["-N2", "-n4", &image_arg, "true"]).success();
    let second = format!("--container-image={}", s.registry.image("2"));
    let out = as_user(&cluster, &s, "alice", "srun", &["-N2", "-n2", &second, "cat", "/etc/version"]).success();
    assert_eq!(out, "2\n2\n");
    assert_eq!(s.registry.blob_gets(&layers[0]), 2);
    let top = s.registry.layers("2").pop().unwrap();
    assert_eq!(s.registry.blob_gets(&top), 2);
    // Another user with the wrong password is refused by the registry, cached image or not.
    let refused = as_user(&cluster, &s, "mallory", "srun", &[&image_arg, "true"]);
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("refused the credentials") && refused.stderr.contains("test/busybox:1"),
        "{refused:?}"
    );
    // The agents count what they did (pulls and hits) in /metrics and the cache in use.
    let agent = cluster.agent(0).unwrap();
    let m = &agent.containers.metrics;
    assert_eq!(m.pulls.load(std::sync::atomic::Ordering::Relaxed), 2, "tag 1 and tag 2");
    assert!(m.cache_hits.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    let (bytes, images) = agent.containers.cache_usage();
    assert!(bytes > 1_000_000 && images == 2, "{bytes} bytes, {images} images");
    // `quorum nodes` shows each node's cache, from its heartbeats.
    let c = client(&cluster.addrs);
    wait_for(T, "both nodes' caches shown", || {
        let c = &c;
        async move { nodes(c).await.iter().all(|n| n.images_cached == 2 && n.image_cache_bytes > 1_000_000).then_some(()) }
    })
    .await;
    let table = run(Command::new(quorum_bin()).arg("nodes").envs(cluster.env()));
    assert!(table.contains("IMAGES") && table.contains(" 2/"), "{table}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_containers_carry_over_and_saved_ones_run_again() {
    if !ready() {
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse here, which squashfuse needs to run a saved squashfs image");
        return;
    }
    let s = Setup::new();
    let opts = DevOptions { agents: 1, quorum_program: Some(quorum_bin().to_path_buf()), ..DevOptions::for_tests() };
    let cluster = start(&s, opts).await;
    let image = s.registry.image("1");
    let home = s.home("alice");
    let saved = home.join("saved.sqsh");
    let script = format!(
        "#!/bin/sh\n\
         srun --container-image={image} --container-name=work sh -c 'echo kept > /made'\n\
         srun --container-name=work cat /made\n\
         srun --container-image={image} --container-save={saved} sh -c 'echo saved > /marker'\n\
         srun --container-image={saved} cat /marker /etc/os-release\n\
         srun --container-image={image} cat /made || echo 'unnamed: fresh'\n",
        saved = saved.display()
    );
    std::fs::write(home.join("job.sh"), script).unwrap();
    chown_tree(&home, "alice");
    let out = as_user(&cluster, &s, "alice", "sbatch", &["--parsable", "-o", "job.out", "job.sh"]).success();
    let id: u64 = out.trim().parse().unwrap();
    let c = client(&cluster.addrs);
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    let output = std::fs::read_to_string(home.join("job.out")).unwrap_or_default();
    assert_eq!(j.state, "COMPLETED", "{j:?}\n{output}");
    assert!(output.starts_with("kept\nsaved\nNAME=\"Quorum test image\"\n"), "{output}");
    assert!(output.contains("unnamed: fresh"), "{output}");
    assert_eq!(std::fs::metadata(&saved).unwrap().uid(), uid("alice"));
    // The job's containers are gone with it.
    let spool = cluster.agent_config(0).spool_dir.join("containers").join(id.to_string());
    wait_for(T, "the job's containers removed", || async { (!spool.exists()).then_some(()) }).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_script_runs_in_its_container() {
    if !ready() {
        return;
    }
    let s = Setup::new();
    let cluster = start(&s, DevOptions { agents: 1, ..DevOptions::for_tests() }).await;
    let home = s.home("alice");
    let script = format!(
        "#!/bin/sh\n#SBATCH --container-image={}\n#SBATCH --container-workdir=/tmp\ncat /etc/os-release\nid -u\npwd\necho $SLURM_JOB_ID\n",
        s.registry.image("1")
    );
    std::fs::write(home.join("batch.sh"), script).unwrap();
    chown_tree(&home, "alice");
    let id: u64 = as_user(&cluster, &s, "alice", "sbatch", &["--parsable", "-o", "batch.out", "batch.sh"])
        .success()
        .trim()
        .parse()
        .unwrap();
    let c = client(&cluster.addrs);
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    let out = std::fs::read_to_string(home.join("batch.out")).unwrap_or_default();
    assert_eq!(j.state, "COMPLETED", "{j:?}: {out}");
    assert_eq!(out, format!("NAME=\"Quorum test image\"\nID=quorum-test\n{}\n/tmp\n{id}\n", uid("alice")));
    assert_eq!(std::fs::metadata(home.join("batch.out")).unwrap().uid(), uid("alice"));
    // While its node pulls the image, the job is CONFIGURING and says what it waits for: the
    // registry is stopped (SIGSTOP) until the job shows it.
    let pid = s.registry.child.id() as i32;
    // SAFETY: signals our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let slow = format!("#!/bin/sh\n#SBATCH --container-image={}\ntrue\n", s.registry.image("2"));
    std::fs::write(home.join("slow.sh"), slow).unwrap();
    chown_tree(&home, "alice");
    let slow: u64 =
        as_user(&cluster, &s, "alice", "sbatch", &["--parsable", "slow.sh"]).success().trim().parse().unwrap();
    let waiting = wait_for(T, "the job configuring", || {
        let c = &c;
        async move { Some(job(c, slow).await).filter(|j| j.state == "CONFIGURING") }
    })
    .await;
    let squeue = run(Command::new(slurm_command("squeue")).args(["-o", "%i %t %r"]).envs(cluster.env()));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let r = &waiting.reason;
    assert!(r.contains("pulling image") && r.contains("test/busybox:2") && r.contains("node01"), "{waiting:?}");
    assert!(squeue.contains(&format!("{slow} CF pulling image")), "{squeue}");
    assert_eq!(wait_state(&c, slow, &["COMPLETED", "FAILED"], T).await.state, "COMPLETED");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pull_names_the_image_and_the_cause() {
    if !ready() {
        return;
    }
    let s = Setup::new();
    let cluster = start(&s, DevOptions { agents: 1, ..DevOptions::for_tests() }).await;
    let failed = |r: Run| {
        assert_ne!(r.code, 0, "{r:?}");
        r.stderr
    };
    // `srun --container-image=<tag> true` as `user`: what it said, having failed.
    let pull = |user: &str, tag: &str| {
        failed(as_user(&cluster, &s, user, "srun", &[&format!("--container-image={}", s.registry.image(tag)), "true"]))
    };
    let wrong_tag = pull("alice", "9");
    assert!(wrong_tag.contains("test/busybox:9") && wrong_tag.contains("no such image or tag"), "{wrong_tag}");
    let wrong_password = pull("mallory", "1");
    assert!(wrong_password.contains("refused the credentials"), "{wrong_password}");
    // A layer the registry serves changed: tag 3, a layer of its own, corrupted at rest.
    let bundle = s.dir.path().join("bundle3");
    run(Command::new("umoci").args(["unpack", "--image"]).arg(format!("{}:1", s.layout.display())).arg(&bundle));
    std::fs::write(bundle.join("rootfs/etc/three"), "3\n".repeat(1000)).unwrap();
    run(Command::new("umoci").args(["repack", "--image"]).arg(format!("{}:3", s.layout.display())).arg(&bundle));
    s.registry.push(&s.layout, "3");
    let top = s.registry.layers("3").pop().unwrap();
    let blob = s.registry.blob_file(&top);
    let mut bytes = std::fs::read(&blob).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    let corrupt = pull("alice", "3");
    assert!(corrupt.contains("test/busybox:3") && corrupt.contains("does not match its digest"), "{corrupt}");
    // Asked again, refused again, the same way: nothing half-made was kept.
    let again = pull("alice", "3");
    assert!(again.contains("does not match its digest"), "{again}");
    // A squashfs file this host sees is missing: refused at submit.
    let missing = failed(as_user(&cluster, &s, "alice", "srun", &["--container-image=./nothing.sqsh", "true"]));
    assert!(missing.contains("no such squashfs file"), "{missing}");
    // A batch job whose image cannot be pulled fails, and says why in its error file.
    let home = s.home("alice");
    std::fs::write(
        home.join("bad.sh"),
        format!("#!/bin/sh\n#SBATCH --container-image={}\ntrue\n", s.registry.image("9")),
    )
    .unwrap();
    chown_tree(&home, "alice");
    let id: u64 = as_user(&cluster, &s, "alice", "sbatch", &["--parsable", "-o", "bad.out", "bad.sh"])
        .success()
        .trim()
        .parse()
        .unwrap();
    let c = client(&cluster.addrs);
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "FAILED");
    // Its reason (scontrol's, squeue's) is why, naming the image.
    assert!(j.reason.contains("test/busybox:9") && j.reason.contains("no such image or tag"), "{j:?}");
    let said = std::fs::read_to_string(home.join("bad.out")).unwrap_or_default();
    assert!(said.contains("test/busybox:9") && said.contains("no such image or tag"), "{said}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_and_gpus_hold_inside_as_outside() {
    if !ready() {
        return;
    }
    let s = Setup::new();
    // Fake GPU device files (character devices) on a file system that allows them.
    let devs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let files: Vec<PathBuf> = (0..2).map(|i| devs.path().join(format!("nvidia{i}"))).collect();
    for (i, f) in files.iter().enumerate() {
        let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mknod reads the NUL-terminated path only.
        let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(195, 240 + i as u32)) };
        assert_eq!(made, 0, "mknod {}: {}", f.display(), std::io::Error::last_os_error());
    }
    let opts = DevOptions { agents: 1, cgroups: true, gpus_per_agent: 2, gpu_files: files, ..DevOptions::for_tests() };
    let cluster = start(&s, opts).await;
    let image_arg = format!("--container-image={}", s.registry.image("1"));
    // One GPU: its device file alone in the container's /dev, and CUDA_VISIBLE_DEVICES as outside.
    let out = as_user(
        &cluster,
        &s,
        "alice",
        "srun",
        &["--gpus-per-task=1", &image_arg, "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; ls /dev | grep nvidia"],
    )
    .success();
    let lines: Vec<&str> = out.lines().collect();
    let own: u32 = lines[0].parse().unwrap_or_else(|_| panic!("{out}"));
    assert_eq!(lines[1..], [format!("nvidia{}", 240 + own).as_str()], "{out}");
    // Over its memory inside: stopped as outside (the OOM killer in its cgroup, or its rlimit
    // where the node has no cgroups); the same copy within its memory runs.
    let c = client(&cluster.addrs);
    let limits = nodes(&c).await[0].limits.clone();
    let dd = |mem: &str, bs: &str| {
        as_user(&cluster, &s, "alice", "srun", &[mem, &image_arg, "dd", "if=/dev/zero", "of=/dev/null", bs, "count=1"])
    };
    let over = dd("--mem=32M", "bs=256M");
    assert_ne!(over.code, 0, "{over:?} ({limits})");
    assert!(!over.stderr.contains("1+0 records in"), "{over:?} ({limits})");
    let within = dd("--mem=64M", "bs=8M");
    assert_eq!(within.code, 0, "{within:?} ({limits})");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_containers_never_runs_a_container_job_outside_one() {
    if !ready() {
        return;
    }
    let s = Setup::new();
    let off = quorum_agent::container::ContainerConfig { enabled: false, ..s.containers() };
    let opts = DevOptions { agents: 1, containers: off, switch_user: true, ..DevOptions::for_tests() };
    let cluster = cluster(opts).await;
    let c = client(&cluster.addrs);
    wait_ready(&cluster, &c, 1).await;
    let image_arg = format!("--container-image={}", s.registry.image("1"));
    let step = as_user(&cluster, &s, "alice", "srun", &[&image_arg, "cat", "/etc/os-release"]);
    assert_ne!(step.code, 0, "{step:?}");
    assert!(step.stderr.contains("cannot run containers") && !step.stdout.contains("ID="), "{step:?}");
    let home = s.home("alice");
    std::fs::write(home.join("off.sh"), format!("#!/bin/sh\n#SBATCH {image_arg}\ncat /etc/os-release\n")).unwrap();
    chown_tree(&home, "alice");
    let id: u64 = as_user(&cluster, &s, "alice", "sbatch", &["--parsable", "-o", "off.out", "off.sh"])
        .success()
        .trim()
        .parse()
        .unwrap();
    let j = wait_state(&c, id, &["COMPLETED", "FAILED"], T).await;
    assert_eq!(j.state, "FAILED", "{j:?}");
    assert!(j.reason.contains("cannot run containers"), "{j:?}");
    cluster.shutdown().await;
}
