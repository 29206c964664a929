//! Job steps: what `srun` asks for inside a job's allocation, where its tasks go
//! ([`layout`], pure, applied the same on every replica), and what is recorded of it.
//!
//! Steps get dedicated CPUs (and the GPUs they ask for with `--gpus-per-task`), as Slurm's
//! steps do by default: a step that would need CPUs other running steps hold waits for them
//! ([`StepRefusal::Busy`]) unless it shares them (`--overlap`). A step the allocation can never
//! hold is refused at once ([`StepRefusal::Never`]), naming what it lacks.

use serde::{Deserialize, Serialize};

/// Milliseconds since the epoch (as `crate::Millis`).
type Millis = u64;

/// What a job holds on one node, as [`layout`] reads it.
#[derive(Clone, Copy, Debug)]
pub struct NodeShare<'a> {
    pub node: &'a str,
    pub cpus: u32,
    pub gpus: &'a [u32],
}

/// At most this many tasks in one step.
pub const MAX_STEP_TASKS: u32 = 65_536;
/// At most this many steps of one job run at once.
pub const MAX_RUNNING_STEPS: usize = 256;
/// Ended steps kept with a running job (the newest); the job history keeps them all.
pub const KEPT_ENDED_STEPS: usize = 64;

/// What `srun` asks of a step. A count of 0 is "not given".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRequest {
    /// What it runs, for listings: the program's name.
    pub name: String,
    /// `-N`: nodes.
    pub nodes: u32,
    /// `-n`: tasks.
    pub ntasks: u32,
    pub ntasks_per_node: u32,
    /// `-c` (1 when 0).
    pub cpus_per_task: u32,
    pub gpus_per_task: u32,
    /// `-w`: nodes the step must use, each in the job's allocation.
    pub nodelist: Vec<String>,
    /// `--overlap`: shares CPUs and GPUs with the job's other steps instead of waiting for them.
    pub overlap: bool,
    /// `--het-group`: in a heterogeneous job, the components whose nodes the step runs on
    /// (empty: component 0). From feature level 25.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub het_groups: Vec<u32>,
    /// `-O`/`--overcommit`: more tasks than CPUs; on each node the step needs one task's CPUs
    /// and holds what is free of what its tasks would need. From feature level 29.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overcommit: bool,
    /// `--distribution=cyclic`: tasks numbered round-robin over the step's nodes (rank 0 on the
    /// first, rank 1 on the second, ...) instead of in blocks; each node runs as many as it
    /// would in blocks. From feature level 31.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cyclic: bool,
}

/// The step's share of one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepNode {
    pub node: String,
    /// Its first task here: with the block distribution its tasks are `first_task`,
    /// `first_task + 1`, ...; with the cyclic one, see [`task_ranks`].
    pub first_task: u32,
    pub tasks: u32,
    /// CPUs it holds here (`tasks × cpus_per_task`).
    pub cpus: u32,
    /// GPUs its tasks see here, `gpus_per_task` each in task order; without `--gpus-per-task`,
    /// every GPU the job has on the node, shared by all its tasks (as Slurm gives a step all of
    /// the job's GRES by default).
    pub gpus: Vec<u32>,
}

impl StepNode {
    /// The GPUs the node's `local`-th task (0, 1, ... in rank order) sees.
    pub fn task_gpus(&self, local: u32, gpus_per_task: u32) -> &[u32] {
        if gpus_per_task == 0 {
            return &self.gpus;
        }
        let local = (local * gpus_per_task) as usize;
        self.gpus.get(local..local + gpus_per_task as usize).unwrap_or(&[])
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepState {
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl StepState {
    pub fn name(self) -> &'static str {
        match self {
            StepState::Running => "RUNNING",
            StepState::Completed => "COMPLETED",
            StepState::Failed => "FAILED",
            StepState::Cancelled => "CANCELLED",
        }
    }
}

/// Where a leader launched a step before its start was recorded: the id it gave it and its nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub id: u32,
    pub nodes: Vec<StepNode>,
}

/// A step of a job, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// 0, 1, 2, ... within the job (`<job>.<id>`).
    pub id: u32,
    pub name: String,
    pub nodes: Vec<StepNode>,
    pub ntasks: u32,
    pub cpus_per_task: u32,
    pub gpus_per_task: u32,
    pub overlap: bool,
    pub state: StepState,
    pub start: Millis,
    pub end: Option<Millis>,
    /// The highest exit code of its tasks, and the signal that killed one, if any.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// What its tasks used, summed over them (the largest resident set of one), as each node's
    /// agent measured them when they ended (from feature level 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::usage::JobUsage>,
    /// Its tasks numbered round-robin over its nodes (`--distribution=cyclic`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cyclic: bool,
}

