//! Slurm-style hostlists: `gpu[01-04,07]` expands to `gpu01 gpu02 gpu03 gpu04 gpu07`, and a
//! list of names compresses back to the shortest such form, keeping zero padding.

use std::fmt::Write as _;

/// Why a hostlist expression could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad hostlist '{expr}': {reason}")]
pub struct HostlistError {
    pub expr: String,
    pub reason: String,
}

/// The most names an expression may expand to.
pub const MAX_EXPANDED: usize = 1_000_000;

/// The most bytes of names per name allowed (on average): a million short names expand, a
/// million long ones do not, so that a short expression cannot ask for gigabytes.
const BYTES_PER_NAME: usize = 16;

/// Expands a comma-separated hostlist expression such as `a[1-3],b07,c[08-10]`.
pub fn expand(expr: &str) -> Result<Vec<String>, HostlistError> {
    expand_at_most(expr, MAX_EXPANDED)
}

/// [`expand`], refusing an expression that names more than `max_names` hosts or more than 16
/// bytes a name in all. (The fuzz target uses a small bound, so that each input costs little.)
pub fn expand_at_most(expr: &str, max_names: usize) -> Result<Vec<String>, HostlistError> {
    let err = |reason: &str| HostlistError { expr: expr.to_string(), reason: reason.to_string() };
    let max_bytes = max_names.saturating_mul(BYTES_PER_NAME);
    let too_many = || match max_names {
        MAX_EXPANDED => err("expands to more than a million names"),
        n => err(&format!("expands to more than {n} names")),
    };
    let too_long = || err(&format!("expands to more than {max_bytes} bytes of names"));
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for item in split_top_level(expr).map_err(|r| err(&r))? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        match item.find('[') {
            None => {
                if item.contains(']') {
                    return Err(err("']' without '['"));
                }
                if out.len() >= max_names {
                    return Err(too_many());
                }
                bytes += item.len();
                out.push(item.to_string());
            }
            Some(open) => {
                let close = item.rfind(']').ok_or_else(|| err("'[' without ']'"))?;
                let prefix = &item[..open];
                let suffix = &item[close + 1..];
                if suffix.contains('[') {
                    return Err(err("only one bracket range per name is supported"));
                }
                for range in item[open + 1..close].split(',') {
                    let (lo, hi) = match range.split_once('-') {
                        Some((lo, hi)) => (lo, hi),
                        None => (range, range),
                    };
                    let width = lo.len();
                    let lo_n: u64 = lo.parse().map_err(|_| err(&format!("'{range}' is not a number or range")))?;
                    let hi_n: u64 = hi.parse().map_err(|_| err(&format!("'{range}' is not a number or range")))?;
                    if hi_n < lo_n {
                        return Err(err(&format!("range '{range}' runs backwards")));
                    }
                    // `hi - lo` may be near u64::MAX: compared, never added to.
                    if hi_n - lo_n >= (max_names - out.len().min(max_names)) as u64 {
                        return Err(too_many());
                    }
                    // Each name is at least this long; the number's digits come on top.
                    let fixed = prefix.len() + suffix.len() + width;
                    if ((hi_n - lo_n + 1) as usize).saturating_mul(fixed).saturating_add(bytes) > max_bytes {
                        return Err(too_long());
                    }
                    for n in lo_n..=hi_n {
                        let name = format!("{prefix}{n:0width$}{suffix}");
                        bytes += name.len();
                        out.push(name);
                    }
                    if bytes > max_bytes {
                        return Err(too_long());
                    }
                }
            }
        }
    }
    if out.is_empty() {
        return Err(err("names no host"));
    }
    Ok(out)
}

fn split_top_level(expr: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in expr.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth < 0 {
                    return Err("']' without '['".into());
                }
            }
            ',' if depth == 0 => {
                parts.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("'[' without ']'".into());
    }
    parts.push(&expr[start..]);
    Ok(parts)
}

/// Splits `gpu012` into (`gpu`, `012`); names without a trailing number have no digits.
fn split_numeric_suffix(name: &str) -> (&str, &str) {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    name.split_at(name.len() - digits)
}

/// Orders node names as a hostlist lists them: by the prefix before a trailing number, then by
/// that number (`node2` before `node10`), then by the whole name. A job's nodes are kept in this
/// order, as Slurm keeps them in its node table's: the batch script runs on the first, and `srun`
/// numbers block-distributed tasks (and `mpirun` its ranks, from `SLURM_JOB_NODELIST`) along it.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn key(name: &str) -> (&str, Option<u64>) {
        let (prefix, digits) = split_numeric_suffix(name);
        // More than 18 digits is no number a hostlist writes as one.
        (prefix, if digits.len() > 18 { None } else { digits.parse().ok() })
    }
    key(a).cmp(&key(b)).then_with(|| a.cmp(b))
}

