//! The controller's TOML configuration file.
//!
//! ```toml
//! id = 1
//! listen = "0.0.0.0:7101"
//! advertise = "ctl1.example.org:7101"   # what the other replicas and agents dial; default: listen
//! data_dir = "/var/lib/quorum"
//!
//! [[replicas]]
//! id = 1
//! addr = "ctl1.example.org:7101"
//!
//! [[partitions]]
//! name = "gpu"
//! nodes = "gpu-node[01-10]"
//! default = true
//! max_time = "2-00:00:00"
//! default_time = "1:00:00"
//! default_mem_per_cpu = "2G"
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::oversubscribe::OverSubscribe;
use crate::model::preempt::{PreemptMode, PreemptType};
use crate::model::{hostlist, parse, Account, AssocLimits, Partition, PartitionAccess, Qos};
use crate::model::{BackfillMode, BackfillOrder, Policy, QueueOrder, Weights};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaConfig {
    pub id: u64,
    pub addr: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionConfig {
    pub name: String,
    pub nodes: String,
    #[serde(default)]
    pub default: bool,
    #[serde(default)]
    pub max_time: Option<String>,
    #[serde(default)]
    pub default_time: Option<String>,
    #[serde(default)]
    pub default_mem_per_cpu: Option<String>,
    /// Jobs of higher-tier partitions rank higher.
    #[serde(default)]
    pub priority_tier: u32,
    /// Most nodes one job may ask for.
    #[serde(default)]
    pub max_nodes: Option<u32>,
    /// Every job gets whole nodes.
    #[serde(default)]
    pub exclusive: bool,
    /// Whether jobs share CPUs, as Slurm's `OverSubscribe`: `NO` (the default), `YES[:N]` (jobs
    /// that ask with `--oversubscribe` share each CPU with up to N such jobs, 4 unless given),
    /// `FORCE[:N]` (every job does), or `EXCLUSIVE` (the same as `exclusive = true`). Memory
    /// and GPUs are never shared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oversubscribe: Option<String>,
    /// What becomes of its jobs when a job of a higher tier (or QOS) preempts them: `off` (not
    /// preemptable), `cancel`, `requeue` or `suspend` (frozen, keeping memory and GPUs, until
    /// the CPUs they lend are free again); unset: `[scheduler] preempt_mode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_mode: Option<String>,
    /// Seconds a preempted job has between SIGTERM and SIGKILL (Slurm's `GraceTime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_time: Option<u64>,
    /// Only jobs of these accounts may use it (Slurm's `AllowAccounts`; empty: all), such as
    /// the owners of its nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_accounts: Vec<String>,
    /// Jobs of these accounts may not use it (`DenyAccounts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_accounts: Vec<String>,
    /// Only jobs of these QOS may use it (`AllowQos`; empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_qos: Vec<String>,
    /// Jobs of these QOS may not use it (`DenyQos`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_qos: Vec<String>,
    /// `UP` (the default), `DOWN` (takes jobs, starts none), `DRAIN` (takes no new jobs, starts
    /// those it has) or `INACTIVE` (neither), as Slurm's partition `State=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

impl PartitionConfig {
    /// `oversubscribe = "EXCLUSIVE"`.
    fn whole_nodes(&self) -> bool {
        self.oversubscribe.as_deref().is_some_and(|o| o.trim().eq_ignore_ascii_case("exclusive"))
    }

    pub fn to_partition(&self) -> Result<Partition, ConfigError> {
        let bad = |what: String| ConfigError::Invalid(format!("partition '{}': {what}", self.name));
        if self.name.is_empty() || self.name.contains(|c: char| c.is_whitespace() || c == ',') {
            return Err(bad("a partition name must be non-empty without spaces or commas".into()));
        }
        let names = hostlist::expand(&self.nodes).map_err(|e| bad(e.to_string()))?;
        let time = |v: &Option<String>| -> Result<Option<u64>, ConfigError> {
            match v {
                Some(t) => parse::parse_time_limit(t).map_err(|e| bad(e.to_string())),
                None => Ok(None),
            }
        };
        let mem = match &self.default_mem_per_cpu {
            Some(m) => parse::parse_mem_mb(m).map_err(|e| bad(e.to_string()))?,
            None => 1024,
        };
        Ok(Partition {
            name: self.name.clone(),
            nodes: self.nodes.clone(),
            node_names: names.into_iter().collect::<BTreeSet<_>>(),
            default: self.default,
            max_time_s: time(&self.max_time)?,
            default_time_s: time(&self.default_time)?,
            default_mem_per_cpu_mb: mem,
            priority_tier: self.priority_tier,
            max_nodes: self.max_nodes,
            exclusive: self.exclusive || self.whole_nodes(),
            oversubscribe: match self.oversubscribe.as_deref() {
                Some(_) if self.whole_nodes() => OverSubscribe::No,
                Some(o) => match OverSubscribe::parse(o).map_err(bad)? {
                    OverSubscribe::No => OverSubscribe::No,
                    _ if self.exclusive => {
                        return Err(bad(format!("exclusive = true gives whole nodes; OverSubscribe={o} shares them")))
                    }
                    shared => shared,
                },
                None => OverSubscribe::No,
            },
            preempt_mode: self.preempt_mode.as_deref().map(PreemptMode::parse).transpose().map_err(bad)?,
            grace_time_s: self.grace_time.unwrap_or(0),
            access: {
                let access = PartitionAccess {
                    allow_accounts: self.allow_accounts.clone(),
                    deny_accounts: self.deny_accounts.clone(),
                    allow_qos: self.allow_qos.clone(),
                    deny_qos: self.deny_qos.clone(),
                };
                access.check().map_err(bad)?;
                access
            },
            state: match &self.state {
                Some(s) => quorum_model::PartitionState::parse(s).map_err(bad)?,
                None => Default::default(),
            },
        })
    }
}

fn default_heartbeat_ms() -> u64 {
    50
}
fn default_election_min_ms() -> u64 {
    150
}
fn default_election_max_ms() -> u64 {
    300
}
fn default_snapshot_every() -> u64 {
    10_000
}
fn default_max_payload_entries() -> u64 {
    32
}
fn default_snapshot_keep_logs() -> u64 {
    1_000
}
fn default_node_timeout_ms() -> u64 {
    30_000
}
fn default_agent_lease_ms() -> u64 {
    20_000
}
/// Slurm's default `MinJobAge`.
fn default_min_job_age_s() -> u64 {
    300
}
/// The shortest lease accepted: several agent heartbeats and a leader failover fit in it.
const MIN_AGENT_LEASE_MS: u64 = 2_000;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    pub id: u64,
    pub listen: String,
    #[serde(default)]
    pub advertise: Option<String>,
    pub data_dir: PathBuf,
    pub replicas: Vec<ReplicaConfig>,
    #[serde(default)]
    pub partitions: Vec<PartitionConfig>,
    #[serde(default = "default_heartbeat_ms")]
    pub raft_heartbeat_ms: u64,
    #[serde(default = "default_election_min_ms")]
    pub election_timeout_min_ms: u64,
    #[serde(default = "default_election_max_ms")]
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many log entries since the last one.
    #[serde(default = "default_snapshot_every")]
    pub snapshot_every: u64,
    /// At most this many log entries in one AppendEntries to a follower. openraft gives every
    /// AppendEntries one heartbeat interval to be answered; a follower that fell behind by
    /// hundreds of group-commit entries (tens of MB) would otherwise be sent more than it can
    /// store in that time, again and again, and never catch up.
    #[serde(default = "default_max_payload_entries")]
    pub raft_max_payload_entries: u64,
    /// Log entries kept behind a snapshot for followers that lag a little; one that lags more
    /// receives the snapshot.
    #[serde(default = "default_snapshot_keep_logs")]
    pub snapshot_keep_logs: u64,
    /// A node whose agent the leader has not heard from for this long is DOWN, and its jobs
    /// end NODE_FAIL or are requeued. A new leader waits this long before judging any node.
    #[serde(default = "default_node_timeout_ms")]
    pub node_timeout_ms: u64,
    /// An agent none of whose heartbeats sent in this window was answered has its `--requeue`
    /// jobs killed (by their supervisors, whatever the agent does), so that a job requeued
    /// elsewhere never runs twice at once; other jobs run on. Must be below `node_timeout_ms`.
    #[serde(default = "default_agent_lease_ms")]
    pub agent_lease_ms: u64,
    /// This replica joins a running cluster (`quorum admin add-replica`) instead of forming one
    /// with `replicas`: it never initializes a cluster itself.
    #[serde(default)]
    pub join: bool,
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    /// QOS levels of a new cluster; afterwards changed through the API.
    #[serde(default)]
    pub qos: Vec<QosConfig>,
    /// The account tree of a new cluster; afterwards changed through the API.
    #[serde(default)]
    pub accounts: Vec<AccountConfig>,
    /// Network topology: which nodes hang off which switch.
    #[serde(default)]
    pub switches: Vec<SwitchConfig>,
    /// Licenses jobs ask for with `--licenses` and how many of each the cluster has, as
    /// Slurm's `Licenses=` (`[licenses]` with `matlab = 10`).
    #[serde(default)]
    pub licenses: std::collections::BTreeMap<String, u32>,
    /// For upgrade rehearsals and tests: this replica reports this older feature level and
    /// refuses to apply any entry above it, as a replica of the older release would.
    #[serde(default)]
    pub emulate_feature_level: Option<u32>,
    /// Who may ask what, and how they prove it.
    #[serde(default)]
    pub security: SecurityConfig,
    /// What one submit may carry.
    #[serde(default)]
    pub limits: AdmissionLimits,
    /// `[submit_filter]`: the site's program that sees every submit and may refuse or amend
    /// it, like Slurm's job_submit plugins ([`crate::server::filter`]).
    #[serde(default)]
    pub submit_filter: Option<SubmitFilterConfig>,
    /// `[gpu_idle]`: running jobs whose GPUs stay idle are flagged, or cancelled in the
    /// partitions it names ([`crate::leader::gpu_idle`]). The leader's counts.
    #[serde(default)]
    pub gpu_idle: Option<GpuIdleConfig>,
    /// The program that mails users about their jobs (`--mail-type`), called as Slurm's
    /// MailProg: `PROGRAM -s SUBJECT RECIPIENT`. None: nothing is mailed (the types and
    /// recipient are still recorded and shown). Give it on every replica: the leader mails.
    #[serde(default)]
    pub mail_program: Option<PathBuf>,
    /// How long a job that ended stays in the hot state (`quorum queue --all`, `scontrol show
    /// job`, what every scheduling view and snapshot carries), in seconds, before it moves to the
    /// job history (`sacct`), like Slurm's `MinJobAge`. 0 keeps ended jobs in the hot state for
    /// good, as Slurm's 0 does. The leader's value is the one that counts.
    #[serde(default = "default_min_job_age_s")]
    pub min_job_age_s: u64,
    /// The process-management interface steps get when `srun` names none (`--mpi`), like
    /// Slurm's `MpiDefault`: "none" (the default) or "pmi2". The leader's value counts.
    #[serde(default)]
    pub mpi_default: crate::model::mpi::Mpi,
    /// What the job history keeps.
    #[serde(default)]
    pub accounting: AccountingConfig,
    /// `[http]`: the HTTP port (metrics).
    #[serde(default)]
    pub http: HttpConfig,
}

/// `[accounting]`: what the job history keeps of each job beyond its resources, times and
/// outcome, like Slurm's `AccountingStoreFlags=job_script,job_env`; neither by default (a script
/// or an environment may hold secrets, and they are most of a record's size).
///
/// ```toml
/// [accounting]
/// store_job_script = false
/// store_job_env = false
/// purge_job_after_s = 31_536_000   # a year; 0 (the default) keeps every job
/// ```
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AccountingConfig {
    pub store_job_script: bool,
    pub store_job_env: bool,
    /// The history forgets a job this many seconds after it ended (Slurm's `PurgeJobAfter`);
    /// 0 keeps every job. The leader's value is the one that counts.
    pub purge_job_after_s: u64,
}

/// The longest partition, GPU type, QOS, account or feature name accepted.
const MAX_WORD_BYTES: usize = 256;
/// The most node features one job may ask for.
const MAX_CONSTRAINTS: usize = 64;

/// `[limits]`: what a replica accepts in one submit, like Slurm's `max_script_size`; each at
/// most the built-in ceiling (`quorum_model::limits`), which is also the default. And what the
/// cluster holds at once (Slurm's `MaxJobCount`, `MaxArraySize`, and a `MaxSubmitJobs` for every
/// user whose account and QOS set none): the leader's values count, replicated to all.
///
/// ```toml
/// [limits]
/// max_script_bytes = 4194304    # the batch script, or the command's arguments together
/// max_env_bytes = 4194304       # names and values together
/// max_env_vars = 16384
/// max_dependencies = 1000
/// max_submit_bytes = 8388608    # the whole spec as the replicas store it (escapes counted)
/// max_job_count = 100000        # jobs pending or running at once (each array task one)
/// max_array_size = 1001         # array task ids 0 to 1000
/// max_submit_jobs_per_user = 10000
/// ```
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionLimits {
    pub max_script_bytes: usize,
    pub max_env_bytes: usize,
    pub max_env_vars: usize,
    pub max_dependencies: usize,
    pub max_submit_bytes: usize,
    pub max_job_count: u32,
    pub max_array_size: u32,
    pub max_submit_jobs_per_user: u32,
}

/// The default `[limits] max_job_count`: at the few KB a typical job takes in a replica
/// (benches/RESULTS.md, "Replica memory"), a queue this full holds a few hundred MB.
pub const DEFAULT_MAX_JOB_COUNT: u32 = 100_000;
/// The default `[limits] max_array_size`, Slurm's.
pub const DEFAULT_MAX_ARRAY_SIZE: u32 = 1001;
/// The default `[limits] max_submit_jobs_per_user`: a tenth of the queue.
pub const DEFAULT_MAX_SUBMIT_JOBS_PER_USER: u32 = 10_000;

impl Default for AdmissionLimits {
    fn default() -> Self {
        use quorum_model::limits::*;
        AdmissionLimits {
            max_script_bytes: MAX_SCRIPT_BYTES,
            max_env_bytes: MAX_ENV_BYTES,
            max_env_vars: MAX_ENV_VARS,
            max_dependencies: MAX_DEPENDENCIES,
            max_submit_bytes: MAX_SPEC_BYTES,
            max_job_count: DEFAULT_MAX_JOB_COUNT,
            max_array_size: DEFAULT_MAX_ARRAY_SIZE,
            max_submit_jobs_per_user: DEFAULT_MAX_SUBMIT_JOBS_PER_USER,
        }
    }
}

impl AdmissionLimits {
    fn validate(&self) -> Result<(), ConfigError> {
        let ceiling = AdmissionLimits::default();
        for (key, value, max) in [
            ("max_script_bytes", self.max_script_bytes, ceiling.max_script_bytes),
            ("max_env_bytes", self.max_env_bytes, ceiling.max_env_bytes),
            ("max_env_vars", self.max_env_vars, ceiling.max_env_vars),
            ("max_dependencies", self.max_dependencies, ceiling.max_dependencies),
            ("max_submit_bytes", self.max_submit_bytes, ceiling.max_submit_bytes),
        ] {
            if value > max {
                return Err(ConfigError::Invalid(format!(
                    "[limits] {key} = {value}: at most {max}, this release's ceiling"
                )));
            }
        }
        for (key, value) in [
            ("max_job_count", self.max_job_count),
            ("max_array_size", self.max_array_size),
            ("max_submit_jobs_per_user", self.max_submit_jobs_per_user),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid(format!("[limits] {key} = 0: give 1 or more")));
            }
        }
        Ok(())
    }

    /// What the cluster holds at once, as the policy carries it.
    pub fn queue(&self) -> quorum_model::QueueLimits {
        quorum_model::QueueLimits {
            max_job_count: Some(self.max_job_count),
            max_array_size: Some(self.max_array_size),
            max_submit_jobs_per_user: Some(self.max_submit_jobs_per_user),
        }
    }

    /// No limit on what the cluster holds (benches that fill a replica on purpose).
    pub fn unbounded_queue(self) -> AdmissionLimits {
        AdmissionLimits {
            max_job_count: u32::MAX,
            max_array_size: u32::MAX,
            max_submit_jobs_per_user: u32::MAX,
            ..self
        }
    }

    /// Refuses a spec over a limit, naming it: `(field, reason)`. Besides the configured limits,
    /// the names a job carries are bounded (they are shown in every listing; the job's own
    /// name is bounded by `JobSpec::check_shape`).
    pub fn check(&self, spec: &quorum_model::JobSpec) -> Result<(), (&'static str, String)> {
        use quorum_model::Program;
        let words = [
            ("partition", spec.partition.as_deref()),
            ("gpu_type", spec.gpu_type.as_deref()),
            ("qos", spec.qos.as_deref()),
            ("account", spec.account.as_deref()),
        ];
        let constraints = spec.constraint.iter().map(|c| ("constraint", Some(c.as_str())));
        for (field, word) in words.into_iter().chain(constraints) {
            let word = word.unwrap_or_default();
            if word.len() > MAX_WORD_BYTES || word.chars().any(char::is_control) {
                return Err((field, format!("at most {MAX_WORD_BYTES} bytes without control characters")));
            }
        }
        if spec.constraint.len() > MAX_CONSTRAINTS {
            return Err(("constraint", format!("{} features: at most {MAX_CONSTRAINTS}", spec.constraint.len())));
        }
        // Checked at the door only: jobs already in the log keep what an older release took.
        if let Err(e) = quorum_model::MailTypes::parse(&spec.notes.mail_type) {
            return Err(("mail_type", e));
        }
        if spec.licenses.len() > MAX_CONSTRAINTS {
            return Err(("licenses", format!("{} licenses: at most {MAX_CONSTRAINTS}", spec.licenses.len())));
        }
        if spec.licenses.keys().any(|n| n.len() > MAX_WORD_BYTES || n.chars().any(char::is_control)) {
            return Err((
                "licenses",
                format!("a license name is at most {MAX_WORD_BYTES} bytes without control characters"),
            ));
        }
        let script = match &spec.program {
            Program::Script(s) => s.len(),
            Program::Argv(argv) => argv.iter().map(String::len).sum(),
        };
        if script > self.max_script_bytes {
            return Err((
                "script",
                format!("{script} bytes: this cluster accepts at most {} (max_script_bytes)", self.max_script_bytes),
            ));
        }
        let (vars, bytes) = spec.env.iter().fold((0, 0), |(n, b), (k, v)| (n + 1, b + k.len() + v.len()));
        if vars > self.max_env_vars || bytes > self.max_env_bytes {
            return Err((
                "env",
                format!(
                    "{vars} variables of {bytes} bytes: this cluster accepts at most {} (max_env_vars) and {} (max_env_bytes)",
                    self.max_env_vars, self.max_env_bytes
                ),
            ));
        }
        if spec.dependencies.len() > self.max_dependencies {
            return Err((
                "dependency",
                format!(
                    "{} jobs: this cluster accepts at most {} (max_dependencies)",
                    spec.dependencies.len(),
                    self.max_dependencies
                ),
            ));
        }
        let encoded = spec.encoded_bytes();
        if encoded > self.max_submit_bytes {
            return Err((
                "spec",
                format!(
                    "{encoded} bytes as stored: this cluster accepts at most {} (max_submit_bytes)",
                    self.max_submit_bytes
                ),
            ));
        }
        Ok(())
    }
}

