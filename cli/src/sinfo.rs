//! `sinfo`: partitions and nodes as Slurm's shows them. Without `-N`, each line is a group of a
//! partition's nodes that show the same values (state, CPUs, ...), with their count (`%D`) and
//! host list (`%N`); with `-N`, a line for each node in each of its partitions. `-o` takes
//! Slurm's `%` codes, `-R` lists why nodes are drained or down, `-s` summarizes partitions.

use clap::Parser;
use quorum_client::client::ControllersArg;
use quorum_client::display::null_or;
use quorum_model::hostlist;
use quorum_model::parse::format_duration;
use quorum_proto::api::{self, NodeInfo, PartitionInfo};

use crate::commands::Context;
use crate::format::{self, parse_format, Piece};

/// Slurm's default format.
const DEFAULT_FORMAT: &str = "%9P %.5a %.10l %.6D %.6t %N";
/// `-N`.
const NODE_FORMAT: &str = "%-10N %.6D %.9P %-6t";
/// `-l`.
const LONG_FORMAT: &str = "%9P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N";
/// `-N -l`.
const LONG_NODE_FORMAT: &str = "%-10N %.6D %.9P %11T %.4c %.6m %.8f %20E";
/// `-R`.
const REASON_FORMAT: &str = "%20E %9u %19H %N";
/// `-s`.
const SUMMARY_FORMAT: &str = "%9P %.5a %.10l %.16F  %N";

/// What `-o` may name, with its header.
const CODES: &[(char, &str)] = &[
    ('P', "PARTITION"),
    ('R', "PARTITION"),
    ('a', "AVAIL"),
    ('l', "TIMELIMIT"),
    ('L', "DEFAULTTIME"),
    ('D', "NODES"),
    ('F', "NODES(A/I/O/T)"),
    ('t', "STATE"),
    ('T', "STATE"),
    ('N', "NODELIST"),
    ('n', "HOSTNAMES"),
    ('c', "CPUS"),
    ('C', "CPUS(A/I/O/T)"),
    ('m', "MEMORY"),
    ('G', "GRES"),
    ('f', "AVAIL_FEATURES"),
    ('b', "ACTIVE_FEATURES"),
    ('E', "REASON"),
    ('s', "JOB_SIZE"),
    ('r', "ROOT"),
    ('h', "OVERSUBSCRIBE"),
    ('g', "GROUPS"),
    ('u', "USER"),
    ('H', "TIMESTAMP"),
];

/// Codes whose value is the group's, not each node's: a line groups the nodes equal in the rest.
const GROUP_CODES: &[char] = &['D', 'F', 'N', 'n', 'C'];

#[derive(Parser, Debug)]
#[command(
    name = "sinfo",
    no_binary_name = true,
    infer_long_args = true,
    disable_help_flag = true,
    about = "Partitions and nodes (Quorum's sinfo)"
)]
pub struct SinfoArgs {
    #[command(flatten)]
    controllers: ControllersArg,
    /// A line for each node (in each of its partitions).
    #[arg(short = 'N', long = "Node")]
    node: bool,
    /// No header line.
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    /// Only these partitions.
    #[arg(short = 'p', long = "partition", value_delimiter = ',')]
    partitions: Vec<String>,
    /// Only these nodes (a host list).
    #[arg(short = 'n', long = "nodes")]
    nodes: Option<String>,
    /// Only nodes in these states (idle, mix, alloc, drain, drng, down; any case).
    #[arg(short = 't', long = "states", value_delimiter = ',')]
    states: Vec<String>,
    /// Why nodes are drained or down.
    #[arg(short = 'R', long = "list-reasons")]
    reasons: bool,
    /// More fields.
    #[arg(short = 'l', long = "long")]
    long: bool,
    /// A line for each partition, with node counts allocated/idle/other/total.
    #[arg(short = 's', long = "summarize")]
    summarize: bool,
    /// The advance reservations instead: name, state, start, end, duration, nodes.
    #[arg(short = 'T', long = "reservation")]
    reservations: bool,
    /// Fields as `%` codes: `%P %R %a %l %L %D %F %t %T %N %n %c %C %m %G %f %b %E %s %r %h %g %u %H`.
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
}

