//! Provides [`SharedSeq`]: the sequence under a session's [`crate::EventList`] and its
//! [`crate::History`]: cheap to clone, and cheap to cut a prefix from, however long it grows.
//!
//! # Why two representations
//! A fork child inherits its parent's completed turns: a prefix of the parent's events and of
//! its history. In a plain vector the child had to hold a pointer per inherited item (and drop
//! them all again), so a root that forks thousands of children, each after another settled
//! sibling grew its transcript, cost the square of its children. A persistent vector (an RRB
//! tree of 64-item chunks, `imbl`) cuts a prefix in O(log n), sharing every whole chunk. But its
//! chunks cost a short sequence more than copying it ever would, and most sessions (one-shot
//! children) stay short: so a sequence is a shared plain vector up to [`SHORT`] items, and
//! moves into a tree past that.
use std::sync::Arc;

/// How many items a sequence keeps in a plain vector before it moves them into a tree: a
/// prefix of a short one costs at most this many pointer copies.
pub(crate) const SHORT: usize = 256;

/// A sequence of `T`, oldest first, clone-on-write: clones share the items, and a clone that
/// is changed copies a short vector once, or a tree's path to the change. One pointer wide,
/// and an empty one allocates nothing: every live session holds two, and most also hold an
/// empty seed.
#[derive(Clone)]
pub(crate) struct SharedSeq<T: Clone>(Option<Arc<Repr<T>>>);

/// Four words: the tree is boxed, so a short sequence (the common case) does not pay for it.
#[derive(Clone)]
enum Repr<T: Clone> {
    /// Up to [`SHORT`] items.
    Short(Vec<T>),
    /// More.
    Long(Box<imbl::Vector<T>>),
}

impl<T: Clone> Default for SharedSeq<T> {
    fn default() -> Self {
        Self(None)
    }
}

/// A sequence's items as they are held.
enum View<'a, T: Clone> {
    Short(&'a [T]),
    Long(&'a imbl::Vector<T>),
}

impl<T: Clone> SharedSeq<T> {
    fn view(&self) -> View<'_, T> {
        match self.0.as_deref() {
            None => View::Short(&[]),
            Some(Repr::Short(items)) => View::Short(items),
            Some(Repr::Long(items)) => View::Long(items),
        }
    }

    /// The representation to change in place (copied first when shared).
    fn repr_mut(&mut self) -> &mut Repr<T> {
        Arc::make_mut(
            self.0
                .get_or_insert_with(|| Arc::new(Repr::Short(Vec::new()))),
        )
    }

    pub(crate) fn len(&self) -> usize {
        match self.view() {
            View::Short(items) => items.len(),
            View::Long(items) => items.len(),
        }
    }

    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        match self.view() {
            View::Short(items) => items.get(index),
            View::Long(items) => items.get(index),
        }
    }

    pub(crate) fn last(&self) -> Option<&T> {
        match self.view() {
            View::Short(items) => items.last(),
            View::Long(items) => items.last(),
        }
    }

    /// The items in `[start, end)`, clamped to the sequence, in order.
    pub(crate) fn iter_range(&self, start: usize, end: usize) -> Iter<'_, T> {
        let end = end.min(self.len());
        let start = start.min(end);
        Iter(match self.view() {
            View::Short(items) => IterInner::Short(items[start..end].iter()),
            View::Long(items) => IterInner::Long(items.focus().narrow(start..end).into_iter()),
        })
    }

    /// The first `len` items (all of them, when there are fewer), shared with this sequence.
    pub(crate) fn prefix(&self, len: usize) -> Self {
        if len >= self.len() {
            return self.clone();
        }
        if len == 0 {
            return Self::default();
        }
        Self(Some(Arc::new(match self.view() {
            View::Short(items) => Repr::Short(items[..len].to_vec()),
            View::Long(items) if len <= SHORT => {
                Repr::Short(items.iter().take(len).cloned().collect())
            }
            View::Long(items) => Repr::Long(Box::new(items.take(len))),
        })))
    }

    /// The items from `start` on (none when `start` is past the end), shared with this
    /// sequence: what is left once a prefix is paged out.
    pub(crate) fn suffix(&self, start: usize) -> Self {
        if start == 0 {
            return self.clone();
        }
        let len = self.len();
        if start >= len {
            return Self::default();
        }
        Self(Some(Arc::new(match self.view() {
            View::Short(items) => Repr::Short(items[start..].to_vec()),
            View::Long(items) if len - start <= SHORT => {
                Repr::Short(items.iter().skip(start).cloned().collect())
            }
            View::Long(items) => Repr::Long(Box::new(items.skip(start))),
        })))
    }

    pub(crate) fn push(&mut self, item: T) {
        let repr = self.repr_mut();
        match repr {
            Repr::Short(items) if items.len() < SHORT => items.push(item),
            Repr::Short(items) => {
                let mut long: imbl::Vector<T> = std::mem::take(items).into_iter().collect();
                long.push_back(item);
                *repr = Repr::Long(Box::new(long));
            }
            Repr::Long(items) => items.push_back(item),
        }
    }

    /// Replaces the items in `[start, end)` with `item`: `start` clamped to the sequence, `end`
    /// to `[start, len]` (an empty range inserts at `start`).
    pub(crate) fn splice(&mut self, start: usize, end: usize, item: T) {
        let start = start.min(self.len());
        let end = end.clamp(start, self.len());
        match self.repr_mut() {
            Repr::Short(items) => {
                items.splice(start..end, [item]);
            }
            Repr::Long(items) => {
                let _spliced_over = items.slice(start..end);
                items.insert(start, item);
            }
        }
    }
}