fn default_clock_skew_s() -> u64 {
    30
}

/// `[security]`: TLS, credentials and roles (DESIGN.md, "Trust").
///
/// ```toml
/// [security]
/// certs_dir = "/etc/quorum/certs"   # from `quorum admin certs`: ca.pem, replica-<id>.pem/.key,
///                                   # launch.key, token.key
/// munge_socket = "/run/munge/munge.socket.2"
/// admins = ["alice"]
/// operators = ["oncall"]
/// private_data = ["jobs", "usage"]
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityConfig {
    /// The directory `quorum admin certs` wrote. Required unless `insecure`.
    #[serde(default)]
    pub certs_dir: Option<PathBuf>,
    /// This host's munged; libmunge's default socket when unset.
    #[serde(default)]
    pub munge_socket: Option<PathBuf>,
    /// Plaintext gRPC, with nothing to prove a replica or an agent: for a private test network
    /// only. Users still authenticate with MUNGE. Logged as a warning at every start.
    #[serde(default)]
    pub insecure: bool,
    /// Users with the admin role (uid 0 always has it).
    #[serde(default)]
    pub admins: Vec<String>,
    /// Users with the operator role.
    #[serde(default)]
    pub operators: Vec<String>,
    /// What users see only of themselves, like Slurm's PrivateData: `jobs`, `usage`,
    /// `accounts` (only the accounts they belong to), `users` (only themselves among an
    /// account's users).
    #[serde(default)]
    pub private_data: Vec<String>,
    /// How far apart hosts' clocks may be: launch grants, tokens and credentials are judged
    /// with this much tolerance.
    #[serde(default = "default_clock_skew_s")]
    pub clock_skew_s: u64,
    /// Further token keys that verify (the one in `certs_dir` signs): rotation without downtime.
    #[serde(default)]
    pub token_keys: Vec<PathBuf>,
    /// Moving a plaintext cluster to TLS one replica at a time (README, "Upgrading"):
    /// `accept`: TLS and plaintext are both accepted, the other replicas are dialled in
    /// plaintext (some still run the plaintext release); `dial-tls`: both accepted, the others
    /// dialled with TLS (every replica accepts it by then). Unset: TLS only.
    #[serde(default)]
    pub transitional: Option<Transitional>,
}

