//! Provides [`History`], the model history of a session (its surface messages, oldest first),
//! and the incremental projection a [`crate::SessionLog`] keeps of it.
//!
//! # Why incremental
//! A model step needs the whole history. Rebuilding it from the log at every step costs the
//! log's length, so a long conversation would cost its length squared. The log instead folds
//! each event into the history as it is appended, and a step takes a [`History`] snapshot:
//! O(1) to take. The next append copies the entries only if a snapshot is still held (an
//! adapter or a recording model that keeps requests), and then at most a short history's
//! worth: a long one is a persistent vector, of which an append copies only the path to its
//! end. The turn driver drops its request before it appends, so a conversation costs O(turns).
//!
//! # Why a fork child shares it
//! A fork child's history starts as its parent's history at the end of the parent's last
//! completed turn. The projection remembers where that turn ended, so the child takes the
//! parent's entries cut there (sharing them) instead of folding the inherited events again.
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
use crate::session::shared_seq::{Iter, SharedSeq};
use crate::session::{EventKind, SessionEvent, SurfaceOp};

/// A snapshot of a session's model history, oldest first. Cheap to clone (it shares its
/// entries); a sequence of [`HistoryEntry`], each of which reads as its [`Message`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History(SharedSeq<HistoryEntry>);

impl History {
    /// The history of `events`, folded from scratch.
    pub fn of<E: Borrow<Arc<SessionEvent>>>(events: impl IntoIterator<Item = E>) -> Self {
        let mut projection = Projection::default();
        for event in events {
            projection.push(event.borrow());
        }
        projection.snapshot()
    }

    /// The number of messages.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the history holds no message.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// The entry at `index`, oldest first.
    pub fn get(&self, index: usize) -> Option<&HistoryEntry> {
        self.0.get(index)
    }

    /// The oldest entry.
    pub fn first(&self) -> Option<&HistoryEntry> {
        self.0.get(0)
    }

    /// The newest entry.
    pub fn last(&self) -> Option<&HistoryEntry> {
        self.0.last()
    }

    /// The entries, oldest first.
    pub fn iter(&self) -> Iter<'_, HistoryEntry> {
        self.0.iter_range(0, usize::MAX)
    }

    /// The messages, oldest first.
    pub fn messages(&self) -> impl DoubleEndedIterator<Item = &Message> + ExactSizeIterator {
        self.iter().map(|entry| &**entry)
    }
}

impl std::ops::Index<usize> for History {
    type Output = HistoryEntry;

    /// The entry at `index`.
    ///
    /// # Panics
    /// When `index` is out of range, as a slice does; [`History::get`] does not.
    fn index(&self, index: usize) -> &HistoryEntry {
        match self.0.get(index) {
            Some(entry) => entry,
            None => panic!(
                "history index {index} out of range for a history of {}",
                self.0.len()
            ),
        }
    }
}

