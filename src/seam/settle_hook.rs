//! Provides [`SettleHook`]: how the task that settles a run tells the run's one observer (the
//! seam's `subagent/end`), so no task of its own has to wait on the result.

use std::sync::{Arc, Mutex, PoisonError};

use crate::error::{Result, SubagentError};
use crate::seam::SubagentResult;

/// Told a run's outcome once, by the task that settles it.
pub(crate) type SettleObserver = Box<dyn FnOnce(&Result<SubagentResult>) + Send>;

enum State {
    /// Neither side has come yet.
    Open,
    /// The observer came first and waits for the outcome.
    Observed(SettleObserver),
    /// The run settled before anyone observed it.
    Settled,
}

/// The meeting point of a run's settling task and its observer: whichever comes second runs
/// the observer (the task with the outcome in hand; a late observer is handed back, since the
/// outcome has gone on to the run's result).
pub(crate) struct SettleHook {
    state: Mutex<State>,
}

impl SettleHook {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State::Open),
        }
    }

    /// Registers the observer; hands it back when the run has already settled (the caller then
    /// reads the outcome from the run's result).
    pub(crate) fn observe(&self, observer: SettleObserver) -> Option<SettleObserver> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match *state {
            State::Open => {
                *state = State::Observed(observer);
                None
            }
            State::Observed(_) | State::Settled => Some(observer),
        }
    }

    /// Called once by the settling task with the run's outcome: runs a waiting observer.
    pub(crate) fn settle(&self, outcome: &Result<SubagentResult>) {
        let previous = std::mem::replace(
            &mut *self.state.lock().unwrap_or_else(PoisonError::into_inner),
            State::Settled,
        );
        // Outside the lock: the observer emits to listeners, which may do anything.
        if let State::Observed(observer) = previous {
            observer(outcome);
        }
    }
}

/// Settles its hook when dropped unsettled: a settling task that panicked, or that the runtime
/// dropped at shutdown, still tells the observer (as an infrastructure error), so no run's
/// `subagent/start` is left without its `subagent/end`.
pub(crate) struct SettleGuard(Option<Arc<SettleHook>>);

impl SettleGuard {
    /// Guards `hook` until [`SettleGuard::settle`].
    pub(crate) fn new(hook: Arc<SettleHook>) -> Self {
        Self(Some(hook))
    }

    /// Settles the hook with the run's outcome.
    pub(crate) fn settle(mut self, outcome: &Result<SubagentResult>) {
        if let Some(hook) = self.0.take() {
            hook.settle(outcome);
        }
    }
}

impl Drop for SettleGuard {
    fn drop(&mut self) {
        if let Some(hook) = self.0.take() {
            hook.settle(&Err(SubagentError::bug(
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

    #[test]
    fn an_observer_that_came_first_is_told_by_the_settling_task_once() {
        let hook = SettleHook::new();
        let told = Arc::new(AtomicUsize::new(0));
        assert!(hook.observe(counting(&told)).is_none());
        assert_eq!(told.load(Ordering::SeqCst), 0);
        hook.settle(&completed());
        assert_eq!(told.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn an_observer_that_came_after_the_settlement_is_handed_back() {
        let hook = SettleHook::new();
        hook.settle(&completed());
        let told = Arc::new(AtomicUsize::new(0));
        let late = hook.observe(counting(&told)).expect("handed back");
        assert_eq!(told.load(Ordering::SeqCst), 0);
        late(&completed());
        assert_eq!(told.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_guard_dropped_unsettled_tells_the_observer_an_error_once() {
        let hook = Arc::new(SettleHook::new());
        let told = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&told);
        assert!(hook
            .observe(Box::new(move |outcome| {
                assert!(
                    outcome.is_err(),
                    "an unsettled run is an infrastructure error"
                );
                counted.fetch_add(1, Ordering::SeqCst);
            }))
            .is_none());
        let guard = SettleGuard::new(Arc::clone(&hook));
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _guard = guard;
            panic!("the settling task panicked");
        }));
        assert!(unwound.is_err());
        assert_eq!(told.load(Ordering::SeqCst), 1);
        hook.settle(&completed());
        assert_eq!(told.load(Ordering::SeqCst), 1, "told once");
    }

    #[test]
    fn a_settled_guard_tells_the_outcome_and_nothing_on_drop() {
        let hook = Arc::new(SettleHook::new());
        let told = Arc::new(AtomicUsize::new(0));
        assert!(hook.observe(counting(&told)).is_none());
        SettleGuard::new(Arc::clone(&hook)).settle(&completed());
        assert_eq!(told.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_second_observer_is_handed_back_and_the_first_keeps_its_place() {
        let hook = SettleHook::new();
        let first = Arc::new(AtomicUsize::new(0));
        let second = Arc::new(AtomicUsize::new(0));
        assert!(hook.observe(counting(&first)).is_none());
        assert!(hook.observe(counting(&second)).is_some());
        hook.settle(&completed());
        assert_eq!(first.load(Ordering::SeqCst), 1);
        assert_eq!(second.load(Ordering::SeqCst), 0);
    }
}
