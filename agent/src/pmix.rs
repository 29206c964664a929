//! PMIx for a step's tasks (`srun --mpi=pmix`): on each node of the step, a PMIx server built on
//! the reference library (OpenPMIx's `libpmix.so.2`, loaded when first needed, so the agent
//! builds and runs without it) serves that node's tasks: rank, size, local ranks, the node and
//! process maps, and fences with their data (Open MPI's modex).
//!
//! The server does not run in the agent. Each step gets a helper process on each of its nodes
//! (`quorum-agent --pmix-server`), started as the job's user in the job's cgroup, with its
//! rendezvous directory in the job's temporary directory: the library parses what the tasks send
//! it, and a task that breaks it breaks only its own step's server, with no privilege to gain.
//! The agent and the helper speak JSON lines on the helper's standard input and output:
//!
//! - agent → helper: the step's layout (first line); `{"done":SEQ,"data":B64}` when fence SEQ
//!   completed on every node, its data every node's contribution in node order;
//! - helper → agent: `{"rank":R,"env":[[K,V],...]}` for each task here, then `{"ready":true}`;
//!   `{"fence":SEQ,"data":B64}` when this node's tasks entered fence SEQ (their data, packed by
//!   the library); `{"abort":STATUS,"message":TEXT}` when a task called `PMIx_Abort`.
//!
//! A fence's contributions travel as PMI-2's do: on the agent's stream to the leader, which
//! passes each node's to every node of the step ([`PmiExchange`] with one pair, `pmix`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use base64::Engine;
use quorum_proto::agent::{agent_message, AgentMessage, PmiExchange, PmiPair, StepLaunch};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// What an agent that serves PMIx tells the leader it can do, and the name launches give it.
pub const CAPABILITY: &str = quorum_model::mpi::Mpi::Pmix.wire();

/// The library, by its soname (Debian's `libpmix2`, OpenPMIx 4 and 5).
const LIBRARY: &str = "libpmix.so.2";
/// The key a fence contribution travels under in a [`PmiExchange`].
const KEY: &str = "pmix";
/// One node's contribution to one fence, packed: past this the fence fails on that node.
const MAX_CONTRIBUTION: usize = 2 << 20;
/// A fence's data on one node, all nodes' together.
const MAX_FENCE: usize = 64 << 20;
/// A contribution for a fence further ahead than this is dropped.
const MAX_FENCES_AHEAD: u32 = 2;
/// The longest line the helper may write (a fence of [`MAX_CONTRIBUTION`] in base64).
const MAX_LINE: usize = 4 << 20;
/// How long the helper may take to start the server and set up the tasks.
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether this node can serve PMIx: the library loads (asked once).
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: loading OpenPMIx runs its initialisers, which only register its components.
    *AVAILABLE.get_or_init(|| unsafe { libloading::Library::new(LIBRARY) }.is_ok())
}

/// The step's layout, as the agent tells the helper.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct Layout {
    /// The step's PMIx namespace.
    nspace: String,
    /// The server's rendezvous directory (the job's user's).
    dir: String,
    /// This node's name, and every node's in node order.
    host: String,
    hosts: Vec<String>,
    node_id: u32,
    node_tasks: Vec<u32>,
    /// The tasks numbered round-robin over the nodes (`--distribution=cyclic`).
    #[serde(default)]
    cyclic: bool,
    job_id: u64,
    uid: u32,
    gid: u32,
}

impl Layout {
    /// The ranks on each node, and the total.
    fn ranks(&self) -> (Vec<Vec<u32>>, u32) {
        let total = self.node_tasks.iter().fold(0u32, |t, &n| t.saturating_add(n));
        (quorum_model::step::task_ranks(&self.node_tasks, self.cyclic), total)
    }
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(untagged)]
enum FromHelper {
    Env { rank: u32, env: Vec<(String, String)> },
    Ready { ready: bool },
    Fence { fence: u32, data: String },
    Abort { abort: i32, message: String },
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(untagged)]
enum ToHelper {
    Done { done: u32, data: String },
}

/// One step's PMIx on this node, from its launch on (other nodes' contributions may come
/// before its tasks start).
pub struct StepPmix {
    /// The step's namespace: `quorum.JOB.STEP.SECRET`.
    nspace: String,
    job_id: u64,
    step_id: u32,
    node_id: u32,
    node_tasks: Vec<u32>,
    cyclic: bool,
    hosts: Vec<String>,
    outbox: mpsc::Sender<AgentMessage>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    completed: u32,
    /// Contributions to fences not completed yet: fence → node → data.
    arrived: BTreeMap<u32, BTreeMap<u32, Vec<u8>>>,
    /// The helper's input, once it runs; dropped (the helper ends) when the step is gone here.
    to_helper: Option<mpsc::Sender<String>>,
    helper: Option<tokio::process::Child>,
    closed: bool,
}

