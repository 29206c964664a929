//! The public API's state, and what every area of it shares: the mapping of errors to gRPC
//! statuses, the root check and the read barrier.

use std::sync::Arc;

use quorum_auth::{Caller, Role};
use tonic::Status;

use crate::leader::LeaderState;
use crate::model::Rejection;
use crate::replica::batch::SubmitBatcher;
use crate::replica::peers::Peers;
use crate::replica::{Replica, WriteError};
use crate::security::Security;

/// The public API of one replica, which its gRPC port and its HTTP port (the REST API) serve.
pub struct Api {
    pub(super) replica: Arc<Replica>,
    pub(super) leader: Arc<LeaderState>,
    /// The leader (for forwarding) and new replicas (asked what they run).
    pub(super) peers: Peers,
    /// Submits, committed in groups.
    pub(super) submits: SubmitBatcher,
    pub(super) security: Arc<Security>,
    /// What one submit may carry (`[limits]`).
    pub(super) limits: Arc<crate::config::AdmissionLimits>,
    /// The site's submit filter (`[submit_filter]`), which every submit passes first.
    pub(super) submit_filter: Option<super::filter::SubmitFilterConfig>,
    /// What `scontrol show config` shows of the replica's configuration ([`super::shown`]).
    pub(super) shown_config: Vec<(String, String)>,
}

impl Api {
    pub fn new(
        replica: Arc<Replica>,
        leader: Arc<LeaderState>,
        security: Arc<Security>,
        limits: Arc<crate::config::AdmissionLimits>,
    ) -> Api {
        let submits = SubmitBatcher::submits(replica.clone());
        let peers = Peers::new(replica.dialer.clone(), None);
        Api { peers, replica, leader, submits, security, limits, submit_filter: None, shown_config: Vec::new() }
    }

    /// `scontrol show config` shows these (with the replicated policy).
    pub fn with_shown_config(mut self, shown: Vec<(String, String)>) -> Api {
        self.shown_config = shown;
        self
    }

    /// Every submit passes the site's filter first.
    pub fn with_submit_filter(mut self, filter: Option<super::filter::SubmitFilterConfig>) -> Api {
        self.submit_filter = filter;
        self
    }
}

/// The status a replica answers when it cannot serve a request because it does not lead,
/// carrying the leader's address when known.
pub fn not_leader(leader: Option<&str>) -> Status {
    let mut status = Status::unavailable(match leader {
        Some(l) => format!("not the leader; the leader is {l}"),
        None => "not the leader, and no leader is known yet".to_string(),
    });
    if let Some(Ok(v)) = leader.map(tonic::metadata::MetadataValue::try_from) {
        status.metadata_mut().insert(quorum_proto::LEADER_HINT_KEY, v);
    }
    status
}

/// The status for a write that was not committed.
pub fn write_status(e: WriteError) -> Status {
    match e {
        WriteError::NotLeader { leader } => not_leader(leader.as_deref()),
        WriteError::Raft(msg) => Status::unavailable(msg),
        e @ WriteError::TooNew { .. } => Status::failed_precondition(e.to_string()),
        e @ WriteError::Stopping => Status::unavailable(e.to_string()),
        e @ WriteError::Unexpected(_) => Status::internal(e.to_string()),
    }
}

/// The status for a business rejection.
pub fn rejection_status(r: &Rejection) -> Status {
    let msg = r.to_string();
    match r {
        Rejection::UnknownJob { .. } | Rejection::UnknownNode { .. } => Status::not_found(msg),
        Rejection::NodeIsDown { .. } => Status::failed_precondition(msg),
        Rejection::JobFinished { .. }
        | Rejection::NotPending { .. }
        | Rejection::NotRunning { .. }
        | Rejection::StepBusy { .. }
        | Rejection::SuspendedByPreemption { .. } => Status::failed_precondition(msg),
        Rejection::NotChangeable { .. } => Status::failed_precondition(msg),
        Rejection::AdminHold { .. } | Rejection::OperatorOnly { .. } => Status::permission_denied(msg),
        Rejection::NotOwner { .. } => Status::permission_denied(msg),
        Rejection::QueueFull { .. } => Status::resource_exhausted(msg),
        Rejection::QosNotPermitted { .. } => Status::permission_denied(msg),
        _ => Status::invalid_argument(msg),
    }
}

/// The user a command acts as: an operator's or admin's commands act as root does (on any job;
/// an admin hold), which apply knows; a user's as themselves, whose ownership apply checks.
pub(super) fn acting_as(caller: &Caller) -> String {
    if caller.at_least(Role::Operator) {
        "root".to_string()
    } else {
        caller.user.clone()
    }
}

/// A default read waits until this replica, as the confirmed leader, has applied everything
/// committed before it; a stale read answers from what this replica has applied.
pub(super) async fn read_barrier(api: &Api, stale: bool) -> Result<(), Status> {
    if stale {
        return Ok(());
    }
    api.replica.linearizable().await.map_err(write_status)
}
