//! Provides [`Inbox`]: an agent's two pending lists, changed only through journaled splices.
//!
//! `next-turn` is a FIFO of prompts, one per turn; `next-step` holds steering and injected
//! context, drained whole at the next step boundary. Every change appends an
//! `agent/inbox/spliced` event **first** and only then changes the live list, so replaying the
//! splices of a log rebuilds the pending work exactly (even after a crash).
use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};

use crate::content::Message;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::{FastHashSet, MessageId};
use crate::session::{EventKind, InboxTarget, SessionEvent, SessionLog, SpliceOutcome};

/// Whether `events` insert a message with this `id` into an inbox (pending now or not).
pub fn inserts<E: AsRef<SessionEvent>>(events: impl IntoIterator<Item = E>, id: MessageId) -> bool {
    events.into_iter().any(|event| {
        matches!(&event.as_ref().kind, EventKind::InboxSpliced { inserted, .. }
            if inserted.iter().any(|message| message.id == id))
    })
}

/// The range of a list of `len` messages that a splice at `start` removing `removed` covers,
/// clamped to the list as every reader of the journal clamps it.
pub(crate) fn splice_range(start: u64, removed: Option<u64>, len: usize) -> (usize, usize) {
    let start = usize::try_from(start).unwrap_or(usize::MAX).min(len);
    let removed = usize::try_from(removed.unwrap_or(0)).unwrap_or(usize::MAX);
    (start, start.saturating_add(removed).min(len))
}

/// What became of one inbox message, as its log's inbox journal tells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageFate {
    /// How often a turn claimed it (once, for a message that ran).
    pub claimed: u32,
    /// How often it was discarded (a release's or a cancel's splice, outcome `canceled`).
    pub discarded: u32,
    /// When a turn first claimed it (the splice's time, epoch milliseconds).
    pub claimed_at: Option<u64>,
}

/// The fate of every message `events` inserted into an inbox, replaying the inbox journal: a
/// message still pending was neither claimed nor discarded.
pub fn message_fates<E: Borrow<SessionEvent>>(events: &[E]) -> HashMap<MessageId, MessageFate> {
    let mut lists: [Vec<MessageId>; 2] = [Vec::new(), Vec::new()];
    let mut fates = HashMap::<MessageId, MessageFate>::new();
    for event in events {
        let event = event.borrow();
        let EventKind::InboxSpliced {
            target,
            start,
            removed_count,
            inserted,
            outcome,
        } = &event.kind
        else {
            continue;
        };
        let list = &mut lists[usize::from(*target == InboxTarget::NextStep)];
        let (start, end) = splice_range(*start, *removed_count, list.len());
        for id in list.drain(start..end) {
            let fate = fates.entry(id).or_default();
            if *outcome == Some(SpliceOutcome::Canceled) {
                fate.discarded += 1;
            } else {
                fate.claimed += 1;
                // A turn claims its message as it opens.
                fate.claimed_at.get_or_insert(event.time);
            }
        }
        for (offset, message) in inserted.iter().enumerate() {
            list.insert((start + offset).min(list.len()), message.id);
        }
    }
    fates
}

/// The pending messages of one agent.
#[derive(Debug, Default, Clone)]
pub struct Inbox {
    next_turn: VecDeque<Message>,
    next_step: Vec<Message>,
    /// The ids of every pending message in both lists: a parent collecting many children's
    /// notices must not pay a scan of its whole inbox per insert.
    pending: FastHashSet<MessageId>,
}

fn len_u64(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX)
}

/// [`Inbox::replay`] a part at a time: the splices of an agent's own events, folded in order
/// as they are read (a paging agent's log is loaded a chunk at a time).
#[derive(Debug, Default)]
pub(crate) struct InboxReplay(Inbox);

impl InboxReplay {
    /// Folds in the next own event (every other kind than a splice leaves the lists alone).
    pub(crate) fn fold(&mut self, event: &SessionEvent) {
        let EventKind::InboxSpliced {
            target,
            start,
            removed_count,
            inserted,
            ..
        } = &event.kind
        else {
            return;
        };
        match target {
            InboxTarget::NextTurn => {
                let list = &mut self.0.next_turn;
                let (start, end) = splice_range(*start, *removed_count, list.len());
                list.drain(start..end);
                for (offset, message) in inserted.iter().enumerate() {
                    list.insert((start + offset).min(list.len()), message.clone());
                }
            }
            InboxTarget::NextStep => {
                let list = &mut self.0.next_step;
                let (start, end) = splice_range(*start, *removed_count, list.len());
                list.splice(start..end, inserted.iter().cloned());
            }
        }
    }

