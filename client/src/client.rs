//! A small client library: any replica will do. A call goes to the preferred replica; when it
//! is unavailable (down, no leader yet, or not the leader and unable to forward), the call is
//! retried on the hinted leader or the next address until a deadline. Writes carry a request id
//! chosen once by the caller, so a retry after a failover never makes a second job.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use std::path::PathBuf;
use std::sync::Arc;

use quorum_auth::munge::Munge;
use quorum_auth::tls::ClientTls;
use quorum_proto::api::quorum_client::QuorumClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// `--controllers` (or `QUORUM_CONTROLLERS`) and how to reach them safely, for every command
/// that talks to a cluster.
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
    /// The cluster's CA certificate, which the controllers' certificates are checked against.
    #[arg(long, env = "QUORUM_CA", global = true, default_value = "/etc/quorum/certs/ca.pem")]
    pub ca: PathBuf,
    /// This host's munged socket (libmunge's default when unset).
    #[arg(long, env = "QUORUM_MUNGE_SOCKET", global = true)]
    pub munge_socket: Option<PathBuf>,
    /// The user the controllers run as (a name or uid): MUNGE credentials are made for them
    /// alone to decode.
    #[arg(long, env = "QUORUM_CONTROLLER_USER", global = true, default_value = "root")]
    pub controller_user: String,
    /// A token (`quorum token`) to prove who you are instead of MUNGE, off the cluster.
    #[arg(long, env = "QUORUM_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Plaintext to controllers that run with `insecure = true` (a private test network).
    #[arg(long, env = "QUORUM_INSECURE", global = true)]
    pub insecure: bool,
}

impl ControllersArg {
    pub fn security(&self) -> anyhow::Result<Security> {
        let tls = if self.insecure {
            None
        } else {
            Some(ClientTls::anonymous(&self.ca).map_err(|e| {
                anyhow::anyhow!(
                    "{e}: the cluster's CA certificate is needed to check the controllers (--ca or QUORUM_CA)"
                )
            })?)
        };
        let proof = match &self.token {
            Some(t) if !t.trim().is_empty() => Proof::Token(t.trim().to_string()),
            _ => Proof::Munge(Munge::new(self.munge_socket.as_deref()).restrict_to(self.controller_uid()?)),
        };
        Ok(Security { tls, proof })
    }

    /// The uid `--controller-user` names.
    fn controller_uid(&self) -> anyhow::Result<u32> {
        let user = self.controller_user.trim();
        if let Ok(uid) = user.parse::<u32>() {
            return Ok(uid);
        }
        quorum_auth::users::by_name(user).map(|u| u.uid).map_err(|e| {
            anyhow::anyhow!(
                "--controller-user (QUORUM_CONTROLLER_USER) '{user}': {e}; give the name or uid the controllers run as"
            )
        })
    }

    /// A client for these controllers, asking first the leader `QUORUM_LEADER` names where it
    /// is one of them (jobs and `salloc` shells are given it).
    pub fn client(&self) -> anyhow::Result<Client> {
        let client = Client::new(self.controllers.clone(), self.security()?)?;
        if let Ok(leader) = std::env::var(quorum_proto::LEADER_ENV) {
            client.prefer(&leader);
        }
        Ok(client)
    }
}

/// How a client proves who it is to the controllers.
#[derive(Clone, Debug)]
pub enum Proof {
    /// A fresh credential from the host's munged with every request.
    Munge(Munge),
    /// A token (`quorum token`).
    Token(String),
    /// A name taken at its word (`user:uid:gid`): only controllers with `insecure = true`
    /// accept it, as the measure of what authentication costs.
    Claim(String),
}

/// How a client checks the controllers (TLS with the cluster's CA; plaintext when `None`) and
/// proves itself.
#[derive(Clone, Debug)]
pub struct Security {
    pub tls: Option<ClientTls>,
    pub proof: Proof,
}

/// Puts the caller's proof on every request of one channel. A MUNGE credential is sent with
/// every request on the channel's connection for [`quorum_proto::CREDENTIAL_REUSE_S`] seconds:
/// the controller decodes it once and accepts it again on that connection only. A new
/// connection that meets it again is told "replayed", and [`Client::call`] asks for a fresh one.
#[derive(Clone, Debug)]
pub struct Authenticate {
    proof: Arc<Proof>,
    credential: Arc<std::sync::Mutex<Option<(String, Instant)>>>,
}

