//! Group commit. Writes that reach the leader together go into one Raft entry, so they share one
//! round of log fsyncs on the replicas instead of queueing for one round each: openraft's core
//! appends (and our log store syncs) one client write at a time.
//!
//! - Submits become one [`Command::SubmitJobs`] (feature level 5);
//! - agent reports — registrations, job ends, node health — one [`Command::Batch`] (level 6):
//!   after a cold start or a leader change ten thousand agents register at once, and a cluster
//!   running short jobs reports many ends a second.
//!
//! There is no timer: a write that finds nothing in flight is proposed at once. While
//! [`IN_FLIGHT`] entries of a kind are being committed, new writes wait, and the next entry
//! takes all that have arrived, up to [`MAX_BATCH`]. Below the kind's level (a voter runs an
//! older release mid-upgrade) each write is an entry of its own, as before.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{now_ms, Replica, WriteError};
use quorum_state::{Command, Response, Submit, BATCH_LEVEL, SUBMIT_JOBS_LEVEL};

/// Entries of one kind being committed at once.
const IN_FLIGHT: usize = 4;
/// Writes in one entry at most; a spec carries its environment, a few KiB, and a large entry
/// would miss openraft's replication timeout.
const MAX_BATCH: usize = 64;
/// Bytes of writes in one entry at most (one larger write goes alone): thirty 4 MB scripts
/// submitted together made one entry over the 64 MB message limit, and the cluster stood still.
const MAX_BATCH_BYTES: usize = 1 << 20;

type Answer = oneshot::Sender<Result<Response, WriteError>>;

/// A queue of writes of one kind, proposed in groups; cloning shares it.
pub struct Batcher<I> {
    tx: mpsc::UnboundedSender<(I, Answer)>,
}

impl<I> Clone for Batcher<I> {
    fn clone(&self) -> Self {
        Batcher { tx: self.tx.clone() }
    }
}

/// Submits, proposed as `SubmitJobs`.
pub type SubmitBatcher = Batcher<Submit>;
/// Agent reports, proposed as `Batch`.
pub type ReportBatcher = Batcher<Command>;

impl<I: Send + 'static> Batcher<I> {
    /// Starts the task that proposes the queued writes with `propose`, which answers each; it
    /// ends when the last batcher is dropped.
    /// `weight` is about how many bytes an item takes in an entry.
    fn start<F, Fut>(replica: Arc<Replica>, weight: fn(&I) -> usize, propose: F) -> Batcher<I>
    where
        F: Fn(Arc<Replica>, Vec<(I, Answer)>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(replica, rx, weight, propose));
        Batcher { tx }
    }

    /// Proposes `item` (with others that arrive meanwhile) and answers what applying it gave.
    pub async fn write(&self, item: I) -> Result<Response, WriteError> {
        let (answer, answered) = oneshot::channel();
        self.tx.send((item, answer)).map_err(|_| WriteError::Stopping)?;
        answered.await.map_err(|_| WriteError::Stopping)?
    }
}

impl SubmitBatcher {
    pub fn submits(replica: Arc<Replica>) -> SubmitBatcher {
        Batcher::start(replica, |s: &Submit| s.spec.encoded_bytes() + s.request_id.len(), propose_submits)
    }
}

impl ReportBatcher {
    pub fn reports(replica: Arc<Replica>) -> ReportBatcher {
        // A report is a few hundred bytes at most (a node's registration, a job's end).
        Batcher::start(replica, |_| 512, propose_reports)
    }
}

async fn run<I, F, Fut>(
    replica: Arc<Replica>,
    mut rx: mpsc::UnboundedReceiver<(I, Answer)>,
    weight: fn(&I) -> usize,
    propose: F,
) where
    I: Send + 'static,
    F: Fn(Arc<Replica>, Vec<(I, Answer)>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    // A write that did not fit the last entry starts the next.
    let mut carried = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match rx.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        // everything that queued while waiting for a free slot goes into this entry, up to
        // MAX_BATCH writes and MAX_BATCH_BYTES
        let mut bytes = weight(&first.0);
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) if bytes + weight(&next.0) > MAX_BATCH_BYTES => {
                    carried = Some(next);
                    break;
                }
                Ok(next) => {
                    bytes += weight(&next.0);
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let proposed = propose(replica.clone(), batch);
        tokio::spawn(async move {
            proposed.await;
            drop(permit);
        });
    }
}

/// Proposes each command as an entry of its own, concurrently.
async fn propose_each(replica: &Replica, batch: Vec<(Command, Answer)>) {
    futures::future::join_all(batch.into_iter().map(|(command, answer)| async move {
        let _ = answer.send(replica.write(command).await.map(|(_, applied)| applied));
    }))
    .await;
}

/// Proposes `command` (holding `n` writes) and gives each answer its share of what applying it
/// answered, which `split` takes out of the response. On an error (NotLeader and the like)
/// every write fails: clients retry with their request ids and agents re-send their reports,
/// so one that did commit after all is not applied twice.
async fn propose_together(
    replica: &Replica,
    command: Command,
    answers: Vec<Answer>,
    split: fn(Response) -> Option<Vec<Response>>,
) {
    let n = answers.len();
    let each = match replica.write(command).await {
        Ok((_, applied)) => match split(applied) {
            Some(each) if each.len() == n => Ok(each),
            other => Err(WriteError::Unexpected(format!("{other:?} answered {n} writes in one entry"))),
        },
        Err(e) => Err(e),
    };
    match each {
        Ok(each) => answers.into_iter().zip(each).for_each(|(answer, applied)| {
            let _ = answer.send(Ok(applied));
        }),
        Err(e) => answers.into_iter().for_each(|answer| {
            let _ = answer.send(Err(e.clone()));
        }),
    }
}

async fn propose_submits(replica: Arc<Replica>, batch: Vec<(Submit, Answer)>) {
    let level = replica.shared.read().state.cluster_level();
    if batch.len() == 1 || level < SUBMIT_JOBS_LEVEL {
        let each = batch.into_iter().map(|(s, answer)| {
            (Command::SubmitJob { spec: s.spec, user: s.user, now: now_ms(), request_id: s.request_id }, answer)
        });
        return propose_each(&replica, each.collect()).await;
    }
    let (submits, answers): (Vec<Submit>, Vec<Answer>) = batch.into_iter().unzip();
    let split = |applied| match applied {
        Response::SubmittedMany(each) => Some(each),
        _ => None,
    };
    propose_together(&replica, Command::SubmitJobs { submits, now: now_ms() }, answers, split).await;
}

async fn propose_reports(replica: Arc<Replica>, batch: Vec<(Command, Answer)>) {
    let level = replica.shared.read().state.cluster_level();
    if batch.len() == 1 || level < BATCH_LEVEL {
        return propose_each(&replica, batch).await;
    }
    let (commands, answers): (Vec<Command>, Vec<Answer>) = batch.into_iter().unzip();
    let split = |applied| match applied {
        Response::Batch(each) => Some(each),
        _ => None,
    };
    propose_together(&replica, Command::Batch { commands }, answers, split).await;
}
