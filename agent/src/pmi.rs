//! PMI for a step's tasks (`srun --mpi=pmi2`): each task gets one end of a socket pair on
//! `PMI_FD` (with `PMI_RANK`, `PMI_SIZE`, `PMI_JOBID`) and speaks PMI-1 or PMI-2 on it, as the
//! MPI library chooses in its first line. The agent serves this node's tasks of the step: the
//! step's attributes (`PMI_process_mapping`, the universe size), node attributes shared by the
//! tasks here, and the key-value space.
//!
//! A fence (PMI-2's `kvs-fence`, PMI-1's `barrier_in`) completes across all nodes of the step:
//! once every task here has entered it, what they put since the last fence goes to the leader
//! on the agent's stream ([`PmiExchange`]); the leader passes each node's contribution to every
//! node of the step, and a node's fence completes, every contribution merged into its space,
//! when it holds all of them. A one-node step's fences complete here.
//!
//! The tasks are the job's user's processes and the agent is root: every line is bounded, what a
//! task may put is bounded, and anything malformed ends that task's connection (the MPI library
//! then fails as it would on a lost PMI server) without touching the step's other tasks.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use quorum_proto::agent::{agent_message, AgentMessage, PmiExchange, PmiPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch, Notify};

/// What an agent that serves PMI tells the leader it can do, and the name launches give it.
pub const CAPABILITY: &str = quorum_model::mpi::Mpi::Pmi2.wire();

/// The longest key and value a task may put (PMI-2's limits; PMI-1 is told the same).
const MAX_KEY: usize = 64;
const MAX_VALUE: usize = 1024;
/// The longest PMI-1 line or PMI-2 command read.
const MAX_COMMAND: usize = 8 * 1024;
/// What one node's tasks may put between two fences, together: one fence's message to the
/// leader stays well under the stream's message size.
const MAX_NODE_PUTS: usize = 2 << 20;
/// A contribution for a fence further ahead than this is dropped (no node runs more than one
/// fence ahead of the slowest).
const MAX_FENCES_AHEAD: u32 = 2;
/// Node attributes the tasks here may put, together.
const MAX_NODE_ATTRS: usize = 1 << 20;
/// The step's whole key-value space as a node holds it: pairs that would take it past this are
/// dropped, the same ones on every node (each merges the nodes' parts in node order). MPICH puts
/// a few hundred bytes per rank, so 64 MiB holds 100,000 ranks; without a bound, a step that
/// puts new keys before every fence would grow the agent without end.
const MAX_KVS: usize = 64 << 20;

/// One step's PMI on this node.
pub struct StepPmi {
    job_id: u64,
    step_id: u32,
    node_id: u32,
    /// Tasks on each node of the step, in node order.
    node_tasks: Vec<u32>,
    /// `PMI_process_mapping`, made once: every rank asks for it.
    mapping: String,
    local_tasks: u32,
    outbox: mpsc::Sender<AgentMessage>,
    inner: Mutex<Inner>,
    /// The number of fences completed here.
    done: watch::Sender<u32>,
    /// Node attributes changed (PMI-2 `info-getnodeattr` with `wait=TRUE`).
    attrs_changed: Notify,
    /// Turns true when none of the step's tasks runs here any more: connections still served
    /// (one waiting in a fence the other nodes never complete) end.
    closed: watch::Sender<bool>,
}

#[derive(Default)]
struct Inner {
    /// What every fence so far made visible, and its size.
    kvs: HashMap<String, String>,
    kvs_bytes: usize,
    /// What the tasks here put since the last fence, and its size.
    puts: Vec<(String, String)>,
    put_bytes: usize,
    /// Tasks here that entered the next fence.
    entered: u32,
    /// Contributions to fences not completed yet: fence → node → pairs.
    arrived: BTreeMap<u32, BTreeMap<u32, Vec<(String, String)>>>,
    node_attrs: HashMap<String, String>,
    attr_bytes: usize,
}

impl std::fmt::Debug for StepPmi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepPmi")
            .field("job", &self.job_id)
            .field("step", &self.step_id)
            .field("node", &self.node_id)
            .finish()
    }
}

