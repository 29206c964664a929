//! The availability profile of one node over time: a step function of free resources,
//! starting now. Running jobs give their resources back at their expected end (start plus time
//! limit); starts and reservations take resources over an interval.

use super::view::{ClusterView, Res};

/// `t` rounded up to a multiple of `resolution` (the backfill resolution); 0 or 1 leaves it.
pub fn round_up(t: u64, resolution: u64) -> u64 {
    if resolution > 1 {
        t.div_ceil(resolution) * resolution
    } else {
        t
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    /// (from this time on, this much is free), sorted by time; the first step is `now`.
    steps: Vec<(u64, Res)>,
}

impl Timeline {
    /// `free_now` from `now` on, then each (time, amount) release added from its time on.
    pub fn new(now: u64, free_now: Res, mut releases: Vec<(u64, Res)>) -> Timeline {
        releases.sort_by_key(|(t, _)| *t);
        Timeline::from_sorted(now, free_now, releases.len(), releases.into_iter())
    }

    /// Like [`Timeline::new`], from `count` releases already in time order.
    pub fn from_sorted(now: u64, free_now: Res, count: usize, releases: impl Iterator<Item = (u64, Res)>) -> Timeline {
        let mut steps = Vec::with_capacity(count + 1);
        steps.push((now, free_now));
        for (t, amount) in releases {
            let t = t.max(now);
            let last = steps.last().expect("never empty").1;
            if steps.last().expect("never empty").0 == t {
                steps.last_mut().expect("never empty").1 = last.plus(&amount);
            } else {
                steps.push((t, last.plus(&amount)));
            }
        }
        Timeline { steps }
    }

    /// Index of the step in force at `t`.
    fn at(&self, t: u64) -> usize {
        // Most lookups are of now, which the first step holds: no search for them.
        match self.steps.get(1) {
            Some((s, _)) if *s > t => 0,
            None => 0,
            Some(_) => self.steps.partition_point(|(s, _)| *s <= t).saturating_sub(1),
        }
    }

    /// Free resources at `t`.
    pub fn free_at(&self, t: u64) -> Res {
        self.steps[self.at(t)].1
    }

    /// Free resources at every moment of `[from, to)`, component-wise minimum.
    pub fn min_free(&self, from: u64, to: u64) -> Res {
        let mut i = self.at(from);
        let mut m = self.steps[i].1;
        i += 1;
        while i < self.steps.len() && self.steps[i].0 < to {
            m = m.min(&self.steps[i].1);
            i += 1;
        }
        m
    }

    /// Ensures a step starts exactly at `t` and returns its index.
    fn split(&mut self, t: u64) -> usize {
        let i = self.at(t);
        if self.steps[i].0 == t || t < self.steps[0].0 {
            return i;
        }
        let free = self.steps[i].1;
        self.steps.insert(i + 1, (t, free));
        i + 1
    }

    /// The steps covering exactly `[from, to)` (split where needed), from now on.
    fn span(&mut self, from: u64, to: u64) -> &mut [(u64, Res)] {
        let from = from.max(self.steps[0].0);
        if to <= from {
            return &mut [];
        }
        let start = self.split(from);
        let end = if to == u64::MAX { self.steps.len() } else { self.split(to) };
        &mut self.steps[start..end]
    }

    /// Takes `amount` over `[from, to)`.
    pub fn take(&mut self, from: u64, to: u64, amount: &Res) {
        for step in self.span(from, to) {
            step.1 = step.1.minus(amount);
        }
    }

    /// Nothing is free over `[from, to)` (what is overcommitted stays so): the node is held
    /// for others then, by an advance reservation.
    pub fn block(&mut self, from: u64, to: u64) {
        for step in self.span(from, to) {
            step.1 = step.1.min(&Res::default());
        }
    }

    /// The earliest time in `[from, horizon]`, rounded up to `resolution`, at which `req` stays
    /// free for `duration`.
    pub fn earliest_fit(&self, req: &Res, duration: u64, from: u64, horizon: u64, resolution: u64) -> Option<u64> {
        let first = self.at(from);
        let candidates = std::iter::once(from).chain(self.steps[first + 1..].iter().map(|(t, _)| *t));
        for t in candidates.map(|t| round_up(t, resolution)) {
            if t > horizon {
                return None;
            }
            if self.min_free(t, t.saturating_add(duration)).fits(req) {
                return Some(t);
            }
        }
        None
    }

    /// The earliest time from which `req` stays free until `t` (`t` itself when it is not free
    /// just before `t`, or `t` is the first step's time): how long before `t` the node could
    /// already hold it.
    pub fn holds_since(&self, req: &Res, t: u64) -> u64 {
        let mut since = t;
        for &(from, free) in self.steps[..=self.at(t.saturating_sub(1))].iter().rev() {
            if from >= t {
                continue;
            }
            if !free.fits(req) {
                break;
            }
            since = from;
        }
        since
    }

    /// `inside` over `windows` (sorted, disjoint), `outside` at every other time: what a job
    /// that may use both books sees of one node.
    pub fn spliced(outside: &Timeline, inside: &Timeline, windows: &[(u64, u64)]) -> Timeline {
        let start = outside.steps[0].0;
        let mut times: Vec<u64> = outside.change_times().chain(inside.change_times()).collect();
        times.extend(windows.iter().flat_map(|&(s, e)| [s, e]));
        times.retain(|&t| t >= start && t != u64::MAX);
        times.push(start);
        times.sort_unstable();
        times.dedup();
        let mut steps: Vec<(u64, Res)> = Vec::with_capacity(times.len());
        for t in times {
            let within = windows.iter().any(|&(s, e)| s <= t && t < e);
            let free = if within { inside.free_at(t) } else { outside.free_at(t) };
            if steps.last().is_none_or(|(_, last)| *last != free) {
                steps.push((t, free));
            }
        }
        Timeline { steps }
    }

    /// Times at which the free amount changes, from the first step on.
    pub fn change_times(&self) -> impl Iterator<Item = u64> + '_ {
        self.steps.iter().map(|(t, _)| *t)
    }

    /// Whether nothing is ever taken beyond what the node has.
    pub fn never_overcommitted(&self) -> bool {
        self.steps.iter().all(|(_, r)| r.non_negative())
    }
}

