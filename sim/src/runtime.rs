//! The runtime openraft runs on in a simulation: tokio's (one thread, time paused, so that it
//! advances only when every task waits) with openraft's one source of chance, the generator its
//! election timeouts are drawn from, seeded by the run instead of by the operating system.

use std::cell::RefCell;
use std::future::Future;
use std::io::Cursor;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioInstant};
use quorum_jepsen::rng::Rng;

thread_local! {
    static CHANCE: RefCell<Rng> = RefCell::new(Rng::new(0));
}

/// Seeds the generator openraft draws from on this thread (a run's one thread).
pub fn seed(seed: u64) {
    CHANCE.with(|c| *c.borrow_mut() = Rng::new(seed).fork(0x0A_F7));
}

/// openraft's handle on this thread's seeded generator.
pub struct SeededRng;

impl rand::RngCore for SeededRng {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        CHANCE.with(|c| c.borrow_mut().next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// tokio, as openraft's own `TokioRuntime`, with the seeded generator.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SimRuntime;

impl AsyncRuntime for SimRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = SeededRng;
    type OneshotSender<T: OptionalSend> = openraft::async_runtime::TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(duration: Duration, future: F) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        SeededRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (openraft::async_runtime::TokioOneShotSender(tx), rx)
    }
}

openraft::declare_raft_types!(
    /// The controller's entries (its `Command`s and `Response`s) on the simulation's runtime.
    pub SimConfig:
        D = quorum_state::Command,
        R = quorum_state::Response,
        AsyncRuntime = SimRuntime,
);

pub type Raft = openraft::Raft<SimConfig>;
