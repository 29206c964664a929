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

use crate::{JobSpec, Node, Partition};

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
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let (a, b) = (a.max(1), b.max(1));
    let l = (a / gcd(a, b)).checked_mul(b)?;
    (l <= MAX_COMMON_WAYS).then_some(l)
}

impl Node {
    /// Whether `cpus` more CPUs shared `ways` ways fit beside what the node's jobs hold: the
    /// sum of each job's CPUs divided by its ways stays within the node's CPUs.
    pub fn cpus_fit(&self, cpus: u32, ways: u32) -> bool {
        let ways = u128::from(ways.max(1));
        let l = self.shared_cpus.keys().fold(ways, |l, &k| lcm128(l, u128::from(k.max(1))));
        let held: u128 = u128::from(self.alloc_cpus) * l
            + self.shared_cpus.iter().map(|(&k, &c)| u128::from(c) * (l / u128::from(k.max(1)))).sum::<u128>();
        held + u128::from(cpus) * (l / ways) <= u128::from(self.cpus) * l
    }

    /// Holds `cpus` CPUs shared `ways` ways.
    pub fn hold_cpus(&mut self, cpus: u32, ways: u32) {
        if ways <= 1 {
            self.alloc_cpus = self.alloc_cpus.saturating_add(cpus);
        } else {
            let held = self.shared_cpus.entry(ways).or_default();
            *held = held.saturating_add(cpus);
        }
    }

    /// Gives back `cpus` CPUs held `ways` ways.
    pub fn release_cpus(&mut self, cpus: u32, ways: u32) {
        if ways <= 1 {
            self.alloc_cpus = self.alloc_cpus.saturating_sub(cpus);
        } else if let Some(held) = self.shared_cpus.get_mut(&ways) {
            *held = held.saturating_sub(cpus);
            if *held == 0 {
                self.shared_cpus.remove(&ways);
            }
        }
    }

    /// The CPUs its jobs use, counting a shared CPU once per its ways (rounded up, at most
    /// the node's): Slurm's `CPUAlloc`.
    pub fn cpus_in_use(&self) -> u32 {
        let shared: f64 = self.shared_cpus.iter().map(|(&k, &c)| f64::from(c) / f64::from(k.max(1))).sum();
        let used = f64::from(self.alloc_cpus) + shared;
        (used - 1e-9).ceil().clamp(0.0, f64::from(self.cpus)) as u32
    }

    /// No job holds any of its CPUs.
    pub fn cpus_idle(&self) -> bool {
        self.alloc_cpus == 0 && self.shared_cpus.is_empty()
    }
}

impl Partition {
    /// How many ways a job of this spec shares each of its CPUs here (1: it does not).
    pub fn cpu_ways(&self, spec: &JobSpec) -> u32 {
        if self.exclusive {
            return 1;
        }
        self.oversubscribe.ways(spec.oversubscribe, spec.exclusive)
    }

    /// Whether a job of this spec gets whole nodes here.
    pub fn whole_nodes(&self, spec: &JobSpec) -> bool {
        self.exclusive || (spec.exclusive && self.oversubscribe.honours_exclusive())
    }
}

fn lcm128(a: u128, b: u128) -> u128 {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(cpus: u32) -> Node {
        Node {
            name: "n".into(),
            cpus,
            mem_mb: 1000,
            gpus: Vec::new(),
            features: Vec::new(),
            admin: crate::NodeAdminState::Up,
            alloc_cpus: 0,
            alloc_mem_mb: 0,
            alloc_gpus: Default::default(),
            shared_cpus: Default::default(),
            jobs: Default::default(),
            agent_version: String::new(),
            registered_at: 0,
        }
    }

    #[test]
    fn a_node_holds_each_jobs_cpus_divided_by_its_ways() {
        let mut n = node(2);
        // Four 1-CPU jobs shared 2 ways fill 2 CPUs; a fifth does not fit.
        for _ in 0..4 {
            assert!(n.cpus_fit(1, 2));
            n.hold_cpus(1, 2);
        }
        assert!(!n.cpus_fit(1, 2));
        assert_eq!(n.cpus_in_use(), 2);
        n.release_cpus(1, 2);
        // Half a CPU is free: a job shared 3 ways (a third) fits, one not shared does not.
        assert!(n.cpus_fit(1, 3) && !n.cpus_fit(1, 1));
        n.hold_cpus(1, 3);
        assert_eq!(n.cpus_in_use(), 2);
        // 3/2 + 1/3 = 11/6: a sixth left, so no job of 1 CPU shared 4 ways (a quarter) fits.
        assert!(!n.cpus_fit(1, 4) && n.cpus_fit(1, 6));
        n.release_cpus(1, 2);
        n.release_cpus(2, 2);
        n.release_cpus(1, 3);
        assert!(n.cpus_idle() && n.cpus_fit(2, 1));
        assert_eq!(n.cpus_in_use(), 0);
    }

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
