//! Mail about jobs (`--mail-type`, `--mail-user`), through the `mail_program` of the leader's
//! config, called as Slurm calls its MailProg: `PROGRAM -s SUBJECT RECIPIENT`, nothing on its
//! standard input, and the job in `SLURM_JOB_*` variables. Without a `mail_program` nothing is
//! sent; the types and recipient stay recorded and shown.
//!
//! The leader mails the changes it sees applied during its term ([`Watcher::look`], after
//! applied changes, a few times a second): a job that began, ended, failed, reached its time
//! limit or was requeued. A new leader first learns where every job stands and mails only what
//! changes after that, so a change applied during a failover is not mailed, and none twice.
//! Without `ARRAY_TASKS` an array is mailed about as a whole, as Slurm does: when its first task
//! begins and when its last one ends.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quorum_model::{Job, JobId, JobState, MailTypes, Millis};
use quorum_state::ClusterState;
use tokio::sync::watch;

use crate::replica::Replica;

/// One mail to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mail {
    pub to: String,
    pub subject: String,
    /// `SLURM_JOB_*` variables for the program.
    pub env: Vec<(String, String)>,
}

/// Where a job stood at the last look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    state: JobState,
    requeues: u32,
}

impl Seen {
    fn of(job: &Job) -> Seen {
        Seen { state: job.state, requeues: job.requeues }
    }
}

/// What the leader remembers between looks at the state.
#[derive(Default)]
pub struct Watcher {
    /// Unfinished jobs that asked for mail.
    seen: BTreeMap<JobId, Seen>,
    /// Jobs from this id on were submitted after the last look.
    next_id: JobId,
    /// Arrays (by id) mailed about as a whole whose beginning, and whose end, was mailed or
    /// known at the first look.
    began: BTreeSet<JobId>,
    ended: BTreeSet<JobId>,
    primed: bool,
}

