//! Forwarding: a follower sends a request that needs the leader on to the leader it knows,
//! once. The forwarded copy is marked, so a replica that is not the leader either (leadership
//! moved meanwhile) answers UNAVAILABLE with its own hint instead of forwarding again, and the
//! answer carries the leader's address so that the client goes there directly next time.

use quorum_auth::Caller;
use tonic::{Request, Response, Status};

use super::api::{not_leader, Api};
use super::auth::{caller, FORWARDED_USER_KEY};

/// Where a request is answered.
pub(super) enum Route<T> {
    /// Here, with the caller and the request's message.
    Here(Caller, T),
    /// At the leader at this address, with the request marked as forwarded and carrying the
    /// identity this replica verified (the leader believes it from a replica certificate only).
    Leader(String, Request<T>),
}

impl Api {
    /// Where `req` is answered: here when this replica leads (or `local` says any replica may
    /// answer, as for a stale read), else at the leader, unless it was forwarded already or no
    /// leader is known.
    pub(super) fn route<T>(&self, req: Request<T>, local: bool) -> Result<Route<T>, Status> {
        let caller = caller(&req)?;
        if local || self.replica.is_leader() {
            return Ok(Route::Here(caller, req.into_inner()));
        }
        let leader = self.replica.leader_addr();
        match leader {
            Some(addr) if !req.metadata().contains_key(quorum_proto::FORWARDED_KEY) => {
                let mut forwarded = Request::new(req.into_inner());
                forwarded
                    .metadata_mut()
                    .insert(quorum_proto::FORWARDED_KEY, tonic::metadata::MetadataValue::from_static("1"));
                let identity = tonic::metadata::MetadataValue::try_from(caller.forwarded())
                    .map_err(|_| Status::invalid_argument("a user name that cannot travel in metadata"))?;
                forwarded.metadata_mut().insert(FORWARDED_USER_KEY, identity);
                quorum_proto::telemetry::carry(&tracing::Span::current(), forwarded.metadata_mut());
                Ok(Route::Leader(addr, forwarded))
            }
            _ => Err(not_leader(leader.as_deref())),
        }
    }
}

/// A forwarded call's answer, carrying the leader's address.
pub(super) fn with_leader_hint<T>(leader: &str, answer: Result<Response<T>, Status>) -> Result<Response<T>, Status> {
    answer.map(|mut r| {
        if let Ok(v) = tonic::metadata::MetadataValue::try_from(leader) {
            r.metadata_mut().insert(quorum_proto::LEADER_HINT_KEY, v);
        }
        r
    })
}

/// The caller and the request's message when this replica answers it; otherwise returns the leader's answer
/// to the same RPC (`$method` of the generated client) from the enclosing handler.
/// `unless_stale`: a request asking for a stale read is answered here.
macro_rules! at_leader {
    ($api:expr, $req:expr, $method:ident) => {
        at_leader!(@route $api, $api.route($req, false)?, $method)
    };
    ($api:expr, $req:expr, $method:ident, unless_stale) => {{
        let stale = $req.get_ref().stale;
        at_leader!(@route $api, $api.route($req, stale)?, $method)
    }};
    (@route $api:expr, $route:expr, $method:ident) => {
        match $route {
            $crate::server::forward::Route::Here(caller, message) => (caller, message),
            $crate::server::forward::Route::Leader(addr, forwarded) => {
                let mut client = $api.peers.client(&addr).map_err(tonic::Status::internal)?;
                return $crate::server::forward::with_leader_hint(&addr, client.$method(forwarded).await);
            }
        }
    };
}