/// Compresses names into a hostlist expression; the inverse of [`expand`] up to ordering.
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    // group by (prefix, width) keeping first-seen order of groups
    let mut groups: Vec<(String, usize, Vec<u64>)> = Vec::new();
    let mut plain: Vec<(usize, String)> = Vec::new();
    let mut order = 0usize;
    let mut group_order: Vec<usize> = Vec::new();
    for name in names {
        let name = name.as_ref();
        let (prefix, digits) = split_numeric_suffix(name);
        if digits.is_empty() || digits.len() > 18 {
            plain.push((order, name.to_string()));
            order += 1;
            continue;
        }
        let n: u64 = digits.parse().expect("all ascii digits, at most 18");
        // Zero-padded numbers keep their width; others (width 0) print as they are.
        let width = if digits.len() > 1 && digits.starts_with('0') { digits.len() } else { 0 };
        match groups.iter_mut().find(|(p, w, _)| p == prefix && *w == width) {
            Some((_, _, nums)) => nums.push(n),
            None => {
                groups.push((prefix.to_string(), width, vec![n]));
                group_order.push(order);
                order += 1;
            }
        }
    }
    // An unpadded number as wide as a padded group of the same prefix belongs to it (gpu10
    // beside gpu09).
    for i in 0..groups.len() {
        if groups[i].1 != 0 {
            continue;
        }
        let prefix = groups[i].0.clone();
        let (moved, kept): (Vec<u64>, Vec<u64>) = groups[i]
            .2
            .iter()
            .partition(|n| groups.iter().any(|(p, w, _)| *p == prefix && *w != 0 && n.to_string().len() == *w));
        if moved.is_empty() {
            continue;
        }
        groups[i].2 = kept;
        for n in moved {
            let w = n.to_string().len();
            if let Some(g) = groups.iter_mut().find(|(p, gw, _)| *p == prefix && *gw == w) {
                g.2.push(n);
            }
        }
    }
    let (groups, group_order): (Vec<_>, Vec<_>) =
        groups.into_iter().zip(group_order).filter(|(g, _)| !g.2.is_empty()).unzip();
    let mut pieces: Vec<(usize, String)> = plain;
    for ((prefix, width, mut nums), at) in groups.into_iter().zip(group_order) {
        nums.sort_unstable();
        nums.dedup();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for n in nums {
            match ranges.last_mut() {
                Some((_, hi)) if *hi + 1 == n => *hi = n,
                _ => ranges.push((n, n)),
            }
        }
        let text = if ranges.len() == 1 && ranges[0].0 == ranges[0].1 {
            format!("{prefix}{:0width$}", ranges[0].0)
        } else {
            let mut s = format!("{prefix}[");
            for (i, (lo, hi)) in ranges.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                if lo == hi {
                    let _ = write!(s, "{lo:0width$}");
                } else {
                    let _ = write!(s, "{lo:0width$}-{hi:0width$}");
                }
            }
            s.push(']');
            s
        };
        pieces.push((at, text));
    }
    pieces.sort_by_key(|(at, _)| *at);
    pieces.into_iter().map(|(_, s)| s).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_order_as_a_hostlist_lists_them() {
        let mut names = vec!["node10", "gpu2", "node2", "node02", "login", "node1", "gpu10"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(names, ["gpu2", "gpu10", "login", "node1", "node02", "node2", "node10"]);
        let sorted = ["node1", "node2", "node10"];
        assert_eq!(expand(&compress(&sorted)).unwrap(), sorted);
    }

    #[test]
    fn expands_ranges_with_padding() {
        assert_eq!(expand("gpu[01-03,07]").unwrap(), vec!["gpu01", "gpu02", "gpu03", "gpu07"]);
        assert_eq!(expand("a1,b[8-10]").unwrap(), vec!["a1", "b8", "b9", "b10"]);
        assert_eq!(expand("node[1-2]-ib").unwrap(), vec!["node1-ib", "node2-ib"]);
    }

    #[test]
    fn rejects_malformed_expressions() {
        for bad in ["gpu[01-03", "gpu]1", "gpu[3-1]", "gpu[a-b]", "", "x[1-2][3]"] {
            assert!(expand(bad).is_err(), "{bad} should be rejected");
        }
        let e = expand("gpu[3-1]").unwrap_err();
        assert!(e.to_string().contains("runs backwards"), "{e}");
    }

    #[test]
    fn bounds_what_an_expression_expands_to() {
        // A million short names expand; one more does not, nor does a range that reaches
        // u64::MAX after another name (its size once overflowed the count).
        assert_eq!(expand("x[0-999999]").unwrap().len(), MAX_EXPANDED);
        for huge in ["x[0-1000000]", "a,x[0-999999]", "a,x[0-18446744073709551615]", "x[0-18446744073709551615]"] {
            let e = expand(huge).unwrap_err();
            assert!(e.to_string().contains("more than a million names"), "{huge}: {e}");
        }
        // A long prefix would make a million names gigabytes.
        let long = format!("{}[0-99999]", "n".repeat(200));
        let e = expand(&long).unwrap_err();
        assert!(e.to_string().contains("bytes of names"), "{e}");
        assert_eq!(expand_at_most("n[1-3],m", 4).unwrap().len(), 4);
        assert!(expand_at_most("n[1-3],m,k", 4).unwrap_err().to_string().contains("more than 4 names"));
        assert!(expand_at_most("k,n[1-4]", 4).is_err());
    }

    #[test]
    fn compresses_back() {
        let names = expand("gpu[01-04,07],login,cpu[9-11]").unwrap();
        assert_eq!(compress(&names), "gpu[01-04,07],login,cpu[9-11]");
        assert_eq!(compress(&expand("gpu[08-12]").unwrap()), "gpu[08-12]");
        assert_eq!(compress(&["n1"]), "n1");
        assert_eq!(compress(&["n2", "n1"]), "n[1-2]");
        for expr in ["gpu[01-04,07]", "a[1-3],b", "x[008-012]"] {
            assert_eq!(expand(&compress(&expand(expr).unwrap())).unwrap(), expand(expr).unwrap());
        }
    }
}
