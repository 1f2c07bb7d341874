//! Reads of sessions' headers and stored batches, many sessions to a statement (see
//! [`batch`](super::batch)).

use std::sync::Arc;

use deadpool_postgres::Pool;

use super::pool::checkout;
use super::{io, pool_io, seq_column, seq_value, uuid_of};
use crate::error::{Result, SubagentError};
use crate::ids::SessionId;
use crate::session::{SessionEvent, SessionHeader};
use crate::store::codec::{assemble, before_the_stored_log, decode_header};
use crate::store::not_found;

/// One session's part of a batched read: its batches holding events in `[from_seq,
/// before_seq)`, and its header when asked.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadRequest {
    pub(super) id: SessionId,
    pub(super) from_seq: u64,
    pub(super) before_seq: u64,
    pub(super) with_header: bool,
}

impl ReadRequest {
    /// The header alone.
    pub(super) fn header(id: SessionId) -> Self {
        Self {
            id,
            from_seq: 0,
            before_seq: 0,
            with_header: true,
        }
    }

    /// The stored events in `[from_seq, before_seq)`.
    pub(super) fn events(id: SessionId, from_seq: u64, before_seq: u64) -> Self {
        Self {
            id,
            from_seq,
            before_seq,
            with_header: false,
        }
    }

    /// This read with the header too.
    pub(super) fn and_header(self) -> Self {
        Self {
            with_header: true,
            ..self
        }
    }
}

/// What one session's read found: its rows, undecoded.
#[derive(Debug)]
pub(super) struct StoredRows {
    request: ReadRequest,
    header: Option<Vec<u8>>,
    next_seq: i64,
    /// The first seq its stored log holds, if it holds any.
    first_stored: Option<i64>,
    /// The batches in range (first seq, events), in seq order.
    batches: Vec<(Option<i64>, Vec<u8>)>,
}

impl StoredRows {
    /// The header, decoded.
    ///
    /// # Errors
    /// `STORE_CORRUPT` for a header that does not decode.
    pub(super) fn header(&self) -> Result<SessionHeader> {
        let id = self.request.id;
        let bytes = self
            .header
            .as_deref()
            .ok_or_else(|| SubagentError::bug(format!("session {id}: read without its header")))?;
        decode_header(id, bytes)
    }

    /// The stored events in the requested range, as `read_stored` answers them.
    ///
    /// # Errors
    /// `STORE_CORRUPT` for a gap, a lost row below the head, or a batch that does not decode.
    pub(super) fn events(self) -> Result<Vec<Arc<SessionEvent>>> {
        let ReadRequest {
            id,
            from_seq,
            before_seq,
            ..
        } = self.request;
        let next_seq = seq_value(self.next_seq)?.min(before_seq);
        if from_seq >= next_seq {
            return Ok(Vec::new());
        }
        // No batch in range: a range inside a seed stored by reference, or lost rows.
        if self.batches.is_empty()
            && before_the_stored_log(
                self.first_stored.and_then(|seq| u64::try_from(seq).ok()),
                next_seq,
            )
        {
            return Ok(Vec::new());
        }
        let batches = self
            .batches
            .into_iter()
            .map(|(start, bytes)| Ok((start.and_then(|start| u64::try_from(start).ok()), bytes)));
        assemble(id, from_seq, next_seq, batches)
    }
}

/// Answers `requests` with one statement, in their order: a session not stored is
/// `SESSION_NOT_FOUND`.
///
/// # Errors
/// `STORE_IO` for the statement (every request fails with it).
pub(super) async fn read_many(
    pool: &Pool,
    requests: &[ReadRequest],
) -> Result<Vec<Result<StoredRows>>> {
    let mut ids = Vec::with_capacity(requests.len());
    let mut froms = Vec::with_capacity(requests.len());
    let mut befores = Vec::with_capacity(requests.len());
    let mut headers = Vec::with_capacity(requests.len());
    for request in requests {
        ids.push(uuid_of(request.id));
        froms.push(seq_column(request.from_seq)?);
        befores.push(i64::try_from(request.before_seq).unwrap_or(i64::MAX));
        headers.push(request.with_header);
    }
    let client = checkout(pool)
        .await
        .map_err(pool_io("connecting to PostgreSQL for reads"))?;
    // Per request: its session row (absent when not stored), then one row per batch in range
    // (none when the range holds no batch). The batch holding `from_seq` is found by the
    // greatest first seq at or below it.
    let statement = client
        .prepare_cached(
            "SELECT q.i, s.next_seq, CASE WHEN q.with_header THEN s.header END,
                    b.first_seq, b.events,
                    (SELECT min(first_seq) FROM subagents_event_batches WHERE session = q.id)
             FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bool[])
                  WITH ORDINALITY AS q(id, from_seq, before_seq, with_header, i)
             JOIN subagents_sessions s ON s.id = q.id
             LEFT JOIN subagents_event_batches b
               ON b.session = s.id
              AND b.first_seq < s.next_seq
              AND b.first_seq < q.before_seq
              AND q.from_seq < s.next_seq
              AND b.first_seq >= coalesce((
                  SELECT max(first_seq) FROM subagents_event_batches
                  WHERE session = q.id AND first_seq <= q.from_seq), 0)
             ORDER BY q.i, b.first_seq",
        )
        .await
        .map_err(io("preparing a statement"))?;
    let rows = client
        .query(&statement, &[&ids, &froms, &befores, &headers])
        .await
        .map_err(io(format!("reading {} sessions", requests.len())))?;
    let mut found: Vec<Option<StoredRows>> = requests.iter().map(|_| None).collect();
    for row in &rows {
        let index = usize::try_from(row.get::<_, i64>(0) - 1)
            .ok()
            .filter(|index| *index < requests.len())
            .ok_or_else(|| SubagentError::bug("a batched read answered an unknown request"))?;
        let stored = found[index].get_or_insert_with(|| StoredRows {
            request: requests[index],
            header: row.get(2),
            next_seq: row.get(1),
            first_stored: row.get(5),
            batches: Vec::new(),
        });
        let start: Option<i64> = row.get(3);
        if let Some(bytes) = row.get::<_, Option<Vec<u8>>>(4) {
            stored.batches.push((start, bytes));
        }
    }
    Ok(found
        .into_iter()
        .zip(requests)
        .map(|(stored, request)| stored.ok_or_else(|| not_found(request.id)))
        .collect())
}
