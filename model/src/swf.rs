//! A reader for the Standard Workload Format (SWF) of the Parallel Workloads Archive.
//!
//! Each data line holds 18 whitespace-separated numbers; `-1` means unknown. Lines starting with
//! `;` are comments, and `; Key: value` comments form the header (`MaxNodes`, `MaxProcs`,
//! `UnixStartTime`, ...). Reading a file (plain or gzipped) is the simulator's
//! (`quorum_control::sim::swf::read`); parsing is here, with no I/O but the reader it is given,
//! so that it can be fuzzed without the controller.

use std::collections::BTreeMap;
use std::io::BufRead;

/// Why a trace could not be read; always names the file and, for bad content, the line.
#[derive(Debug, thiserror::Error)]
pub enum SwfError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}:{line}: {message}")]
    Malformed { path: String, line: usize, message: String },
    #[error("{path}: {message}")]
    Header { path: String, message: String },
}

/// The names of the 18 fields, for error messages.
pub const FIELDS: [&str; 18] = [
    "job number",
    "submit time",
    "wait time",
    "run time",
    "allocated processors",
    "average CPU time",
    "used memory",
    "requested processors",
    "requested time",
    "requested memory",
    "status",
    "user id",
    "group id",
    "executable number",
    "queue number",
    "partition number",
    "preceding job number",
    "think time",
];

/// One job of a trace, `None` where the trace says `-1`.
#[derive(Clone, Debug, PartialEq)]
pub struct SwfJob {
    /// The line it came from (1-based).
    pub line: usize,
    pub number: u64,
    pub submit_s: Option<u64>,
    pub wait_s: Option<u64>,
    pub run_s: Option<u64>,
    pub allocated_procs: Option<u64>,
    pub requested_procs: Option<u64>,
    pub requested_time_s: Option<u64>,
    pub status: Option<i64>,
    pub user: Option<u64>,
    pub group: Option<u64>,
    pub queue: Option<u64>,
    pub partition: Option<u64>,
}

