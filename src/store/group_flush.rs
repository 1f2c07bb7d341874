//! Provides [`GroupFlush`]: one durability flush at a time, shared by every caller it covers
//! (group commit).
//!
//! A caller takes a ticket, then waits for a flush that *began* after its ticket: that flush
//! covers every write the caller made before asking. A caller that finds a flush in flight
//! that began earlier waits for it and then starts (or joins) the next one. So however many
//! children flush at once, the database sees one flush in flight, and most callers share one.
//! (sled 0.34's own concurrent `flush_async` calls can also stall each other for good.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use futures::future::{BoxFuture, FutureExt, Shared};

use crate::error::Result;

type Flush = Shared<BoxFuture<'static, Result<()>>>;

#[derive(Default)]
struct State {
    /// The highest ticket a completed flush covered.
    covered: u64,
    /// The flush in flight and the highest ticket it covers.
    in_flight: Option<(u64, Flush)>,
}

/// Serializes and shares flushes.
#[derive(Default)]
pub(crate) struct GroupFlush {
    tickets: AtomicU64,
    state: Mutex<State>,
}

impl std::fmt::Debug for GroupFlush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupFlush").finish_non_exhaustive()
    }
}

impl GroupFlush {
    /// Makes every write made before this call durable, through `start` (called at most once
    /// per flush actually run).
    ///
    /// # Cancel safety
    /// Dropping the future abandons the wait; a flush it started still completes for whoever
    /// else waits on it (a later caller drives it if nobody does).
    pub(crate) async fn flush(
        &self,
        start: impl Fn() -> BoxFuture<'static, Result<()>>,
    ) -> Result<()> {
        let ticket = self.tickets.fetch_add(1, Ordering::SeqCst) + 1;
        loop {
            let (covers, flush) = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                // A finished flush nobody recorded (its waiters were dropped) still counts.
                if let Some((covers, done)) = &state.in_flight {
                    if let Some(outcome) = done.peek() {
                        let covers = *covers;
                        let succeeded = outcome.is_ok();
                        state.in_flight = None;
                        if succeeded {
                            state.covered = state.covered.max(covers);
                        }
                    }
                }
                if state.covered >= ticket {
                    return Ok(());
                }
                match &state.in_flight {
                    Some((covers, flush)) => (*covers, flush.clone()),
                    None => {
                        // Every ticket taken so far is covered by a flush starting now.
                        let covers = self.tickets.load(Ordering::SeqCst);
                        let flush = start().shared();
                        state.in_flight = Some((covers, flush.clone()));
                        (covers, flush)
                    }
                }
            };
            let outcome = flush.await;
            if covers >= ticket {
                return outcome;
            }
            // That flush began before this caller asked: wait for (or start) the next one.
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn concurrent_callers_share_flushes_and_each_is_covered() {
        let gate = Arc::new(GroupFlush::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let (release, hold) = tokio::sync::watch::channel(false);
        let start = {
            let runs = Arc::clone(&runs);
            move || -> BoxFuture<'static, Result<()>> {
                let runs = Arc::clone(&runs);
                let mut hold = hold.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = hold.wait_for(|open| *open).await;
                    Ok(())
                }
                .boxed()
            }
        };
        // The first caller starts a flush that is held; nine more ask while it is in flight.
        let callers: Vec<_> = (0..10)
            .map(|_| {
                let gate = Arc::clone(&gate);
                let start = start.clone();
                tokio::spawn(async move { gate.flush(start).await })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "one flush in flight at a time"
        );
        release.send_replace(true);
        for caller in callers {
            caller.await.unwrap().unwrap();
        }
        // The nine who asked during the first flush share one more.
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // Nothing was written since: a new caller still gets a flush of its own.
        gate.flush(start).await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }
}