impl std::fmt::Debug for StepPmix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepPmix").field("job", &self.job_id).field("step", &self.step_id).finish()
    }
}

/// What a started helper gives the step's tasks here: each task's PMIx variables by rank.
pub type TaskEnvironments = HashMap<u32, Vec<(String, String)>>;

impl StepPmix {
    pub fn new(l: &StepLaunch, outbox: mpsc::Sender<AgentMessage>) -> Result<Arc<StepPmix>, String> {
        crate::pmi::check_layout(l)?;
        let list = l.env.iter().find(|e| e.name == "SLURM_STEP_NODELIST").map(|e| e.value.as_str()).unwrap_or("");
        let hosts = quorum_model::hostlist::expand_at_most(list, l.node_tasks.len())
            .map_err(|e| format!("the step's node list '{list}': {e}"))?;
        if hosts.len() != l.node_tasks.len() {
            return Err(format!("the step's node list '{list}' does not name its {} nodes", l.node_tasks.len()));
        }
        let secret = l
            .env
            .iter()
            .find(|e| e.name == quorum_model::mpi::PMIX_SECRET_ENV)
            .map(|e| e.value.as_str())
            .filter(|s| (16..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or("the launch carries no PMIx secret (its leader is older than this agent)")?;
        Ok(Arc::new(StepPmix {
            nspace: format!("quorum.{}.{}.{secret}", l.job_id, l.step_id),
            job_id: l.job_id,
            step_id: l.step_id,
            node_id: l.node_id,
            node_tasks: l.node_tasks.clone(),
            cyclic: l.cyclic,
            hosts,
            outbox,
            inner: Mutex::new(Inner::default()),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts this node's server for the step, as `account` (the agent's own user when none)
    /// in the job's cgroup, with its rendezvous directory under `tmpdir`; then each task's
    /// variables.
    pub async fn start(
        self: &Arc<Self>,
        on_abort: impl Fn() + Send + 'static,
        account: Option<&crate::identity::Account>,
        cgroup_procs: &[std::path::PathBuf],
        tmpdir: &std::path::Path,
    ) -> Result<TaskEnvironments, String> {
        let (uid, gid) = match account {
            Some(a) => (a.uid, a.gid),
            // SAFETY: getuid and getgid cannot fail.
            None => unsafe { (libc::getuid(), libc::getgid()) },
        };
        let base = if tmpdir.is_dir() { tmpdir.to_path_buf() } else { std::env::temp_dir() };
        let dir = base.join(format!("pmix.{}.{}.{}", self.job_id, self.step_id, self.node_id));
        let layout = Layout {
            nspace: self.nspace.clone(),
            dir: dir.display().to_string(),
            host: self.hosts[self.node_id as usize].clone(),
            hosts: self.hosts.clone(),
            node_id: self.node_id,
            node_tasks: self.node_tasks.clone(),
            cyclic: self.cyclic,
            job_id: self.job_id,
            uid,
            gid,
        };
        let mut child =
            spawn_helper(account, cgroup_procs, &base).map_err(|e| format!("cannot start the PMIx server: {e}"))?;
        let mut stdin = child.stdin.take().ok_or("the PMIx server has no input")?;
        let stdout = child.stdout.take().ok_or("the PMIx server has no output")?;
        if let Some(stderr) = child.stderr.take() {
            let (job, step) = (self.job_id, self.step_id);
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                let mut said = 0;
                while let Ok(Some(line)) = lines.next_line().await {
                    if said < 100 {
                        said += 1;
                        tracing::warn!(job, step, "PMIx server: {}", line.chars().take(500).collect::<String>());
                    }
                }
            });
        }
        let mut first = serde_json::to_string(&layout).map_err(|e| e.to_string())?;
        first.push('\n');
        stdin.write_all(first.as_bytes()).await.map_err(|e| format!("the PMIx server: {e}"))?;
        let mut lines = Lines { reader: tokio::io::BufReader::new(stdout), buf: Vec::new() };
        let mut envs = TaskEnvironments::new();
        let ready = tokio::time::timeout(START_TIMEOUT, async {
            loop {
                match lines.next().await? {
                    Some(FromHelper::Env { rank, env }) => {
                        envs.insert(rank, env);
                    }
                    Some(FromHelper::Ready { .. }) => return Ok(()),
                    Some(other) => return Err(format!("the PMIx server said {other:?} before it was ready")),
                    None => return Err("the PMIx server ended before it was ready".to_string()),
                }
            }
        })
        .await;
        match ready {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(format!("the PMIx server did not start within {}s", START_TIMEOUT.as_secs())),
        }
        let (tx, mut rx) = mpsc::channel::<String>(16);
        tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                if stdin.write_all(line.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
        {
            let mut inner = self.lock();
            if inner.closed {
                return Err("the step ended before its PMIx server started".into());
            }
            inner.to_helper = Some(tx);
            inner.helper = Some(child);
        }
        // Fences already complete here (every other node's came first) are sent by the next one.
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                match lines.next().await {
                    Ok(Some(FromHelper::Fence { fence, data })) => {
                        let bytes =
                            base64::engine::general_purpose::STANDARD.decode(data.as_bytes()).unwrap_or_default();
                        me.contribute(fence, bytes).await;
                    }
                    Ok(Some(FromHelper::Abort { abort, message })) => {
                        tracing::info!(
                            job = me.job_id,
                            step = me.step_id,
                            status = abort,
                            "a task called PMIx_Abort: {message}"
                        );
                        me.abort_here(&on_abort);
                    }
                    Ok(Some(other)) => {
                        tracing::warn!(job = me.job_id, step = me.step_id, "PMIx server: unexpected {other:?}")
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(job = me.job_id, step = me.step_id, "PMIx server: {e}");
                        break;
                    }
                }
            }
        });
        Ok(envs)
    }

    /// This node's contribution to fence `seq`: to every node of the step through the leader
    /// (or straight in, on a one-node step).
    async fn contribute(&self, seq: u32, mut data: Vec<u8>) {
        // Too much to carry: the fence completes without it, and the tasks' library fails it.
        if data.len() > MAX_CONTRIBUTION {
            tracing::warn!(
                job = self.job_id,
                step = self.step_id,
                seq,
                bytes = data.len(),
                "a PMIx fence's data is too big"
            );
            data = Vec::new();
        }
        if self.node_tasks.len() == 1 {
            self.arrive(self.node_id, seq, data);
            return;
        }
        let value = base64::engine::general_purpose::STANDARD.encode(&data);
        let exchange = PmiExchange {
            job_id: self.job_id,
            step_id: self.step_id,
            node_id: self.node_id,
            seq,
            pairs: vec![PmiPair { key: KEY.into(), value }],
        };
        let _ = self.outbox.send(AgentMessage { msg: Some(agent_message::Msg::Pmi(exchange)) }).await;
    }

    /// A node's contribution to a fence, passed on by the leader: fences complete in order once
    /// every node's has come, and the helper gets each completed one's data.
    pub fn arrive_exchange(&self, x: PmiExchange) {
        let data = x
            .pairs
            .into_iter()
            .find(|p| p.key == KEY)
            .and_then(|p| base64::engine::general_purpose::STANDARD.decode(p.value.as_bytes()).ok())
            .unwrap_or_default();
        self.arrive(x.node_id, x.seq, data);
    }

    fn arrive(&self, node: u32, seq: u32, data: Vec<u8>) {
        let mut inner = self.lock();
        let completed = inner.completed;
        if node as usize >= self.node_tasks.len() || seq <= completed || seq > completed + MAX_FENCES_AHEAD {
            tracing::warn!(
                job = self.job_id,
                step = self.step_id,
                node,
                seq,
                "an unexpected PMIx fence contribution was dropped"
            );
            return;
        }
        inner.arrived.entry(seq).or_default().insert(node, data);
        while inner.arrived.get(&(inner.completed + 1)).is_some_and(|n| n.len() == self.node_tasks.len()) {
            let seq = inner.completed + 1;
            let nodes = inner.arrived.remove(&seq).unwrap_or_default();
            inner.completed = seq;
            let total: usize = nodes.values().map(Vec::len).sum();
            let data: Vec<u8> = if total > MAX_FENCE {
                tracing::warn!(
                    job = self.job_id,
                    step = self.step_id,
                    seq,
                    bytes = total,
                    "a PMIx fence's data is too big"
                );
                Vec::new()
            } else {
                nodes.into_values().flatten().collect()
            };
            let line = serde_json::to_string(&ToHelper::Done {
                done: seq,
                data: base64::engine::general_purpose::STANDARD.encode(&data),
            })
            .unwrap_or_default()
                + "\n";
            if let Some(tx) = &inner.to_helper {
                if tx.try_send(line).is_err() {
                    tracing::warn!(
                        job = self.job_id,
                        step = self.step_id,
                        seq,
                        "the PMIx server does not read its fences"
                    );
                }
            }
        }
    }

    /// `PMIx_Abort` from a task here: every task of the step here is killed (the step then ends
    /// as its tasks' ends say; `--kill-on-bad-exit` ends the other nodes' too).
    fn abort_here(&self, kill: &impl Fn()) {
        let _ = self.outbox.try_send(AgentMessage {
            msg: Some(agent_message::Msg::StepOutput(quorum_proto::agent::StepOutput {
                job_id: self.job_id,
                step_id: self.step_id,
                task: quorum_model::step::task_ranks(&self.node_tasks, self.cyclic)
                    .get(self.node_id as usize)
                    .and_then(|r| r.first().copied())
                    .unwrap_or(0),
                stderr: true,
                data: b"quorum-agent: a task called PMIx_Abort: the step's tasks on this node are killed\n".to_vec(),
            })),
        });
        kill();
    }

    /// Ends the step's server here.
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        inner.to_helper = None;
        if let Some(mut child) = inner.helper.take() {
            let _ = child.start_kill();
        }
    }
}

