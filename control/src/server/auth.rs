//! Who is asking, checked in one place for every RPC the replica serves: a tower layer in front
//! of all its services looks the method up in [`rule`], authenticates the caller it needs (a
//! replica or agent certificate, or a user's MUNGE credential or token) and refuses what the
//! rule does not allow before the request reaches a handler. Handlers read the [`Caller`] it
//! leaves in the request's extensions and check ownership (a user's own jobs) themselves.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use quorum_auth::listener::Peer;
use quorum_auth::pki::PeerRole;
use quorum_auth::{users, Caller, Proof, Role};
use tonic::Status;

use crate::replica::Replica;
use crate::security::Security;

/// How long a MUNGE credential proved on a connection is accepted again on it (clients send a
/// fresh one every [`quorum_proto::CREDENTIAL_REUSE_S`] seconds).
const SESSION_REUSE: std::time::Duration = std::time::Duration::from_secs(2 * quorum_proto::CREDENTIAL_REUSE_S);

/// Metadata key of the identity a follower verified and passes on with a forwarded request.
pub const FORWARDED_USER_KEY: &str = "x-quorum-user";

/// Who may call an RPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Any authenticated user; handlers check that a user acts only on their own jobs.
    User,
    Operator,
    Admin,
    /// Another replica, by its certificate: Raft, and what one replica asks of another.
    Replica,
    /// A node agent, by its certificate (which names its node).
    Agent,
}

/// The rule of every RPC, by its gRPC path. A method missing here is refused to everyone, and a
/// test fails for every RPC in the protocol files without a rule.
pub fn rule(path: &str) -> Option<Rule> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    Some(match (service, method) {
        ("quorum.raft.RaftService", "AppendEntries" | "Vote" | "InstallSnapshot") => Rule::Replica,
        ("quorum.agent.AgentService", "Session") => Rule::Agent,
        ("quorum.api.Quorum", m) => match m {
            "SubmitJob" | "CancelJob" | "HoldJob" | "UpdateJob" | "GetJob" | "ListJobs" | "JobLogs" | "JobUsage"
            | "ListNodes" | "Priorities" | "Shares" | "ListAccounts" | "Config" | "GetReplicaStatus"
            | "ClusterMembers" | "IssueToken" | "WhoAmI" | "RunStep" | "AddCron" | "ListCron" | "RemoveCron" => {
                Rule::User
            }
            "SetNodesDrained" | "FollowHistory" | "CreateReservation" | "UpdateReservation" | "DeleteReservation"
            | "UpdateNodes" | "ClusterConfig" => Rule::Operator,
            "UpsertAccount" | "UpsertQos" | "PutPartition" | "DeletePartition" | "InjectGpuFault" | "Digest"
            | "ReplicaDigest" | "AddReplica" | "Backup" | "RemoveReplica" | "TransferLeader" | "SetRole" => Rule::Admin,
            "Campaign" | "HistoryPage" => Rule::Replica,
            _ => return None,
        },
        _ => return None,
    })
}

/// A replica asking for itself (what another runs, a leadership hand-over): replicas are
/// trusted with everything already, as they commit the log. Id 0: a replica of a cluster
/// without TLS, which cannot tell which.
fn replica_caller(replica: u64) -> Caller {
    Caller {
        user: format!("replica-{replica}"),
        uid: u32::MAX,
        gid: u32::MAX,
        role: Role::Admin,
        proof: Proof::Replica(replica),
    }
}

/// Refuses `caller` an RPC (at `path`) whose rule asks for a higher role.
fn may_call(caller: &Caller, rule: Rule, path: &str) -> Result<(), Status> {
    let needed = match rule {
        Rule::Admin => Role::Admin,
        Rule::Operator => Role::Operator,
        _ => Role::User,
    };
    if caller.at_least(needed) {
        return Ok(());
    }
    Err(Status::permission_denied(format!(
        "user '{}' ({}) may not call {}: it needs the {needed} role",
        caller.user,
        caller.role,
        path.rsplit('/').next().unwrap_or(path)
    )))
}

