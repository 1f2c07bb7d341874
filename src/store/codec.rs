//! Provides the byte encoding every persistent backend shares: a header is its JSON, an
//! append is one row holding its events as a JSON array (which a store may keep compressed:
//! [`compress_batch`]), and a read reassembles the rows below the session's head into one
//! contiguous run of events. A projection cache row is its JSON.

use std::borrow::Cow;
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

/// The first byte of a batch row that holds its JSON array compressed (LZ4's block format
/// behind the array's length, a little-endian `u32`). A plain row is the array itself, whose
/// first byte is `[`, so rows written before compression read back as they are.
pub(super) const LZ4_BATCH: u8 = 0x04;

/// The tag byte and the length before a compressed row's block.
const COMPRESSED_HEAD: usize = 1 + 4;

/// Rows shorter than this are kept plain: LZ4 saves little on them.
const COMPRESS_FROM: usize = 128;

/// How many times its length LZ4 can expand a block at most: a stored length beyond it is a
/// corrupt row, not an allocation to make.
const LZ4_MAX_EXPANSION: usize = 255;

/// The largest scratch block a thread keeps between compressions (see [`COMPRESSOR`]); a batch
/// whose block could be longer compresses into a block of its own.
const SCRATCH_KEPT: usize = 1 << 20;

thread_local! {
    /// LZ4's hash table and a scratch block for its output, kept by each thread that compresses
    /// batches. Allocating both zeroed for every batch (the table 8 KiB, the block the batch's
    /// length and a tenth) cost a third of compressing a turn's batch; the table is cleared
    /// before each use, and the block's stale bytes are only ever overwritten.
    static COMPRESSOR: std::cell::RefCell<(lz4_flex::block::CompressTable, Vec<u8>)> =
        std::cell::RefCell::new((lz4_flex::block::CompressTable::default(), Vec::new()));
}

/// `json`, an encoded batch ([`encode_batch`]), as the row a store keeps: compressed with LZ4
/// when that makes it shorter, plain otherwise. Event JSON repeats its field names and ids, so a
/// turn's batch shrinks to about half ([`assemble`] reads either kind).
pub(crate) fn compress_batch(json: Vec<u8>) -> Vec<u8> {
    let Ok(len) = u32::try_from(json.len()) else {
        return json;
    };
    if json.len() < COMPRESS_FROM {
        return json;
    }
    let bound = lz4_flex::block::get_maximum_output_size(json.len());
    let row = |block: &[u8]| {
        let mut row = Vec::with_capacity(COMPRESSED_HEAD + block.len());
        row.push(LZ4_BATCH);
        row.extend_from_slice(&len.to_le_bytes());
        row.extend_from_slice(block);
        row
    };
    let compressed = COMPRESSOR.with_borrow_mut(|(table, scratch)| {
        let mut own = Vec::new();
        let block = if bound <= SCRATCH_KEPT {
            if scratch.len() < bound {
                scratch.resize(bound, 0);
            }
            &mut scratch[..bound]
        } else {
            own.resize(bound, 0);
            &mut own[..]
        };
        match lz4_flex::block::compress_into_with_table(&json, block, table) {
            Ok(written) if COMPRESSED_HEAD + written < json.len() => Some(row(&block[..written])),
            _ => None,
        }
    });
    compressed.unwrap_or(json)
}

