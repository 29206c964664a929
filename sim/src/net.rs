//! The simulated network between hosts (replicas, agents, clients): each message takes a
//! delay drawn from the seed (a few milliseconds, sometimes a hundred or more, so that messages
//! overtake one another), may be lost or (Raft's) delivered twice, and is dropped while a
//! partition cuts its way. A lost message is noticed only by its sender's deadline, as on a real
//! network.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use quorum_jepsen::rng::Rng;

/// A host: replicas are 1..=N, agents [`AGENT_BASE`]+i, clients [`CLIENT_BASE`]+i.
pub type Host = u64;
pub const AGENT_BASE: Host = 100;
pub const CLIENT_BASE: Host = 200;

pub struct Net {
    rng: Mutex<Rng>,
    /// Directed pairs (from, to) whose messages are dropped.
    cut: Mutex<BTreeSet<(Host, Host)>>,
    /// Chance that a message is lost, and that a Raft message is delivered twice.
    pub loss: f64,
    pub duplicate: f64,
}

impl Net {
    pub fn new(rng: Rng, loss: f64, duplicate: f64) -> Net {
        Net { rng: Mutex::new(rng), cut: Mutex::new(BTreeSet::new()), loss, duplicate }
    }

    fn rng(&self) -> std::sync::MutexGuard<'_, Rng> {
        self.rng.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn chance(&self, p: f64) -> bool {
        p > 0.0 && self.rng().chance(p)
    }

    /// A message's time on the wire.
    pub fn delay(&self) -> Duration {
        let mut rng = self.rng();
        let ms = if rng.chance(0.05) { rng.between(20, 150) } else { rng.between(1, 8) };
        Duration::from_millis(ms)
    }

    pub fn cut(&self, pairs: impl IntoIterator<Item = (Host, Host)>) {
        self.cut.lock().unwrap_or_else(|p| p.into_inner()).extend(pairs);
    }

    pub fn heal(&self) {
        self.cut.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub fn is_cut(&self, from: Host, to: Host) -> bool {
        self.cut.lock().unwrap_or_else(|p| p.into_inner()).contains(&(from, to))
    }

    /// Carries one message from `from` to `to`: true once it arrived, false if it was lost or
    /// cut off (on the way out or on arrival).
    pub async fn hop(&self, from: Host, to: Host) -> bool {
        if from == to {
            return true;
        }
        if self.is_cut(from, to) || self.chance(self.loss) {
            return false;
        }
        tokio::time::sleep(self.delay()).await;
        !self.is_cut(from, to)
    }
}
