//! What the clients do, whichever cluster they do it to: `jepsen/`'s real processes or the
//! simulator's (`sim/`). Each side turns a chosen [`Job`] into its own submit.

use crate::history::{Array, Op, Outcome};
use crate::rng::Rng;

/// A register job is cancelled and replaced after this many operations on it, which keeps each
/// job's history small enough for the linearizability search.
pub const REGISTER_OPS: u32 = 24;
/// Register jobs in use at once.
pub const ACTIVE_REGISTERS: usize = 3;
/// How long a job runs, in ticks of 0.2 s (a register job: past any run).
pub const TICK_S: f64 = 0.2;
pub const REGISTER_TICKS: u64 = 100_000;

/// A job to submit.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub name: String,
    pub ticks: u64,
    pub held: bool,
    pub requeue: bool,
    pub gpus: u32,
    pub nodes: u32,
    /// `--dependency=afterok:JOB`.
    pub after: Option<u64>,
    /// `--kill-on-invalid-dep=yes`.
    pub kill_on_invalid_dep: bool,
    /// `--array`.
    pub array: Option<Array>,
    /// `--partition`, when not the default one.
    pub partition: Option<String>,
    /// A heterogeneous job: one node as asked, then (`sbatch A : B`) a component of one node with
    /// one GPU, on another node.
    pub het: bool,
    /// `--reservation`.
    pub reservation: Option<String>,
    /// Steps its script starts, one after another (`srun -n1`), each running `ticks`; 0: none,
    /// the script runs `ticks` itself.
    pub steps: u32,
}

impl Job {
    /// A job of one node and one CPU running `ticks`, nothing else asked; the others start from it.
    pub fn plain(name: String, ticks: u64) -> Job {
        Job {
            name,
            ticks,
            held: false,
            requeue: false,
            gpus: 0,
            nodes: 1,
            after: None,
            kill_on_invalid_dep: false,
            array: None,
            partition: None,
            het: false,
            reservation: None,
            steps: 0,
        }
    }

    /// Its submit as the history records it (`long`: a register job).
    pub fn submit(&self, long: bool) -> Op {
        Op::Submit {
            name: self.name.clone(),
            held: self.held,
            requeue: self.requeue,
            gpus: self.gpus,
            long,
            nodes: self.nodes,
            after: self.after,
            array: self.array,
            partition: self.partition.clone(),
            het: self.het,
            reservation: self.reservation.clone(),
        }
    }
}

/// The partition of the default one's nodes whose jobs the default one's preempt: a lower
/// priority tier, its jobs requeued when preempted (`PreemptType=preempt/partition_prio`,
/// `PreemptMode=REQUEUE`). The default partition's jobs are not preemptable.
pub const SCAVENGER: &str = "scavenger";
/// The other partition of a lower tier: its jobs are suspended when preempted
/// (`PreemptMode=SUSPEND`), frozen with their memory and GPUs and lending their CPUs to the job
/// that preempted them until it ends.
pub const STANDBY: &str = "standby";

/// Which workload: each adds to the one before, and a seed of an earlier one replays as it did
/// when that was all there was (its choices draw nothing the later ones added).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Mix {
    /// One-node jobs: the workload of the first weeks.
    SingleNode,
    /// Some jobs on two nodes.
    MultiNode,
    /// Every feature the workload has: job arrays with a throttle, jobs of a lower tier that the
    /// others preempt, heterogeneous jobs, jobs that start steps, an advance reservation and a
    /// recurring job (the last two the operator's), as well.
    Full,
}

/// 0.4–3 s, and 3–12 s for a third of them (to outlast the node timeout).
fn short_ticks(rng: &mut Rng) -> u64 {
    match rng.chance(0.3) {
        true => rng.between(15, 60),
        false => rng.between(2, 15),
    }
}

/// What the clients have learnt so far, shared by them all.
#[derive(Default)]
pub struct Pool {
    /// Acknowledged short jobs.
    short: Vec<u64>,
    /// Register jobs in use, with the operations each has had.
    active: Vec<(u64, u32)>,
    /// Every job used as a register.
    registers: Vec<u64>,
    /// Register submits in flight.
    submitting: usize,
    names: u64,
    /// The advance reservation the operator made, once it exists: some short jobs run in it.
    pub reservation: Option<String>,
}

impl Pool {
    /// Jobs used as registers.
    pub fn registers(&self) -> Vec<u64> {
        self.registers.clone()
    }

