//! Priority: Slurm's multifactor formula, with every factor kept so that users can see why a
//! job ranks where it does, and the fairshare factors it uses.
//!
//! priority = w_age·age + w_fairshare·fairshare + w_size·job_size + w_partition·partition
//!            + w_qos·qos + Σ w_tres·tres − nice, each factor in [0, 1]; a TRES factor is the
//!            job's share of what its partition holds of that resource (`PriorityWeightTRES`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::view::{ClusterView, PendingJob};
use quorum_model::Policy;
use quorum_model::{JobId, Millis};

/// One job's factors, each in [0, 1], and its total.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Factors {
    pub age: f64,
    pub fairshare: f64,
    pub job_size: f64,
    pub partition: f64,
    pub qos: f64,
    /// Its TRES factors, in [`quorum_model::TresWeights::NAMES`]' order (CPUs, memory, nodes,
    /// GPUs): each its share of what its partition holds; zero where the weight is.
    pub tres: [f64; 4],
    pub nice: i32,
    pub total: f64,
}

/// An account's place in the fairshare tree.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AccountShare {
    pub name: String,
    pub parent: Option<String>,
    pub raw_shares: u32,
    /// Its fraction of the whole cluster: shares normalised per level, multiplied down the tree.
    pub norm_shares: f64,
    /// Decayed usage of it and its sub-accounts, in billed TRES-seconds, with what their
    /// running jobs have run so far ([`crate::view::Charge`]).
    pub raw_usage: f64,
    pub norm_usage: f64,
    /// `2^(-norm_usage / norm_shares)`.
    pub fairshare: f64,
}

/// The fairshare factor of every account at `now`.
///
/// Usage is normalised by the larger of the total decayed usage and what the cluster could
/// deliver in one half-life, so that when usage decays away every factor returns to 1. Running
/// jobs count as they run: their owners' usage grows by what they have run so far.
pub fn fairshare(view: &ClusterView, now_ms: Millis, policy: &Policy) -> BTreeMap<String, AccountShare> {
    let running = running(view, now_ms, policy);
    account_shares(view, now_ms, policy, &running, usage_denominator(view, now_ms, policy, &running))
}

/// The accounts' and their users' fairshare at `now` ([`fairshare`], [`user_fairshare`]), the
/// usage normalised once for both.
pub fn fairshare_tree(
    view: &ClusterView,
    now_ms: Millis,
    policy: &Policy,
) -> (BTreeMap<String, AccountShare>, BTreeMap<String, AccountUsers>) {
    let running = running(view, now_ms, policy);
    let denominator = usage_denominator(view, now_ms, policy, &running);
    let accounts = account_shares(view, now_ms, policy, &running, denominator);
    let users = users_of(view, &accounts, now_ms, policy, &running, denominator);
    (accounts, users)
}

/// What the running jobs have run so far (billed TRES-seconds, [`crate::view::Charge`]): by
/// account, and by account and user. Charged to them when they end; counted meanwhile.
struct Running<'a> {
    accounts: BTreeMap<&'a str, f64>,
    users: BTreeMap<(&'a str, &'a str), f64>,
    total: f64,
}

fn running<'a>(view: &'a ClusterView, now_ms: Millis, policy: &Policy) -> Running<'a> {
    // Summed in hash maps (a running job's owners are looked up once per job, and there are
    // tens of thousands), each sum in the running jobs' order as before, then ordered.
    // With a fixed hasher: the core reads no randomness, even where the result would not show it.
    type Fixed = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;
    let mut accounts: std::collections::HashMap<&str, f64, Fixed> = Default::default();
    let mut users: std::collections::HashMap<(&str, &str), f64, Fixed> = Default::default();
    let mut total = 0.0;
    for j in &view.running {
        let billed = j.charge.billed_at(now_ms, policy);
        if billed > 0.0 {
            *accounts.entry(j.account.as_str()).or_default() += billed;
            *users.entry((j.account.as_str(), j.user.as_str())).or_default() += billed;
            total += billed;
        }
    }
    Running { accounts: accounts.into_iter().collect(), users: users.into_iter().collect(), total }
}

