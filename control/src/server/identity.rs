//! Identity: tokens (`quorum token`), roles given at run time (`quorum admin role`), and who a
//! replica takes the caller for (`quorum whoami`).

use quorum_auth::{users, Caller, Proof, Role};
use quorum_proto::api::*;
use tonic::Status;

use super::api::{rejection_status, write_status, Api};
use crate::replica::now_ms;
use quorum_state::{Command, Response};

/// A token's lifetime unless asked otherwise, and the longest one.
const DEFAULT_LIFESPAN_S: u64 = 24 * 3600;
const MAX_LIFESPAN_S: u64 = 30 * 24 * 3600;

/// A token for the caller, or for another user when an admin asks. Any replica answers: all
/// hold the same keys. A token cannot mint another token for anyone but its own user.
pub(super) fn issue_token(api: &Api, caller: &Caller, r: IssueTokenRequest) -> Result<IssueTokenResponse, Status> {
    let tokens = api
        .security
        .tokens
        .as_ref()
        .ok_or_else(|| Status::failed_precondition("this replica has no token key ([security] certs_dir)"))?;
    if !r.user.is_empty() {
        users::check_name(&r.user).map_err(Status::invalid_argument)?;
    }
    let user = if r.user.is_empty() || r.user == caller.user {
        caller.user.clone()
    } else if caller.at_least(Role::Admin) && !matches!(caller.proof, Proof::Token { .. }) {
        users::by_name(&r.user).map_err(Status::invalid_argument)?.name
    } else {
        return Err(Status::permission_denied(format!(
            "user '{}' may not mint a token for '{}': only an admin may, with MUNGE",
            caller.user, r.user
        )));
    };
    if matches!(caller.proof, Proof::Replica(_)) {
        return Err(Status::permission_denied("a replica does not get tokens"));
    }
    let lifespan = if r.lifespan_s == 0 { DEFAULT_LIFESPAN_S } else { r.lifespan_s };
    if lifespan > MAX_LIFESPAN_S {
        return Err(Status::invalid_argument(format!(
            "lifespan {lifespan} s is above the most, {MAX_LIFESPAN_S} s (30 days)"
        )));
    }
    let now_s = now_ms() / 1000;
    // A token never mints one that outlives it: renewing cannot turn a short token into a long one.
    if let Proof::Token { expires_s } = caller.proof {
        if now_s.saturating_add(lifespan) > expires_s {
            return Err(Status::permission_denied(format!(
                "a token may mint only a token that ends before it does: this one ends in {} s, and {lifespan} s were asked; ask with MUNGE for a longer one",
                expires_s.saturating_sub(now_s)
            )));
        }
    }
    let token = tokens.mint(&user, now_s, lifespan);
    tracing::info!(by = caller.user, user, lifespan_s = lifespan, "token issued");
    Ok(IssueTokenResponse { token, user, expires_at_s: now_s + lifespan })
}

pub(super) async fn set_role(api: &Api, caller: &Caller, r: SetRoleRequest) -> Result<SetRoleResponse, Status> {
    let role: Role = r.role.parse().map_err(Status::invalid_argument)?;
    let user = r.user.trim().to_string();
    if user.is_empty() {
        return Err(Status::invalid_argument("name the user to give a role"));
    }
    users::check_name(&user).map_err(Status::invalid_argument)?;
    match api.replica.write(Command::SetRole { user: user.clone(), role, now: now_ms() }).await.map_err(write_status)?.1
    {
        Response::Ok => {
            tracing::info!(by = caller.user, user, %role, "role given");
            Ok(SetRoleResponse {})
        }
        Response::Rejected(rej) => Err(rejection_status(&rej)),
        other => Err(Status::internal(format!("unexpected answer to a role change: {other:?}"))),
    }
}

pub(super) fn who_am_i(caller: &Caller) -> WhoAmIResponse {
    let proof = match &caller.proof {
        Proof::Munge => "munge".to_string(),
        Proof::Token { .. } => "token".to_string(),
        Proof::Forwarded { replica } => format!("munge or token, verified by replica {replica}"),
        Proof::Replica(id) => format!("replica {id}'s certificate"),
        Proof::Claimed => "claimed".to_string(),
    };
    WhoAmIResponse { user: caller.user.clone(), uid: caller.uid, gid: caller.gid, role: caller.role.to_string(), proof }
}
