//! Slurm's `-o` output formats (`squeue`, `sinfo`): `%[.][-][width]code` fields between text,
//! each value cut or padded to its width, right-aligned with `.`.

/// One field of a format: a `%` code, how wide, and which side it is aligned to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Field { code: char, width: Option<usize>, right: bool },
}

/// Parses a `-o` format: text, and `%[.][-][width]code` fields (`%%` is a `%`).
pub fn parse_format(format: &str, codes: &[(char, &str)], command: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            text.push('%');
            continue;
        }
        let mut right = false;
        while let Some(&f) = chars.peek().filter(|f| **f == '.' || **f == '-') {
            right |= f == '.';
            chars.next();
        }
        let mut digits = String::new();
        while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(d);
            chars.next();
        }
        let width = if digits.is_empty() {
            None
        } else {
            Some(
                digits
                    .parse::<usize>()
                    .ok()
                    .filter(|w| *w <= 1024)
                    .ok_or_else(|| format!("invalid width '{digits}' in --format '{format}'"))?,
            )
        };
        let Some(code) = chars.next() else {
            return Err(format!("invalid --format '{format}': it ends in the middle of a field"));
        };
        if !codes.iter().any(|(c, _)| *c == code) {
            let known: String = codes.iter().map(|(c, _)| format!("%{c}")).collect::<Vec<_>>().join(" ");
            return Err(format!(
                "invalid --format '{format}': %{code} is not a field Quorum's {command} knows ({known})"
            ));
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(Piece::Field { code, width, right });
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// `text` in `width` columns (cut when longer), on the side `right` says.
pub fn fit(text: &str, width: Option<usize>, right: bool) -> String {
    let text = quorum_client::display::escape(text);
    let Some(width) = width else { return text.into_owned() };
    let cut: String = text.chars().take(width).collect();
    if right {
        format!("{cut:>width$}")
    } else {
        format!("{cut:<width$}")
    }
}

/// One line of `pieces`, each field's value from `value` (trailing spaces trimmed).
pub fn line(pieces: &[Piece], value: &dyn Fn(char) -> String) -> String {
    let mut s = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => s.push_str(t),
            Piece::Field { code, width, right } => s.push_str(&fit(&value(*code), *width, *right)),
        }
    }
    s.trim_end().to_string()
}

/// `Tue Nov  4 21:48:23 2026`, local, as ctime writes it.
pub fn ctime(ms: u64) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let secs = (ms / 1000) as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`, which lives here.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return String::new();
    }
    format!(
        "{} {} {:>2} {:02}:{:02}:{:02} {}",
        DAYS[tm.tm_wday.clamp(0, 6) as usize],
        MONTHS[tm.tm_mon.clamp(0, 11) as usize],
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        tm.tm_year + 1900
    )
}

/// Now, in milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