/// Bounded JSON lines from the helper.
struct Lines<R> {
    reader: tokio::io::BufReader<R>,
    buf: Vec<u8>,
}

impl<R: tokio::io::AsyncRead + Unpin> Lines<R> {
    async fn next(&mut self) -> Result<Option<FromHelper>, String> {
        use tokio::io::AsyncReadExt;
        self.buf.clear();
        let read = (&mut self.reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut self.buf)
            .await
            .map_err(|e| e.to_string())?;
        if read == 0 {
            return Ok(None);
        }
        if self.buf.last() != Some(&b'\n') {
            return Err(format!("a line of the PMIx server's is longer than {MAX_LINE} bytes"));
        }
        serde_json::from_slice(&self.buf)
            .map(Some)
            .map_err(|e| format!("the PMIx server said something unreadable: {e}"))
    }
}

/// The helper: this binary again, as the job's user, in the job's cgroup, in a process group of
/// its own (the step's signals are not its), with a clean environment.
fn spawn_helper(
    account: Option<&crate::identity::Account>,
    cgroup_procs: &[std::path::PathBuf],
    cwd: &std::path::Path,
) -> std::io::Result<tokio::process::Child> {
    let exe = std::env::current_exe()?;
    let procs = crate::as_user::cgroup_files(cgroup_procs)?;
    let ids = account.map(|a| (a.uid, a.gid, a.groups.clone()));
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg(HELPER_FLAG)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("TMPDIR", cwd)
        .current_dir(cwd)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(a) = account {
        cmd.env("HOME", &a.home).env("USER", &a.name);
    }
    // SAFETY: between fork and exec only async-signal-safe calls run (setpgid, open, write,
    // close, setgroups, setgid, setuid, umask) on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            crate::as_user::join_cgroups(&procs)?;
            if let Some(ids) = &ids {
                crate::as_user::become_ids(ids)?;
            }
            libc::umask(0o077);
            Ok(())
        });
    }
    cmd.spawn()
}

