//! Recurring jobs (`quorum cron`, like Slurm's `scrontab` and dstack's `schedule.cron`): a cron
//! schedule in a time zone, when it next fires, and the entry the replicated state keeps. The
//! leader computes each next firing (time zones are the machine's business, not apply's) and
//! proposes it with the firing; apply fires an entry only at the time it recorded as next, so
//! a firing proposed twice (a leader failover) submits one job.

use serde::{Deserialize, Serialize};

use crate::{JobId, JobSpec, Millis};

/// The most entries a cluster keeps, and one user.
pub const MAX_ENTRIES: usize = 10_000;
pub const MAX_PER_USER: usize = 100;

/// How far ahead a schedule is searched for its next firing: one that never fires within it
/// (`0 0 30 2 *`) is refused.
const SEARCH_YEARS: u64 = 5;

/// A cron schedule: five fields (minute, hour, day of month, month, day of week), or six with
/// seconds first; `*`, lists, ranges and steps; month and day names; `@hourly`, `@daily`,
/// `@midnight`, `@weekly`, `@monthly`, `@yearly`, `@annually`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Seconds, when given (a six-field schedule); else the minute's start.
    seconds: Option<u64>,
    minutes: u64,
    hours: u64,
    /// Bits 1..=31.
    days: u64,
    /// Bits 1..=12.
    months: u64,
    /// Bits 0..=6, Sunday 0.
    weekdays: u64,
    days_any: bool,
    weekdays_any: bool,
}

const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// One field's values as bits, from `min` to `max`; `names` are values from `min` on.
fn field(text: &str, what: &str, min: u64, max: u64, names: &[&str]) -> Result<(u64, bool), String> {
    let bad = |why: String| Err(format!("invalid {what} field '{text}': {why}"));
    let value = |v: &str| -> Result<u64, String> {
        let lower = v.to_ascii_lowercase();
        if let Some(i) = names.iter().position(|n| *n == lower) {
            return Ok(min + i as u64);
        }
        match v.parse::<u64>() {
            // Sunday is 0 or 7.
            Ok(7) if what == "day-of-week" => Ok(0),
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(format!("invalid {what} field '{text}': '{v}' is not from {min} to {max}")),
        }
    };
    let mut bits = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => match s.parse::<u64>() {
                Ok(s) if s > 0 && s <= max => (r, s),
                _ => return bad(format!("step '{s}' is not from 1 to {max}")),
            },
            None => (item, 1),
        };
        let (lo, hi) = match range {
            "*" => (min, max),
            r => match r.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                // `a/n`: from a every n to the end.
                None if step > 1 => (value(r)?, max),
                None => (value(r)?, value(r)?),
            },
        };
        if lo > hi {
            return bad(format!("range {lo}-{hi} runs backwards"));
        }
        for v in (lo..=hi).step_by(step as usize) {
            bits |= 1 << v;
        }
    }
    if bits == 0 {
        return bad("no value".into());
    }
    Ok((bits, text == "*"))
}

impl Schedule {
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let text = text.trim();
        let expanded = match text.to_ascii_lowercase().as_str() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            t if t.starts_with('@') => {
                return Err(format!(
                    "unknown schedule '{text}' (@yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly)"
                ))
            }
            _ => text,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let (seconds, rest) = match fields.len() {
            5 => (None, &fields[..]),
            6 => (Some(field(fields[0], "second", 0, 59, &[])?.0), &fields[1..]),
            n => {
                return Err(format!(
                    "invalid schedule '{text}': {n} fields; give minute hour day-of-month month day-of-week (or seconds first)"
                ))
            }
        };
        let (days, days_any) = field(rest[2], "day-of-month", 1, 31, &[])?;
        let (weekdays, weekdays_any) = field(rest[4], "day-of-week", 0, 7, &WEEKDAYS)?;
        Ok(Schedule {
            seconds,
            minutes: field(rest[0], "minute", 0, 59, &[])?.0,
            hours: field(rest[1], "hour", 0, 23, &[])?.0,
            days,
            months: field(rest[3], "month", 1, 12, &MONTHS)?.0,
            // 7 is Sunday too.
            weekdays: (weekdays | (weekdays >> 7)) & 0x7f,
            days_any,
            weekdays_any,
        })
    }

    /// Cron's rule: with both restricted, a day matches either; else the restricted one.
    fn day_matches(&self, t: &Fields) -> bool {
        let dom = self.days & (1 << t.day) != 0;
        let dow = self.weekdays & (1 << t.weekday) != 0;
        match (self.days_any, self.weekdays_any) {
            (false, false) => dom || dow,
            (true, false) => dow,
            (false, true) => dom,
            (true, true) => true,
        }
    }

    /// The first firing strictly after `after_ms` in `zone`, within a few years.
    pub fn next_after(&self, after_ms: Millis, zone: Zone) -> Option<Millis> {
        let step: i64 = if self.seconds.is_some() { 1 } else { 60 };
        let after = i64::try_from(after_ms / 1000).ok()?;
        let limit = after.saturating_add(SEARCH_YEARS as i64 * 366 * 86_400);
        let mut t = (after.div_euclid(step) + 1) * step;
        while t <= limit {
            let f = zone.fields(t)?;
            let next = if self.months & (1 << f.month) == 0 {
                zone.time(f.year, f.month + 1, 1, 0, 0, 0)?
            } else if !self.day_matches(&f) {
                zone.time(f.year, f.month, f.day + 1, 0, 0, 0)?
            } else if self.hours & (1 << f.hour) == 0 {
                zone.time(f.year, f.month, f.day, f.hour + 1, 0, 0)?
            } else if self.minutes & (1 << f.minute) == 0 {
                zone.time(f.year, f.month, f.day, f.hour, f.minute + 1, 0)?
            } else if self.seconds.is_some_and(|s| s & (1 << f.second) == 0) {
                t + 1
            } else {
                return u64::try_from(t).ok().map(|s| s * 1000);
            };
            // A local time that repeats (the clock set back) must not hold the search.
            t = next.max(t + step);
        }
        None
    }
}