impl Step {
    /// The step's nodes in order.
    pub fn node_names(&self) -> Vec<&str> {
        self.nodes.iter().map(|n| n.node.as_str()).collect()
    }

    /// The tasks on each of its nodes, in node order.
    pub fn ranks(&self) -> Vec<Vec<u32>> {
        let counts: Vec<u32> = self.nodes.iter().map(|n| n.tasks).collect();
        task_ranks(&counts, self.cyclic)
    }

    /// `SLURM_STEP_TASKS_PER_NODE` / `SLURM_TASKS_PER_NODE` as Slurm writes it: `2(x3)`, `3,2`.
    pub fn tasks_per_node(&self) -> String {
        run_lengths(self.nodes.iter().map(|n| n.tasks))
    }
}

/// The tasks each node runs, given how many (`counts`, in node order): in blocks (node 0 takes
/// `0..counts[0]`, node 1 the next, ...) or cyclic (task 0 on node 0, task 1 on node 1, ...,
/// round after round, a node leaving the rounds once it has its count), as Slurm's
/// `--distribution=block|cyclic` number them.
pub fn task_ranks(counts: &[u32], cyclic: bool) -> Vec<Vec<u32>> {
    let mut ranks: Vec<Vec<u32>> = counts.iter().map(|&c| Vec::with_capacity(c as usize)).collect();
    let mut next = 0u32;
    if !cyclic {
        for (here, &c) in ranks.iter_mut().zip(counts) {
            here.extend(next..next.saturating_add(c));
            next = next.saturating_add(c);
        }
        return ranks;
    }
    let mut open: Vec<usize> = (0..counts.len()).filter(|&i| counts[i] > 0).collect();
    let mut round = 0;
    while !open.is_empty() {
        for &i in &open {
            ranks[i].push(next);
            next = next.saturating_add(1);
        }
        round += 1;
        open.retain(|&i| counts[i] > round);
    }
    ranks
}

/// Counts per node as Slurm writes them: runs of equal counts as `N(xK)`, e.g. `3,2(x2)`.
pub fn run_lengths(counts: impl IntoIterator<Item = u32>) -> String {
    let mut parts: Vec<(u32, u32)> = Vec::new();
    for count in counts {
        match parts.last_mut() {
            Some((c, times)) if *c == count => *times += 1,
            _ => parts.push((count, 1)),
        }
    }
    let text: Vec<String> =
        parts.into_iter().map(|(c, times)| if times == 1 { c.to_string() } else { format!("{c}(x{times})") }).collect();
    text.join(",")
}

/// `ntasks` spread over `nodes` as evenly as they go, the first nodes taking one more, as
/// `SLURM_TASKS_PER_NODE` writes it: `2(x3)`, `3,2(x2)`.
pub fn tasks_per_node(ntasks: u32, nodes: u32) -> String {
    let nodes = nodes.max(1);
    let (base, extra) = (ntasks / nodes, ntasks % nodes);
    run_lengths((0..nodes).map(|i| base + u32::from(i < extra)))
}

