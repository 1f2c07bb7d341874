//! Provides [`FoldState`]: a unit's state on one live log (or one whole-log fold), kept decoded
//! for the delegation API's own two units.
//!
//! # Why
//! A unit's state is plain JSON, so any unit can be checkpointed and restored. Folding the
//! built-in units on that JSON cost more than the rest of a child's release: every event moved
//! a field found by name in a map, every turn boundary decoded and re-encoded the timing state,
//! and a fresh cell built its JSON before the first event. Every continuable epoch folds its
//! log at its turn end and again at its release, so the registry keeps these two states as
//! the structs their JSON encodes and writes JSON only for a checkpoint row or a view. The
//! result is the same JSON the unit's own fold reaches from its `init` (a test folds both
//! ways); a host's units, and any unit registered outside
//! [`ProjectionRegistry::with_seam_units`](super::ProjectionRegistry::with_seam_units), fold
//! on JSON as before.

use std::panic::{catch_unwind, AssertUnwindSafe};

use serde_json::value::RawValue;
use serde_json::Value;

use super::identity::identity_after;
use super::registry::view_of;
use super::timing::TimingState;
use super::{ProjectionUnit, SubagentIdentity};
use crate::error::Result;
use crate::session::SessionEvent;

/// Which built-in unit a registered unit is, for the units the registry folds decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Native {
    /// [`super::SubagentIdentityUnit`].
    Identity,
    /// [`super::SubagentTimingUnit`].
    Timing,
}

/// One unit's fold state.
#[derive(Debug, Clone)]
pub(super) enum FoldState {
    /// Any unit's JSON state, moved by its `apply_in_place`.
    Json(Value),
    /// The identity unit's state: `None` is its null sentinel.
    Identity(Option<SubagentIdentity>),
    /// The timing unit's state.
    Timing(TimingState),
}

impl Default for FoldState {
    fn default() -> Self {
        Self::Json(Value::Null)
    }
}

impl FoldState {
    /// The state before any event; `None` when the unit's `init` panicked.
    pub(super) fn init(unit: &dyn ProjectionUnit, native: Option<Native>) -> Option<Self> {
        match native {
            Some(Native::Identity) => Some(Self::Identity(None)),
            Some(Native::Timing) => Some(Self::Timing(TimingState::default())),
            None => catch_unwind(AssertUnwindSafe(|| unit.init()))
                .ok()
                .map(Self::Json),
        }
    }

    /// The state a checkpoint row stores (what [`FoldState::to_json`] wrote), decoded for the
    /// unit the row is of; `None` when it does not decode as that unit's state.
    pub(super) fn from_row(native: Option<Native>, state: &RawValue) -> Option<Self> {
        let state = state.get();
        match native {
            Some(Native::Identity) => serde_json::from_str(state).ok().map(Self::Identity),
            Some(Native::Timing) => serde_json::from_str(state).ok().map(Self::Timing),
            None => serde_json::from_str(state).ok().map(Self::Json),
        }
    }

    /// Moves the state past `events`, contained: `None` when the unit panicked.
    pub(super) fn fold(
        mut self,
        unit: &dyn ProjectionUnit,
        events: impl IntoIterator<Item = impl AsRef<SessionEvent>>,
    ) -> Option<Self> {
        catch_unwind(AssertUnwindSafe(|| {
            for event in events {
                self.apply(unit, event.as_ref());
            }
            self
        }))
        .ok()
    }

    fn apply(&mut self, unit: &dyn ProjectionUnit, event: &SessionEvent) {
        match self {
            Self::Json(state) => {
                unit.apply_in_place(state, event);
            }
            Self::Identity(identity) => {
                if let Some(next) = identity_after(event) {
                    *identity = next;
                }
            }
            Self::Timing(timing) => {
                if let Some(next) = timing.next(event) {
                    *timing = next;
                }
            }
        }
    }

    /// The state as the unit's JSON fold would hold it: what a checkpoint row stores.
    pub(super) fn to_json(&self) -> Value {
        match self {
            Self::Json(state) => state.clone(),
            Self::Identity(identity) => encoded(identity.as_ref()),
            Self::Timing(timing) => encoded(timing),
        }
    }

    /// The unit's view of the state, contained.
    ///
    /// # Errors
    /// When the unit's view panicked or failed.
    pub(super) fn view(&self, unit: &dyn ProjectionUnit) -> Result<Value> {
        match self {
            Self::Json(state) => view_of(unit, state),
            // The identity unit's view is its state.
            Self::Identity(_) => Ok(self.to_json()),
            Self::Timing(timing) => Ok(encoded(timing.view())),
        }
    }
}

/// Writes the state as [`FoldState::to_json`] would have it, without building that value.
impl serde::Serialize for FoldState {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Self::Json(state) => state.serialize(serializer),
            Self::Identity(identity) => identity.serialize(serializer),
            Self::Timing(timing) => timing.serialize(serializer),
        }
    }
}