    /// The inbox the folded splices leave.
    pub(crate) fn finish(self) -> Inbox {
        let Inbox {
            next_turn,
            next_step,
            ..
        } = self.0;
        Inbox::of_lists(next_turn, next_step)
    }
}

impl Inbox {
    /// Rebuilds the pending lists from the splices in `events` (an agent's own events: from the
    /// seed length on, so a fork prefix's parent splices are ignored).
    ///
    /// The events are kept while the splices are replayed by position, so a message is cloned
    /// only if it is still pending at the end: a long-lived agent's log journals every message
    /// it ever took, and nearly all of them were claimed long ago. ([`InboxReplay`] folds a
    /// part at a time instead, for a log read a chunk at a time.)
    pub fn replay<E: AsRef<SessionEvent>>(events: impl IntoIterator<Item = E>) -> Self {
        // The splice events that inserted something, and each list as (splice, position in
        // what it inserted): `next-step` first, then `next-turn`.
        let mut splices: Vec<E> = Vec::new();
        let mut lists: [Vec<(usize, usize)>; 2] = [Vec::new(), Vec::new()];
        for event in events {
            let EventKind::InboxSpliced {
                target,
                start,
                removed_count,
                inserted,
                ..
            } = &event.as_ref().kind
            else {
                continue;
            };
            let list = &mut lists[usize::from(*target == InboxTarget::NextTurn)];
            let (start, end) = splice_range(*start, *removed_count, list.len());
            let count = inserted.len();
            let splice = splices.len();
            list.splice(start..end, (0..count).map(|position| (splice, position)));
            if count > 0 {
                splices.push(event);
            }
        }
        let pending = |list: &[(usize, usize)]| -> Vec<Message> {
            list.iter()
                .filter_map(|&(splice, position)| match &splices[splice].as_ref().kind {
                    EventKind::InboxSpliced { inserted, .. } => inserted.get(position).cloned(),
                    _ => None,
                })
                .collect()
        };
        let [next_step, next_turn] = &lists;
        Self::of_lists(pending(next_turn).into(), pending(next_step))
    }

    /// The inbox holding these two lists, with their ids as the pending set.
    fn of_lists(next_turn: VecDeque<Message>, next_step: Vec<Message>) -> Self {
        let pending = next_step.iter().chain(&next_turn).map(|m| m.id).collect();
        Self {
            next_turn,
            next_step,
            pending,
        }
    }

    /// Whether message `id` is pending in either list.
    pub fn is_pending(&self, id: &MessageId) -> bool {
        self.pending.contains(id)
    }

    /// Whether a later turn is pending.
    pub fn has_next_turn(&self) -> bool {
        !self.next_turn.is_empty()
    }

    /// How many messages wait in `next-turn`.
    pub fn next_turn_len(&self) -> usize {
        self.next_turn.len()
    }

    /// How many messages wait in `next-step`.
    pub fn next_step_len(&self) -> usize {
        self.next_step.len()
    }

    /// Journals and adds `message` to `target`.
    ///
    /// # Errors
    /// `INVALID_EVENT` when a pending message already has this id (ids are unique across both
    /// lists while pending), or when the journal append fails.
    pub fn insert(
        &mut self,
        log: &SessionLog,
        target: InboxTarget,
        message: Message,
    ) -> Result<()> {
        if self.pending.contains(&message.id) {
            return Err(SubagentError::new(
                ErrorCode::InvalidEvent,
                format!("message {} is already pending", message.id),
            ));
        }
        let start = match target {
            InboxTarget::NextTurn => self.next_turn.len(),
            InboxTarget::NextStep => self.next_step.len(),
        };
        log.append(EventKind::InboxSpliced {
            target,
            start: len_u64(start),
            removed_count: None,
            inserted: vec![message.clone()],
            outcome: None,
        })?;
        self.pending.insert(message.id);
        match target {
            InboxTarget::NextTurn => self.next_turn.push_back(message),
            InboxTarget::NextStep => self.next_step.push(message),
        }
        Ok(())
    }

