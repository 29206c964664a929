//! Slurm's formats for time limits and memory sizes, parsed and printed.

/// A value the user typed that is not a valid time or size; the message names the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} '{value}': {reason}")]
pub struct ParseError {
    pub what: &'static str,
    pub value: String,
    pub reason: &'static str,
}

fn time_err(value: &str, reason: &'static str) -> ParseError {
    ParseError { what: "time", value: value.to_string(), reason }
}

/// Parses a Slurm time limit into seconds: `minutes`, `minutes:seconds`,
/// `hours:minutes:seconds`, `days-hours`, `days-hours:minutes`, `days-hours:minutes:seconds`.
/// `UNLIMITED` and `infinite` give `None`.
/// The longest finite time limit: 100 years, far from overflowing in milliseconds.
pub const MAX_TIME_LIMIT_S: u64 = 100 * 365 * 86400;

pub fn parse_time_limit(value: &str) -> Result<Option<u64>, ParseError> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("unlimited") || v.eq_ignore_ascii_case("infinite") {
        return Ok(None);
    }
    if v.is_empty() {
        return Err(time_err(value, "empty"));
    }
    let num = |s: &str| -> Result<u64, ParseError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(time_err(value, "expected [days-]hours:minutes:seconds or minutes"));
        }
        s.parse().map_err(|_| time_err(value, "number too large"))
    };
    let (days, rest) = match v.split_once('-') {
        Some((d, rest)) => (Some(num(d)?), rest),
        None => (None, v),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    if parts.len() > 3 {
        return Err(time_err(value, "too many ':' fields"));
    }
    let nums = parts.iter().map(|p| num(p)).collect::<Result<Vec<u64>, _>>()?;
    // Checked: a limit that overflows is refused, not wrapped to something short.
    let sum = |terms: &[(u64, u64)]| -> Option<u64> {
        terms.iter().try_fold(0u64, |acc, &(n, unit)| acc.checked_add(n.checked_mul(unit)?))
    };
    let secs = match (days, nums.as_slice()) {
        (None, [m]) => sum(&[(*m, 60)]),
        (None, [m, s]) => sum(&[(*m, 60), (*s, 1)]),
        (None, [h, m, s]) => sum(&[(*h, 3600), (*m, 60), (*s, 1)]),
        (Some(d), [h]) => sum(&[(d, 86400), (*h, 3600)]),
        (Some(d), [h, m]) => sum(&[(d, 86400), (*h, 3600), (*m, 60)]),
        (Some(d), [h, m, s]) => sum(&[(d, 86400), (*h, 3600), (*m, 60), (*s, 1)]),
        _ => return Err(time_err(value, "expected [days-]hours:minutes:seconds or minutes")),
    };
    let secs = secs
        .filter(|s| *s <= MAX_TIME_LIMIT_S)
        .ok_or_else(|| time_err(value, "longer than the longest time limit, 100 years (use UNLIMITED for none)"))?;
    if secs == 0 {
        return Err(time_err(value, "a time limit must be at least one second"));
    }
    Ok(Some(secs))
}

/// Prints seconds the way squeue does: `M:SS`, `H:MM:SS` or `D-HH:MM:SS`.
pub fn format_duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// Parses a memory size into MiB: a number with an optional K, M, G or T suffix (Slurm's
/// default unit is megabytes).
pub fn parse_mem_mb(value: &str) -> Result<u64, ParseError> {
    let err = |reason| ParseError { what: "memory size", value: value.to_string(), reason };
    let v = value.trim();
    let (digits, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => v.split_at(i),
        None => (v, ""),
    };
    if digits.is_empty() {
        return Err(err("expected a number with an optional K, M, G or T suffix"));
    }
    let n: u64 = digits.parse().map_err(|_| err("number too large"))?;
    let unit = unit.trim_end_matches(['b', 'B']);
    let mb = match unit.to_ascii_uppercase().as_str() {
        "K" => n.div_ceil(1024),
        "" | "M" => n,
        "G" => n.checked_mul(1024).ok_or_else(|| err("number too large"))?,
        "T" => n.checked_mul(1024 * 1024).ok_or_else(|| err("number too large"))?,
        _ => return Err(err("unknown unit; use K, M, G or T")),
    };
    if mb == 0 {
        return Err(err("must be at least 1M"));
    }
    Ok(mb)
}

/// Prints MiB compactly: `512M`, `4G`, `1.5T`.
pub fn format_mem_mb(mb: u64) -> String {
    if mb >= 1024 * 1024 && mb.is_multiple_of(1024 * 1024) {
        format!("{}T", mb / (1024 * 1024))
    } else if mb >= 1024 && mb.is_multiple_of(1024) {
        format!("{}G", mb / 1024)
    } else {
        format!("{mb}M")
    }
}

/// Sorted ids as Slurm writes a list of them: `0-3,5,7-9` (array tasks, CPUs).
pub fn ranges(ids: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        out.push(if i == j { ids[i].to_string() } else { format!("{}-{}", ids[i], ids[j]) });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_time_formats() {
        assert_eq!(parse_time_limit("10").unwrap(), Some(600));
        assert_eq!(parse_time_limit("1:30").unwrap(), Some(90));
        assert_eq!(parse_time_limit("1:00:00").unwrap(), Some(3600));
        assert_eq!(parse_time_limit("2-0").unwrap(), Some(2 * 86400));
        assert_eq!(parse_time_limit("1-2:03").unwrap(), Some(86400 + 7200 + 180));
        assert_eq!(parse_time_limit("1-02:03:04").unwrap(), Some(86400 + 7384));
        assert_eq!(parse_time_limit("UNLIMITED").unwrap(), None);
        for bad in ["", "abc", "1:2:3:4", "-5", "1:", "0", "1h"] {
            let e = parse_time_limit(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("'{bad}'")), "{e}");
        }
    }

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_mem_mb("512").unwrap(), 512);
        assert_eq!(parse_mem_mb("4G").unwrap(), 4096);
        assert_eq!(parse_mem_mb("4gb").unwrap(), 4096);
        assert_eq!(parse_mem_mb("1T").unwrap(), 1024 * 1024);
        assert_eq!(parse_mem_mb("2048K").unwrap(), 2);
        for bad in ["", "G", "4X", "0", "-1"] {
            assert!(parse_mem_mb(bad).is_err(), "{bad}");
        }
        assert_eq!(format_mem_mb(4096), "4G");
        assert_eq!(format_mem_mb(1500), "1500M");
    }

    #[test]
    fn durations_print_like_squeue() {
        assert_eq!(format_duration(5), "0:05");
        assert_eq!(format_duration(3725), "1:02:05");
        assert_eq!(format_duration(90061), "1-01:01:01");
    }
}