pub fn main(args: &[String]) -> std::process::ExitCode {
    crate::entry::main_of::<SinfoArgs, _, _>("sinfo", crate::entry::Threads::One, args, run)
}

/// A node's state as `%t` (compact) or `%T` shows it; `*` when its agent is not connected.
fn state(n: &NodeInfo, long: bool) -> String {
    let word = match (n.state.as_str(), n.alloc_cpus > 0 || n.alloc_gpus > 0, long) {
        ("idle", _, _) => "idle",
        ("mixed", _, false) => "mix",
        ("mixed", _, true) => "mixed",
        ("allocated", _, false) => "alloc",
        ("allocated", _, true) => "allocated",
        ("drain", true, false) => "drng",
        ("drain", true, true) => "draining",
        ("drain", false, false) => "drain",
        ("drain", false, true) => "drained",
        ("down", _, _) => "down",
        (other, _, _) => other,
    };
    if n.connected {
        word.to_string()
    } else {
        format!("{word}*")
    }
}

/// Where a state sorts among a partition's lines (as Slurm's: unavailable nodes first).
fn state_rank(n: &NodeInfo) -> u8 {
    match n.state.as_str() {
        "down" => 0,
        "drain" => 1,
        "mixed" => 2,
        "allocated" => 3,
        _ => 4,
    }
}

/// `TRES` generic resources as Slurm writes them: `gpu:h100:4`, or `(null)`.
pub fn gres(n: &NodeInfo) -> String {
    if n.gpus == 0 || n.gpu_types.is_empty() {
        return "(null)".into();
    }
    n.gpu_types.split(',').map(|t| format!("gpu:{t}")).collect::<Vec<_>>().join(",")
}

fn time_limit(seconds: u64, none: &str) -> String {
    if seconds == 0 {
        none.to_string()
    } else {
        format_duration(seconds)
    }
}

/// A partition's AVAIL as Slurm's sinfo writes it: `up`, `down`, `drain` or `inact`.
pub fn avail(p: &PartitionInfo) -> &'static str {
    match p.state.as_str() {
        "DOWN" => "down",
        "DRAIN" => "drain",
        "INACTIVE" => "inact",
        _ => "up",
    }
}

/// A node's value of `code` in partition `p` (group codes excepted).
fn node_value(code: char, p: &PartitionInfo, n: &NodeInfo) -> String {
    match code {
        'P' if p.default => format!("{}*", p.name),
        'P' | 'R' => p.name.clone(),
        'a' => avail(p).into(),
        'l' => time_limit(p.max_time_s, "infinite"),
        'L' => time_limit(p.default_time_s, "n/a"),
        't' => state(n, false),
        'T' => state(n, true),
        'c' => n.cpus.to_string(),
        'm' => n.mem_mb.to_string(),
        'G' => gres(n),
        'f' | 'b' => null_or(&n.features.join(",")).to_string(),
        'E' if n.reason.is_empty() => "none".into(),
        'E' => n.reason.clone(),
        's' if p.max_nodes == 0 => "1-infinite".into(),
        's' => format!("1-{}", p.max_nodes),
        'r' => "no".into(),
        'h' => oversubscribe(p).into(),
        'g' => "all".into(),
        // Who set a drain, and when, is not recorded.
        'u' => "(null)".into(),
        'H' => "Unknown".into(),
        _ => String::new(),
    }
}

/// A line: a partition and nodes that show the same values.
struct Line<'a> {
    partition: &'a PartitionInfo,
    nodes: Vec<&'a NodeInfo>,
    key: Vec<String>,
}

/// The value of a group code over `nodes`.
fn group_value(code: char, nodes: &[&NodeInfo]) -> String {
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let unavailable = |n: &NodeInfo| matches!(n.state.as_str(), "drain" | "down") || !n.connected;
    match code {
        'D' => nodes.len().to_string(),
        'N' | 'n' => hostlist::compress(&names),
        'F' => {
            let other = nodes.iter().filter(|n| unavailable(n)).count();
            let alloc = nodes.iter().filter(|n| !unavailable(n) && n.alloc_cpus > 0).count();
            format!("{alloc}/{}/{other}/{}", nodes.len() - alloc - other, nodes.len())
        }
        'C' => {
            let (mut alloc, mut idle, mut other) = (0u64, 0u64, 0u64);
            for n in nodes {
                if unavailable(n) {
                    other += u64::from(n.cpus);
                } else {
                    alloc += u64::from(n.alloc_cpus);
                    idle += u64::from(n.cpus.saturating_sub(n.alloc_cpus));
                }
            }
            format!("{alloc}/{idle}/{other}/{}", alloc + idle + other)
        }
        _ => String::new(),
    }
}