/// `D-HH:MM:SS`, or `HH:MM:SS` under a day, as Slurm writes times in its mail.
fn duration(ms: Millis) -> String {
    let s = ms / 1000;
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

fn types_of(job: &Job) -> Option<MailTypes> {
    let notes = &job.spec.notes;
    if notes.mail_type.is_empty() {
        return None;
    }
    MailTypes::parse(&notes.mail_type).ok().filter(MailTypes::any)
}

impl Watcher {
    /// The mails the changes since the last look call for. The first look only learns where
    /// each job stands.
    pub fn look(&mut self, state: &ClusterState) -> Vec<Mail> {
        let mut out = Vec::new();
        let mut now: BTreeMap<JobId, Seen> = BTreeMap::new();
        // Active jobs, and the jobs submitted since the last look that have ended already.
        let fresh = state.jobs.range(self.next_id..).map(|(id, _)| *id).filter(|id| !state.active.contains(id));
        for id in state.active.iter().copied().chain(fresh) {
            let Some(job) = state.jobs.get(&id) else { continue };
            let Some(types) = types_of(job) else { continue };
            let before = self.seen.get(&id).copied();
            if self.primed {
                // A job not seen before was submitted since: pending, never requeued.
                let before = before.unwrap_or(Seen { state: JobState::Pending, requeues: 0 });
                self.changes(state, job, types, before, &mut out);
            } else if let Some(a) = job.array.filter(|_| !types.array_tasks) {
                if job.start_time.is_some() || job.state.is_finished() {
                    self.began.insert(a.array_job_id);
                }
            }
            if !job.state.is_finished() {
                now.insert(id, Seen::of(job));
            }
        }
        // Jobs that were unfinished at the last look and are no longer active have ended.
        for (id, before) in std::mem::take(&mut self.seen) {
            if now.contains_key(&id) {
                continue;
            }
            let Some(job) = state.jobs.get(&id).filter(|j| j.state.is_finished()) else { continue };
            if let Some(types) = types_of(job) {
                self.changes(state, job, types, before, &mut out);
            }
        }
        self.seen = now;
        // Arrays purged from the state are not mailed about again.
        self.began.retain(|a| state.jobs.contains_key(a));
        self.ended.retain(|a| state.jobs.contains_key(a));
        self.next_id = state.next_job_id;
        self.primed = true;
        out
    }

    /// The mails for `job` moving from `before` to where it is now.
    fn changes(&mut self, state: &ClusterState, job: &Job, types: MailTypes, before: Seen, out: &mut Vec<Mail>) {
        let whole_array = job.array.filter(|_| !types.array_tasks);
        let requeued = job.requeues > before.requeues;
        if requeued && types.requeue && whole_array.is_none() {
            out.push(mail(job, "Requeued", format!("Slurm Job_id={} Name={} Requeued", job.id, job.spec.name)));
        }
        // Started since (a job cancelled while pending never started).
        let began = job.start_time.is_some()
            && job.state != JobState::Pending
            && (requeued || before.state == JobState::Pending);
        if began && types.begin {
            match whole_array {
                Some(a) if !self.began.insert(a.array_job_id) => {}
                Some(a) => out.push(mail(
                    job,
                    "Began",
                    format!(
                        "Slurm Array Summary Job_id={}_* ({}) Name={} Began",
                        a.array_job_id, a.array_job_id, job.spec.name
                    ),
                )),
                None => {
                    let queued = job.start_time.unwrap_or(0).saturating_sub(job.submit_time);
                    out.push(mail(
                        job,
                        "Began",
                        format!(
                            "Slurm Job_id={} Name={} Began, Queued time {}",
                            job.id,
                            job.spec.name,
                            duration(queued)
                        ),
                    ));
                }
            }
        }
        if before.state.is_finished() || !job.state.is_finished() {
            return;
        }
        if let Some(a) = whole_array {
            self.array_ended(state, job, types, a.array_job_id, u64::from(a.count), out);
            return;
        }
        let failed = !matches!(job.state, JobState::Completed | JobState::Cancelled);
        let run = match (job.start_time, job.end_time) {
            (Some(start), Some(end)) => end.saturating_sub(start),
            _ => 0,
        };
        let code = job.exit_code.unwrap_or(0);
        let how = |word: &str| {
            format!(
                "Slurm Job_id={} Name={} {word}, Run time {}, {}, ExitCode {code}",
                job.id,
                job.spec.name,
                duration(run),
                job.state.name()
            )
        };
        if failed && types.fail {
            out.push(mail(job, "Failed", how("Failed")));
        } else if types.end {
            out.push(mail(job, "Ended", how("Ended")));
        }
        if job.state == JobState::Timeout && types.time_limit {
            out.push(mail(
                job,
                "Time limit reached",
                format!(
                    "Slurm Job_id={} Name={} Reached time limit, Run time {}",
                    job.id,
                    job.spec.name,
                    duration(run)
                ),
            ));
        }
    }

    /// A task of an array mailed about as a whole ended: once every task has, one mail for the
    /// array, with the worst of its tasks' states and the highest exit code.
    fn array_ended(
        &mut self,
        state: &ClusterState,
        job: &Job,
        types: MailTypes,
        array: JobId,
        count: u64,
        out: &mut Vec<Mail>,
    ) {
        let tasks: Vec<&Job> = state
            .jobs
            .range(array..array.saturating_add(count.max(1)))
            .map(|(_, j)| &**j)
            .filter(|j| j.array.is_some_and(|a| a.array_job_id == array))
            .collect();
        if tasks.iter().any(|t| !t.state.is_finished()) || !self.ended.insert(array) {
            return;
        }
        let worst = tasks.iter().map(|t| t.state).find(|s| *s != JobState::Completed).unwrap_or(JobState::Completed);
        let code = tasks.iter().filter_map(|t| t.exit_code).max().unwrap_or(0);
        let failed = !matches!(worst, JobState::Completed | JobState::Cancelled);
        let word = if failed && types.fail {
            "Failed"
        } else if types.end {
            "Ended"
        } else {
            return;
        };
        out.push(mail(
            job,
            word,
            format!(
                "Slurm Array Summary Job_id={array}_* ({array}) Name={} {word}, {}, ExitCode {code}",
                job.spec.name,
                worst.name()
            ),
        ));
    }
}

fn mail(job: &Job, what: &str, subject: String) -> Mail {
    let notes = &job.spec.notes;
    let to = if notes.mail_user.is_empty() { job.user.clone() } else { notes.mail_user.clone() };
    let env = [
        ("SLURM_JOB_ID", job.id.to_string()),
        ("SLURM_JOB_NAME", job.spec.name.clone()),
        ("SLURM_JOB_USER", job.user.clone()),
        ("SLURM_JOB_PARTITION", job.partition.clone()),
        ("SLURM_JOB_STATE", job.state.name().to_string()),
        ("SLURM_JOB_MAIL_TYPE", what.to_string()),
        ("SLURM_JOB_EXIT_CODE_MAX", job.exit_code.unwrap_or(0).to_string()),
        ("SLURM_JOB_WORK_DIR", job.spec.work_dir.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Mail { to, subject, env }
}

/// Sends one mail: `program -s SUBJECT RECIPIENT`, given at most a minute. A recipient that
/// could pass for an option is not mailed.
async fn send(program: &std::path::Path, m: Mail) {
    if m.to.starts_with('-') || m.to.is_empty() || m.to.chars().any(|c| c.is_whitespace() || c.is_control()) {
        tracing::warn!(to = %m.to, subject = %m.subject, "not mailed: the recipient is not an address");
        return;
    }
    let child = tokio::process::Command::new(program)
        .arg("-s")
        .arg(&m.subject)
        .arg(&m.to)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .envs(m.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let result = match child {
        Ok(mut c) => match tokio::time::timeout(Duration::from_secs(60), c.wait()).await {
            Ok(Ok(status)) if status.success() => return,
            Ok(Ok(status)) => format!("it exited with {status}"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "it ran for a minute; killed".to_string(),
        },
        Err(e) => format!("cannot start it: {e}"),
    };
    tracing::warn!(program = %program.display(), to = %m.to, subject = %m.subject, error = %result, "mail not sent");
}

/// Mails queued beyond this many are dropped, each with a warning: a mail program that hangs
/// must not hold the leader's memory.
const MAIL_QUEUE: usize = 10_000;

/// While this replica leads: after applied changes (at most four looks a second), mails what
/// changed through `program`, one mail after another in the order the changes happened.
pub async fn mail_loop(replica: Arc<Replica>, program: PathBuf, mut stop: watch::Receiver<bool>) {
    let mut applied = replica.shared.applied_index.subscribe();
    let mut watcher = Watcher::default();
    let (queue, mut queued) = tokio::sync::mpsc::channel::<Mail>(MAIL_QUEUE);
    let sender = tokio::spawn(async move {
        while let Some(m) = queued.recv().await {
            send(&program, m).await;
        }
    });
    loop {
        let mails = {
            let a = replica.shared.read();
            watcher.look(&a.state)
        };
        for m in mails {
            if let Err(tokio::sync::mpsc::error::TrySendError::Full(m)) = queue.try_send(m) {
                tracing::warn!(to = %m.to, subject = %m.subject, "not mailed: {MAIL_QUEUE} mails wait for the mail program");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = stop.changed() => break,
        }
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => break,
        }
    }
    // Leadership ended: what is queued goes on being sent, but nothing waits for it.
    drop(queue);
    drop(sender);
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorum_model::{Allocation, NodeAllocation, PlannedStart};
    use quorum_state::testing::{cluster, spec, submit};
    use quorum_state::{apply, Command, Response};

    fn start(s: &mut ClusterState, index: u64, job_id: JobId, node: &str) -> Response {
        let allocation = Allocation {
            nodes: vec![NodeAllocation { node: node.into(), cpus: 1, mem_mb: 100, gpus: vec![], het_group: 0 }],
            cpu_ways: None,
        };
        let starts = vec![PlannedStart { job_id, allocation }];
        apply(
            s,
            index,
            Command::ApplyPlan {
                base_index: index - 1,
                now: 2000 + index,
                starts,
                reasons: vec![],
                preemptions: vec![],
                resumes: vec![],
                shown: vec![],
            },
        )
    }

    #[test]
    fn durations_read_as_slurm_writes_them() {
        assert_eq!(duration(5_000), "00:00:05");
        assert_eq!(duration(3_725_000), "01:02:05");
        assert_eq!(duration(90_061_000), "1-01:01:01");
    }

    /// Begin and end of a job, once each; a failure as such; nothing before the first look nor
    /// for a job that asked for nothing.
    #[test]
    fn the_leader_mails_the_changes_it_sees_once() {
        let mut s = cluster();
        let mut w = Watcher::default();
        let mut asked = spec(&["true"]);
        asked.mem_per_node_mb = Some(100);
        asked.notes.mail_type = "BEGIN,END,FAIL".into();
        asked.notes.mail_user = "alice@example.org".into();
        submit(&mut s, 2, asked.clone(), "a");
        assert!(w.look(&s).is_empty(), "the first look learns");
        let mut plain = spec(&["true"]);
        plain.mem_per_node_mb = Some(100);
        submit(&mut s, 3, plain, "b");
        start(&mut s, 4, 1, "n1");
        start(&mut s, 5, 2, "n2");
        let m = w.look(&s);
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(m[0].to, "alice@example.org");
        assert!(m[0].subject.starts_with("Slurm Job_id=1 Name="), "{}", m[0].subject);
        assert!(m[0].subject.contains(" Began, Queued time 00:00:"), "{}", m[0].subject);
        assert!(w.look(&s).is_empty(), "nothing new");
        let end = |job_id, token, code| Command::JobEnded {
            job_id,
            token,
            node: "n1".into(),
            outcome: quorum_model::RankOutcome::Exited { code, signal: 0 },
            now: 9_000,
        };
        apply(&mut s, 6, end(1, 4, 3));
        let m = w.look(&s);
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].subject.contains(" Failed, Run time ") && m[0].subject.ends_with(", FAILED, ExitCode 3"),
            "{}",
            m[0].subject
        );
        assert!(m[0].env.contains(&("SLURM_JOB_MAIL_TYPE".into(), "Failed".into())), "{:?}", m[0].env);

        // Submitted, started and ended between two looks: both mails.
        asked.notes.mail_user.clear();
        submit(&mut s, 7, asked, "c");
        start(&mut s, 8, 3, "n1");
        apply(&mut s, 9, end(3, 8, 0));
        let subjects: Vec<String> = w.look(&s).into_iter().map(|m| format!("{} {}", m.to, m.subject)).collect();
        assert_eq!(subjects.len(), 2, "{subjects:?}");
        assert!(subjects[0].starts_with("alice Slurm Job_id=3 ") && subjects[0].contains("Began"), "{subjects:?}");
        assert!(
            subjects[1].contains("Ended, Run time ") && subjects[1].ends_with("COMPLETED, ExitCode 0"),
            "{subjects:?}"
        );
    }
}
