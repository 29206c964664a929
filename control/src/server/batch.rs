//! Group commit of submits. Concurrent submits reaching the leader go into one Raft entry
//! ([`Command::SubmitJobs`]), so they share one round of log fsyncs on the replicas instead of
//! queueing for one round each: openraft's core appends (and our log store syncs) one client
//! write at a time.
//!
//! There is no timer: a submit that finds nothing in flight is proposed at once. While
//! [`IN_FLIGHT`] entries are being committed, new submits wait, and the next entry takes all that
//! have arrived, up to [`MAX_BATCH`]. A cluster below feature level 5 (a voter runs an older
//! release mid-upgrade) gets one `SubmitJob` entry per submit, as before.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tonic::Status;

use super::api::write_status;
use crate::replica::{now_ms, Core};
use crate::state::{Command, Response as Applied, Submit, SUBMIT_JOBS_LEVEL};

/// Entries of submits being committed at once.
const IN_FLIGHT: usize = 4;
/// Submits in one entry at most; a spec carries its environment, a few KiB, and a large entry
/// would miss openraft's replication timeout.
const MAX_BATCH: usize = 64;

type Answer = oneshot::Sender<Result<Applied, Status>>;

/// The leader's queue of submits; cloning shares it.
#[derive(Clone)]
pub struct SubmitBatcher {
    tx: mpsc::UnboundedSender<(Submit, Answer)>,
}

impl SubmitBatcher {
    /// Starts the task that proposes the queued submits; it ends when the last batcher is dropped.
    pub fn start(core: Arc<Core>) -> SubmitBatcher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(core, rx));
        SubmitBatcher { tx }
    }

    /// Proposes `submit` (with others that arrive meanwhile) and answers what applying it gave:
    /// `Submitted` or `Rejected`.
    pub async fn submit(&self, submit: Submit) -> Result<Applied, Status> {
        let (answer, answered) = oneshot::channel();
        self.tx.send((submit, answer)).map_err(|_| Status::unavailable("this replica is shutting down"))?;
        answered.await.map_err(|_| Status::unavailable("this replica stopped before the submit was committed"))?
    }
}

async fn run(core: Arc<Core>, mut rx: mpsc::UnboundedReceiver<(Submit, Answer)>) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        // everything that queued while waiting for a free slot goes into this entry
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let core = core.clone();
        tokio::spawn(async move {
            propose(&core, batch).await;
            drop(permit);
        });
    }
}

async fn propose(core: &Core, batch: Vec<(Submit, Answer)>) {
    let level = core.shared.read().state.cluster_level();
    if batch.len() == 1 || level < SUBMIT_JOBS_LEVEL {
        // one entry per submit, written concurrently
        futures::future::join_all(batch.into_iter().map(|(s, answer)| async move {
            let command = Command::SubmitJob { spec: s.spec, user: s.user, now: now_ms(), request_id: s.request_id };
            let _ = answer.send(core.write(command).await.map(|(_, applied)| applied).map_err(write_status));
        }))
        .await;
        return;
    }
    let (submits, answers): (Vec<Submit>, Vec<Answer>) = batch.into_iter().unzip();
    let n = submits.len();
    // On an error (NotLeader and the like) every client retries with its own request id, so a
    // submit that did commit after all is found again, not made twice.
    let each = match core.write(Command::SubmitJobs { submits, now: now_ms() }).await {
        Ok((_, Applied::SubmittedMany(each))) if each.len() == n => Ok(each),
        Ok((_, other)) => Err(Status::internal(format!("unexpected answer to {n} submits: {other:?}"))),
        Err(e) => Err(write_status(e)),
    };
    match each {
        Ok(each) => answers.into_iter().zip(each).for_each(|(answer, applied)| {
            let _ = answer.send(Ok(applied));
        }),
        Err(status) => answers.into_iter().for_each(|answer| {
            let _ = answer.send(Err(status.clone()));
        }),
    }
}
