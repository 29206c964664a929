//! What the clients did: every operation as an invocation and a completion, in the order the
//! harness saw them, on the host's boot-time clock (the one the jobs read from /proc/uptime).

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Seconds since boot (CLOCK_BOOTTIME): the namespaces share it, and jobs read it too.
pub fn now_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// What a client asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "f", rename_all = "kebab-case")]
pub enum Op {
    /// A job named `name` (unique in the run). `long`: it sleeps past the run (the jobs whose
    /// holds, releases, cancels and reads the linearizability checker judges).
    Submit {
        name: String,
        held: bool,
        requeue: bool,
        gpus: u32,
        long: bool,
        /// How many nodes it asks for (one unless said).
        #[serde(default = "one", skip_serializing_if = "is_one")]
        nodes: u32,
        /// `--dependency=afterok:JOB`: it may start only after that job completed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u64>,
        /// A job array: one job per task, with consecutive ids from the one answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        array: Option<Array>,
        /// Its partition, when not the default one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partition: Option<String>,
        /// A heterogeneous job: its first component as the fields above say (one node), and a
        /// second of one node with a GPU; `nodes` counts both.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        het: bool,
        /// `--reservation`: it runs only inside this advance reservation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reservation: Option<String>,
    },
    Hold {
        job: u64,
    },
    Release {
        job: u64,
    },
    Cancel {
        job: u64,
    },
    /// A linearizable read of one job.
    Read {
        job: u64,
    },
    /// A read answered by whichever replica is asked, from what it has applied.
    StaleRead {
        job: u64,
    },
}

/// `--array=0-N%K`: `tasks` tasks (ids 0 to `tasks - 1`), at most `throttle` running at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Array {
    pub tasks: u32,
    pub throttle: u32,
}

impl Array {
    /// As `--array` says it.
    pub fn arg(&self) -> String {
        format!("0-{}%{}", self.tasks.saturating_sub(1), self.throttle)
    }
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Op {
    /// The submit of the harness's probe, a plain short job, when the faults have healed.
    pub fn probe(name: String) -> Op {
        Op::Submit {
            name,
            held: false,
            requeue: false,
            gpus: 0,
            long: false,
            nodes: 1,
            after: None,
            array: None,
            partition: None,
            het: false,
            reservation: None,
        }
    }

    pub fn job(&self) -> Option<u64> {
        match self {
            Op::Submit { .. } => None,
            Op::Hold { job } | Op::Release { job } | Op::Cancel { job } | Op::Read { job } | Op::StaleRead { job } => {
                Some(*job)
            }
        }
    }
}

/// A job as a read showed it: what clients write and what the run checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    pub name: String,
    pub state: String,
    pub held: bool,
    /// Cancelled, or a cancel asked of it while it ran.
    pub cancelled: bool,
    /// Its task id, when it is a task of an array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<u32>,
}

/// What came back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Outcome {
    /// A submit's job id.
    Submitted {
        job: u64,
    },
    /// A hold or release the cluster applied.
    Done,
    /// A cancel it applied: of a running job (which ends once its processes are stopped), or of
    /// a pending one (CANCELLED at once).
    Cancelled {
        was_running: bool,
    },
    /// One it refused, saying why (the job was not pending, or had ended).
    Refused {
        reason: String,
    },
    /// The job does not exist.
    Missing,
    Read {
        job: Seen,
    },
    /// It may or may not have happened: a timeout, a lost connection, no leader.
    Unknown {
        error: String,
    },
    /// It did not happen: refused before it was applied (authentication, a bad request).
    Failed {
        error: String,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Event {
    Invoke {
        process: u64,
        time: f64,
        op: Op,
    },
    Complete {
        process: u64,
        time: f64,
        outcome: Outcome,
    },
    /// A fault began or healed.
    Nemesis {
        time: f64,
        what: String,
    },
}

/// The run's history, appended to by every client.
#[derive(Default)]
pub struct Recorder {
    events: Mutex<Vec<Event>>,
}

impl Recorder {
    pub fn invoke(&self, process: u64, op: Op) {
        self.push(|time| Event::Invoke { process, time, op });
    }

    pub fn complete(&self, process: u64, outcome: Outcome) {
        self.push(|time| Event::Complete { process, time, outcome });
    }

    pub fn nemesis(&self, what: String) {
        self.push(|time| Event::Nemesis { time, what });
    }

    /// The time is read under the lock, so that events are in the order of their times.
    fn push(&self, event: impl FnOnce(f64) -> Event) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events.push(event(now_s()));
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// One operation with its completion (`None` while it never completed).
#[derive(Clone, Debug)]
pub struct Pair {
    pub process: u64,
    pub invoked: f64,
    pub op: Op,
    pub completed: Option<(f64, Outcome)>,
    /// Positions in the history, for ordering.
    pub invoke_at: usize,
    pub complete_at: Option<usize>,
}

/// Each invocation matched with its process's next completion.
pub fn pairs(events: &[Event]) -> anyhow::Result<Vec<Pair>> {
    let mut open: std::collections::HashMap<u64, usize> = Default::default();
    let mut out: Vec<Pair> = Vec::new();
    for (at, e) in events.iter().enumerate() {
        match e {
            Event::Invoke { process, time, op } => {
                anyhow::ensure!(!open.contains_key(process), "process {process} invoked twice at event {at}");
                open.insert(*process, out.len());
                out.push(Pair {
                    process: *process,
                    invoked: *time,
                    op: op.clone(),
                    completed: None,
                    invoke_at: at,
                    complete_at: None,
                });
            }
            Event::Complete { process, time, outcome } => {
                let Some(i) = open.remove(process) else {
                    anyhow::bail!("process {process} completed at event {at} with nothing in flight")
                };
                out[i].completed = Some((*time, outcome.clone()));
                out[i].complete_at = Some(at);
            }
            Event::Nemesis { .. } => {}
        }
    }
    Ok(out)
}

/// The history as JSON lines.
pub fn write(path: &std::path::Path, events: &[Event]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for e in events {
        serde_json::to_writer(&mut f, e)?;
        f.write_all(b"\n")?;
    }
    f.flush()?;
    Ok(())
}

pub fn read(path: &std::path::Path) -> anyhow::Result<Vec<Event>> {
    let text = std::fs::read_to_string(path)?;
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| Ok(serde_json::from_str(l)?)).collect()
}