/// The JSON array of `row`, a stored batch whose first event is at seq `start`: the row itself
/// when plain, decompressed when compressed.
///
/// # Errors
/// `STORE_CORRUPT` when a compressed row does not decompress to the length it states.
fn batch_json(id: SessionId, start: u64, row: &[u8]) -> Result<Cow<'_, [u8]>> {
    let Some((&LZ4_BATCH, compressed)) = row.split_first() else {
        return Ok(Cow::Borrowed(row));
    };
    let corrupt = |why: String| {
        SubagentError::new(
            ErrorCode::StoreCorrupt,
            format!("session {id}: the events from {start} do not decompress: {why}"),
        )
    };
    let (len, block) = compressed
        .split_first_chunk::<4>()
        .ok_or_else(|| corrupt("the row ends before its length".into()))?;
    let len = usize::try_from(u32::from_le_bytes(*len)).unwrap_or(usize::MAX);
    if len > block.len().saturating_mul(LZ4_MAX_EXPANSION) {
        return Err(corrupt(format!(
            "it states {len} bytes for a block of {}",
            block.len()
        )));
    }
    let mut json = vec![0; len];
    match lz4_flex::block::decompress_into(block, &mut json) {
        Ok(written) if written == len => Ok(Cow::Owned(json)),
        Ok(written) => Err(corrupt(format!("{written} bytes where it states {len}"))),
        Err(error) => Err(corrupt(error.to_string()).with_source(error)),
    }
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
        let json = batch_json(id, start, &bytes)?;
        let (in_range, len) = batch
            .deserialize(&mut serde_json::Deserializer::from_slice(&json))
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

    /// A long batch is stored compressed and a short one plain; a read assembles both kinds.
    #[test]
    fn compressed_and_plain_rows_assemble_into_one_log() {
        let id = SessionId::new();
        let long = batch(0, 40);
        let compressed = compress_batch(long.clone());
        assert_eq!(compressed[0], LZ4_BATCH);
        assert!(
            compressed.len() < long.len() / 2,
            "{} of {}",
            compressed.len(),
            long.len()
        );
        let short = batch(40, 1);
        assert!(short.len() < COMPRESS_FROM);
        assert_eq!(
            compress_batch(short.clone()),
            short,
            "a short row stays plain"
        );
        // Bytes LZ4 cannot shorten (a xorshift sequence) stay plain too.
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let noise: Vec<u8> = (0..4 * COMPRESS_FROM)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect();
        assert_eq!(
            compress_batch(noise.clone()),
            noise,
            "an incompressible row stays plain"
        );
        let rows = [(Some(0), compressed), (Some(40), short)];
        let read = assemble(id, 0, 41, rows.into_iter().map(Ok)).expect("a sound log");
        let seqs: Vec<u64> = read.iter().map(|event| event.seq).collect();
        assert_eq!(seqs, (0..41).collect::<Vec<_>>());
    }

    /// The thread's kept table and scratch block carry nothing from one batch to the next: a
    /// batch compresses as a fresh compressor would, and after a longer one (which grows the
    /// block past the kept bound and the table past 16-bit offsets) it still reads back whole.
    #[test]
    fn a_batch_compresses_alike_whatever_the_thread_compressed_before() {
        let id = SessionId::new();
        let short = batch(0, 40);
        let fresh = lz4_flex::block::compress(&short);
        let first = compress_batch(short.clone());
        assert_eq!(first[COMPRESSED_HEAD..], fresh[..], "as a fresh compressor");
        let long = batch(40, 20_000);
        assert!(lz4_flex::block::get_maximum_output_size(long.len()) > SCRATCH_KEPT);
        let long_row = compress_batch(long);
        let middle = batch(20_040, 2_000);
        assert!(middle.len() > usize::from(u16::MAX));
        let middle_row = compress_batch(middle);
        let again = compress_batch(short.clone());
        let rows = [(Some(40), long_row), (Some(20_040), middle_row)];
        let read = assemble(id, 40, 22_040, rows.into_iter().map(Ok)).expect("a sound log");
        assert!(read.iter().map(|event| event.seq).eq(40..22_040));
        for row in [first, again] {
            assert_eq!(
                batch_json(id, 0, &row).expect("decompresses")[..],
                short[..]
            );
        }
    }

    /// A damaged compressed row is `STORE_CORRUPT`: never a panic, nor an allocation of the
    /// length a damaged prefix states.
    #[test]
    fn a_damaged_compressed_row_reads_as_corrupt() {
        let id = SessionId::new();
        let row = compress_batch(batch(0, 40));
        let mut huge = row.clone();
        huge[1..COMPRESSED_HEAD].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut longer = row.clone();
        let stated = u32::from_le_bytes(row[1..COMPRESSED_HEAD].try_into().unwrap());
        longer[1..COMPRESSED_HEAD].copy_from_slice(&(stated + 1).to_le_bytes());
        let damaged = [
            ("a length past any expansion", huge),
            ("a length the block does not fill", longer),
            ("a cut block", row[..row.len() / 2].to_vec()),
            ("no length", vec![LZ4_BATCH, 1]),
        ];
        for (what, row) in damaged {
            let error = assemble(id, 0, 40, std::iter::once(Ok((Some(0), row)))).expect_err(what);
            assert_eq!(error.code(), ErrorCode::StoreCorrupt, "{what}: {error}");
            assert!(
                error.message().contains("do not decompress"),
                "{what}: {error}"
            );
        }
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
