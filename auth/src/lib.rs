//! Who is asking, and proof of it, on every path (DESIGN.md, "Trust"): MUNGE credentials
//! ([`munge`]) and tokens ([`token`]) for users, mapped to names through the user database
//! ([`users`]); roles ([`role`]); the cluster's CA and certificates ([`pki`]) and TLS with them
//! ([`tls`], [`listener`]); launches signed by the leader and verified by agents ([`launch`]);
//! and what the daemons store, kept theirs alone ([`private`]).

pub mod launch;
pub mod listener;
pub mod munge;
pub mod pki;
pub mod private;
pub mod role;
pub mod tls;
pub mod token;
pub mod users;

pub use role::{Caller, Proof, Role};
