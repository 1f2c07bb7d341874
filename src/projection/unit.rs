//! Provides [`ProjectionUnit`]: a pure fold of one session's events into a small plain-JSON
//! state, the form in which the listing reads a child's identity without loading it.

use serde_json::Value;

use crate::error::Result;
use crate::session::SessionEvent;

/// A pure, synchronous fold of a session's events.
///
/// The state is plain JSON so a checkpoint of it can be cached beside the log and restored
/// later. `apply` must not look anywhere but its arguments: the same events always fold to the
/// same state, whether live, restored from a checkpoint, or refolded from the store.
pub trait ProjectionUnit: Send + Sync + 'static {
    /// The unit's key in snapshots and checkpoint rows.
    fn key(&self) -> &str;

    /// The version of the state's shape: a checkpoint row of another version is refolded.
    fn state_version(&self) -> u32;

    /// The state before any event.
    fn init(&self) -> Value;

    /// The state after `event`, or `None` when `event` leaves it unchanged (most events).
    fn apply(&self, state: &Value, event: &SessionEvent) -> Option<Value>;

    /// Moves `state` past `event` in place; answers whether it changed. Folds call this; by
    /// default it is [`apply`](Self::apply). A unit whose state changes on most events
    /// overrides it to change the state where it is instead of building a copy per event; both
    /// must fold the same events to the same state.
    fn apply_in_place(&self, state: &mut Value, event: &SessionEvent) -> bool {
        match self.apply(state, event) {
            Some(next) => {
                *state = next;
                true
            }
            None => false,
        }
    }

    /// Whether snapshots show this unit's view (a host-only unit keeps its state to itself).
    fn visible(&self) -> bool {
        true
    }

    /// The client-visible view of `state`.
    ///
    /// # Errors
    /// When the state cannot be rendered; a listing then diagnoses that session `corrupt`.
    fn view(&self, state: &Value) -> Result<Value> {
        Ok(state.clone())
    }
}