/// The argument that makes `quorum-agent` the PMIx helper.
pub const HELPER_FLAG: &str = "--pmix-server";

/// The helper's side: the PMIx server for one step on one node, until the agent closes its
/// input. Never returns.
pub fn helper_main() -> ! {
    match server::run() {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1)
        }
    }
}

/// The PMIx server, through the library's C interface.
mod server {
    use super::{FromHelper, Layout, ToHelper, LIBRARY};
    use base64::Engine;
    use std::collections::BTreeMap;
    use std::ffi::{c_char, c_int, c_void, CStr, CString};
    use std::io::{BufRead, Write};
    use std::sync::{Mutex, OnceLock};

    const PMIX_SUCCESS: c_int = 0;
    const PMIX_ERROR: c_int = -1;
    const PMIX_ERR_NOT_SUPPORTED: c_int = -47;
    const PMIX_OPERATION_SUCCEEDED: c_int = -157;
    const PMIX_RANK_WILDCARD: u32 = u32::MAX - 1;
    const PMIX_BOOL: u16 = 1;
    const PMIX_STRING: u16 = 3;
    const PMIX_UINT16: u16 = 13;
    const PMIX_UINT32: u16 = 14;
    const PMIX_DATA_ARRAY: u16 = 39;
    const PMIX_PROC_RANK: u16 = 40;
    const PMIX_REGEX: u16 = 49;

    /// `pmix_proc_t`.
    #[repr(C)]
    pub struct Proc {
        nspace: [c_char; 256],
        rank: u32,
    }

    /// `pmix_data_array_t`.
    #[repr(C)]
    struct DataArray {
        kind: u16,
        size: usize,
        array: *mut c_void,
    }

