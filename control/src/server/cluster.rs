//! The replicas: their status (`quorum cluster`), digests (`quorum admin digest`), leadership
//! transfer and campaigns, and membership changes (`quorum admin add-replica`, `remove-replica`).

use std::collections::BTreeSet;
use std::time::Duration;

use quorum_auth::Caller;
use quorum_proto::api::*;
use tonic::Status;

use super::api::{write_status, Api};
use crate::leader::versions;
use crate::replica::{now_ms, UpTo, VERSION};
use quorum_state::{Command, Response};

/// How long a new replica may take to catch up before it is promoted.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(600);

/// How long a new replica may take to say what it runs.
const ASK_LIMIT: Duration = Duration::from_secs(1);

/// How long a replica waits to reach a digest point before saying how far it got.
const DIGEST_WAIT: Duration = Duration::from_secs(10);

pub(super) async fn get_replica_status(
    api: &Api,
    _caller: &Caller,
    _r: ReplicaStatusRequest,
) -> Result<ReplicaStatus, Status> {
    let metrics = api.replica.raft.metrics();
    let m = metrics.borrow();
    let role = match m.state {
        openraft::ServerState::Leader => "leader",
        openraft::ServerState::Follower => "follower",
        openraft::ServerState::Candidate => "candidate",
        openraft::ServerState::Learner => "learner",
        openraft::ServerState::Shutdown => "shutdown",
    };
    Ok(ReplicaStatus {
        id: api.replica.id,
        address: api.replica.addr.clone(),
        role: role.to_string(),
        term: m.current_term,
        last_log_index: m.last_log_index.unwrap_or(0),
        committed_index: api.replica.committed_index(),
        applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
        leader_id: m.current_leader.unwrap_or(0),
        has_leader: m.current_leader.is_some(),
        version: VERSION.to_string(),
        snapshot_index: m.snapshot.map(|l| l.index).unwrap_or(0),
        feature_level: api.replica.feature_level,
        cluster_level: api.replica.shared.read().state.cluster_level(),
        started_at_ms: api.replica.started_at_ms,
    })
}

pub(super) async fn cluster_members(
    api: &Api,
    _caller: &Caller,
    _r: ClusterStatusRequest,
) -> Result<ClusterStatusResponse, Status> {
    let metrics = api.replica.raft.metrics();
    let m = metrics.borrow();
    let members = m
        .membership_config
        .membership()
        .nodes()
        .map(|(id, node)| ReplicaStatus { id: *id, address: node.addr.clone(), ..Default::default() })
        .collect();
    Ok(ClusterStatusResponse { members })
}

pub(super) async fn digest(api: &Api, _caller: &Caller, _r: DigestRequest) -> Result<DigestResponse, Status> {
    match api.replica.write(Command::Digest { now: now_ms() }).await.map_err(write_status)? {
        (index, Response::Digest { digest }) => Ok(DigestResponse { index, digest }),
        (_, other) => Err(Status::internal(format!("unexpected answer to a digest point: {other:?}"))),
    }
}

pub(super) async fn replica_digest(
    api: &Api,
    _caller: &Caller,
    r: ReplicaDigestRequest,
) -> Result<ReplicaDigestResponse, Status> {
    let index = r.index;
    let mut applied = api.replica.shared.applied_index.subscribe();
    let reached = tokio::time::timeout(DIGEST_WAIT, applied.wait_for(|a| *a >= index)).await.is_ok_and(|r| r.is_ok());
    if !reached {
        let at = *applied.borrow();
        return Err(Status::deadline_exceeded(format!(
            "replica {} has applied up to {at}, not yet the digest point {index}",
            api.replica.id
        )));
    }
    let digest = api.replica.shared.digest_at(index).ok_or_else(|| {
        Status::not_found(format!(
            "replica {} took no digest at {index} (it installed a snapshot past it, or the point is old); run it again",
            api.replica.id
        ))
    })?;
    Ok(ReplicaDigestResponse { id: api.replica.id, index, digest })
}

pub(super) async fn transfer_leader(
    api: &Api,
    _caller: &Caller,
    r: TransferLeaderRequest,
) -> Result<TransferLeaderResponse, Status> {
    let Ok(_guard) = api.replica.membership_change.try_lock() else {
        return Err(Status::failed_precondition(
            "cannot transfer leadership: a membership change is in progress; wait for it to finish",
        ));
    };
    let leader = api
        .replica
        .transfer_leadership((r.to != 0).then_some(r.to))
        .await
        .map_err(|e| Status::failed_precondition(format!("cannot transfer leadership: {e}")))?;
    Ok(TransferLeaderResponse { leader })
}

pub(super) async fn campaign(api: &Api, _caller: &Caller, _r: CampaignRequest) -> Result<CampaignResponse, Status> {
    api.replica.campaign();
    Ok(CampaignResponse {})
}

/// The most records, and about the most bytes, one page of the job history carries.
const HISTORY_PAGE_RECORDS: usize = 5_000;
const HISTORY_PAGE_BYTES: usize = 2 << 20;

