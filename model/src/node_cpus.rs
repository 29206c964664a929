//! What a node's jobs hold of its CPUs when some share them ([`crate::oversubscribe`]), and how
//! many ways a partition makes a job share them.

use crate::oversubscribe::lcm128;
use crate::{JobSpec, Node, Partition};

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
            weight: 1,
            features_set: None,
            completing: Vec::new(),
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
}
