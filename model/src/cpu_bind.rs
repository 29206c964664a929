//! Task binding (`srun --cpu-bind`, Slurm's task/affinity): which of the job's CPUs on a node
//! each task of a step may run on. [`CpuBind::parse`] reads srun's option (srun, the leader and
//! the agent read the same text); [`CpuBind::cpus`] picks a task's CPUs among the job's.

use std::fmt;

/// What an agent that binds tasks advertises.
pub const CAPABILITY: &str = "cpu-bind";

/// The most CPU ids one `map_cpu`/`mask_cpu` list may name, and the highest id.
pub const MAX_LIST: usize = 1024;
pub const MAX_CPU: u32 = 16_383;

/// How tasks are bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Not bound: every task may run on every CPU of the job's.
    None,
    /// Task `i` on the node: the `i`-th CPU of the job's (Slurm's `rank`).
    Rank,
    /// Each task its own hardware threads (`cpus-per-task` of them), in order.
    Threads,
    /// Each task whole cores (enough for `cpus-per-task` threads), in order.
    Cores,
    /// Each task the sockets its cores are on.
    Sockets,
    /// Task `i`: the CPU `list[i % len]`.
    MapCpu(Vec<u32>),
    /// Task `i`: the CPUs of the mask `list[i % len]` (each mask a set of CPU ids).
    MaskCpu(Vec<Vec<u32>>),
}

/// `--cpu-bind`: its kind, and whether each task's binding is reported (`verbose`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuBind {
    pub kind: Kind,
    pub verbose: bool,
}

/// A CPU's place in the node: its socket (package) and core. CPUs with the same place are one
/// core's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub socket: u32,
    pub core: u32,
}

impl CpuBind {
    /// No binding.
    pub const NONE: CpuBind = CpuBind { kind: Kind::None, verbose: false };

    /// Slurm's syntax: `[quiet|verbose,]TYPE` where TYPE is `none`/`no`, `rank`, `threads`,
    /// `cores`, `sockets`, `ldoms` (as sockets), `map_cpu:ID,...`, `mask_cpu:MASK,...` (hex,
    /// `0x` optional); `q`/`v` abbreviate. `Ok(None)` for a type Slurm has and this cluster does
    /// not make (`map_ldom`, `mask_ldom`, `rank_ldom`, `boards`): the caller warns.
    pub fn parse(text: &str) -> Result<Option<CpuBind>, String> {
        if text.len() > 16 * MAX_LIST {
            return Err(format!("--cpu-bind: {} bytes is too long", text.len()));
        }
        if text.trim().is_empty() {
            return Ok(Some(CpuBind::NONE));
        }
        let mut bind = CpuBind::NONE;
        let mut kind: Option<Kind> = None;
        let mut unmade = false;
        let mut parts = text.split(',').peekable();
        while let Some(part) = parts.next() {
            let word = part.trim().to_ascii_lowercase();
            let set = |kind: &mut Option<Kind>, k: Kind| match kind {
                Some(_) => Err(format!("--cpu-bind={text}: more than one binding type")),
                None => {
                    *kind = Some(k);
                    Ok(())
                }
            };
            match word.as_str() {
                "q" | "quiet" => bind.verbose = false,
                "v" | "verbose" => bind.verbose = true,
                "none" | "no" => set(&mut kind, Kind::None)?,
                "rank" => set(&mut kind, Kind::Rank)?,
                "threads" | "thread" => set(&mut kind, Kind::Threads)?,
                "cores" | "core" => set(&mut kind, Kind::Cores)?,
                "sockets" | "socket" | "ldoms" | "ldom" => set(&mut kind, Kind::Sockets)?,
                "boards" | "board" | "rank_ldom" => unmade = true,
                w if w.starts_with("map_cpu:") || w.starts_with("mask_cpu:") => {
                    // The list runs to the end of the option: its own commas separate entries.
                    let mut items = vec![w.split_once(':').map_or("", |(_, l)| l).to_string()];
                    while let Some(next) = parts.peek() {
                        let n = next.trim().to_ascii_lowercase();
                        if matches!(n.as_str(), "q" | "quiet" | "v" | "verbose") {
                            break;
                        }
                        items.push(n);
                        parts.next();
                    }
                    let k = if w.starts_with("map_cpu:") {
                        Kind::MapCpu(items.iter().map(|i| cpu_id(text, i)).collect::<Result<_, _>>()?)
                    } else {
                        Kind::MaskCpu(items.iter().map(|i| mask(text, i)).collect::<Result<_, _>>()?)
                    };
                    if items.len() > MAX_LIST {
                        return Err(format!("--cpu-bind: {} entries; at most {MAX_LIST}", items.len()));
                    }
                    set(&mut kind, k)?;
                }
                w if w.starts_with("map_ldom:") || w.starts_with("mask_ldom:") => {
                    unmade = true;
                    while parts.peek().is_some_and(|n| !matches!(n.trim(), "q" | "quiet" | "v" | "verbose")) {
                        parts.next();
                    }
                }
                "" => return Err(format!("--cpu-bind={text}: an empty type")),
                w => {
                    return Err(format!(
                        "--cpu-bind={text}: unknown type '{w}' (none, rank, threads, cores, sockets, map_cpu:LIST, mask_cpu:LIST, with verbose or quiet)"
                    ))
                }
            }
        }
        if unmade {
            return Ok(None);
        }
        bind.kind = kind.unwrap_or(Kind::None);
        Ok(Some(bind))
    }

