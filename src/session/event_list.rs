//! Provides [`EventList`]: a session's events, seq 0 first.
//!
//! A fork child shares its parent's events, cut at the prefix it inherits, instead of copying
//! them: a long log is a persistent vector (an RRB tree of 64-event chunks) whose prefix shares
//! every whole chunk, O(log n) however long the parent's log grows; a short one (most
//! children's) stays a plain vector, cheaper to copy whole than to keep as a tree.
//!
//! # Paged out
//! A long-lived agent that pages its log ([`crate::AgentOptions::resident_events`]) drops the
//! settled events it has written to the store from memory: the list then holds the events from
//! [`EventList::first_resident`] on, and knows where the rest lies in the store (the first
//! events of one stored log: its own, or the parent's a fork child inherited them from). Every
//! index is a seq all the same: [`EventList::len`] counts the paged-out events, and
//! [`EventList::get`] finds none below the first resident one.
use std::sync::Arc;

use crate::ids::{MessageId, SessionId};
use crate::session::event::SessionEvent;
use crate::session::paged_inserts::PagedInserts;
use crate::session::shared_seq::{Iter, SharedSeq};

/// Where a list's paged-out events lie: the first `len` events of `session`'s stored log (seed
/// included, as [`crate::SessionPersistence::read_between`] resolves it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PagedPrefix {
    /// The stored log that holds them.
    pub(crate) session: SessionId,
    /// How many they are: the seq of the first resident event.
    pub(crate) len: usize,
}

/// A list's paged-out part: where it lies, and which messages it inserted into the inbox.
#[derive(Clone)]
struct Paged {
    prefix: PagedPrefix,
    /// Shared by the list's clones (a clone that pages out copies it).
    inserts: Arc<PagedInserts>,
}

impl Paged {
    /// A part whose insertions are not taken in (yet): a fork's inherited prefix, or a list's
    /// first page-out, which takes them in from seq 0 on.
    fn unknown(prefix: PagedPrefix) -> Box<Self> {
        Box::new(Self {
            prefix,
            inserts: Arc::default(),
        })
    }
}

/// Two lists are equal by their events; the insertions are derived from them.
impl PartialEq for Paged {
    fn eq(&self, other: &Self) -> bool {
        self.prefix == other.prefix
    }
}

/// A session's events, seq 0 first. Cloning and [`EventList::prefix`] cost O(log n) pointer
/// copies (at most a short log's length) and share the events instead of copying them.
#[derive(Clone, Default, PartialEq)]
pub struct EventList {
    resident: SharedSeq<Arc<SessionEvent>>,
    /// Boxed: almost no list pages, and every live log and seed holds one.
    paged: Option<Box<Paged>>,
}

impl EventList {
    /// The number of events, paged out or not: the next seq.
    pub fn len(&self) -> usize {
        self.first_resident() + self.resident.len()
    }

    /// Whether the list holds no events.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The seq of the first event held in memory: 0 unless the log pages out its settled
    /// events, which are then read from the store.
    pub fn first_resident(&self) -> usize {
        self.paged.as_ref().map_or(0, |paged| paged.prefix.len)
    }

    /// Where the paged-out events lie in the store, if any are.
    pub(crate) fn paged(&self) -> Option<PagedPrefix> {
        self.paged.as_deref().map(|paged| paged.prefix)
    }

    /// Whether the paged-out events may have inserted message `id` into the inbox: `false`
    /// proves they did not, without reading them back (see [`PagedInserts`]). A list with
    /// nothing paged out has none that did; one whose paged-out part it inherited (a fork's)
    /// may have.
    pub(crate) fn paged_out_may_insert(&self, id: MessageId) -> bool {
        self.paged
            .as_deref()
            .is_some_and(|paged| paged.inserts.may_hold(id, paged.prefix.len))
    }

    /// The event of seq `index`, if the list holds it in memory.
    pub fn get(&self, index: usize) -> Option<&Arc<SessionEvent>> {
        self.resident.get(index.checked_sub(self.first_resident())?)
    }

