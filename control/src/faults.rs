//! Fault injection for tests: the one seam through which a test cuts a replica off. Built by the
//! composition root, handed to the Raft network and service, and reached through
//! [`crate::Controller::faults`]; nothing in production sets it.

use std::sync::atomic::Ordering;

/// The switches of one replica.
#[derive(Clone, Default)]
pub struct Faults {
    /// Drops this replica's Raft traffic both ways while set.
    pub(crate) raft: quorum_raft::network::Isolation,
}

impl Faults {
    /// Cuts this replica's Raft traffic off (`true`) or restores it.
    pub fn isolate_raft(&self, on: bool) {
        self.raft.store(on, Ordering::SeqCst);
    }
}
