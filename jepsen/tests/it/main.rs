//! The Jepsen harness's tests in one test binary (one link instead of one per file).

mod checkers;
mod sample;