/// The lines for `pieces`: by partition (in the order listed), nodes grouped unless `per_node`.
fn lines<'a>(
    pieces: &[Piece],
    partitions: &'a [PartitionInfo],
    nodes: &'a [NodeInfo],
    per_node: bool,
) -> Vec<Line<'a>> {
    let codes: Vec<char> = pieces
        .iter()
        .filter_map(|p| match p {
            Piece::Field { code, .. } if !GROUP_CODES.contains(code) => Some(*code),
            _ => None,
        })
        .collect();
    let mut out: Vec<Line> = Vec::new();
    for p in partitions {
        let mut members: Vec<&NodeInfo> = nodes.iter().filter(|n| n.partitions.contains(&p.name)).collect();
        members.sort_by_key(|n| (state_rank(n), n.name.clone()));
        let first = out.len();
        for n in members {
            let key: Vec<String> = codes.iter().map(|&c| node_value(c, p, n)).collect();
            match out[first..].iter_mut().find(|l| !per_node && l.key == key) {
                Some(line) => line.nodes.push(n),
                None => out.push(Line { partition: p, nodes: vec![n], key }),
            }
        }
    }
    out
}

fn render(pieces: &[Piece], lines: &[Line], header: bool) -> String {
    let mut out = String::new();
    if header {
        out.push_str(&format::line(pieces, &|code| {
            CODES.iter().find(|(c, _)| *c == code).map_or("", |(_, h)| h).to_string()
        }));
        out.push('\n');
    }
    for l in lines {
        out.push_str(&format::line(pieces, &|code| {
            if GROUP_CODES.contains(&code) {
                group_value(code, &l.nodes)
            } else {
                node_value(code, l.partition, l.nodes[0])
            }
        }));
        out.push('\n');
    }
    out
}

/// Whether `n` is in one of the `-t` states (compact or long names, any case).
fn in_states(n: &NodeInfo, states: &[String]) -> bool {
    if states.is_empty() {
        return true;
    }
    let names = [state(n, false), state(n, true)].map(|s| s.trim_end_matches('*').to_string());
    states.iter().any(|s| {
        let s = s.to_ascii_lowercase();
        names.contains(&s) || (s == "drained" || s == "drain") && n.state == "drain" || s == n.state
    })
}

pub async fn run(a: SinfoArgs) -> anyhow::Result<u8> {
    let format = match (&a.format, a.reasons, a.summarize, a.node, a.long) {
        (Some(f), ..) => f.as_str(),
        (None, true, ..) => REASON_FORMAT,
        (None, false, true, ..) => SUMMARY_FORMAT,
        (None, false, false, true, true) => LONG_NODE_FORMAT,
        (None, false, false, true, false) => NODE_FORMAT,
        (None, false, false, false, true) => LONG_FORMAT,
        (None, false, false, false, false) => DEFAULT_FORMAT,
    };
    let pieces = parse_format(format, CODES, "sinfo").map_err(anyhow::Error::msg)?;
    let only_nodes = match &a.nodes {
        Some(list) => Some(hostlist::expand(list).map_err(|e| anyhow::anyhow!("invalid --nodes '{list}': {e}"))?),
        None => None,
    };
    let ctx = Context { client: a.controllers.client()?, stale: false };
    let r = ctx.send(api::ListNodesRequest { stale: false }, |mut c, r| async move { c.list_nodes(r).await }).await?;
    if a.reservations {
        print!("{}", crate::commands::reservation::table(&r.reservations));
        return Ok(0);
    }
    if let Some(unknown) = a.partitions.iter().find(|p| !r.partitions.iter().any(|q| &q.name == *p)) {
        anyhow::bail!("invalid --partition '{unknown}': no such partition");
    }
    let partitions: Vec<PartitionInfo> =
        r.partitions.into_iter().filter(|p| a.partitions.is_empty() || a.partitions.contains(&p.name)).collect();
    let nodes: Vec<NodeInfo> = r
        .nodes
        .into_iter()
        .filter(|n| only_nodes.as_ref().is_none_or(|only| only.contains(&n.name)))
        .filter(|n| in_states(n, &a.states))
        .filter(|n| !a.reasons || matches!(n.state.as_str(), "drain" | "down"))
        .collect();
    if a.long && a.format.is_none() {
        println!("{}", format::ctime(format::now_ms()));
    }
    print!("{}", render(&pieces, &lines(&pieces, &partitions, &nodes, a.node), !a.noheader));
    Ok(0)
}

