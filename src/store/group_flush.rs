//! Provides [`GroupFlush`]: one durability flush at a time, shared by every caller it covers
//! (group commit).
//!
//! A caller takes a ticket, then waits for a flush that *began* after its ticket: that flush
//! covers every write the caller made before asking. A caller that finds a flush in flight
//! that began earlier waits for it and then starts (or joins) the next one. So however many
//! children flush at once, the database sees one flush in flight, and most callers share one.
//! (sled 0.34's own concurrent `flush_async` calls can also stall each other for good.)
//!
//! Under load a flush also **gathers** before it begins: when the last flush covered several
//! callers, the next one waits for twice as many (at most [`GATHER_AT_MOST`]), so the group
//! grows with the rate of callers until the window bounds it, and each flush's cost is shared
//! by more of them. A caller alone (the last flush covered one) is flushed at once: gathering
//! costs latency only when others are flushing too. (One epoch's end-of-epoch flush waits at
//! most the window longer; 1,000 concurrent epochs share a few dozen flushes instead of
//! hundreds.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::sync::Notify;

use crate::error::Result;
use crate::ids::SessionId;

/// The longest a flush waits for more callers before it begins.
pub(crate) const GATHER_AT_MOST: Duration = Duration::from_millis(1);

/// The most callers a flush waits for.
const GATHER_UP_TO: u64 = 1024;

/// A flush that began (or is gathering): the highest ticket it covers, and its outcome.
type Flush = Shared<BoxFuture<'static, (u64, Result<()>)>>;

#[derive(Default)]
struct State {
    /// The highest ticket a completed flush covered.
    covered: u64,
    /// The flush gathering or in flight.
    in_flight: Option<Flush>,
    /// The highest ticket the last flush that began covers: where the next group starts.
    began: u64,
    /// How many tickets the last flush that began covered.
    last_group: u64,
}

#[derive(Default)]
struct Inner {
    /// Shared with a gathering flush, which holds no reference to the state it is kept in.
    tickets: Arc<AtomicU64>,
    /// Woken by every new ticket, for a flush that gathers.
    joined: Arc<Notify>,
    state: Mutex<State>,
}

/// Serializes, gathers and shares flushes.
#[derive(Default)]
pub(crate) struct GroupFlush {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for GroupFlush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupFlush").finish_non_exhaustive()
    }
}

impl GroupFlush {
    /// Makes every write made before this call durable, through `start` (called at most once
    /// per flush actually run; its future is polled only once the flush begins).
    ///
    /// # Cancel safety
    /// Dropping the future abandons the wait; a flush it started still completes for whoever
    /// else waits on it (a later caller drives it if nobody does).
    pub(crate) async fn flush(
        &self,
        start: impl Fn() -> BoxFuture<'static, Result<()>>,
    ) -> Result<()> {
        let inner = &self.inner;
        let ticket = inner.tickets.fetch_add(1, Ordering::SeqCst) + 1;
        inner.joined.notify_waiters();
        loop {
            let flush = {
                let mut state = inner.state.lock().unwrap_or_else(PoisonError::into_inner);
                // A finished flush nobody recorded (its waiters were dropped) still counts.
                if let Some((covers, outcome)) = state.in_flight.as_ref().and_then(Shared::peek) {
                    let (covers, succeeded) = (*covers, outcome.is_ok());
                    state.in_flight = None;
                    if succeeded {
                        state.covered = state.covered.max(covers);
                    }
                }
                if state.covered >= ticket {
                    return Ok(());
                }
                match &state.in_flight {
                    Some(flush) => flush.clone(),
                    None => {
                        let flush = self.begin(&state, start()).shared();
                        state.in_flight = Some(flush.clone());
                        flush
                    }
                }
            };
            let (covers, outcome) = flush.await;
            if covers >= ticket {
                return outcome;
            }
            // That flush began before this caller asked: wait for (or start) the next one.
        }
    }

    /// [`GroupFlush::flush`] for session `id`'s flush: a failure names the session, as a
    /// flush of its own would.
    pub(crate) async fn flush_session(
        &self,
        id: SessionId,
        start: impl Fn() -> BoxFuture<'static, Result<()>>,
    ) -> Result<()> {
        self.flush(start)
            .await
            .map_err(|error| error.about(format_args!("flushing session {id}")))
    }