/// Builds every node's availability profile from what is free now and when running jobs end.
pub fn profiles(view: &ClusterView, now: u64) -> Vec<Timeline> {
    let mut free: Vec<Res> = view.nodes.iter().map(|n| n.capacity.minus(&n.completing)).collect();
    // Every release of every node in one list, sorted by node and time: one allocation for
    // all of them, then one per node for its steps. What ended jobs still hold while their
    // processes are killed is planned gone in a second, as a job past its limit is.
    let mut releases: Vec<(usize, u64, Res)> = (view.nodes.iter().enumerate())
        .filter(|(_, n)| n.completing != Res::default())
        .map(|(i, n)| (i, now + 1, n.completing))
        .collect();
    for r in &view.running {
        // A job predicted to end before its limit is planned to then, until it outlives the
        // prediction; a job past its limit is being killed: plan for it to be gone in a second.
        let limit = (r.end_s != u64::MAX).then(|| r.end_s.saturating_sub(r.start_s));
        let predicted = r.predicted_end_s.map(|p| p.saturating_sub(r.start_s));
        let planned = quorum_model::predict::running_s(predicted, limit, now.saturating_sub(r.start_s));
        let end = planned.map(|d| r.start_s.saturating_add(d).max(now + 1));
        for (i, res) in &r.alloc {
            free[*i] = free[*i].minus(res);
            if let Some(end) = end {
                releases.push((*i, end, *res));
            }
        }
    }
    releases.sort_unstable_by_key(|(i, t, _)| (*i, *t));
    let mut rest = releases.as_slice();
    free.into_iter()
        .enumerate()
        .map(|(i, f)| {
            let n = rest.iter().take_while(|(node, _, _)| *node == i).count();
            let (mine, after) = rest.split_at(n);
            rest = after;
            Timeline::from_sorted(now, f, n, mine.iter().map(|(_, t, r)| (*t, *r)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(cpus: i64) -> Res {
        Res { cpus, mem: 0, gpus: 0 }
    }

    #[test]
    fn how_long_a_node_could_hold_a_share_before_a_time() {
        // 1 CPU free now, 3 at t=10, 1 again at t=20 (taken), 4 from t=30.
        let mut tl = Timeline::new(0, r(1), vec![(10, r(2)), (30, r(1))]);
        tl.take(20, 30, &r(2));
        assert_eq!(tl.holds_since(&r(1), 40), 0, "one CPU was free all along");
        assert_eq!(tl.holds_since(&r(2), 40), 30, "two only since t=30");
        assert_eq!(tl.holds_since(&r(2), 20), 10, "and from 10 to 20");
        assert_eq!(tl.holds_since(&r(4), 40), 30);
        assert_eq!(tl.holds_since(&r(5), 40), 40, "never");
        assert_eq!(tl.holds_since(&r(1), 0), 0, "now");
    }

    #[test]
    fn releases_reservations_and_earliest_fit() {
        // 2 CPUs free now, 4 more at t=10, 2 more at t=20
        let mut tl = Timeline::new(0, r(2), vec![(20, r(2)), (10, r(4))]);
        assert_eq!(tl.min_free(0, 10), r(2));
        assert_eq!(tl.min_free(0, 11), r(2));
        assert_eq!(tl.min_free(10, 20), r(6));
        assert_eq!(tl.earliest_fit(&r(6), 5, 0, 100, 1), Some(10));
        assert_eq!(tl.earliest_fit(&r(8), 5, 0, 100, 1), Some(20));
        assert_eq!(tl.earliest_fit(&r(9), 5, 0, 100, 1), None);
        assert_eq!(tl.earliest_fit(&r(8), 5, 0, 15, 1), None, "beyond the window");
        assert_eq!(tl.earliest_fit(&r(6), 5, 0, 100, 7), Some(14), "rounded to the resolution");
        // reserve 6 CPUs on [10, 30): a 2-CPU job of 5s still fits now, one of 15s does not
        tl.take(10, 30, &r(6));
        assert!(tl.never_overcommitted());
        assert_eq!(tl.earliest_fit(&r(2), 5, 0, 100, 1), Some(0));
        assert_eq!(tl.earliest_fit(&r(2), 15, 0, 100, 1), Some(20));
        assert_eq!(tl.min_free(0, u64::MAX), r(0));
        // held for a reservation over [40, 50): nothing fits across it, all fits after it
        let mut tl = Timeline::new(0, r(4), vec![]);
        tl.block(40, 50);
        assert_eq!(tl.earliest_fit(&r(1), 40, 0, 100, 1), Some(0));
        assert_eq!(tl.earliest_fit(&r(1), 41, 0, 100, 1), Some(50));
        assert_eq!(tl.free_at(49), r(0));
        tl.block(60, u64::MAX);
        assert_eq!(tl.earliest_fit(&r(1), 41, 0, 100, 1), None);
        assert!(tl.never_overcommitted());
    }
}