/// A partition's `OverSubscribe` as Slurm prints it: `EXCLUSIVE`, `NO`, `YES:N` or `FORCE:N`.
pub fn oversubscribe(p: &PartitionInfo) -> &str {
    match p.oversubscribe.as_str() {
        _ if p.exclusive => "EXCLUSIVE",
        "" => "NO",
        o => o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, state: &str, alloc_cpus: u32) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            state: state.into(),
            cpus: 8,
            alloc_cpus,
            mem_mb: 32768,
            gpus: 4,
            gpu_types: "h100:4".into(),
            partitions: vec!["gpu".into()],
            connected: true,
            ..Default::default()
        }
    }

    fn partition(name: &str, default: bool) -> PartitionInfo {
        PartitionInfo { name: name.into(), default, nodes: "n[1-4]".into(), ..Default::default() }
    }

    #[test]
    fn lines_group_a_partitions_nodes_by_what_they_show() {
        let mut drained = node("n3", "drain", 0);
        drained.reason = "bad disk".into();
        let mut lost = node("n4", "idle", 0);
        lost.connected = false;
        let nodes = vec![node("n1", "idle", 0), node("n2", "idle", 0), drained, lost, node("n5", "mixed", 2)];
        let parts = vec![PartitionInfo { max_time_s: 86400, ..partition("gpu", true) }];
        let pieces = parse_format(DEFAULT_FORMAT, CODES, "sinfo").unwrap();
        assert_eq!(
            render(&pieces, &lines(&pieces, &parts, &nodes, false), true),
            "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n\
             gpu*         up 1-00:00:00      1  drain n3\n\
             gpu*         up 1-00:00:00      1    mix n5\n\
             gpu*         up 1-00:00:00      2   idle n[1-2]\n\
             gpu*         up 1-00:00:00      1  idle* n4\n"
        );
        let pieces = parse_format(NODE_FORMAT, CODES, "sinfo").unwrap();
        let out = render(&pieces, &lines(&pieces, &parts, &nodes, true), true);
        assert!(out.starts_with("NODELIST    NODES PARTITION STATE\nn3              1      gpu* drain\n"), "{out}");
        let pieces = parse_format(REASON_FORMAT, CODES, "sinfo").unwrap();
        let out = render(&pieces, &lines(&pieces, &parts, &nodes[2..3], false), true);
        assert_eq!(out, "REASON               USER      TIMESTAMP           NODELIST\nbad disk             (null)    Unknown             n3\n");
        let pieces = parse_format(SUMMARY_FORMAT, CODES, "sinfo").unwrap();
        let out = render(&pieces, &lines(&pieces, &parts, &nodes, false), false);
        assert_eq!(out, "gpu*         up 1-00:00:00          1/2/2/5  n[1-5]\n");
        let pieces = parse_format("%P|%c|%m|%G|%C|%f|%s|%h", CODES, "sinfo").unwrap();
        let out = render(&pieces, &lines(&pieces, &parts, &nodes[..2], false), false);
        assert_eq!(out, "gpu*|8|32768|gpu:h100:4|0/16/0/16|(null)|1-infinite|NO\n");
        assert!(parse_format("%Q", CODES, "sinfo").unwrap_err().contains("%Q is not a field Quorum's sinfo knows"));
    }

    #[test]
    fn states_are_matched_by_compact_or_long_names() {
        let draining = node("n1", "drain", 4);
        assert_eq!(state(&draining, false), "drng");
        assert_eq!(state(&draining, true), "draining");
        assert!(in_states(&draining, &["DRAIN".into()]));
        assert!(in_states(&node("n2", "mixed", 1), &["mix".into()]));
        assert!(!in_states(&node("n2", "idle", 0), &["alloc".into(), "down".into()]));
    }
}