fn account_shares(
    view: &ClusterView,
    now_ms: Millis,
    policy: &Policy,
    running: &Running,
    denominator: f64,
) -> BTreeMap<String, AccountShare> {
    let half_life_ms = policy.half_life_s * 1000;
    let mut decayed: BTreeMap<&str, f64> =
        view.usage.iter().map(|(a, u)| (a.as_str(), u.at(now_ms, half_life_ms))).collect();
    for (account, billed) in &running.accounts {
        *decayed.entry(account).or_default() += billed;
    }

    let mut out = BTreeMap::new();
    // Sibling share sums, by parent (None for top-level accounts).
    let mut sibling_sum: BTreeMap<Option<&str>, u64> = BTreeMap::new();
    for a in view.accounts.values() {
        *sibling_sum.entry(a.parent.as_deref()).or_default() += u64::from(a.shares);
    }
    let mut subtree_usage: BTreeMap<&str, f64> = BTreeMap::new();
    for (account, usage) in &decayed {
        let mut next = Some(*account);
        let mut hops = 0;
        while let Some(a) = next {
            *subtree_usage.entry(a).or_default() += usage;
            next = view.accounts.get(a).and_then(|acc| acc.parent.as_deref());
            hops += 1;
            if hops > 64 {
                break;
            }
        }
    }
    for a in view.accounts.values() {
        let mut norm = 1.0;
        let mut current = Some(a);
        let mut hops = 0;
        while let Some(acc) = current {
            let sum = sibling_sum.get(&acc.parent.as_deref()).copied().unwrap_or(0);
            norm *= if sum == 0 { 0.0 } else { f64::from(acc.shares) / sum as f64 };
            current = acc.parent.as_ref().and_then(|p| view.accounts.get(p));
            hops += 1;
            if hops > 64 {
                break;
            }
        }
        let raw_usage = subtree_usage.get(a.name.as_str()).copied().unwrap_or(0.0);
        out.insert(a.name.clone(), share(a.name.clone(), a.parent.clone(), a.shares, norm, raw_usage, denominator));
    }
    // Accounts with usage but no entry in the tree (the implicit root when none is configured).
    for (a, _) in decayed.iter().filter(|(a, _)| !view.accounts.contains_key(**a)) {
        let raw = subtree_usage.get(a).copied().unwrap_or(0.0);
        out.insert(a.to_string(), share(a.to_string(), None, 1, 1.0, raw, denominator));
    }
    out
}

/// A user's place under an account (Slurm's user association).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UserShare {
    pub account: String,
    pub user: String,
    pub raw_shares: u32,
    /// The account's fraction times the user's part of it (its shares over those of the
    /// account's users and sub-accounts together).
    pub norm_shares: f64,
    /// The user's decayed usage under the account, in billed TRES-seconds, with what the
    /// user's running jobs there have run so far.
    pub raw_usage: f64,
    /// Slurm's effective usage: the user's own normalised usage, plus the part of the account's
    /// usage beyond it in proportion to the user's shares among its siblings, so that a busy
    /// account lowers each of its users a little and a busy user lowers itself most.
    pub effective_usage: f64,
    /// `2^(-effective_usage / norm_shares)`.
    pub fairshare: f64,
}

/// The users of one account.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AccountUsers {
    pub users: BTreeMap<String, UserShare>,
    /// The factor of a user with one share and no usage who is not listed (root charging the
    /// account, or a user added since): as if they were one more sibling.
    pub newcomer: f64,
}

impl AccountUsers {
    pub fn factor(&self, user: &str) -> f64 {
        self.users.get(user).map_or(self.newcomer, |u| u.fairshare)
    }
}

/// The fairshare of each user under each account: the members of every account, and whoever
/// else has usage charged to one. `accounts` is [`fairshare`]'s.
pub fn user_fairshare(
    view: &ClusterView,
    accounts: &BTreeMap<String, AccountShare>,
    now_ms: Millis,
    policy: &Policy,
) -> BTreeMap<String, AccountUsers> {
    let running = running(view, now_ms, policy);
    users_of(view, accounts, now_ms, policy, &running, usage_denominator(view, now_ms, policy, &running))
}

