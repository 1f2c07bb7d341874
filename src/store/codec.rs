//! Provides the byte encoding every persistent backend shares: a header is its JSON, an
//! append is one row holding its events as a JSON array, and a read reassembles the rows below
//! the session's head into one contiguous run of events. A projection cache row is its JSON.

use std::sync::Arc;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, SeqAccess, Visitor};

use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::session::{SessionEvent, SessionHeader};

/// A store's `cache_put`: the row encoded, then written as
/// [`SessionPersistence::cache_put_encoded`](super::SessionPersistence::cache_put_encoded)
/// writes the rows the runtime encodes itself.
pub(crate) fn put_value_row<'a, S: super::SessionPersistence + ?Sized>(
    store: &'a S,
    unit: &str,
    id: SessionId,
    row: &serde_json::Value,
    lease: Option<super::LeaseEpoch>,
) -> futures::future::BoxFuture<'a, Result<()>> {
    match super::EncodedRow::encode(row) {
        Ok(row) => store.cache_put_encoded(unit, id, row, lease),
        Err(error) => Box::pin(futures::future::ready(Err(SubagentError::new(
            ErrorCode::InvalidProjection,
            format!("session {id}, the {unit} cache row: {}", error.message()),
        )))),
    }
}

/// Decodes a stored projection cache row.
///
/// # Errors
/// `STORE_CORRUPT` when the bytes are not a row.
pub(crate) fn decode_cache_row(
    unit: &str,
    id: SessionId,
    bytes: &[u8],
) -> Result<serde_json::Value> {
    serde_json::from_slice(bytes).map_err(|e| {
        SubagentError::new(
            ErrorCode::StoreCorrupt,
            format!("session {id}: the {unit} cache row does not decode: {e}"),
        )
        .with_source(e)
    })
}

/// Decodes and checks a stored header.
pub(crate) fn decode_header(id: SessionId, bytes: &[u8]) -> Result<SessionHeader> {
    let header: SessionHeader = serde_json::from_slice(bytes).map_err(|e| {
        SubagentError::new(
            ErrorCode::StoreCorrupt,
            format!("session {id}: bad header: {e}"),
        )
        .with_source(e)
    })?;
    if header.id != id {
        return Err(SubagentError::new(
            ErrorCode::StoreCorrupt,
            format!("session {id}: header names session {}", header.id),
        ));
    }
    header.validate().map_err(|e| {
        SubagentError::new(
            ErrorCode::StoreCorrupt,
            format!("session {id}: {}", e.message()),
        )
    })?;
    Ok(header)
}

/// One append's row: its events as a JSON array, or `None` for no events.
pub(crate) fn encode_batch(id: SessionId, events: &[Arc<SessionEvent>]) -> Result<Option<Vec<u8>>> {
    if events.is_empty() {
        return Ok(None);
    }
    let plain: Vec<&SessionEvent> = events.iter().map(AsRef::as_ref).collect();
    serde_json::to_vec(&plain).map(Some).map_err(|e| {
        SubagentError::new(
            ErrorCode::InvalidEvent,
            format!(
                "session {id}: events from {} do not encode: {e}",
                events[0].seq
            ),
        )
    })
}

/// Reassembles `rows` (each an append's first seq, when readable, and its JSON array) into the
/// events from `from_seq` below `next_seq`, checking that they run without a gap. The rows may
/// start past `from_seq` (a session whose seed is stored by reference stores only what follows
/// it): the events then start where the rows do, and the caller resolves the rest.
///
/// # Errors
/// `STORE_CORRUPT` for a row that does not decode, a gap, or fewer events than the head says.
/// Whether a read that found no stored rows asked only for events before the session's stored
/// log, which starts at `first_stored` (a seed stored by reference precedes it): it then holds
/// nothing, rightly. A session with no stored row at all holds nothing below its head either,
/// which [`assemble`] reports.
pub(crate) fn before_the_stored_log(first_stored: Option<u64>, end: u64) -> bool {
    first_stored.is_some_and(|first| first >= end)
}

/// Decodes one stored batch (a JSON array of events, the first at seq `start`): the events in
/// `[from_seq, next_seq)` are built, the others skipped unbuilt (a listing that reads a one-shot
/// child's four creation events from a batch holding its whole log decodes those four), and
/// the batch's length is answered with them.
struct BatchInRange {
    start: u64,
    from_seq: u64,
    next_seq: u64,
}

