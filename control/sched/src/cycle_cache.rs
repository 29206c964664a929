//! What one scheduling cycle keeps for the next, so that a cycle after a few submits and ends
//! pays for them rather than for the whole queue again.
//!
//! **The order.** A job's priority is age and fairshare, which move with the time and the
//! usage, plus terms that depend on the job and on the policy, partitions and QOS alone
//! ([`Terms`]). The cache keeps each pending job's terms while its view entry is the same one
//! (the view's own cache, [`crate::view::ViewCache`], hands out the same entry for a job that
//! did not change) and the context they were computed in is the same; each cycle adds age and
//! fairshare to them, by the same function as [`crate::order`], and sorts the keys with a
//! radix sort of the priority's bits. The keys are a total order (priority, submit time, id),
//! so the order is the one [`crate::order`] gives.
//!
//! Why not the last cycle's order as well: with fairshare charging running jobs as they run,
//! every pair of account and user moves by its own amount each cycle, and a third of the
//! neighbours in a queue of 100,000 trade places from one second to the next (measured on
//! `benches/sched.rs`' cluster); a sort that starts from the last order gains nothing there.

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

/// The kept priority terms (see the module's documentation).
#[derive(Clone, Debug, Default)]
pub(crate) struct OrderCache {
    /// The policy and the context the kept terms were computed in: another clears them.
    basis: Option<(Policy, Option<Basis>)>,
    /// The last view's pending jobs, in its order (by id), with their terms.
    jobs: Vec<Kept>,
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
}

fn by_key(a: &Key, b: &Key) -> Ordering {
    b.primary
        .total_cmp(&a.primary)
        .then(a.secondary.cmp(&b.secondary))
        .then(a.submit_ms.cmp(&b.submit_ms))
        .then(a.id.cmp(&b.id))
}

/// `f64::total_cmp`'s descending order as an unsigned number's ascending one.
fn descending_bits(x: f64) -> u64 {
    let b = x.to_bits();
    !(if b >> 63 == 1 { !b } else { b | 1 << 63 })
}

/// The positions of `keys` in [`by_key`]'s order: by `primary` alone with a radix sort of its
/// bits (eight passes of a byte over 12-byte items, each reading and moving them once, where a
/// comparison sort of 100,000 keys makes 1.7 million comparisons), then each run of equal
/// `primary` by the rest of the key. That order is total, so this is [`by_key`]'s exactly.
fn sorted(keys: &[Key]) -> Vec<u32> {
    if keys.len() < 256 {
        let mut order: Vec<u32> = (0..keys.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| by_key(&keys[a as usize], &keys[b as usize]));
        return order;
    }
    let mut from: Vec<(u64, u32)> =
        keys.iter().enumerate().map(|(i, k)| (descending_bits(k.primary), i as u32)).collect();
    let mut to = vec![(0, 0); from.len()];
    for shift in (0..64).step_by(8) {
        let mut counts = [0usize; 256];
        for (bits, _) in &from {
            counts[(bits >> shift) as usize & 0xff] += 1;
        }
        if counts.contains(&from.len()) {
            continue; // every key has the same byte here: this pass would move nothing
        }
        let mut next = [0usize; 256];
        for b in 1..256 {
            next[b] = next[b - 1] + counts[b - 1];
        }
        for &item in &from {
            let b = (item.0 >> shift) as usize & 0xff;
            to[next[b]] = item;
            next[b] += 1;
        }
        std::mem::swap(&mut from, &mut to);
    }
    // Ties of `primary` (an operator's priorities, or every job under FIFO) by the rest.
    let mut start = 0;
    while start < from.len() {
        let bits = from[start].0;
        let end = start + from[start..].iter().position(|&(b, _)| b != bits).unwrap_or(from.len() - start);
        if end - start > 1 {
            from[start..end].sort_unstable_by(|a, b| by_key(&keys[a.1 as usize], &keys[b.1 as usize]));
        }
        start = end;
    }
    from.into_iter().map(|(_, i)| i).collect()
}