fn users_of(
    view: &ClusterView,
    accounts: &BTreeMap<String, AccountShare>,
    now_ms: Millis,
    policy: &Policy,
    running: &Running,
    denominator: f64,
) -> BTreeMap<String, AccountUsers> {
    let half_life_ms = policy.half_life_s * 1000;
    // Shares of sub-accounts, by parent: a user's siblings are the account's users and its
    // sub-accounts together, as in Slurm's association tree.
    let mut child_shares: BTreeMap<&str, u64> = BTreeMap::new();
    for a in view.accounts.values() {
        if let Some(p) = a.parent.as_deref() {
            *child_shares.entry(p).or_default() += u64::from(a.shares);
        }
    }
    let none = BTreeMap::new();
    let mut out: BTreeMap<String, AccountUsers> = BTreeMap::new();
    for (name, account_share) in accounts {
        let acc = view.accounts.get(name);
        let used = view.user_usage.get(name).unwrap_or(&none);
        let mut users: Vec<&str> = acc.map(|a| a.users.iter().map(String::as_str).collect()).unwrap_or_default();
        users.extend(used.keys().map(String::as_str).filter(|u| !acc.is_some_and(|a| a.users.contains(*u))));
        let runs = running.users.range((name.as_str(), "")..).take_while(|((a, _), _)| *a == name.as_str());
        for ((_, u), _) in runs {
            if !users.contains(u) {
                users.push(u);
            }
        }
        let shares_of = |u: &str| acc.map_or(1, |a| a.user_shares_of(u));
        let siblings: u64 = users.iter().map(|u| u64::from(shares_of(u))).sum::<u64>()
            + child_shares.get(name.as_str()).copied().unwrap_or(0);
        let factor = |part: f64, own: f64| {
            let norm_shares = account_share.norm_shares * part;
            let effective_usage = own + (account_share.norm_usage - own).max(0.0) * part;
            let fairshare =
                if norm_shares <= 0.0 { 0.0 } else { quorum_model::accounts::exp2_neg(effective_usage / norm_shares) };
            (norm_shares, effective_usage, fairshare)
        };
        let mut row = AccountUsers { newcomer: factor(1.0 / (siblings + 1) as f64, 0.0).2, ..Default::default() };
        for user in users {
            let raw_shares = shares_of(user);
            let part = if siblings == 0 { 0.0 } else { f64::from(raw_shares) / siblings as f64 };
            let ran = running.users.get(&(name.as_str(), user)).copied().unwrap_or(0.0);
            let raw_usage = used.get(user).map_or(0.0, |u| u.at(now_ms, half_life_ms)) + ran;
            let (norm_shares, effective_usage, fairshare) = factor(part, raw_usage / denominator);
            row.users.insert(
                user.to_string(),
                UserShare {
                    account: name.clone(),
                    user: user.to_string(),
                    raw_shares,
                    norm_shares,
                    raw_usage,
                    effective_usage,
                    fairshare,
                },
            );
        }
        out.insert(name.clone(), row);
    }
    out
}

/// What usage is normalised by: the larger of the total decayed usage and what the cluster
/// could deliver in one half-life.
fn usage_denominator(view: &ClusterView, now_ms: Millis, policy: &Policy, running: &Running) -> f64 {
    let half_life_ms = policy.half_life_s * 1000;
    let total: f64 = view.usage.values().map(|u| u.at(now_ms, half_life_ms)).sum::<f64>() + running.total;
    let capacity = billed_capacity(view, policy) * policy.half_life_s as f64;
    total.max(capacity).max(1.0)
}

/// What the cluster holds, in billed TRES ([`Policy::billed`]).
fn billed_capacity(view: &ClusterView, policy: &Policy) -> f64 {
    let cap = view.total_capacity();
    policy.billed(cap.cpus.max(0) as u64, cap.gpus.max(0) as u64) as f64
}

fn share(name: String, parent: Option<String>, raw: u32, norm: f64, raw_usage: f64, denominator: f64) -> AccountShare {
    let norm_usage = raw_usage / denominator;
    let fairshare = if norm <= 0.0 { 0.0 } else { quorum_model::accounts::exp2_neg(norm_usage / norm) };
    AccountShare { name, parent, raw_shares: raw, norm_shares: norm, raw_usage, norm_usage, fairshare }
}

