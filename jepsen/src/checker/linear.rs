//! Linearizability of each job, judged by stateright's `LinearizabilityTester`: each job is a
//! register of what clients write to it (that it exists, its hold, its cancel) and what the
//! cluster may do to it on its own (end it), and every completed or unfinished operation on it
//! must fit one order that respects real time.

use std::collections::BTreeMap;

use stateright::semantics::{ConsistencyTester, LinearizabilityTester, SequentialSpec};

use crate::history::{Event, Op, Outcome};

/// One job as clients see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobRegister {
    pub exists: bool,
    pub held: bool,
    pub cancelled: bool,
    /// It ended by itself (a node failure, say) without being cancelled.
    pub ended: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOp {
    Submit { held: bool },
    Hold,
    Release,
    Cancel,
    Read,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobRet {
    Ok,
    /// Refused by the cluster's rules (not pending, already ended).
    Refused,
    Missing,
    Seen {
        held: bool,
        cancelled: bool,
        ended: bool,
    },
}

impl JobRegister {
    fn seen(&self) -> JobRet {
        JobRet::Seen { held: self.held && !self.cancelled, cancelled: self.cancelled, ended: self.ended }
    }
}

impl SequentialSpec for JobRegister {
    type Op = JobOp;
    type Ret = JobRet;

    /// An operation whose answer never came, taking effect.
    fn invoke(&mut self, op: &JobOp) -> JobRet {
        if !self.exists && *op != (JobOp::Submit { held: false }) && *op != (JobOp::Submit { held: true }) {
            return JobRet::Missing;
        }
        let open = !self.cancelled && !self.ended;
        match op {
            JobOp::Submit { held } => {
                self.exists = true;
                self.held = *held;
                JobRet::Ok
            }
            JobOp::Hold | JobOp::Release if open => {
                self.held = *op == JobOp::Hold;
                JobRet::Ok
            }
            JobOp::Cancel if !self.ended => {
                self.cancelled = true;
                JobRet::Ok
            }
            JobOp::Hold | JobOp::Release | JobOp::Cancel => JobRet::Refused,
            JobOp::Read => self.seen(),
        }
    }

    /// Whether `op` may have answered `ret` from this state, moving it as the answer says: the
    /// cluster may refuse a hold of a running job, or end a job on its own, and a read or a
    /// refused cancel shows that it did.
    fn is_valid_step(&mut self, op: &JobOp, ret: &JobRet) -> bool {
        if let JobOp::Submit { held } = op {
            if self.exists || *ret != JobRet::Ok {
                return false;
            }
            (self.exists, self.held) = (true, *held);
            return true;
        }
        // A job that ended may have left the queue for the history (`min_job_age`): a hold,
        // release or cancel then finds no such job, as Slurm's `scontrol` past `MinJobAge` does,
        // while a read still finds it there. An open job answered so ended by itself (a held one
        // never runs, so never ends so).
        if self.exists && *ret == JobRet::Missing && *op != JobOp::Read {
            if !self.cancelled && !self.ended {
                if self.held {
                    return false;
                }
                self.ended = true;
            }
            return true;
        }
        if !self.exists || *ret == JobRet::Missing {
            return !self.exists && *ret == JobRet::Missing;
        }
        let open = !self.cancelled && !self.ended;
        match (op, ret) {
            (JobOp::Hold | JobOp::Release, JobRet::Ok) if open => {
                self.held = *op == JobOp::Hold;
                true
            }
            (JobOp::Hold | JobOp::Release, JobRet::Ok) => false,
            // Refused while it runs; always, once it has ended.
            (JobOp::Hold | JobOp::Release, JobRet::Refused) => true,
            (JobOp::Cancel, JobRet::Ok) if !self.ended => {
                self.cancelled = true;
                true
            }
            (JobOp::Cancel, JobRet::Ok) => false,
            (JobOp::Cancel, JobRet::Refused) => {
                // A job that was neither cancelled nor ended is refused a cancel only by having
                // ended by itself just now.
                if open {
                    self.ended = true;
                }
                true
            }
            (JobOp::Read, JobRet::Seen { held, cancelled, ended }) => {
                if *cancelled != self.cancelled || *held != (self.held && !self.cancelled) {
                    return false;
                }
                if self.cancelled {
                    return true;
                }
                match (self.ended, *ended) {
                    (true, false) => false,
                    // A held job does not end by itself: it never runs.
                    (false, true) if self.held => false,
                    (false, true) => {
                        self.ended = true;
                        true
                    }
                    _ => true,
                }
            }
            _ => false,
        }
    }
}

/// What the register records of one outcome: `None` for an operation that did not happen
/// (refused before it was applied) or whose answer is unknown.
fn ret_of(outcome: &Outcome) -> Option<JobRet> {
    Some(match outcome {
        Outcome::Submitted { .. } | Outcome::Done | Outcome::Cancelled { .. } => JobRet::Ok,
        Outcome::Refused { .. } => JobRet::Refused,
        Outcome::Missing => JobRet::Missing,
        Outcome::Read { job } => {
            let terminal = super::ended::terminal(&job.state);
            JobRet::Seen {
                held: job.held && !job.cancelled,
                cancelled: job.cancelled,
                ended: terminal && !job.cancelled,
            }
        }
        Outcome::Unknown { .. } | Outcome::Failed { .. } => return None,
    })
}

/// The jobs whose history is not linearizable, each with a line saying so. `jobs`: which jobs to
/// judge (those the workload used as registers); the submit of each is part of its history.
pub fn check(events: &[Event], jobs: &[u64]) -> Vec<String> {
    let pairs = match crate::history::pairs(events) {
        Ok(p) => p,
        Err(e) => return vec![format!("linearizability: malformed history: {e}")],
    };
    let wanted: std::collections::BTreeSet<u64> = jobs.iter().copied().collect();
    // At each invocation the register records: the job, the operation and its answer (`None`:
    // in flight for ever). Failed operations did not happen, and a read without an answer tells
    // nothing: neither is recorded.
    let mut plan: BTreeMap<usize, (u64, JobOp, Option<JobRet>)> = BTreeMap::new();
    for p in &pairs {
        let outcome = p.completed.as_ref().map(|(_, o)| o);
        let (job, jop) = match (&p.op, outcome) {
            (Op::Submit { held, .. }, Some(Outcome::Submitted { job })) => (*job, JobOp::Submit { held: *held }),
            (Op::Submit { .. }, _) | (Op::StaleRead { .. }, _) => continue,
            (Op::Hold { job }, _) => (*job, JobOp::Hold),
            (Op::Release { job }, _) => (*job, JobOp::Release),
            (Op::Cancel { job }, _) => (*job, JobOp::Cancel),
            (Op::Read { job }, _) => (*job, JobOp::Read),
        };
        if !wanted.contains(&job) {
            continue;
        }
        let ret = outcome.and_then(ret_of);
        let unanswered = outcome.is_none() || matches!(outcome, Some(Outcome::Unknown { .. }));
        match (ret, unanswered) {
            (Some(r), _) => plan.insert(p.invoke_at, (job, jop, Some(r))),
            (None, true) if jop != JobOp::Read => plan.insert(p.invoke_at, (job, jop, None)),
            (None, _) => continue,
        };
    }
    let mut testers: BTreeMap<u64, LinearizabilityTester<u64, JobRegister>> = BTreeMap::new();
    let mut returning: BTreeMap<u64, (u64, JobRet)> = BTreeMap::new();
    let mut problems = Vec::new();
    for (at, e) in events.iter().enumerate() {
        let result = match e {
            Event::Invoke { process, .. } => {
                let Some((job, jop, ret)) = plan.get(&at) else { continue };
                if let Some(r) = ret {
                    returning.insert(*process, (*job, r.clone()));
                }
                let t = testers.entry(*job).or_insert_with(|| LinearizabilityTester::new(JobRegister::default()));
                t.on_invoke(*process, jop.clone()).map(|_| ()).map_err(|e| (*job, e))
            }
            Event::Complete { process, .. } => {
                let Some((job, ret)) = returning.remove(process) else { continue };
                let t = testers.get_mut(&job).expect("invoked before");
                t.on_return(*process, ret).map(|_| ()).map_err(|e| (job, e))
            }
            Event::Nemesis { .. } => continue,
        };
        if let Err((job, e)) = result {
            problems.push(format!("linearizability: job {job}: malformed history: {e}"));
        }
    }
    for (job, t) in &testers {
        if t.serialized_history().is_none() {
            problems.push(format!("linearizability: job {job}: no order of its operations explains what clients saw"));
        }
    }
    problems
}
