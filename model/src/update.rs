//! Changing a job after its submit (`quorum update`, `scontrol update JobId=...`): what may
//! change, read from Slurm's `Key=Value` words. Who may change what, and when, is apply's to
//! decide (`Command::UpdateJob`); this only says what was asked.

use serde::{Deserialize, Serialize};

use crate::{parse, parse_dependencies, Dependency};

/// A new time limit: set outright, or moved by an amount (`TimeLimit=+30`, `-1:00:00`), as
/// Slurm's `scontrol update` reads it. `Set(None)` is no limit (`UNLIMITED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeLimitChange {
    Set(Option<u64>),
    Add(u64),
    Subtract(u64),
}

impl TimeLimitChange {
    /// The limit this makes of `old` (seconds; `None`: no limit). Moving no limit leaves none.
    pub fn applied_to(self, old: Option<u64>) -> Option<u64> {
        match self {
            TimeLimitChange::Set(limit) => limit,
            TimeLimitChange::Add(s) => old.map(|o| o.saturating_add(s)),
            TimeLimitChange::Subtract(s) => old.map(|o| o.saturating_sub(s).max(1)),
        }
    }
}

/// A job's new dependencies (`Dependency=`, empty for none).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DependencyChange {
    pub list: Vec<Dependency>,
    pub singleton: bool,
    pub any: bool,
}

/// What to change in a job; `None` leaves that part as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<TimeLimitChange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nice: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependencies: Option<DependencyChange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// `Reservation=NAME`; `Some(None)` (`Reservation=`): out of any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Option<String>>,
}

/// The keys `scontrol update` takes for a job here, as its error names them.
pub const KEYS: &str =
    "TimeLimit, Partition, QOS, Account, Nice, Dependency, JobName (Name), Comment, NumNodes, Reservation";

impl JobUpdate {
    pub fn is_empty(&self) -> bool {
        *self == JobUpdate::default()
    }

    /// The parts that may change only while the job is pending (Slurm's rule): where it runs
    /// and under what, and what it waits for.
    pub fn pending_only(&self) -> Vec<&'static str> {
        let mut parts = Vec::new();
        for (set, name) in [
            (self.partition.is_some(), "partition"),
            (self.qos.is_some(), "qos"),
            (self.account.is_some(), "account"),
            (self.nice.is_some(), "nice"),
            (self.dependencies.is_some(), "dependency"),
            (self.nodes.is_some(), "nodes"),
            (self.reservation.is_some(), "reservation"),
        ] {
            if set {
                parts.push(name);
            }
        }
        parts
    }

    /// Sets one part from `KEY=VALUE` as `scontrol update` names it (keys in any case).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let bad = |why: String| Err(format!("invalid {key}='{value}': {why}"));
        match key.to_ascii_lowercase().as_str() {
            "timelimit" | "time" => {
                let (sign, rest) = match value.as_bytes().first() {
                    Some(b'+') => (Some(true), &value[1..]),
                    Some(b'-') => (Some(false), &value[1..]),
                    _ => (None, value),
                };
                let limit = match parse::parse_time_limit(rest) {
                    Ok(l) => l,
                    Err(e) => return bad(e.to_string()),
                };
                self.time_limit = Some(match (sign, limit) {
                    (None, l) => TimeLimitChange::Set(l),
                    (Some(_), None) => return bad("only a time can be added or taken away".into()),
                    (Some(true), Some(s)) => TimeLimitChange::Add(s),
                    (Some(false), Some(s)) => TimeLimitChange::Subtract(s),
                });
            }
            "partition" => self.partition = Some(name(key, value)?),
            "qos" => self.qos = Some(name(key, value)?),
            "account" => self.account = Some(name(key, value)?),
            "nice" => match value.parse::<i32>() {
                Ok(n) if n.unsigned_abs() <= MAX_NICE => self.nice = Some(n),
                _ => return bad(format!("expected a number from -{MAX_NICE} to {MAX_NICE}")),
            },
            "dependency" => {
                let d = match parse_dependencies(value) {
                    Ok(d) => d,
                    Err(e) => return bad(e),
                };
                if d.list.len() > crate::limits::MAX_DEPENDENCIES {
                    return bad(format!("{} dependencies: at most {}", d.list.len(), crate::limits::MAX_DEPENDENCIES));
                }
                self.dependencies = Some(DependencyChange { list: d.list, singleton: d.singleton, any: d.any });
            }
            "jobname" | "name" => self.name = Some(value.to_string()),
            "comment" => {
                if value.len() > crate::limits::MAX_NOTE_BYTES {
                    return bad(format!("longer than {} bytes", crate::limits::MAX_NOTE_BYTES));
                }
                self.comment = Some(value.to_string());
            }
            "numnodes" | "minnodes" | "nodes" => {
                // Slurm writes a range `MIN[-MAX]`; a job here has one node count.
                let (min, max) = value.split_once('-').unwrap_or((value, value));
                match (min.parse::<u32>(), max.parse::<u32>()) {
                    (Ok(n), Ok(m)) if n == m && (1..=crate::limits::MAX_NODES).contains(&n) => self.nodes = Some(n),
                    (Ok(n), Ok(m)) if n != m => return bad("a job here has one node count, not a range".into()),
                    _ => return bad(format!("expected a node count from 1 to {}", crate::limits::MAX_NODES)),
                }
            }
            "reservation" if value.is_empty() => self.reservation = Some(None),
            "reservation" => self.reservation = Some(Some(name(key, value)?)),
            _ => return Err(format!("updating '{key}' is not supported (a job's updatable keys: {KEYS})")),
        }
        Ok(())
    }

    /// Reads `KEY=VALUE` words, such as `scontrol update JobId=7 TimeLimit=30 Partition=gpu`
    /// gives after its job id.
    pub fn from_words<'a>(words: impl IntoIterator<Item = &'a str>) -> Result<JobUpdate, String> {
        let pairs = words
            .into_iter()
            .map(|word| word.split_once('=').ok_or_else(|| format!("'{word}' is not KEY=VALUE (keys: {KEYS})")))
            .collect::<Result<Vec<_>, _>>()?;
        JobUpdate::from_pairs(pairs)
    }

    /// Reads keys and values; at least one.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<JobUpdate, String> {
        let mut update = JobUpdate::default();
        for (key, value) in pairs {
            update.set(key, value)?;
        }
        if update.is_empty() {
            return Err(format!("nothing to change: give KEY=VALUE (keys: {KEYS})"));
        }
        Ok(update)
    }
}