    type OpCb = unsafe extern "C" fn(status: c_int, cbdata: *mut c_void);
    type ReleaseCb = unsafe extern "C" fn(cbdata: *mut c_void);
    type ModexCb = unsafe extern "C" fn(
        status: c_int,
        data: *const c_char,
        ndata: usize,
        cbdata: *mut c_void,
        release: Option<ReleaseCb>,
        release_cbdata: *mut c_void,
    );
    type FenceFn = unsafe extern "C" fn(
        procs: *const Proc,
        nprocs: usize,
        info: *const c_void,
        ninfo: usize,
        data: *mut c_char,
        ndata: usize,
        cbfunc: Option<ModexCb>,
        cbdata: *mut c_void,
    ) -> c_int;
    type AbortFn = unsafe extern "C" fn(
        proc_: *const Proc,
        server_object: *mut c_void,
        status: c_int,
        msg: *const c_char,
        procs: *const Proc,
        nprocs: usize,
        cbfunc: Option<OpCb>,
        cbdata: *mut c_void,
    ) -> c_int;

    /// `pmix_server_module_t` (PMIx 4: 28 entry points, the v1 ones first). What is left null
    /// the library answers as not supported.
    #[repr(C)]
    struct Module {
        client_connected: usize,
        client_finalized: usize,
        abort: Option<AbortFn>,
        fence_nb: Option<FenceFn>,
        rest: [usize; 24],
    }

    /// The library's entry points used here.
    struct Api {
        server_init: unsafe extern "C" fn(*mut Module, *mut c_void, usize) -> c_int,
        server_finalize: unsafe extern "C" fn() -> c_int,
        register_nspace:
            unsafe extern "C" fn(*const c_char, c_int, *mut c_void, usize, Option<OpCb>, *mut c_void) -> c_int,
        register_client: unsafe extern "C" fn(*const Proc, u32, u32, *mut c_void, Option<OpCb>, *mut c_void) -> c_int,
        setup_fork: unsafe extern "C" fn(*const Proc, *mut *mut *mut c_char) -> c_int,
        generate_regex: unsafe extern "C" fn(*const c_char, *mut *mut c_char) -> c_int,
        generate_ppn: unsafe extern "C" fn(*const c_char, *mut *mut c_char) -> c_int,
        list_start: unsafe extern "C" fn() -> *mut c_void,
        list_add: unsafe extern "C" fn(*mut c_void, *const c_char, *const c_void, u16) -> c_int,
        list_convert: unsafe extern "C" fn(*mut c_void, *mut DataArray) -> c_int,
        list_release: unsafe extern "C" fn(*mut c_void),
        _lib: libloading::Library,
    }

    impl Api {
        fn load() -> Result<Api, String> {
            // SAFETY: OpenPMIx's initialisers only register its components; each symbol is
            // given the type its header declares (PMIx 4's, which PMIx 5 keeps).
            unsafe {
                let lib = libloading::Library::new(LIBRARY).map_err(|e| format!("cannot load {LIBRARY}: {e}"))?;
                macro_rules! sym {
                    ($name:literal) => {
                        *lib.get(concat!($name, "\0").as_bytes()).map_err(|e| format!("{LIBRARY}: {}: {e}", $name))?
                    };
                }
                Ok(Api {
                    server_init: sym!("PMIx_server_init"),
                    server_finalize: sym!("PMIx_server_finalize"),
                    register_nspace: sym!("PMIx_server_register_nspace"),
                    register_client: sym!("PMIx_server_register_client"),
                    setup_fork: sym!("PMIx_server_setup_fork"),
                    generate_regex: sym!("PMIx_generate_regex"),
                    generate_ppn: sym!("PMIx_generate_ppn"),
                    list_start: sym!("PMIx_Info_list_start"),
                    list_add: sym!("PMIx_Info_list_add"),
                    list_convert: sym!("PMIx_Info_list_convert"),
                    list_release: sym!("PMIx_Info_list_release"),
                    _lib: lib,
                })
            }
        }
    }

    /// What the callbacks, on the library's thread, reach.
    struct Shared {
        nspace: [c_char; 256],
        /// Fences entered here and not completed: number → the library's callback.
        pending: Mutex<BTreeMap<u32, (ModexCb, usize)>>,
        next: Mutex<u32>,
    }

    static SHARED: OnceLock<Shared> = OnceLock::new();
    static OUT: Mutex<()> = Mutex::new(());

    fn say(msg: &FromHelper) {
        let _held = OUT.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = std::io::stdout().lock();
        let _ = serde_json::to_writer(&mut out, msg);
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    }

