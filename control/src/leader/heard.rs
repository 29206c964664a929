//! When each node's agent was last heard from while this replica leads, and which nodes it is
//! declaring DOWN (shared by the hub, the liveness loop and the simulator).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// When each node's agent was last heard from while this replica leads, and which nodes it is
/// declaring DOWN. It orders the two paths that could otherwise race (found by the simulator,
/// `jepsen/RESULTS.md`, seed 20919): the liveness loop decides a node is silent and proposes its
/// `NodeDown`, which requeues its `--requeue` jobs, while the node's stream answers a heartbeat
/// that arrived meanwhile with a fresh lease, under which the node's copy runs on beside the new
/// one. A node is judged silent and marked as being declared DOWN in one step
/// ([`Heard::begin_down`]), and a heartbeat recorded after that gets no lease
/// ([`Heard::heard`]) until the proposal is over ([`Heard::down_ended`]); one recorded before
/// makes the node not silent. Shared with the simulator (`quorum-sim`), which runs it as is.
#[derive(Debug, Default)]
pub struct Heard {
    last: HashMap<String, Instant>,
    downing: HashSet<String>,
}

impl Heard {
    /// `node` was heard at `now`. Whether its heartbeat may be answered with a lease: not while
    /// a `NodeDown` of it is being proposed.
    pub fn heard(&mut self, node: &str, now: Instant) -> bool {
        match self.last.get_mut(node) {
            Some(at) => *at = (*at).max(now),
            None => {
                self.last.insert(node.to_string(), now);
            }
        }
        !self.downing.contains(node)
    }

    /// When `node` was last heard.
    pub fn last(&self, node: &str) -> Option<Instant> {
        self.last.get(node).copied()
    }

    /// How long `node` has been silent at `now`, counted from `since` (when this replica began
    /// leading) for one not heard since then.
    pub fn silence(&self, node: &str, since: Instant, now: Instant) -> Duration {
        let heard = self.last(node).map_or(since, |t| t.max(since));
        now.saturating_duration_since(heard)
    }

    /// If `node` has been silent for `timeout` at `now`, marks it as being declared DOWN (no
    /// lease for it until [`Heard::down_ended`]) and returns how long it was silent.
    pub fn begin_down(&mut self, node: &str, since: Instant, now: Instant, timeout: Duration) -> Option<Duration> {
        let silent = self.silence(node, since, now);
        (silent >= timeout).then(|| {
            self.downing.insert(node.to_string());
            silent
        })
    }

    /// The `NodeDown` proposed for `node` was answered, whatever the answer: committed, the
    /// node is DOWN and its next heartbeat returns it to service (its strays killed before the
    /// lease, on the same stream); not committed, the replica no longer leads in that term, and
    /// a later term gives leases only once it applied an entry of its own, so after any
    /// `NodeDown` left in the log ([`crate::replica::may_lease`]).
    pub fn down_ended(&mut self, node: &str) {
        self.downing.remove(node);
    }

    /// Forgets everything: the replica stopped leading.
    pub fn clear(&mut self) {
        self.last.clear();
        self.downing.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 20919's race, by hand: a heartbeat recorded while the node is being declared DOWN
    /// gets no lease until the proposal is answered; one recorded before keeps it from being
    /// judged silent at all.
    #[test]
    fn no_lease_while_the_node_is_being_declared_down() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let timeout = Duration::from_secs(5);
        let mut h = Heard::default();
        assert!(h.heard("a1", at(0)), "an ordinary heartbeat is a lease");
        assert_eq!(h.begin_down("a1", t0, at(4), timeout), None, "heard 4 s ago: not silent");
        assert_eq!(h.begin_down("a1", t0, at(6), timeout), Some(Duration::from_secs(6)));
        assert!(!h.heard("a1", at(6)), "heard while its NodeDown is in flight: no lease");
        assert!(h.heard("a2", at(6)), "another node is not held back");
        h.down_ended("a1");
        assert!(h.heard("a1", at(7)), "once the proposal is answered, its heartbeats are leases again");
        // Heard just before the pass: not silent, nothing begins.
        assert_eq!(h.begin_down("a1", t0, at(8), timeout), None);
        // A new leader counts a node it never heard from its own start.
        h.clear();
        assert_eq!(h.begin_down("a1", at(10), at(14), timeout), None);
        assert!(h.begin_down("a1", at(10), at(15), timeout).is_some());
    }
}