/// Authenticates requests for one replica.
pub struct Authenticator {
    security: Arc<Security>,
    replica: Arc<Replica>,
    /// Tokens name users: looked up once a minute, not per request.
    users: users::Cache,
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Authenticator {
    pub fn new(security: Arc<Security>, replica: Arc<Replica>) -> Authenticator {
        Authenticator { security, replica, users: users::Cache::default() }
    }

    /// The role of `user` (uid `uid`): uid 0 is admin; then the configuration's lists and the
    /// roles given at run time, whichever is higher.
    pub fn role_of(&self, user: &str, uid: u32) -> Role {
        if uid == 0 {
            return Role::Admin;
        }
        let c = &self.security.config;
        let configured = if c.admins.iter().any(|a| a == user) {
            Role::Admin
        } else if c.operators.iter().any(|o| o == user) {
            Role::Operator
        } else {
            Role::User
        };
        let given = self.replica.shared.read().state.roles.get(user).copied().unwrap_or_default();
        configured.max(given)
    }

    /// Checks a request to `path`: the caller it names when the rule asks for a user.
    pub fn check(&self, path: &str, headers: &http::HeaderMap, peer: &Peer) -> Result<Option<Caller>, Status> {
        let rule = rule(path).ok_or_else(|| Status::permission_denied(format!("{path}: no such RPC")))?;
        match rule {
            Rule::Replica => match &peer.role {
                Some(PeerRole::Replica(id)) => Ok(Some(replica_caller(*id))),
                _ if self.security.plaintext_trusted(peer) => Ok(Some(replica_caller(0))),
                _ => Err(Status::permission_denied(format!(
                    "{path} is for replicas only: present a replica certificate"
                ))),
            },
            Rule::Agent => match &peer.role {
                Some(PeerRole::Agent(_)) => Ok(None),
                _ if self.security.plaintext_trusted(peer) => Ok(None),
                _ => Err(Status::permission_denied(format!("{path} is for agents only: present an agent certificate"))),
            },
            Rule::User | Rule::Operator | Rule::Admin => {
                let caller = self.caller(headers, peer)?;
                may_call(&caller, rule, path)?;
                Ok(Some(caller))
            }
        }
    }

    /// Checks an HTTP request that the REST API answers by calling the RPC at `path`: the
    /// caller its credential proves ([`Self::http_caller`]), refused as [`Self::check`] refuses
    /// a caller the RPC's rule does not allow. RPCs for replicas and agents are not for HTTP.
    pub fn http_check(&self, path: &str, headers: &http::HeaderMap, peer: &Peer) -> Result<Caller, Status> {
        let rule = match rule(path) {
            Some(rule @ (Rule::User | Rule::Operator | Rule::Admin)) => rule,
            _ => return Err(Status::permission_denied(format!("{path} is not served over HTTP"))),
        };
        let caller = self.http_caller(headers, peer)?;
        may_call(&caller, rule, path)?;
        Ok(caller)
    }

    fn caller(&self, headers: &http::HeaderMap, peer: &Peer) -> Result<Caller, Status> {
        if let Some(forwarded) = headers.get(FORWARDED_USER_KEY) {
            let replica = match &peer.role {
                Some(PeerRole::Replica(replica)) => *replica,
                None if self.security.plaintext_trusted(peer) => 0,
                _ => {
                    return Err(Status::permission_denied(
                        "a forwarded identity is accepted only from a replica's certificate",
                    ))
                }
            };
            let (user, uid, gid) = forwarded
                .to_str()
                .ok()
                .and_then(Caller::parse_forwarded)
                .ok_or_else(|| Status::invalid_argument("malformed forwarded identity"))?;
            let role = self.role_of(&user, uid);
            return Ok(Caller { user, uid, gid, role, proof: Proof::Forwarded { replica } });
        }
        let auth = headers.get(quorum_proto::AUTHORIZATION_KEY);
        if let (None, Some(PeerRole::Replica(replica))) = (auth, &peer.role) {
            return Ok(replica_caller(*replica));
        }
        // A replica of the plaintext release forwarded a client's request without its proof:
        // the client is sent here, to ask again with a fresh credential.
        if auth.is_none() && headers.contains_key(quorum_proto::FORWARDED_KEY) && self.security.plaintext_trusted(peer)
        {
            let mut status = Status::unavailable(
                "a request forwarded without its caller's proof (by a replica of the plaintext release): ask this replica directly",
            );
            if let Ok(v) = tonic::metadata::MetadataValue::try_from(self.replica.addr.as_str()) {
                status.metadata_mut().insert(quorum_proto::LEADER_HINT_KEY, v);
            }
            return Err(status);
        }
        // Without TLS nothing tells a replica from anyone else: a request without a credential
        // over plaintext is taken for a replica asking for itself, as its Raft messages are
        // (the warning `insecure` and `transitional` log at every start says so).
        if auth.is_none() && self.security.plaintext_trusted(peer) {
            return Ok(replica_caller(0));
        }
        let auth = auth.and_then(|v| v.to_str().ok()).ok_or_else(|| {
            Status::unauthenticated("no credential: the request carries neither a MUNGE credential nor a token")
        })?;
        self.proved(auth, peer)
    }

    /// Who an HTTP request comes from: its token or MUNGE credential (or, on an insecure
    /// cluster, its claimed identity). Nothing is taken from the connection there: no replica
    /// certificate, forwarded identity or plaintext peer stands for a caller.
    pub fn http_caller(&self, headers: &http::HeaderMap, peer: &Peer) -> Result<Caller, Status> {
        let auth = headers.get(quorum_proto::AUTHORIZATION_KEY).and_then(|v| v.to_str().ok()).ok_or_else(|| {
            Status::unauthenticated("no credential: send 'Authorization: Bearer <token>' (`quorum token` makes one)")
        })?;
        self.proved(auth, peer)
    }

    /// The caller an `authorization` value proves.
    fn proved(&self, auth: &str, peer: &Peer) -> Result<Caller, Status> {
        let skew = self.security.config.clock_skew_s;
        if let Some(cred) = auth.strip_prefix(quorum_proto::MUNGE_PREFIX) {
            let cred = cred.trim();
            let (user, uid, gid) = peer.session.prove(cred, SESSION_REUSE, || {
                let (who, payload) =
                    self.security.munge.decode(cred).map_err(|e| Status::unauthenticated(e.to_string()))?;
                // Made for Quorum and for these controllers, not for another service.
                // SAFETY: geteuid has no failure mode.
                let me = unsafe { libc::geteuid() };
                quorum_auth::munge::Munge::check_for_quorum(&who, &payload, me)
                    .map_err(|e| Status::unauthenticated(e.to_string()))?;
                let user = users::by_uid(who.uid).map_err(Status::unauthenticated)?;
                Ok::<_, Status>((user.name, who.uid, who.gid))
            })?;
            let role = self.role_of(&user, uid);
            return Ok(Caller { user, uid, gid, role, proof: Proof::Munge });
        }
        if let Some(token) = auth.strip_prefix(quorum_proto::BEARER_PREFIX) {
            let tokens = self
                .security
                .tokens
                .as_ref()
                .ok_or_else(|| Status::unauthenticated("this replica has no token key: tokens are not accepted"))?;
            let claims =
                tokens.verify(token.trim(), now_s(), skew).map_err(|e| Status::unauthenticated(e.to_string()))?;
            let user = self.users.by_name(&claims.sub).map_err(Status::unauthenticated)?;
            let role = self.role_of(&user.name, user.uid);
            let proof = Proof::Token { expires_s: claims.exp };
            return Ok(Caller { user: user.name, uid: user.uid, gid: user.gid, role, proof });
        }
        if let Some(claim) = auth.strip_prefix(quorum_proto::CLAIM_PREFIX) {
            if !self.security.config.insecure {
                return Err(Status::unauthenticated(
                    "a claimed identity is accepted only by controllers with insecure = true",
                ));
            }
            let (user, uid, gid) = Caller::parse_forwarded(claim.trim())
                .ok_or_else(|| Status::invalid_argument("malformed claim: expected user:uid:gid"))?;
            let role = self.role_of(&user, uid);
            return Ok(Caller { user, uid, gid, role, proof: Proof::Claimed });
        }
        Err(Status::unauthenticated("unknown credential kind: expected 'MUNGE <credential>' or 'Bearer <token>'"))
    }
}

/// The layer that puts an [`Authenticator`] in front of every service.
#[derive(Clone)]
pub struct AuthLayer(pub Arc<Authenticator>);

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService { inner, auth: self.0.clone() }
    }
}