    /// Journals and removes all of `next-step`, plus the first `next-turn` message when
    /// `target` is `next-turn`. Returns the claimed messages, `next-turn` first.
    ///
    /// # Errors
    /// When a journal append fails; what was not yet journaled stays pending.
    pub fn claim(&mut self, log: &SessionLog, target: InboxTarget) -> Result<Vec<Message>> {
        let mut claimed = Vec::new();
        if target == InboxTarget::NextTurn && !self.next_turn.is_empty() {
            log.append(removal(InboxTarget::NextTurn, 1, None))?;
            claimed.extend(self.next_turn.pop_front());
            self.forget(&claimed);
        }
        if !self.next_step.is_empty() {
            log.append(removal(InboxTarget::NextStep, self.next_step.len(), None))?;
            let from = claimed.len();
            claimed.append(&mut self.next_step);
            self.forget(&claimed[from..]);
        }
        Ok(claimed)
    }

    /// Journals and discards everything pending, `next-step` first. Returns the discarded
    /// messages.
    ///
    /// # Errors
    /// When the journal append fails; what was not yet journaled stays pending.
    pub fn clear(&mut self, log: &SessionLog) -> Result<Vec<Message>> {
        let mut discarded = Vec::new();
        if !self.next_step.is_empty() {
            log.append(removal(
                InboxTarget::NextStep,
                self.next_step.len(),
                Some(SpliceOutcome::Canceled),
            ))?;
            discarded.append(&mut self.next_step);
            self.forget(&discarded);
        }
        if !self.next_turn.is_empty() {
            log.append(removal(
                InboxTarget::NextTurn,
                self.next_turn.len(),
                Some(SpliceOutcome::Canceled),
            ))?;
            let from = discarded.len();
            discarded.extend(self.next_turn.drain(..));
            self.forget(&discarded[from..]);
        }
        Ok(discarded)
    }

    /// Drops journaled removals from the pending ids. An inbox that empties lets go of its
    /// buffers: an idle or held agent keeps none, which is most of a resident child's life.
    fn forget(&mut self, removed: &[Message]) {
        for message in removed {
            self.pending.remove(&message.id);
        }
        if self.pending.is_empty() {
            *self = Self::default();
        }
    }
}

fn removal(target: InboxTarget, count: usize, outcome: Option<SpliceOutcome>) -> EventKind {
    EventKind::InboxSpliced {
        target,
        start: 0,
        removed_count: Some(len_u64(count)),
        inserted: Vec::new(),
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::content::{ContentBlock, MessageSource};
    use proptest::prelude::*;

    /// A splice of `target` at `start` removing `removed` and inserting `inserted` fresh
    /// messages, at `seq`.
    fn splice(
        seq: u64,
        (next_turn, start, removed, inserted, canceled): (bool, u8, Option<u8>, u8, bool),
    ) -> SessionEvent {
        let target = if next_turn {
            InboxTarget::NextTurn
        } else {
            InboxTarget::NextStep
        };
        let inserted = (0..inserted)
            .map(|n| {
                Message::user(
                    vec![ContentBlock::text(format!("{seq}.{n}"))],
                    MessageSource::User,
                )
            })
            .collect();
        SessionEvent::new(
            seq,
            EventKind::InboxSpliced {
                target,
                start: u64::from(start),
                removed_count: removed.map(u64::from),
                inserted,
                outcome: canceled.then_some(SpliceOutcome::Canceled),
            },
        )
    }

    proptest! {
        /// Replaying a whole log, which clones only the messages left pending, leaves the
        /// lists that folding it a splice at a time leaves.
        #[test]
        fn a_whole_replay_leaves_the_lists_a_fold_leaves(
            splices in proptest::collection::vec(
                (any::<bool>(), 0..6u8, proptest::option::of(0..4u8), 0..4u8, any::<bool>()),
                0..40,
            ),
        ) {
            let events: Vec<SessionEvent> = splices
                .into_iter()
                .zip(0..)
                .map(|(splice_of, seq)| splice(seq, splice_of))
                .collect();
            let mut folded = InboxReplay::default();
            events.iter().for_each(|event| folded.fold(event));
            let folded = folded.finish();
            let replayed = Inbox::replay(&events);
            let ids = |list: &mut dyn Iterator<Item = &Message>| list.map(|m| m.id).collect::<Vec<_>>();
            prop_assert_eq!(ids(&mut replayed.next_turn.iter()), ids(&mut folded.next_turn.iter()));
            prop_assert_eq!(ids(&mut replayed.next_step.iter()), ids(&mut folded.next_step.iter()));
            prop_assert_eq!(&replayed.pending, &folded.pending);
            let texts = |inbox: &Inbox| -> Vec<String> {
                inbox.next_step.iter().chain(&inbox.next_turn).map(|m| format!("{:?}", m.content)).collect()
            };
            prop_assert_eq!(texts(&replayed), texts(&folded));
        }
    }
}
