//! Advance reservations, as Slurm has them (`scontrol create reservation`): nodes set aside
//! over a window of time (once, or every day or week) for some users or accounts. Jobs that ask
//! for the reservation (`--reservation`) run only on its nodes and only inside its window;
//! every other job keeps off those nodes while it is in force, so backfill never starts a job
//! that would run into it. A `maint` reservation also keeps the jobs of other reservations off
//! its nodes, and may overlap one.

use serde::{Deserialize, Serialize};

use crate::Millis;

/// The most reservations a cluster keeps: each is checked against every other when made.
pub const MAX_RESERVATIONS: usize = 1_000;

/// The most windows of a recurring reservation the scheduler looks ahead to; from the last on,
/// its nodes are taken as reserved for good (a job that long would cross one anyway).
pub const MAX_WINDOWS: usize = 64;

/// How often a reservation comes back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Recurrence {
    #[default]
    Once,
    Daily,
    Weekly,
}

impl Recurrence {
    pub fn period_ms(self) -> Option<Millis> {
        match self {
            Recurrence::Once => None,
            Recurrence::Daily => Some(86_400_000),
            Recurrence::Weekly => Some(7 * 86_400_000),
        }
    }
}

/// A reservation's flags (Slurm's `Flags=`), those this cluster honours.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResvFlags {
    /// Maintenance: jobs of other reservations keep off its nodes too, it may overlap one, and
    /// jobs waiting for its nodes say `ReqNodeNotAvail, Reserved for maintenance`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub maint: bool,
    /// Made even where running jobs would still run when it starts (they go on).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_jobs: bool,
    /// Its jobs may start before its window, run past its end, and use nodes outside it as
    /// well as its own (level 23); jobs outside it still keep off its nodes over its windows.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flex: bool,
    #[serde(default)]
    pub recurrence: Recurrence,
}

impl ResvFlags {
    /// Slurm's comma-separated flags, in any case: `MAINT`, `IGNORE_JOBS`, `DAILY`,
    /// `WEEKLY`, and `SPEC_NODES` (which Slurm shows for reservations of named nodes).
    pub fn parse(value: &str) -> Result<ResvFlags, String> {
        let mut f = ResvFlags::default();
        for word in value.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word.to_ascii_uppercase().as_str() {
                "MAINT" => f.maint = true,
                "IGNORE_JOBS" => f.ignore_jobs = true,
                "FLEX" => f.flex = true,
                "OVERLAP" | "PURGE_COMP" | "REPLACE" | "STATIC_ALLOC" | "ANY_NODES" | "NO_HOLD_JOBS_AFTER"
                | "TIME_FLOAT" | "WEEKDAY" | "WEEKEND" | "MAGNETIC" => {
                    return Err(format!(
                        "reservation flag '{word}' is not supported yet (MAINT, IGNORE_JOBS, FLEX, DAILY, WEEKLY)"
                    ))
                }
                "DAILY" => f.recurrence = Recurrence::Daily,
                "WEEKLY" => f.recurrence = Recurrence::Weekly,
                "SPEC_NODES" => {}
                other => {
                    return Err(format!("unknown reservation flag '{other}' (MAINT, IGNORE_JOBS, FLEX, DAILY, WEEKLY)"))
                }
            }
        }
        Ok(f)
    }

    /// As `scontrol show reservation` writes them.
    pub fn names(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.maint {
            out.push("MAINT");
        }
        if self.ignore_jobs {
            out.push("IGNORE_JOBS");
        }
        if self.flex {
            out.push("FLEX");
        }
        match self.recurrence {
            Recurrence::Daily => out.push("DAILY"),
            Recurrence::Weekly => out.push("WEEKLY"),
            Recurrence::Once => {}
        }
        out
    }
}

/// A reservation as the replicated state holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub name: String,
    /// In name order.
    pub nodes: Vec<String>,
    /// Its first window; a recurring one comes back every period from here.
    pub start_ms: Millis,
    /// `None`: it never ends (`Duration=UNLIMITED`, not with a recurrence).
    pub end_ms: Option<Millis>,
    /// Who may use it: a job of one of these users, or charged to one of these accounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accounts: Vec<String>,
    /// The partition its node count was chosen from, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default)]
    pub flags: ResvFlags,
}

impl Reservation {
    pub fn duration_ms(&self) -> Option<Millis> {
        self.end_ms.map(|e| e.saturating_sub(self.start_ms))
    }

