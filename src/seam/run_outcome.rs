//! Provides [`RunOutcome`]: where an in-process run's task leaves its outcome, for the run's
//! one observer (the `subagent/end` event) and for everyone awaiting its result, so neither
//! needs a task, a join handle or a shared future of its own.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::error::{Result, SubagentError};
use crate::seam::SubagentResult;

/// Told a run's outcome once, by the task that settles it.
pub(crate) type SettleObserver = Box<dyn FnOnce(&Result<SubagentResult>) + Send>;

enum State {
    /// Neither the outcome nor an observer has come yet.
    Open,
    /// The observer came first and waits for the outcome.
    Observed(SettleObserver),
    /// The settling task is telling the observer; the outcome is stored next.
    Settling,
    /// The outcome, for every reader of the run's result.
    Settled(Result<SubagentResult>),
}

/// The meeting point of a run's settling task, its observer and its result's readers. The
/// observer is told before the outcome is stored, so a run's `subagent/end` is emitted before
/// anyone awaiting its result hears of it.
pub(crate) struct RunOutcome {
    state: Mutex<State>,
    settled: Notify,
}

impl RunOutcome {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State::Open),
            settled: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers the observer, or tells it now when the run has settled. A second observer,
    /// or one that comes while the first is being told, is handed back: the caller awaits
    /// [`RunOutcome::outcome`] for it.
    pub(crate) fn observe(&self, observer: SettleObserver) -> Option<SettleObserver> {
        let mut state = self.state();
        match &*state {
            State::Open => {
                *state = State::Observed(observer);
                None
            }
            State::Settled(outcome) => {
                let outcome = outcome.clone();
                // Outside the lock: the observer emits to listeners, which may do anything.
                drop(state);
                observer(&outcome);
                None
            }
            State::Observed(_) | State::Settling => Some(observer),
        }
    }

    /// Called once, by the settling task: tells a waiting observer, then stores the outcome
    /// and wakes every reader.
    fn settle(&self, outcome: Result<SubagentResult>) {
        let previous = std::mem::replace(&mut *self.state(), State::Settling);
        if let State::Observed(observer) = previous {
            observer(&outcome);
        }
        *self.state() = State::Settled(outcome);
        self.settled.notify_waiters();
    }

    /// Waits until the run has settled.
    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.settled.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the state is read, so a settlement in between is not missed.
            notified.as_mut().enable();
            if matches!(*self.state(), State::Settled(_)) {
                return;
            }
            notified.await;
        }
    }

    /// The run's outcome, once it has settled.
    pub(crate) async fn outcome(&self) -> Result<SubagentResult> {
        loop {
            self.wait().await;
            if let State::Settled(outcome) = &*self.state() {
                return outcome.clone();
            }
        }
    }
}

/// Settles its outcome when dropped unsettled: a settling task that panicked, or that the
/// runtime dropped at shutdown, still settles (as an infrastructure error), so no run's
/// `subagent/start` is left without its `subagent/end` and no reader waits forever.
pub(crate) struct SettleGuard(Option<Arc<RunOutcome>>);

impl SettleGuard {
    /// Guards `outcome` until [`SettleGuard::settle`].
    pub(crate) fn new(outcome: Arc<RunOutcome>) -> Self {
        Self(Some(outcome))
    }

    /// Settles the run with its outcome.
    pub(crate) fn settle(mut self, outcome: Result<SubagentResult>) {
        if let Some(cell) = self.0.take() {
            cell.settle(outcome);
        }
    }
}

impl Drop for SettleGuard {
    fn drop(&mut self) {
        if let Some(cell) = self.0.take() {
            cell.settle(Err(SubagentError::bug(
                "the run's task ended before it settled",
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::stop_reason::StopReason;

    fn completed() -> Result<SubagentResult> {
        Ok(SubagentResult {
            output: vec![crate::content::ContentBlock::text("done")],
            structured: None,
            stop_reason: StopReason::Completed,
            diagnostic: None,
        })
    }

    fn counting(told: &Arc<AtomicUsize>) -> SettleObserver {
        let told = Arc::clone(told);
        Box::new(move |outcome| {
            let result = outcome.as_ref().expect("a completed outcome");
            assert_eq!(result.stop_reason, StopReason::Completed);
            told.fetch_add(1, Ordering::SeqCst);
        })
    }

    fn settled(cell: &Arc<RunOutcome>, outcome: Result<SubagentResult>) {
        SettleGuard::new(Arc::clone(cell)).settle(outcome);
    }

    #[test]
    fn an_observer_that_came_first_is_told_by_the_settling_task_once() {
        let cell = Arc::new(RunOutcome::new());
        let told = Arc::new(AtomicUsize::new(0));
        assert!(cell.observe(counting(&told)).is_none());
        assert_eq!(told.load(Ordering::SeqCst), 0);
        settled(&cell, completed());
        assert_eq!(told.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn an_observer_that_came_after_the_settlement_is_told_at_once() {
        let cell = Arc::new(RunOutcome::new());
        settled(&cell, completed());
        let told = Arc::new(AtomicUsize::new(0));
        assert!(cell.observe(counting(&told)).is_none());
        assert_eq!(told.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_guard_dropped_unsettled_tells_the_observer_an_error_once() {
        let cell = Arc::new(RunOutcome::new());
        let told = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&told);
        assert!(cell
            .observe(Box::new(move |outcome| {
                assert!(
                    outcome.is_err(),
                    "an unsettled run is an infrastructure error"
                );
                counted.fetch_add(1, Ordering::SeqCst);
            }))
            .is_none());
        let guard = SettleGuard::new(Arc::clone(&cell));
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _guard = guard;
            panic!("the settling task panicked");
        }));
        assert!(unwound.is_err());
        assert_eq!(told.load(Ordering::SeqCst), 1, "told once");
    }

    #[test]
    fn a_second_observer_is_handed_back_and_the_first_keeps_its_place() {
        let cell = Arc::new(RunOutcome::new());
        let first = Arc::new(AtomicUsize::new(0));
        let second = Arc::new(AtomicUsize::new(0));
        assert!(cell.observe(counting(&first)).is_none());
        assert!(cell.observe(counting(&second)).is_some());
        settled(&cell, completed());
        assert_eq!(first.load(Ordering::SeqCst), 1);
        assert_eq!(second.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn readers_get_the_outcome_only_after_the_observer_was_told() {
        let cell = Arc::new(RunOutcome::new());
        let told = Arc::new(AtomicUsize::new(0));
        assert!(cell.observe(counting(&told)).is_none());
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let cell = Arc::clone(&cell);
                let told = Arc::clone(&told);
                tokio::spawn(async move {
                    let outcome = cell.outcome().await;
                    (told.load(Ordering::SeqCst), outcome)
                })
            })
            .collect();
        // Lets the readers run to their first wait (a reader that comes later reads at once).
        tokio::task::yield_now().await;
        settled(&cell, completed());
        for reader in readers {
            let (told_before, outcome) = reader.await.expect("the reader ran");
            assert_eq!(told_before, 1, "the observer was told before any reader");
            assert_eq!(
                outcome.expect("completed").stop_reason,
                StopReason::Completed
            );
        }
        // A reader after the settlement gets it at once.
        assert!(cell.outcome().await.is_ok());
    }
}
