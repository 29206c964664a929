//! The caller of a request, as the controller authenticated it.

pub use quorum_model::Role;

/// How the caller proved who they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proof {
    /// A MUNGE credential decoded by this replica's munged.
    Munge,
    /// A signed token, valid until `expires_s` (seconds since the epoch).
    Token { expires_s: u64 },
    /// Another replica (its certificate) vouches for what it verified.
    Forwarded { replica: u64 },
    /// Another replica asking on its own behalf (its certificate).
    Replica(u64),
    /// A plaintext request during the move to TLS (`transitional`): the name the client sent.
    Claimed,
}

/// Who sent a request, after authentication.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub role: Role,
    pub proof: Proof,
}

impl Caller {
    pub fn at_least(&self, role: Role) -> bool {
        self.role >= role
    }

    /// May act on a job of `owner`: their own, or any job as an operator.
    pub fn may_act_on(&self, owner: &str) -> bool {
        self.user == owner || self.at_least(Role::Operator)
    }

    /// The identity a follower passes on to the leader (`user:uid:gid`).
    pub fn forwarded(&self) -> String {
        format!("{}:{}:{}", self.user, self.uid, self.gid)
    }

    /// Reads what [`Caller::forwarded`] wrote.
    pub fn parse_forwarded(s: &str) -> Option<(String, u32, u32)> {
        let mut parts = s.rsplitn(3, ':');
        let gid = parts.next()?.parse().ok()?;
        let uid = parts.next()?.parse().ok()?;
        let user = parts.next()?.to_string();
        (!user.is_empty()).then_some((user, uid, gid))
    }
}