#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Arc<Authenticator>,
}

type BoxFuture<T, E> = Pin<Box<dyn std::future::Future<Output = Result<T, E>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for AuthService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let peer = req.extensions().get::<Peer>().cloned().unwrap_or_default();
        match self.auth.check(req.uri().path(), req.headers(), &peer) {
            Ok(caller) => {
                if let Some(caller) = caller {
                    req.extensions_mut().insert(caller);
                }
                // The service that was made ready is the one that is called.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Box::pin(inner.call(req))
            }
            Err(status) => {
                tracing::warn!(
                    peer = %peer.describe(),
                    rpc = req.uri().path(),
                    code = ?status.code(),
                    reason = status.message(),
                    "refused a request"
                );
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

/// The caller the layer authenticated for this request.
pub fn caller<T>(req: &tonic::Request<T>) -> Result<Caller, Status> {
    req.extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::internal("no authenticated caller on a request that needs one"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every RPC of every service in the protocol files, as `/package.Service/Method`.
    fn every_rpc() -> Vec<String> {
        let mut paths = Vec::new();
        for text in [
            include_str!("../../../proto/proto/api.proto"),
            include_str!("../../../proto/proto/agent.proto"),
            include_str!("../../../proto/proto/raft.proto"),
        ] {
            let package = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("package ").map(|p| p.trim_end_matches(';').trim().to_string()))
                .expect("a package line");
            let mut service = None;
            for line in text.lines().map(str::trim) {
                if let Some(s) = line.strip_prefix("service ") {
                    service = Some(s.trim_end_matches('{').trim().to_string());
                }
                if let (Some(rpc), Some(s)) = (line.strip_prefix("rpc "), &service) {
                    let method = rpc.split('(').next().unwrap().trim();
                    paths.push(format!("/{package}.{s}/{method}"));
                }
            }
        }
        paths
    }

    #[test]
    fn every_rpc_has_a_rule() {
        let rpcs = every_rpc();
        assert!(rpcs.len() > 25, "found only {rpcs:?}");
        let missing: Vec<&String> = rpcs.iter().filter(|p| rule(p).is_none()).collect();
        assert!(missing.is_empty(), "RPCs without a rule: {missing:?}");
        assert_eq!(rule("/quorum.raft.RaftService/AppendEntries"), Some(Rule::Replica));
        assert_eq!(rule("/quorum.api.Quorum/Campaign"), Some(Rule::Replica));
        assert_eq!(rule("/quorum.api.Quorum/RemoveReplica"), Some(Rule::Admin));
        assert_eq!(rule("/quorum.api.Quorum/FollowHistory"), Some(Rule::Operator));
        assert_eq!(rule("/quorum.api.Quorum/NoSuchThing"), None);
    }

    /// The golden table (`rules.golden`): every RPC has exactly the rule it lists, and each role
    /// may call exactly what its rule allows. Widening a rule (an admin's RPC opened to
    /// operators, an operator's to users) fails here until the table says so too.
    #[test]
    fn every_rpc_is_allowed_to_exactly_the_roles_of_the_golden_table() {
        let golden: std::collections::BTreeMap<&str, &str> = include_str!("rules.golden")
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .map(|l| l.split_once(' ').expect("PATH RULE"))
            .collect();
        let rpcs = every_rpc();
        let listed: Vec<&str> = golden.keys().copied().collect();
        let mut found: Vec<&str> = rpcs.iter().map(String::as_str).collect();
        found.sort_unstable();
        assert_eq!(listed, found, "the golden table lists every RPC of the protocol files, and only those");
        let caller = |role: Role| Caller { user: format!("{role}"), uid: 1000, gid: 1000, role, proof: Proof::Munge };
        for (path, expected) in &golden {
            let rule = rule(path).unwrap_or_else(|| panic!("{path} has no rule"));
            let named = match rule {
                Rule::User => "user",
                Rule::Operator => "operator",
                Rule::Admin => "admin",
                Rule::Replica => "replica",
                Rule::Agent => "agent",
            };
            assert_eq!(named, *expected, "{path}: its rule is {named}, the golden table says {expected}");
            if matches!(rule, Rule::Replica | Rule::Agent) {
                continue;
            }
            for (role, rank) in [(Role::User, 0), (Role::Operator, 1), (Role::Admin, 2)] {
                let needed = match *expected {
                    "user" => 0,
                    "operator" => 1,
                    _ => 2,
                };
                let allowed = may_call(&caller(role), rule, path).is_ok();
                assert_eq!(allowed, rank >= needed, "{path} for a caller of role {role}");
            }
        }
    }
}
