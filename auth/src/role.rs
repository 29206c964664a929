//! Roles and the caller of a request, as the controller authenticated it.

use serde::{Deserialize, Serialize};

/// What a caller may do. `User`: their own jobs; `Operator`: any job, and nodes; `Admin`:
/// accounts, QOS, roles, tokens, membership, leadership, fault drills.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    User,
    Operator,
    Admin,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::User => "user",
            Role::Operator => "operator",
            Role::Admin => "admin",
        })
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Role, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "user" => Ok(Role::User),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            _ => Err(format!("unknown role '{s}': one of user, operator, admin")),
        }
    }
}

/// How the caller proved who they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proof {
    /// A MUNGE credential decoded by this replica's munged.
    Munge,
    /// A signed token.
    Token,
    /// Another replica (its certificate) vouches for what it verified.
    Forwarded { replica: u64 },
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