impl SwfJob {
    /// The processors the job asks for: the larger of requested and allocated.
    pub fn procs(&self) -> Option<u64> {
        match (self.requested_procs, self.allocated_procs) {
            (Some(r), Some(a)) => Some(r.max(a)),
            (r, a) => r.or(a),
        }
        .filter(|&p| p > 0)
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Header {
    pub max_nodes: Option<u64>,
    pub max_procs: Option<u64>,
    pub unix_start_time: Option<u64>,
    /// Every `; Key: value` line, the last value of a repeated key winning (`Note` lines are
    /// joined).
    pub fields: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub header: Header,
    pub jobs: Vec<SwfJob>,
}

impl Trace {
    /// Parses SWF text; `path` only names the source in errors.
    pub fn parse(path: &str, reader: impl BufRead) -> Result<Trace, SwfError> {
        let mut trace = Trace::default();
        let bad = |line: usize, message: String| SwfError::Malformed { path: path.to_string(), line, message };
        for (i, line) in reader.split(b'\n').enumerate() {
            let n = i + 1;
            let bytes = line.map_err(|source| SwfError::Io { path: path.to_string(), source })?;
            let text = std::str::from_utf8(&bytes).map_err(|_| bad(n, "the line is not valid UTF-8".into()))?;
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            if let Some(comment) = text.strip_prefix(';') {
                header_line(&mut trace.header, comment);
                continue;
            }
            trace.jobs.push(job_line(n, text).map_err(|m| bad(n, m))?);
        }
        let h = &mut trace.header;
        h.max_nodes = header_number(path, &h.fields, "MaxNodes")?;
        h.max_procs = header_number(path, &h.fields, "MaxProcs")?;
        h.unix_start_time = header_number(path, &h.fields, "UnixStartTime")?;
        Ok(trace)
    }
}

fn header_line(header: &mut Header, comment: &str) {
    let Some((key, value)) = comment.split_once(':') else { return };
    let key = key.trim();
    // Only `Key: value` with a one-word key is a header field; other comments are prose.
    if key.is_empty() || key.contains(char::is_whitespace) {
        return;
    }
    let value = value.trim().to_string();
    match header.fields.get_mut(key) {
        Some(old) if key == "Note" => {
            old.push('\n');
            old.push_str(&value);
        }
        _ => {
            header.fields.insert(key.to_string(), value);
        }
    }
}

fn header_number(path: &str, fields: &BTreeMap<String, String>, key: &str) -> Result<Option<u64>, SwfError> {
    let Some(v) = fields.get(key) else { return Ok(None) };
    let first = v.split_whitespace().next().unwrap_or("");
    match first.parse::<i64>() {
        Ok(-1) => Ok(None),
        Ok(n) if n > 0 => Ok(Some(n as u64)),
        _ => Err(SwfError::Header {
            path: path.to_string(),
            message: format!("header field {key} = '{v}' is not a positive number"),
        }),
    }
}

/// Parses one number field: `-1` (or any negative value in a field where that is the usual
/// spelling of unknown) is `None`; fractions are allowed only where SWF has them.
fn field(fields: &[&str], k: usize) -> Result<Option<i64>, String> {
    let raw = fields[k];
    let name = FIELDS[k];
    let value = match raw.parse::<i64>() {
        Ok(v) => v,
        Err(_) => match raw.parse::<f64>() {
            // Times and memory are sometimes written with decimals; round to whole units.
            Ok(v) if v.is_finite() => v.round() as i64,
            _ => return Err(format!("field {} ({name}) is '{raw}', not a number", k + 1)),
        },
    };
    match value {
        -1 => Ok(None),
        v if v < 0 => Err(format!("field {} ({name}) is {v}; only -1 (unknown) may be negative", k + 1)),
        v => Ok(Some(v)),
    }
}

fn job_line(n: usize, text: &str) -> Result<SwfJob, String> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() != 18 {
        return Err(format!("expected 18 fields, found {}", fields.len()));
    }
    let u = |k: usize| -> Result<Option<u64>, String> { Ok(field(&fields, k)?.map(|v| v as u64)) };
    // Fields the simulator does not use are still checked to be numbers, so that a shifted or
    // truncated line is caught rather than misread.
    for k in [5, 6, 9, 13, 16, 17] {
        field(&fields, k)?;
    }
    let number = u(0)?.ok_or_else(|| "field 1 (job number) is -1".to_string())?;
    Ok(SwfJob {
        line: n,
        number,
        submit_s: u(1)?,
        wait_s: u(2)?,
        run_s: u(3)?,
        allocated_procs: u(4)?,
        requested_procs: u(7)?,
        requested_time_s: u(8)?,
        status: field(&fields, 10)?,
        user: u(11)?,
        group: u(12)?,
        queue: u(14)?,
        partition: u(15)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Trace, SwfError> {
        Trace::parse("t.swf", text.as_bytes())
    }

    #[test]
    fn reads_header_and_jobs() {
        let t = parse(
            "; Version: 2.2\n; MaxNodes: 100\n; MaxProcs: 800\n; UnixStartTime: 843480031\n\
             ; Note: one\n; Note: two\n;   a comment: with a colon\n\n\
             1 0 10 100 4 -1 -1 8 3600 -1 1 3 4 -1 -1 -1 -1 -1\n\
             2 5 -1 7.0 -1 1.5 -1 2 -1 -1 0 -1 -1 -1 1 2 -1 -1\n",
        )
        .unwrap();
        assert_eq!(t.header.max_nodes, Some(100));
        assert_eq!(t.header.max_procs, Some(800));
        assert_eq!(t.header.unix_start_time, Some(843480031));
        assert_eq!(t.header.fields["Note"], "one\ntwo");
        assert_eq!(t.jobs.len(), 2);
        let a = &t.jobs[0];
        assert_eq!((a.number, a.submit_s, a.wait_s, a.run_s), (1, Some(0), Some(10), Some(100)));
        assert_eq!(a.procs(), Some(8), "the larger of requested (8) and allocated (4)");
        assert_eq!((a.user, a.group, a.requested_time_s), (Some(3), Some(4), Some(3600)));
        let b = &t.jobs[1];
        assert_eq!((b.wait_s, b.run_s, b.requested_time_s, b.user), (None, Some(7), None, None));
        assert_eq!(b.procs(), Some(2));
        assert_eq!((b.queue, b.partition, b.line), (Some(1), Some(2), 10));
    }

    #[test]
    fn malformed_lines_name_their_line_and_field() {
        let ok = "1 0 10 100 4 -1 -1 8 3600 -1 1 3 4 -1 -1 -1 -1 -1\n";
        let cases = [
            ("1 0 10 100 4 -1 -1 8 3600 -1 1 3 4 -1 -1 -1 -1\n", "t.swf:2: expected 18 fields, found 17"),
            (
                "1 0 10 1x0 4 -1 -1 8 3600 -1 1 3 4 -1 -1 -1 -1 -1\n",
                "t.swf:2: field 4 (run time) is '1x0', not a number",
            ),
            ("1 0 10 100 4 -1 -1 -8 3600 -1 1 3 4 -1 -1 -1 -1 -1\n", "field 8 (requested processors) is -8"),
            ("-1 0 10 100 4 -1 -1 8 3600 -1 1 3 4 -1 -1 -1 -1 -1\n", "t.swf:2: field 1 (job number) is -1"),
            ("1 0 10 100 4 -1 -1 8 3600 -1 1 3 4 -1 -1 -1 -1 x\n", "field 18 (think time) is 'x'"),
        ];
        for (line, want) in cases {
            let err = parse(&format!("{ok}{line}")).unwrap_err().to_string();
            assert!(err.contains(want), "{line:?}: got '{err}', want '{want}'");
        }
        let err = parse("; MaxNodes: many\n").unwrap_err().to_string();
        assert_eq!(err, "t.swf: header field MaxNodes = 'many' is not a positive number");
        let err = Trace::parse("bin.swf", &b"1 0 0 1 1 -1 -1 1 1 -1 1 1 1 -1 -1 -1 -1 -1\n\xff\xfe\n"[..])
            .unwrap_err()
            .to_string();
        assert_eq!(err, "bin.swf:2: the line is not valid UTF-8");
    }
}
