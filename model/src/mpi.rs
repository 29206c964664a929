//! The process-management interfaces a step's tasks may get (`srun --mpi`, `MpiDefault`), and
//! what PMI tells every task of a step's layout.

use std::fmt;

/// `srun --mpi=TYPE`, and the controllers' `mpi_default` (read from its name, checked as it is
/// read).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Mpi {
    /// No PMI: the tasks start as they are (`mpirun`'s own daemons, non-MPI programs).
    #[default]
    None,
    /// PMI-2 (and PMI-1, which the same socket serves) on `PMI_FD`: MPICH, Intel MPI, Open MPI's
    /// `s1`/`s2`.
    Pmi2,
    /// PMIx, served by OpenPMIx's server library for each step on each node: Open MPI 4 and 5,
    /// and any PMIx client.
    Pmix,
}

/// What `srun --mpi=list` prints, and what `--mpi` accepts.
pub const OFFERED: &[&str] = &["none", "pmi2", "pmix"];

/// The variable a `--mpi=pmix` step's launch carries its secret in (hexadecimal, chosen by the
/// leader for each step, the same on every node): the step's PMIx namespace ends with it, so no
/// process of another user that reaches a node's PMIx server can name the step. The agent takes
/// it out of the tasks' environment.
pub const PMIX_SECRET_ENV: &str = "QUORUM_PMIX_SECRET";

/// The PMIx versions `--mpi` also names (Slurm's `pmix_vN` plugins): one server serves them all.
pub const PMIX_VERSIONS: &[&str] = &["pmix_v2", "pmix_v3", "pmix_v4", "pmix_v5"];

impl Mpi {
    /// `none`, `pmi2` (and Slurm's `pmi1`/`pmi`, which the PMI-2 server also serves), `pmix`
    /// (and `pmix_v2` to `pmix_v5`). Slurm's other plugins are refused by name.
    pub fn parse(text: &str) -> Result<Mpi, String> {
        if text.len() > 32 {
            return Err(format!(
                "--mpi: unknown MPI type ({} bytes); this cluster offers {}",
                text.len(),
                OFFERED.join(", ")
            ));
        }
        match text.trim().to_ascii_lowercase().as_str() {
            "none" | "" => Ok(Mpi::None),
            "pmi2" | "pmi1" | "pmi" => Ok(Mpi::Pmi2),
            "pmix" => Ok(Mpi::Pmix),
            v if PMIX_VERSIONS.contains(&v) => Ok(Mpi::Pmix),
            other => Err(format!("--mpi={other}: unknown MPI type; this cluster offers {}", OFFERED.join(", "))),
        }
    }

    /// The name a step launch carries (and an agent that serves it advertises): empty for none.
    pub const fn wire(self) -> &'static str {
        match self {
            Mpi::None => "",
            Mpi::Pmi2 => "pmi2",
            Mpi::Pmix => "pmix",
        }
    }
}

impl TryFrom<String> for Mpi {
    type Error = String;

    fn try_from(text: String) -> Result<Mpi, String> {
        Mpi::parse(&text)
    }
}

impl From<Mpi> for String {
    fn from(m: Mpi) -> String {
        m.to_string()
    }
}

impl fmt::Display for Mpi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mpi::None => "none",
            Mpi::Pmi2 => "pmi2",
            Mpi::Pmix => "pmix",
        })
    }
}

/// PMI's `PMI_process_mapping` of a step whose nodes run `node_tasks[i]` tasks each, numbered
/// in blocks or cyclic ([`crate::step::task_ranks`]): `(vector,(first node,nodes,tasks each),...)`,
/// each triple a run of consecutive nodes taking the same number of consecutive ranks, as MPICH
/// reads it to find which ranks share a node. A list that repeats (an even cyclic layout: one
/// rank per node, round after round) is written once: readers repeat it until every rank has
/// its node.
pub fn process_mapping(node_tasks: &[u32], cyclic: bool) -> String {
    // Runs of consecutive ranks on one node: (node, ranks).
    let ranks = crate::step::task_ranks(node_tasks, cyclic);
    let mut node_of: Vec<(u32, usize)> =
        ranks.iter().enumerate().flat_map(|(n, r)| r.iter().map(move |&r| (r, n))).collect();
    node_of.sort_unstable();
    let mut runs: Vec<(usize, u32)> = Vec::new();
    for (_, n) in node_of {
        match runs.last_mut() {
            Some((node, count)) if *node == n => *count += 1,
            _ => runs.push((n, 1)),
        }
    }
    // Consecutive nodes with the same run: (first node, nodes, ranks each).
    let mut triples: Vec<(usize, usize, u32)> = Vec::new();
    for (n, count) in runs {
        match triples.last_mut() {
            Some((first, nodes, each)) if *each == count && *first + *nodes == n => *nodes += 1,
            _ => triples.push((n, 1, count)),
        }
    }
    let period = (1..=triples.len())
        .find(|&p| triples.len().is_multiple_of(p) && triples.chunks(p).all(|c| c == &triples[..p]))
        .unwrap_or(0);
    let mut out = String::from("(vector");
    for (first, nodes, each) in &triples[..period] {
        out.push_str(&format!(",({first},{nodes},{each})"));
    }
    out.push(')');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_groups_runs_of_nodes_with_the_same_count() {
        assert_eq!(process_mapping(&[2, 2], false), "(vector,(0,2,2))");
        assert_eq!(process_mapping(&[3, 3, 1], false), "(vector,(0,2,3),(2,1,1))");
        assert_eq!(process_mapping(&[1, 2, 1], false), "(vector,(0,1,1),(1,1,2),(2,1,1))");
        assert_eq!(process_mapping(&[], false), "(vector)");
        // Cyclic: one rank per node a round, written once when every round is the same.
        assert_eq!(process_mapping(&[2, 2], true), "(vector,(0,2,1))");
        assert_eq!(process_mapping(&[3, 3, 3], true), "(vector,(0,3,1))");
        assert_eq!(process_mapping(&[2, 1], true), "(vector,(0,2,1),(0,1,1))");
        assert_eq!(process_mapping(&[1, 1], true), "(vector,(0,2,1))");
    }

    #[test]
    fn types_are_parsed_and_unknown_ones_named() {
        assert_eq!(Mpi::parse("pmi2"), Ok(Mpi::Pmi2));
        assert_eq!(Mpi::parse("NONE"), Ok(Mpi::None));
        assert_eq!(Mpi::parse("pmix"), Ok(Mpi::Pmix));
        assert_eq!(Mpi::parse("pmix_v4"), Ok(Mpi::Pmix));
        assert_eq!(Mpi::parse("pmix_v4").map(Mpi::wire), Ok("pmix"));
        assert!(Mpi::parse("cray_shasta").unwrap_err().contains("unknown MPI type"));
        let long = Mpi::parse(&"x".repeat(1 << 20)).unwrap_err();
        assert!(long.len() < 200 && long.contains("1048576 bytes"), "{long}");
    }
}