    /// An info list built with the library's own functions (no `pmix_info_t` layout here).
    struct Infos<'a> {
        api: &'a Api,
        list: *mut c_void,
    }

    impl<'a> Infos<'a> {
        fn new(api: &'a Api) -> Infos<'a> {
            // SAFETY: starts an empty list.
            Infos { api, list: unsafe { (api.list_start)() } }
        }

        fn add_raw(&mut self, key: &str, value: *const c_void, kind: u16) -> Result<(), String> {
            let k = CString::new(key).map_err(|e| e.to_string())?;
            // SAFETY: the list is live; the value is of the type named, and is copied.
            let rc = unsafe { (self.api.list_add)(self.list, k.as_ptr(), value, kind) };
            if rc != PMIX_SUCCESS {
                return Err(format!("PMIx_Info_list_add({key}): status {rc}"));
            }
            Ok(())
        }

        fn string(&mut self, key: &str, value: &str) -> Result<(), String> {
            let v = CString::new(value).map_err(|e| e.to_string())?;
            // The list copies the value: `v` may go when this returns.
            self.add_raw(key, v.as_ptr().cast(), PMIX_STRING)
        }

        /// A regular expression the library generated (`PMIx_generate_regex`/`_ppn`).
        fn regex(&mut self, key: &str, value: *mut c_char) -> Result<(), String> {
            self.add_raw(key, value.cast(), PMIX_REGEX)
        }

        fn u32(&mut self, key: &str, value: u32) -> Result<(), String> {
            self.add_raw(key, (&value as *const u32).cast(), PMIX_UINT32)
        }

        fn u16(&mut self, key: &str, value: u16) -> Result<(), String> {
            self.add_raw(key, (&value as *const u16).cast(), PMIX_UINT16)
        }

        fn rank(&mut self, key: &str, value: u32) -> Result<(), String> {
            self.add_raw(key, (&value as *const u32).cast(), PMIX_PROC_RANK)
        }

        fn bool(&mut self, key: &str, value: bool) -> Result<(), String> {
            self.add_raw(key, (&value as *const bool).cast(), PMIX_BOOL)
        }

        fn array(&mut self, key: &str, inner: Infos<'_>) -> Result<(), String> {
            let array = inner.finish()?;
            self.add_raw(key, (&array as *const DataArray).cast(), PMIX_DATA_ARRAY)
        }

        /// The list as an array of `pmix_info_t` (which the library owns; this process ends
        /// before it would be freed).
        fn finish(self) -> Result<DataArray, String> {
            let mut array = DataArray { kind: 0, size: 0, array: std::ptr::null_mut() };
            // SAFETY: the list is live and converted once, then released.
            let rc = unsafe { (self.api.list_convert)(self.list, &mut array) };
            unsafe { (self.api.list_release)(self.list) };
            if rc != PMIX_SUCCESS {
                return Err(format!("PMIx_Info_list_convert: status {rc}"));
            }
            Ok(array)
        }
    }

    fn nspace_of(name: &str) -> Result<[c_char; 256], String> {
        if name.len() > 255 || name.contains('\0') {
            return Err(format!("the namespace '{name}' is too long"));
        }
        let mut out = [0 as c_char; 256];
        for (o, b) in out.iter_mut().zip(name.bytes()) {
            *o = b as c_char;
        }
        Ok(out)
    }

    /// Waits for a non-blocking call's completion (its callback, or its synchronous answer).
    fn completed(what: &str, call: impl FnOnce(Option<OpCb>, *mut c_void) -> c_int) -> Result<(), String> {
        unsafe extern "C" fn done(status: c_int, cbdata: *mut c_void) {
            // SAFETY: cbdata is the sender boxed below, taken back once.
            let tx = unsafe { Box::from_raw(cbdata.cast::<std::sync::mpsc::SyncSender<c_int>>()) };
            let _ = tx.send(status);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<c_int>(1);
        let cbdata = Box::into_raw(Box::new(tx)).cast::<c_void>();
        let rc = call(Some(done), cbdata);
        let status = if rc == PMIX_SUCCESS {
            rx.recv_timeout(std::time::Duration::from_secs(20)).map_err(|_| format!("{what}: no answer"))?
        } else {
            // SAFETY: the library did not take the callback: the box is still ours.
            drop(unsafe { Box::from_raw(cbdata.cast::<std::sync::mpsc::SyncSender<c_int>>()) });
            if rc == PMIX_OPERATION_SUCCEEDED {
                PMIX_SUCCESS
            } else {
                rc
            }
        };
        if status != PMIX_SUCCESS {
            return Err(format!("{what}: status {status}"));
        }
        Ok(())
    }

    unsafe extern "C" fn fence_nb(
        procs: *const Proc,
        nprocs: usize,
        _info: *const c_void,
        _ninfo: usize,
        data: *mut c_char,
        ndata: usize,
        cbfunc: Option<ModexCb>,
        cbdata: *mut c_void,
    ) -> c_int {
        let Some(shared) = SHARED.get() else { return PMIX_ERROR };
        let Some(cbfunc) = cbfunc else { return PMIX_ERROR };
        // Fences over the whole step only: the step's ranks wildcarded in its namespace.
        // SAFETY: the library passes nprocs procs.
        let whole = nprocs == 1
            && unsafe {
                (*procs).rank == PMIX_RANK_WILDCARD
                    && CStr::from_ptr((*procs).nspace.as_ptr()) == CStr::from_ptr(shared.nspace.as_ptr())
            };
        if !whole {
            return PMIX_ERR_NOT_SUPPORTED;
        }
        let bytes = if data.is_null() || ndata == 0 {
            Vec::new()
        } else {
            // SAFETY: the library's data, ndata bytes, read before returning.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), ndata) }.to_vec()
        };
        let seq = {
            let mut next = shared.next.lock().unwrap_or_else(|p| p.into_inner());
            *next += 1;
            *next
        };
        shared.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(seq, (cbfunc, cbdata as usize));
        say(&FromHelper::Fence { fence: seq, data: base64::engine::general_purpose::STANDARD.encode(&bytes) });
        PMIX_SUCCESS
    }

    unsafe extern "C" fn abort(
        _proc: *const Proc,
        _server_object: *mut c_void,
        status: c_int,
        msg: *const c_char,
        _procs: *const Proc,
        _nprocs: usize,
        cbfunc: Option<OpCb>,
        cbdata: *mut c_void,
    ) -> c_int {
        let message = if msg.is_null() {
            String::new()
        } else {
            // SAFETY: the library's message, a C string.
            unsafe { CStr::from_ptr(msg) }.to_string_lossy().chars().take(1000).collect()
        };
        say(&FromHelper::Abort { abort: status, message });
        // Answered after returning, as the library expects of a non-blocking call.
        if let Some(cbfunc) = cbfunc {
            let cbdata = cbdata as usize;
            // SAFETY: the library's callback for this request, called once.
            std::thread::spawn(move || unsafe { cbfunc(PMIX_SUCCESS, cbdata as *mut c_void) });
        }
        PMIX_SUCCESS
    }

    unsafe extern "C" fn release(cbdata: *mut c_void) {
        // SAFETY: the data handed over in a fence's completion, taken back once.
        drop(unsafe { Box::from_raw(cbdata.cast::<Vec<u8>>()) });
    }

    /// `PMIx_generate_regex` or `_ppn` of `input`.
    fn generated(
        f: unsafe extern "C" fn(*const c_char, *mut *mut c_char) -> c_int,
        input: &str,
    ) -> Result<*mut c_char, String> {
        let c = CString::new(input).map_err(|e| e.to_string())?;
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: a C string in, the library's allocation out.
        let rc = unsafe { f(c.as_ptr(), &mut out) };
        if rc != PMIX_SUCCESS || out.is_null() {
            return Err(format!("cannot describe '{input}' to PMIx: status {rc}"));
        }
        Ok(out)
    }

    pub fn run() -> Result<(), String> {
        let mut first = String::new();
        std::io::stdin().lock().read_line(&mut first).map_err(|e| e.to_string())?;
        let layout: Layout = serde_json::from_str(&first).map_err(|e| format!("the step's layout: {e}"))?;
        let api = Api::load()?;
        let (ranks, total) = layout.ranks();
        let node = layout.node_id as usize;
        let (Some(&mine), Some(&first_rank)) = (layout.node_tasks.get(node), ranks.get(node).and_then(|r| r.first()))
        else {
            return Err("this node is not among the step's".into());
        };
        if layout.hosts.len() != layout.node_tasks.len() {
            return Err("the step's nodes and tasks do not match".into());
        }
        std::fs::create_dir_all(&layout.dir).map_err(|e| format!("{}: {e}", layout.dir))?;
        let nspace = nspace_of(&layout.nspace)?;
        SHARED
            .set(Shared { nspace, pending: Mutex::new(BTreeMap::new()), next: Mutex::new(0) })
            .map_err(|_| "started twice")?;

        // The server, its rendezvous in the job's directory.
        let mut init = Infos::new(&api);
        init.string("pmix.srvr.tmpdir", &layout.dir)?;
        init.string("pmix.sys.tmpdir", &layout.dir)?;
        init.string("pmix.hname", &layout.host)?;
        init.bool("pmix.srvr.tool", false)?;
        init.bool("pmix.srvr.sys", false)?;
        let init = init.finish()?;
        let mut module = Box::new(Module {
            client_connected: 0,
            client_finalized: 0,
            abort: Some(abort),
            fence_nb: Some(fence_nb),
            rest: [0; 24],
        });
        // SAFETY: the module lives until the process ends; the infos are the library's.
        let rc = unsafe { (api.server_init)(&mut *module, init.array, init.size) };
        if rc != PMIX_SUCCESS {
            return Err(format!("PMIx_server_init: status {rc}"));
        }
        std::mem::forget(module);

        // The step: its size, maps, this node's peers, and every rank's place.
        let node_map = generated(api.generate_regex, &layout.hosts.join(","))?;
        let ppn: Vec<String> =
            ranks.iter().map(|r| r.iter().map(u32::to_string).collect::<Vec<_>>().join(",")).collect();
        let proc_map = generated(api.generate_ppn, &ppn.join(";"))?;
        let mut job = Infos::new(&api);
        // The job id without the secret: tools print it.
        job.string("pmix.jobid", &format!("{}", layout.job_id))?;
        job.u32("pmix.univ.size", total)?;
        job.u32("pmix.job.size", total)?;
        job.u32("pmix.max.size", total)?;
        job.u32("pmix.appnum", 0)?;
        job.u32("pmix.app.size", total)?;
        job.rank("pmix.aldr", 0)?;
        job.u32("pmix.job.napps", 1)?;
        job.u32("pmix.num.nodes", layout.node_tasks.len() as u32)?;
        job.regex("pmix.nmap", node_map)?;
        job.regex("pmix.pmap", proc_map)?;
        job.string("pmix.lpeers", &ppn[node])?;
        job.u32("pmix.local.size", mine)?;
        job.u32("pmix.node.size", mine)?;
        job.rank("pmix.lldr", first_rank)?;
        job.u32("pmix.num.slots", mine)?;
        job.string("pmix.tmpdir", &layout.dir)?;
        job.string("pmix.nsdir", &layout.dir)?;
        for (n, here) in ranks.iter().enumerate() {
            for (local, &rank) in (0u32..).zip(here) {
                let mut p = Infos::new(&api);
                p.rank("pmix.rank", rank)?;
                p.u32("pmix.appnum", 0)?;
                p.rank("pmix.apprank", rank)?;
                p.rank("pmix.grank", rank)?;
                p.u16("pmix.lrank", local.min(u32::from(u16::MAX)) as u16)?;
                p.u16("pmix.nrank", local.min(u32::from(u16::MAX)) as u16)?;
                p.u32("pmix.nodeid", n as u32)?;
                p.string("pmix.hname", &layout.hosts[n])?;
                job.array("pmix.pdata", p)?;
            }
        }
        let job = job.finish()?;
        completed("PMIx_server_register_nspace", |cb, cbdata| unsafe {
            // SAFETY: the namespace and infos outlive the call.
            (api.register_nspace)(nspace.as_ptr(), mine as c_int, job.array, job.size, cb, cbdata)
        })?;

        // Each task here: its rank, its user, and the variables that lead it to this server.
        for &rank in &ranks[node] {
            let proc_ = Proc { nspace, rank };
            completed("PMIx_server_register_client", |cb, cbdata| unsafe {
                // SAFETY: the proc outlives the call.
                (api.register_client)(&proc_, layout.uid, layout.gid, std::ptr::null_mut(), cb, cbdata)
            })?;
            let mut env: *mut *mut c_char = std::ptr::null_mut();
            // SAFETY: the library fills a NULL-terminated array of C strings.
            let rc = unsafe { (api.setup_fork)(&proc_, &mut env) };
            if rc != PMIX_SUCCESS {
                return Err(format!("PMIx_server_setup_fork({rank}): status {rc}"));
            }
            let mut vars = Vec::new();
            let mut i = 0;
            while !env.is_null() {
                // SAFETY: entries up to the NULL one are C strings.
                let entry = unsafe { *env.add(i) };
                if entry.is_null() {
                    break;
                }
                let text = unsafe { CStr::from_ptr(entry) }.to_string_lossy().into_owned();
                if let Some((k, v)) = text.split_once('=') {
                    vars.push((k.to_string(), v.to_string()));
                }
                i += 1;
            }
            say(&FromHelper::Env { rank, env: vars });
        }
        say(&FromHelper::Ready { ready: true });

        // Fences completed on every node, until the agent closes this input.
        let stdin = std::io::stdin().lock();
        for line in stdin.lines() {
            let line = line.map_err(|e| e.to_string())?;
            let ToHelper::Done { done, data } =
                serde_json::from_str(&line).map_err(|e| format!("from the agent: {e}"))?;
            let Some(shared) = SHARED.get() else { break };
            let Some((cbfunc, cbdata)) = shared.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&done) else {
                continue;
            };
            let bytes = base64::engine::general_purpose::STANDARD.decode(data.as_bytes());
            let status = if bytes.is_ok() { PMIX_SUCCESS } else { PMIX_ERROR };
            let boxed = Box::new(bytes.unwrap_or_default());
            let (ptr, len) = (boxed.as_ptr().cast::<c_char>(), boxed.len());
            // SAFETY: the library's callback for this fence, called once; it releases the data
            // through `release` when done with it.
            unsafe { cbfunc(status, ptr, len, cbdata as *mut c_void, Some(release), Box::into_raw(boxed).cast()) };
        }
        // SAFETY: the server was initialised above.
        unsafe { (api.server_finalize)() };
        Ok(())
    }
}
