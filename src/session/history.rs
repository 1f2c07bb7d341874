//! Provides [`History`], the model history of a session (its surface messages, oldest first),
//! and the incremental projection a [`crate::SessionLog`] keeps of it.
//!
//! # Why incremental
//! A model step needs the whole history. Rebuilding it from the log at every step costs the
//! log's length, so a long conversation would cost its length squared. The log instead folds
//! each event into the history as it is appended, and a step takes a [`History`] snapshot: a
//! reference-counted pointer, O(1) to take. The next append copies the entry list only if a
//! snapshot is still held (an adapter or a recording model that keeps requests); the turn
//! driver drops its request before it appends, so a conversation costs O(turns) in total.
//!
//! # Why entries share their events
//! A [`HistoryEntry`] points at the log event that carries its message instead of copying the
//! message: the history of a held child then costs a pointer per message, not a second copy of
//! every prompt and runtime-context text (a third of a resident child's memory before).
use std::borrow::Borrow;
use std::ops::Deref;
use std::sync::Arc;

use crate::content::{Message, MessageSource, Role};
use crate::ids::MessageId;
use crate::session::{EventKind, SessionEvent, SurfaceOp};

/// A snapshot of a session's model history, oldest first. Cheap to clone; reads as a slice of
/// [`HistoryEntry`], each of which reads as its [`Message`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History(Arc<Vec<HistoryEntry>>);

impl History {
    /// The history of `events`, folded from scratch.
    pub fn of<E: Borrow<Arc<SessionEvent>>>(events: &[E]) -> Self {
        let mut projection = Projection::default();
        for event in events {
            projection.push(event.borrow());
        }
        projection.snapshot()
    }

    /// The messages, oldest first.
    pub fn messages(&self) -> impl DoubleEndedIterator<Item = &Message> + ExactSizeIterator {
        self.0.iter().map(|entry| &**entry)
    }
}

impl Deref for History {
    type Target = [HistoryEntry];

    fn deref(&self) -> &[HistoryEntry] {
        &self.0
    }
}

impl From<Vec<Message>> for History {
    fn from(messages: Vec<Message>) -> Self {
        Self(Arc::new(
            messages.into_iter().map(HistoryEntry::from).collect(),
        ))
    }
}

/// One message of a [`History`]: shared with the log event that carries it. Reads as the
/// [`Message`].
#[derive(Debug, Clone)]
pub struct HistoryEntry(Arc<SessionEvent>);

/// What an entry reads as if its event carried no message; never reached, since entries are
/// only made from events that carry one.
static NO_MESSAGE: Message = Message {
    id: MessageId::from_uuid(uuid::Uuid::nil()),
    role: Role::User,
    content: Vec::new(),
    source: MessageSource::User,
};

/// The message a surface event puts in the history, if it puts one there.
fn surface_message(event: &SessionEvent) -> Option<&Message> {
    match &event.kind {
        EventKind::UserMessage(message) | EventKind::ToolResult { message, .. } => Some(message),
        // An empty assistant message (a step that produced nothing) is left out.
        EventKind::AssistantMessage { message, .. } if !message.content.is_empty() => Some(message),
        _ => None,
    }
}

impl HistoryEntry {
    /// The entry for `event`, when it is a surface event that carries a message.
    fn of(event: &Arc<SessionEvent>) -> Option<Self> {
        surface_message(event).map(|_| Self(Arc::clone(event)))
    }
}

impl Deref for HistoryEntry {
    type Target = Message;

    fn deref(&self) -> &Message {
        surface_message(&self.0).unwrap_or(&NO_MESSAGE)
    }
}

impl PartialEq for HistoryEntry {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl From<Message> for HistoryEntry {
    /// An entry of its own (not from a log): for building requests by hand.
    fn from(message: Message) -> Self {
        Self(Arc::new(SessionEvent::new(
            0,
            EventKind::UserMessage(message),
        )))
    }
}

/// The history a log keeps up to date as it appends.
#[derive(Debug, Default)]
pub(crate) struct Projection {
    entries: Arc<Vec<HistoryEntry>>,
}

impl Projection {
    /// Folds one event in: surface events in order, leaving out empty assistant messages; a
    /// `replace` surface op splices over the entries it names.
    pub(crate) fn push(&mut self, event: &Arc<SessionEvent>) {
        let Some(entry) = HistoryEntry::of(event) else {
            return;
        };
        let history = Arc::make_mut(&mut self.entries);
        match event.surface_op {
            Some(SurfaceOp::Replace { start, end }) => {
                let start = usize::try_from(start)
                    .unwrap_or(usize::MAX)
                    .min(history.len());
                let end = usize::try_from(end)
                    .unwrap_or(usize::MAX)
                    .clamp(start, history.len());
                history.splice(start..end, [entry]);
            }
            _ => history.push(entry),
        }
    }

    /// The history so far.
    pub(crate) fn snapshot(&self) -> History {
        History(Arc::clone(&self.entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::{ContentBlock, MessageSource};

    fn user(seq: u64, text: &str) -> Arc<SessionEvent> {
        Arc::new(SessionEvent::new(
            seq,
            EventKind::UserMessage(Message::user(
                vec![ContentBlock::text(text)],
                MessageSource::User,
            )),
        ))
    }

    fn texts(history: &History) -> Vec<String> {
        history.messages().map(Message::text).collect()
    }

    #[test]
    fn surface_events_append_and_a_replace_splices() {
        let mut events = vec![user(0, "a"), user(1, "b"), user(2, "c")];
        let mut projection = Projection::default();
        for event in &events {
            projection.push(event);
        }
        let before = projection.snapshot();
        let mut summary = SessionEvent::new(
            3,
            EventKind::UserMessage(Message::user(
                vec![ContentBlock::text("summary of a and b")],
                MessageSource::User,
            )),
        );
        summary.surface_op = Some(SurfaceOp::Replace { start: 0, end: 2 });
        let summary = Arc::new(summary);
        projection.push(&summary);
        events.push(summary);
        projection.push(&Arc::new(SessionEvent::new(4, EventKind::EndSeed {})));
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
        projection.push(&Arc::new(SessionEvent::new(
            1,
            EventKind::AssistantMessage {
                turn: 1,
                step: 1,
                message: Message::assistant(Vec::new(), "p", "m"),
                usage: None,
                interrupted: false,
            },
        )));
        assert_eq!(texts(&projection.snapshot()), ["a"]);
    }
}
