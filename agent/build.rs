//! The job supervisor's fingerprint: a hash of the sources that decide what the agent hands a
//! supervisor and what the supervisor writes back (the handoff, the record, the cgroup), so
//! that a `quorum-supervisor` program of another build refuses the work instead of misreading
//! it (see `supervisor::program`).

use std::hash::Hasher;

fn main() {
    // FNV-1a, 64 bits: stable across Rust releases (std's DefaultHasher is not).
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    h.write(env!("CARGO_PKG_VERSION").as_bytes());
    for file in ["src/supervisor.rs", "src/record.rs", "src/limits.rs"] {
        println!("cargo:rerun-if-changed={file}");
        h.write(&std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}")));
    }
    println!("cargo:rustc-env=QUORUM_SUPERVISOR_FINGERPRINT={:016x}", h.finish());
}
