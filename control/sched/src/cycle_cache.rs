//! What one scheduling cycle keeps for the next, so that a cycle after a few submits and ends
//! pays for them rather than for the whole queue again.
//!
//! **The order.** A job's priority is age and fairshare, which move with the time and the
//! usage, plus terms that depend on the job and on the policy, partitions and QOS alone
//! ([`Terms`]). The cache keeps each pending job's terms while its view entry is the same one
//! (the view's own cache, [`crate::view::ViewCache`], hands out the same entry for a job that
//! did not change) and the context they were computed in is the same; each cycle adds age and
//! fairshare to them, by the same function as [`crate::order`]. It keeps the last cycle's order
//! too, and sorts this cycle's keys starting from it: between two cycles most jobs keep their
//! places, and a stable merge sort over a sequence that is mostly sorted runs do little more
//! than read it. The keys are a total order (priority, submit time, id), so the order is the
//! one [`crate::order`] gives whatever the sequence the sort starts from.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use quorum_model::{Millis, Policy, QueueOrder};

use crate::priority::{self, Basis, PriorityContext, Terms};
use crate::view::{ClusterView, Name, PendingJob};

/// What the scheduler keeps between cycles ([`crate::schedule_with`]); one per leader, across
/// its cycles. Any plan made with it is the plan [`crate::schedule`] makes without it.
#[derive(Clone, Debug, Default)]
pub struct CycleCache {
    pub(crate) order: OrderCache,
}

/// The kept priority terms and the last order (see the module's documentation).
#[derive(Clone, Debug, Default)]
pub(crate) struct OrderCache {
    /// The policy and the context the kept terms were computed in: another clears them.
    basis: Option<(Policy, Option<Basis>)>,
    /// The last view's pending jobs, in its order (by id), with their terms.
    jobs: Vec<Kept>,
    /// The last cycle's order, as positions in `jobs`.
    order: Vec<u32>,
    /// The (account, user) pairs of the kept jobs, whose fairshare factor each cycle looks up
    /// once per pair rather than once per job.
    pairs: Vec<(Name, Name)>,
    pair_index: BTreeMap<(Name, Name), u32>,
}

#[derive(Clone, Debug)]
struct Kept {
    job: Arc<PendingJob>,
    /// With multifactor priority.
    terms: Option<Terms>,
    pair: u32,
    /// The job's, kept beside its terms so that its key is made without reading its entry.
    submit_ms: Millis,
    id: u64,
}

/// One job's place in the order: the larger `primary` first, then the smaller `secondary`,
/// submit time and id.
#[derive(Clone, Copy, Debug)]
struct Key {
    primary: f64,
    secondary: u64,
    submit_ms: Millis,
    id: u64,
    position: u32,
}

fn by_key(a: &Key, b: &Key) -> Ordering {
    b.primary
        .total_cmp(&a.primary)
        .then(a.secondary.cmp(&b.secondary))
        .then(a.submit_ms.cmp(&b.submit_ms))
        .then(a.id.cmp(&b.id))
}

/// `keys` in [`by_key`]'s order: by `primary` alone with a radix sort of its bits (eight
/// passes of a byte, each reading and moving the keys once, where a comparison sort of 100,000
/// keys makes 1.7 million comparisons), then each run of equal `primary` by the rest of the key.
/// The result is [`by_key`]'s order exactly: that order is total, so any sort reaches it.
fn sort(keys: &mut Vec<Key>) {
    if keys.len() < 256 {
        keys.sort_unstable_by(by_key);
        return;
    }
    // The bits of `primary` as an unsigned number whose ascending order is `f64::total_cmp`'s
    // descending one.
    let bits = |k: &Key| {
        let b = k.primary.to_bits();
        !(if b >> 63 == 1 { !b } else { b | 1 << 63 })
    };
    let mut from = std::mem::take(keys);
    let mut to = Vec::with_capacity(from.len());
    for shift in (0..64).step_by(8) {
        let mut counts = [0usize; 256];
        for k in &from {
            counts[(bits(k) >> shift) as usize & 0xff] += 1;
        }
        if counts.contains(&from.len()) {
            continue; // every key has the same byte here: this pass would move nothing
        }
        let mut next = [0usize; 256];
        for b in 1..256 {
            next[b] = next[b - 1] + counts[b - 1];
        }
        to.clear();
        to.resize(from.len(), from[0]);
        for k in &from {
            let b = (bits(k) >> shift) as usize & 0xff;
            to[next[b]] = *k;
            next[b] += 1;
        }
        std::mem::swap(&mut from, &mut to);
    }
    // Ties of `primary` (an operator's priorities, or every job under FIFO) by the rest.
    let mut start = 0;
    while start < from.len() {
        let b = bits(&from[start]);
        let end = start + from[start..].iter().position(|k| bits(k) != b).unwrap_or(from.len() - start);
        if end - start > 1 {
            from[start..end].sort_unstable_by(by_key);
        }
        start = end;
    }
    *keys = from;
}

