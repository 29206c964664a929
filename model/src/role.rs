//! What a caller may do.

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
