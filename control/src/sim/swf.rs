//! Reading a Standard Workload Format (SWF) trace file, plain or gzipped (recognised by its
//! magic bytes). The format's parser is `quorum_model::swf`, re-exported here.

use std::io::{BufRead, BufReader};
use std::path::Path;

pub use quorum_model::swf::*;

/// Reads a trace file, plain or gzipped.
pub fn read(path: &Path) -> Result<Trace, SwfError> {
    let name = path.display().to_string();
    let io = |source| SwfError::Io { path: name.clone(), source };
    let mut reader = BufReader::new(std::fs::File::open(path).map_err(io)?);
    // The gzip magic bytes, peeked at without consuming them.
    if reader.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]) {
        Trace::parse(&name, BufReader::new(flate2::read::MultiGzDecoder::new(reader)))
    } else {
        Trace::parse(&name, reader)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_gzipped_and_plain_files_alike() {
        use std::io::Write;
        let text = "; MaxNodes: 4\n1 0 0 5 1 -1 -1 1 10 -1 1 1 1 -1 -1 -1 -1 -1\n";
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("a.swf");
        std::fs::write(&plain, text).unwrap();
        let gz = dir.path().join("a.swf.gz");
        let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
        enc.write_all(text.as_bytes()).unwrap();
        enc.finish().unwrap();
        let a = read(&plain).unwrap();
        let b = read(&gz).unwrap();
        assert_eq!(a.jobs, b.jobs);
        assert_eq!(a.header, b.header);
        let missing = read(&dir.path().join("nope.swf")).unwrap_err().to_string();
        assert!(missing.contains("nope.swf: No such file"), "{missing}");
    }
}