    /// Client `w`'s next operation, with the job when it is a submit, from the workload `mix`.
    pub fn choose(&mut self, rng: &mut Rng, w: usize, mix: Mix) -> Option<(Op, Option<Job>)> {
        let roll = rng.below(100);
        let register = |pool: &mut Pool, rng: &mut Rng| -> Option<u64> {
            let i = rng.below(pool.active.len() as u64) as usize;
            let (job, ops) = pool.active.get_mut(i)?;
            *ops += 1;
            Some(*job)
        };
        if self.active.len() + self.submitting < ACTIVE_REGISTERS {
            self.names += 1;
            self.submitting += 1;
            let name = format!("reg-{w}-{}", self.names);
            let held = rng.chance(0.5);
            let job = Job { held, ..Job::plain(name, REGISTER_TICKS) };
            return Some((job.submit(true), Some(job)));
        }
        // A register that has had its share is cancelled and retired.
        if let Some(i) = self.active.iter().position(|(_, ops)| *ops >= REGISTER_OPS) {
            let (job, _) = self.active.remove(i);
            return Some((Op::Cancel { job }, None));
        }
        Some(match roll {
            0..=24 => {
                self.names += 1;
                if mix >= Mix::Full && rng.chance(0.1) {
                    let job = array(format!("array-{w}-{}", self.names), rng);
                    return Some((job.submit(false), Some(job)));
                }
                if mix >= Mix::Full && rng.chance(0.2) {
                    let job = scavenger(format!("scav-{w}-{}", self.names), rng);
                    return Some((job.submit(false), Some(job)));
                }
                if mix >= Mix::Full && rng.chance(0.1) {
                    let job = het(format!("het-{w}-{}", self.names), rng);
                    return Some((job.submit(false), Some(job)));
                }
                if mix >= Mix::Full && rng.chance(0.1) {
                    let job = stepped(format!("steps-{w}-{}", self.names), rng);
                    return Some((job.submit(false), Some(job)));
                }
                if let Some(resv) = self.reservation.clone().filter(|_| rng.chance(0.15)) {
                    let job = reserved(format!("resv-{w}-{}", self.names), resv, rng);
                    return Some((job.submit(false), Some(job)));
                }
                let name = format!("job-{w}-{}", self.names);
                let requeue = rng.chance(0.3);
                let gpus = u32::from(rng.chance(0.3));
                // Some wait for another short job to complete (afterok), and of those half are
                // cancelled once it cannot.
                let nodes = if mix >= Mix::MultiNode && rng.chance(0.15) { 2 } else { 1 };
                let after = if rng.chance(0.2) { rng.pick(&self.short).copied() } else { None };
                let kill_on_invalid_dep = after.is_some() && rng.chance(0.5);
                let ticks = short_ticks(rng);
                let job = Job { requeue, gpus, nodes, after, kill_on_invalid_dep, ..Job::plain(name, ticks) };
                (job.submit(false), Some(job))
            }
            25..=39 => (Op::Hold { job: register(self, rng)? }, None),
            40..=54 => (Op::Release { job: register(self, rng)? }, None),
            55..=59 => (Op::Cancel { job: register(self, rng)? }, None),
            60..=64 => (Op::Cancel { job: *rng.pick(&self.short)? }, None),
            65..=89 => (Op::Read { job: register(self, rng)? }, None),
            _ => {
                let job = match rng.chance(0.5) {
                    true => *rng.pick(&self.short)?,
                    false => *rng.pick(&self.registers)?,
                };
                (Op::StaleRead { job }, None)
            }
        })
    }

    /// Keeps what later choices need: the ids of acknowledged jobs (not arrays': a dependency
    /// on, or a cancel of, an array's id is of the whole array).
    pub fn learn(&mut self, op: &Op, outcome: &Outcome) {
        if let Op::Submit { long, array: None, .. } = op {
            if *long {
                self.submitting -= 1;
            }
            if let Outcome::Submitted { job } = outcome {
                match long {
                    true => {
                        self.active.push((*job, 0));
                        self.registers.push(*job);
                    }
                    false => self.short.push(*job),
                }
            }
        }
    }
}

/// An array of 3-6 short tasks, at most one or two running at once. Its tasks are `--requeue`:
/// a task on a node cut off stops itself when its lease runs out, before the node is declared
/// DOWN and the task requeued, so the throttle holds for the processes, not only in the books
/// (a task that is not would run on there after the next started).
fn array(name: String, rng: &mut Rng) -> Job {
    let array = Array { tasks: rng.between(3, 6) as u32, throttle: rng.between(1, 2) as u32 };
    let ticks = rng.between(2, 15);
    Job { requeue: true, array: Some(array), ..Job::plain(name, ticks) }
}

/// A job of a lower tier (the scavenger or the standby partition, as likely), which a job of the
/// default one that finds no room preempts: 3-12 s (long enough to be in the way), a third with
/// a GPU, `--requeue` (as such jobs are: requeued when preempted, and stopped with the lease on
/// a node cut off).
fn scavenger(name: String, rng: &mut Rng) -> Job {
    let gpus = u32::from(rng.chance(0.3));
    let ticks = rng.between(15, 60);
    let partition = if rng.chance(0.5) { SCAVENGER } else { STANDBY };
    Job { requeue: true, gpus, partition: Some(partition.to_string()), ..Job::plain(name, ticks) }
}

/// A heterogeneous job of 0.4-12 s (as short jobs run): a component of one node, with a GPU for a
/// third of them, and one of one node with a GPU, on two nodes that start together; a third with
/// `--requeue`.
fn het(name: String, rng: &mut Rng) -> Job {
    let requeue = rng.chance(0.3);
    let gpus = u32::from(rng.chance(0.3));
    let ticks = short_ticks(rng);
    Job { requeue, gpus, nodes: 2, het: true, ..Job::plain(name, ticks) }
}

/// A job whose script starts one or two steps (`srun -n1`) of 0.4-3 s each, one after the other;
/// a third with `--requeue`. (The simulator, which has no steps, runs it as one job of that long.)
fn stepped(name: String, rng: &mut Rng) -> Job {
    let requeue = rng.chance(0.3);
    let steps = rng.between(1, 2) as u32;
    let ticks = rng.between(2, 15);
    Job { requeue, steps, ..Job::plain(name, ticks) }
}

/// A job of 0.4-3 s in the advance reservation `resv`: it waits for the window and runs on the
/// reservation's nodes, which no other job may use in it.
fn reserved(name: String, resv: String, rng: &mut Rng) -> Job {
    let ticks = rng.between(2, 15);
    Job { reservation: Some(resv), ..Job::plain(name, ticks) }
}