/// A step of the move from plaintext to TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transitional {
    Accept,
    DialTls,
}

impl Default for SecurityConfig {
    fn default() -> SecurityConfig {
        SecurityConfig {
            certs_dir: None,
            munge_socket: None,
            insecure: false,
            admins: Vec::new(),
            operators: Vec::new(),
            private_data: Vec::new(),
            clock_skew_s: default_clock_skew_s(),
            token_keys: Vec::new(),
            transitional: None,
        }
    }
}

impl SecurityConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.insecure && self.transitional.is_some() {
            return Err(ConfigError::Invalid(
                "[security] transitional moves a cluster to TLS: it needs certs_dir, not insecure = true".into(),
            ));
        }
        if !self.insecure && self.certs_dir.is_none() {
            return Err(ConfigError::Invalid(
                "[security] certs_dir is required (make one with `quorum admin certs`), or set insecure = true".into(),
            ));
        }
        for p in &self.private_data {
            if !matches!(p.as_str(), "jobs" | "usage" | "accounts" | "users") {
                return Err(ConfigError::Invalid(format!(
                    "[security] private_data: unknown '{p}' (jobs, usage, accounts, users)"
                )));
            }
        }
        Ok(())
    }

    pub fn private(&self, what: &str) -> bool {
        self.private_data.iter().any(|p| p == what)
    }
}

fn opt_time(what: &str, v: &Option<String>) -> Result<Option<u64>, ConfigError> {
    match v {
        Some(t) => parse::parse_time_limit(t).map_err(|e| ConfigError::Invalid(format!("{what}: {e}"))),
        None => Ok(None),
    }
}

