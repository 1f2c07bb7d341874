//! Provides [`WorkerPool`]: the arbiters (threads) agents are spread over, round-robin.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Arbiters agents are spread over, round-robin (see [`crate::RuntimeBuilder::workers`]).
pub(crate) struct WorkerPool {
    arbiters: Vec<actix::Arbiter>,
    next: AtomicUsize,
}

impl WorkerPool {
    pub(crate) fn new(count: usize) -> Self {
        Self {
            arbiters: (0..count).map(|_| actix::Arbiter::new()).collect(),
            next: AtomicUsize::new(0),
        }
    }

    pub(crate) fn next(&self) -> actix::ArbiterHandle {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.arbiters.len().max(1);
        self.arbiters[index].handle()
    }

    /// Stops every worker thread (after every agent on them was released).
    pub(crate) fn stop(&self) {
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
    }
}