    /// The next flush: it gathers (see the module docs), then covers every ticket taken so far
    /// and runs `run`.
    fn begin(
        &self,
        state: &State,
        run: BoxFuture<'static, Result<()>>,
    ) -> BoxFuture<'static, (u64, Result<()>)> {
        // The flush is kept in the state, so it refers to the state weakly: a flush abandoned
        // while it gathers must not keep its store (and the database `run` holds) alive.
        let inner = Arc::downgrade(&self.inner);
        let gather = (state.last_group > 1).then(|| Gather {
            tickets: Arc::clone(&self.inner.tickets),
            joined: Arc::clone(&self.inner.joined),
            began: state.began,
            callers: state.last_group.saturating_mul(2).min(GATHER_UP_TO),
        });
        async move {
            if let Some(gather) = gather {
                gather.wait().await;
            }
            let covers = match inner.upgrade() {
                Some(inner) => {
                    let mut state = inner.state.lock().unwrap_or_else(PoisonError::into_inner);
                    let covers = inner.tickets.load(Ordering::SeqCst);
                    state.last_group = covers.saturating_sub(state.began);
                    state.began = covers;
                    covers
                }
                // The store is gone: nobody waits for this flush any more.
                None => 0,
            };
            (covers, run.await)
        }
        .boxed()
    }
}

/// A flush waiting for more callers before it begins.
struct Gather {
    tickets: Arc<AtomicU64>,
    joined: Arc<Notify>,
    /// The tickets the last flush that began covers.
    began: u64,
    /// How many callers since then to wait for.
    callers: u64,
}