    /// The last event, if any is held in memory.
    pub fn last(&self) -> Option<&Arc<SessionEvent>> {
        self.resident.last()
    }

    /// The events held in memory, in order: every event, unless a prefix is paged out.
    pub fn iter(&self) -> Iter<'_, Arc<SessionEvent>> {
        self.iter_range(0, usize::MAX)
    }

    /// The events held in memory from seq `index` on, in order (none when `index` is past the
    /// end).
    pub fn iter_from(&self, index: usize) -> Iter<'_, Arc<SessionEvent>> {
        self.iter_range(index, usize::MAX)
    }

    /// The events held in memory with seqs in `[start, end)`, clamped to the list, in order.
    pub fn iter_range(&self, start: usize, end: usize) -> Iter<'_, Arc<SessionEvent>> {
        let first = self.first_resident();
        self.resident
            .iter_range(start.saturating_sub(first), end.saturating_sub(first))
    }

    /// The first `len` events (all of them, when there are fewer), sharing them with this list
    /// (and, for those paged out, their place in the store).
    pub fn prefix(&self, len: usize) -> Self {
        let first = self.first_resident();
        if len <= first {
            return Self {
                resident: SharedSeq::default(),
                paged: self.paged.as_ref().filter(|_| len > 0).map(|paged| {
                    Paged::unknown(PagedPrefix {
                        len,
                        ..paged.prefix
                    })
                }),
            };
        }
        Self {
            resident: self.resident.prefix(len - first),
            // Not sharing the insertions: the log this is cut from copies what it shares
            // whenever it pages out further, and a fork never pages out.
            paged: self
                .paged
                .as_ref()
                .map(|paged| Paged::unknown(paged.prefix)),
        }
    }

    /// A vector of the events held in memory with seqs in `[start, end)` (clamped), sharing
    /// each event.
    pub fn to_vec_range(&self, start: usize, end: usize) -> Vec<Arc<SessionEvent>> {
        self.iter_range(start, end).cloned().collect()
    }

    /// A vector of the events held in memory, sharing each event.
    pub fn to_vec(&self) -> Vec<Arc<SessionEvent>> {
        self.iter().cloned().collect()
    }

    /// Appends `event` at the end.
    pub(crate) fn push(&mut self, event: Arc<SessionEvent>) {
        self.resident.push(event);
    }

    /// Drops the events below seq `below` from memory: they are the first events of
    /// `session`'s stored log. Nothing changes when they are already paged out.
    pub(crate) fn page_out(&mut self, below: usize, session: SessionId) {
        let first = self.first_resident();
        let below = below.min(self.len());
        if below <= first {
            return;
        }
        let prefix = PagedPrefix {
            session,
            len: below,
        };
        let mut paged = self.paged.take().unwrap_or_else(|| Paged::unknown(prefix));
        Arc::make_mut(&mut paged.inserts).record(
            first,
            below,
            self.resident
                .iter_range(0, below - first)
                .map(|event| &**event),
        );
        paged.prefix = prefix;
        self.paged = Some(paged);
        self.resident = self.resident.suffix(below - first);
    }
}

impl std::fmt::Debug for EventList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(paged) = self.paged() {
            write!(f, "[{} paged out of {}] ", paged.len, paged.session)?;
        }
        f.debug_list().entries(self.iter()).finish()
    }
}

impl From<Vec<Arc<SessionEvent>>> for EventList {
    fn from(events: Vec<Arc<SessionEvent>>) -> Self {
        Self {
            resident: events.into(),
            paged: None,
        }
    }
}

