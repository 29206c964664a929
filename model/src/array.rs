//! Job arrays (`--array=0-15%4`), as Slurm has them: one submit makes a job per task id, with
//! consecutive job ids; the first is the array's id. Each task is an ordinary job (it has its
//! own allocation, state and exit) that also knows its array and its task id, which it sees as
//! `SLURM_ARRAY_JOB_ID`/`SLURM_ARRAY_TASK_ID` and in `%A`/`%a` output patterns. A throttle (`%N`)
//! lets at most N tasks of the array run at once.

use serde::{Deserialize, Serialize};

use super::JobId;

/// The most tasks one array may have.
pub const MAX_ARRAY_TASKS: usize = 100_000;
/// The largest task id.
pub const MAX_TASK_ID: u32 = 10_000_000;

/// `--array`: which task ids, and how many may run at once. Kept as the ranges given, so that
/// the command that submits an array stays small however many tasks it has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySpec {
    /// The task ids are the union of these.
    pub ranges: Vec<TaskRange>,
    /// At most this many run at once (`%N`); 0: no limit.
    pub throttle: u32,
}

/// `first-last:step`; a single id is `first == last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRange {
    pub first: u32,
    pub last: u32,
    pub step: u32,
}

impl TaskRange {
    /// How many ids it names (0 when malformed).
    fn count(&self) -> u64 {
        if self.step == 0 || self.first > self.last {
            return 0;
        }
        u64::from((self.last - self.first) / self.step) + 1
    }
}

impl ArraySpec {
    /// `0-15`, `1,3,5`, `0-99:10` (every tenth), any mix of them joined by commas, and `%N` at
    /// the end for the throttle.
    pub fn parse(text: &str) -> Result<ArraySpec, String> {
        let bad = |why: String| format!("invalid --array '{text}': {why}");
        let (list, throttle) = match text.trim().split_once('%') {
            Some((list, n)) => {
                let n: u32 = n.trim().parse().map_err(|_| bad(format!("'%{n}' is not a number of tasks")))?;
                if n == 0 {
                    return Err(bad("the throttle %0 would let no task run".into()));
                }
                (list, n)
            }
            None => (text.trim(), 0),
        };
        let number = |s: &str| -> Result<u32, String> {
            let n: u32 = s.trim().parse().map_err(|_| bad(format!("'{s}' is not a task id")))?;
            if n > MAX_TASK_ID {
                return Err(bad(format!("task id {n} is above the largest, {MAX_TASK_ID}")));
            }
            Ok(n)
        };
        let mut ranges = Vec::new();
        for part in list.split(',') {
            if part.trim().is_empty() {
                return Err(bad("an empty item (give ranges such as 0-15 or ids such as 1,3,5)".into()));
            }
            let (range, step) = match part.split_once(':') {
                Some((r, s)) => {
                    let step: u32 = s.trim().parse().map_err(|_| bad(format!("':{s}' is not a step")))?;
                    if step == 0 {
                        return Err(bad(format!("'{part}' has a step of 0")));
                    }
                    (r, step)
                }
                None => (part, 1),
            };
            let (first, last) = match range.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None if step == 1 => (number(range)?, number(range)?),
                None => return Err(bad(format!("'{part}': a step needs a range, such as 0-99:10"))),
            };
            if first > last {
                return Err(bad(format!("the range '{range}' runs backwards")));
            }
            ranges.push(TaskRange { first, last, step });
        }
        let spec = ArraySpec { ranges, throttle };
        spec.check().map_err(bad)?;
        Ok(spec)
    }

    /// The tasks as given, counted before any is made: `Err` when there are none or too many.
    pub fn check(&self) -> Result<(), String> {
        let count: u64 = self.ranges.iter().map(TaskRange::count).sum();
        match count {
            0 => Err("an array has at least one task".into()),
            n if n > MAX_ARRAY_TASKS as u64 => Err(format!("more than {MAX_ARRAY_TASKS} tasks ({n})")),
            _ => Ok(()),
        }
    }

    /// The task ids, in order, each once. Call [`ArraySpec::check`] first.
    pub fn tasks(&self) -> Vec<u32> {
        let mut tasks: Vec<u32> = self
            .ranges
            .iter()
            .filter(|r| r.count() > 0)
            .flat_map(|r| (r.first..=r.last).step_by(r.step as usize))
            .collect();
        tasks.sort_unstable();
        tasks.dedup();
        tasks
    }

    /// The canonical text: runs of consecutive ids, and the throttle.
    pub fn to_spec(&self) -> String {
        let tasks = self.tasks();
        let mut parts = Vec::new();
        let mut i = 0;
        while i < tasks.len() {
            let start = tasks[i];
            let mut end = start;
            while i + 1 < tasks.len() && tasks[i + 1] == end + 1 {
                i += 1;
                end = tasks[i];
            }
            parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
            i += 1;
        }
        let mut text = parts.join(",");
        if self.throttle > 0 {
            text.push_str(&format!("%{}", self.throttle));
        }
        text
    }
}