/// A page of this replica's job history, for a replica copying it ([`crate::replica::catch_up`]).
pub(super) async fn history_page(api: &Api, r: HistoryPageRequest) -> Result<HistoryPageResponse, Status> {
    let history = api.replica.shared.history.clone();
    // Taken before the page is read: records are only ever added, so a history complete now
    // holds every job that left up to this index.
    let applied_index = api.replica.shared.read().applied_index();
    let incomplete = history.gap().is_some();
    let limit = (r.limit as usize).clamp(1, HISTORY_PAGE_RECORDS);
    let (records, last_job_id, done) =
        tokio::task::spawn_blocking(move || history.page_after(r.after_job_id, limit, HISTORY_PAGE_BYTES))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::internal(e.to_string()))?;
    Ok(HistoryPageResponse { records, last_job_id, done, incomplete, applied_index })
}

/// The job history after a position, in the order jobs entered it, for an exporter. A
/// replica whose history is still being copied answers UNAVAILABLE, so that the caller asks
/// another.
pub(super) async fn follow_history(
    api: &Api,
    _caller: &Caller,
    r: FollowHistoryRequest,
) -> Result<FollowHistoryResponse, Status> {
    let history = api.replica.shared.history.clone();
    let applied_index = api.replica.shared.read().applied_index();
    let limit = (r.limit as usize).clamp(1, HISTORY_PAGE_RECORDS);
    let (records, done) = tokio::task::spawn_blocking(move || {
        history.entered_after((r.after_index, r.after_job_id), limit, HISTORY_PAGE_BYTES)
    })
    .await
    .map_err(|e| Status::internal(e.to_string()))?
    .map_err(super::jobs::history_status)?;
    let records = records.into_iter().map(|(index, job_id, job)| HistoryRecord { index, job_id, job }).collect();
    Ok(FollowHistoryResponse { records, done, applied_index })
}

pub(super) async fn add_replica(
    api: &Api,
    _caller: &Caller,
    r: MembershipChangeRequest,
) -> Result<MembershipChangeResponse, Status> {
    if r.id == 0 || r.addr.trim().is_empty() {
        return Err(Status::invalid_argument("add-replica needs an id above 0 and an address host:port"));
    }
    let (voters, _, _) = membership(api);
    if voters.contains(&r.id) {
        return Err(Status::already_exists(format!("replica {} is already a voter", r.id)));
    }
    let what = format!("add replica {} at {}", r.id, r.addr);
    one_change(api, &what, || async {
        tracing::info!(id = r.id, addr = %r.addr, "adding a replica: as a learner until it has caught up");
        api.replica
            .raft
            .add_learner(r.id, openraft::BasicNode::new(r.addr.trim()), false)
            .await
            .map_err(membership_status)?;
        let started = std::time::Instant::now();
        api.replica.wait_replicated(r.id, UpTo::Start, CATCH_UP_LIMIT).await.map_err(|(matched, wanted)| {
            Status::deadline_exceeded(format!(
                "replica {} has not caught up within {}s (it has {matched} of {wanted} entries); it stays a learner: check that it runs and that the leader can reach it, then add it again or remove it",
                r.id,
                CATCH_UP_LIMIT.as_secs()
            ))
        })?;
        tracing::info!(id = r.id, elapsed_ms = started.elapsed().as_millis() as u64, "learner caught up");
        // A voter of an older release would lower the cluster's level after commands above
        // its level may already be in the log: refuse it.
        let runs = tokio::time::timeout(ASK_LIMIT, versions::ask(&api.peers, r.addr.trim())).await.ok().flatten();
        let cluster = api.replica.shared.read().state.cluster_level();
        match runs {
            Some(v) if v.level >= cluster => {}
            Some(v) => {
                return Err(Status::failed_precondition(format!(
                    "replica {} runs {} (feature level {}) but the cluster is at level {cluster}: it could not apply what the log holds; start it with this release. It stays a learner until then: remove it or add it again",
                    r.id, v.version, v.level
                )))
            }
            None => {
                return Err(Status::unavailable(format!(
                    "replica {} caught up but does not answer what it runs; it stays a learner: add it again",
                    r.id
                )))
            }
        }
        quorum_raft::crash_point("membership-change");
        let mut voters = membership(api).0;
        voters.insert(r.id);
        api.replica.raft.change_membership(voters, false).await.map_err(membership_status)?;
        tracing::info!(id = r.id, "replica added as a voter");
        Ok(())
    })
    .await
}

