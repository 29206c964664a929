//! The controller's integration tests in one test binary (one link of the controller and
//! RocksDB instead of one per file).

mod history;
mod layering;
mod raft_storage;