impl<T: Clone> From<Vec<T>> for SharedSeq<T> {
    fn from(items: Vec<T>) -> Self {
        if items.is_empty() {
            return Self::default();
        }
        Self(Some(Arc::new(if items.len() <= SHORT {
            Repr::Short(items)
        } else {
            Repr::Long(Box::new(items.into_iter().collect()))
        })))
    }
}

impl<T: Clone + std::fmt::Debug> std::fmt::Debug for SharedSeq<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.iter_range(0, usize::MAX))
            .finish()
    }
}

impl<T: Clone + PartialEq> PartialEq for SharedSeq<T> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .iter_range(0, usize::MAX)
                .eq(other.iter_range(0, usize::MAX))
    }
}

/// An iterator over a [`SharedSeq`]'s items (or a range of them), in order.
pub struct Iter<'a, T: Clone>(IterInner<'a, T>);

enum IterInner<'a, T: Clone> {
    Short(std::slice::Iter<'a, T>),
    Long(imbl::vector::Iter<'a, T, imbl::shared_ptr::DefaultSharedPtr>),
}

impl<'a, T: Clone> Iterator for Iter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        match &mut self.0 {
            IterInner::Short(items) => items.next(),
            IterInner::Long(items) => items.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.0 {
            IterInner::Short(items) => items.size_hint(),
            IterInner::Long(items) => items.size_hint(),
        }
    }
}

impl<T: Clone> DoubleEndedIterator for Iter<'_, T> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match &mut self.0 {
            IterInner::Short(items) => items.next_back(),
            IterInner::Long(items) => items.next_back(),
        }
    }
}

