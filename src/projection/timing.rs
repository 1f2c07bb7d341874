//! Provides [`SubagentTimingUnit`] (`subagentTiming`): how long a child has spent in its own
//! completed turns, and the turn it is in now.
//!
//! The child's (last) descriptor is the timing origin: it resets the sum, so time a fork
//! replayed from its parent, or turns before the child was delegated, never count. A turn open
//! when the descriptor lands (a one-shot child appends it inside its first turn) stays open from
//! its own start. A turn that ends before it started adds nothing.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ProjectionUnit;
use crate::json::{field, field_mut};
use crate::seam::descriptor::DESCRIPTOR_EVENT;
use crate::session::{EventKind, SessionEvent};

/// The key of the timing unit.
pub const TIMING_UNIT: &str = "subagentTiming";

/// An open turn: from its start to the child's latest event so far (epoch milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveSpan {
    /// When the turn started.
    pub since: u64,
    /// The child's latest event in it.
    pub through: u64,
}

/// The timing view: the settled time of completed own turns, and the open turn if any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubagentTiming {
    /// Milliseconds spent in completed turns since the descriptor.
    pub settled_ms: u64,
    /// The turn open now, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<ActiveSpan>,
}

/// The fold state: the view plus what the fold needs before the descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TimingState {
    descriptor_seen: bool,
    settled_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pending_turn_start: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    active: Option<ActiveSpan>,
}

impl TimingState {
    /// The view of this state.
    pub(super) fn view(&self) -> SubagentTiming {
        SubagentTiming {
            settled_ms: self.settled_ms,
            active: self.active,
        }
    }

    /// The state after `event`, or `None` when `event` leaves it as it is.
    pub(super) fn next(&self, event: &SessionEvent) -> Option<Self> {
        let time = event.time;
        let mut next = *self;
        match &event.kind {
            EventKind::TurnStart { .. } if self.descriptor_seen => {
                next.active = Some(ActiveSpan {
                    since: time,
                    through: time,
                });
            }
            EventKind::TurnStart { .. } => next.pending_turn_start = Some(time),
            EventKind::Extension { event_type, .. } if event_type == DESCRIPTOR_EVENT => {
                let since = self
                    .active
                    .map(|active| active.since)
                    .or(self.pending_turn_start);
                next = Self {
                    descriptor_seen: true,
                    settled_ms: 0,
                    pending_turn_start: None,
                    active: since.map(|since| ActiveSpan {
                        since,
                        through: time,
                    }),
                };
            }
            EventKind::TurnEnd { .. } if !self.descriptor_seen => {
                self.pending_turn_start?;
                next.pending_turn_start = None;
            }
            EventKind::TurnEnd { .. } => {
                let active = self.active?;
                next.active = None;
                next.settled_ms = self
                    .settled_ms
                    .saturating_add(time.saturating_sub(active.since));
            }
            _ => {
                let active = self.active?;
                next.active = Some(ActiveSpan {
                    through: time,
                    ..active
                });
            }
        }
        Some(next)
    }

    /// Whether `fields`, which decode to `self`, are exactly what serializing `self` writes:
    /// having decoded, they are unless they hold more keys than its fields.
    fn is_written_as(&self, fields: &Map<String, Value>) -> bool {
        let keys =
            2 + usize::from(self.pending_turn_start.is_some()) + usize::from(self.active.is_some());
        let span_written = self.active.is_none()
            || field(fields, "active")
                .and_then(Value::as_object)
                .is_some_and(|span| span.len() == 2);
        fields.len() == keys && span_written
    }

    /// Writes into `fields` (which encode `current`) what differs in `self`, as its
    /// serialization would have it: an absent optional field is no key at all.
    fn write_changes(&self, current: &Self, fields: &mut Map<String, Value>) {
        if self.descriptor_seen != current.descriptor_seen {
            set_field(fields, "descriptorSeen", self.descriptor_seen.into());
        }
        if self.settled_ms != current.settled_ms {
            set_field(fields, "settledMs", self.settled_ms.into());
        }
        if self.pending_turn_start != current.pending_turn_start {
            match self.pending_turn_start {
                Some(time) => set_field(fields, "pendingTurnStart", time.into()),
                None => {
                    fields.remove("pendingTurnStart");
                }
            }
        }
        if self.active != current.active {
            match self.active {
                Some(active) => match field_mut(fields, "active").and_then(Value::as_object_mut) {
                    Some(span) => {
                        set_field(span, "since", active.since.into());
                        set_field(span, "through", active.through.into());
                    }
                    None => {
                        let span = Map::from_iter([
                            ("since".to_owned(), Value::from(active.since)),
                            ("through".to_owned(), Value::from(active.through)),
                        ]);
                        fields.insert("active".to_owned(), Value::Object(span));
                    }
                },
                None => {
                    fields.remove("active");
                }
            }
        }
    }
}

