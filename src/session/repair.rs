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

/// The shape of a log just after its last `turn/end`, and the seq that follows that event;
/// `None` when no turn ended in `events`. Nothing before it can be open (a step cannot outlive
/// its turn, nor a call its step), so repair looks only at what follows: a balanced log costs a
/// backward scan to its last turn end, not a walk over its whole length.
pub(crate) fn after_last_turn_end<E: AsRef<SessionEvent>>(
    events: impl DoubleEndedIterator<Item = E>,
) -> Option<(LogShape, u64)> {
    events.rev().find_map(|event| match event.as_ref().kind {
        EventKind::TurnEnd { turn, .. } => Some((
            LogShape::after_turn(turn),
            event.as_ref().seq.saturating_add(1),
        )),
        _ => None,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::event::TurnEndReason;

    fn events(kinds: Vec<EventKind>) -> Vec<SessionEvent> {
        kinds
            .into_iter()
            .zip(0..)
            .map(|(kind, seq)| SessionEvent::new(seq, kind))
            .collect()
    }

    fn assistant_calling(turn: u64, call: &str) -> EventKind {
        EventKind::AssistantMessage {
            turn,
            step: 1,
            message: Message::assistant(
                vec![ContentBlock::ToolCall {
                    id: CallId::new(call),
                    name: "a".into(),
                    arguments: "{}".into(),
                }],
                "p",
                "m",
            ),
            usage: None,
            interrupted: false,
        }
    }

    fn settled_turn(turn: u64) -> Vec<EventKind> {
        vec![
            EventKind::TurnStart { turn },
            EventKind::StepStart { turn, step: 1 },
            assistant_calling(turn, "settled"),
            EventKind::StepEnd { turn, step: 1 },
            EventKind::TurnEnd {
                turn,
                reason: TurnEndReason::Completed,
                traceparent: None,
            },
        ]
    }

    #[test]
    fn the_part_after_the_last_turn_end_closes_as_the_whole_log_does() {
        let mut kinds = settled_turn(1);
        kinds.extend(settled_turn(2));
        kinds.extend([
            EventKind::TurnStart { turn: 3 },
            EventKind::StepStart { turn: 3, step: 1 },
            assistant_calling(3, "open"),
        ]);
        let log = events(kinds);
        let (shape, from) = after_last_turn_end(log.iter()).expect("two turns ended");
        assert_eq!(from, 10, "the seq after turn 2's end");
        // A closing result by the call it answers and its code (its message id is fresh each
        // time), the other closers as they are.
        let outline = |closers: Vec<EventKind>| -> Vec<String> {
            closers
                .iter()
                .map(|kind| match kind {
                    EventKind::ToolResult {
                        turn,
                        message,
                        error,
                        ..
                    } => format!(
                        "turn {turn} {:?} {:?}",
                        crate::session::invariants::tool_result_call_id(message),
                        error.as_ref().map(|error| error.code.clone()),
                    ),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        let tail = outline(interrupted_turn_closers_after(shape, &log[10..]));
        assert_eq!(tail, outline(interrupted_turn_closers(&log)));
        assert_eq!(
            tail.len(),
            3,
            "the open call's result, the step end, the turn end"
        );
    }

    #[test]
    fn a_log_whose_last_turn_ended_has_nothing_open_after_it() {
        let log = events(settled_turn(1));
        let (shape, from) = after_last_turn_end(log.iter()).expect("a turn ended");
        assert!(shape.is_balanced());
        assert_eq!(shape.last_turn(), 1);
        assert_eq!(from, 5);
        assert!(after_last_turn_end(log[..4].iter()).is_none());
    }
}
