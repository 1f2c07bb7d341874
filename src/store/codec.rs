//! Provides the byte encoding every persistent backend shares: a header is its JSON, an
//! append is one row holding its events as a JSON array, and a read reassembles the rows below
//! the session's head into one contiguous run of events. A projection cache row is its JSON.

use std::sync::Arc;

use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::session::{SessionEvent, SessionHeader};

/// Encodes a projection cache row.
///
/// # Errors
/// `INVALID_PROJECTION` when the row does not encode.
pub(crate) fn encode_cache_row(
    unit: &str,
    id: SessionId,
    row: &serde_json::Value,
) -> Result<Vec<u8>> {
    serde_json::to_vec(row).map_err(|e| {
        SubagentError::new(
            ErrorCode::InvalidProjection,
            format!("session {id}: the {unit} cache row does not encode: {e}"),
        )
        .with_source(e)
    })
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
        first_start = first_start.or(Some(start.unwrap_or(u64::MAX)));
        let batch: Vec<SessionEvent> = serde_json::from_slice(&bytes).map_err(|e| {
            SubagentError::new(
                ErrorCode::StoreCorrupt,
                format!(
                    "session {id}: the events from {} do not decode: {e}",
                    start.map_or_else(|| "?".to_owned(), |seq| seq.to_string())
                ),
            )
            .with_source(e)
        })?;
        for event in batch {
            let next = *expected.get_or_insert(start.unwrap_or(u64::MAX));
            if event.seq != next {
                return Err(SubagentError::new(
                    ErrorCode::StoreCorrupt,
                    format!("session {id}: seq gap at {next}"),
                ));
            }
            expected = Some(next.checked_add(1).ok_or_else(|| {
                SubagentError::new(
                    ErrorCode::StoreCorrupt,
                    format!("session {id}: a seq past the largest"),
                )
            })?);
            if event.seq >= from_seq && event.seq < next_seq {
                events.push(Arc::new(event));
            }
        }
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
