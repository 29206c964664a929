//! A small client library: any replica will do. A call goes to the preferred replica; when it
//! is unavailable (down, no leader yet, or not the leader and unable to forward), the call is
//! retried on the hinted leader or the next address until a deadline. Writes carry a request id
//! chosen once by the caller, so a retry after a failover never makes a second job.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use quorum_proto::api::quorum_client::QuorumClient;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// `--controllers` (or `QUORUM_CONTROLLERS`), for every command that talks to a cluster.
#[derive(clap::Args, Clone, Debug)]
pub struct ControllersArg {
    /// Controller addresses, comma-separated; any replica will do.
    #[arg(
        long,
        env = "QUORUM_CONTROLLERS",
        value_delimiter = ',',
        global = true,
        default_value = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
    )]
    pub controllers: Vec<String>,
}

pub struct Client {
    addrs: Vec<String>,
    channels: Vec<Channel>,
    preferred: AtomicUsize,
    /// How long retries go on.
    pub deadline: Duration,
    /// How long one call may take before the next replica is tried.
    pub call_timeout: Duration,
}

impl Client {
    pub fn new(addrs: Vec<String>) -> anyhow::Result<Client> {
        let addrs: Vec<String> = addrs.into_iter().map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect();
        if addrs.is_empty() {
            anyhow::bail!("no controller address given (use --controllers or QUORUM_CONTROLLERS)");
        }
        let mut channels = Vec::new();
        for a in &addrs {
            let endpoint = Endpoint::from_shared(format!("http://{a}"))
                .map_err(|e| anyhow::anyhow!("bad controller address '{a}': {e}"))?
                .connect_timeout(Duration::from_millis(500))
                .tcp_nodelay(true);
            channels.push(endpoint.connect_lazy());
        }
        Ok(Client {
            addrs,
            channels,
            preferred: AtomicUsize::new(0),
            deadline: Duration::from_secs(20),
            call_timeout: Duration::from_secs(5),
        })
    }

    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// A client for one address of the list, for per-replica calls.
    pub fn replica(&self, addr: &str) -> anyhow::Result<QuorumClient<Channel>> {
        let channel = match self.addrs.iter().position(|a| a == addr) {
            Some(i) => self.channels[i].clone(),
            None => Endpoint::from_shared(format!("http://{addr}"))?
                .connect_timeout(Duration::from_millis(500))
                .connect_lazy(),
        };
        Ok(QuorumClient::new(channel))
    }

    /// The position in our list of the leader a replica named in `metadata`, if any.
    fn hinted(&self, metadata: &tonic::metadata::MetadataMap) -> Option<usize> {
        let hint = metadata.get(quorum_proto::LEADER_HINT_KEY)?.to_str().ok()?;
        self.addrs.iter().position(|a| a == hint)
    }

    fn retryable(status: &Status) -> bool {
        matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown)
    }

    /// Calls `f` with a client until it answers something other than "unavailable".
    pub async fn call<T, F, Fut>(&self, mut f: F) -> Result<T, Status>
    where
        F: FnMut(QuorumClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let start = Instant::now();
        let mut attempt = 0usize;
        loop {
            let i = self.preferred.load(Ordering::Relaxed) % self.addrs.len();
            let client = QuorumClient::new(self.channels[i].clone());
            let status = match tokio::time::timeout(self.call_timeout, f(client)).await {
                Ok(Ok(r)) => {
                    // Answered through a replica that forwarded to the leader: go there next.
                    if let Some(leader) = self.hinted(r.metadata()).filter(|l| *l != i) {
                        self.preferred.store(leader, Ordering::Relaxed);
                    }
                    return Ok(r.into_inner());
                }
                Ok(Err(status)) if !Self::retryable(&status) => return Err(status),
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded(format!(
                    "{} did not answer within {}s",
                    self.addrs[i],
                    self.call_timeout.as_secs()
                )),
            };
            if start.elapsed() > self.deadline {
                return Err(status);
            }
            let next = self.hinted(status.metadata()).filter(|h| *h != i).unwrap_or((i + 1) % self.addrs.len());
            self.preferred.store(next, Ordering::Relaxed);
            attempt += 1;
            if attempt.is_multiple_of(self.addrs.len()) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A job as users name it: `12`, or `12_3` for task 3 of job array 12.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobRef {
    pub id: u64,
    pub task: Option<u32>,
}

impl std::str::FromStr for JobRef {
    type Err = String;

    fn from_str(s: &str) -> Result<JobRef, String> {
        let bad = || format!("invalid job '{s}': give a job id such as 12, or an array task such as 12_3");
        match s.trim().split_once('_') {
            Some((id, task)) => {
                Ok(JobRef { id: id.parse().map_err(|_| bad())?, task: Some(task.parse().map_err(|_| bad())?) })
            }
            None => Ok(JobRef { id: s.trim().parse().map_err(|_| bad())?, task: None }),
        }
    }
}

impl JobRef {
    /// The job's id: an array task's is looked up.
    pub async fn resolve(&self, client: &Client) -> Result<u64, Status> {
        let Some(task) = self.task else { return Ok(self.id) };
        let req = quorum_proto::api::GetJobRequest { job_id: self.id, stale: false, array_task_id: Some(task) };
        let r = client.call(|mut c| async move { c.get_job(req).await }).await?;
        r.job.map(|j| j.id).ok_or_else(|| Status::internal("an answer without its job"))
    }
}