impl Authenticate {
    fn new(proof: Arc<Proof>) -> Authenticate {
        Authenticate { proof, credential: Arc::default() }
    }

    /// The next request gets a fresh credential.
    fn forget(&self) {
        *self.credential.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn munge(&self, m: &Munge) -> Result<String, Status> {
        let mut cached = self.credential.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cred, at)) = cached.as_ref() {
            if at.elapsed() < Duration::from_secs(quorum_proto::CREDENTIAL_REUSE_S) {
                return Ok(cred.clone());
            }
        }
        let cred = m.credential().map_err(|e| Status::unauthenticated(format!("no MUNGE credential: {e}")))?;
        *cached = Some((cred.clone(), Instant::now()));
        Ok(cred)
    }
}

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let value = match &*self.proof {
            Proof::Munge(m) => format!("{}{}", quorum_proto::MUNGE_PREFIX, self.munge(m)?),
            Proof::Token(t) => format!("{}{t}", quorum_proto::BEARER_PREFIX),
            Proof::Claim(c) => format!("{}{c}", quorum_proto::CLAIM_PREFIX),
        };
        let value = tonic::metadata::MetadataValue::try_from(value)
            .map_err(|_| Status::unauthenticated("the credential cannot travel in metadata"))?;
        req.metadata_mut().insert(quorum_proto::AUTHORIZATION_KEY, value);
        // A caller that exports traces has its request continue them on the controllers.
        quorum_proto::telemetry::carry(&tracing::Span::current(), req.metadata_mut());
        Ok(req)
    }
}

/// The API of one controller, with the caller's proof on each request.
pub type Api = QuorumClient<InterceptedService<Channel, Authenticate>>;

pub struct Client {
    addrs: Vec<String>,
    channels: Vec<Channel>,
    security: Security,
    /// One per channel: each connection proves itself with its own credential.
    auth: Vec<Authenticate>,
    preferred: AtomicUsize,
    /// How long retries go on.
    pub deadline: Duration,
    /// How long one call may take before the next replica is tried.
    pub call_timeout: Duration,
}

impl Client {
    pub fn new(addrs: Vec<String>, security: Security) -> anyhow::Result<Client> {
        let addrs: Vec<String> = addrs.into_iter().map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect();
        if addrs.is_empty() {
            anyhow::bail!("no controller address given (use --controllers or QUORUM_CONTROLLERS)");
        }
        let mut channels = Vec::new();
        for a in &addrs {
            let endpoint = quorum_auth::tls::endpoint(a, security.tls.as_ref())?
                .connect_timeout(Duration::from_millis(500))
                .tcp_nodelay(true);
            channels.push(endpoint.connect_lazy());
        }
        let proof = Arc::new(security.proof.clone());
        let auth = channels.iter().map(|_| Authenticate::new(proof.clone())).collect();
        Ok(Client {
            addrs,
            channels,
            auth,
            security,
            preferred: AtomicUsize::new(0),
            deadline: Duration::from_secs(20),
            call_timeout: Duration::from_secs(5),
        })
    }

    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// Asks `addr` first from now on, where it is one of this client's addresses.
    pub fn prefer(&self, addr: &str) {
        if let Some(i) = self.addrs.iter().position(|a| a == addr.trim()) {
            self.preferred.store(i, Ordering::Relaxed);
        }
    }

    /// The address asked first: the leader, once a replica has said which one it is.
    pub fn preferred(&self) -> &str {
        &self.addrs[self.preferred.load(Ordering::Relaxed) % self.addrs.len()]
    }

    /// How this client checks controllers and proves itself.
    pub fn security(&self) -> &Security {
        &self.security
    }

    fn api(&self, i: usize) -> Api {
        QuorumClient::with_interceptor(self.channels[i].clone(), self.auth[i].clone())
    }

    /// A client for one address of the list, for per-replica calls.
    pub fn replica(&self, addr: &str) -> anyhow::Result<Api> {
        Ok(match self.addrs.iter().position(|a| a == addr) {
            Some(i) => self.api(i),
            None => {
                let channel = quorum_auth::tls::endpoint(addr, self.security.tls.as_ref())?
                    .connect_timeout(Duration::from_millis(500))
                    .connect_lazy();
                QuorumClient::with_interceptor(channel, Authenticate::new(Arc::new(self.security.proof.clone())))
            }
        })
    }

