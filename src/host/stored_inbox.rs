//! A write into the stored inbox of a session that is away, from the last such write's
//! checkpoint instead of its whole log.
//!
//! A message for a session no agent holds (a parent's settled notice, while the parent is away)
//! is journaled into its log as an inbox splice at the end of `next-turn`. The splice names its
//! position, so the writer must know how many messages wait there; and a turn a crash left
//! open must be closed first. Both are facts about the log's end, which a long-lived parent's
//! log reaches only after millions of events.
//!
//! Each write therefore leaves a checkpoint in the store's projection cache: the log's length
//! and the lengths of both inbox lists at that length, with no turn open. A session's log is
//! append-only, so what a checkpoint says about the events below its length stays true; the
//! next write reads only the events after it (the writes since, or the turns of an agent that
//! came back and went away again), folds their splices into the lengths, and appends at the
//! end. Only a first write, a missing or unreadable checkpoint, and a turn left open since fall
//! back to reading the whole log.
//!
//! The checkpoint is an accelerator, like every row of the projection cache: written after the
//! splice it counts is durable and stored fail-soft, read back only for the same session
//! lifecycle (its creation time) and contiguous with the log after it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::content::Message;
use crate::error::{ErrorCode, Result};
use crate::host::inbox::splice_range;
use crate::ids::SessionId;
use crate::session::{EventKind, InboxTarget, SessionEvent, SessionHeader};
use crate::store::{LeaseEpoch, SessionPersistence};

/// The projection cache's unit that keeps a session's stored-inbox checkpoint.
pub(crate) const STORED_INBOX_UNIT: &str = "stored_inbox";

/// A session's inbox at the end of its first `seq` events, with no turn open there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InboxCheckpoint {
    /// The session's creation time: a checkpoint of another lifecycle is no answer.
    created_at: u64,
    /// The log length it describes.
    seq: u64,
    /// How many messages wait in `next-turn` there.
    next_turn: u64,
    /// How many messages wait in `next-step` there.
    next_step: u64,
}

/// A checkpoint brought forward over the events after it.
#[derive(Debug)]
struct Folded {
    at: InboxCheckpoint,
    /// Whether the last turn the events opened is still open (a crash left it so).
    turn_open: bool,
    /// Whether an event was missing or out of place: the checkpoint is not this log's.
    broken: bool,
}

impl Folded {
    fn fold(&mut self, event: &SessionEvent) {
        if event.seq != self.at.seq {
            self.broken = true;
            return;
        }
        self.at.seq += 1;
        match &event.kind {
            EventKind::TurnStart { .. } => self.turn_open = true,
            EventKind::TurnEnd { .. } => self.turn_open = false,
            EventKind::InboxSpliced {
                target,
                start,
                removed_count,
                inserted,
                ..
            } => {
                let len = match target {
                    InboxTarget::NextTurn => &mut self.at.next_turn,
                    InboxTarget::NextStep => &mut self.at.next_step,
                };
                let held = usize::try_from(*len).unwrap_or(usize::MAX);
                let (start, end) = splice_range(*start, *removed_count, held);
                // A checkpoint read back from the store is not trusted to be sane: saturate.
                let kept = (held - (end - start)).saturating_add(inserted.len());
                *len = u64::try_from(kept).unwrap_or(u64::MAX);
            }
            _ => {}
        }
    }
}

impl InboxCheckpoint {
    /// The checkpoint of a log of `seq` events of `header`'s session whose inbox lists hold
    /// `next_turn` and `next_step` messages, no turn open.
    pub(crate) fn new(
        header: &SessionHeader,
        seq: u64,
        next_turn: usize,
        next_step: usize,
    ) -> Self {
        Self {
            created_at: header.created_at,
            seq,
            next_turn: u64::try_from(next_turn).unwrap_or(u64::MAX),
            next_step: u64::try_from(next_step).unwrap_or(u64::MAX),
        }
    }

    /// Stores it under `lease`. Fail-soft: a checkpoint that is not written only costs the
    /// next write a whole read.
    pub(crate) async fn store(
        self,
        store: &dyn SessionPersistence,
        id: SessionId,
        lease: LeaseEpoch,
    ) {
        let Ok(row) = serde_json::to_value(self) else {
            return;
        };
        if let Err(error) = store
            .cache_put(STORED_INBOX_UNIT, id, row, Some(lease))
            .await
        {
            tracing::debug!(session_id = %id, %error, "the stored inbox's checkpoint was not written");
        }
    }

    /// The session's checkpoint, if one of this lifecycle is stored and reads back.
    async fn load(store: &dyn SessionPersistence, header: &SessionHeader) -> Option<Self> {
        let row = store.cache_get(STORED_INBOX_UNIT, header.id).await.ok()??;
        let checkpoint: Self = serde_json::from_value(row).ok()?;
        (checkpoint.created_at == header.created_at).then_some(checkpoint)
    }
}