/// At most this many jobs get a kept entry in one cycle (see [`OrderCache::order`]); a few in
/// the tests, so that their small queues take both ways.
#[cfg(not(test))]
const KEEP_PER_CYCLE: usize = 2_000;
#[cfg(test)]
const KEEP_PER_CYCLE: usize = 3;

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

        // The jobs of the last view and of this one, both in id order, walked together: a job
        // whose entry is the same one keeps what was computed of it, without its entry being
        // read; any other is computed again.
        // A job without a kept entry gets one while this cycle's budget lasts; past it, its key
        // is made as the full path makes it, and it is kept in a later cycle. The first cycle
        // of a leader (or after a change of context) so costs what a cycle from nothing does,
        // plus the budget's entries: each is a reference taken on the job's view entry.
        let mut kept: Vec<Kept> = Vec::with_capacity(view.pending.len().min(old.len() + KEEP_PER_CYCLE));
        let mut fresh = 0;
        let mut slots: Vec<Result<u32, Key>> = Vec::with_capacity(view.pending.len());
        let mut old_jobs = old.into_iter().peekable();
        for job in &view.pending {
            let mut same = old_jobs.next_if(|k| Arc::ptr_eq(&k.job, job));
            if same.is_none() {
                // Past the jobs that left, to this one's last entry if it had one.
                while old_jobs.next_if(|k| k.id < job.id).is_some() {}
                same = old_jobs.next_if(|k| k.id == job.id).filter(|k| Arc::ptr_eq(&k.job, job));
            }
            let k = match same {
                Some(k) if reusable => k,
                _ if fresh < KEEP_PER_CYCLE => {
                    fresh += 1;
                    Kept {
                        job: job.clone(),
                        terms: ctx.as_ref().map(|c| c.terms(view, job, policy)),
                        pair: self.pair(&job.account, &job.user),
                        submit_ms: job.submit_ms,
                        id: job.id,
                    }
                }
                _ => {
                    let terms = ctx.as_ref().map(|c| c.terms(view, job, policy));
                    let fairshare = || ctx.as_ref().map_or(0.0, |c| c.fairshare_of(&job.account, &job.user));
                    let (primary, secondary) = key_of(job, terms, fairshare, now_ms, policy);
                    slots.push(Err(Key { primary, secondary, submit_ms: job.submit_ms, id: job.id }));
                    continue;
                }
            };
            slots.push(Ok(kept.len() as u32));
            kept.push(k);
        }

        // This cycle's keys: age and fairshare added to the kept terms.
        let mut fairshare: Vec<Option<f64>> = vec![None; self.pairs.len()];
        let mut kept_key = |k: &Kept| {
            let (account, user) = &self.pairs[k.pair as usize];
            let fs = &mut fairshare[k.pair as usize];
            let fairshare = || *fs.get_or_insert_with(|| ctx.as_ref().map_or(0.0, |c| c.fairshare_of(account, user)));
            let (primary, secondary) = key_of(&k.job, k.terms, fairshare, now_ms, policy);
            Key { primary, secondary, submit_ms: k.submit_ms, id: k.id }
        };
        let keys: Vec<Key> =
            slots.into_iter().map(|slot| slot.map_or_else(|key| key, |i| kept_key(&kept[i as usize]))).collect();
        let ordered: Vec<&PendingJob> = sorted(&keys).into_iter().map(|i| &*view.pending[i as usize]).collect();
        self.jobs = kept;
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

/// A job's (primary, secondary) key this cycle, as the full path orders: under multifactor
/// priority its `terms` with age and its `fairshare` (asked only then) added; otherwise an
/// operator's number, and its run time where the shortest go first. `job` is read only
/// without terms.
fn key_of(
    job: &PendingJob,
    terms: Option<Terms>,
    fairshare: impl FnOnce() -> f64,
    now_ms: Millis,
    policy: &Policy,
) -> (f64, u64) {
    match (terms, policy.ordering) {
        (Some(terms), _) => (terms.total(priority::age(terms.eligible_ms, now_ms, policy), fairshare(), policy), 0),
        (None, QueueOrder::ShortestFirst) => (operator(job), job.duration_s()),
        (None, _) => (operator(job), 0),
    }
}

/// An operator's priority first, highest first; jobs without one after them.
fn operator(job: &PendingJob) -> f64 {
    job.priority.map_or(-1.0, f64::from)
}