/// `[http]`: the replica's HTTP port, which serves `/metrics`.
///
/// ```toml
/// [http]
/// listen = "0.0.0.0:7180"
/// metrics_allow = ["10.0.0.0/8"]   # scrapers that need no token
/// ```
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Where it listens; none: no HTTP port.
    pub listen: Option<String>,
    /// Address ranges (CIDR) whose clients read `/metrics` without a credential.
    pub metrics_allow: Vec<String>,
}

impl HttpConfig {
    /// `metrics_allow`, read.
    pub fn metrics_allow(&self) -> Result<Vec<Cidr>, ConfigError> {
        self.metrics_allow
            .iter()
            .map(|c| Cidr::parse(c).map_err(|e| ConfigError::Invalid(format!("[http] metrics_allow '{c}': {e}"))))
            .collect()
    }
}

pub use crate::model::Cidr;

/// `[scheduler]`: ordering, backfill and priority weights.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    /// `multifactor` (default), `fifo` or `sjf`.
    pub ordering: Option<String>,
    /// `easy` (default), `conservative` or `none`.
    pub backfill: Option<String>,
    /// Conservative backfill: how many blocked jobs get reservations (default 100).
    pub reservations: Option<u32>,
    pub bf_window: Option<String>,
    pub bf_resolution_s: Option<u64>,
    pub max_age: Option<String>,
    pub half_life: Option<String>,
    pub favor_small: Option<bool>,
    pub gpu_billing_weight: Option<u32>,
    pub weight_age: Option<u32>,
    pub weight_fairshare: Option<u32>,
    pub weight_job_size: Option<u32>,
    pub weight_partition: Option<u32>,
    pub weight_qos: Option<u32>,
    /// `PriorityWeightTRES`, in Slurm's form: `"CPU=1000,Mem=2000,GRES/gpu=3000"` (each weight
    /// times the job's share of what its partition holds of that resource; default none).
    pub weight_tres: Option<String>,
    /// Who may preempt whom: `none` (default), `partition_prio` (a higher `priority_tier`
    /// preempts a lower one) or `qos` (a QOS preempts those it lists in `preempt`).
    pub preempt_type: Option<String>,
    /// What becomes of a preempted job where its partition and QOS do not say: `off`
    /// (default), `cancel`, `requeue` or `suspend`.
    pub preempt_mode: Option<String>,
    /// Backfill on run times predicted from each user's last two jobs instead of their time
    /// limits (default false).
    pub predict: Option<bool>,
    /// In what order backfill tries the jobs behind the reservations: `priority` (default,
    /// the queue's) or `shortest` (shortest planned run time first).
    pub backfill_order: Option<String>,
}

/// A backfill order as the config and `quorum simulate --backfill-order` spell it.
pub fn parse_backfill_order(s: &str) -> Result<BackfillOrder, String> {
    match s {
        "priority" => Ok(BackfillOrder::Priority),
        "shortest" => Ok(BackfillOrder::Shortest),
        other => Err(format!("'{other}': expected one of priority, shortest")),
    }
}

impl SchedulerConfig {
    pub fn to_policy(&self) -> Result<Policy, ConfigError> {
        let d = Policy::default();
        let bad = |what: &str, v: &str, choices: &str| {
            ConfigError::Invalid(format!("scheduler.{what} = '{v}': expected one of {choices}"))
        };
        let ordering = match self.ordering.as_deref() {
            None | Some("multifactor") => QueueOrder::Multifactor,
            Some("fifo") => QueueOrder::Fifo,
            Some("sjf") => QueueOrder::ShortestFirst,
            Some(o) => return Err(bad("ordering", o, "multifactor, fifo, sjf")),
        };
        let backfill = match self.backfill.as_deref() {
            None | Some("easy") => BackfillMode::Easy,
            Some("conservative") => BackfillMode::Conservative,
            Some("none") => BackfillMode::None,
            Some(b) => return Err(bad("backfill", b, "easy, conservative, none")),
        };
        let w = d.weights;
        Ok(Policy {
            ordering,
            backfill,
            reservations: self.reservations.unwrap_or(if backfill == BackfillMode::Conservative { 100 } else { 1 }),
            bf_window_s: opt_time("scheduler.bf_window", &self.bf_window)?.unwrap_or(d.bf_window_s),
            bf_resolution_s: self.bf_resolution_s.unwrap_or(d.bf_resolution_s),
            weights: Weights {
                age: self.weight_age.unwrap_or(w.age),
                fairshare: self.weight_fairshare.unwrap_or(w.fairshare),
                job_size: self.weight_job_size.unwrap_or(w.job_size),
                partition: self.weight_partition.unwrap_or(w.partition),
                qos: self.weight_qos.unwrap_or(w.qos),
            },
            max_age_s: opt_time("scheduler.max_age", &self.max_age)?.unwrap_or(d.max_age_s),
            favor_small: self.favor_small.unwrap_or(d.favor_small),
            half_life_s: opt_time("scheduler.half_life", &self.half_life)?.unwrap_or(d.half_life_s),
            gpu_billing_weight: self.gpu_billing_weight.unwrap_or(d.gpu_billing_weight),
            tres_weights: match self.weight_tres.as_deref() {
                None => d.tres_weights,
                Some(t) => quorum_model::TresWeights::parse(t)
                    .map_err(|e| ConfigError::Invalid(format!("scheduler.weight_tres = '{t}': {e}")))?,
            },
            preempt_type: match self.preempt_type.as_deref() {
                None => PreemptType::Off,
                Some(t) => {
                    PreemptType::parse(t).map_err(|e| ConfigError::Invalid(format!("scheduler.preempt_type: {e}")))?
                }
            },
            preempt_mode: match self.preempt_mode.as_deref() {
                None => PreemptMode::Off,
                Some(m) => {
                    PreemptMode::parse(m).map_err(|e| ConfigError::Invalid(format!("scheduler.preempt_mode: {e}")))?
                }
            },
            predict: self.predict.unwrap_or(false),
            // Shortest limit first unless configured: issue 62 (benches/RESULTS.md, issue 29
            // parts 7 and 8): 18-59 % less mean bounded slowdown on five replays of three traces,
            // the p99 wait within 1 % on each, and forecasts that follow it are the better ones.
            backfill_order: match self.backfill_order.as_deref() {
                None => BackfillOrder::Shortest,
                Some(o) => parse_backfill_order(o)
                    .map_err(|e| ConfigError::Invalid(format!("scheduler.backfill_order = {e}")))?,
            },
            // From `[limits]` ([`ControllerConfig::settings`]).
            queue: Default::default(),
        })
    }
}

/// `[gpu_idle]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuIdleConfig {
    /// GPUs under this utilization (percent) are idle.
    #[serde(default = "default_idle_threshold")]
    pub threshold_pct: u32,
    /// For how long, like "30:00" (Slurm's time format).
    pub after: String,
    /// Partitions whose idle jobs are cancelled, not only flagged.
    #[serde(default)]
    pub cancel_partitions: Vec<String>,
}

fn default_idle_threshold() -> u32 {
    5
}

impl GpuIdleConfig {
    pub fn policy(&self) -> Result<crate::leader::gpu_idle::GpuIdlePolicy, ConfigError> {
        let after = opt_time("gpu_idle.after", &Some(self.after.clone()))?
            .ok_or_else(|| ConfigError::Invalid("gpu_idle.after: give a duration, like \"30:00\"".into()))?;
        if self.threshold_pct > 100 {
            return Err(ConfigError::Invalid(format!("gpu_idle.threshold_pct ({}) is above 100", self.threshold_pct)));
        }
        Ok(crate::leader::gpu_idle::GpuIdlePolicy {
            threshold_pct: self.threshold_pct,
            after: std::time::Duration::from_secs(after),
            cancel_partitions: self.cancel_partitions.iter().cloned().collect(),
        })
    }
}

/// `[submit_filter]`: the site's program that sees every submit (see [`crate::server::filter`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitFilterConfig {
    /// Run with `sh -c`.
    pub command: String,
    /// How long a submit waits for its answer before it is refused.
    #[serde(default = "default_filter_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_filter_timeout_ms() -> u64 {
    5_000
}

