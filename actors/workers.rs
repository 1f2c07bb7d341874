//! Provides [`WorkerPool`]: the arbiters (threads) agents are spread over, round-robin.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Arbiters agents are spread over, round-robin (see [`crate::RuntimeBuilder::workers`]): the
/// arbiter that built the runtime and the worker threads started beside it, so a pool of `n`
/// keeps `n` threads busy, not `n + 1` (the building arbiter runs the seam's actors and the
/// host's own work, and would otherwise compete with every worker for the cores).
pub(crate) struct WorkerPool {
    /// The worker threads this pool started (and stops).
    started: Vec<actix::Arbiter>,
    /// Every arbiter agents go to: the building one first, then the started ones.
    arbiters: Vec<actix::ArbiterHandle>,
    next: AtomicUsize,
}

impl WorkerPool {
    /// A pool of `count` arbiters: the current one and `count - 1` new threads.
    pub(crate) fn new(count: usize) -> Self {
        let started: Vec<actix::Arbiter> = (1..count).map(|_| actix::Arbiter::new()).collect();
        let arbiters = std::iter::once(actix::Arbiter::current())
            .chain(started.iter().map(actix::Arbiter::handle))
            .collect();
        Self {
            started,
            arbiters,
            next: AtomicUsize::new(0),
        }
    }

    pub(crate) fn next(&self) -> actix::ArbiterHandle {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.arbiters.len();
        self.arbiters[index].clone()
    }

    /// Stops the worker threads this pool started (after every agent on them was released);
    /// the building arbiter is its owner's to stop.
    pub(crate) fn stop(&self) {
        for arbiter in &self.started {
            arbiter.stop();
        }
    }
}