/// `--distribution` (`-m`) of srun, sbatch and salloc, Slurm's `NODES[:SOCKETS[:CORES]][,Pack|NoPack]`: whether tasks are
/// numbered cyclic over the nodes, and a warning for what is accepted but not honoured. What
/// Slurm would refuse is refused.
pub fn parse_distribution(text: &str) -> Result<(bool, Option<String>), String> {
    let invalid = |why: &str| format!("invalid --distribution '{text}': {why}");
    let (levels, pack) = match text.split_once(',') {
        Some((levels, pack)) => (levels, Some(pack)),
        None => (text, None),
    };
    let mut parts = levels.split(':');
    let nodes = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let within: Vec<String> = parts.map(|p| p.trim().to_ascii_lowercase()).collect();
    let mut unhonoured = Vec::new();
    let cyclic = match nodes.as_str() {
        "block" | "*" => false,
        "cyclic" => true,
        "arbitrary" => {
            unhonoured.push("arbitrary (tasks are numbered in blocks)");
            false
        }
        p if p.strip_prefix("plane=").is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n > 0)) => {
            unhonoured.push("plane (tasks are numbered in blocks)");
            false
        }
        _ => return Err(invalid("the first level is block, cyclic, plane=SIZE, arbitrary or *")),
    };
    if within.len() > 2 {
        return Err(invalid("at most three levels, NODES:SOCKETS:CORES"));
    }
    for level in &within {
        if !matches!(level.as_str(), "block" | "cyclic" | "fcyclic" | "*") {
            return Err(invalid("the second and third levels are block, cyclic, fcyclic or *"));
        }
    }
    if within.iter().any(|l| l != "*") {
        unhonoured.push("the levels within a node (tasks are bound to CPUs as --cpu-bind says)");
    }
    match pack.map(|p| p.trim().to_ascii_lowercase()) {
        None => {}
        // Steps spread their tasks as evenly as they go already.
        Some(p) if p == "nopack" => {}
        Some(p) if p == "pack" => unhonoured.push("Pack (tasks are spread over the step's nodes evenly)"),
        Some(_) => return Err(invalid("after ',' comes Pack or NoPack")),
    }
    let warning = (!unhonoured.is_empty())
        .then(|| format!("--distribution={text}: {} accepted but not honoured", unhonoured.join("; ")));
    Ok((cyclic, warning))
}

/// Why a step cannot start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum StepRefusal {
    /// The job's allocation can never hold it: `srun` fails at once.
    #[error("{0}")]
    Never(String),
    /// It fits once running steps end: `srun` waits, as Slurm's does.
    #[error("{0}")]
    Busy(String),
}

