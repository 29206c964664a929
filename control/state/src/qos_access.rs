//! Which QOS a user may use, as Slurm's associations say (`QOS=` and `DefaultQOS=`): the nearest
//! account of the job's chain that names a list decides; where none does, the default QOS
//! alone. Apply gives a job that names no QOS its account's default ([`default_qos`]); who may
//! name which is checked where a request comes in ([`check`]), since operators may use any.

use quorum_model::Rejection;

use crate::cluster::{ClusterState, DEFAULT_QOS};

/// How deep an account chain is followed (as the limits do), against a cycle.
const MAX_DEPTH: usize = 64;

/// The nearest account from `account` up that `has` something, and that thing.
fn nearest<'a, T: ?Sized>(
    state: &'a ClusterState,
    account: &str,
    has: impl Fn(&'a quorum_model::Account) -> Option<&'a T>,
) -> Option<&'a T> {
    let mut name = Some(account);
    for _ in 0..MAX_DEPTH {
        let acc = state.accounts.get(name?)?;
        if let Some(found) = has(acc) {
            return Some(found);
        }
        name = acc.parent.as_deref();
    }
    None
}

/// The QOS of a job of `account` that names none: the nearest `DefaultQOS`, else `normal`.
pub fn default_qos<'a>(state: &'a ClusterState, account: &str) -> &'a str {
    nearest(state, account, |a| a.default_qos.as_deref()).unwrap_or(DEFAULT_QOS)
}

/// The QOS the users of `account` may use: the nearest list, else the default QOS alone.
pub fn allowed(state: &ClusterState, account: &str) -> Vec<String> {
    match nearest(state, account, |a| (!a.qos.is_empty()).then_some(a.qos.as_slice())) {
        Some(list) => list.to_vec(),
        None => vec![default_qos(state, account).to_string()],
    }
}

/// Whether `user` may run a job under `account` (as the job names it, or the first the user
/// belongs to, as apply chooses) and `qos` (as named, or the account's default). Nothing is
/// enforced where no QOS is defined (names are only recorded, as before) or below level 27.
pub fn check(state: &ClusterState, user: &str, account: Option<&str>, qos: Option<&str>) -> Result<(), Rejection> {
    if state.qos.is_empty() || state.cluster_level() < crate::commands::QOS_ACCESS_LEVEL {
        return Ok(());
    }
    let account = match account {
        Some(a) => a.to_string(),
        None => state.accounts.values().find(|a| a.users.contains(user)).map(|a| a.name.clone()).unwrap_or_default(),
    };
    let wanted = qos.unwrap_or_else(|| default_qos(state, &account));
    let allowed = allowed(state, &account);
    if allowed.iter().any(|q| q == wanted) {
        return Ok(());
    }
    Err(Rejection::QosNotPermitted { user: user.into(), qos: wanted.into(), allowed: allowed.join(", ") })
}
