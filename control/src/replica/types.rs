//! The openraft type config of the controller: log entries carry [`Command`]s and applying them
//! answers [`Response`]s.

use std::io::Cursor;

use quorum_state::{Command, Response};

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Command,
        R = Response,
);

pub type Raft = openraft::Raft<TypeConfig>;