pub(super) async fn remove_replica(
    api: &Api,
    _caller: &Caller,
    r: MembershipChangeRequest,
) -> Result<MembershipChangeResponse, Status> {
    let (mut voters, learners, _) = membership(api);
    if !voters.contains(&r.id) && !learners.contains(&r.id) {
        return Err(Status::not_found(format!(
            "replica {} is not a member (voters: {})",
            r.id,
            voters.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
        )));
    }
    if voters.len() == 1 && voters.contains(&r.id) {
        return Err(Status::failed_precondition(format!("replica {} is the last voter", r.id)));
    }
    let what = format!("remove replica {}", r.id);
    one_change(api, &what, || async {
        voters.remove(&r.id);
        api.replica.raft.change_membership(voters, false).await.map_err(membership_status)?;
        tracing::info!(id = r.id, "replica removed");
        Ok(())
    })
    .await
}

/// The current voters and learners, and whether a change is half done (joint config).
fn membership(api: &Api) -> (BTreeSet<u64>, Vec<u64>, bool) {
    let metrics = api.replica.raft.metrics();
    let m = metrics.borrow();
    let membership = m.membership_config.membership();
    (membership.voter_ids().collect(), membership.learner_ids().collect(), membership.get_joint_config().len() > 1)
}

fn members_response(api: &Api) -> MembershipChangeResponse {
    let metrics = api.replica.raft.metrics();
    let m = metrics.borrow();
    let membership = m.membership_config.membership();
    let members = membership
        .voter_ids()
        .filter_map(|id| membership.get_node(&id).map(|n| (id, n.addr.clone())))
        .map(|(id, address)| ReplicaStatus { id, address, role: "voter".into(), ..Default::default() })
        .collect();
    MembershipChangeResponse { members }
}

/// Runs `change` as the only membership change in progress, or refuses.
async fn one_change<F, Fut>(api: &Api, what: &str, change: F) -> Result<MembershipChangeResponse, Status>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), Status>>,
{
    let Ok(_guard) = api.replica.membership_change.try_lock() else {
        return Err(Status::failed_precondition(format!(
            "cannot {what}: another membership change is in progress; wait for it to finish"
        )));
    };
    if membership(api).2 {
        return Err(Status::failed_precondition(format!(
            "cannot {what}: the cluster is between two memberships (a change was interrupted); retry shortly"
        )));
    }
    change().await?;
    Ok(members_response(api))
}

fn membership_status(e: impl std::fmt::Display) -> Status {
    Status::aborted(format!("membership change failed: {e}"))
}

impl Api {
    /// What the replica at `addr` says of itself, asked within [`ASK_LIMIT`] (the REST API's
    /// view of the cluster).
    pub async fn replica_status_of(&self, addr: &str) -> Result<ReplicaStatus, String> {
        let mut client = self.peers.client(addr)?;
        match tokio::time::timeout(ASK_LIMIT, client.get_replica_status(ReplicaStatusRequest {})).await {
            Ok(Ok(status)) => Ok(status.into_inner()),
            Ok(Err(status)) => Err(status.message().to_string()),
            Err(_) => Err(format!("no answer within {} s", ASK_LIMIT.as_secs())),
        }
    }
}

/// What a backup streams.
pub type BackupStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<BackupChunk, Status>> + Send>>;

/// Bytes of the file per message.
const BACKUP_CHUNK: usize = 1 << 20;

/// Sends what a backup writes as it is written, a chunk a message, in order.
struct ToStream {
    tx: tokio::sync::mpsc::Sender<Result<BackupChunk, Status>>,
    buf: Vec<u8>,
}

impl std::io::Write for ToStream {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= BACKUP_CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = std::mem::take(&mut self.buf);
        self.tx
            .blocking_send(Ok(BackupChunk { data, summary: None }))
            .map_err(|_| std::io::Error::other("the caller went away"))
    }
}

/// `quorum admin backup`: this replica's state and job history at one index, written on a
/// thread of its own as the caller reads it (a slow reader slows the writing, never fills
/// memory), the cluster serving meanwhile.
pub(super) fn backup(api: &Api, caller: &Caller) -> Result<BackupStream, Status> {
    let shared = api.replica.shared.clone();
    let id = api.replica.id;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tracing::info!(replica = id, by = %caller.user, "backup started");
    std::thread::Builder::new()
        .name("backup".into())
        .spawn(move || {
            let mut out = ToStream { tx: tx.clone(), buf: Vec::new() };
            let last = match crate::replica::backup::write(&shared, id, &mut out) {
                Ok(s) => {
                    tracing::info!(
                        replica = id,
                        index = s.header.index,
                        bytes = s.bytes,
                        jobs = s.jobs,
                        "backup written"
                    );
                    Ok(BackupChunk {
                        data: std::mem::take(&mut out.buf),
                        summary: Some(BackupSummary {
                            index: s.header.index,
                            feature_level: s.header.feature_level,
                            jobs: s.jobs,
                            history_records: s.history_records,
                            bytes: s.bytes,
                            sha256: s.sha256,
                            replica: id,
                        }),
                    })
                }
                Err(e) => Err(Status::failed_precondition(format!("backup: {e}"))),
            };
            let _ = tx.blocking_send(last);
        })
        .map_err(|e| Status::internal(format!("backup: {e}")))?;
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}
