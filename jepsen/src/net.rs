//! The hosts of a run: one network namespace each, joined by veth pairs to a bridge in the root
//! namespace (where the harness and its clients live, at 10.77.0.1). Partitions are nftables
//! rules in each host's namespace that drop what arrives from the hosts it is cut off from.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::Context;

/// The bridge; one run at a time on a machine (see [`crate::lock`]).
pub const BRIDGE: &str = "qj0";
const PREFIX: &str = "qj-";
pub const HARNESS_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

#[derive(Clone, Debug)]
pub struct Host {
    /// `r1`, `a2`: a replica or an agent.
    pub name: String,
    pub ip: Ipv4Addr,
}

impl Host {
    pub fn namespace(&self) -> String {
        format!("{PREFIX}{}", self.name)
    }
}

/// Runs a command to completion, failing with what it printed.
pub(crate) fn run(program: &str, args: &[&str], stdin: Option<&str>) -> anyhow::Result<()> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program} (the harness needs iproute2 and nftables, and root)"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "{program} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim(),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    Ok(())
}

pub struct Net {
    pub hosts: Vec<Host>,
}

impl Net {
    /// Removes what an earlier run left (its processes killed), then makes the bridge and one
    /// namespace per name, host `i` at 10.77.0.(10 + i).
    pub fn create(names: &[String]) -> anyhow::Result<Net> {
        anyhow::ensure!(names.len() < 200, "too many hosts");
        cleanup();
        run("ip", &["link", "add", BRIDGE, "type", "bridge"], None)?;
        run("ip", &["addr", "add", &format!("{HARNESS_IP}/24"), "dev", BRIDGE], None)?;
        run("ip", &["link", "set", BRIDGE, "up"], None)?;
        let mut hosts = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let host = Host { name: name.clone(), ip: Ipv4Addr::new(10, 77, 0, 10 + i as u8) };
            let ns = host.namespace();
            let veth = format!("qjv{i}");
            run("ip", &["netns", "add", &ns], None)?;
            run("ip", &["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns], None)?;
            run("ip", &["link", "set", &veth, "master", BRIDGE, "up"], None)?;
            run("ip", &["-n", &ns, "addr", "add", &format!("{}/24", host.ip), "dev", "eth0"], None)?;
            run("ip", &["-n", &ns, "link", "set", "eth0", "up"], None)?;
            run("ip", &["-n", &ns, "link", "set", "lo", "up"], None)?;
            hosts.push(host);
        }
        let net = Net { hosts };
        net.block(&BTreeSet::new())?;
        Ok(net)
    }

    pub fn index(&self, name: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h.name == name)
    }

    /// Drops every packet from `a` to `b` for each `(a, b)` in `cut`, and nothing else: each
    /// host's rules are replaced in one nftables transaction.
    pub fn block(&self, cut: &BTreeSet<(usize, usize)>) -> anyhow::Result<()> {
        for (b, host) in self.hosts.iter().enumerate() {
            let from: Vec<String> =
                cut.iter().filter(|(_, to)| *to == b).map(|(a, _)| self.hosts[*a].ip.to_string()).collect();
            let rule = match from.is_empty() {
                true => String::new(),
                false => format!("ip saddr {{ {} }} drop", from.join(", ")),
            };
            let script = format!(
                "table inet jepsen {{}}\ndelete table inet jepsen\n\
                 table inet jepsen {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    {rule}\n  }}\n}}\n"
            );
            run("ip", &["netns", "exec", &host.namespace(), "nft", "-f", "-"], Some(&script))?;
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        cleanup();
    }
}

/// Every process in a namespace of ours killed, the namespaces and the bridge removed.
pub fn cleanup() {
    let list = Command::new("ip").args(["netns", "list"]).output().map(|o| o.stdout).unwrap_or_default();
    for line in String::from_utf8_lossy(&list).lines() {
        let Some(ns) = line.split_whitespace().next().filter(|n| n.starts_with(PREFIX)) else { continue };
        let pids = Command::new("ip").args(["netns", "pids", ns]).output().map(|o| o.stdout).unwrap_or_default();
        for pid in String::from_utf8_lossy(&pids).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            // SAFETY: kill(2) on a pid of a namespace only this harness makes.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = run("ip", &["netns", "del", ns], None);
    }
    let _ = Command::new("ip").args(["link", "del", BRIDGE]).stderr(Stdio::null()).status();
    // A namespace's veth pair goes with it, but not at once: wait (2 s at most) until the
    // harness's ends are gone, removing any left.
    for _ in 0..20 {
        let links = Command::new("ip").args(["-o", "link", "show"]).output().map(|o| o.stdout).unwrap_or_default();
        let ours: Vec<String> = String::from_utf8_lossy(&links)
            .lines()
            .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().split('@').next().unwrap_or("").to_string()))
            .filter(|n| n.starts_with("qjv"))
            .collect();
        if ours.is_empty() {
            return;
        }
        for link in ours {
            let _ = Command::new("ip").args(["link", "del", &link]).stderr(Stdio::null()).status();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// For `Command::pre_exec`: moves the child into namespace `ns` before it runs.
pub fn enter(ns: &str) -> anyhow::Result<impl FnMut() -> std::io::Result<()> + Send + Sync + 'static> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(format!("/run/netns/{ns}")).with_context(|| format!("network namespace {ns}"))?;
    Ok(move || {
        // SAFETY: setns is async-signal-safe; `file` lives as long as the closure. (No
        // PR_SET_PDEATHSIG: it fires when the spawning thread ends, not the harness; what a run
        // leaves is killed by the next one's `cleanup`.)
        match unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    })
}
