//! Provides [`WorkerPool`]: the arbiters (threads) agents are spread over, round-robin.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{ErrorCode, Result, SubagentError};

/// How many agents a started worker takes for each one the building arbiter takes. Measured on
/// 2 cores with 1,000 and 4,000 one-shot runs in flight: an even split left the building
/// arbiter at 60% of the samples and the worker idle a third of the time; a third of the
/// agents on the building arbiter was best; a quarter was slower at 1,000.
const STARTED_WORKER_SHARE: usize = 2;

/// Arbiters agents are spread over, round-robin (see [`crate::RuntimeBuilder::workers`]): the
/// arbiter that built the runtime and the worker threads started beside it, so a pool of `n` keeps
/// `n` threads busy, not `n + 1` (the building arbiter runs the delegation API's actors and the
/// host's own work, and would otherwise compete with every worker for the cores). For the same
/// reason a started worker takes [`STARTED_WORKER_SHARE`] agents for each one the building arbiter
/// takes.
pub(crate) struct WorkerPool {
    /// The worker threads this pool started (and stops).
    started: Vec<actix::Arbiter>,
    /// The rotation agents are placed by: the building arbiter once, then each started one
    /// [`STARTED_WORKER_SHARE`] times.
    arbiters: Vec<actix::ArbiterHandle>,
    next: AtomicUsize,
}

/// File descriptors one started worker holds (its event loop and wakers). Measured on Linux
/// under a limit of 1,024 descriptors: 230 workers started and 256 did not.
const DESCRIPTORS_PER_WORKER: u64 = 4;

/// Descriptors left for everything else a process holds (the store, sockets, the terminal).
const DESCRIPTORS_RESERVED: u64 = 64;

impl WorkerPool {
    /// Refuses a pool of `count` arbiters this process cannot open: actix panics when a
    /// worker thread's event loop finds no file descriptor left.
    ///
    /// # Errors
    /// `INVALID_ARGS` naming the descriptors needed and the process's limit.
    pub(crate) fn admit(count: usize) -> Result<()> {
        let started = u64::try_from(count.saturating_sub(1)).unwrap_or(u64::MAX);
        let needed = started
            .saturating_mul(DESCRIPTORS_PER_WORKER)
            .saturating_add(DESCRIPTORS_RESERVED);
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        match limit {
            Some(limit) if started > 0 && needed > limit => Err(SubagentError::new(
                ErrorCode::InvalidArgs,
                format!(
                    "{count} workers need about {needed} file descriptors and this process may \
                     open {limit}: use fewer workers, or raise the limit (`ulimit -n`)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// A pool of `count` arbiters: the current one and `count - 1` new threads.
    pub(crate) fn new(count: usize) -> Self {
        let started: Vec<actix::Arbiter> = (1..count).map(|_| actix::Arbiter::new()).collect();
        let arbiters =
            std::iter::once(actix::Arbiter::current())
                .chain(started.iter().flat_map(|arbiter| {
                    std::iter::repeat_n(arbiter.handle(), STARTED_WORKER_SHARE)
                }))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_the_descriptor_limit_cannot_hold_is_refused() {
        assert!(WorkerPool::admit(2).is_ok());
        let error = WorkerPool::admit(usize::MAX).expect_err("no limit holds that many");
        assert_eq!(error.code(), ErrorCode::InvalidArgs);
        assert!(error.message().contains("ulimit -n"), "{error}");
    }

    /// The thread `arbiter` runs on.
    async fn thread_of(arbiter: &actix::ArbiterHandle) -> std::thread::ThreadId {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        assert!(arbiter.spawn_fn(move || {
            let _ = sender.send(std::thread::current().id());
        }));
        receiver.await.expect("the arbiter ran the probe")
    }

    #[actix::test]
    async fn a_pool_of_two_is_the_building_arbiter_and_one_worker_taking_twice_its_share() {
        let pool = WorkerPool::new(2);
        let building = std::thread::current().id();
        let mut threads = Vec::new();
        for _ in 0..6 {
            threads.push(thread_of(&pool.next()).await);
        }
        let on_building = threads.iter().filter(|thread| **thread == building).count();
        assert_eq!(
            on_building, 2,
            "one placement in three stays here: {threads:?}"
        );
        let worker = threads[1];
        assert_ne!(worker, building);
        assert!(
            threads
                .iter()
                .all(|thread| *thread == building || *thread == worker),
            "two threads in all: {threads:?}"
        );
        pool.stop();
    }
}
