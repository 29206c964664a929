//! Advance reservations in one scheduling cycle: when each holds its nodes, what the jobs
//! outside reservations see of those nodes (nothing, over every window), what the jobs of a
//! reservation see (its nodes inside its windows, less a maintenance reservation's over them),
//! and why a job waits for them. Each node's time is split among these views without overlap,
//! so a start in one never takes what another gave away.

use quorum_model::reservation::{Reservation, MAX_WINDOWS};
use quorum_model::{Millis, PendingReason};

use crate::profile::Timeline;
use crate::view::{ClusterView, Res};

/// One reservation as this cycle sees it.
#[derive(Clone, Debug)]
pub struct Held {
    pub name: String,
    pub maint: bool,
    /// View indices of its nodes, in order.
    pub nodes: Vec<usize>,
    /// Its windows not yet over, in seconds, the earliest first; a recurring one's last runs
    /// for good (a job that long would cross a later window anyway).
    pub windows: Vec<(u64, u64)>,
    pub reservation: Reservation,
}

/// The reservations of one cycle.
#[derive(Clone, Debug, Default)]
pub struct Reservations {
    /// In name order.
    pub held: Vec<Held>,
    /// Per partition (the view's order): the first window of each reservation holding one of
    /// its nodes, and whether that reservation is for maintenance.
    by_partition: Vec<Vec<(u64, u64, bool)>>,
}

fn seconds(ms: Millis) -> u64 {
    ms / 1000
}

fn seconds_up(ms: Option<Millis>) -> u64 {
    ms.map_or(u64::MAX, |e| e.div_ceil(1000))
}

impl Reservations {
    pub fn new(view: &ClusterView, now_ms: Millis) -> Reservations {
        let mut held = Vec::new();
        for r in view.reservations.iter().filter(|r| !r.expired(now_ms)) {
            let mut windows: Vec<(u64, u64)> =
                r.windows(now_ms, MAX_WINDOWS).into_iter().map(|(s, e)| (seconds(s), seconds_up(e))).collect();
            if r.flags.recurrence.period_ms().is_some() {
                if let Some(last) = windows.last_mut() {
                    last.1 = u64::MAX;
                }
            }
            let nodes: Vec<usize> = r.nodes.iter().filter_map(|n| view.node_index(n)).collect();
            held.push(Held { name: r.name.clone(), maint: r.flags.maint, nodes, windows, reservation: r.clone() });
        }
        let by_partition = view
            .partitions
            .values()
            .map(|p| {
                held.iter()
                    .filter(|h| h.nodes.iter().any(|i| p.nodes.binary_search(i).is_ok()))
                    .filter_map(|h| h.windows.first().map(|&(s, e)| (s, e, h.maint)))
                    .collect()
            })
            .collect();
        Reservations { held, by_partition }
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn find(&self, name: &str) -> Option<usize> {
        self.held.iter().position(|h| h.name == name)
    }

    /// Takes every window of every reservation out of `profiles`: what a job outside
    /// reservations may use.
    pub fn block_outside(&self, profiles: &mut [Timeline]) {
        for h in &self.held {
            for &i in &h.nodes {
                for &(s, e) in &h.windows {
                    profiles[i].block(s, e);
                }
            }
        }
    }

    /// Whether no reservation holds node `i` at any time in `[from, to)`.
    pub fn clear(&self, i: usize, from: u64, to: u64) -> bool {
        self.held
            .iter()
            .filter(|h| h.nodes.binary_search(&i).is_ok())
            .all(|h| h.windows.iter().all(|&(s, e)| s >= to || e <= from))
    }

    /// The nodes some reservation holds at some time ahead.
    pub fn nodes(&self) -> Vec<usize> {
        let mut all: Vec<usize> = self.held.iter().flat_map(|h| h.nodes.iter().copied()).collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// What the jobs of reservation `k` may use, from `base` (the profiles before any
    /// reservation was taken out): its nodes inside its windows, less the windows of a
    /// maintenance reservation over them (unless it is one); nothing on any other node.
    pub fn profiles_for(&self, k: usize, base: &[(usize, Timeline)], now: u64, nodes: usize) -> Vec<Timeline> {
        let h = &self.held[k];
        let none = Timeline::new(now, Res::default(), Vec::new());
        let mut out = vec![none; nodes];
        for (i, timeline) in base {
            if h.nodes.binary_search(i).is_err() {
                continue;
            }
            let mut t = timeline.clone();
            let mut from = now;
            for &(s, e) in &h.windows {
                t.block(from, s);
                from = e;
            }
            t.block(from, u64::MAX);
            if !h.maint {
                for m in self.held.iter().filter(|m| m.maint && m.nodes.binary_search(i).is_ok()) {
                    for &(s, e) in &m.windows {
                        t.block(s, e);
                    }
                }
            }
            out[*i] = t;
        }
        out
    }

    /// Why a job of partition `part` (the view's order) outside reservations waits, when a
    /// reservation holds one of the partition's nodes during `[now, now + duration)`: a
    /// maintenance one first.
    pub fn reason(&self, part: usize, now: u64, duration: u64) -> Option<PendingReason> {
        let end = now.saturating_add(duration);
        let mut crossing = self.by_partition.get(part)?.iter().filter(|&&(s, e, _)| s < end && e > now);
        let first = crossing.next()?;
        Some(if first.2 || crossing.any(|w| w.2) {
            PendingReason::ReservedForMaintenance
        } else {
            PendingReason::ReservedForOthers
        })
    }
}