impl Gather {
    /// Waits until `callers` tickets were taken since the last flush began, or
    /// [`GATHER_AT_MOST`] passed.
    async fn wait(self) {
        let enough = || {
            self.tickets
                .load(Ordering::SeqCst)
                .saturating_sub(self.began)
                >= self.callers
        };
        let deadline = tokio::time::sleep(GATHER_AT_MOST);
        tokio::pin!(deadline);
        loop {
            let joined = self.joined.notified();
            tokio::pin!(joined);
            // Registered before the check, so a ticket taken in between still wakes it.
            joined.as_mut().enable();
            if enough() {
                return;
            }
            tokio::select! {
                () = &mut deadline => return,
                () = &mut joined => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use tokio::sync::watch;
    use tokio::time::Instant;

    use super::*;

    /// A flush operation that counts its runs and holds each until the gate opens.
    #[derive(Clone)]
    struct Held {
        runs: Arc<AtomicUsize>,
        open: watch::Receiver<bool>,
    }

    impl Held {
        fn new() -> (Self, watch::Sender<bool>) {
            let (gate, open) = watch::channel(false);
            let runs = Arc::default();
            (Self { runs, open }, gate)
        }

        fn start(&self) -> impl Fn() -> BoxFuture<'static, Result<()>> + Clone + 'static {
            let held = self.clone();
            move || {
                let held = held.clone();
                async move {
                    held.runs.fetch_add(1, Ordering::SeqCst);
                    let _ = held.open.clone().wait_for(|open| *open).await;
                    Ok(())
                }
                .boxed()
            }
        }

        fn runs(&self) -> usize {
            self.runs.load(Ordering::SeqCst)
        }
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// `count` callers of `flushes`, spawned.
    fn callers(
        flushes: &Arc<GroupFlush>,
        held: &Held,
        count: usize,
    ) -> Vec<tokio::task::JoinHandle<Result<()>>> {
        (0..count)
            .map(|_| {
                let flushes = Arc::clone(flushes);
                let start = held.start();
                tokio::spawn(async move { flushes.flush(start).await })
            })
            .collect()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn concurrent_callers_share_flushes_and_each_is_covered() {
        let flushes = Arc::new(GroupFlush::default());
        let (held, gate) = Held::new();
        // The first caller starts a flush that is held; nine more ask while it is in flight.
        let waiting = callers(&flushes, &held, 10);
        settle().await;
        assert_eq!(held.runs(), 1, "one flush in flight at a time");
        gate.send_replace(true);
        for caller in waiting {
            caller.await.unwrap().unwrap();
        }
        // The nine who asked during the first flush share one more.
        assert_eq!(held.runs(), 2);
        // Nothing was written since: a new caller still gets a flush of its own.
        flushes.flush(held.start()).await.unwrap();
        assert_eq!(held.runs(), 3);
    }

    /// One flush held in flight with two callers behind it, then released: the last group
    /// (the second flush's) is two, so the next flush gathers.
    async fn load_with_a_group_of_two(flushes: &Arc<GroupFlush>) -> Held {
        let (held, gate) = Held::new();
        let first = callers(flushes, &held, 3);
        settle().await;
        gate.send_replace(true);
        for caller in first {
            caller.await.unwrap().unwrap();
        }
        assert_eq!(held.runs(), 2);
        held
    }

    // A flush abandoned while it gathers (its callers dropped, as a shutdown drops them) is
    // let go of with the store: it kept the store, and the database its operation holds, alive
    // before (a reference cycle through the state it is kept in).
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_flush_abandoned_while_it_gathers_is_let_go_with_the_store() {
        let flushes = Arc::new(GroupFlush::default());
        load_with_a_group_of_two(&flushes).await;
        // The next flush gathers; its one caller is dropped meanwhile.
        let database = Arc::new(());
        let start = {
            let database = Arc::clone(&database);
            move || -> BoxFuture<'static, Result<()>> {
                let database = Arc::clone(&database);
                async move {
                    drop(database);
                    Ok(())
                }
                .boxed()
            }
        };
        let abandoned = {
            let flushes = Arc::clone(&flushes);
            tokio::spawn(async move { flushes.flush(start).await })
        };
        settle().await;
        // Here, its caller's operation and the gathering flush's.
        assert_eq!(Arc::strong_count(&database), 3);
        abandoned.abort();
        settle().await;
        assert_eq!(
            Arc::strong_count(&database),
            2,
            "the store keeps the gathering flush"
        );
        drop(flushes);
        assert_eq!(
            Arc::strong_count(&database),
            1,
            "nothing outlives the store"
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_caller_alone_is_flushed_at_once() {
        let flushes = GroupFlush::default();
        let (held, gate) = Held::new();
        gate.send_replace(true);
        let began = Instant::now();
        for _ in 0..3 {
            flushes.flush(held.start()).await.unwrap();
        }
        assert_eq!(held.runs(), 3);
        assert_eq!(began.elapsed(), Duration::ZERO, "nothing waited to gather");
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn under_load_a_flush_gathers_twice_the_last_group_within_the_window() {
        let flushes = Arc::new(GroupFlush::default());
        let held = load_with_a_group_of_two(&flushes).await;

        // The last group was two: the next flush waits for four callers, and begins as soon
        // as the fourth asks, with no time passing.
        let began = Instant::now();
        let mut second = Vec::new();
        for _ in 0..4 {
            assert_eq!(held.runs(), 2, "the flush gathers before it begins");
            second.extend(callers(&flushes, &held, 1));
            settle().await;
        }
        for caller in second {
            caller.await.unwrap().unwrap();
        }
        assert_eq!(held.runs(), 3, "four callers, one flush");
        assert_eq!(began.elapsed(), Duration::ZERO);

        // Fewer callers than it waits for: it begins when the window closes.
        let began = Instant::now();
        for caller in callers(&flushes, &held, 3) {
            caller.await.unwrap().unwrap();
        }
        assert_eq!(held.runs(), 4);
        assert_eq!(began.elapsed(), GATHER_AT_MOST);

        // Load is gone: the first caller alone waits out the window once (the group before it
        // was three), and the next is flushed at once.
        let began = Instant::now();
        flushes.flush(held.start()).await.unwrap();
        assert_eq!(began.elapsed(), GATHER_AT_MOST);
        let began = Instant::now();
        flushes.flush(held.start()).await.unwrap();
        assert_eq!(began.elapsed(), Duration::ZERO);
        assert_eq!(held.runs(), 6);
    }
}
