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
//! end. Only a first write, a missing or unreadable checkpoint, a turn left open since, and a
//! message a peer node asks again (it may be anywhere in the log) fall back to reading the
//! whole log.
//!
//! A message whose first recipient refused it as it went away may have been taken all the
//! same. It can only be at or after where that recipient's log was stored when the message
//! was posted: a stored log is never cut short. So the write looks for it from there, and
//! stores it only if it is not found.
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

/// What [`append_after_checkpoint`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterCheckpoint {
    /// The message is journaled, durable, and the checkpoint moved past it.
    Written,
    /// The message was already in the log where it could be: nothing was written.
    AlreadyThere,
    /// Nothing was written: there is no usable checkpoint (none, another lifecycle's, or one
    /// past the log's end), or a turn is open at the log's end. The caller reads the whole log.
    NeedsWholeLog,
}

/// Journals `message` at the end of the `next-turn` list of session `header`'s stored inbox
/// under `lease`, reading only the events after the session's checkpoint, and makes it
/// durable.
///
/// `may_be_from` says where the log may hold the message already: `None` when it cannot (it was
/// never handed to the session), `Some(seq)` when it may at `seq` or after (a sender that did
/// not hear its first answer; `seq` is a lower bound on where the session's log ended when the
/// message was first handed to it). The events from there are searched for it as they are
/// read: from the checkpoint on, in the same read; before the checkpoint, in one more read of
/// only those. A message found is not written again.
///
/// # Errors
/// The store's (a lost lease: `LEASE_LOST`).
pub(crate) async fn append_after_checkpoint(
    store: &dyn SessionPersistence,
    header: &SessionHeader,
    message: &Message,
    (lease, may_be_from): (LeaseEpoch, Option<u64>),
) -> Result<AfterCheckpoint> {
    let Some(at) = InboxCheckpoint::load(store, header).await else {
        return Ok(AfterCheckpoint::NeedsWholeLog);
    };
    let id = header.id;
    if let Some(from) = may_be_from.filter(|from| *from < at.seq) {
        // The part of the search the checkpoint already counted.
        let mut found = false;
        let range = (
            from.max(header.first_stored_seq()),
            header.first_stored_seq(),
        );
        crate::store::read_chunked(store, id, range, at.seq, |chunk| {
            found = crate::host::inbox::inserts(&chunk, message.id);
            Ok(!found)
        })
        .await?;
        if found {
            return Ok(AfterCheckpoint::AlreadyThere);
        }
    }
    let mut folded = Folded {
        at,
        turn_open: false,
        broken: false,
    };
    let mut found = false;
    crate::store::read_chunked(store, id, (at.seq, at.seq), u64::MAX, |chunk| {
        chunk.iter().for_each(|event| folded.fold(event));
        found = may_be_from.is_some() && crate::host::inbox::inserts(&chunk, message.id);
        Ok(!folded.broken && !found)
    })
    .await?;
    if found {
        return Ok(AfterCheckpoint::AlreadyThere);
    }
    if folded.broken || folded.turn_open {
        return Ok(AfterCheckpoint::NeedsWholeLog);
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
        Err(error) if error.code() == ErrorCode::StoreConflict => {
            return Ok(AfterCheckpoint::NeedsWholeLog)
        }
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
    Ok(AfterCheckpoint::Written)
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

    /// A stored session of `len` events (inbox splices, one message each), leased, with its
    /// stored-inbox checkpoint at `checkpoint`, in a store that counts the events read back;
    /// with the lease and the messages the events inserted.
    async fn stored_session(
        len: u64,
        checkpoint: u64,
    ) -> (
        crate::store::faults::FaultInjectingStore,
        SessionHeader,
        LeaseEpoch,
        Vec<Message>,
    ) {
        let store =
            crate::store::faults::FaultInjectingStore::new(Arc::new(crate::MemoryStore::new()));
        let header = SessionHeader::new(SessionId::new());
        let events: Vec<Arc<SessionEvent>> = (0..len)
            .map(|seq| Arc::new(splice(seq, InboxTarget::NextTurn, seq, None, 1)))
            .collect();
        let messages = events
            .iter()
            .flat_map(|event| match &event.kind {
                EventKind::InboxSpliced { inserted, .. } => inserted.clone(),
                _ => Vec::new(),
            })
            .collect();
        let lease = store
            .create_leased(header.clone(), events, crate::store::LeaseHolder::new())
            .await
            .unwrap();
        let at = usize::try_from(checkpoint).unwrap();
        InboxCheckpoint::new(&header, checkpoint, at, 0)
            .store(&store, header.id, lease.epoch)
            .await;
        (store, header, lease.epoch, messages)
    }

    fn notice() -> Message {
        Message::user(
            vec![crate::content::ContentBlock::text("settled")],
            crate::content::MessageSource::User,
        )
    }

    // A message its first recipient may have taken as it went is looked for from where that
    // recipient's log was stored, not from the log's start: the write reads the events after
    // that point (here all after the checkpoint), and the message lands once.
    #[actix_rt::test]
    async fn a_message_that_may_repeat_is_looked_for_only_where_it_can_be() {
        let (store, header, lease, _) = stored_session(2_000, 1_990).await;
        let message = notice();
        let written =
            append_after_checkpoint(&store, &header, &message, (lease, Some(1_995))).await;
        assert_eq!(written.unwrap(), AfterCheckpoint::Written);
        assert_eq!(
            store.events_read(header.id),
            10,
            "the events after the checkpoint, not the whole log"
        );
        // Asked again from the same point: found, not written twice.
        let again = append_after_checkpoint(&store, &header, &message, (lease, Some(1_995))).await;
        assert_eq!(again.unwrap(), AfterCheckpoint::AlreadyThere);
        let log = store.read_from(header.id, 0).await.unwrap();
        assert_eq!(log.len(), 2_001);
        assert!(crate::host::inbox::inserts(&log[2_000..], message.id));
    }

    // A point before the checkpoint is searched too, by one more read of only the events
    // between them, and a message found there is not written again; a message that cannot have
    // been handed over before is not looked for.
    #[actix_rt::test]
    async fn a_message_before_the_checkpoint_is_found_by_reading_only_from_its_point() {
        let (store, header, lease, messages) = stored_session(2_000, 1_990).await;
        let taken = messages[1_500].clone();
        let found = append_after_checkpoint(&store, &header, &taken, (lease, Some(1_400))).await;
        assert_eq!(found.unwrap(), AfterCheckpoint::AlreadyThere);
        assert!(
            store.events_read(header.id) <= 600,
            "read from seq 1,400, not from 0: {}",
            store.events_read(header.id)
        );
        let fresh = notice();
        let written = append_after_checkpoint(&store, &header, &fresh, (lease, None)).await;
        assert_eq!(written.unwrap(), AfterCheckpoint::Written);
        assert_eq!(store.read_from(header.id, 0).await.unwrap().len(), 2_001);
    }

    // A settled notice its parent refused as it went away may be in the parent's log already,
    // from where the parent's log was stored when the notice was posted: the stored inbox
    // write reads from there (it read the whole log before), stores the notice once, and a
    // peer's ask from anywhere still reads it all.
    #[actix_rt::test]
    async fn a_refused_notice_is_stored_reading_only_the_log_after_its_point() {
        let (store, header, lease, _) = stored_session(5_000, 4_990).await;
        let id = header.id;
        store.release_lease(id, lease).await.unwrap();
        let store = Arc::new(store);
        let rt = crate::Runtime::builder()
            .shared_store(Arc::clone(&store) as crate::store::SharedStore)
            .build()
            .unwrap();
        let message = notice();
        let read = || store.events_read(id);
        let before = read();
        let stored = rt.agents().enqueue_stored(id, message.clone(), Some(4_995));
        assert_eq!(stored.await.unwrap(), message.id);
        assert_eq!(read() - before, 10, "the events after the checkpoint");
        let before = read();
        let again = rt.agents().enqueue_stored(id, message.clone(), Some(4_995));
        assert_eq!(again.await.unwrap(), message.id);
        assert_eq!(read() - before, 6, "the events from the point on");
        let before = read();
        let anywhere = rt.agents().enqueue_stored(id, message.clone(), Some(0));
        assert_eq!(anywhere.await.unwrap(), message.id);
        assert!(read() - before >= 5_001, "a peer's ask reads the whole log");
        let log = store.read_from(id, 0).await.unwrap();
        let copies = log
            .iter()
            .filter(|event| crate::host::inbox::inserts([*event], message.id))
            .count();
        assert_eq!((log.len(), copies), (5_001, 1), "stored once");
        rt.shutdown().await.unwrap();
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
