//! Provides [`EventList`]: a session's events, seq 0 first, as a persistent vector.
//!
//! # Why persistent
//! A fork child inherits its parent's completed turns. With the events in a `Vec`, the child
//! had to hold a pointer per inherited event (and drop them all again), so a fork cost its
//! parent's transcript: a root that forks thousands of children, each after another settled
//! sibling grew its transcript, cost the square of its children. In a persistent vector (an
//! RRB tree of 64-event chunks) the child's list is the parent's, cut at the prefix: it shares
//! every whole chunk and copies only the path to the cut, O(log n) whatever the parent's
//! length, and the child's own events go into chunks of its own.
use std::sync::Arc;

use crate::session::event::SessionEvent;

/// A session's events, seq 0 first. Cloning and [`EventList::prefix`] are O(log n) and share
/// the events (and the chunks that hold them) instead of copying them.
#[derive(Clone, Default, PartialEq)]
pub struct EventList(imbl::Vector<Arc<SessionEvent>>);

impl EventList {
    /// The number of events.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the list holds no events.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
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
    pub fn iter(
        &self,
    ) -> impl DoubleEndedIterator<Item = &Arc<SessionEvent>> + ExactSizeIterator + '_ {
        self.0.iter()
    }

    /// The events from `index` on, in order (none when `index` is past the end).
    pub fn iter_from(
        &self,
        index: usize,
    ) -> impl DoubleEndedIterator<Item = &Arc<SessionEvent>> + ExactSizeIterator + '_ {
        self.iter_range(index, self.len())
    }

    /// The events in `[start, end)`, clamped to the list, in order.
    pub fn iter_range(
        &self,
        start: usize,
        end: usize,
    ) -> impl DoubleEndedIterator<Item = &Arc<SessionEvent>> + ExactSizeIterator + '_ {
        let end = end.min(self.len());
        let start = start.min(end);
        self.0.focus().narrow(start..end).into_iter()
    }

    /// The first `len` events (all of them, when there are fewer), sharing them with this list.
    pub fn prefix(&self, len: usize) -> Self {
        if len >= self.len() {
            return self.clone();
        }
        Self(self.0.take(len))
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
        self.0.push_back(event);
    }
}

impl std::fmt::Debug for EventList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl From<Vec<Arc<SessionEvent>>> for EventList {
    fn from(events: Vec<Arc<SessionEvent>>) -> Self {
        events.into_iter().collect()
    }
}

impl FromIterator<Arc<SessionEvent>> for EventList {
    fn from_iter<I: IntoIterator<Item = Arc<SessionEvent>>>(events: I) -> Self {
        Self(events.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a EventList {
    type Item = &'a Arc<SessionEvent>;
    type IntoIter = imbl::vector::Iter<'a, Arc<SessionEvent>, imbl::shared_ptr::DefaultSharedPtr>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
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
