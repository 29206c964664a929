//! What one stage of the cycle hands the next: a job that passed screening ([`Candidate`]), and
//! one that does not start now, with why ([`Waiting`]).

use crate::view::PendingJob;
use quorum_model::PendingReason;

/// A job that passed screening: it starts if its limits and the nodes allow.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    /// Its place in the order.
    pub position: usize,
    pub job: &'a PendingJob,
    /// Its partition's position in the view's partitions.
    pub partition: usize,
    /// Whether it holds nodes whose jobs it preempted ([`PendingJob::claim`]), read while
    /// screening had the job's record at hand: the place stage looks for these first.
    pub claims: bool,
}

/// A job that does not start now, its place in the order, and why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Waiting<'a> {
    pub position: usize,
    pub job: &'a PendingJob,
    pub reason: PendingReason,
}
