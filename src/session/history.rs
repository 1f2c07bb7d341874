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
//! # Paged out
//! An agent that pages its log ([`crate::AgentOptions::resident_events`]) drops the oldest
//! entries with the events that carry them: the history then knows how many entries came
//! before the ones it holds ([`History::first_resident`]), and the turn driver reads the whole
//! history back from the store before a model call, unless the model says it reads only the
//! newest entries ([`crate::LlmAdapter::history_window`]). A `replace` that splices over
//! entries both paged out and kept leaves the history unknown until it is read back.
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
use crate::session::event_list::EventList;
use crate::session::shared_seq::{Iter, SharedSeq};
use crate::session::{EventKind, SessionEvent, SurfaceOp};

/// A snapshot of a session's model history, oldest first. Cheap to clone (it shares its
/// entries); a sequence of [`HistoryEntry`], each of which reads as its [`Message`].
///
/// A paged-out history ([`History::is_complete`] false) holds only its newest entries; every
/// index still counts from the oldest entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    entries: SharedSeq<HistoryEntry>,
    paged: Paged,
}

/// Which of a history's entries are not held in memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Paged {
    /// None: the history is whole.
    #[default]
    Nothing,
    /// The first this many.
    Prefix(usize),
    /// Not known without reading the log back (a `replace` spliced over paged-out entries
    /// and kept ones); no entry is held.
    Unknown,
}

impl Paged {
    /// How many entries come before the held ones, when that is known.
    fn prefix(self) -> Option<usize> {
        match self {
            Self::Nothing => Some(0),
            Self::Prefix(len) => Some(len),
            Self::Unknown => None,
        }
    }
}

impl History {
    /// The history of `events`, folded from scratch.
    pub fn of<E: Borrow<Arc<SessionEvent>>>(events: impl IntoIterator<Item = E>) -> Self {
        let mut projection = Projection::default();
        for event in events {
            projection.push(event.borrow());
        }
        projection.snapshot()
    }

    /// The number of messages, paged out or not (those held, when the history is unknown).
    pub fn len(&self) -> usize {
        self.paged.prefix().unwrap_or(0) + self.entries.len()
    }

    /// Whether the history has no message.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every entry is held: the history was not paged out (see the module docs).
    pub fn is_complete(&self) -> bool {
        self.paged == Paged::Nothing
    }

    /// The index of the first entry held in memory: 0 for a complete history, `None` for one
    /// that is not known until read back from the store.
    pub fn first_resident(&self) -> Option<usize> {
        self.paged.prefix()
    }

    /// The entry at `index`, oldest first, if it is held.
    pub fn get(&self, index: usize) -> Option<&HistoryEntry> {
        self.entries.get(index.checked_sub(self.paged.prefix()?)?)
    }

    /// The oldest entry, if it is held.
    pub fn first(&self) -> Option<&HistoryEntry> {
        self.get(0)
    }

    /// The newest entry.
    pub fn last(&self) -> Option<&HistoryEntry> {
        self.entries.last()
    }

    /// The entries held, oldest first: all of them for a complete history.
    pub fn iter(&self) -> Iter<'_, HistoryEntry> {
        self.entries.iter_range(0, usize::MAX)
    }

    /// The messages held, oldest first: all of them for a complete history.
    pub fn messages(&self) -> impl DoubleEndedIterator<Item = &Message> + ExactSizeIterator {
        self.iter().map(|entry| &**entry)
    }
}

impl std::ops::Index<usize> for History {
    type Output = HistoryEntry;