/// More interned pairs than this many per kept job (and a floor) and the interner starts
/// again: users come and go over a long leadership.
const PAIRS_PER_JOB: usize = 4;
const PAIRS_FLOOR: usize = 4096;

impl OrderCache {
    /// Stage 1, [`crate::order`]'s result, from what the last cycle kept.
    pub(crate) fn order<'a>(&mut self, view: &'a ClusterView, now_ms: Millis, policy: &Policy) -> Vec<&'a PendingJob> {
        debug_assert!(view.pending.windows(2).all(|w| w[0].id < w[1].id), "the view's pending jobs are in id order");
        let ctx = (policy.ordering == QueueOrder::Multifactor).then(|| PriorityContext::new(view, now_ms, policy));
        let basis = (policy.clone(), ctx.as_ref().map(|c| c.basis(view)));
        let old = std::mem::take(&mut self.jobs);
        // Kept terms are good while their context is; kept pairs while the interner keeps them.
        let reusable =
            self.basis.as_ref() == Some(&basis) && self.pairs.len() <= PAIRS_FLOOR.max(PAIRS_PER_JOB * old.len());
        if !reusable {
            self.pairs.clear();
            self.pair_index.clear();
        }
        self.basis = Some(basis);

        // The jobs of the last view and of this one, both in id order, walked together.
        let mut moved = vec![u32::MAX; old.len()];
        let mut kept: Vec<Kept> = Vec::with_capacity(view.pending.len());
        let mut old_jobs = old.into_iter().enumerate().peekable();
        for (position, job) in view.pending.iter().enumerate() {
            while old_jobs.next_if(|(_, k)| k.job.id < job.id).is_some() {}
            let last = old_jobs.next_if(|(_, k)| k.job.id == job.id);
            if let Some((i, _)) = &last {
                moved[*i] = position as u32;
            }
            let k = match last {
                Some((_, k)) if reusable && Arc::ptr_eq(&k.job, job) => k,
                _ => Kept {
                    job: job.clone(),
                    terms: ctx.as_ref().map(|c| c.terms(view, job, policy)),
                    pair: self.pair(&job.account, &job.user),
                    submit_ms: job.submit_ms,
                    id: job.id,
                },
            };
            kept.push(k);
        }

        // This cycle's keys, in the last cycle's order, then the new jobs in id order.
        let mut fairshare: Vec<Option<f64>> = vec![None; self.pairs.len()];
        let pairs = &self.pairs;
        let mut key = |position: u32| {
            let k = &kept[position as usize];
            let (primary, secondary) = match (&ctx, policy.ordering) {
                (Some(ctx), _) => {
                    let terms = k.terms.expect("terms are kept under multifactor priority");
                    let (account, user) = &pairs[k.pair as usize];
                    let fs = *fairshare[k.pair as usize].get_or_insert_with(|| ctx.fairshare_of(account, user));
                    (terms.total(priority::age(terms.eligible_ms, now_ms, policy), fs, policy), 0)
                }
                (None, QueueOrder::ShortestFirst) => (operator(&k.job), k.job.duration_s()),
                (None, _) => (operator(&k.job), 0),
            };
            Key { primary, secondary, submit_ms: k.submit_ms, id: k.id, position }
        };
        let mut seen = vec![false; kept.len()];
        let mut keys: Vec<Key> = Vec::with_capacity(kept.len());
        for &p in self.order.iter().map(|&i| &moved[i as usize]).filter(|&&p| p != u32::MAX) {
            seen[p as usize] = true;
            keys.push(key(p));
        }
        for p in (0..kept.len() as u32).filter(|&p| !seen[p as usize]) {
            keys.push(key(p));
        }
        sort(&mut keys);

        self.order = keys.iter().map(|k| k.position).collect();
        self.jobs = kept;
        let ordered: Vec<&PendingJob> = keys.iter().map(|k| &*view.pending[k.position as usize]).collect();
        debug_assert_eq!(ordered.len(), view.pending.len(), "order must consider every pending job once");
        ordered
    }

    /// The interned index of (`account`, `user`).
    fn pair(&mut self, account: &Name, user: &Name) -> u32 {
        let next = self.pairs.len() as u32;
        *self.pair_index.entry((account.clone(), user.clone())).or_insert_with(|| {
            self.pairs.push((account.clone(), user.clone()));
            next
        })
    }
}

/// An operator's priority first, highest first; jobs without one after them.
fn operator(job: &PendingJob) -> f64 {
    job.priority.map_or(-1.0, f64::from)
}
