//! Provides [`LogShape`], the incremental checker of the session log's structural invariants.
//!
//! The invariants (numbered so code that restores them can cite them):
//!
//! 1. At most one turn is open, and `turn/start` carries the previous turn number plus one.
//! 2. `step/*`, `assistant/*` and `tool/*` sit inside the open turn, and inside its open step
//!    where they carry a step number; steps are numbered from 1 within a turn.
//! 3. `turn/end` is refused while a step is open, and `step/end` while a tool call of that step
//!    has no result.
//! 4. Each `tool/result` answers an earlier `tool/call` of the same step with the same call id;
//!    the one exception is a synthetic `TOOL_NOT_STARTED` result written by crash repair.
//! 5. `surfaceOp` is present exactly on `user/message`, `assistant/message` and `tool/result`.
//! 6. `sourceEventSeqs` lists earlier seqs without duplicates.
//! 7. `request/*` events sit inside an open step and `todo/write` inside an open turn; other
//!    plugin events (descriptor, inbox splices, policy) may sit between turns.
//!
//! A log is *balanced* when no turn or step is open and no tool call lacks its result.

use std::collections::BTreeSet;

use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::CallId;
use crate::session::event::{EventKind, SessionEvent};

/// Tracks open turns, steps and tool calls while events are appended.
#[derive(Debug, Clone, Default)]
pub struct LogShape {
    last_turn: u64,
    /// Whether `last_turn` is open (an open turn is always the last one).
    turn_open: bool,
    last_step: u64,
    /// Whether `last_step` is open.
    step_open: bool,
    open_calls: BTreeSet<CallId>,
    answered_calls: BTreeSet<CallId>,
}

/// The synthetic tool-result code crash repair writes for a call that never started.
pub const TOOL_NOT_STARTED: &str = "TOOL_NOT_STARTED";

impl LogShape {
    /// The shape of a log whose last event ends turn `turn`: balanced, as a log is after any
    /// `turn/end` (a step cannot outlive its turn, nor a call its step).
    pub fn after_turn(turn: u64) -> Self {
        Self {
            last_turn: turn,
            ..Self::default()
        }
    }

    /// The last turn number seen (0 before any turn).
    pub fn last_turn(&self) -> u64 {
        self.last_turn
    }

    /// The open turn, if any.
    pub fn open_turn(&self) -> Option<u64> {
        self.turn_open.then_some(self.last_turn)
    }

    /// The open step, if any.
    pub fn open_step(&self) -> Option<u64> {
        self.step_open.then_some(self.last_step)
    }

    /// Tool calls of the open step that have no result yet.
    pub fn open_calls(&self) -> impl Iterator<Item = &CallId> {
        self.open_calls.iter()
    }

    /// Whether no turn or step is open and no call is dangling.
    pub fn is_balanced(&self) -> bool {
        !self.turn_open && !self.step_open && self.open_calls.is_empty()
    }

    /// Checks `event` against invariants 1–6 and, if it passes, records its effect.
    ///
    /// # Errors
    /// `INVALID_EVENT` naming the broken invariant; the tracker is left unchanged.
    pub fn admit(&mut self, event: &SessionEvent) -> Result<()> {
        let fail = |why: &str| {
            Err(SubagentError::new(
                ErrorCode::InvalidEvent,
                format!("event {} ({}): {why}", event.seq, event.kind.type_name()),
            ))
        };
        // Invariant 5.
        if event.kind.is_surface() != event.surface_op.is_some() {
            return fail("surfaceOp must be set exactly on surface events");
        }
        // Invariant 6.
        let mut seen = BTreeSet::new();
        for &source in &event.source_event_seqs {
            if source >= event.seq || !seen.insert(source) {
                return fail("sourceEventSeqs must list distinct earlier seqs");
            }
        }
        match &event.kind {
            EventKind::TurnStart { turn } => {
                if self.turn_open {
                    return fail("a turn is already open");
                }
                if *turn != self.last_turn + 1 {
                    return fail("turn number must follow the previous turn");
                }
                self.turn_open = true;
                self.last_turn = *turn;
                self.last_step = 0;
            }
            EventKind::TurnEnd { turn, .. } => {
                if self.open_turn() != Some(*turn) {
                    return fail("no such open turn");
                }
                if self.step_open {
                    return fail("a step is still open");
                }
                self.turn_open = false;
            }
            EventKind::StepStart { turn, step } => {
                if self.open_turn() != Some(*turn) || self.step_open {
                    return fail("a step starts only inside its open turn, one at a time");
                }
                if *step != self.last_step + 1 {
                    return fail("step number must follow the previous step");
                }
                self.step_open = true;
                self.last_step = *step;
                self.answered_calls.clear();
            }
            EventKind::StepEnd { turn, step } => {
                self.require_step(*turn, *step).or_else(fail)?;
                if !self.open_calls.is_empty() {
                    return fail("a tool call of this step has no result");
                }
                self.step_open = false;
            }
            EventKind::AssistantChunk { turn, step, .. }
            | EventKind::AssistantMessage { turn, step, .. } => {
                self.require_step(*turn, *step).or_else(fail)?;
            }
            EventKind::ToolCall {
                turn,
                step,
                call_id,
                ..
            } => {
                self.require_step(*turn, *step).or_else(fail)?;
                if self.open_calls.contains(call_id) || self.answered_calls.contains(call_id) {
                    return fail("duplicate call id in this step");
                }
                self.open_calls.insert(call_id.clone());
            }
            EventKind::ToolResult {
                turn,
                step,
                message,
                error,
                ..
            } => {
                self.require_step(*turn, *step).or_else(fail)?;
                let Some(call_id) = tool_result_call_id(message) else {
                    return fail("a tool result must carry exactly one tool-result block");
                };
                if !self.open_calls.remove(call_id) {
                    let synthetic = error.as_ref().is_some_and(|e| e.code == TOOL_NOT_STARTED);
                    if !synthetic || self.answered_calls.contains(call_id) {
                        return fail("tool result without a matching tool call");
                    }
                }
                self.answered_calls.insert(call_id.clone());
            }
            EventKind::Extension { event_type, .. } => match &**event_type {
                "request/header" | "request/context" if !self.step_open => {
                    return fail("request events sit inside an open step");
                }
                "todo/write" if !self.turn_open => {
                    return fail("todo/write sits inside an open turn");
                }
                _ => {}
            },
            EventKind::UserMessage(_) | EventKind::InboxSpliced { .. } | EventKind::EndSeed {} => {}
        }
        Ok(())
    }

    fn require_step(&self, turn: u64, step: u64) -> std::result::Result<(), &'static str> {
        if self.open_turn() != Some(turn) || self.open_step() != Some(step) {
            return Err("must sit inside its open turn and step");
        }
        Ok(())
    }
}

/// The call id of a tool-result message (its single tool-result block).
pub fn tool_result_call_id(message: &crate::content::Message) -> Option<&CallId> {
    match message.content.as_slice() {
        [crate::content::ContentBlock::ToolResult { tool_call_id, .. }] => Some(tool_call_id),
        _ => None,
    }
}
