//! Recurring jobs (`quorum cron`): adding one (its job checked as a submit, its first firing
//! computed here, on the leader's clock), listing them (a user's own; operators see all), and
//! removing one.

use quorum_auth::{Caller, Role};
use quorum_proto::api::*;
use tonic::Status;

use super::api::{acting_as, read_barrier, rejection_status, write_status, Api};
use super::jobs::{job_owner, prepared_spec};
use crate::model::cron::{CronEntry, Schedule, Zone};
use crate::replica::now_ms;
use crate::wire;
use quorum_state::{Command, Response};

pub fn cron_to_proto(e: &CronEntry) -> CronInfo {
    CronInfo {
        id: e.id,
        user: e.user.clone(),
        schedule: e.schedule.clone(),
        zone: e.zone.clone(),
        spec: Some(wire::spec_to_proto(&e.spec, false)),
        next_ms: if e.next_ms == u64::MAX { 0 } else { e.next_ms },
        added_ms: e.added_ms,
        fired: e.fired,
        last_fired_ms: e.last_fired_ms.unwrap_or(0),
        last_job: e.last_job.unwrap_or(0),
        last_error: e.last_error.clone().unwrap_or_default(),
    }
}

pub(super) async fn add_cron(api: &Api, caller: &Caller, r: AddCronRequest) -> Result<AddCronResponse, Status> {
    let schedule_text = r.schedule.trim().to_string();
    if schedule_text.len() > 256 {
        return Err(Status::invalid_argument("invalid schedule: longer than 256 bytes"));
    }
    let schedule = Schedule::parse(&schedule_text).map_err(Status::invalid_argument)?;
    let zone = Zone::parse(&r.zone).map_err(Status::invalid_argument)?;
    let now = now_ms();
    let next_ms = schedule.next_after(now, zone).ok_or_else(|| {
        Status::invalid_argument(format!("schedule '{schedule_text}' never fires (within five years)"))
    })?;
    let spec = r.spec.ok_or_else(|| Status::invalid_argument("missing job spec"))?;
    let spec = prepared_spec(api, caller, spec).await?;
    // Whose entry it is, and so whose jobs it submits, decided as a submit's is.
    let user = job_owner(caller, &r.run_as)?;
    let cluster = api.replica.shared.read().state.cluster_level();
    if cluster < quorum_state::CRON_LEVEL {
        let what = "recurring jobs (quorum cron)";
        let needs = quorum_state::CRON_LEVEL;
        return Err(write_status(crate::replica::WriteError::TooNew { what, needs, cluster }));
    }
    let entry = CronEntry {
        id: 0,
        user,
        schedule: schedule_text,
        zone: zone.name(),
        spec,
        next_ms,
        added_ms: now,
        fired: 0,
        last_fired_ms: None,
        last_job: None,
        last_error: None,
    };
    match api.replica.write(Command::AddCron { entry: Box::new(entry), now }).await.map_err(write_status)?.1 {
        Response::CronAdded { id } => {
            let applied = api.replica.shared.read();
            let entry = applied.state.cron.get(&id).map(cron_to_proto);
            Ok(AddCronResponse { entry })
        }
        Response::Rejected(r) => Err(rejection_status(&r)),
        other => Err(Status::internal(format!("unexpected answer to a cron entry: {other:?}"))),
    }
}

pub(super) async fn list_cron(api: &Api, caller: &Caller, r: ListCronRequest) -> Result<ListCronResponse, Status> {
    read_barrier(api, r.stale).await?;
    let everyone = caller.at_least(Role::Operator);
    let applied = api.replica.shared.read();
    let entries =
        applied.state.cron.values().filter(|e| everyone || e.user == caller.user).map(cron_to_proto).collect();
    Ok(ListCronResponse { entries })
}

pub(super) async fn remove_cron(api: &Api, caller: &Caller, r: RemoveCronRequest) -> Result<AdminResponse, Status> {
    let command = Command::RemoveCron { id: r.id, user: acting_as(caller), now: now_ms() };
    match api.replica.write(command).await.map_err(write_status)?.1 {
        Response::Ok => Ok(AdminResponse {}),
        Response::Rejected(r) => Err(rejection_status(&r)),
        other => Err(Status::internal(format!("unexpected answer to a cron entry's removal: {other:?}"))),
    }
}