    /// Its windows that have not ended by `now_ms`, the earliest first, at most `max` of them.
    pub fn windows(&self, now_ms: Millis, max: usize) -> Vec<(Millis, Option<Millis>)> {
        let Some(end) = self.end_ms else {
            return vec![(self.start_ms, None)];
        };
        let Some(period) = self.flags.recurrence.period_ms() else {
            return if end > now_ms { vec![(self.start_ms, Some(end))] } else { Vec::new() };
        };
        // The first window not yet over.
        let skip = if end > now_ms { 0 } else { (now_ms - end) / period + 1 };
        (skip..skip.saturating_add(max as u64))
            .map(|k| {
                let shift = k.saturating_mul(period);
                (self.start_ms.saturating_add(shift), Some(end.saturating_add(shift)))
            })
            .collect()
    }

    /// Its window now in force or next to come, if any.
    pub fn next_window(&self, now_ms: Millis) -> Option<(Millis, Option<Millis>)> {
        self.windows(now_ms, 1).into_iter().next()
    }

    /// Whether it is in force at `now_ms`.
    pub fn active(&self, now_ms: Millis) -> bool {
        self.next_window(now_ms).is_some_and(|(s, _)| s <= now_ms)
    }

    /// Over for good: it does not recur, and its end has passed.
    pub fn expired(&self, now_ms: Millis) -> bool {
        self.next_window(now_ms).is_none()
    }

    /// Whether a job of `user` charged to `account` may use it (`root` may use any).
    pub fn allows(&self, user: &str, account: &str) -> bool {
        user == "root" || self.users.iter().any(|u| u == user) || self.accounts.iter().any(|a| a == account)
    }

    /// Whether the two share a node at some moment (over the windows each has ahead of `now`).
    pub fn overlaps(&self, other: &Reservation, now_ms: Millis) -> bool {
        self.nodes.iter().any(|n| other.nodes.binary_search(n).is_ok()) && self.times_overlap(other, now_ms)
    }

    /// Whether a window of each (ahead of `now`) share a moment, whatever their nodes.
    pub fn times_overlap(&self, other: &Reservation, now_ms: Millis) -> bool {
        let (a, b) = (self.windows(now_ms, MAX_WINDOWS), other.windows(now_ms, MAX_WINDOWS));
        a.iter()
            .any(|&(s1, e1)| b.iter().any(|&(s2, e2)| s1 < e2.unwrap_or(Millis::MAX) && s2 < e1.unwrap_or(Millis::MAX)))
    }

    /// `ACTIVE` or `INACTIVE`, as Slurm shows it.
    pub fn state_name(&self, now_ms: Millis) -> &'static str {
        if self.active(now_ms) {
            "ACTIVE"
        } else {
            "INACTIVE"
        }
    }
}

/// How a request says when a reservation ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResvEnd {
    At(Millis),
    /// This many seconds after its start.
    After(u64),
    Unlimited,
}

/// `scontrol create|update reservation` and `quorum reservation create|update`: what to make
/// or change. On an update, what is `None` stays as it was.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResvRequest {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ms: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<ResvEnd>,
    /// Named nodes (expanded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<String>>,
    /// Or how many, chosen among those free over its window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_count: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounts: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<ResvFlags>,
}

/// The longest reservation name, user list and node list a request may carry.
pub const MAX_NAME_LEN: usize = 64;
pub const MAX_LIST_LEN: usize = 10_000;

/// The keys `scontrol create reservation` takes here, as its errors name them.
pub const KEYS: &str =
    "ReservationName, StartTime, EndTime, Duration, Nodes, NodeCnt, Users, Accounts, PartitionName, Flags";