/// Sets `key` in `fields` to `value`, allocating the key only when it is new.
fn set_field(fields: &mut Map<String, Value>, key: &str, value: Value) {
    match field_mut(fields, key) {
        Some(slot) => *slot = value,
        None => {
            fields.insert(key.to_owned(), value);
        }
    }
}

/// Whether `event` opens or closes a turn or describes the child: the events that change the
/// timing state beyond an open turn's `through`.
fn is_boundary(event: &SessionEvent) -> bool {
    match &event.kind {
        EventKind::TurnStart { .. } | EventKind::TurnEnd { .. } => true,
        EventKind::Extension { event_type, .. } => event_type == DESCRIPTOR_EVENT,
        _ => false,
    }
}

/// Moves an open turn's `through` to `event`'s time, on the JSON where it is (this runs for
/// every event of a child, so the state is not decoded); whether anything changed.
fn moved_through(state: &mut Value, event: &SessionEvent) -> bool {
    let Some(active) = state
        .as_object_mut()
        .and_then(|fields| field_mut(fields, "active"))
        .and_then(Value::as_object_mut)
    else {
        return false;
    };
    match field_mut(active, "through") {
        Some(through) if through.as_u64() == Some(event.time) => false,
        Some(through) => {
            *through = Value::from(event.time);
            true
        }
        None => {
            active.insert("through".to_owned(), Value::from(event.time));
            true
        }
    }
}

/// The state after a boundary event, decoded and re-encoded; a foreign state is restarted
/// from scratch.
fn at_boundary(state: &Value, event: &SessionEvent) -> Option<Value> {
    // Read from the JSON where it is: a copy of the state per boundary is not needed.
    let current = TimingState::deserialize(state).unwrap_or_default();
    let next = current.next(event)?;
    serde_json::to_value(next).ok()
}

/// Moves `state` past a boundary event where it is, writing only the fields that change: every
/// child's turn start and end pass here, and re-encoding the whole state for each cost more
/// than the rest of the fold. A foreign state is restarted from scratch, as [`at_boundary`]
/// does, and a state that decodes but is not as this unit writes it (a field it does not
/// know, a `null` optional) is written whole, so both end in the same state; whether
/// anything changed.
fn at_boundary_in_place(state: &mut Value, event: &SessionEvent) -> bool {
    let decoded = TimingState::deserialize(&*state).ok();
    let Some(next) = decoded.unwrap_or_default().next(event) else {
        return false;
    };
    match (decoded, state.as_object_mut()) {
        (Some(current), Some(fields)) if current.is_written_as(fields) => {
            next.write_changes(&current, fields);
        }
        _ => *state = serde_json::to_value(next).unwrap_or(Value::Null),
    }
    true
}

/// Folds turn boundaries after the descriptor into [`SubagentTiming`].
#[derive(Debug, Default, Clone, Copy)]
pub struct SubagentTimingUnit;

impl ProjectionUnit for SubagentTimingUnit {
    fn key(&self) -> &str {
        TIMING_UNIT
    }

    fn state_version(&self) -> u32 {
        2
    }

    fn init(&self) -> Value {
        serde_json::to_value(TimingState::default()).unwrap_or(Value::Null)
    }

    fn apply(&self, state: &Value, event: &SessionEvent) -> Option<Value> {
        if !is_boundary(event) {
            let mut next = state.clone();
            return moved_through(&mut next, event).then_some(next);
        }
        at_boundary(state, event)
    }

    fn apply_in_place(&self, state: &mut Value, event: &SessionEvent) -> bool {
        if !is_boundary(event) {
            return moved_through(state, event);
        }
        at_boundary_in_place(state, event)
    }

    fn view(&self, state: &Value) -> crate::Result<Value> {
        let state: TimingState = serde_json::from_value(state.clone()).map_err(|error| {
            crate::SubagentError::new(
                crate::ErrorCode::StoreCorrupt,
                format!("subagentTiming state does not decode: {error}"),
            )
        })?;
        serde_json::to_value(state.view())
            .map_err(|error| crate::SubagentError::bug(format!("timing view: {error}")))
    }
}
