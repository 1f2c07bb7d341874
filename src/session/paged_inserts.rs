//! Provides [`PagedInserts`]: which messages a log's paged-out events inserted into its inbox,
//! as a Bloom filter that grows with them.
//!
//! # Why
//! A message that may have been accepted before (a peer's settled notice or report, asked
//! again under its id when its first answer was lost) is looked for in the log before it is
//! accepted. Once the log paged out, that look read every paged-out event back from the store,
//! for every such message, while the agent's mailbox waited: a root whose children run on
//! another node has each of their notices asked that way (two nodes sharing 5,000 children
//! under one root grew 3 to 5 times slower than with nothing paged out). The filter answers
//! "never inserted" for almost every first ask without reading anything; only a message it may
//! hold (an actual repeat, or a rare false positive) is read back.
//!
//! # Cost
//! About 3 bytes a paged-out inserted message at a false-positive rate of 1 in 100,000 per
//! stage (up to twice that while the newest stage fills), and a few hash probes a stage for a
//! lookup. Stages double in size, so a filter holding `n` messages has about
//! `log2(n / 4096)` of them.

use fastbloom::BloomFilter;

use crate::ids::MessageId;
use crate::session::event::{EventKind, SessionEvent};

/// How many messages the first stage holds at its rate; each later stage holds twice the one
/// before.
const FIRST_STAGE: usize = 4096;

/// The false-positive rate of each stage.
const STAGE_FALSE_POSITIVES: f64 = 1e-5;

/// The inbox insertions of the events `[0, covered)` of a log, as a growing Bloom filter (see
/// the module docs). A message it does not hold was never inserted by those events.
#[derive(Clone, Default)]
pub(crate) struct PagedInserts {
    /// The seq below which every event's insertions are held.
    covered: usize,
    /// Full stages first; the last one takes new messages until it holds its capacity.
    stages: Vec<BloomFilter>,
    /// How many messages the last stage holds.
    in_last: usize,
}

impl PagedInserts {
    /// Takes in the insertions of `events`, the events of seqs `[from, below)`, when they
    /// continue what is held; events past a gap (a prefix inherited from another log, never
    /// held here) leave the filter where it was: it then answers "may hold" for everything.
    pub(crate) fn record<'a>(
        &mut self,
        from: usize,
        below: usize,
        events: impl IntoIterator<Item = &'a SessionEvent>,
    ) {
        if from != self.covered || below <= from {
            return;
        }
        for event in events {
            if let EventKind::InboxSpliced { inserted, .. } = &event.kind {
                for message in inserted {
                    self.insert(message.id);
                }
            }
        }
        self.covered = below;
    }

    /// Whether the events `[0, len)` may have inserted message `id`: always, when the filter
    /// does not cover them all.
    pub(crate) fn may_hold(&self, id: MessageId, len: usize) -> bool {
        len > self.covered || self.stages.iter().any(|stage| stage.contains(&id))
    }

    fn insert(&mut self, id: MessageId) {
        let full = self
            .stages
            .len()
            .checked_sub(1)
            .is_none_or(|last| self.in_last >= stage_capacity(last));
        if full {
            let next = stage_capacity(self.stages.len());
            self.stages
                .push(BloomFilter::with_false_pos(STAGE_FALSE_POSITIVES).expected_items(next));
            self.in_last = 0;
        }
        if let Some(last) = self.stages.last_mut() {
            last.insert(&id);
            self.in_last += 1;
        }
    }
}

/// How many messages stage `stage` holds at its rate (bounded: no log inserts that many).
fn stage_capacity(stage: usize) -> usize {
    FIRST_STAGE << stage.min(32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::{ContentBlock, Message, MessageSource, Role};
    use crate::session::InboxTarget;

    fn spliced(seq: u64, ids: &[MessageId]) -> SessionEvent {
        SessionEvent::new(
            seq,
            EventKind::InboxSpliced {
                target: InboxTarget::NextTurn,
                start: 0,
                removed_count: None,
                inserted: ids
                    .iter()
                    .map(|id| Message {
                        id: *id,
                        role: Role::User,
                        content: vec![ContentBlock::text("m")],
                        source: MessageSource::User,
                    })
                    .collect(),
                outcome: None,
            },
        )
    }

    #[test]
    fn holds_every_message_the_covered_events_inserted_across_stages() {
        let mut paged = PagedInserts::default();
        let ids: Vec<MessageId> = (0..3 * FIRST_STAGE).map(|_| MessageId::new()).collect();
        let events: Vec<SessionEvent> = ids
            .chunks(7)
            .enumerate()
            .map(|(seq, chunk)| spliced(seq as u64, chunk))
            .collect();
        let (first, rest) = events.split_at(100);
        paged.record(0, 100, first);
        paged.record(100, events.len(), rest);
        assert!(paged.stages.len() >= 2, "the filter grew a stage");
        assert!(ids.iter().all(|id| paged.may_hold(*id, events.len())));
        let strangers = (0..10_000)
            .filter(|_| paged.may_hold(MessageId::new(), events.len()))
            .count();
        assert!(strangers <= 5, "{strangers} false positives in 10,000");
    }

    #[test]
    fn answers_may_hold_for_events_it_does_not_cover() {
        let mut paged = PagedInserts::default();
        let id = MessageId::new();
        // Events past a gap (an inherited prefix) are not taken in.
        paged.record(10, 20, [&spliced(10, &[id])]);
        assert!(paged.may_hold(MessageId::new(), 20));
        paged.record(0, 5, [&spliced(0, &[id])]);
        assert!(paged.may_hold(id, 5));
        assert!(!paged.may_hold(MessageId::new(), 5));
        assert!(paged.may_hold(MessageId::new(), 6), "seq 5 is not covered");
    }
}
