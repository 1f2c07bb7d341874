//! Provides [`interrupted_turn_closers`]: the events crash repair appends to close a turn the
//! process died in.
//!
//! For the open step, every tool call the last assistant message asked for gets a result: a
//! call with a logged `tool/call` gets `TOOL_OUTCOME_UNKNOWN` (it may have run), one without gets
//! `TOOL_NOT_STARTED`. Then `step/end` if a step was open, and `turn/end {interrupted}`.
use crate::content::{ContentBlock, Message};
use crate::ids::CallId;
use crate::session::event::{EventKind, SessionEvent, ToolErrorInfo, TurnEndReason};
use crate::session::invariants::{LogShape, TOOL_NOT_STARTED};

/// The tool-result code for a call that was dispatched but whose outcome was lost.
pub const TOOL_OUTCOME_UNKNOWN: &str = "TOOL_OUTCOME_UNKNOWN";

/// The closers for a log whose last turn is open; empty for a log that ends between turns.
///
/// The events are assumed to satisfy the log invariants (a stored log always does).
pub fn interrupted_turn_closers<E: AsRef<SessionEvent>>(
    events: impl IntoIterator<Item = E>,
) -> Vec<EventKind> {
    interrupted_turn_closers_after(LogShape::default(), events)
}

/// [`interrupted_turn_closers`] for the events that follow a log part whose shape is `shape`
/// (a fork's own events after its seed, say, which ends balanced after its last turn).
pub fn interrupted_turn_closers_after<E: AsRef<SessionEvent>>(
    shape: LogShape,
    events: impl IntoIterator<Item = E>,
) -> Vec<EventKind> {
    let mut shape = shape;
    let mut requested: Vec<(CallId, String)> = Vec::new();
    let mut answered: Vec<CallId> = Vec::new();
    for event in events {
        let event = event.as_ref();
        // A stored log passed these checks on append; an event that fails here is skipped so
        // repair still closes what it can.
        if shape.admit(event).is_err() {
            continue;
        }
        match &event.kind {
            EventKind::StepStart { .. } => {
                requested.clear();
                answered.clear();
            }
            EventKind::AssistantMessage { message, .. } => {
                requested = message
                    .content
                    .iter()
                    .filter_map(|block| match block {
                        ContentBlock::ToolCall { id, name, .. } => Some((id.clone(), name.clone())),
                        _ => None,
                    })
                    .collect();
            }
            EventKind::ToolResult { message, .. } => {
                if let Some(id) = crate::session::invariants::tool_result_call_id(message) {
                    answered.push(id.clone());
                }
            }
            _ => {}
        }
    }
    let Some(turn) = shape.open_turn() else {
        return Vec::new();
    };
    let mut closers = Vec::new();
    if let Some(step) = shape.open_step() {
        let logged: Vec<CallId> = shape.open_calls().cloned().collect();
        for (call_id, name) in requested {
            if answered.contains(&call_id) {
                continue;
            }
            let code = if logged.contains(&call_id) {
                TOOL_OUTCOME_UNKNOWN
            } else {
                TOOL_NOT_STARTED
            };
            closers.push(closing_result(turn, step, call_id, name, code));
        }
        closers.push(EventKind::StepEnd { turn, step });
    }
    closers.push(EventKind::TurnEnd {
        turn,
        reason: TurnEndReason::Interrupted,
        traceparent: None,
    });
    closers
}

fn closing_result(turn: u64, step: u64, call_id: CallId, name: String, code: &str) -> EventKind {
    let text = if code == TOOL_NOT_STARTED {
        "Error: tool call never started before the process stopped"
    } else {
        "Error: tool call outcome unknown: the process stopped while it ran"
    };
    EventKind::ToolResult {
        turn,
        step,
        message: Message::tool_result(call_id, vec![ContentBlock::text(text)], true),
        error: Some(Box::new(ToolErrorInfo {
            name,
            code: code.to_owned(),
        })),
        meta: None,
    }
}