/// That a launch's `node_tasks` hold its own tasks where it says, and number fewer ranks than
/// PMI's and PMIx's reserved ones.
pub(crate) fn check_layout(launch: &quorum_proto::agent::StepLaunch) -> Result<(), String> {
    if launch.node_tasks.is_empty() {
        return Err("the launch carries no layout of the step".into());
    }
    local_ranks(launch).map(drop)
}

/// The tasks of a launch that run here, in order: `first_task`, `first_task + 1`, ... in
/// blocks; with the cyclic numbering, this node's share of the step's layout (`node_tasks`),
/// checked against `first_task` and `tasks`.
pub(crate) fn local_ranks(launch: &quorum_proto::agent::StepLaunch) -> Result<Vec<u32>, String> {
    let block = || launch.first_task..launch.first_task.saturating_add(launch.tasks);
    if launch.node_tasks.is_empty() && !launch.cyclic {
        return Ok(block().collect());
    }
    let total: u64 = launch.node_tasks.iter().map(|&t| u64::from(t)).sum();
    let wrong = || {
        Err(format!(
            "the step's layout ({:?} tasks per node{}) does not hold this node's {} tasks from {}",
            launch.node_tasks,
            if launch.cyclic { ", cyclic" } else { "" },
            launch.tasks,
            launch.first_task
        ))
    };
    if total > u64::from(u32::MAX - 2) || launch.node_tasks.get(launch.node_id as usize) != Some(&launch.tasks) {
        return wrong();
    }
    let mine = quorum_model::step::task_ranks(&launch.node_tasks, launch.cyclic).swap_remove(launch.node_id as usize);
    if mine.first().is_some_and(|&f| f != launch.first_task) {
        return wrong();
    }
    Ok(mine)
}

impl StepPmi {
    pub fn new(
        launch: &quorum_proto::agent::StepLaunch,
        outbox: mpsc::Sender<AgentMessage>,
    ) -> Result<Arc<StepPmi>, String> {
        check_layout(launch)?;
        Ok(Arc::new(StepPmi {
            job_id: launch.job_id,
            step_id: launch.step_id,
            node_id: launch.node_id,
            node_tasks: launch.node_tasks.clone(),
            mapping: quorum_model::mpi::process_mapping(&launch.node_tasks, launch.cyclic),
            local_tasks: launch.tasks,
            outbox,
            inner: Mutex::new(Inner::default()),
            done: watch::Sender::new(0),
            attrs_changed: Notify::new(),
            closed: watch::Sender::new(false),
        }))
    }

    fn size(&self) -> u32 {
        self.node_tasks.iter().sum()
    }

    /// The step's name in PMI (`PMI_JOBID`, the space's name).
    fn kvsname(&self) -> String {
        format!("{}.{}", self.job_id, self.step_id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a task's environment gets, beside its end of the socket.
    pub fn environment(&self, task: u32, fd: i32) -> Vec<(String, String)> {
        vec![
            ("PMI_FD".into(), fd.to_string()),
            ("PMI_RANK".into(), task.to_string()),
            ("PMI_SIZE".into(), self.size().to_string()),
            ("PMI_JOBID".into(), self.kvsname()),
        ]
    }

    /// A step attribute (PMI-2 `info-getjobattr`; PMI-1 reads them as keys).
    fn attribute(&self, key: &str) -> Option<String> {
        match key {
            "PMI_process_mapping" => Some(self.mapping.clone()),
            "universeSize" => Some(self.size().to_string()),
            _ => None,
        }
    }

    fn put(&self, key: &str, value: &str) -> Result<(), &'static str> {
        let size = pair_size(key, value)?;
        let mut inner = self.lock();
        if inner.put_bytes + size > MAX_NODE_PUTS {
            return Err("too much put before a fence");
        }
        inner.put_bytes += size;
        inner.puts.push((key.to_string(), value.to_string()));
        Ok(())
    }

    fn get(&self, key: &str) -> Option<String> {
        self.lock().kvs.get(key).cloned().or_else(|| self.attribute(key))
    }

    fn put_node_attr(&self, key: &str, value: &str) -> Result<(), &'static str> {
        let size = pair_size(key, value)?;
        {
            let mut inner = self.lock();
            if inner.attr_bytes + size > MAX_NODE_ATTRS {
                return Err("too many node attributes");
            }
            inner.attr_bytes += size;
            inner.node_attrs.insert(key.to_string(), value.to_string());
        }
        self.attrs_changed.notify_waiters();
        Ok(())
    }