    /// The position in our list of the leader a replica named in `metadata`, if any.
    fn hinted(&self, metadata: &tonic::metadata::MetadataMap) -> Option<usize> {
        let hint = metadata.get(quorum_proto::LEADER_HINT_KEY)?.to_str().ok()?;
        self.addrs.iter().position(|a| a == hint)
    }

    /// Whether another replica, or the same one later, may answer what this one did not. A
    /// status with a source was made here from a transport failure (a connection reset, or an
    /// HTTP/2 stream a replica dropped as it shut down: tonic calls that `Internal`), not sent by
    /// a replica; the request may or may not have been applied, which every call allows for, as
    /// submits carry their request id.
    pub fn retryable(status: &Status) -> bool {
        match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => true,
            Code::Internal => std::error::Error::source(status).is_some(),
            _ => false,
        }
    }

    /// Calls `f` with a client until it answers something other than "unavailable".
    pub async fn call<T, F, Fut>(&self, mut f: F) -> Result<T, Status>
    where
        F: FnMut(Api) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let start = Instant::now();
        let mut attempt = 0usize;
        loop {
            let i = self.preferred.load(Ordering::Relaxed) % self.addrs.len();
            let client = self.api(i);
            let status = match tokio::time::timeout(self.call_timeout, f(client)).await {
                Ok(Ok(r)) => {
                    // Answered through a replica that forwarded to the leader: go there next.
                    if let Some(leader) = self.hinted(r.metadata()).filter(|l| *l != i) {
                        self.preferred.store(leader, Ordering::Relaxed);
                    }
                    return Ok(r.into_inner());
                }
                // A new connection met the credential an older one proved: a fresh one, again.
                Ok(Err(status)) if status.code() == Code::Unauthenticated && status.message().contains("replayed") => {
                    self.auth[i].forget();
                    status
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
        if let Some((id, k)) = s.trim().split_once('+') {
            // A component of a heterogeneous job: component 0 names the whole job.
            let id: u64 = id.parse().map_err(|_| bad())?;
            return match k.parse::<u32>().map_err(|_| bad())? {
                0 => Ok(JobRef { id, task: None }),
                k => Err(format!(
                    "job '{s}' is component {k} of heterogeneous job {id}: its components are acted on together here; name the job, {id}"
                )),
            };
        }
        match s.trim().split_once('_') {
            Some((id, task)) => {
                Ok(JobRef { id: id.parse().map_err(|_| bad())?, task: Some(task.parse().map_err(|_| bad())?) })
            }
            None => Ok(JobRef { id: s.trim().parse().map_err(|_| bad())?, task: None }),
        }
    }
}

impl JobRef {
    /// Whether `job` is one this names: the job itself, a task of the array it names, or the
    /// array task it names.
    pub fn names(&self, job: &quorum_proto::api::JobInfo) -> bool {
        let array = job.array.as_ref().map(|t| (t.array_job_id, t.task_id));
        match self.task {
            None => self.id == job.id || array.is_some_and(|(id, _)| id == self.id),
            Some(task) => array == Some((self.id, task)),
        }
    }

    /// The job's id: an array task's is looked up.
    pub async fn resolve(&self, client: &Client) -> Result<u64, Status> {
        let Some(task) = self.task else { return Ok(self.id) };
        let req = quorum_proto::api::GetJobRequest { job_id: self.id, stale: false, array_task_id: Some(task) };
        let r = client.call(|mut c| async move { c.get_job(req).await }).await?;
        r.job.map(|j| j.id).ok_or_else(|| Status::internal("an answer without its job"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_failures_are_retried_and_a_replicas_internal_error_is_not() {
        assert!(Client::retryable(&Status::unavailable("no leader")));
        // What tonic makes of an HTTP/2 stream reset by a replica shutting down.
        let mut dropped = Status::internal("h2 protocol error: http2 error");
        dropped.set_source(Arc::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        assert!(Client::retryable(&dropped));
        // An answer a replica sent stays an answer.
        assert!(!Client::retryable(&Status::internal("state machine failed")));
        assert!(!Client::retryable(&Status::invalid_argument("bad spec")));
    }
}