    /// The entry at `index`.
    ///
    /// # Panics
    /// When `index` is out of range or paged out, as a slice's index would; [`History::get`]
    /// does not.
    fn index(&self, index: usize) -> &HistoryEntry {
        match self.get(index) {
            Some(entry) => entry,
            None => panic!(
                "history index {index} out of range or paged out for a history of {}",
                self.len()
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
        Self {
            entries: messages
                .into_iter()
                .map(HistoryEntry::from)
                .collect::<Vec<_>>()
                .into(),
            paged: Paged::Nothing,
        }
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

/// An entry count in four bytes, or none (`u32::MAX`): every live log holds a [`Projection`],
/// and two of these keep it two words wide beside its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Count(u32);

impl Count {
    const NONE: Self = Self(u32::MAX);

    /// `count`, or none when it does not fit.
    fn of(count: usize) -> Self {
        u32::try_from(count)
            .ok()
            .filter(|&count| count != u32::MAX)
            .map_or(Self::NONE, Self)
    }

    fn get(self) -> Option<usize> {
        (self != Self::NONE).then_some(self.0 as usize)
    }
}

/// The history a log keeps up to date as it appends.
#[derive(Debug)]
pub(crate) struct Projection {
    entries: SharedSeq<HistoryEntry>,
    /// How many entries came before those held (paged out with their events); none when the
    /// history is unknown (see the module docs), or too long to count this way.
    paged: Count,
    /// How many entries the history had when the last `turn/end` was folded in, while no
    /// `replace` has spliced over them since: the history a fork taken now inherits is those
    /// entries. None before the first turn ends, or after such a splice.
    through_last_turn: Count,
}

impl Default for Projection {
    fn default() -> Self {
        Self {
            entries: SharedSeq::default(),
            paged: Count(0),
            through_last_turn: Count::NONE,
        }
    }
}

impl Projection {
    /// A projection that starts from `history`, the history of a seed that ends a turn.
    pub(crate) fn starting_from(history: History) -> Self {
        let paged = history.paged.prefix().map_or(Count::NONE, Count::of);
        Self {
            through_last_turn: paged
                .get()
                .map_or(Count::NONE, |_| Count::of(history.len())),
            entries: history.entries,
            paged,
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

    /// The projection of a seed's `events`: unknown when some are paged out (the fork of a
    /// paged parent whose history did not come with it), until read back from the store.
    pub(crate) fn of_list(events: &EventList) -> Self {
        if events.first_resident() > 0 {
            return Self {
                paged: Count::NONE,
                ..Self::default()
            };
        }
        Self::of(events)
    }

    /// The history's paging, as a snapshot tells it.
    fn paging(&self) -> Paged {
        match self.paged.get() {
            Some(0) => Paged::Nothing,
            Some(len) => Paged::Prefix(len),
            None => Paged::Unknown,
        }
    }

    /// Drops the oldest entries carried by events below seq `below` (paged out of the log):
    /// those before the first entry carried by a later event.
    pub(crate) fn page_out(&mut self, below: u64) {
        let Some(first) = self.paged.get() else {
            return;
        };
        let dropped = self
            .entries
            .iter_range(0, usize::MAX)
            .take_while(|entry| entry.seq() < below)
            .count();
        if dropped > 0 {
            self.entries = self.entries.suffix(dropped);
            self.paged = Count::of(first + dropped);
        }
    }

    /// Folds one event in: surface events in order, leaving out empty assistant messages; a
    /// `replace` surface op splices over the entries it names.
    pub(crate) fn push(&mut self, event: &Arc<SessionEvent>) {
        // An unknown history stays so until the log installs the one read back.
        let Some(first) = self.paged.get() else {
            return;
        };
        if matches!(event.kind, EventKind::TurnEnd { .. }) {
            // A history too long to count this way is folded again by its forks.
            self.through_last_turn = Count::of(first + self.entries.len());
            return;
        }
        let Some(entry) = HistoryEntry::of(event) else {
            return;
        };
        match event.surface_op {
            Some(SurfaceOp::Replace { start, end }) => {
                let start = usize::try_from(start).unwrap_or(usize::MAX);
                let end = usize::try_from(end).unwrap_or(usize::MAX).max(start);
                if self
                    .through_last_turn
                    .get()
                    .is_some_and(|through| start < through)
                {
                    self.through_last_turn = Count::NONE;
                }
                if start >= first {
                    self.entries.splice(start - first, end - first, entry);
                } else if end >= first {
                    // The paged-out entries before `start` stay the history's first ones.
                    let kept = self.entries.suffix(end - first);
                    self.entries = SharedSeq::from(vec![entry]);
                    for entry in kept.iter_range(0, usize::MAX) {
                        self.entries.push(entry.clone());
                    }
                    self.paged = Count::of(start);
                } else {
                    // Paged-out entries would follow the new one: not known from here.
                    self.entries = SharedSeq::default();
                    self.paged = Count::NONE;
                }
            }
            _ => self.entries.push(entry),
        }
    }

    /// The history so far.
    pub(crate) fn snapshot(&self) -> History {
        History {
            entries: self.entries.clone(),
            paged: self.paging(),
        }
    }

    /// The history as it was when the last turn ended (what a fork inherits), when the
    /// projection still holds it: O(log n), sharing the entries.
    pub(crate) fn through_last_turn(&self) -> Option<History> {
        let first = self.paged.get()?;
        let through = self.through_last_turn.get()?;
        Some(History {
            entries: self.entries.prefix(through.checked_sub(first)?),
            paged: self.paging(),
        })
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
    fn a_paged_out_history_keeps_its_length_and_its_newest_entries() {
        let events: Vec<_> = (0..6).map(|seq| user(seq, &seq.to_string())).collect();
        let mut projection = Projection::of(&events);
        projection.push(&turn_end(6, 1));
        projection.page_out(4);
        let history = projection.snapshot();
        assert_eq!(history.len(), 6, "the paged-out entries still count");
        assert_eq!(history.first_resident(), Some(4));
        assert!(!history.is_complete());
        assert!(history.get(3).is_none());
        assert_eq!(
            history.get(4).map(|entry| entry.text()),
            Some("4".to_owned())
        );
        assert_eq!(texts(&history), ["4", "5"]);
        let through = projection.through_last_turn().expect("a turn ended");
        assert_eq!(
            (through.len(), texts(&through)),
            (6, vec!["4".to_owned(), "5".to_owned()])
        );

        // A splice after the paged-out entries, then one over paged-out and kept entries.
        projection.push(&replacing(7, "five", 5, 6));
        assert_eq!(texts(&projection.snapshot()), ["4", "five"]);
        projection.push(&replacing(8, "summary", 2, 5));
        let history = projection.snapshot();
        assert_eq!((history.len(), history.first_resident()), (4, Some(2)));
        assert_eq!(texts(&history), ["summary", "five"]);
        // One that keeps paged-out entries after the new one leaves the history unknown.
        projection.push(&replacing(9, "lost", 0, 1));
        assert_eq!(projection.snapshot().first_resident(), None, "unknown");
        assert!(projection.through_last_turn().is_none());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        // Paged out anywhere, between any appends and splices, a known history holds the
        // newest entries of the history folded whole, and counts the rest.
        #[test]
        fn a_paged_out_history_is_the_whole_ones_suffix(
            steps in proptest::collection::vec((0..4u8, 0..12u32, 0..12u32), 1..40),
        ) {
            let mut events = Vec::new();
            let mut projection = Projection::default();
            for (seq, (kind, a, b)) in (0u64..).zip(steps) {
                let event = match kind {
                    0 => {
                        let (start, end) = (a.min(b), a.max(b));
                        replacing(seq, &format!("r{seq}"), start, end)
                    }
                    1 => {
                        projection.page_out(u64::from(a).min(seq));
                        continue;
                    }
                    _ => user(seq, &format!("m{seq}")),
                };
                projection.push(&event);
                events.push(event);
            }
            let whole = History::of(&events);
            let paged = projection.snapshot();
            if let Some(first) = paged.first_resident() {
                proptest::prop_assert_eq!(paged.len(), whole.len());
                let newest: Vec<String> = whole.messages().skip(first).map(Message::text).collect();
                proptest::prop_assert_eq!(texts(&paged), newest);
            }
        }
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
