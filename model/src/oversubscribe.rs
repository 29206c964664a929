//! Sharing a partition's CPUs among jobs (Slurm's `OverSubscribe=NO|YES[:N]|FORCE[:N]`).
//!
//! A job that shares its CPUs `N` ways counts as `1/N` of each of them against its nodes: a
//! node holds jobs as long as the sum, over its jobs, of each job's CPUs divided by its `N`
//! stays within the node's CPUs (`N = 1` for a job that does not share). Memory and GPUs are
//! never shared, as with Slurm's `cons_tres`. `N` is fixed when the job starts, from its
//! partition and its `--oversubscribe`, and recorded in its allocation, so that a partition
//! changed later does not change what its running jobs hold.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The most jobs one CPU may be shared among (Slurm's examples go to 4; its default is 4).
pub const MAX_WAYS: u32 = 64;

/// The largest common multiple of every partition's `N` that a cluster may have: the scheduler
/// counts CPUs in `1/L` parts, so that every sharing job's part is whole.
pub const MAX_COMMON_WAYS: u64 = 1 << 20;

/// How a partition lets its jobs share CPUs; whole-node partitions (`EXCLUSIVE`) are
/// `Partition::exclusive`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverSubscribe {
    /// Each CPU to one job (Slurm's default, `NO`); `--oversubscribe` changes nothing.
    #[default]
    No,
    /// Jobs that ask (`--oversubscribe`, `-s`) share each CPU with up to this many such jobs.
    Yes(u32),
    /// Every job shares each CPU with up to this many, asked or not; `--exclusive` does not
    /// change it (the partition's setting wins, as Slurm's does).
    Force(u32),
}

impl OverSubscribe {
    pub fn is_no(&self) -> bool {
        *self == OverSubscribe::No
    }

    /// How many ways a job with these options shares each of its CPUs (1: it does not).
    pub fn ways(&self, asked: bool, exclusive: bool) -> u32 {
        match *self {
            OverSubscribe::Force(n) => n,
            OverSubscribe::Yes(n) if asked && !exclusive => n,
            _ => 1,
        }
    }

    /// Whether a job's `--exclusive` gives it whole nodes here (not under `FORCE`).
    pub fn honours_exclusive(&self) -> bool {
        !matches!(self, OverSubscribe::Force(_))
    }

    /// The most ways it ever shares a CPU.
    pub fn max_ways(&self) -> u32 {
        match *self {
            OverSubscribe::No => 1,
            OverSubscribe::Yes(n) | OverSubscribe::Force(n) => n,
        }
    }

    /// Parses Slurm's spelling: `NO`, `YES`, `YES:N`, `FORCE`, `FORCE:N` (N from 1 to
    /// [`MAX_WAYS`]; 4 when not given), in any case. `EXCLUSIVE` is the partition's `exclusive`.
    pub fn parse(s: &str) -> Result<OverSubscribe, String> {
        let (kind, count) = match s.split_once(':') {
            Some((k, c)) => (k, Some(c)),
            None => (s, None),
        };
        let n = match count {
            None => 4,
            Some(c) => match c.trim().parse::<u32>() {
                Ok(n) if (1..=MAX_WAYS).contains(&n) => n,
                _ => return Err(format!("invalid OverSubscribe '{s}': the count after ':' is 1 to {MAX_WAYS} jobs")),
            },
        };
        match kind.trim().to_ascii_uppercase().as_str() {
            "NO" if count.is_none() => Ok(OverSubscribe::No),
            "YES" => Ok(OverSubscribe::Yes(n)),
            "FORCE" => Ok(OverSubscribe::Force(n)),
            "EXCLUSIVE" if count.is_none() => {
                Err("OverSubscribe=EXCLUSIVE is the partition's exclusive = true, not an oversubscribe setting".into())
            }
            _ => Err(format!("invalid OverSubscribe '{s}': give NO, YES[:N] or FORCE[:N]")),
        }
    }
}

impl fmt::Display for OverSubscribe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OverSubscribe::No => write!(f, "NO"),
            OverSubscribe::Yes(n) => write!(f, "YES:{n}"),
            OverSubscribe::Force(n) => write!(f, "FORCE:{n}"),
        }
    }
}

/// The least common multiple of `a` and `b` (both at least 1), `None` past [`MAX_COMMON_WAYS`].
pub fn common_ways(a: u64, b: u64) -> Option<u64> {
    let l = lcm128(u128::from(a.max(1)), u128::from(b.max(1)));
    (l <= u128::from(MAX_COMMON_WAYS)).then_some(l as u64)
}

/// The least common multiple of `a` and `b` (both at least 1).
pub(crate) fn lcm128(a: u128, b: u128) -> u128 {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversubscribe_reads_slurms_spellings() {
        assert_eq!(OverSubscribe::parse("FORCE:2"), Ok(OverSubscribe::Force(2)));
        assert_eq!(OverSubscribe::parse("force"), Ok(OverSubscribe::Force(4)));
        assert_eq!(OverSubscribe::parse("YES"), Ok(OverSubscribe::Yes(4)));
        assert_eq!(OverSubscribe::parse("NO"), Ok(OverSubscribe::No));
        assert!(OverSubscribe::parse("FORCE:0").unwrap_err().contains("1 to 64"));
        assert!(OverSubscribe::parse("EXCLUSIVE").unwrap_err().contains("exclusive = true"));
        assert!(OverSubscribe::parse("MAYBE").unwrap_err().contains("NO, YES[:N] or FORCE[:N]"));
        assert_eq!(OverSubscribe::Force(3).to_string(), "FORCE:3");
        assert_eq!(OverSubscribe::Yes(4).ways(false, false), 1);
        assert_eq!(OverSubscribe::Yes(4).ways(true, false), 4);
        assert_eq!(OverSubscribe::Force(2).ways(false, true), 2);
        assert_eq!(common_ways(4, 6), Some(12));
        assert_eq!(common_ways(MAX_COMMON_WAYS, 3), None);
    }
}