/// A time broken down in a zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fields {
    year: i64,
    month: i64,
    day: i64,
    hour: i64,
    minute: i64,
    second: i64,
    /// Sunday 0.
    weekday: i64,
}

/// Where a schedule's times are read: UTC, a fixed offset, or the controllers' local time
/// (their `TZ`, with its daylight saving).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zone {
    Utc,
    /// Seconds east of UTC.
    Fixed(i32),
    Local,
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm); months past 12 roll
/// into the next years, days past a month's end into the next months.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let (y, m) = (y + (m - 1).div_euclid(12), (m - 1).rem_euclid(12) + 1);
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468 + (d - 1)
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

impl Zone {
    /// `UTC`, `local`, or an offset `+HH:MM`, `-HHMM`, `+HH`.
    pub fn parse(text: &str) -> Result<Zone, String> {
        let t = text.trim();
        let bad = || {
            format!(
                "unknown time zone '{text}': give UTC, local (the controllers' time zone) or an offset such as +05:30"
            )
        };
        match t.to_ascii_lowercase().as_str() {
            "" | "utc" | "z" | "gmt" => return Ok(Zone::Utc),
            "local" => return Ok(Zone::Local),
            _ => {}
        }
        let sign = match t.as_bytes()[0] {
            b'+' => 1,
            b'-' => -1,
            _ => return Err(bad()),
        };
        let digits: String = t[1..].chars().filter(|c| *c != ':').collect();
        if !digits.bytes().all(|b| b.is_ascii_digit()) || !matches!(digits.len(), 2 | 4) {
            return Err(bad());
        }
        let hours: i32 = digits[..2].parse().map_err(|_| bad())?;
        let minutes: i32 = if digits.len() == 4 { digits[2..].parse().map_err(|_| bad())? } else { 0 };
        if hours > 14 || minutes > 59 {
            return Err(bad());
        }
        Ok(Zone::Fixed(sign * (hours * 3600 + minutes * 60)))
    }

    pub fn name(&self) -> String {
        match self {
            Zone::Utc => "UTC".into(),
            Zone::Local => "local".into(),
            Zone::Fixed(s) => {
                let (sign, a) = if *s < 0 { ('-', -s) } else { ('+', *s) };
                format!("{sign}{:02}:{:02}", a / 3600, a / 60 % 60)
            }
        }
    }

    fn fields(&self, t: i64) -> Option<Fields> {
        let offset = match self {
            Zone::Utc => 0,
            Zone::Fixed(s) => i64::from(*s),
            Zone::Local => {
                let secs = libc::time_t::try_from(t).ok()?;
                // SAFETY: localtime_r writes only into `tm`, which lives here.
                let mut tm: libc::tm = unsafe { std::mem::zeroed() };
                if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
                    return None;
                }
                return Some(Fields {
                    year: i64::from(tm.tm_year) + 1900,
                    month: i64::from(tm.tm_mon) + 1,
                    day: i64::from(tm.tm_mday),
                    hour: i64::from(tm.tm_hour),
                    minute: i64::from(tm.tm_min),
                    second: i64::from(tm.tm_sec),
                    weekday: i64::from(tm.tm_wday),
                });
            }
        };
        let local = t + offset;
        let days = local.div_euclid(86_400);
        let rest = local.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        Some(Fields {
            year,
            month,
            day,
            hour: rest / 3600,
            minute: rest / 60 % 60,
            second: rest % 60,
            weekday: (days + 4).rem_euclid(7),
        })
    }

    /// Seconds since the epoch of a time in this zone; fields past their range roll over.
    fn time(&self, year: i64, month: i64, day: i64, hour: i64, minute: i64, second: i64) -> Option<i64> {
        match self {
            Zone::Utc | Zone::Fixed(_) => {
                let offset = if let Zone::Fixed(s) = self { i64::from(*s) } else { 0 };
                Some(
                    days_from_civil(year, month, 1) * 86_400 + (day - 1) * 86_400 + hour * 3600 + minute * 60 + second
                        - offset,
                )
            }
            Zone::Local => {
                // SAFETY: mktime reads and normalizes `tm`, which lives here.
                let mut tm: libc::tm = unsafe { std::mem::zeroed() };
                tm.tm_year = i32::try_from(year - 1900).ok()?;
                tm.tm_mon = i32::try_from(month - 1).ok()?;
                tm.tm_mday = i32::try_from(day).ok()?;
                tm.tm_hour = i32::try_from(hour).ok()?;
                tm.tm_min = i32::try_from(minute).ok()?;
                tm.tm_sec = i32::try_from(second).ok()?;
                tm.tm_isdst = -1;
                let t = unsafe { libc::mktime(&mut tm) };
                (t != -1).then_some(t)
            }
        }
    }
}

