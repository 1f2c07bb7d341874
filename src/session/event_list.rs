//! Provides [`EventList`]: a session's events, seq 0 first.
//!
//! A fork child shares its parent's events, cut at the prefix it inherits, instead of copying
//! them: a long log is a persistent vector (an RRB tree of 64-event chunks) whose prefix shares
//! every whole chunk, O(log n) however long the parent's log grows; a short one (most
//! children's) stays a plain vector, cheaper to copy whole than to keep as a tree.
use std::sync::Arc;

use crate::session::event::SessionEvent;
use crate::session::shared_seq::{Iter, SharedSeq};

/// A session's events, seq 0 first. Cloning and [`EventList::prefix`] cost O(log n) pointer
/// copies (at most a short log's length) and share the events instead of copying them.
#[derive(Clone, Default, PartialEq)]
pub struct EventList(SharedSeq<Arc<SessionEvent>>);

impl EventList {
    /// The number of events.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the list holds no events.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The event at `index` (its seq, for a whole log), if there is one.
    pub fn get(&self, index: usize) -> Option<&Arc<SessionEvent>> {
        self.0.get(index)
    }

    /// The last event, if any.
    pub fn last(&self) -> Option<&Arc<SessionEvent>> {
        self.0.last()
    }

    /// The events in order.
    pub fn iter(&self) -> Iter<'_, Arc<SessionEvent>> {
        self.0.iter_range(0, usize::MAX)
    }

    /// The events from `index` on, in order (none when `index` is past the end).
    pub fn iter_from(&self, index: usize) -> Iter<'_, Arc<SessionEvent>> {
        self.0.iter_range(index, usize::MAX)
    }

    /// The events in `[start, end)`, clamped to the list, in order.
    pub fn iter_range(&self, start: usize, end: usize) -> Iter<'_, Arc<SessionEvent>> {
        self.0.iter_range(start, end)
    }

    /// The first `len` events (all of them, when there are fewer), sharing them with this list.
    pub fn prefix(&self, len: usize) -> Self {
        Self(self.0.prefix(len))
    }

    /// A vector of the events in `[start, end)` (clamped), sharing each event.
    pub fn to_vec_range(&self, start: usize, end: usize) -> Vec<Arc<SessionEvent>> {
        self.iter_range(start, end).cloned().collect()
    }

    /// A vector of every event, sharing each event.
    pub fn to_vec(&self) -> Vec<Arc<SessionEvent>> {
        self.iter().cloned().collect()
    }

    /// Appends `event` at the end.
    pub(crate) fn push(&mut self, event: Arc<SessionEvent>) {
        self.0.push(event);
    }
}

impl std::fmt::Debug for EventList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl From<Vec<Arc<SessionEvent>>> for EventList {
    fn from(events: Vec<Arc<SessionEvent>>) -> Self {
        Self(events.into())
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
}
