//! Provides the folds over a run's own events: [`fold_consumed_work`], the stop-reason tables
//! ([`one_shot_stop_reason`], [`continuable_stop_reason`]) and [`final_assistant_output`].

use crate::content::ContentBlock;
use crate::model::StreamChunk;
use crate::session::event::{EventKind, SessionEvent, TurnEndReason};
use crate::stop_reason::StopReason;

/// What a run's events say about the work it consumed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ConsumedWork {
    /// The end reason of the last turn that consumed work: it stepped, or it claimed work and
    /// ended other than `completed`.
    pub end: Option<TurnEndReason>,
    /// Set when accepted work was discarded unrun after that turn (a canceled splice that
    /// inserted nothing).
    pub dropped_unrun: bool,
}

/// Folds events in one pass.
pub fn fold_consumed_work<E: AsRef<SessionEvent>>(
    events: impl IntoIterator<Item = E>,
) -> ConsumedWork {
    let mut work = ConsumedWork::default();
    let mut open_turn = false;
    let mut stepped = false;
    let mut claimed = false;
    for event in events {
        match &event.as_ref().kind {
            EventKind::TurnStart { .. } => {
                open_turn = true;
                stepped = false;
                claimed = false;
            }
            EventKind::StepStart { .. } if open_turn => stepped = true,
            EventKind::InboxSpliced {
                removed_count: Some(removed),
                outcome: None,
                ..
            } if open_turn && *removed > 0 => claimed = true,
            EventKind::InboxSpliced {
                outcome: Some(_),
                inserted,
                ..
            } if inserted.is_empty() => work.dropped_unrun = true,
            EventKind::TurnEnd { reason, .. } => {
                let claimed_and_failed = claimed && *reason != TurnEndReason::Completed;
                if stepped || claimed_and_failed {
                    work.end = Some(reason.clone());
                    work.dropped_unrun = false;
                }
                open_turn = false;
            }
            _ => {}
        }
    }
    work
}

/// The one-shot table: `completed`, `max-tokens`, `aborted` map to themselves, `blocked` to
/// `refusal`, and `error`, `interrupted` or no end to `error`.
pub fn one_shot_stop_reason(end: Option<&TurnEndReason>) -> StopReason {
    match end {
        Some(TurnEndReason::Completed) => StopReason::Completed,
        Some(TurnEndReason::MaxTokens) => StopReason::MaxTokens,
        Some(TurnEndReason::Aborted { .. }) => StopReason::Aborted,
        Some(TurnEndReason::Blocked) => StopReason::Refusal,
        Some(TurnEndReason::BudgetExhausted { .. }) => StopReason::BudgetExhausted,
        Some(TurnEndReason::Error { .. } | TurnEndReason::Interrupted) | None => StopReason::Error,
    }
}

/// The continuable-epoch table: `interrupted` counts as `aborted` here, and a clean end after
/// dropped work is `aborted`.
pub fn continuable_stop_reason(work: &ConsumedWork) -> StopReason {
    match &work.end {
        Some(TurnEndReason::MaxTokens) => StopReason::MaxTokens,
        Some(TurnEndReason::Aborted { .. } | TurnEndReason::Interrupted) => StopReason::Aborted,
        Some(TurnEndReason::Error { .. }) => StopReason::Error,
        Some(TurnEndReason::Blocked) => StopReason::Refusal,
        Some(TurnEndReason::BudgetExhausted { .. }) => StopReason::BudgetExhausted,
        Some(TurnEndReason::Completed) | None if work.dropped_unrun => StopReason::Aborted,
        Some(TurnEndReason::Completed) | None => StopReason::Completed,
    }
}

/// Folds a run's output incrementally: the last non-empty `assistant/message` (textless
/// content such as reasoning counts; empty usage-only messages do not) wins; failing that, the
/// streamed text deltas (and raw text pieces from transports without events) as one text block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AssistantOutputFold {
    candidate: Option<Vec<ContentBlock>>,
    streamed: String,
}

impl AssistantOutputFold {
    /// An empty fold.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one event; reasoning deltas and tool results are ignored.
    pub fn push_event(&mut self, event: &SessionEvent) {
        match &event.kind {
            EventKind::AssistantMessage { message, .. } if !message.content.is_empty() => {
                self.candidate = Some(message.content.clone());
            }
            EventKind::AssistantChunk {
                chunk: StreamChunk::TextDelta { text, .. },
                ..
            } => self.streamed.push_str(text),
            _ => {}
        }
    }

    /// Folds a raw text piece (a transport without session events); empty pieces are ignored.
    pub fn push_text(&mut self, text: &str) {
        self.streamed.push_str(text);
    }

    /// The output so far, or `None` when nothing was folded.
    pub fn collect(&self) -> Option<Vec<ContentBlock>> {
        if let Some(candidate) = &self.candidate {
            return Some(candidate.clone());
        }
        (!self.streamed.is_empty()).then(|| vec![ContentBlock::text(self.streamed.clone())])
    }
}

/// The output of a run: the content of the last non-empty `assistant/message`; failing that, the
/// streamed text deltas as one text block; failing that, nothing.
pub fn final_assistant_output<E: AsRef<SessionEvent>>(
    events: impl IntoIterator<Item = E>,
) -> Vec<ContentBlock> {
    let mut fold = AssistantOutputFold::new();
    for event in events {
        fold.push_event(event.as_ref());
    }
    fold.collect().unwrap_or_default()
}