/// `[[qos]]`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosConfig {
    pub name: String,
    #[serde(default)]
    pub priority: u32,
    pub max_wall: Option<String>,
    pub max_gpus_per_user: Option<u32>,
    pub max_jobs_per_user: Option<u32>,
    /// The QOS whose jobs this one's preempt (with `[scheduler] preempt_type = "qos"`).
    #[serde(default)]
    pub preempt: Vec<String>,
    /// What becomes of this QOS's jobs when preempted: `off`, `cancel`, `requeue` or `suspend`.
    pub preempt_mode: Option<String>,
    /// Seconds its preempted jobs have between SIGTERM and SIGKILL (`GraceTime`).
    pub grace_time: Option<u64>,
    /// What one job may ask for, in Slurm's TRES list: `"cpu=16,mem=64G,node=2,gres/gpu=4"`.
    pub max_tres_per_job: Option<String>,
    /// What one user's running jobs may hold together (`MaxTRESPerUser`), a TRES list.
    pub max_tres_per_user: Option<String>,
    /// What all its running jobs may hold together (`GrpTRES`), a TRES list.
    pub grp_tres: Option<String>,
    /// How many of its jobs may run at once (`GrpJobs`).
    pub grp_jobs: Option<u32>,
    /// A budget of minutes for all its jobs (`GrpTRESMins`): `"cpu=60000,gres/gpu=6000"`.
    pub grp_tres_mins: Option<String>,
    /// Jobs pending or running at once per user; a submit past it is refused.
    pub max_submit_jobs_per_user: Option<u32>,
    /// Its usage does not decay (`Flags=NoDecay`), so a `grp_tres_mins` budget stays spent.
    #[serde(default)]
    pub no_decay: bool,
}

/// A TRES list of a config section, read as Slurm writes it.
fn tres_of(what: &str, text: &Option<String>) -> Result<quorum_model::TresLimit, ConfigError> {
    text.as_deref()
        .map(quorum_model::TresLimit::parse)
        .transpose()
        .map(Option::unwrap_or_default)
        .map_err(|e| ConfigError::Invalid(format!("{what}: {e}")))
}

/// A budget of TRES-minutes of a config section.
fn tres_mins_of(what: &str, text: &Option<String>) -> Result<quorum_model::TresMins, ConfigError> {
    text.as_deref()
        .map(quorum_model::TresMins::parse)
        .transpose()
        .map(Option::unwrap_or_default)
        .map_err(|e| ConfigError::Invalid(format!("{what}: {e}")))
}

impl QosConfig {
    pub fn to_qos(&self) -> Result<Qos, ConfigError> {
        let bad = |e: String| ConfigError::Invalid(format!("qos '{}': {e}", self.name));
        Ok(Qos {
            name: self.name.clone(),
            priority: self.priority,
            max_wall_s: opt_time(&format!("qos '{}' max_wall", self.name), &self.max_wall)?,
            max_gpus_per_user: self.max_gpus_per_user,
            max_jobs_per_user: self.max_jobs_per_user,
            preempt: self.preempt.clone(),
            preempt_mode: self.preempt_mode.as_deref().map(PreemptMode::parse).transpose().map_err(bad)?,
            grace_time_s: self.grace_time.unwrap_or(0),
            max_tres_per_job: tres_of(&format!("qos '{}' max_tres_per_job", self.name), &self.max_tres_per_job)?,
            max_tres_per_user: tres_of(&format!("qos '{}' max_tres_per_user", self.name), &self.max_tres_per_user)?,
            grp_tres: tres_of(&format!("qos '{}' grp_tres", self.name), &self.grp_tres)?,
            grp_jobs: self.grp_jobs,
            grp_tres_mins: tres_mins_of(&format!("qos '{}' grp_tres_mins", self.name), &self.grp_tres_mins)?,
            max_submit_jobs_per_user: self.max_submit_jobs_per_user,
            no_decay: self.no_decay,
        })
    }
}

/// `[[accounts]]`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountConfig {
    pub name: String,
    pub parent: Option<String>,
    #[serde(default = "one")]
    pub shares: u32,
    #[serde(default)]
    pub users: Vec<String>,
    pub max_jobs: Option<u32>,
    pub grp_gpus: Option<u32>,
    pub grp_cpus: Option<u32>,
    pub max_wall: Option<String>,
    /// Memory, like "512G".
    pub grp_mem: Option<String>,
    pub grp_nodes: Option<u32>,
    /// GPUs by type, like `{ h100 = 16 }`.
    #[serde(default)]
    pub grp_gpus_by_type: std::collections::BTreeMap<String, u32>,
    /// What one job may ask for, in Slurm's TRES list: `"cpu=16,mem=64G,node=2,gres/gpu=4"`.
    pub max_tres_per_job: Option<String>,
    /// Jobs pending or running at once per user of it (and of its sub-accounts, unless they
    /// set their own); a submit past it is refused.
    pub max_submit_jobs: Option<u32>,
    /// A budget of minutes (`GrpTRESMins`): `"cpu=60000,gres/gpu=6000"`, against decayed usage.
    pub grp_tres_mins: Option<String>,
    /// Users' shares of the account, like `{ alice = 3 }`; a user not named has 1.
    #[serde(default)]
    pub user_shares: std::collections::BTreeMap<String, u32>,
    /// The QOS its users may use (Slurm's `QOS=`); none: its parent's, and where no account of
    /// the tree names any, the default QOS (`normal`) alone.
    #[serde(default)]
    pub qos: Vec<String>,
    /// The QOS of its users' jobs that name none (`DefaultQOS=`); none: its parent's, then `normal`.
    pub default_qos: Option<String>,
}

fn one() -> u32 {
    1
}

impl AccountConfig {
    pub fn to_account(&self) -> Result<Account, ConfigError> {
        Ok(Account {
            name: self.name.clone(),
            parent: self.parent.clone(),
            shares: self.shares,
            users: self.users.iter().cloned().collect(),
            limits: AssocLimits {
                max_jobs: self.max_jobs,
                grp_gpus: self.grp_gpus,
                grp_cpus: self.grp_cpus,
                max_wall_s: opt_time(&format!("account '{}' max_wall", self.name), &self.max_wall)?,
                grp_mem_mb: match &self.grp_mem {
                    Some(m) => Some(
                        parse::parse_mem_mb(m)
                            .map_err(|e| ConfigError::Invalid(format!("account '{}' grp_mem: {e}", self.name)))?,
                    ),
                    None => None,
                },
                grp_nodes: self.grp_nodes,
                grp_gpus_by_type: self.grp_gpus_by_type.clone(),
                max_tres_per_job: tres_of(
                    &format!("account '{}' max_tres_per_job", self.name),
                    &self.max_tres_per_job,
                )?,
                max_submit_jobs: self.max_submit_jobs,
                grp_tres_mins: tres_mins_of(&format!("account '{}' grp_tres_mins", self.name), &self.grp_tres_mins)?,
            },
            user_shares: self.user_shares.clone(),
            qos: self.qos.clone(),
            default_qos: self.default_qos.clone(),
        })
    }
}

/// `[[switches]]`: a switch and the nodes under it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchConfig {
    pub name: String,
    pub nodes: String,
}

/// Everything the leader makes the replicated state match (partitions, policy, topology) or
/// seeds into a new cluster (accounts, QOS).
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSettings {
    pub partitions: Vec<Partition>,
    pub policy: Policy,
    /// Switch of each node.
    pub switches: std::collections::BTreeMap<String, String>,
    pub accounts: Vec<Account>,
    pub qos: Vec<Qos>,
    pub licenses: std::collections::BTreeMap<String, u32>,
    /// How long an ended job stays in the hot state; zero: for good.
    pub min_job_age: std::time::Duration,
    /// How long after it ended the job history forgets a job; zero: never.
    pub purge_job_after: std::time::Duration,
}