    async fn node_attr(&self, key: &str, wait: bool) -> Option<String> {
        loop {
            let changed = self.attrs_changed.notified();
            if let Some(v) = self.lock().node_attrs.get(key).cloned() {
                return Some(v);
            }
            if !wait {
                return None;
            }
            changed.await;
        }
    }

    /// Enters the next fence and waits until it completes on every node of the step.
    async fn fence(&self) {
        let mut done = self.done.subscribe();
        let (seq, send) = {
            let mut inner = self.lock();
            let seq = *done.borrow() + 1;
            inner.entered += 1;
            if inner.entered >= self.local_tasks {
                inner.entered = 0;
                inner.put_bytes = 0;
                (seq, Some(std::mem::take(&mut inner.puts)))
            } else {
                (seq, None)
            }
        };
        if let Some(pairs) = send {
            if self.node_tasks.len() == 1 {
                self.arrive(self.node_id, seq, pairs);
            } else {
                let exchange = PmiExchange {
                    job_id: self.job_id,
                    step_id: self.step_id,
                    node_id: self.node_id,
                    seq,
                    pairs: pairs.into_iter().map(|(key, value)| PmiPair { key, value }).collect(),
                };
                let _ = self.outbox.send(AgentMessage { msg: Some(agent_message::Msg::Pmi(exchange)) }).await;
            }
        }
        let _ = done.wait_for(|&d| d >= seq).await;
    }

    /// A node's contribution to a fence (from the leader, or this node's own on a one-node
    /// step): fences complete in order once every node's has come.
    pub fn arrive(&self, node: u32, seq: u32, pairs: Vec<(String, String)>) {
        let completed = *self.done.borrow();
        if node as usize >= self.node_tasks.len() || seq <= completed || seq > completed + MAX_FENCES_AHEAD {
            tracing::warn!(
                job = self.job_id,
                step = self.step_id,
                node,
                seq,
                "an unexpected PMI fence contribution was dropped"
            );
            return;
        }
        let mut inner = self.lock();
        inner.arrived.entry(seq).or_default().insert(node, pairs);
        let mut completed = completed;
        let mut dropped = 0usize;
        while inner.arrived.get(&(completed + 1)).is_some_and(|n| n.len() == self.node_tasks.len()) {
            let nodes = inner.arrived.remove(&(completed + 1)).unwrap_or_default();
            for (key, value) in nodes.into_values().flatten() {
                let old = inner.kvs.get(&key).map_or(0, |v| key.len() + v.len());
                let bytes = inner.kvs_bytes - old + key.len() + value.len();
                if bytes > MAX_KVS {
                    dropped += 1;
                    continue;
                }
                inner.kvs_bytes = bytes;
                inner.kvs.insert(key, value);
            }
            completed += 1;
        }
        if dropped > 0 {
            tracing::warn!(
                job = self.job_id,
                step = self.step_id,
                dropped,
                "PMI pairs past the key-value space's {MAX_KVS} bytes were dropped"
            );
        }
        drop(inner);
        self.done.send_if_modified(|d| {
            let changed = *d != completed;
            *d = completed;
            changed
        });
    }

    /// Ends what is still served of the step here.
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Serves one task on its end of the socket pair until it closes it, misbehaves, or the
    /// step is gone here.
    pub async fn serve(self: Arc<Self>, task: u32, stream: UnixStream) {
        let mut closed = self.closed.subscribe();
        tokio::select! {
            served = self.serve_task(task, stream) => if let Err(e) = served {
                tracing::info!(job = self.job_id, step = self.step_id, task, "PMI connection ended: {e}");
            },
            _ = closed.wait_for(|&c| c) => {}
        }
    }