/// Context shared by every job's priority in one cycle.
pub struct PriorityContext {
    pub shares: BTreeMap<String, AccountShare>,
    /// The users of each account; a job's fairshare factor is its user's under its account.
    pub users: BTreeMap<String, AccountUsers>,
    /// What the cluster holds, in billed TRES (CPUs, each GPU `gpu_billing_weight` of them).
    cluster_billed: f64,
    max_tier: u32,
    max_qos: u32,
    /// What each partition holds of each TRES (as [`Factors::tres`]), when any TRES weighs.
    partition_tres: BTreeMap<String, [f64; 4]>,
}

/// What each partition's schedulable nodes hold: CPUs, memory (MB), nodes, GPUs.
fn partition_tres(view: &ClusterView) -> BTreeMap<String, [f64; 4]> {
    let parts = view.cpu_parts.max(1);
    view.partitions
        .iter()
        .map(|(name, p)| {
            let mut held = [0.0; 4];
            for n in p.nodes.iter().filter_map(|&i| view.nodes.get(i)).filter(|n| n.schedulable) {
                held[0] += (n.capacity.cpus / parts) as f64;
                held[1] += n.capacity.mem as f64;
                held[2] += 1.0;
                held[3] += n.capacity.gpus as f64;
            }
            (name.clone(), held)
        })
        .collect()
}

impl PriorityContext {
    pub fn new(view: &ClusterView, now_ms: Millis, policy: &Policy) -> Self {
        let (shares, users) = fairshare_tree(view, now_ms, policy);
        Self {
            shares,
            users,
            cluster_billed: billed_capacity(view, policy).max(1.0),
            max_tier: view.partitions.values().map(|p| p.tier).max().unwrap_or(0),
            max_qos: view.qos.values().map(|q| q.priority).max().unwrap_or(0),
            partition_tres: if policy.tres_weights.is_zero() { BTreeMap::new() } else { partition_tres(view) },
        }
    }

    /// `job`'s TRES factors: what it asks for (every component) as a share of what its
    /// partition holds, for each TRES that weighs.
    fn tres(&self, job: &PendingJob, policy: &Policy) -> [f64; 4] {
        let mut factors = [0.0; 4];
        let Some(held) = self.partition_tres.get(&*job.partition) else { return factors };
        let mut asked = [0.0; 4];
        for c in job.components() {
            let nodes = f64::from(c.nodes);
            asked[0] += c.total_cpus().max(0) as f64;
            asked[1] += c.per_node.mem.max(0) as f64 * nodes;
            asked[2] += nodes;
            asked[3] += c.total_gpus().max(0) as f64;
        }
        for (i, w) in policy.tres_weights.each().into_iter().enumerate() {
            if w > 0 && held[i] > 0.0 {
                factors[i] = (asked[i] / held[i]).min(1.0);
            }
        }
        factors
    }

    pub fn factors(&self, view: &ClusterView, job: &PendingJob, now_ms: Millis, policy: &Policy) -> Factors {
        let age = age(job.eligible_ms(), now_ms, policy);
        let fairshare = self.fairshare_of(&job.account, &job.user);
        let (job_size, partition, qos, tres) = self.job_factors(view, job, policy);
        let total = Terms::of(job, (job_size, partition, qos, tres), policy).total(age, fairshare, policy);
        Factors { age, fairshare, job_size, partition, qos, tres, nice: job.nice, total }
    }

    /// The fairshare factor of `user`'s jobs under `account`.
    pub fn fairshare_of(&self, account: &str, user: &str) -> f64 {
        match self.users.get(account) {
            Some(users) => users.factor(user),
            None => self.shares.get(account).map(|s| s.fairshare).unwrap_or(1.0),
        }
    }