/// Journals `message` at the end of the `next-turn` list of session `header`'s stored inbox
/// under `lease`, reading only the events after the session's checkpoint, and makes it
/// durable. Answers `false`, having written nothing, when there is no usable checkpoint (none,
/// another lifecycle's, or one past the log's end) or a turn is open at the log's end: the
/// caller then reads the whole log.
///
/// The message must not be in the log already: nothing here looks for it.
///
/// # Errors
/// The store's (a lost lease: `LEASE_LOST`).
pub(crate) async fn append_after_checkpoint(
    store: &dyn SessionPersistence,
    header: &SessionHeader,
    message: &Message,
    lease: LeaseEpoch,
) -> Result<bool> {
    let Some(at) = InboxCheckpoint::load(store, header).await else {
        return Ok(false);
    };
    let id = header.id;
    let mut folded = Folded {
        at,
        turn_open: false,
        broken: false,
    };
    crate::store::read_chunked(store, id, (at.seq, at.seq), u64::MAX, |chunk| {
        chunk.iter().for_each(|event| folded.fold(event));
        Ok(!folded.broken)
    })
    .await?;
    if folded.broken || folded.turn_open {
        return Ok(false);
    }
    let at = folded.at;
    let splice = EventKind::InboxSpliced {
        target: InboxTarget::NextTurn,
        start: at.next_turn,
        removed_count: None,
        inserted: vec![message.clone()],
        outcome: None,
    };
    match store
        .append(
            id,
            at.seq,
            vec![Arc::new(SessionEvent::new(at.seq, splice))],
            Some(lease),
        )
        .await
    {
        Ok(()) => {}
        // The log does not end where the checkpoint said (a store that lost what followed
        // it): nothing was written, and the whole log says where it ends.
        Err(error) if error.code() == ErrorCode::StoreConflict => return Ok(false),
        Err(error) => return Err(error),
    }
    // Durable before it is answered: its sender sends it no more.
    store.flush(id).await?;
    InboxCheckpoint {
        seq: at.seq + 1,
        next_turn: at.next_turn.saturating_add(1),
        ..at
    }
    .store(store, id, lease)
    .await;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::Inbox;
    use crate::session::SpliceOutcome;
    use proptest::prelude::*;

    fn splice(
        seq: u64,
        target: InboxTarget,
        start: u64,
        removed: Option<u64>,
        inserted: usize,
    ) -> SessionEvent {
        SessionEvent::new(
            seq,
            EventKind::InboxSpliced {
                target,
                start,
                removed_count: removed,
                inserted: (0..inserted)
                    .map(|_| {
                        Message::user(
                            vec![crate::content::ContentBlock::text(format!("m{seq}"))],
                            crate::content::MessageSource::User,
                        )
                    })
                    .collect(),
                outcome: removed.map(|_| SpliceOutcome::Canceled),
            },
        )
    }

    proptest! {
        // The lengths a checkpoint folds are the lengths of the lists the journal replays,
        // whatever the splices (positions and removals past the lists' ends included).
        #[test]
        fn folded_lengths_are_the_replayed_lists(
            splices in proptest::collection::vec(
                (any::<bool>(), 0_u64..6, proptest::option::of(0_u64..4), 0_usize..3),
                0..40,
            )
        ) {
            let events: Vec<SessionEvent> = splices
                .iter()
                .zip(0..)
                .map(|(&(step, start, removed, inserted), seq)| {
                    let target = if step { InboxTarget::NextStep } else { InboxTarget::NextTurn };
                    splice(seq, target, start, removed, inserted)
                })
                .collect();
            let header = SessionHeader::new(SessionId::new());
            let mut folded = Folded {
                at: InboxCheckpoint::new(&header, 0, 0, 0),
                turn_open: false,
                broken: false,
            };
            events.iter().for_each(|event| folded.fold(event));
            let replayed = Inbox::replay(&events);
            prop_assert!(!folded.broken);
            prop_assert_eq!(folded.at.next_turn, replayed.next_turn_len() as u64);
            prop_assert_eq!(folded.at.next_step, replayed.next_step_len() as u64);
            prop_assert_eq!(folded.at.seq, events.len() as u64);
        }
    }

    #[test]
    fn a_gap_or_an_open_turn_is_no_checkpoint_to_write_from() {
        let header = SessionHeader::new(SessionId::new());
        let mut folded = Folded {
            at: InboxCheckpoint::new(&header, 5, 1, 0),
            turn_open: false,
            broken: false,
        };
        folded.fold(&SessionEvent::new(5, EventKind::TurnStart { turn: 3 }));
        assert!(folded.turn_open && !folded.broken);
        folded.fold(&splice(7, InboxTarget::NextTurn, 1, None, 1));
        assert!(folded.broken, "seq 6 is missing");
    }
}
