//! What the state keeps of a job that left it for the job history ([`Departed`]), and what a
//! dependency reads of a job wherever it is ([`Outcome`]). See [`crate::purge`].

use serde::{Deserialize, Serialize};

use quorum_model::{ArrayTask, Job, JobState, Millis};

/// What the state keeps of a job that left it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Departed {
    pub state: JobState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayTask>,
    /// The request id of its submit, kept with the tombstone so that a retry still gets this
    /// job back; empty when none was given.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_id: String,
    /// When it left the hot state (or was recalled into it).
    pub left_at: Millis,
}

impl Departed {
    pub fn of(job: &Job, left_at: Millis) -> Departed {
        Departed {
            state: job.state,
            start_time: job.start_time,
            end_time: job.end_time,
            array: job.array,
            request_id: job.request_id.clone(),
            left_at,
        }
    }
}

/// What a dependency needs to know of a job, whether it is in the hot state or left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub state: JobState,
    pub start_time: Option<Millis>,
    pub end_time: Option<Millis>,
    pub array: Option<ArrayTask>,
}

impl From<&Job> for Outcome {
    fn from(j: &Job) -> Self {
        Outcome { state: j.state, start_time: j.start_time, end_time: j.end_time, array: j.array }
    }
}

impl From<&Departed> for Outcome {
    fn from(d: &Departed) -> Self {
        Outcome { state: d.state, start_time: d.start_time, end_time: d.end_time, array: d.array }
    }
}
