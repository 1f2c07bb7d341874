//! Provides [`WriteThread`]: one thread that carries out a store's writes, first asked, first
//! run, once they come from more than one thread.
//!
//! # Why
//! A runtime spread over several worker threads writes from all of them at once: they contend
//! for the store's writer lock and for sled's own structures, and each spends its time
//! encoding, compressing and inserting rows instead of running agents. Handed to one thread of
//! their own, the writes run one after another beside the agents (the main job, `subagents
//! load`, ran 1.07–1.39× as fast in six alternated pairs, `load --roots 1 --children 20000`
//! 1.10–1.22× in three). A runtime on one thread gains nothing from it: every write would then
//! wait for two wakeups, one on each side (the reference's continuable scenario on sled, a
//! thousand starts one after another, took 1.4× as long). So writes run on their caller's
//! thread until one arrives from a second thread, and on the write thread from then on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::thread::{JoinHandle, ThreadId};

use futures::future::{BoxFuture, FutureExt};

use crate::error::{Result, SubagentError};

/// One write, with its answer inside.
type Job = Box<dyn FnOnce() + Send>;

/// A thread that runs a store's writes one at a time, in the order they were asked for, once
/// they come from more than one thread (see the module docs).
#[derive(Default)]
pub(crate) struct WriteThread {
    /// The thread, started by the first write from a second thread; `None` inside when the
    /// system refused a thread (writes then stay on their callers' threads).
    started: OnceLock<Option<Started>>,
    /// The thread the first write came from.
    first_writer: OnceLock<ThreadId>,
    /// Set once a write came from another thread: every write is queued from then on.
    shared: AtomicBool,
}

/// The running thread and its queue.
struct Started {
    /// Taken when the store is gone, which ends the thread once it has run what is queued.
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for WriteThread {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("WriteThread")
            .field("shared", &self.shared.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Started {
    /// Starts the thread; `None` when the system refuses one.
    fn start() -> Option<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || {
                // Ends once every sender is gone and the queue is empty.
                for job in queue {
                    job();
                }
            })
            .inspect_err(|error| {
                tracing::warn!(%error, "the store's write thread could not start: writes stay on their callers' threads");
            })
            .ok()?;
        Some(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }
}

/// What the thread is called (in `top -H`, a debugger, a profile).
const THREAD_NAME: &str = "subagents-store";

impl WriteThread {
    /// Whether the calling thread carries its write out itself, here and now: while every
    /// write so far came from it. Once one comes from another thread, every write is
    /// [queued](WriteThread::queue).
    pub(crate) fn here(&self) -> bool {
        if self.shared.load(Ordering::Acquire) {
            return false;
        }
        let here = std::thread::current().id();
        if *self.first_writer.get_or_init(|| here) == here {
            return true;
        }
        if !self.shared.swap(true, Ordering::AcqRel) {
            tracing::debug!(thread = THREAD_NAME, "store writes come from several threads: they are queued to the store's write thread from now on");
        }
        false
    }

    /// Whether the thread runs (for tests).
    #[cfg(test)]
    pub(crate) fn is_started(&self) -> bool {
        self.started.get().is_some_and(Option::is_some)
    }

    /// Queues `write` behind every write queued before it; the future answers what it
    /// returned. The write runs even when the future is dropped unpolled, as a store's writes
    /// take effect when they are asked for, and a caller's writes run in the order it asked
    /// for them.
    pub(crate) fn queue<T: Send + 'static>(
        &self,
        write: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> BoxFuture<'static, Result<T>> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // The caller may have stopped waiting; the write still happened.
            let _ = answer.send(write());
        });
        let jobs = self
            .started
            .get_or_init(Started::start)
            .as_ref()
            .and_then(|started| started.jobs.as_ref());
        let refused = match jobs {
            Some(jobs) => jobs.send(job).err().map(|mpsc::SendError(job)| job),
            None => Some(job),
        };
        // No thread (refused, or gone with the process stopping under it): written here.
        if let Some(job) = refused {
            job();
        }
        async move {
            answered.await.unwrap_or_else(|_| {
                Err(SubagentError::bug(
                    "the store's write thread stopped under a write",
                ))
            })
        }
        .boxed()
    }
}

impl Drop for Started {
    /// Lets the thread finish what is queued, then waits for it: nothing asked of the store is
    /// left unwritten once it is gone.
    fn drop(&mut self) {
        drop(self.jobs.take());
        // The store's last handle may go with a queued write's own, on the thread itself,
        // which then ends by itself.
        if let Some(thread) = self
            .thread
            .take()
            .filter(|thread| thread.thread().id() != std::thread::current().id())
        {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures::executor::block_on;

    use super::*;

    /// A write that records `n` in `written`.
    fn record(written: &Arc<Mutex<Vec<u32>>>, n: u32) -> impl FnOnce() -> Result<u32> + Send {
        let written = Arc::clone(written);
        move || {
            written.lock().expect("lock").push(n);
            Ok(n)
        }
    }

    #[test]
    fn writes_from_one_thread_stay_on_it() {
        let writes = WriteThread::default();
        assert!((0..3).all(|_| writes.here()));
        assert!(!writes.is_started(), "no thread is started for one writer");
    }

    #[test]
    fn once_a_second_thread_writes_every_write_is_queued_in_the_order_asked() {
        let writes = Arc::new(WriteThread::default());
        assert!(writes.here());
        let other = Arc::clone(&writes);
        let second = std::thread::spawn(move || other.here())
            .join()
            .expect("the second writer");
        assert!(!second, "a second thread's write is queued");
        assert!(!writes.here(), "and so is every later one, from any thread");
        let written = Arc::new(Mutex::new(Vec::new()));
        let mut answers = Vec::new();
        for n in 0..100 {
            let answer = writes.queue(record(&written, n));
            // Every other future is dropped unpolled: its write happens all the same.
            if n % 2 == 0 {
                answers.push((n, answer));
            }
        }
        for (n, answer) in answers {
            assert_eq!(block_on(answer).expect("written"), n);
        }
        let last = block_on(writes.queue(record(&written, 100))).expect("written");
        assert_eq!(last, 100);
        assert_eq!(
            *written.lock().expect("lock"),
            (0..=100).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_store_that_goes_runs_what_was_queued_first() {
        let writes = WriteThread::default();
        writes.shared.store(true, Ordering::Release);
        let (release, held) = std::sync::mpsc::channel::<()>();
        let written = Arc::new(Mutex::new(Vec::new()));
        // The first write holds the thread until the store is going, so the rest are queued.
        let first = record(&written, 0);
        drop(writes.queue(move || {
            held.recv().expect("released");
            first()
        }));
        for n in 1..10 {
            drop(writes.queue(record(&written, n)));
        }
        let dropping = std::thread::spawn(move || drop(writes));
        release.send(()).expect("the first write waits");
        dropping.join().expect("the store went");
        assert_eq!(*written.lock().expect("lock"), (0..10).collect::<Vec<_>>());
    }
}
