//! Provides [`History`], the model history of a session (its surface messages, oldest first),
//! and the incremental projection a [`crate::SessionLog`] keeps of it.
//!
//! # Why incremental
//! A model step needs the whole history. Rebuilding it from the log at every step costs the
//! log's length, so a long conversation would cost its length squared. The log instead folds
//! each event into the history as it is appended, and a step takes a [`History`] snapshot: a
//! reference-counted pointer, O(1) to take. The next append copies the messages only if a
//! snapshot is still held (an adapter or a recording model that keeps requests); the turn driver
//! drops its request before it appends, so a conversation costs O(turns) in total.
use std::borrow::Borrow;
use std::ops::Deref;
use std::sync::Arc;

use crate::content::Message;
use crate::session::{EventKind, SessionEvent, SurfaceOp};

/// A snapshot of a session's model history, oldest first. Cheap to clone; reads as a slice.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History(Arc<Vec<Message>>);

impl History {
    /// The history of `events`, folded from scratch.
    pub fn of<E: Borrow<SessionEvent>>(events: &[E]) -> Self {
        let mut projection = Projection::default();
        for event in events {
            projection.push(event.borrow());
        }
        projection.snapshot()
    }
}

impl Deref for History {
    type Target = [Message];

    fn deref(&self) -> &[Message] {
        &self.0
    }
}

impl From<Vec<Message>> for History {
    fn from(messages: Vec<Message>) -> Self {
        Self(Arc::new(messages))
    }
}

/// The history a log keeps up to date as it appends.
#[derive(Debug, Default)]
pub(crate) struct Projection {
    messages: Arc<Vec<Message>>,
}

impl Projection {
    /// Folds one event in: surface events in order, leaving out empty assistant messages; a
    /// `replace` surface op splices over the entries it names.
    pub(crate) fn push(&mut self, event: &SessionEvent) {
        let message = match &event.kind {
            EventKind::UserMessage(message) => message,
            EventKind::AssistantMessage { message, .. } if !message.content.is_empty() => message,
            EventKind::ToolResult { message, .. } => message,
            _ => return,
        };
        let history = Arc::make_mut(&mut self.messages);
        match event.surface_op {
            Some(SurfaceOp::Replace { start, end }) => {
                let start = usize::try_from(start)
                    .unwrap_or(usize::MAX)
                    .min(history.len());
                let end = usize::try_from(end)
                    .unwrap_or(usize::MAX)
                    .clamp(start, history.len());
                history.splice(start..end, [message.clone()]);
            }
            _ => history.push(message.clone()),
        }
    }

    /// The history so far.
    pub(crate) fn snapshot(&self) -> History {
        History(Arc::clone(&self.messages))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::{ContentBlock, MessageSource};

    fn user(seq: u64, text: &str) -> SessionEvent {
        SessionEvent::new(
            seq,
            EventKind::UserMessage(Message::user(
                vec![ContentBlock::text(text)],
                MessageSource::User,
            )),
        )
    }

    fn texts(history: &History) -> Vec<String> {
        history.iter().map(Message::text).collect()
    }

    #[test]
    fn surface_events_append_and_a_replace_splices() {
        let mut events = vec![user(0, "a"), user(1, "b"), user(2, "c")];
        let mut projection = Projection::default();
        for event in &events {
            projection.push(event);
        }
        let before = projection.snapshot();
        let mut summary = user(3, "summary of a and b");
        summary.surface_op = Some(SurfaceOp::Replace { start: 0, end: 2 });
        projection.push(&summary);
        events.push(summary);
        projection.push(&SessionEvent::new(4, EventKind::EndSeed {}));
        assert_eq!(texts(&projection.snapshot()), ["summary of a and b", "c"]);
        assert_eq!(
            texts(&before),
            ["a", "b", "c"],
            "a snapshot never changes under later appends"
        );
        assert_eq!(History::of(&events), projection.snapshot());
    }

    #[test]
    fn an_empty_assistant_message_stays_out_of_the_history() {
        let mut projection = Projection::default();
        projection.push(&user(0, "a"));
        projection.push(&SessionEvent::new(
            1,
            EventKind::AssistantMessage {
                turn: 1,
                step: 1,
                message: Message::assistant(Vec::new(), "p", "m"),
                usage: None,
                interrupted: false,
            },
        ));
        assert_eq!(texts(&projection.snapshot()), ["a"]);
    }
}
