//! Every input kept in `fuzz/corpus/` (the seeds, the corpus the fuzzers grew, and each input
//! that once crashed a target) run through its target's code: the fuzz targets' bodies are
//! `fuzz/src/lib.rs`, included here, so that what a fuzzer found stays fixed without a nightly
//! toolchain. See `fuzz/README.md`.

#[allow(dead_code)]
#[path = "../../../fuzz/src/lib.rs"]
mod targets;

use std::path::Path;

/// A target's name and what it does with an input.
type Target = (&'static str, fn(&[u8]));

#[test]
fn every_kept_fuzz_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let all: [Target; 8] = [
        ("hostlist", targets::hostlist),
        ("times_and_sizes", targets::times_and_sizes),
        ("job_options", targets::job_options),
        ("batch_script", targets::batch_script),
        ("raft_command", targets::raft_command),
        ("swf", targets::swf),
        ("controller_config", targets::controller_config),
        ("submit_request", targets::submit_request),
    ];
    for (name, run) in all {
        let dir = root.join(name);
        let mut inputs = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let caught = std::panic::catch_unwind(|| run(&data));
            assert!(
                caught.is_ok(),
                "{name}: {} ({:?}) fails its target",
                path.display(),
                String::from_utf8_lossy(&data)
            );
            inputs += 1;
        }
        assert!(inputs > 0, "no kept input for the target {name}");
    }
}