    /// The factors of `job` that depend on it and the cycle's context alone, not on the time:
    /// job size, partition, QOS and TRES.
    fn job_factors(&self, view: &ClusterView, job: &PendingJob, policy: &Policy) -> (f64, f64, f64, [f64; 4]) {
        // What it asks for as Slurm's TRES billing counts it: its CPUs, and each GPU as
        // `gpu_billing_weight` CPUs (a 4-GPU job is not sized by its few CPUs).
        let billed = policy.billed(job.total_cpus().max(0) as u64, job.total_gpus().max(0) as u64);
        let size = (billed as f64 / self.cluster_billed).min(1.0);
        let job_size = if policy.favor_small { 1.0 - size } else { size };
        let tier = view.partitions.get(&*job.partition).map(|p| p.tier).unwrap_or(0);
        let partition = if self.max_tier == 0 { 0.0 } else { f64::from(tier) / f64::from(self.max_tier) };
        let qos_prio = view.qos.get(&*job.qos).map(|q| q.priority).unwrap_or(0);
        let qos = if self.max_qos == 0 { 0.0 } else { f64::from(qos_prio) / f64::from(self.max_qos) };
        (job_size, partition, qos, self.tres(job, policy))
    }

    /// [`Terms`] of `job` in this context.
    pub(crate) fn terms(&self, view: &ClusterView, job: &PendingJob, policy: &Policy) -> Terms {
        Terms::of(job, self.job_factors(view, job, policy), policy)
    }

    /// What the weights of the factors that depend only on the job ([`Terms`]) were computed
    /// from besides the job: while it is the same, a job's terms are.
    pub(crate) fn basis(&self, view: &ClusterView) -> Basis {
        Basis {
            cluster_billed: self.cluster_billed,
            partition_tres: self.partition_tres.clone(),
            tiers: view.partitions.iter().map(|(n, p)| (n.clone(), p.tier)).collect(),
            qos: view.qos.iter().map(|(n, q)| (n.clone(), q.priority)).collect(),
        }
    }
}

/// The age factor of a job eligible since `eligible_ms`, at `now_ms`.
pub(crate) fn age(eligible_ms: Millis, now_ms: Millis, policy: &Policy) -> f64 {
    let age_s = now_ms.saturating_sub(eligible_ms) as f64 / 1000.0;
    if policy.max_age_s == 0 {
        1.0
    } else {
        (age_s / policy.max_age_s as f64).min(1.0)
    }
}

/// The weighted terms of a job's priority that do not change with time or usage, and what
/// replaces the sum: the scheduler keeps them between cycles for jobs that did not change
/// ([`crate::order::OrderCache`]); [`Terms::total`] adds age and fairshare in the formula's
/// order, so that a total from kept terms is the one [`PriorityContext::factors`] computes, to
/// the bit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Terms {
    job_size: f64,
    partition: f64,
    qos: f64,
    tres: f64,
    nice: f64,
    /// An operator's number (`--priority`): the total, whatever the factors.
    operator: Option<u32>,
    pub eligible_ms: Millis,
}

impl Terms {
    fn of(job: &PendingJob, (job_size, partition, qos, tres): (f64, f64, f64, [f64; 4]), policy: &Policy) -> Terms {
        let w = &policy.weights;
        Terms {
            job_size: f64::from(w.job_size) * job_size,
            partition: f64::from(w.partition) * partition,
            qos: f64::from(w.qos) * qos,
            tres: policy.tres_weights.each().iter().zip(tres).map(|(w, f)| f64::from(*w) * f).sum(),
            nice: f64::from(job.nice),
            operator: job.priority,
            eligible_ms: job.eligible_ms(),
        }
    }

    /// The priority with these terms, at this age and fairshare factor.
    pub(crate) fn total(&self, age: f64, fairshare: f64, policy: &Policy) -> f64 {
        let w = &policy.weights;
        let total = f64::from(w.age) * age
            + f64::from(w.fairshare) * fairshare
            + self.job_size
            + self.partition
            + self.qos
            + self.tres
            - self.nice;
        // An operator's number replaces the sum (the factors are still shown).
        self.operator.map_or(total, f64::from)
    }
}

/// See [`PriorityContext::basis`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Basis {
    cluster_billed: f64,
    partition_tres: BTreeMap<String, [f64; 4]>,
    tiers: Vec<(String, u32)>,
    qos: Vec<(String, u32)>,
}

/// Every pending job's factors, for `quorum prio`.
pub fn breakdown(view: &ClusterView, now_ms: Millis, policy: &Policy) -> BTreeMap<JobId, Factors> {
    let ctx = PriorityContext::new(view, now_ms, policy);
    view.pending.iter().map(|j| (j.id, ctx.factors(view, j, now_ms, policy))).collect()
}