/// Where a job stands in its array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayTask {
    /// The array's id: the job id of its first task.
    pub array_job_id: JobId,
    pub task_id: u32,
    /// How many tasks the array has, and the lowest and highest task id.
    pub count: u32,
    pub min: u32,
    pub max: u32,
    /// At most this many tasks of the array run at once; 0: no limit.
    pub throttle: u32,
}

impl ArrayTask {
    /// `12_3`: how users name a task.
    pub fn name(&self) -> String {
        format!("{}_{}", self.array_job_id, self.task_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_parse() {
        let a = ArraySpec::parse("0-3").unwrap();
        assert_eq!((a.tasks().as_slice(), a.throttle), (&[0, 1, 2, 3][..], 0));
        let a = ArraySpec::parse("1,3,5-6%2").unwrap();
        assert_eq!((a.tasks().as_slice(), a.throttle), (&[1, 3, 5, 6][..], 2));
        assert_eq!(ArraySpec::parse("0-9:3").unwrap().tasks(), [0, 3, 6, 9]);
        assert_eq!(ArraySpec::parse("5,1-2,2").unwrap().tasks(), [1, 2, 5]);
        // However many tasks, the spec is its ranges.
        let big = ArraySpec::parse("0-99999").unwrap();
        assert_eq!(big.ranges, [TaskRange { first: 0, last: 99_999, step: 1 }]);
        assert_eq!(big.tasks().len(), 100_000);
        // A malformed spec (from a command, not the parser) is counted, never expanded.
        let huge = ArraySpec { ranges: vec![TaskRange { first: 0, last: u32::MAX, step: 1 }], throttle: 0 };
        assert!(huge.check().unwrap_err().contains("more than 100000 tasks"));
        let none = ArraySpec { ranges: vec![TaskRange { first: 5, last: 1, step: 1 }], throttle: 0 };
        assert!(none.check().is_err());
        assert_eq!(ArraySpec::parse("5,1-3,7%4").unwrap().to_spec(), "1-3,5,7%4");
    }

    #[test]
    fn bad_arrays_say_why() {
        for (text, why) in [
            ("5-2", "the range '5-2' runs backwards"),
            ("a-3", "'a' is not a task id"),
            ("1,,2", "an empty item"),
            ("0-9%0", "the throttle %0 would let no task run"),
            ("0-9%x", "'%x' is not a number of tasks"),
            ("0-9:0", "'0-9:0' has a step of 0"),
            ("4:2", "a step needs a range"),
            ("0-200000", "more than 100000 tasks (200001)"),
            ("99999999", "is above the largest"),
        ] {
            let e = ArraySpec::parse(text).unwrap_err();
            assert!(e.starts_with(&format!("invalid --array '{text}': ")) && e.contains(why), "{text}: {e}");
        }
    }
}