impl ResvRequest {
    /// Reads scontrol's `KEY=VALUE` words (keys in any case); `time` reads `StartTime` and
    /// `EndTime` values (given the key, for its errors).
    pub fn from_words(
        words: &[String],
        time: &dyn Fn(&str, &str) -> Result<Millis, String>,
    ) -> Result<ResvRequest, String> {
        let mut r = ResvRequest::default();
        let list = |v: &str| v.split(',').map(str::trim).filter(|x| !x.is_empty()).map(String::from).collect();
        for word in words {
            let (key, value) = word.split_once('=').ok_or_else(|| format!("'{word}' is not KEY=VALUE ({KEYS})"))?;
            let (key, value) = (key.trim(), value.trim());
            match key.to_ascii_lowercase().as_str() {
                "reservationname" | "reservation" | "resv" | "name" => r.name = value.to_string(),
                "starttime" => r.start_ms = Some(time("StartTime", value)?),
                "endtime" => r.end = Some(ResvEnd::At(time("EndTime", value)?)),
                "duration" => {
                    r.end = Some(match crate::parse::parse_time_limit(value) {
                        Ok(Some(s)) => ResvEnd::After(s),
                        Ok(None) => ResvEnd::Unlimited,
                        Err(e) => return Err(format!("invalid Duration='{value}': {e}")),
                    })
                }
                "nodes" | "nodelist" => {
                    let nodes = crate::hostlist::expand_at_most(value, MAX_LIST_LEN)
                        .map_err(|e| format!("invalid Nodes='{value}': {e}"))?;
                    r.nodes = Some(nodes);
                }
                "nodecnt" | "nodecount" => {
                    r.node_count = Some(value.parse().map_err(|_| format!("invalid NodeCnt='{value}': give a number"))?)
                }
                "users" | "user" => r.users = Some(list(value)),
                "accounts" | "account" => r.accounts = Some(list(value)),
                "partitionname" | "partition" => r.partition = Some(value.to_string()),
                "flags" => r.flags = Some(ResvFlags::parse(value)?),
                _ => return Err(format!("'{key}' is not supported ({KEYS})")),
            }
        }
        if r.name.is_empty() {
            return Err("name the reservation: ReservationName=NAME".into());
        }
        r.check_shape()?;
        Ok(r)
    }

    /// Shape checks that need no state: a name, lists within bounds.
    pub fn check_shape(&self) -> Result<(), String> {
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= MAX_NAME_LEN
                && n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !name_ok(&self.name) {
            return Err(format!(
                "invalid reservation name '{}': 1 to {MAX_NAME_LEN} letters, digits, '-', '_' or '.'",
                self.name
            ));
        }
        for (what, list) in [("Nodes", &self.nodes), ("Users", &self.users), ("Accounts", &self.accounts)] {
            if list.as_ref().is_some_and(|l| l.len() > MAX_LIST_LEN || l.iter().any(|x| x.len() > 256)) {
                return Err(format!("invalid {what}: at most {MAX_LIST_LEN} names of at most 256 bytes"));
            }
        }
        if self.partition.as_ref().is_some_and(|p| p.len() > 256) {
            return Err("invalid PartitionName: longer than 256 bytes".into());
        }
        if self.nodes.is_some() && self.node_count.is_some() {
            return Err("give Nodes= or NodeCnt=, not both".into());
        }
        if self.node_count == Some(0) {
            return Err("invalid NodeCnt=0: a reservation needs a node".into());
        }
        Ok(())
    }