impl ClusterSettings {
    /// The cluster-wide sections of a controller config file (partitions, scheduler, QOS,
    /// accounts, switches) for tools that need no replica of their own, like the simulator; the
    /// replica's own fields may be left out.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: name.clone(), source })?;
        Self::parse(&name, &text)
    }

    /// [`ClusterSettings::load`] of a file's text; `name` names it in errors.
    pub fn parse(name: &str, text: &str) -> Result<Self, ConfigError> {
        ControllerConfig::parse_site(name, text)?.settings()
    }
}

impl ControllerConfig {
    /// A controller config file's text whose replica's own fields (`id`, `listen`, `data_dir`,
    /// `replicas`) may be left out, for what runs a cluster of its own from the file's
    /// cluster-wide sections (`quorum dev --config`, the simulator); those fields, if left out,
    /// are placeholders the caller replaces. Not validated: the caller validates what it makes.
    pub fn parse_site(name: &str, text: &str) -> Result<ControllerConfig, ConfigError> {
        let name = name.to_string();
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Parse { path: name.clone(), message: e.to_string() })?;
        table.entry("id").or_insert(toml::Value::Integer(1));
        table.entry("listen").or_insert(toml::Value::String("127.0.0.1:0".into()));
        table.entry("data_dir").or_insert(toml::Value::String(String::new()));
        table.entry("replicas").or_insert_with(|| {
            let mut r = toml::Table::new();
            r.insert("id".into(), toml::Value::Integer(1));
            r.insert("addr".into(), toml::Value::String("127.0.0.1:0".into()));
            toml::Value::Array(vec![toml::Value::Table(r)])
        });
        table.try_into().map_err(|e: toml::de::Error| ConfigError::Parse { path: name, message: e.to_string() })
    }
}

impl ControllerConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// A config file's text, read and validated; `name` names it in errors.
    pub fn parse(name: &str, text: &str) -> Result<Self, ConfigError> {
        let config: ControllerConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse { path: name.to_string(), message: e.to_string() })?;
        config.validate()?;
        Ok(config)
    }

    pub fn advertise_addr(&self) -> &str {
        self.advertise.as_deref().unwrap_or(&self.listen)
    }

    /// The partitions, validated: hostlists expand, times and sizes parse, one default at most.
    pub fn partitions(&self) -> Result<Vec<Partition>, ConfigError> {
        let parts = self.partitions.iter().map(PartitionConfig::to_partition).collect::<Result<Vec<_>, _>>()?;
        let mut seen = BTreeSet::new();
        for p in &parts {
            if !seen.insert(&p.name) {
                return Err(ConfigError::Invalid(format!("partition '{}' is defined twice", p.name)));
            }
        }
        if parts.iter().filter(|p| p.default).count() > 1 {
            return Err(ConfigError::Invalid("more than one partition has default = true".into()));
        }
        // The scheduler counts CPUs in parts that every partition's N divides.
        if parts
            .iter()
            .try_fold(1, |l, p| crate::model::oversubscribe::common_ways(l, u64::from(p.oversubscribe.max_ways())))
            .is_none()
        {
            return Err(ConfigError::Invalid(format!(
                "the partitions' OverSubscribe counts have a least common multiple over {}: use fewer distinct counts",
                crate::model::oversubscribe::MAX_COMMON_WAYS
            )));
        }
        Ok(parts)
    }

    /// Everything cluster-wide the file says, validated.
    pub fn settings(&self) -> Result<ClusterSettings, ConfigError> {
        let mut switches = std::collections::BTreeMap::new();
        for s in &self.switches {
            for n in
                hostlist::expand(&s.nodes).map_err(|e| ConfigError::Invalid(format!("switch '{}': {e}", s.name)))?
            {
                if let Some(other) = switches.insert(n.clone(), s.name.clone()) {
                    return Err(ConfigError::Invalid(format!(
                        "node {n} is under two switches, {other} and {}",
                        s.name
                    )));
                }
            }
        }
        let accounts = self.accounts.iter().map(AccountConfig::to_account).collect::<Result<Vec<_>, _>>()?;
        let names: BTreeSet<&str> = accounts.iter().map(|a| a.name.as_str()).collect();
        for a in &accounts {
            if let Some(p) = a.parent.as_deref().filter(|p| !names.contains(p)) {
                return Err(ConfigError::Invalid(format!("account '{}': parent '{p}' is not defined", a.name)));
            }
        }
        for (name, count) in &self.licenses {
            if name.is_empty()
                || name.len() > MAX_WORD_BYTES
                || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            {
                return Err(ConfigError::Invalid(format!(
                    "[licenses] '{name}': a license name is letters, digits, '.', '_' and '-'"
                )));
            }
            if *count == 0 {
                return Err(ConfigError::Invalid(format!(
                    "[licenses] {name} = 0: give how many there are (1 or more)"
                )));
            }
        }
        Ok(ClusterSettings {
            licenses: self.licenses.clone(),
            min_job_age: std::time::Duration::from_secs(self.min_job_age_s),
            purge_job_after: std::time::Duration::from_secs(self.accounting.purge_job_after_s),
            partitions: self.partitions()?,
            policy: quorum_model::Policy { queue: self.limits.queue(), ..self.scheduler.to_policy()? },
            switches,
            accounts,
            qos: self.qos.iter().map(QosConfig::to_qos).collect::<Result<Vec<_>, _>>()?,
        })
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.security.validate()?;
        self.limits.validate()?;
        self.http.metrics_allow()?;
        if !self.replicas.iter().any(|r| r.id == self.id) {
            return Err(ConfigError::Invalid(format!(
                "id {} is not among the replicas ({})",
                self.id,
                self.replicas.iter().map(|r| r.id.to_string()).collect::<Vec<_>>().join(", ")
            )));
        }
        let ids: BTreeSet<u64> = self.replicas.iter().map(|r| r.id).collect();
        if ids.len() != self.replicas.len() {
            return Err(ConfigError::Invalid("two replicas share an id".into()));
        }
        if self.election_timeout_min_ms <= self.raft_heartbeat_ms
            || self.election_timeout_max_ms <= self.election_timeout_min_ms
        {
            return Err(ConfigError::Invalid(
                "need raft_heartbeat_ms < election_timeout_min_ms < election_timeout_max_ms".into(),
            ));
        }
        if self.raft_max_payload_entries == 0 {
            return Err(ConfigError::Invalid("raft_max_payload_entries must be at least 1".into()));
        }
        if self.agent_lease_ms >= self.node_timeout_ms {
            return Err(ConfigError::Invalid(format!(
                "agent_lease_ms ({}) must be below node_timeout_ms ({}): a --requeue job must be killed by its lease before it may be requeued elsewhere",
                self.agent_lease_ms, self.node_timeout_ms
            )));
        }
        if self.agent_lease_ms < MIN_AGENT_LEASE_MS.max(4 * self.election_timeout_max_ms) {
            return Err(ConfigError::Invalid(format!(
                "agent_lease_ms ({}) must be at least {} ms and four election timeouts ({} ms), so that a leader failover never kills jobs",
                self.agent_lease_ms,
                MIN_AGENT_LEASE_MS,
                4 * self.election_timeout_max_ms
            )));
        }
        if let Some(level) = self.emulate_feature_level {
            if !(quorum_state::BASE_LEVEL..=quorum_state::FEATURE_LEVEL).contains(&level) {
                return Err(ConfigError::Invalid(format!(
                    "emulate_feature_level ({level}) must be between {} and {}, the levels this release knows",
                    quorum_state::BASE_LEVEL,
                    quorum_state::FEATURE_LEVEL
                )));
            }
        }
        self.settings()?;
        Ok(())
    }

    /// The feature level this replica reports and applies.
    pub fn feature_level(&self) -> u32 {
        self.emulate_feature_level.unwrap_or(quorum_state::FEATURE_LEVEL)
    }

    /// The leader's timeouts for nodes and agents.
    pub fn liveness(&self) -> Liveness {
        Liveness {
            node_timeout: std::time::Duration::from_millis(self.node_timeout_ms),
            agent_lease: std::time::Duration::from_millis(self.agent_lease_ms),
        }
    }
}