impl<'a> IntoIterator for &'a History {
    type Item = &'a HistoryEntry;
    type IntoIter = Iter<'a, HistoryEntry>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl From<Vec<Message>> for History {
    fn from(messages: Vec<Message>) -> Self {
        Self(
            messages
                .into_iter()
                .map(HistoryEntry::from)
                .collect::<Vec<_>>()
                .into(),
        )
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

    /// The seq of the log event that carries the message.
    pub(crate) fn seq(&self) -> u64 {
        self.0.seq
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
    entries: SharedSeq<HistoryEntry>,
    /// How many entries the history had when the last `turn/end` was folded in, while no
    /// `replace` has spliced over them since: the history a fork taken now inherits is those
    /// entries. `None` before the first turn ends, or after such a splice.
    through_last_turn: Option<u32>,
}

impl Projection {
    /// A projection that starts from `history`, the history of a seed that ends a turn.
    pub(crate) fn starting_from(history: History) -> Self {
        Self {
            through_last_turn: u32::try_from(history.len()).ok(),
            entries: history.0,
        }
    }

    /// The projection of `events`, folded from scratch.
    pub(crate) fn of<'a>(events: impl IntoIterator<Item = &'a Arc<SessionEvent>>) -> Self {
        let mut projection = Self::default();
        for event in events {
            projection.push(event);
        }
        projection
    }

    /// Folds one event in: surface events in order, leaving out empty assistant messages; a
    /// `replace` surface op splices over the entries it names.
    pub(crate) fn push(&mut self, event: &Arc<SessionEvent>) {
        if matches!(event.kind, EventKind::TurnEnd { .. }) {
            // A history too long to count this way is folded again by its forks.
            self.through_last_turn = u32::try_from(self.entries.len()).ok();
            return;
        }
        let Some(entry) = HistoryEntry::of(event) else {
            return;
        };
        match event.surface_op {
            Some(SurfaceOp::Replace { start, end }) => {
                let start = usize::try_from(start).unwrap_or(usize::MAX);
                let end = usize::try_from(end).unwrap_or(usize::MAX);
                if self
                    .through_last_turn
                    .is_some_and(|through| start < through as usize)
                {
                    self.through_last_turn = None;
                }
                self.entries.splice(start, end, entry);
            }
            _ => self.entries.push(entry),
        }
    }

    /// The history so far.
    pub(crate) fn snapshot(&self) -> History {
        History(self.entries.clone())
    }

    /// The history as it was when the last turn ended (what a fork inherits), when the
    /// projection still holds it: O(log n), sharing the entries.
    pub(crate) fn through_last_turn(&self) -> Option<History> {
        self.through_last_turn
            .map(|through| History(self.entries.prefix(through as usize)))
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

    fn turn_end(seq: u64, turn: u64) -> Arc<SessionEvent> {
        Arc::new(SessionEvent::new(
            seq,
            EventKind::TurnEnd {
                turn,
                reason: crate::session::TurnEndReason::Completed,
                traceparent: None,
            },
        ))
    }

    fn replacing(seq: u64, text: &str, start: u32, end: u32) -> Arc<SessionEvent> {
        let mut event = SessionEvent::new(
            seq,
            EventKind::UserMessage(Message::user(
                vec![ContentBlock::text(text)],
                MessageSource::User,
            )),
        );
        event.surface_op = Some(SurfaceOp::Replace { start, end });
        Arc::new(event)
    }

    #[test]
    fn the_history_through_the_last_turn_is_the_fold_of_the_events_through_it() {
        let mut projection = Projection::default();
        assert_eq!(projection.through_last_turn(), None, "no turn ended yet");
        let events = [user(0, "a"), user(1, "b"), turn_end(2, 1), user(3, "c")];
        for event in &events {
            projection.push(event);
        }
        let through = projection.through_last_turn().expect("a turn ended");
        assert_eq!(through, History::of(&events[..3]));
        assert_eq!(texts(&through), ["a", "b"]);
        // A splice over entries after the turn's end leaves what a fork inherits alone.
        projection.push(&replacing(4, "c again", 2, 3));
        assert_eq!(projection.through_last_turn(), Some(through));
        assert_eq!(texts(&projection.snapshot()), ["a", "b", "c again"]);
    }

    #[test]
    fn a_splice_over_a_completed_turn_leaves_the_fork_to_fold_again() {
        let mut projection = Projection::default();
        for event in [user(0, "a"), user(1, "b"), turn_end(2, 1)] {
            projection.push(&event);
        }
        projection.push(&replacing(3, "summary", 0, 2));
        assert_eq!(
            projection.through_last_turn(),
            None,
            "the entries the turn ended with are gone: the caller folds the prefix instead"
        );
        projection.push(&turn_end(4, 2));
        assert_eq!(
            texts(&projection.through_last_turn().expect("a later turn ended")),
            ["summary"]
        );
    }

    #[test]
    fn a_projection_started_from_a_seeds_history_continues_it() {
        let seed = [user(0, "a"), turn_end(1, 1)];
        let mut child = Projection::starting_from(History::of(&seed));
        assert_eq!(child.through_last_turn(), Some(History::of(&seed)));
        let own = user(2, "b");
        child.push(&own);
        let mut all = seed.to_vec();
        all.push(own);
        assert_eq!(child.snapshot(), History::of(&all));
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
