//! Accounts and QOS: the operators' changes (`quorum admin account`, `qos`) and the fairshare
//! tree (`quorum shares`).

use quorum_auth::Caller;
use quorum_proto::api::*;
use tonic::Status;

use super::api::{rejection_status, write_status, Api};
use crate::replica::now_ms;
use quorum_state::{Command, Response};

pub(super) async fn upsert_account(
    api: &Api,
    _caller: &Caller,
    r: UpsertAccountRequest,
) -> Result<AdminResponse, Status> {
    let a = r.account.ok_or_else(|| Status::invalid_argument("missing account"))?;
    let account = crate::model::Account {
        name: a.name,
        parent: (!a.parent.is_empty()).then_some(a.parent),
        shares: a.shares.max(1),
        users: a.users.into_iter().collect(),
        limits: crate::model::AssocLimits {
            max_jobs: a.max_jobs,
            grp_gpus: a.grp_gpus,
            grp_cpus: a.grp_cpus,
            max_wall_s: a.max_wall_s,
            grp_mem_mb: a.grp_mem_mb,
            grp_nodes: a.grp_nodes,
            grp_gpus_by_type: a.grp_gpus_by_type.into_iter().collect(),
            max_tres_per_job: crate::wire::tres_limit(a.max_tres_per_job),
            max_submit_jobs: a.max_submit_jobs,
            grp_tres_mins: crate::wire::tres_mins(a.grp_tres_mins),
        },
        user_shares: a.user_shares.into_iter().collect(),
        qos: a.qos,
        default_qos: (!a.default_qos.is_empty()).then_some(a.default_qos),
    };
    match api.replica.write(Command::UpsertAccount { account, now: now_ms() }).await.map_err(write_status)?.1 {
        Response::Rejected(rej) => Err(rejection_status(&rej)),
        _ => Ok(AdminResponse {}),
    }
}

pub(super) async fn upsert_qos(api: &Api, _caller: &Caller, r: UpsertQosRequest) -> Result<AdminResponse, Status> {
    let q = r.qos.ok_or_else(|| Status::invalid_argument("missing qos"))?;
    if q.name.is_empty() {
        return Err(Status::invalid_argument("invalid qos: empty name"));
    }
    // What the request does not carry (its preemption settings, from the configuration) stays.
    let kept = api.replica.shared.read().state.qos.get(&q.name).cloned().unwrap_or_default();
    let qos = crate::model::Qos {
        name: q.name,
        priority: q.priority,
        max_wall_s: q.max_wall_s,
        max_gpus_per_user: q.max_gpus_per_user,
        max_jobs_per_user: q.max_jobs_per_user,
        max_tres_per_job: crate::wire::tres_limit(q.max_tres_per_job),
        max_tres_per_user: crate::wire::tres_limit(q.max_tres_per_user),
        grp_tres: crate::wire::tres_limit(q.grp_tres),
        grp_jobs: q.grp_jobs,
        grp_tres_mins: crate::wire::tres_mins(q.grp_tres_mins),
        max_submit_jobs_per_user: q.max_submit_jobs_per_user,
        no_decay: q.no_decay,
        ..kept
    };
    api.replica.write(Command::UpsertQos { qos, now: now_ms() }).await.map_err(write_status)?;
    Ok(AdminResponse {})
}

pub(super) async fn shares(api: &Api, caller: &Caller, _r: SharesRequest) -> Result<SharesResponse, Status> {
    api.replica.linearizable().await.map_err(write_status)?;
    let applied = api.replica.shared.read();
    let view = quorum_sched::ClusterView::from_state(&applied.state);
    let now = now_ms();
    let (shares, by_user) = quorum_sched::priority::fairshare_tree(&view, now, &applied.state.policy);
    // PrivateData=usage: a user sees the usage of the accounts they belong to only.
    let private = api.security.config.private("usage") && !caller.at_least(quorum_auth::Role::Operator);
    let member = |name: &str| applied.state.accounts.get(name).is_some_and(|a| a.users.contains(&caller.user));
    let accounts = shares
        .values()
        .filter(|s| !private || member(&s.name))
        .map(|s| AccountShare {
            name: s.name.clone(),
            parent: s.parent.clone().unwrap_or_default(),
            raw_shares: s.raw_shares,
            norm_shares: s.norm_shares,
            raw_usage: s.raw_usage,
            norm_usage: s.norm_usage,
            fairshare: s.fairshare,
            users: applied.state.accounts.get(&s.name).map(|a| a.users.iter().cloned().collect()).unwrap_or_default(),
        })
        .collect();
    // PrivateData=usage: a user sees their own rows only.
    let users = by_user
        .values()
        .flat_map(|a| a.users.values())
        .filter(|u| !private || u.user == caller.user)
        .map(|u| UserShare {
            account: u.account.clone(),
            user: u.user.clone(),
            raw_shares: u.raw_shares,
            norm_shares: u.norm_shares,
            raw_usage: u.raw_usage,
            effective_usage: u.effective_usage,
            fairshare: u.fairshare,
        })
        .collect();
    Ok(SharesResponse { accounts, users })
}

pub(super) async fn list_accounts(
    api: &Api,
    caller: &Caller,
    _r: ListAccountsRequest,
) -> Result<ListAccountsResponse, Status> {
    api.replica.linearizable().await.map_err(write_status)?;
    let applied = api.replica.shared.read();
    let operator = caller.at_least(quorum_auth::Role::Operator);
    // PrivateData=accounts: a user sees the accounts they belong to; users: only themselves
    // among an account's users.
    let (accounts_private, users_private) =
        (api.security.config.private("accounts") && !operator, api.security.config.private("users") && !operator);
    let accounts = applied
        .state
        .accounts
        .values()
        .filter(|a| !accounts_private || a.users.contains(&caller.user))
        .map(|a| {
            let mut spec = crate::wire::account_to_proto(a);
            if users_private {
                spec.users.retain(|u| *u == caller.user);
                spec.user_shares.retain(|u, _| *u == caller.user);
            }
            spec
        })
        .collect();
    let mut qos: Vec<QosSpec> = applied.state.qos.values().map(crate::wire::qos_to_proto).collect();
    // The default QOS is there whether or not it was ever defined.
    if !applied.state.qos.contains_key(quorum_state::DEFAULT_QOS) {
        qos.insert(0, QosSpec { name: quorum_state::DEFAULT_QOS.into(), ..Default::default() });
    }
    Ok(ListAccountsResponse { accounts, qos })
}