    /// The reservation this request makes of `base` (a new one: `None`), its nodes still to be
    /// chosen when it gives a count; `now_ms` is the default start.
    pub fn merge(&self, base: Option<&Reservation>, now_ms: Millis) -> Result<Reservation, String> {
        self.check_shape()?;
        let start_ms = self.start_ms.or(base.map(|b| b.start_ms)).unwrap_or(now_ms);
        let end_ms = match self.end {
            Some(ResvEnd::At(t)) => Some(t),
            Some(ResvEnd::After(s)) => Some(start_ms.saturating_add(s.saturating_mul(1000))),
            Some(ResvEnd::Unlimited) => None,
            // A new start keeps the duration.
            None => match base {
                Some(b) => b.duration_ms().map(|d| start_ms.saturating_add(d)),
                None => return Err("a reservation needs Duration= or EndTime=".into()),
            },
        };
        if end_ms.is_some_and(|e| e <= start_ms) {
            return Err("the reservation ends before it starts".into());
        }
        let flags = self.flags.or(base.map(|b| b.flags)).unwrap_or_default();
        if flags.recurrence != Recurrence::Once {
            let period = flags.recurrence.period_ms().unwrap_or(Millis::MAX);
            if end_ms.is_none_or(|e| e - start_ms > period) {
                return Err("a DAILY or WEEKLY reservation must be shorter than its period".into());
            }
        }
        let mut nodes = self.nodes.clone().or(base.map(|b| b.nodes.clone())).unwrap_or_default();
        nodes.sort();
        nodes.dedup();
        let r = Reservation {
            name: self.name.clone(),
            nodes,
            start_ms,
            end_ms,
            users: self.users.clone().or(base.map(|b| b.users.clone())).unwrap_or_default(),
            accounts: self.accounts.clone().or(base.map(|b| b.accounts.clone())).unwrap_or_default(),
            partition: self.partition.clone().or(base.and_then(|b| b.partition.clone())),
            flags,
        };
        if r.users.is_empty() && r.accounts.is_empty() {
            return Err("a reservation needs Users= or Accounts= (who may use it)".into());
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resv(start: Millis, end: Option<Millis>, recurrence: Recurrence) -> Reservation {
        Reservation {
            name: "r".into(),
            nodes: vec!["n1".into(), "n2".into()],
            start_ms: start,
            end_ms: end,
            users: vec!["alice".into()],
            accounts: vec![],
            partition: None,
            flags: ResvFlags { recurrence, ..ResvFlags::default() },
        }
    }

    #[test]
    fn windows_of_once_daily_and_unlimited_reservations() {
        let day = 86_400_000;
        let once = resv(1_000, Some(2_000), Recurrence::Once);
        assert_eq!(once.windows(0, 5), vec![(1_000, Some(2_000))]);
        assert!(!once.active(999) && once.active(1_000) && !once.active(2_000));
        assert!(once.expired(2_000) && !once.expired(1_999));
        let daily = resv(1_000, Some(2_000), Recurrence::Daily);
        assert_eq!(
            daily.windows(2_000, 2),
            vec![(day + 1_000, Some(day + 2_000)), (2 * day + 1_000, Some(2 * day + 2_000))]
        );
        assert!(daily.active(3 * day + 1_500) && !daily.expired(100 * day));
        let forever = resv(1_000, None, Recurrence::Once);
        assert_eq!(forever.windows(u64::MAX / 2, 3), vec![(1_000, None)]);
        assert!(forever.active(u64::MAX / 2));
    }

    #[test]
    fn overlap_needs_a_shared_node_and_a_shared_moment() {
        let day = 86_400_000;
        let a = resv(1_000, Some(2_000), Recurrence::Once);
        let mut b = resv(2_000, Some(3_000), Recurrence::Once);
        assert!(!a.overlaps(&b, 0), "back to back");
        b.start_ms = 1_999;
        assert!(a.overlaps(&b, 0));
        b.nodes = vec!["n3".into()];
        assert!(!a.overlaps(&b, 0), "other nodes");
        let daily = resv(day * 3 + 1_500, Some(day * 3 + 1_600), Recurrence::Once);
        assert!(resv(1_000, Some(2_000), Recurrence::Daily).overlaps(&daily, 0), "its fourth window");
    }

    #[test]
    fn requests_merge_and_refuse_what_cannot_be() {
        let req = ResvRequest {
            name: "maint".into(),
            start_ms: Some(10_000),
            end: Some(ResvEnd::After(60)),
            nodes: Some(vec!["n2".into(), "n1".into(), "n2".into()]),
            users: Some(vec!["root".into()]),
            ..ResvRequest::default()
        };
        let r = req.merge(None, 0).unwrap();
        assert_eq!((r.start_ms, r.end_ms, r.nodes.clone()), (10_000, Some(70_000), vec!["n1".into(), "n2".into()]));
        // a new start keeps the duration
        let moved = ResvRequest { name: "maint".into(), start_ms: Some(20_000), ..ResvRequest::default() };
        assert_eq!(moved.merge(Some(&r), 0).unwrap().end_ms, Some(80_000));
        let no_end = ResvRequest { end: None, ..req.clone() };
        assert!(no_end.merge(None, 0).unwrap_err().contains("Duration"));
        let nobody = ResvRequest { users: None, ..req.clone() };
        assert!(nobody.merge(None, 0).unwrap_err().contains("Users"));
        let bad = ResvRequest { name: "a b".into(), ..req.clone() };
        assert!(bad.merge(None, 0).unwrap_err().contains("invalid reservation name"));
        let backwards = ResvRequest { end: Some(ResvEnd::At(5_000)), ..req.clone() };
        assert!(backwards.merge(None, 0).unwrap_err().contains("ends before"));
        let long_daily = ResvRequest {
            end: Some(ResvEnd::After(2 * 86_400)),
            flags: Some(ResvFlags::parse("daily").unwrap()),
            ..req
        };
        assert!(long_daily.merge(None, 0).unwrap_err().contains("shorter than its period"));
        assert!(ResvFlags::parse("MAINT,bogus").unwrap_err().contains("'BOGUS'"));
        assert_eq!(ResvFlags::parse("maint,ignore_jobs,weekly").unwrap().names(), ["MAINT", "IGNORE_JOBS", "WEEKLY"]);
        assert_eq!(ResvFlags::parse("FLEX,daily").unwrap().names(), ["FLEX", "DAILY"]);
    }
}