/// A recurring job as the replicated state keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CronEntry {
    pub id: u64,
    /// Whose: each firing submits its job as this user.
    pub user: String,
    /// As given (`*/15 * * * *`).
    pub schedule: String,
    /// `UTC`, `local` or an offset.
    pub zone: String,
    pub spec: JobSpec,
    /// When it fires next (`u64::MAX`: never again).
    pub next_ms: Millis,
    pub added_ms: Millis,
    #[serde(default)]
    pub fired: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fired_ms: Option<Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_job: Option<JobId>,
    /// Why its last firing submitted nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-26T19:55:00Z, a Thursday.
    const T: Millis = 1_795_722_900_000;

    fn next(s: &str, after: Millis, zone: Zone) -> Option<Millis> {
        Schedule::parse(s).unwrap().next_after(after, zone)
    }

    #[test]
    fn next_firings_in_utc_and_at_an_offset() {
        assert_eq!(next("*/15 * * * *", T, Zone::Utc), Some(T + 5 * 60_000), "20:00");
        assert_eq!(next("0 20 * * *", T, Zone::Utc), Some(T + 5 * 60_000));
        assert_eq!(next("0 20 * * *", T + 5 * 60_000, Zone::Utc), Some(T + 5 * 60_000 + 86_400_000), "strictly after");
        assert_eq!(next("@hourly", T, Zone::Utc), Some(T + 5 * 60_000));
        // Friday and Saturday at 08:00, and the first of the month (either matches).
        assert_eq!(next("0 8 1 * fri,sat", T, Zone::Utc), Some(T + 12 * 3_600_000 + 5 * 60_000));
        assert_eq!(
            next("0 0 1 12 *", T, Zone::Utc),
            Some(T + 4 * 86_400_000 + 4 * 3_600_000 + 5 * 60_000),
            "December 1st"
        );
        // 20:00 at +05:30 is 14:30 UTC: tomorrow.
        let ist = Zone::parse("+05:30").unwrap();
        assert_eq!(next("0 20 * * *", T, ist), Some(T + 86_400_000 - 5 * 3_600_000 - 25 * 60_000));
        assert_eq!(ist.name(), "+05:30");
        // Seconds first: every 5 s.
        assert_eq!(next("*/5 * * * * *", T + 1_000, Zone::Utc), Some(T + 5_000));
        assert_eq!(next("0 0 30 2 *", T, Zone::Utc), None, "never");
        assert_eq!(next("0 0 29 2 *", T, Zone::Utc).map(|t| (t - T) / 86_400_000), Some(459), "2028-02-29");
    }

    #[test]
    fn bad_schedules_and_zones_are_named() {
        for (bad, says) in [
            ("* * * *", "4 fields"),
            ("60 * * * *", "'60' is not from 0 to 59"),
            ("* * * foo *", "invalid month field 'foo'"),
            ("*/0 * * * *", "step '0'"),
            ("5-1 * * * *", "runs backwards"),
            ("@often", "unknown schedule '@often'"),
        ] {
            let e = Schedule::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(Zone::parse("Mars/Olympus").unwrap_err().contains("unknown time zone"));
        assert_eq!(Zone::parse("-0800").unwrap(), Zone::Fixed(-8 * 3600));
        assert_eq!(Zone::parse("utc").unwrap(), Zone::Utc);
        assert_eq!(Schedule::parse("0 0 * * 7").unwrap(), Schedule::parse("0 0 * * sun").unwrap());
    }

    #[test]
    fn local_time_agrees_with_utc_where_the_zone_is_utc() {
        // The test machine's zone may be anything: local firings are whole minutes, strictly
        // after, and at most a day and a bit away for a daily schedule.
        let t = next("30 6 * * *", T, Zone::Local).unwrap();
        assert!(t > T && t.is_multiple_of(60_000) && t - T <= 26 * 3_600_000, "{t}");
    }
}