impl<'de> DeserializeSeed<'de> for BatchInRange {
    type Value = (Vec<SessionEvent>, u64);

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for BatchInRange {
    type Value = (Vec<SessionEvent>, u64);

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a batch of session events")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut batch: A) -> Result<Self::Value, A::Error> {
        let mut events = Vec::new();
        let mut at = self.start;
        loop {
            let more = if (self.from_seq..self.next_seq).contains(&at) {
                batch
                    .next_element::<SessionEvent>()?
                    .map(|event| events.push(event))
            } else {
                batch.next_element::<IgnoredAny>()?.map(|_| ())
            };
            if more.is_none() {
                return Ok((events, at - self.start));
            }
            // A batch keyed near the largest seq is corrupt: its length then saturates and the
            // caller's own seq check reports it.
            at = at.saturating_add(1);
        }
    }
}

pub(crate) fn assemble(
    id: SessionId,
    from_seq: u64,
    next_seq: u64,
    rows: impl Iterator<Item = Result<(Option<u64>, Vec<u8>)>>,
) -> Result<Vec<Arc<SessionEvent>>> {
    let mut events = Vec::new();
    let mut expected = None;
    let mut first_start = None;
    for row in rows {
        let (start, bytes) = row?;
        let start = start.ok_or_else(|| {
            SubagentError::new(
                ErrorCode::StoreCorrupt,
                format!("session {id}: a batch of events is keyed by no seq"),
            )
        })?;
        first_start = first_start.or(Some(start));
        if *expected.get_or_insert(start) != start {
            return Err(SubagentError::new(
                ErrorCode::StoreCorrupt,
                format!("session {id}: seq gap at {}", expected.unwrap_or(start)),
            ));
        }
        let batch = BatchInRange {
            start,
            from_seq,
            next_seq,
        };
        let (in_range, len) = batch
            .deserialize(&mut serde_json::Deserializer::from_slice(&bytes))
            .map_err(|e| {
                SubagentError::new(
                    ErrorCode::StoreCorrupt,
                    format!("session {id}: the events from {start} do not decode: {e}"),
                )
                .with_source(e)
            })?;
        let mut at = start.max(from_seq);
        for event in in_range {
            if event.seq != at {
                return Err(SubagentError::new(
                    ErrorCode::StoreCorrupt,
                    format!("session {id}: seq gap at {at}"),
                ));
            }
            at = at.saturating_add(1);
            events.push(Arc::new(event));
        }
        expected = Some(start.checked_add(len).ok_or_else(|| {
            SubagentError::new(
                ErrorCode::StoreCorrupt,
                format!("session {id}: a seq past the largest"),
            )
        })?);
    }
    let read = u64::try_from(events.len()).unwrap_or(u64::MAX);
    let from_seq = from_seq.max(first_start.unwrap_or(from_seq));
    if read != next_seq.saturating_sub(from_seq) {
        return Err(SubagentError::new(
            ErrorCode::StoreCorrupt,
            format!(
                "session {id}: {read} events stored from {from_seq}, its head says {}",
                next_seq.saturating_sub(from_seq)
            ),
        ));
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::EventKind;

    /// A stored batch of `len` turn starts from seq `start`.
    fn batch(start: u64, len: u64) -> Vec<u8> {
        let events: Vec<SessionEvent> = (start..start + len)
            .map(|seq| SessionEvent::new(seq, EventKind::TurnStart { turn: seq }))
            .collect();
        serde_json::to_vec(&events).expect("events encode")
    }

    #[test]
    fn a_read_builds_only_the_events_in_its_range_and_checks_the_batches_join() {
        let id = SessionId::new();
        let rows = [(Some(0), batch(0, 6)), (Some(6), batch(6, 6))];
        let read = assemble(id, 4, 8, rows.into_iter().map(Ok)).expect("a sound log");
        let seqs: Vec<u64> = read.iter().map(|event| event.seq).collect();
        assert_eq!(seqs, [4, 5, 6, 7]);
        // The second batch must start where the first, skipped in part, ended.
        let rows = [(Some(0), batch(0, 6)), (Some(7), batch(7, 6))];
        let error = assemble(id, 0, 13, rows.into_iter().map(Ok)).expect_err("a gap");
        assert_eq!(error.code(), ErrorCode::StoreCorrupt);
        assert!(error.message().contains("seq gap at 6"), "{error}");
        // An event stored out of place inside the range is reported, not returned.
        let rows = [(Some(0), batch(1, 6))];
        let error = assemble(id, 2, 4, rows.into_iter().map(Ok)).expect_err("misplaced");
        assert!(error.message().contains("seq gap at 2"), "{error}");
    }
}