/// Where a step's tasks go in `allocation`, given the job's `running` steps; the tasks are
/// numbered in node order (block distribution), the first nodes taking one more when they do
/// not divide evenly.
pub fn layout(shares: &[NodeShare], running: &[Step], req: &StepRequest) -> Result<Vec<StepNode>, StepRefusal> {
    let never = |s: String| Err(StepRefusal::Never(s));
    let names: Vec<&str> = shares.iter().map(|n| n.node).collect();
    let nodelist = crate::hostlist::compress(&names);
    for w in &req.nodelist {
        if !names.contains(&w.as_str()) {
            return never(format!("node {w} is not in the job's allocation ({})", nodelist));
        }
    }
    // The nodes it may use, those it must use first.
    let mut candidates: Vec<usize> =
        (0..shares.len()).filter(|&i| req.nodelist.contains(&names[i].to_string())).collect();
    let required = candidates.len();
    candidates.extend((0..shares.len()).filter(|&i| !req.nodelist.contains(&names[i].to_string())));
    let have = shares.len() as u32;
    if req.nodes > have {
        return never(format!("it asks for {} nodes; the job has {have} ({})", req.nodes, nodelist));
    }
    let wanted_nodes = match (req.nodes, required) {
        (0, 0) => None,
        (0, r) => Some(r as u32),
        (n, r) if (n as usize) < r => {
            return never(format!("it asks for {n} nodes but names {r} with --nodelist"));
        }
        (n, _) => Some(n),
    };
    let span = wanted_nodes.unwrap_or(have);
    let ntasks = match (req.ntasks, req.ntasks_per_node) {
        (0, 0) => span,
        (0, per) => span.saturating_mul(per),
        (n, _) => n,
    };
    if ntasks == 0 || ntasks > MAX_STEP_TASKS {
        return never(format!("{ntasks} tasks: a step runs 1 to {MAX_STEP_TASKS}"));
    }
    let nodes = match wanted_nodes {
        Some(n) => n,
        None if req.ntasks_per_node > 0 => ntasks.div_ceil(req.ntasks_per_node).min(have),
        None => ntasks.min(have),
    };
    if ntasks < nodes {
        return never(format!("{ntasks} tasks cannot spread over {nodes} nodes"));
    }
    // Tasks per node, in order.
    let counts: Vec<u32> = if req.ntasks_per_node > 0 {
        if ntasks > nodes.saturating_mul(req.ntasks_per_node) {
            return never(format!("{ntasks} tasks do not fit {nodes} nodes at {} tasks per node", req.ntasks_per_node));
        }
        let mut left = ntasks;
        (0..nodes)
            .map(|i| {
                // Each node at least one, the first ones full.
                let rest = nodes - i - 1;
                let here = req.ntasks_per_node.min(left - rest);
                left -= here;
                here
            })
            .collect()
    } else {
        let (base, extra) = (ntasks / nodes, ntasks % nodes);
        (0..nodes).map(|i| base + u32::from(i < extra)).collect()
    };
    let cpt = req.cpus_per_task.max(1);
    let gpt = req.gpus_per_task;
    let need = |tasks: u32| (u64::from(tasks) * u64::from(cpt), u64::from(tasks) * u64::from(gpt));
    // The CPUs it takes on a node with `have` of them: its tasks' own, or overcommitted, one
    // task's at least and what its tasks would need at most.
    let want = |tasks: u32, have: u64| {
        let (c, _) = need(tasks);
        if req.overcommit {
            c.min(have).max(u64::from(cpt))
        } else {
            c
        }
    };

    // Never: on the allocation as a whole, ignoring other steps.
    let total = |i: usize| {
        let a = &shares[i];
        (u64::from(a.cpus), a.gpus.len() as u64)
    };
    if let Err(count) = place(&counts, &candidates, required, |i, tasks| {
        let (_, g) = need(tasks);
        let (tc, tg) = total(i);
        want(tasks, tc) <= tc && g <= tg
    }) {
        let (c, g) = need(count);
        let most = shares.iter().map(|a| a.cpus).max().unwrap_or(0);
        let most_gpus = shares.iter().map(|a| a.gpus.len()).max().unwrap_or(0);
        let what = if g > most_gpus as u64 {
            format!("{g} GPUs on a node ({count} tasks × {gpt}); the job has at most {most_gpus} on one")
        } else {
            format!("{c} CPUs on a node ({count} tasks × {cpt}); the job has at most {most} on one")
        };
        return never(format!("it needs {what} ({})", nodelist));
    }

    // Busy: what other running steps hold (unless this one overlaps them).
    let held = |i: usize| -> (u64, Vec<u32>) {
        let name = names[i];
        let mut cpus = 0u64;
        let mut gpus = Vec::new();
        for s in running.iter().filter(|s| s.state == StepState::Running && !s.overlap) {
            for n in s.nodes.iter().filter(|n| n.node == name) {
                cpus += u64::from(n.cpus);
                if s.gpus_per_task > 0 {
                    gpus.extend(&n.gpus);
                }
            }
        }
        (cpus, gpus)
    };
    let free = |i: usize| -> (u64, Vec<u32>) {
        let a = &shares[i];
        if req.overlap {
            return (u64::from(a.cpus), a.gpus.to_vec());
        }
        let (cpus, gpus) = held(i);
        (u64::from(a.cpus).saturating_sub(cpus), a.gpus.iter().copied().filter(|g| !gpus.contains(g)).collect())
    };
    let placed = place(&counts, &candidates, required, |i, tasks| {
        let (_, g) = need(tasks);
        let (fc, fg) = free(i);
        want(tasks, fc) <= fc && g <= fg.len() as u64
    })
    .map_err(|count| {
        let (c, g) = need(count);
        StepRefusal::Busy(format!(
            "{c} CPUs{} on a node are held by the job's other steps",
            if g > 0 { format!(" and {g} GPUs") } else { String::new() }
        ))
    })?;
    let ranks = task_ranks(&counts, req.cyclic);
    Ok(placed
        .into_iter()
        .zip(&counts)
        .zip(&ranks)
        .map(|((i, &tasks), ranks)| {
            let c = want(tasks, free(i).0);
            let gpus = if gpt == 0 {
                shares[i].gpus.to_vec()
            } else {
                free(i).1.into_iter().take((tasks * gpt) as usize).collect()
            };
            let first_task = ranks.first().copied().unwrap_or(0);
            StepNode { node: names[i].to_string(), first_task, tasks, cpus: c as u32, gpus }
        })
        .collect())
}