    async fn serve_task(&self, task: u32, mut stream: UnixStream) -> std::io::Result<()> {
        let mut conn = Conn { buf: Vec::new() };
        // Both protocols begin with PMI-1's `cmd=init pmi_version=N pmi_subversion=M`.
        let Some(line) = conn.line(&mut stream).await? else { return Ok(()) };
        let init = pmi1_fields(&line);
        if field(&init, "cmd") != Some("init") {
            return Err(bad(format!("expected cmd=init, got {line}")));
        }
        match field(&init, "pmi_version") {
            Some("2") => {
                stream.write_all(b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n").await?;
                self.pmi2(task, &mut conn, &mut stream).await
            }
            _ => {
                stream.write_all(b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n").await?;
                self.pmi1(task, &mut conn, &mut stream).await
            }
        }
    }

    async fn pmi1(&self, task: u32, conn: &mut Conn, stream: &mut UnixStream) -> std::io::Result<()> {
        let kvsname = self.kvsname();
        while let Some(line) = conn.line(stream).await? {
            let f = pmi1_fields(&line);
            let answer = match field(&f, "cmd").unwrap_or("") {
                "get_maxes" => {
                    format!("cmd=maxes rc=0 kvsname_max=256 keylen_max={MAX_KEY} vallen_max={MAX_VALUE}")
                }
                "get_appnum" => "cmd=appnum rc=0 appnum=0".into(),
                "get_my_kvsname" => format!("cmd=my_kvsname rc=0 kvsname={kvsname}"),
                "get_universe_size" => format!("cmd=universe_size rc=0 size={}", self.size()),
                "barrier_in" => {
                    self.fence().await;
                    "cmd=barrier_out rc=0".into()
                }
                "put" => match self.put(field(&f, "key").unwrap_or(""), field(&f, "value").unwrap_or("")) {
                    Ok(()) => "cmd=put_result rc=0 msg=success".into(),
                    Err(e) => format!("cmd=put_result rc=-1 msg={}", e.replace(' ', "_")),
                },
                "get" => {
                    let key = field(&f, "key").unwrap_or("");
                    match self.get(key) {
                        Some(v) => format!("cmd=get_result rc=0 msg=success value={v}"),
                        None => format!("cmd=get_result rc=-1 msg=key_{key}_not_found"),
                    }
                }
                "finalize" => {
                    stream.write_all(b"cmd=finalize_ack rc=0\n").await?;
                    return Ok(());
                }
                "abort" => {
                    tracing::info!(job = self.job_id, step = self.step_id, task, "a task called PMI_Abort");
                    return Ok(());
                }
                "initack" => {
                    format!("cmd=initack rc=0\ncmd=set size={}\ncmd=set rank={task}\ncmd=set debug=0", self.size())
                }
                other => return Err(bad(format!("PMI-1 command '{other}' is not served"))),
            };
            stream.write_all(format!("{answer}\n").as_bytes()).await?;
        }
        Ok(())
    }

    async fn pmi2(&self, task: u32, conn: &mut Conn, stream: &mut UnixStream) -> std::io::Result<()> {
        while let Some(command) = conn.frame(stream).await? {
            let f = pmi2_fields(&command);
            let cmd = field(&f, "cmd").unwrap_or("").to_string();
            let mut answer: Vec<(&str, String)> = match cmd.as_str() {
                "fullinit" => {
                    let asked = field(&f, "pmirank").and_then(|r| r.parse::<u32>().ok());
                    if asked.is_some_and(|r| r != task) {
                        return Err(bad(format!("fullinit as rank {asked:?}, but this socket is task {task}'s")));
                    }
                    vec![
                        ("pmi-version", "2".into()),
                        ("pmi-subversion", "0".into()),
                        ("rank", task.to_string()),
                        ("size", self.size().to_string()),
                        ("appnum", "0".into()),
                        ("debugged", "FALSE".into()),
                        ("pmiverbose", "FALSE".into()),
                        ("rc", "0".into()),
                    ]
                }
                "job-getid" => vec![("jobid", self.kvsname()), ("rc", "0".into())],
                "info-getjobattr" => match self.attribute(field(&f, "key").unwrap_or("")) {
                    Some(v) => vec![("found", "TRUE".into()), ("value", v), ("rc", "0".into())],
                    None => vec![("found", "FALSE".into()), ("rc", "0".into())],
                },
                "info-putnodeattr" => {
                    match self.put_node_attr(field(&f, "key").unwrap_or(""), field(&f, "value").unwrap_or("")) {
                        Ok(()) => vec![("rc", "0".into())],
                        Err(e) => vec![("rc", "1".into()), ("errmsg", e.into())],
                    }
                }
                "info-getnodeattr" => {
                    let wait = field(&f, "wait") == Some("TRUE");
                    match self.node_attr(field(&f, "key").unwrap_or(""), wait).await {
                        Some(v) => vec![("found", "TRUE".into()), ("value", v), ("rc", "0".into())],
                        None => vec![("found", "FALSE".into()), ("rc", "0".into())],
                    }
                }
                "kvs-put" => match self.put(field(&f, "key").unwrap_or(""), field(&f, "value").unwrap_or("")) {
                    Ok(()) => vec![("rc", "0".into())],
                    Err(e) => vec![("rc", "1".into()), ("errmsg", e.into())],
                },
                "kvs-fence" => {
                    self.fence().await;
                    vec![("rc", "0".into())]
                }
                "kvs-get" => match self.get(field(&f, "key").unwrap_or("")) {
                    Some(v) => vec![("found", "TRUE".into()), ("value", v), ("rc", "0".into())],
                    None => vec![("found", "FALSE".into()), ("rc", "0".into())],
                },
                "finalize" => {
                    write_frame(stream, "finalize-response", &[("rc", "0".into())]).await?;
                    return Ok(());
                }
                "abort" => {
                    tracing::info!(job = self.job_id, step = self.step_id, task, "a task called PMI2_Abort");
                    return Ok(());
                }
                "spawn" | "job-connect" | "job-disconnect" | "name-publish" | "name-unpublish" | "name-lookup" => {
                    vec![("rc", "1".into()), ("errmsg", format!("{cmd} is not supported by this cluster"))]
                }
                other => return Err(bad(format!("PMI-2 command '{other}' is not served"))),
            };
            if let Some(thrid) = field(&f, "thrid") {
                answer.push(("thrid", thrid.to_string()));
            }
            write_frame(stream, &format!("{cmd}-response"), &answer).await?;
        }
        Ok(())
    }
}

/// A key and value a task may put, and what they take.
fn pair_size(key: &str, value: &str) -> Result<usize, &'static str> {
    if key.is_empty() || key.len() > MAX_KEY || value.len() > MAX_VALUE {
        return Err("key or value too long");
    }
    Ok(key.len() + value.len())
}

fn bad(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

/// A connection's unread bytes.
struct Conn {
    buf: Vec<u8>,
}

impl Conn {
    /// Reads until `n` bytes are buffered; false at the end of the stream.
    async fn fill(&mut self, stream: &mut UnixStream, n: usize) -> std::io::Result<bool> {
        let mut chunk = [0u8; 4096];
        while self.buf.len() < n {
            let got = stream.read(&mut chunk).await?;
            if got == 0 {
                return Ok(false);
            }
            self.buf.extend_from_slice(&chunk[..got]);
        }
        Ok(true)
    }

    /// A PMI-1 line, without its newline; `None` at the end of the stream.
    async fn line(&mut self, stream: &mut UnixStream) -> std::io::Result<Option<String>> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                return String::from_utf8(line[..end].to_vec())
                    .map(Some)
                    .map_err(|_| bad("a line that is not UTF-8".into()));
            }
            if self.buf.len() > MAX_COMMAND {
                return Err(bad(format!("a line longer than {MAX_COMMAND} bytes")));
            }
            let have = self.buf.len();
            if !self.fill(stream, have + 1).await? {
                return Ok(None);
            }
        }
    }

    /// A PMI-2 command: six characters of decimal length, then that many bytes.
    async fn frame(&mut self, stream: &mut UnixStream) -> std::io::Result<Option<String>> {
        if !self.fill(stream, 6).await? {
            return Ok(None);
        }
        let header: Vec<u8> = self.buf.drain(..6).collect();
        let len: usize = std::str::from_utf8(&header).ok().and_then(|h| h.trim().parse().ok()).ok_or_else(|| {
            bad(format!("a PMI-2 length that is not a number: {:?}", String::from_utf8_lossy(&header)))
        })?;
        if len > MAX_COMMAND {
            return Err(bad(format!("a PMI-2 command of {len} bytes; at most {MAX_COMMAND}")));
        }
        if !self.fill(stream, len).await? {
            return Ok(None);
        }
        let body: Vec<u8> = self.buf.drain(..len).collect();
        String::from_utf8(body).map(Some).map_err(|_| bad("a command that is not UTF-8".into()))
    }
}