    /// Whether tasks are bound at all (or only their binding reported).
    pub fn binds(&self) -> bool {
        self.kind != Kind::None
    }

    /// The CPUs of task `local` (its index among the step's tasks on this node) with
    /// `cpus_per_task`, among the job's CPUs here (`allowed`, ascending, with each one's place).
    /// An id of a map or mask outside the job's CPUs is refused, naming them.
    pub fn cpus(&self, allowed: &[(u32, Place)], local: u32, cpus_per_task: u32) -> Result<Vec<u32>, String> {
        let n = allowed.len();
        let all = || allowed.iter().map(|(c, _)| *c).collect::<Vec<u32>>();
        if n == 0 {
            return Ok(Vec::new());
        }
        let per = cpus_per_task.max(1) as usize;
        let local = local as usize;
        let outside =
            |c: u32| format!("CPU {c} of --cpu-bind is not one of the job's CPUs on this node ({})", list_text(&all()));
        let mut out: Vec<u32> = match &self.kind {
            Kind::None => all(),
            Kind::Rank => vec![allowed[local % n].0],
            Kind::Threads => (0..per).map(|k| allowed[(local * per + k) % n].0).collect(),
            Kind::Cores | Kind::Sockets => {
                // The job's CPUs by core, in order of their first thread.
                let mut cores: Vec<(Place, Vec<u32>)> = Vec::new();
                for (cpu, place) in allowed {
                    match cores.iter_mut().find(|(p, _)| p == place) {
                        Some((_, cpus)) => cpus.push(*cpu),
                        None => cores.push((*place, vec![*cpu])),
                    }
                }
                let threads = cores[0].1.len().max(1);
                let want = per.div_ceil(threads);
                let mine: Vec<&(Place, Vec<u32>)> =
                    (0..want).map(|k| &cores[(local * want + k) % cores.len()]).collect();
                if self.kind == Kind::Cores {
                    mine.iter().flat_map(|(_, cpus)| cpus.iter().copied()).collect()
                } else {
                    let sockets: Vec<u32> = mine.iter().map(|(p, _)| p.socket).collect();
                    allowed.iter().filter(|(_, p)| sockets.contains(&p.socket)).map(|(c, _)| *c).collect()
                }
            }
            Kind::MapCpu(list) => {
                let c = list[local % list.len()];
                if !allowed.iter().any(|(a, _)| *a == c) {
                    return Err(outside(c));
                }
                vec![c]
            }
            Kind::MaskCpu(list) => {
                let m = &list[local % list.len()];
                if let Some(c) = m.iter().find(|c| !allowed.iter().any(|(a, _)| a == *c)) {
                    return Err(outside(*c));
                }
                m.clone()
            }
        };
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

fn cpu_id(text: &str, item: &str) -> Result<u32, String> {
    let item = item.trim();
    let parsed = match item.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => item.parse::<u32>().ok(),
    };
    parsed
        .filter(|c| *c <= MAX_CPU)
        .ok_or_else(|| format!("--cpu-bind={text}: '{item}' is not a CPU id (0 to {MAX_CPU})"))
}

/// A hex mask (`0x3`, `c`): the CPU ids of its set bits.
fn mask(text: &str, item: &str) -> Result<Vec<u32>, String> {
    let item = item.trim();
    let hex = item.strip_prefix("0x").unwrap_or(item);
    let bad = || format!("--cpu-bind={text}: '{item}' is not a CPU mask (hex, such as 0x3)");
    if hex.is_empty() || hex.len() > (MAX_CPU as usize + 1) / 4 {
        return Err(bad());
    }
    let mut cpus = Vec::new();
    for (i, ch) in hex.chars().rev().enumerate() {
        let nibble = ch.to_digit(16).ok_or_else(bad)?;
        cpus.extend((0..4).filter(|b| nibble & (1 << b) != 0).map(|b| i as u32 * 4 + b));
    }
    if cpus.is_empty() {
        return Err(format!("--cpu-bind={text}: the mask '{item}' has no CPU"));
    }
    Ok(cpus)
}

/// CPU ids as a list: `0-3,6`.
pub fn list_text(cpus: &[u32]) -> String {
    crate::parse::ranges(cpus)
}

/// A cpuset list (`0-3,6`, as cgroups write them): its ids, ascending; `None` if it is not one.
pub fn parse_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        if a > b || b > MAX_CPU {
            return None;
        }
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// CPU ids as a hex mask, as Slurm's verbose binding reports it: `0x5`.
pub fn mask_text(cpus: &[u32]) -> String {
    let Some(top) = cpus.iter().max() else { return "0x0".into() };
    let mut nibbles = vec![0u8; *top as usize / 4 + 1];
    for c in cpus {
        nibbles[*c as usize / 4] |= 1 << (c % 4);
    }
    let digits: String = nibbles.iter().rev().map(|n| char::from_digit(u32::from(*n), 16).unwrap_or('0')).collect();
    format!("0x{digits}")
}

impl fmt::Display for CpuBind {
    /// The canonical text (what the launch carries): `verbose,cores`, `map_cpu:0,2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.verbose {
            f.write_str("verbose,")?;
        }
        match &self.kind {
            Kind::None => f.write_str("none"),
            Kind::Rank => f.write_str("rank"),
            Kind::Threads => f.write_str("threads"),
            Kind::Cores => f.write_str("cores"),
            Kind::Sockets => f.write_str("sockets"),
            Kind::MapCpu(l) => write!(f, "map_cpu:{}", l.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
            Kind::MaskCpu(l) => write!(f, "mask_cpu:{}", l.iter().map(|m| mask_text(m)).collect::<Vec<_>>().join(",")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(text: &str) -> CpuBind {
        CpuBind::parse(text).unwrap().unwrap()
    }

    /// `n` CPUs, `threads` per core, two sockets.
    fn node(cpus: &[u32], threads: u32, per_socket: u32) -> Vec<(u32, Place)> {
        cpus.iter().map(|c| (*c, Place { socket: c / per_socket, core: c / threads })).collect()
    }

    #[test]
    fn srun_options_read_as_slurm_writes_them() {
        assert_eq!(bind("q"), CpuBind::NONE);
        // What a step without the option carries.
        assert_eq!(bind(""), CpuBind::NONE);
        assert_eq!(bind("none"), CpuBind::NONE);
        assert_eq!(bind("verbose,cores"), CpuBind { kind: Kind::Cores, verbose: true });
        assert_eq!(bind("cores,v").to_string(), "verbose,cores");
        assert_eq!(bind("map_cpu:0,2,0x3").kind, Kind::MapCpu(vec![0, 2, 3]));
        assert_eq!(bind("v,mask_cpu:0x3,c").kind, Kind::MaskCpu(vec![vec![0, 1], vec![2, 3]]));
        assert_eq!(bind("mask_cpu:0x3,c,verbose").to_string(), "verbose,mask_cpu:0x3,0xc");
        assert_eq!(CpuBind::parse("map_ldom:0,1").unwrap(), None);
        assert_eq!(CpuBind::parse("boards").unwrap(), None);
        assert!(CpuBind::parse("cores,threads").unwrap_err().contains("more than one"));
        assert!(CpuBind::parse("bogus").unwrap_err().contains("'bogus'"));
        assert!(CpuBind::parse("map_cpu:x").unwrap_err().contains("'x'"));
        assert!(CpuBind::parse("map_cpu:99999").unwrap_err().contains("99999"));
        assert!(CpuBind::parse("mask_cpu:0x0").unwrap_err().contains("no CPU"));
        assert!(CpuBind::parse(&"f".repeat(20_000)).is_err());
        // What it prints is what it reads back.
        for t in ["verbose,rank", "threads", "sockets", "map_cpu:4,5", "mask_cpu:0x30,0x1"] {
            assert_eq!(bind(&bind(t).to_string()), bind(t));
        }
    }

    #[test]
    fn each_task_gets_its_own_cpus_among_the_jobs() {
        // The job has CPUs 2-5 of a node with 2 threads a core (cores {2,3}, {4,5}).
        let job = node(&[2, 3, 4, 5], 2, 4);
        assert_eq!(bind("threads").cpus(&job, 0, 1).unwrap(), [2]);
        assert_eq!(bind("threads").cpus(&job, 3, 1).unwrap(), [5]);
        assert_eq!(bind("threads").cpus(&job, 1, 2).unwrap(), [4, 5]);
        assert_eq!(bind("cores").cpus(&job, 0, 1).unwrap(), [2, 3]);
        assert_eq!(bind("cores").cpus(&job, 1, 1).unwrap(), [4, 5]);
        // More tasks than cores (overcommitted): they wrap round.
        assert_eq!(bind("cores").cpus(&job, 2, 1).unwrap(), [2, 3]);
        assert_eq!(bind("rank").cpus(&job, 1, 1).unwrap(), [3]);
        assert_eq!(bind("none").cpus(&job, 1, 1).unwrap(), [2, 3, 4, 5]);
        assert_eq!(bind("map_cpu:5,2").cpus(&job, 2, 1).unwrap(), [5]);
        assert_eq!(bind("mask_cpu:0x30,0xc").cpus(&job, 1, 1).unwrap(), [2, 3]);
        let e = bind("map_cpu:0").cpus(&job, 0, 1).unwrap_err();
        assert!(e.contains("CPU 0") && e.contains("(2-5)"), "{e}");
        // Without SMT, a task of 2 CPUs gets 2 cores; sockets widen to the whole socket.
        let flat = node(&[0, 1, 2, 3, 4, 5, 6, 7], 1, 4);
        assert_eq!(bind("cores").cpus(&flat, 1, 2).unwrap(), [2, 3]);
        assert_eq!(bind("sockets").cpus(&flat, 2, 2).unwrap(), [4, 5, 6, 7]);
        assert_eq!(bind("cores").cpus(&[], 0, 1).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn lists_and_masks_print_and_read() {
        assert_eq!(list_text(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(parse_list("0-3,6\n"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_list(""), Some(vec![]));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("0-99999"), None);
        assert_eq!(mask_text(&[0, 2]), "0x5");
        assert_eq!(mask_text(&[4, 5]), "0x30");
    }
}
