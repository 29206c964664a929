#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| quorum_fuzz::controller_config(data));