async fn write_frame(stream: &mut UnixStream, cmd: &str, fields: &[(&str, String)]) -> std::io::Result<()> {
    let mut body = format!("cmd={cmd};");
    for (k, v) in fields {
        body.push_str(k);
        body.push('=');
        body.push_str(&v.replace(';', ";;"));
        body.push(';');
    }
    let frame = format!("{:<6}{body}", body.len());
    stream.write_all(frame.as_bytes()).await
}

/// PMI-1's `key=value` words.
fn pmi1_fields(line: &str) -> Vec<(String, String)> {
    line.split_whitespace().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// PMI-2's `key=value;` pairs, `;;` standing for a `;` in a value.
fn pmi2_fields(command: &str) -> Vec<(String, String)> {
    let mut fields = Vec::new();
    let (mut current, mut chars) = (String::new(), command.chars().peekable());
    while let Some(c) = chars.next() {
        if c == ';' {
            if chars.peek() == Some(&';') {
                chars.next();
                current.push(';');
                continue;
            }
            if let Some((k, v)) = current.split_once('=') {
                fields.push((k.to_string(), v.to_string()));
            }
            current.clear();
        } else {
            current.push(c);
        }
    }
    if let Some((k, v)) = current.split_once('=') {
        fields.push((k.to_string(), v.to_string()));
    }
    fields
}

fn field<'a>(fields: &'a [(String, String)], key: &str) -> Option<&'a str> {
    fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// The PMI socket pairs of this node's tasks of a step: the agent's ends, served, and the