impl FromIterator<Arc<SessionEvent>> for EventList {
    fn from_iter<I: IntoIterator<Item = Arc<SessionEvent>>>(events: I) -> Self {
        Self::from(events.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a EventList {
    type Item = &'a Arc<SessionEvent>;
    type IntoIter = Iter<'a, Arc<SessionEvent>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::EventKind;

    fn list(len: u64) -> EventList {
        (0..len)
            .map(|seq| Arc::new(SessionEvent::new(seq, EventKind::EndSeed {})))
            .collect()
    }

    fn seqs<'a>(events: impl Iterator<Item = &'a Arc<SessionEvent>>) -> Vec<u64> {
        events.map(|event| event.seq).collect()
    }

    #[test]
    fn a_prefix_shares_the_events_and_later_pushes_stay_apart() {
        let mut parent = list(1000);
        let mut child = parent.prefix(700);
        assert_eq!(child.len(), 700);
        assert!(Arc::ptr_eq(
            parent.get(699).expect("in the parent"),
            child.get(699).expect("in the child")
        ));
        child.push(Arc::new(SessionEvent::new(700, EventKind::EndSeed {})));
        parent.push(Arc::new(SessionEvent::new(1000, EventKind::EndSeed {})));
        assert_eq!(child.len(), 701);
        assert_eq!(parent.len(), 1001);
        assert_eq!(seqs(child.iter_from(698)), [698, 699, 700]);
        assert_eq!(seqs(parent.iter_range(999, 5000)), [999, 1000]);
        assert_eq!(seqs(parent.iter_range(7, 3)), Vec::<u64>::new());
        assert_eq!(parent.prefix(5000), parent);
    }

    #[test]
    fn a_paged_out_prefix_keeps_every_index_a_seq() {
        let session = SessionId::new();
        let mut log = list(1000);
        log.page_out(600, session);
        assert_eq!(log.len(), 1000, "the paged-out events still count");
        assert_eq!(log.first_resident(), 600);
        assert_eq!(log.get(599), None, "a paged-out event is not in memory");
        assert_eq!(log.get(600).map(|event| event.seq), Some(600));
        assert_eq!(seqs(log.iter()).first(), Some(&600));
        assert_eq!(seqs(log.iter_range(10, 602)), [600, 601]);
        assert_eq!(seqs(log.iter_range(10, 20)), Vec::<u64>::new());
        log.push(Arc::new(SessionEvent::new(1000, EventKind::EndSeed {})));
        assert_eq!(log.len(), 1001);
        log.page_out(500, session);
        assert_eq!(log.first_resident(), 600, "paging out is never undone");

        // A fork's prefix keeps where the paged-out part lies.
        let fork = log.prefix(700);
        assert_eq!((fork.len(), fork.first_resident()), (700, 600));
        assert_eq!(fork.paged(), log.paged());
        let inside = log.prefix(300);
        assert_eq!((inside.len(), inside.first_resident()), (300, 300));
        assert_eq!(inside.iter().count(), 0);
        assert_eq!(inside.paged().map(|paged| paged.session), Some(session));
        assert_eq!(log.prefix(0), EventList::default());
    }

    #[test]
    fn a_paged_out_prefix_proves_which_messages_it_never_inserted() {
        use crate::content::Message;
        let session = SessionId::new();
        let inserted = Message::user(
            vec![crate::content::ContentBlock::text("a notice")],
            crate::content::MessageSource::User,
        );
        let stranger = MessageId::new();
        let mut log: EventList = (0..100)
            .map(|seq| {
                let kind = match seq {
                    10 => EventKind::InboxSpliced {
                        target: crate::session::InboxTarget::NextTurn,
                        start: 0,
                        removed_count: None,
                        inserted: vec![inserted.clone()],
                        outcome: None,
                    },
                    _ => EventKind::EndSeed {},
                };
                Arc::new(SessionEvent::new(seq, kind))
            })
            .collect();
        assert!(
            !log.paged_out_may_insert(inserted.id),
            "nothing is paged out"
        );
        log.page_out(50, session);
        assert!(log.paged_out_may_insert(inserted.id));
        assert!(!log.paged_out_may_insert(stranger));
        log.page_out(80, session);
        assert!(
            log.paged_out_may_insert(inserted.id),
            "still, a page-out later"
        );
        assert!(!log.paged_out_may_insert(stranger));
        let fork = log.prefix(90);
        assert!(
            fork.paged_out_may_insert(stranger),
            "a fork does not know what its inherited part inserted"
        );
    }
}
