//! Task 0's input (`srun`'s stdin) on its way into the task, bounded.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

/// How much of `srun`'s input may wait for task 0 to read it.
pub(crate) const MAX_WAITING_INPUT: usize = 4 << 20;

/// What a task's input writer takes pieces from, and the count it lowers by each piece written.
pub(crate) type Queue = (mpsc::UnboundedReceiver<Option<Vec<u8>>>, Arc<AtomicUsize>);

/// Task 0's input on its way in. What `srun` sent and the task has not read yet is bounded by
/// [`MAX_WAITING_INPUT`]: a task that never reads its input cannot make the agent hold an
/// unbounded amount of it.
#[derive(Debug)]
pub(crate) struct TaskInput {
    pub(crate) tx: mpsc::UnboundedSender<Option<Vec<u8>>>,
    waiting: Arc<AtomicUsize>,
    /// Whether `srun` was told that input was dropped.
    pub(crate) told: bool,
}

impl TaskInput {
    /// The input, the queue its writer takes pieces from, and the count the writer lowers by
    /// each piece it wrote.
    pub(crate) fn new() -> (TaskInput, mpsc::UnboundedReceiver<Option<Vec<u8>>>, Arc<AtomicUsize>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        (TaskInput { tx, waiting: waiting.clone(), told: false }, rx, waiting)
    }

    /// Queues `data` for the task; false, and nothing queued, when that would exceed the bound.
    pub(crate) fn push(&self, data: Vec<u8>) -> bool {
        let len = data.len();
        let fits = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                w.checked_add(len).filter(|&n| n <= MAX_WAITING_INPUT)
            })
            .is_ok();
        if fits && self.tx.send(Some(data)).is_err() {
            self.waiting.fetch_sub(len, Ordering::Relaxed);
        }
        fits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_a_task_does_not_read_is_bounded_and_room_comes_back_as_it_reads() {
        let (input, mut rx, waiting) = TaskInput::new();
        assert!(input.push(vec![0; MAX_WAITING_INPUT - 1]));
        assert!(!input.push(vec![0; 2]), "past the bound");
        assert!(input.push(vec![0; 1]), "up to it");
        assert!(!input.push(vec![0; 1]));
        // The task reads the first piece: its room is free again.
        let piece = rx.try_recv().unwrap().unwrap();
        waiting.fetch_sub(piece.len(), Ordering::Relaxed);
        assert!(input.push(vec![0; 1 << 20]));
        assert_eq!(rx.try_recv().unwrap().unwrap().len(), 1);
        assert_eq!(rx.try_recv().unwrap().unwrap().len(), 1 << 20);
        assert!(rx.try_recv().is_err(), "what did not fit was not queued");
    }
}