/// `value` as JSON; the built-in states are plain structs of numbers, strings and options,
/// which always encode.
fn encoded(value: impl serde::Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::{SubagentIdentityUnit, SubagentTimingUnit};
    use crate::seam::SubagentDescriptor;
    use crate::session::{EventKind, TurnEndReason};
    use proptest::prelude::*;
    use serde_json::json;

    /// An event of one of the kinds the built-in units tell apart.
    fn event(kind: u8, seq: u64, time: u64) -> SessionEvent {
        let kind = match kind % 7 {
            0 => EventKind::TurnStart { turn: 1 },
            1 => EventKind::TurnEnd {
                turn: 1,
                reason: TurnEndReason::Completed,
                traceparent: None,
            },
            2 => SubagentDescriptor::continuable("spawn", format!("task {seq}")).event(),
            3 => SubagentDescriptor::one_shot("fork", None).event(),
            // Malformed, and of another version: the identity's null sentinel.
            4 => EventKind::Extension {
                event_type: crate::seam::descriptor::DESCRIPTOR_EVENT.into(),
                data: json!({"version": 2, "mode": "continuable"}),
            },
            5 => EventKind::Extension {
                event_type: crate::seam::descriptor::DESCRIPTOR_EVENT.into(),
                data: json!({"version": 99}),
            },
            _ => EventKind::Extension {
                event_type: "test/unrelated".into(),
                data: json!({}),
            },
        };
        let mut event = SessionEvent::new(seq, kind);
        event.time = time;
        event
    }

    /// Folds `events` on the unit's JSON and decoded; after every event both must hold the
    /// same JSON, write it, and render the same view.
    fn folds_alike(
        unit: &dyn ProjectionUnit,
        native: Native,
        events: &[SessionEvent],
    ) -> std::result::Result<(), TestCaseError> {
        let mut json = FoldState::init(unit, None).expect("init");
        let mut decoded = FoldState::init(unit, Some(native)).expect("init");
        prop_assert_eq!(decoded.to_json(), json.to_json(), "before any event");
        for event in events {
            json = json.fold(unit, [event]).expect("the JSON fold");
            decoded = decoded.fold(unit, [event]).expect("the decoded fold");
            prop_assert_eq!(decoded.to_json(), json.to_json(), "after {:?}", event);
            // A checkpoint record is written from the state itself.
            prop_assert_eq!(
                serde_json::to_value(&decoded).expect("encodes"),
                decoded.to_json(),
                "written after {:?}",
                event
            );
            prop_assert_eq!(
                decoded.view(unit).expect("view"),
                json.view(unit).expect("view"),
                "the view after {:?}",
                event
            );
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// The decoded fold of each built-in unit writes the JSON its own fold reaches.
        #[test]
        fn the_built_in_units_fold_decoded_to_the_json_they_fold_to(
            events in proptest::collection::vec((0..7u8, 0..50u64), 0..24),
        ) {
            let events: Vec<SessionEvent> = events
                .into_iter()
                .enumerate()
                .map(|(seq, (kind, time))| event(kind, seq as u64, time))
                .collect();
            folds_alike(&SubagentTimingUnit, Native::Timing, &events)?;
            folds_alike(&SubagentIdentityUnit, Native::Identity, &events)?;
        }

        /// A fold started from the row a checkpoint wrote after `split` events reaches the
        /// state the fold of every event reaches, for each built-in unit and its JSON twin.
        #[test]
        fn a_fold_resumed_from_a_checkpoint_row_reaches_the_whole_fold(
            events in proptest::collection::vec((0..7u8, 0..50u64), 0..24),
            split in 0..24usize,
        ) {
            let events: Vec<SessionEvent> = events
                .into_iter()
                .enumerate()
                .map(|(seq, (kind, time))| event(kind, seq as u64, time))
                .collect();
            let split = split.min(events.len());
            let units: [(&dyn ProjectionUnit, Native); 2] = [
                (&SubagentTimingUnit, Native::Timing),
                (&SubagentIdentityUnit, Native::Identity),
            ];
            for (unit, native) in units {
                for native in [Some(native), None] {
                    let init = || FoldState::init(unit, native).expect("init");
                    let whole = init().fold(unit, &events).expect("the whole fold");
                    let prefix = init().fold(unit, &events[..split]).expect("the prefix");
                    let row = serde_json::value::to_raw_value(&prefix).expect("a row encodes");
                    let resumed = FoldState::from_row(native, &row)
                        .expect("a row decodes")
                        .fold(unit, &events[split..])
                        .expect("the rest");
                    prop_assert_eq!(resumed.to_json(), whole.to_json(), "split at {}", split);
                }
            }
        }
    }
}