/// How long a node may be silent before it is DOWN, and the lease its agent keeps its jobs by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    pub node_timeout: std::time::Duration,
    pub agent_lease: std::time::Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The controllers' files of deploy/compose and of the Kubernetes ConfigMap are valid, one
    /// replica each of the same three, seeding the same partitions.
    #[test]
    fn the_compose_and_kubernetes_controller_files_are_valid_replicas_of_one_cluster() {
        let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
        let compose: Vec<String> = (1..=3)
            .map(|i| std::fs::read_to_string(format!("{deploy}/compose/controller-{i}.toml")).unwrap())
            .collect();
        // The ConfigMap's files: each `ctl-N.toml: |` block, its lines indented four spaces.
        let manifest = std::fs::read_to_string(format!("{deploy}/kubernetes/quorum.yaml")).unwrap();
        let mut kubernetes: Vec<String> = Vec::new();
        let mut lines = manifest.lines().peekable();
        while let Some(line) = lines.next() {
            if line.trim_start().starts_with("ctl-") && line.trim_end().ends_with(".toml: |") {
                let mut text = String::new();
                while let Some(l) = lines.next_if(|l| l.starts_with("    ")) {
                    text.push_str(&l[4..]);
                    text.push('\n');
                }
                kubernetes.push(text);
            }
        }
        for (what, files) in [("compose", compose), ("kubernetes", kubernetes)] {
            assert_eq!(files.len(), 3, "{what}");
            let configs: Vec<ControllerConfig> = files
                .iter()
                .map(|t| ControllerConfig::parse(what, t).unwrap_or_else(|e| panic!("{what}: {e}")))
                .collect();
            for (i, c) in configs.iter().enumerate() {
                assert_eq!(c.id, i as u64 + 1, "{what}");
                assert_eq!(
                    c.replicas.iter().map(|r| &r.addr).collect::<Vec<_>>(),
                    configs[0].replicas.iter().map(|r| &r.addr).collect::<Vec<_>>()
                );
                assert_eq!(
                    c.advertise.as_deref(),
                    Some(c.replicas[i].addr.as_str()),
                    "{what}: replica {} advertises its own address",
                    i + 1
                );
                assert_eq!(c.partitions().unwrap(), configs[0].partitions().unwrap(), "{what}");
                assert!(c.security.certs_dir.is_some() && !c.security.insecure, "{what}: the secure path");
            }
        }
    }

    #[test]
    fn address_ranges_hold_what_they_name() {
        let c = |t: &str| Cidr::parse(t).unwrap();
        let ip = |t: &str| t.parse::<std::net::IpAddr>().unwrap();
        assert!(c("10.0.0.0/8").contains(ip("10.200.3.4")));
        assert!(!c("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(c("10.0.0.0/8").contains(ip("::ffff:10.1.2.3")));
        assert!(c("127.0.0.1").contains(ip("127.0.0.1")) && !c("127.0.0.1").contains(ip("127.0.0.2")));
        assert!(c("0.0.0.0/0").contains(ip("8.8.8.8")) && !c("0.0.0.0/0").contains(ip("::1")));
        assert!(c("fd00::/8").contains(ip("fd12::1")) && !c("fd00::/8").contains(ip("fe80::1")));
        assert!(c("::/0").contains(ip("2001:db8::1")));
        for bad in ["10.0.0.0/33", "10.0.0/8", "fd00::/129", "x", "10.0.0.0/-1", ""] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        let e = HttpConfig { metrics_allow: vec!["10.0.0.0/40".into()], ..Default::default() }.metrics_allow();
        assert!(e.unwrap_err().to_string().contains("[http] metrics_allow '10.0.0.0/40': '/40' is not 0 to 32"));
    }

    #[test]
    fn the_scheduler_section_sets_predictions_and_the_backfill_order() {
        let read = |text: &str| toml::from_str::<SchedulerConfig>(text).unwrap().to_policy();
        let p = read("").unwrap();
        assert!(!p.predict);
        assert_eq!(p.backfill_order, BackfillOrder::Shortest, "shortest limit first by default");
        let p = read("predict = true\nbackfill_order = \"shortest\"").unwrap();
        assert!(p.predict);
        assert_eq!(p.backfill_order, BackfillOrder::Shortest);
        assert_eq!(read("backfill_order = \"priority\"").unwrap().backfill_order, BackfillOrder::Priority);
        let e = read("backfill_order = \"sjf\"").unwrap_err().to_string();
        assert!(e.contains("scheduler.backfill_order = 'sjf': expected one of priority, shortest"), "{e}");
    }

    /// `weight_tres` reads Slurm's `PriorityWeightTRES` form, and names what it cannot read.
    #[test]
    fn the_scheduler_section_reads_tres_weights_as_slurm_writes_them() {
        let read = |text: &str| toml::from_str::<SchedulerConfig>(text).unwrap().to_policy();
        assert!(read("").unwrap().tres_weights.is_zero(), "no TRES weights unless configured");
        let w = read("weight_tres = \"CPU=1000,Mem=2000,GRES/gpu=3000\"").unwrap().tres_weights;
        assert_eq!(w, quorum_model::TresWeights { cpu: 1000, mem: 2000, node: 0, gpu: 3000 });
        assert_eq!(w.to_slurm(), "CPU=1000,Mem=2000,GRES/gpu=3000");
        assert_eq!(read("weight_tres = \"node=5, gres/GPU=7\"").unwrap().tres_weights.each(), [0, 0, 5, 7]);
        for (text, says) in [
            ("weight_tres = \"license/matlab=5\"", "unknown TRES 'license/matlab' (known: CPU, Mem, Node, GRES/gpu)"),
            ("weight_tres = \"CPU=-5\"", "'CPU=-5': the weight must be a whole number"),
            ("weight_tres = \"CPU\"", "'CPU': expected TRES=WEIGHT"),
            ("weight_tres = \"GRES/gpu:a100=9\"", "weights per GPU type are not supported"),
        ] {
            let e = read(text).unwrap_err().to_string();
            assert!(e.contains("scheduler.weight_tres = ") && e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn reads_a_config_and_names_bad_fields() {
        let text = r#"
            id = 1
            listen = "127.0.0.1:7101"
            data_dir = "/tmp/q"
            [[replicas]]
            id = 1
            addr = "127.0.0.1:7101"
            [[partitions]]
            name = "gpu"
            nodes = "gpu[01-04]"
            default = true
            max_time = "1-00:00:00"
            [security]
            certs_dir = "/etc/quorum/certs"
        "#;
        let c: ControllerConfig = toml::from_str(text).unwrap();
        c.validate().unwrap();
        let p = &c.partitions().unwrap()[0];
        assert_eq!(p.node_names.len(), 4);
        assert_eq!(p.max_time_s, Some(86400));

        let bad = text.replace("gpu[01-04]", "gpu[04-01]");
        let c: ControllerConfig = toml::from_str(&bad).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("partition 'gpu'") && e.contains("runs backwards"), "{e}");

        // [security]: certificates unless insecure; known private data only.
        let without = text.replace("certs_dir = \"/etc/quorum/certs\"", "");
        let e = toml::from_str::<ControllerConfig>(&without).unwrap().validate().unwrap_err().to_string();
        assert!(e.contains("certs_dir is required"), "{e}");
        let insecure = text.replace("certs_dir = \"/etc/quorum/certs\"", "insecure = true");
        toml::from_str::<ControllerConfig>(&insecure).unwrap().validate().unwrap();
        let private =
            text.replace("certs_dir = \"/etc/quorum/certs\"", "certs_dir = \"/c\"\nprivate_data = [\"secrets\"]");
        let e = toml::from_str::<ControllerConfig>(&private).unwrap().validate().unwrap_err().to_string();
        assert!(e.contains("unknown 'secrets'"), "{e}");
        let both = text.replace("certs_dir = \"/etc/quorum/certs\"", "insecure = true\ntransitional = \"accept\"");
        assert!(toml::from_str::<ControllerConfig>(&both).unwrap().validate().is_err());
        assert_eq!(toml::from_str::<ControllerConfig>(text).unwrap().security.clock_skew_s, 30);

        let bad = text.replace("id = 1\n            listen", "id = 9\n            listen");
        let c: ControllerConfig = toml::from_str(&bad).unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("id 9 is not among"));

        // Node liveness: defaults, and a lease that would let a requeued job run twice.
        let c: ControllerConfig = toml::from_str(text).unwrap();
        assert_eq!(
            c.liveness(),
            Liveness {
                node_timeout: std::time::Duration::from_secs(30),
                agent_lease: std::time::Duration::from_secs(20)
            }
        );
        let with = |extra: &str| -> ControllerConfig { toml::from_str(&format!("{extra}\n{text}")).unwrap() };
        let e = with("node_timeout_ms = 10000\nagent_lease_ms = 10000").validate().unwrap_err().to_string();
        assert!(e.contains("agent_lease_ms (10000) must be below node_timeout_ms (10000)"), "{e}");
        let e = with("agent_lease_ms = 500").validate().unwrap_err().to_string();
        assert!(e.contains("agent_lease_ms (500) must be at least 2000 ms"), "{e}");
        with("node_timeout_ms = 5000\nagent_lease_ms = 3000").validate().unwrap();
        assert_eq!(c.raft_max_payload_entries, 32);
        let e = with("raft_max_payload_entries = 0").validate().unwrap_err().to_string();
        assert!(e.contains("raft_max_payload_entries must be at least 1"), "{e}");
        // [limits]: below the ceilings only, and enforced with the key named.
        let limits =
            |extra: &str| -> ControllerConfig { toml::from_str(&format!("{text}\n[limits]\n{extra}")).unwrap() };
        let c = limits("max_script_bytes = 1000\nmax_env_vars = 2");
        c.validate().unwrap();
        let e = limits("max_submit_bytes = 99999999999").validate().unwrap_err().to_string();
        assert!(e.contains("max_submit_bytes = 99999999999: at most 8388608"), "{e}");
        let mut spec =
            quorum_model::JobSpec { program: quorum_model::Program::Script("x".repeat(1001)), ..Default::default() };
        let (field, reason) = c.limits.check(&spec).unwrap_err();
        assert_eq!(field, "script");
        assert!(reason.contains("1001 bytes: this cluster accepts at most 1000 (max_script_bytes)"), "{reason}");
        spec.program = quorum_model::Program::Script("x".into());
        spec.env = quorum_model::Env::new([("A", "1"), ("B", "2"), ("C", "3")]);
        assert!(c.limits.check(&spec).unwrap_err().1.contains("(max_env_vars)"));
        // A mail type sbatch would not send is refused at the door too (another client's).
        spec.env = quorum_model::Env::default();
        spec.notes.mail_type = "END,LATER".into();
        let (field, reason) = c.limits.check(&spec).unwrap_err();
        assert_eq!((field, reason.contains("unknown type 'LATER'")), ("mail_type", true), "{reason}");
        let above = quorum_state::FEATURE_LEVEL + 1;
        let e = with(&format!("emulate_feature_level = {above}")).validate().unwrap_err().to_string();
        assert!(e.contains(&format!("emulate_feature_level ({above}) must be between 1 and")), "{e}");
        assert_eq!(with("emulate_feature_level = 1").feature_level(), 1);
        assert_eq!(with("").feature_level(), quorum_state::FEATURE_LEVEL);
    }

    #[test]
    fn qos_and_accounts_read_their_tres_limits_and_user_shares() {
        let text = r#"
            [[qos]]
            name = "gpu"
            max_tres_per_user = "cpu=256,gres/gpu=16"
            max_tres_per_job = "node=4"
            grp_tres = "mem=2T"
            grp_jobs = 200
            grp_tres_mins = "gres/gpu=100000"
            max_submit_jobs_per_user = 500
            no_decay = true

            [[accounts]]
            name = "physics"
            users = ["alice", "bob"]
            user_shares = { alice = 2 }
            max_tres_per_job = "cpu=128,mem=1T,node=16,gres/gpu=32"
            max_submit_jobs = 1000
            grp_tres_mins = "cpu=6000000,gres/gpu=600000"
        "#;
        #[derive(Deserialize)]
        struct Sections {
            qos: Vec<QosConfig>,
            accounts: Vec<AccountConfig>,
        }
        let c: Sections = toml::from_str(text).unwrap();
        let q = c.qos[0].to_qos().unwrap();
        assert_eq!((q.max_tres_per_user.cpus, q.max_tres_per_user.gpus), (Some(256), Some(16)));
        assert_eq!((q.max_tres_per_job.nodes, q.grp_tres.mem_mb, q.grp_jobs), (Some(4), Some(2 << 20), Some(200)));
        assert_eq!((q.grp_tres_mins.gpu, q.max_submit_jobs_per_user, q.no_decay), (Some(100_000), Some(500), true));
        assert!(q.uses_level_20());
        let a = c.accounts[0].to_account().unwrap();
        assert_eq!((a.user_shares_of("alice"), a.user_shares_of("bob")), (2, 1));
        assert_eq!(a.limits.max_tres_per_job.to_slurm(), "cpu=128,mem=1048576M,node=16,gres/gpu=32");
        assert_eq!((a.limits.max_submit_jobs, a.limits.grp_tres_mins.cpu), (Some(1000), Some(6_000_000)));
        let bad = text.replace("grp_tres = \"mem=2T\"", "grp_tres = \"mem=2T,disk=1\"");
        let e = toml::from_str::<Sections>(&bad).unwrap().qos[0].to_qos().unwrap_err().to_string();
        assert!(e.contains("qos 'gpu' grp_tres: unknown TRES 'disk'"), "{e}");
    }

    #[test]
    fn a_partition_reads_slurms_oversubscribe() {
        let part = |extra: &str| -> Result<Partition, ConfigError> {
            let text = format!("name = \"p\"\nnodes = \"n[1-2]\"\n{extra}");
            toml::from_str::<PartitionConfig>(&text).unwrap().to_partition()
        };
        assert_eq!(part("oversubscribe = \"FORCE:2\"").unwrap().oversubscribe, OverSubscribe::Force(2));
        assert_eq!(part("oversubscribe = \"yes\"").unwrap().oversubscribe, OverSubscribe::Yes(4));
        let whole = part("oversubscribe = \"EXCLUSIVE\"").unwrap();
        assert!(whole.exclusive && whole.oversubscribe.is_no());
        let e = part("exclusive = true\noversubscribe = \"FORCE\"").unwrap_err().to_string();
        assert!(
            e.contains("partition 'p': exclusive = true gives whole nodes; OverSubscribe=FORCE shares them"),
            "{e}"
        );
        let e = part("oversubscribe = \"FORCE:99\"").unwrap_err().to_string();
        assert!(e.contains("the count after ':' is 1 to 64 jobs"), "{e}");
        // The scheduler's parts of a CPU: the counts' least common multiple is bounded.
        let many: String = (33..=64)
            .map(|n| format!("[[partitions]]\nname = \"p{n}\"\nnodes = \"n1\"\noversubscribe = \"FORCE:{n}\"\n"))
            .collect();
        let text = format!("id = 1\nlisten = \"127.0.0.1:1\"\ndata_dir = \"/tmp/q\"\nreplicas = []\n{many}");
        let e = toml::from_str::<ControllerConfig>(&text).unwrap().partitions().unwrap_err().to_string();
        assert!(e.contains("least common multiple over 1048576"), "{e}");
    }
}