/// Puts each count on its own candidate node, in order, the `required` first candidates all
/// used: the node indexes chosen, or the first count that found no node.
fn place(
    counts: &[u32],
    candidates: &[usize],
    required: usize,
    fits: impl Fn(usize, u32) -> bool,
) -> Result<Vec<usize>, u32> {
    let mut chosen = Vec::with_capacity(counts.len());
    let mut next = 0;
    for (k, &count) in counts.iter().enumerate() {
        // A required node takes the count in turn; the rest may skip nodes that cannot hold it.
        if k < required {
            if !fits(candidates[k], count) {
                return Err(count);
            }
            chosen.push(candidates[k]);
            next = k + 1;
            continue;
        }
        next = next.max(required);
        loop {
            let Some(&i) = candidates.get(next) else { return Err(count) };
            next += 1;
            if fits(i, count) {
                chosen.push(i);
                break;
            }
        }
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where a step's tasks went on a node: (node, first task, tasks, GPUs).
    type Placed = (String, u32, u32, Vec<u32>);

    /// A job's allocation: (node, CPUs, GPUs) each.
    struct Alloc(Vec<(String, u32, Vec<u32>)>);

    impl Alloc {
        fn shares(&self) -> Vec<NodeShare<'_>> {
            self.0.iter().map(|(node, cpus, gpus)| NodeShare { node, cpus: *cpus, gpus }).collect()
        }
    }

    fn allocation(nodes: &[(&str, u32, &[u32])]) -> Alloc {
        Alloc(nodes.iter().map(|(n, cpus, gpus)| (n.to_string(), *cpus, gpus.to_vec())).collect())
    }

    fn shape(nodes: &[StepNode]) -> Vec<(&str, u32, u32, Vec<u32>)> {
        nodes.iter().map(|n| (n.node.as_str(), n.first_task, n.tasks, n.gpus.clone())).collect()
    }

    fn step(id: u32, nodes: Vec<StepNode>, gpus_per_task: u32, overlap: bool) -> Step {
        Step {
            id,
            name: "x".into(),
            ntasks: nodes.iter().map(|n| n.tasks).sum(),
            nodes,
            cpus_per_task: 1,
            gpus_per_task,
            overlap,
            state: StepState::Running,
            start: 0,
            end: None,
            exit_code: None,
            signal: None,
            usage: None,
            cyclic: false,
        }
    }

    #[test]
    fn tasks_spread_over_the_allocation_as_slurm_spreads_them() {
        let a = allocation(&[("n1", 4, &[0, 1]), ("n2", 4, &[2, 3])]);
        let req = |f: fn(&mut StepRequest)| {
            let mut r = StepRequest::default();
            f(&mut r);
            layout(&a.shares(), &[], &r)
                .map(|n| shape(&n).into_iter().map(|(n, f, t, g)| (n.to_string(), f, t, g)).collect::<Vec<_>>())
        };
        let s = |v: &[(&str, u32, u32, &[u32])]| {
            Ok(v.iter().map(|(n, f, t, g)| (n.to_string(), *f, *t, g.to_vec())).collect::<Vec<_>>())
        };
        // One task per node by default, every GPU of the node shared.
        assert_eq!(req(|_| {}), s(&[("n1", 0, 1, &[0, 1]), ("n2", 1, 1, &[2, 3])]));
        assert_eq!(req(|r| r.ntasks = 1), s(&[("n1", 0, 1, &[0, 1])]));
        assert_eq!(req(|r| r.ntasks = 3), s(&[("n1", 0, 2, &[0, 1]), ("n2", 2, 1, &[2, 3])]));
        assert_eq!(
            req(|r| {
                r.ntasks_per_node = 2;
                r.gpus_per_task = 1
            }),
            s(&[("n1", 0, 2, &[0, 1]), ("n2", 2, 2, &[2, 3])])
        );
        assert_eq!(
            req(|r| {
                r.ntasks = 3;
                r.ntasks_per_node = 2
            }),
            s(&[("n1", 0, 2, &[0, 1]), ("n2", 2, 1, &[2, 3])])
        );
        assert_eq!(req(|r| r.nodelist = vec!["n2".into()]), s(&[("n2", 0, 1, &[2, 3])]));
        assert_eq!(
            req(|r| {
                r.nodes = 1;
                r.ntasks = 4
            }),
            s(&[("n1", 0, 4, &[0, 1])])
        );
        // What the allocation can never hold, named.
        let never = |r: Result<Vec<Placed>, StepRefusal>, what: &str| match r {
            Err(StepRefusal::Never(m)) => assert!(m.contains(what), "{m}"),
            other => panic!("expected a refusal naming {what}, got {other:?}"),
        };
        never(req(|r| r.nodes = 3), "asks for 3 nodes; the job has 2");
        never(req(|r| r.ntasks = 9), "5 CPUs on a node");
        never(
            req(|r| {
                r.ntasks_per_node = 2;
                r.gpus_per_task = 2
            }),
            "4 GPUs on a node",
        );
        never(req(|r| r.nodelist = vec!["n9".into()]), "n9 is not in the job's allocation");
        never(
            req(|r| {
                r.nodes = 2;
                r.ntasks = 1
            }),
            "cannot spread",
        );
        never(req(|r| r.ntasks = MAX_STEP_TASKS + 1), "a step runs 1 to");
        // --overcommit: 16 tasks on 2 nodes of 4 CPUs, each node's CPUs held once.
        let over = StepRequest { ntasks: 16, overcommit: true, ..Default::default() };
        let nodes = layout(&a.shares(), &[], &over).unwrap();
        assert_eq!(nodes.iter().map(|n| (n.tasks, n.cpus)).collect::<Vec<_>>(), [(8, 4), (8, 4)]);
        // It needs one task's CPUs free on a node, and takes what is free up to its tasks' need.
        let busy =
            step(1, vec![StepNode { node: "n1".into(), first_task: 0, tasks: 3, cpus: 3, gpus: vec![] }], 0, false);
        let one =
            StepRequest { ntasks: 5, nodes: 1, nodelist: vec!["n1".into()], overcommit: true, ..Default::default() };
        assert_eq!(layout(&a.shares(), std::slice::from_ref(&busy), &one).unwrap()[0].cpus, 1);
        let wide = StepRequest { cpus_per_task: 2, ..one };
        assert!(matches!(layout(&a.shares(), &[busy], &wide), Err(StepRefusal::Busy(_))));
    }

    #[test]
    fn steps_hold_their_cpus_and_gpus_until_they_end_unless_they_overlap() {
        let a = allocation(&[("n1", 2, &[0, 1]), ("n2", 2, &[2, 3])]);
        let two = StepRequest { ntasks_per_node: 2, gpus_per_task: 1, ..Default::default() };
        let first = layout(&a.shares(), &[], &two).unwrap();
        let running = vec![step(0, first.clone(), 1, false)];
        assert!(matches!(layout(&a.shares(), &running, &two), Err(StepRefusal::Busy(_))));
        assert!(matches!(
            layout(&a.shares(), &running, &StepRequest { ntasks: 1, ..Default::default() }),
            Err(StepRefusal::Busy(_))
        ));
        let shared = layout(&a.shares(), &running, &StepRequest { overlap: true, ..two.clone() }).unwrap();
        assert_eq!(shape(&shared), shape(&first));
        // A half-size step fits beside a half-size one, on other CPUs and GPUs.
        let half = StepRequest { ntasks: 2, gpus_per_task: 1, ..Default::default() };
        let one = layout(&a.shares(), &[], &half).unwrap();
        let other = layout(&a.shares(), &[step(0, one.clone(), 1, false)], &half).unwrap();
        assert_eq!(shape(&one), [("n1", 0, 1, vec![0]), ("n2", 1, 1, vec![2])]);
        assert_eq!(shape(&other), [("n1", 0, 1, vec![1]), ("n2", 1, 1, vec![3])]);
        let mut ended = step(0, first, 1, false);
        ended.state = StepState::Completed;
        assert!(layout(&a.shares(), &[ended], &two).is_ok(), "an ended step holds nothing");
        assert_eq!(first_gpus(&other), vec![1]);
    }

    fn first_gpus(nodes: &[StepNode]) -> Vec<u32> {
        nodes[0].task_gpus(0, 1).to_vec()
    }

    #[test]
    fn cyclic_numbers_tasks_round_robin_and_keeps_each_nodes_count() {
        assert_eq!(task_ranks(&[2, 2], false), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(task_ranks(&[2, 2], true), vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(task_ranks(&[3, 1, 2], true), vec![vec![0, 3, 5], vec![1], vec![2, 4]]);
        assert_eq!(task_ranks(&[], true), Vec::<Vec<u32>>::new());
        // Every task once, whatever the counts.
        for counts in [vec![5, 1, 1, 3], vec![1], vec![4, 4, 4]] {
            let mut all: Vec<u32> = task_ranks(&counts, true).concat();
            all.sort_unstable();
            assert_eq!(all, (0..counts.iter().sum::<u32>()).collect::<Vec<_>>());
        }

        let alloc = allocation(&[("n1", 4, &[]), ("n2", 4, &[])]);
        let req = StepRequest { ntasks: 3, cyclic: true, ..Default::default() };
        let nodes = layout(&alloc.shares(), &[], &req).unwrap();
        assert_eq!(shape(&nodes), vec![("n1", 0, 2, vec![]), ("n2", 1, 1, vec![])]);
        let mut s = step(1, nodes, 0, false);
        s.cyclic = true;
        assert_eq!(s.ranks(), vec![vec![0, 2], vec![1]]);
        assert_eq!(s.tasks_per_node(), "2,1");
    }
}