impl<T: Clone> ExactSizeIterator for Iter<'_, T> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(len: usize) -> SharedSeq<usize> {
        (0..len).collect::<Vec<_>>().into()
    }

    fn items(seq: &SharedSeq<usize>) -> Vec<usize> {
        seq.iter_range(0, usize::MAX).copied().collect()
    }

    #[test]
    fn a_sequence_moves_into_a_tree_past_a_short_one_and_cuts_back_to_one() {
        let mut short = seq(SHORT);
        assert!(matches!(short.0.as_deref(), Some(Repr::Short(_))));
        let snapshot = short.clone();
        short.push(SHORT);
        assert!(
            matches!(short.0.as_deref(), Some(Repr::Long(_))),
            "one more moves it into a tree"
        );
        assert_eq!(
            snapshot.len(),
            SHORT,
            "a clone never changes under later pushes"
        );
        assert_eq!(items(&short), (0..=SHORT).collect::<Vec<_>>());
        assert!(matches!(
            short.prefix(SHORT).0.as_deref(),
            Some(Repr::Short(_))
        ));
        assert_eq!(short.prefix(SHORT), snapshot);
        let long = seq(1000);
        let cut = long.prefix(700);
        assert!(matches!(cut.0.as_deref(), Some(Repr::Long(_))));
        assert_eq!(items(&cut), (0..700).collect::<Vec<_>>());
        assert_eq!(long.prefix(5000), long);
    }

    #[test]
    fn a_suffix_keeps_the_items_after_its_start_in_either_representation() {
        for (len, start) in [(10, 3), (1000, 100), (1000, 900), (300, 0)] {
            let whole = seq(len);
            let rest = whole.suffix(start);
            assert_eq!(items(&rest), (start..len).collect::<Vec<_>>());
            assert_eq!(
                matches!(rest.0.as_deref(), Some(Repr::Long(_))),
                len - start > SHORT,
                "a suffix as short as a short sequence is one"
            );
        }
        assert!(
            seq(10).suffix(10).0.is_none(),
            "an empty suffix allocates nothing"
        );
        assert!(seq(10).suffix(99).0.is_none());
    }

    #[test]
    fn an_empty_sequence_holds_nothing_and_a_short_one_no_tree() {
        let empty = SharedSeq::<usize>::default();
        assert!(empty.0.is_none(), "an empty sequence allocates nothing");
        assert!(SharedSeq::<usize>::from(Vec::new()).0.is_none());
        assert!(seq(5).prefix(0).0.is_none(), "nor does an empty prefix");
        assert_eq!(empty.len(), 0);
        assert_eq!(empty.get(0), None);
        assert_eq!(empty.last(), None);
        assert_eq!(empty.iter_range(0, 9).count(), 0);
        assert_eq!(empty.prefix(3), empty);
        let mut pushed = empty.clone();
        pushed.push(7);
        assert_eq!(items(&pushed), [7]);
        assert!(
            empty.0.is_none(),
            "a clone's push leaves the original empty"
        );
        let mut spliced = SharedSeq::default();
        spliced.splice(4, 9, 1);
        assert_eq!(items(&spliced), [1], "a splice into nothing inserts");
        // The tree is boxed: a short sequence's shared part is a vector and a tag, not a tree.
        assert!(std::mem::size_of::<Repr<Arc<u64>>>() <= 4 * std::mem::size_of::<usize>());
    }

    #[test]
    fn a_splice_replaces_its_range_in_either_representation() {
        for len in [10, 1000] {
            let mut spliced = seq(len);
            spliced.splice(2, 5, 99);
            let mut expected: Vec<usize> = (0..len).collect();
            expected.splice(2..5, [99]);
            assert_eq!(items(&spliced), expected);
            spliced.splice(7, 3, 42);
            expected.insert(7, 42);
            assert_eq!(items(&spliced), expected, "an empty range inserts");
        }
    }

    #[test]
    fn a_range_is_clamped_to_the_sequence() {
        for len in [10, 1000] {
            let seq = seq(len);
            assert_eq!(seq.iter_range(len - 2, usize::MAX).count(), 2);
            assert_eq!(seq.iter_range(7, 3).count(), 0);
            assert_eq!(seq.iter_range(len + 5, len + 9).count(), 0);
            assert_eq!(
                seq.iter_range(0, 3).rev().copied().collect::<Vec<_>>(),
                [2, 1, 0]
            );
        }
    }
}