/// tasks' ends, handed to them across exec.
pub fn socket_pair() -> std::io::Result<(UnixStream, std::os::fd::OwnedFd)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    Ok((UnixStream::from_std(ours)?, theirs.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmi2_fields_unescape_semicolons() {
        let f = pmi2_fields("cmd=kvs-put;key=a;value=x;;y;thrid=7;");
        assert_eq!(field(&f, "cmd"), Some("kvs-put"));
        assert_eq!(field(&f, "value"), Some("x;y"));
        assert_eq!(field(&f, "thrid"), Some("7"));
    }

    fn launch(node_id: u32, first_task: u32, tasks: u32, node_tasks: Vec<u32>) -> quorum_proto::agent::StepLaunch {
        quorum_proto::agent::StepLaunch {
            job_id: 5,
            step_id: 1,
            node_id,
            first_task,
            tasks,
            node_tasks,
            mpi: "pmi2".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_layout_that_does_not_hold_this_nodes_tasks_is_refused() {
        let (tx, _rx) = mpsc::channel(4);
        assert!(StepPmi::new(&launch(1, 2, 2, vec![2, 2]), tx.clone()).is_ok());
        assert!(StepPmi::new(&launch(1, 1, 2, vec![2, 2]), tx.clone()).is_err());
        assert!(StepPmi::new(&launch(2, 4, 1, vec![2, 2]), tx.clone()).is_err());
        // Cyclic: node 1 runs tasks 1 and 3.
        let cyclic = |node_id, first_task, tasks, node_tasks| quorum_proto::agent::StepLaunch {
            cyclic: true,
            ..launch(node_id, first_task, tasks, node_tasks)
        };
        assert_eq!(local_ranks(&cyclic(1, 1, 2, vec![2, 2])), Ok(vec![1, 3]));
        assert_eq!(local_ranks(&cyclic(0, 0, 3, vec![3, 1])), Ok(vec![0, 2, 3]));
        assert!(local_ranks(&cyclic(1, 2, 2, vec![2, 2])).is_err());
        assert!(local_ranks(&cyclic(1, 1, 2, vec![])).is_err());
        let pmi = StepPmi::new(&cyclic(1, 1, 2, vec![2, 2]), tx).unwrap();
        assert_eq!(pmi.get("PMI_process_mapping").as_deref(), Some("(vector,(0,2,1))"));
        // Without a layout, blocks from first_task.
        assert_eq!(local_ranks(&launch(0, 4, 2, vec![])), Ok(vec![4, 5]));
    }

    /// Two nodes' fences: each completes only when both nodes' contributions are in, and then
    /// both nodes see every pair; a stale or far-ahead contribution changes nothing.
    #[tokio::test]
    async fn a_fence_completes_with_every_nodes_contribution() {
        let (tx, mut rx) = mpsc::channel(4);
        let pmi = StepPmi::new(&launch(0, 0, 1, vec![1, 1]), tx).unwrap();
        pmi.put("a", "1").unwrap();
        let fence = tokio::spawn({
            let pmi = pmi.clone();
            async move { pmi.fence().await }
        });
        let sent = match rx.recv().await.and_then(|m| m.msg) {
            Some(agent_message::Msg::Pmi(x)) => x,
            other => panic!("expected a contribution, got {other:?}"),
        };
        assert_eq!((sent.node_id, sent.seq, sent.pairs.len()), (0, 1, 1));
        pmi.arrive(0, 1, vec![("a".into(), "1".into())]);
        pmi.arrive(1, 5, vec![("far".into(), "x".into())]);
        tokio::task::yield_now().await;
        assert!(!fence.is_finished());
        assert_eq!(pmi.get("a"), None);
        pmi.arrive(1, 1, vec![("b".into(), "2".into())]);
        fence.await.unwrap();
        assert_eq!((pmi.get("a").as_deref(), pmi.get("b").as_deref()), (Some("1"), Some("2")));
        assert_eq!(pmi.get("far"), None);
        pmi.arrive(1, 1, vec![("b".into(), "stale".into())]);
        assert_eq!(pmi.get("b").as_deref(), Some("2"));
        assert_eq!(pmi.get("PMI_process_mapping").as_deref(), Some("(vector,(0,2,1))"));
    }

    /// Fence after fence of new keys: the space stops growing at its bound, and a key already
    /// there may still change.
    #[test]
    fn the_key_value_space_is_bounded_across_fences() {
        let (tx, _rx) = mpsc::channel(4);
        let pmi = StepPmi::new(&launch(0, 0, 1, vec![1]), tx).unwrap();
        let value = "v".repeat(MAX_VALUE);
        let per_fence = MAX_NODE_PUTS / (MAX_VALUE + 8) - 1;
        let fences = MAX_KVS / (per_fence * (MAX_VALUE + 8)) + 2;
        for f in 0..fences as u32 {
            let pairs = (0..per_fence).map(|i| (format!("{f:04}.{i:06}"), value.clone())).collect();
            pmi.arrive(0, f + 1, pairs);
        }
        assert_eq!(*pmi.done.borrow(), fences as u32, "every fence completes");
        let inner = pmi.lock();
        assert!(inner.kvs_bytes <= MAX_KVS && inner.kvs_bytes > MAX_KVS - 2 * (MAX_VALUE + 8), "{}", inner.kvs_bytes);
        assert_eq!(inner.kvs_bytes, inner.kvs.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>());
        let first = "0000.000000".to_string();
        drop(inner);
        pmi.arrive(0, fences as u32 + 1, vec![(first.clone(), "short".into())]);
        assert_eq!(pmi.get(&first).as_deref(), Some("short"));
    }

    #[test]
    fn puts_are_bounded() {
        let (tx, _rx) = mpsc::channel(4);
        let pmi = StepPmi::new(&launch(0, 0, 1, vec![1]), tx).unwrap();
        assert!(pmi.put(&"k".repeat(MAX_KEY + 1), "v").is_err());
        assert!(pmi.put("k", &"v".repeat(MAX_VALUE + 1)).is_err());
        let value = "v".repeat(MAX_VALUE);
        let fits = MAX_NODE_PUTS / (MAX_VALUE + 8);
        for i in 0..fits {
            pmi.put(&format!("k{i:06}"), &value).unwrap();
        }
        assert!((0..8).any(|i| pmi.put(&format!("x{i:06}"), &value).is_err()));
    }
}