/// Slurm's bound on `--nice`.
pub const MAX_NICE: u32 = 2_147_483_645;

fn name(key: &str, value: &str) -> Result<String, String> {
    if value.is_empty() || value.len() > 256 || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("invalid {key}='{value}': expected a name (no spaces, at most 256 bytes)"));
    }
    Ok(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DependencyKind;

    #[test]
    fn scontrol_words_read_as_slurm_writes_them() {
        let u =
            JobUpdate::from_words(["TimeLimit=+30", "partition=gpu", "QOS=high", "Nice=10", "JobName=x y"]).unwrap();
        assert_eq!(u.time_limit, Some(TimeLimitChange::Add(1800)));
        assert_eq!((u.partition.as_deref(), u.qos.as_deref(), u.nice), (Some("gpu"), Some("high"), Some(10)));
        assert_eq!(u.name.as_deref(), Some("x y"));
        assert_eq!(u.pending_only(), vec!["partition", "qos", "nice"]);
        let u = JobUpdate::from_words(["timelimit=1-00:00:00", "Dependency=afterok:4", "NumNodes=3"]).unwrap();
        assert_eq!(u.time_limit, Some(TimeLimitChange::Set(Some(86_400))));
        assert_eq!(u.dependencies.unwrap().list[0].kind, DependencyKind::AfterOk);
        assert_eq!(u.nodes, Some(3));
        assert_eq!(
            JobUpdate::from_words(["TimeLimit=-1:00:00"]).unwrap().time_limit,
            Some(TimeLimitChange::Subtract(3600))
        );
        assert_eq!(
            JobUpdate::from_words(["TimeLimit=UNLIMITED"]).unwrap().time_limit,
            Some(TimeLimitChange::Set(None))
        );
        assert_eq!(JobUpdate::from_words(["Dependency="]).unwrap().dependencies, Some(DependencyChange::default()));
        for (bad, says) in [
            ("Features=x", "updating 'Features' is not supported"),
            ("TimeLimit=soon", "invalid TimeLimit='soon'"),
            ("TimeLimit=+UNLIMITED", "only a time can be added"),
            ("Nice=-2147483647", "expected a number"),
            ("NumNodes=2-4", "not a range"),
            ("NumNodes=0", "expected a node count"),
            ("Partition=", "expected a name"),
            ("Dependency=afterok:x", "not a job id"),
            ("TimeLimit", "is not KEY=VALUE"),
        ] {
            let e = JobUpdate::from_words([bad]).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(JobUpdate::from_words([]).unwrap_err().contains("nothing to change"));
    }

    #[test]
    fn a_moved_limit_never_reaches_zero_and_no_limit_stays_none() {
        assert_eq!(TimeLimitChange::Subtract(600).applied_to(Some(300)), Some(1));
        assert_eq!(TimeLimitChange::Add(60).applied_to(Some(60)), Some(120));
        assert_eq!(TimeLimitChange::Add(60).applied_to(None), None);
        assert_eq!(TimeLimitChange::Set(Some(5)).applied_to(None), Some(5));
    }
}
