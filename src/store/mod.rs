//! Provides [`SessionPersistence`], the storage interface, and its two backends: [`SledStore`] (the
//! embedded default) and [`MemoryStore`] (tests), plus [`crate::testing::FaultInjectingStore`] for
//! failure tests.
//!
//! # Guarantees
//! - A session's log is append-only and its seqs run from 0 without gaps.
//! - [`SessionPersistence::append`] is compare-and-append: it fails with `STORE_CONFLICT` unless
//!   the first event's seq is the next stored seq, so two writers can never interleave one log.
//! - Writes are durable once [`SessionPersistence::flush`] returns `Ok`. Anything no successful
//!   flush covered may be lost by a crash, as if it never happened.
//! - [`SessionPersistence::prepare`] repairs a turn the process died in, durably, before a
//!   resume; [`SessionPersistence::inspect`] shows the same repair in memory only.
//! - A record that cannot be decoded is a `STORE_CORRUPT` error for its own session; it never
//!   panics and never hides other sessions from [`SessionPersistence::list`].
//!
//! # Leases
//! A runtime may drive a session only while it holds its lease (see [`lease`]).
//! [`SessionPersistence::acquire_lease`] refuses a lease another live runtime holds
//! (`SESSION_LEASED`) and bumps the session's durable fencing epoch; an append that names an
//! epoch that is no longer current is refused with `LEASE_LOST`. On an embedded store the holders
//! live in memory (one process owns the directory); a networked backend maps the lease to a row
//! with a holder, an expiry and an epoch column.

mod codec;
mod encoded_row;
pub(crate) mod faults;
mod group_flush;
pub mod lease;
mod memory;
pub(crate) mod metered;
mod postgres;
mod recent_logs;
mod sled_store;
mod write_thread;

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::session::{
    interrupted_turn_closers_after, repair::after_last_turn_end, EventKind, LogShape,
    SeedReference, SessionEvent, SessionHeader,
};

pub use encoded_row::EncodedRow;
pub use lease::{Lease, LeaseEpoch, LeaseHolder};
pub use memory::MemoryStore;
pub use postgres::{
    deliveries, BatchedCalls, LeasedChild, NodeIncarnation, NodeMembership, PostgresConfig,
    PostgresStore, RECONNECT_WITHIN,
};
pub use sled_store::SledStore;

/// A store shared by the runtime's actors.
pub type SharedStore = Arc<dyn SessionPersistence>;

/// A session as stored: its header and events.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSession {
    /// The header.
    pub header: SessionHeader,
    /// The events, seq 0 first (shared: a store that keeps events in memory hands out its own).
    pub events: Vec<Arc<SessionEvent>>,
    /// How many of the last `events` close an interrupted turn in memory only: an inspection's
    /// repair, not stored. 0 when the stored log was balanced, and after
    /// [`SessionPersistence::prepare`], which stores its repair.
    pub unrepaired: usize,
}

/// A session's own events — those after its seed — as [`SessionPersistence::read_own`] reads
/// them, with the shape its seed leaves them to continue.
#[derive(Debug, Clone)]
pub struct OwnEvents {
    /// The header.
    pub header: SessionHeader,
    /// The shape of the log after its seed: balanced after the seed's last turn (the default
    /// shape for a session with no seed).
    pub seed_shape: LogShape,
    /// The events from seq [`SessionHeader::seed_len`] on.
    pub events: Vec<Arc<SessionEvent>>,
}

/// One row of a listing: a readable header, or the session's own error.
#[derive(Debug, Clone)]
pub enum ListedSession {
    /// The session's header.
    Header(SessionHeader),
    /// The header could not be read.
    Corrupt {
        /// The session id, when the key itself was readable.
        id: Option<SessionId>,
        /// Why.
        error: SubagentError,
    },
}

impl ListedSession {
    /// The header, if it was readable.
    pub fn header(&self) -> Option<&SessionHeader> {
        match self {
            Self::Header(header) => Some(header),
            Self::Corrupt { .. } => None,
        }
    }

    /// The session id, when known.
    pub fn id(&self) -> Option<SessionId> {
        match self {
            Self::Header(header) => Some(header.id),
            Self::Corrupt { id, .. } => *id,
        }
    }
}

/// The storage interface: what every backend provides.
///
/// Every method is async so networked backends fit without a rewrite. Implementations must
/// uphold the guarantees in the module docs; the shared property test in `tests/store.rs` checks
/// them against a model.
pub trait SessionPersistence: Send + Sync + 'static {
    /// Stores a new session: its header and initial events (seed, markers, setup events).
    /// Events arrive shared with the log that committed them: a store that keeps them in memory
    /// keeps the same allocation.
    ///
    /// # Errors
    /// `SESSION_EXISTS` when the id is taken; `INVALID_HEADER`; `STORE_IO`.
    fn create(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
    ) -> BoxFuture<'_, Result<()>>;

    /// [`SessionPersistence::create`], then [`SessionPersistence::acquire_lease`] for
    /// `holder`: a store that can write both at once (sled writes the head once) overrides it.
    /// On a lease error the session stays created, as with the two calls.
    ///
    /// # Errors
    /// As the two calls.
    fn create_leased(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
        holder: LeaseHolder,
    ) -> BoxFuture<'_, Result<Lease>> {
        Box::pin(async move {
            let id = header.id;
            self.create(header, events).await?;
            self.acquire_lease(id, holder).await
        })
    }

    /// Appends `events` if the session's next stored seq is `expected_next_seq` and `lease`, when
    /// given, is the session's current epoch. The batch is all or nothing.
    ///
    /// # Errors
    /// `SESSION_NOT_FOUND`; `STORE_CONFLICT` on a seq mismatch; `LEASE_LOST` when `lease` is not
    /// the current epoch; `STORE_IO`.
    fn append(
        &self,
        id: SessionId,
        expected_next_seq: u64,
        events: Vec<Arc<SessionEvent>>,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>>;

    /// Makes every write to `id` made before the call durable.
    ///
    /// # Errors
    /// `STORE_IO`.
    fn flush(&self, id: SessionId) -> BoxFuture<'_, Result<()>>;

    /// Every stored session, ordered by id (ids are time-ordered UUIDs).
    ///
    /// # Errors
    /// `STORE_IO` when the listing itself fails; a bad row is a [`ListedSession::Corrupt`].
    fn list(&self) -> BoxFuture<'_, Result<Vec<ListedSession>>>;

    /// The sessions whose header names `parent` as parent, without reading any log.
    ///
    /// # Errors
    /// As [`SessionPersistence::list`].
    fn list_children(&self, parent: SessionId) -> BoxFuture<'_, Result<Vec<ListedSession>>>;

    /// The stored header.
    ///
    /// # Errors
    /// `SESSION_NOT_FOUND`; `STORE_CORRUPT`; `STORE_IO`.
    fn header(&self, id: SessionId) -> BoxFuture<'_, Result<SessionHeader>>;

    /// The events the session's own stored log holds from `from_seq` on and before
    /// `before_seq`, raw (no repair): a session whose seed is stored by reference holds only the
    /// events after its seed (from [`SessionHeader::first_stored_seq`]). Readers call
    /// [`SessionPersistence::read_from`], which resolves the seed.
    ///
    /// # Errors
    /// `SESSION_NOT_FOUND`; `STORE_CORRUPT` naming the bad record; `STORE_IO`.
    fn read_stored(
        &self,
        id: SessionId,
        from_seq: u64,
        before_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Arc<SessionEvent>>>>;

    /// The session's events from `from_seq` on, raw (no repair), its seed included: a seed
    /// stored by reference is read from the log it references (only the prefix it names,
    /// following forks of forks) and checked against the reference's length and digest. A
    /// session with its seed inline costs one [`SessionPersistence::read_stored`].
    ///
    /// # Errors
    /// As [`SessionPersistence::read_stored`]; `STORE_CORRUPT` when the stored log starts past
    /// `from_seq` without a seed reference, or the referenced prefix is missing or changed.
    fn read_from(
        &self,
        id: SessionId,
        from_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Arc<SessionEvent>>>> {
        self.read_between(id, from_seq, u64::MAX)
    }

    /// [`SessionPersistence::read_from`], stopping before `before_seq`.
    ///
    /// # Errors
    /// As [`SessionPersistence::read_from`].
    fn read_between(
        &self,
        id: SessionId,
        from_seq: u64,
        before_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Arc<SessionEvent>>>> {
        Box::pin(async move {
            let stored = self.read_stored(id, from_seq, before_seq).await?;
            let header = if stored.first().is_none_or(|first| first.seq <= from_seq) {
                // An inline log, or a read that asked for nothing before the stored events;
                // a read that ends inside a seed finds no stored events and must look.
                if !stored.is_empty() || from_seq >= before_seq {
                    return Ok(stored);
                }
                let header = self.header(id).await?;
                if header.first_stored_seq() <= from_seq {
                    return Ok(stored);
                }
                header
            } else {
                self.header(id).await?
            };
            let reference = header.seed_reference.as_deref().copied().ok_or_else(|| {
                corrupt(
                    id,
                    format!(
                        "its stored log starts at seq {} with no seed reference",
                        stored.first().map_or(0, |first| first.seq)
                    ),
                )
            })?;
            if stored
                .first()
                .is_some_and(|first| first.seq != reference.length)
            {
                return Err(corrupt(
                    id,
                    format!(
                        "its stored log starts at seq {}, after a seed of {}",
                        stored[0].seq, reference.length
                    ),
                ));
            }
            // Here `from_seq` lies inside the seed. Only the named prefix is read, always
            // through its last event, whose digest proves it unchanged.
            let mut events = self
                .read_between(reference.session, from_seq, reference.length)
                .await
                .map_err(|error| match error.code() {
                    // The child is stored; what is missing is its seed.
                    ErrorCode::SessionNotFound => corrupt(
                        id,
                        format!("its seed's session {} is not stored", reference.session),
                    ),
                    _ => error,
                })?;
            let whole = seq_of(events.len())? == reference.length.saturating_sub(from_seq);
            if !whole
                || events.last().map(|tail| SeedReference::digest(tail)) != Some(reference.tail)
            {
                return Err(corrupt(
                    id,
                    format!(
                        "its seed, the first {} events of session {}, is missing or changed",
                        reference.length, reference.session
                    ),
                ));
            }
            let wanted = before_seq.min(reference.length).saturating_sub(from_seq);
            events.truncate(usize::try_from(wanted).unwrap_or(usize::MAX));
            events.extend(stored);
            Ok(events)
        })
    }

    /// Grants `holder` the session's lease with a fresh, larger fencing epoch (durable), unless
    /// another live holder holds it. A holder that asks again for its own lease gets a new epoch,
    /// which fences its older writer.
    ///
    /// # Errors
    /// `SESSION_NOT_FOUND`; `SESSION_LEASED` when another runtime holds the lease; `STORE_IO`.
    fn acquire_lease(&self, id: SessionId, holder: LeaseHolder) -> BoxFuture<'_, Result<Lease>>;

    /// [`SessionPersistence::acquire_lease`], answered with the length of the session's
    /// stored log at the grant when the store learns it in the same step (`None` otherwise,
    /// the default). No one else appends while the lease is held, so a resume that inspected
    /// the log before taking it reads it again only if it grew
    /// ([`SessionPersistence::prepare_inspected`]).
    ///
    /// # Errors
    /// As [`SessionPersistence::acquire_lease`].
    fn acquire_lease_with_length(
        &self,
        id: SessionId,
        holder: LeaseHolder,
    ) -> BoxFuture<'_, Result<(Lease, Option<u64>)>> {
        Box::pin(async move { Ok((self.acquire_lease(id, holder).await?, None)) })
    }

    /// Extends a lease that has a time-to-live.
    ///
    /// # Errors
    /// `LEASE_LOST` when `epoch` is no longer the session's current lease; `STORE_IO`.
    fn renew_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>>;

    /// Frees the lease if `epoch` is still current (a stale release is a no-op).
    ///
    /// # Errors
    /// `STORE_IO`.
    fn release_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>>;

    /// Reads a projection-cache row for (`unit`, `id`).
    ///
    /// # Errors
    /// `STORE_CORRUPT`; `STORE_IO`.
    fn cache_get(&self, unit: &str, id: SessionId) -> BoxFuture<'_, Result<Option<Value>>>;

    /// [`cache_get`](Self::cache_get) of a row as its JSON bytes, for a reader that decodes
    /// only what it needs (a resume reads its child's checkpoint record this way: decoding a
    /// record as a value cost more than folding a few dozen events). By default the row is read
    /// by `cache_get` and encoded; the crate's stores hand out the bytes they keep.
    ///
    /// # Errors
    /// As `cache_get`.
    fn cache_get_encoded(
        &self,
        unit: &str,
        id: SessionId,
    ) -> BoxFuture<'_, Result<Option<EncodedRow>>> {
        let row = self.cache_get(unit, id);
        Box::pin(async move { row.await?.map(|row| EncodedRow::encode(&row)).transpose() })
    }

    /// Writes a projection-cache row for (`unit`, `id`). With `lease`, the write is fenced like
    /// an append: it lands only while `lease` is the session's current epoch, so a runtime that
    /// lost the session (or released it and saw a newer holder take it) can never overwrite the
    /// row of the one writing it now.
    ///
    /// # Errors
    /// `INVALID_PROJECTION` for a row that does not encode; `LEASE_LOST` when `lease` is not the
    /// session's current epoch; `SESSION_NOT_FOUND` when a fenced write names no stored session;
    /// `STORE_IO`.
    fn cache_put(
        &self,
        unit: &str,
        id: SessionId,
        row: Value,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>>;

    /// [`cache_put`](Self::cache_put) of a row already encoded: the runtime's checkpoints are
    /// encoded straight from their parts, which costs less than building them as a value
    /// first. By default the row is decoded and written by `cache_put`; the crate's stores
    /// keep the bytes as they are.
    ///
    /// # Errors
    /// As `cache_put`.
    fn cache_put_encoded(
        &self,
        unit: &str,
        id: SessionId,
        row: EncodedRow,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        match codec::decode_cache_row(unit, id, row.as_bytes()) {
            Ok(row) => self.cache_put(unit, id, row, lease),
            // An encoded row is JSON: a decoder that disagrees is this crate's fault.
            Err(error) => Box::pin(futures::future::ready(Err(SubagentError::bug(
                error.message(),
            )))),
        }
    }

    /// Told that the one-shot child `id` was disposed: the runtime never reads or writes its
    /// session again. A store keeps it by default, so it can still be listed and inspected; a
    /// store built to let such sessions go (see [`MemoryStore::forgetting_one_shots`]) drops
    /// it, so a long run of one-shot delegations does not grow the store.
    ///
    /// [`MemoryStore::forgetting_one_shots`]: super::MemoryStore::forgetting_one_shots
    fn one_shot_disposed(&self, id: SessionId) {
        let _ = id;
    }

    /// The store's size on disk in bytes, for a store that has one.
    fn size_on_disk(&self) -> Option<u64> {
        None
    }

    /// The stored session with an interrupted last turn closed **in memory only**; commits
    /// nothing.
    ///
    /// # Errors
    /// As [`SessionPersistence::header`] and [`SessionPersistence::read_from`].
    fn inspect(&self, id: SessionId) -> BoxFuture<'_, Result<StoredSession>> {
        Box::pin(inspection(self, id))
    }

    /// The session's own events, raw, with its seed checked but not read: only the seed's last
    /// event is, which proves a seed stored by reference resolves unchanged (the reference's
    /// digest covers it), so a fork's cost does not grow with its parent's transcript. A seed
    /// that does not end a turn (one a host built by hand) is read whole to learn its shape.
    ///
    /// # Errors
    /// As [`SessionPersistence::read_from`].
    fn read_own(&self, id: SessionId) -> BoxFuture<'_, Result<OwnEvents>> {
        Box::pin(async move {
            let header = self.header(id).await?;
            let seed_len = header.seed_len();
            let Some(tail_seq) = seed_len.checked_sub(1) else {
                let events = self.read_from(id, 0).await?;
                return Ok(OwnEvents {
                    header,
                    seed_shape: LogShape::default(),
                    events,
                });
            };
            let mut events = self.read_from(id, tail_seq).await?;
            let seed_shape = match events.first().map(|tail| (tail.seq, &tail.kind)) {
                Some((seq, EventKind::TurnEnd { turn, .. })) if seq == tail_seq => {
                    LogShape::after_turn(*turn)
                }
                _ => {
                    events = self.read_from(id, 0).await?;
                    let mut shape = LogShape::default();
                    let split = usize::try_from(seed_len)
                        .unwrap_or(usize::MAX)
                        .min(events.len());
                    for event in events.drain(..split) {
                        shape.admit(&event)?;
                    }
                    return Ok(OwnEvents {
                        header,
                        seed_shape: shape,
                        events,
                    });
                }
            };
            events.remove(0);
            Ok(OwnEvents {
                header,
                seed_shape,
                events,
            })
        })
    }

    /// [`SessionPersistence::read_own`] with an interrupted last turn closed **in memory
    /// only**, as [`SessionPersistence::inspect`] shows it: what a listing folds to name a cold
    /// child from its own descriptor. Commits nothing.
    ///
    /// # Errors
    /// As [`SessionPersistence::read_own`].
    fn inspect_own(&self, id: SessionId) -> BoxFuture<'_, Result<OwnEvents>> {
        Box::pin(own_inspection(self, id))
    }

    /// Loads the session for a resume: an interrupted last turn is closed durably (appended
    /// under `lease` and flushed) before the balanced log is returned. The resume of an agent
    /// that pages its log, and a write into the inbox of a session that is away, load it a
    /// chunk at a time through [`SessionPersistence::header`],
    /// [`SessionPersistence::read_between`], [`SessionPersistence::append`] and
    /// [`SessionPersistence::flush`] instead, closing the turn the same way.
    ///
    /// # Errors
    /// As [`SessionPersistence::inspect`], plus the append and flush errors of the repair.
    fn prepare(
        &self,
        id: SessionId,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<StoredSession>> {
        Box::pin(async move {
            let header = self.header(id).await?;
            let events = self.read_from(id, 0).await?;
            repair_durably(self, id, lease, header, events).await
        })
    }

    /// [`SessionPersistence::prepare`] for a caller that inspected the session
    /// ([`SessionPersistence::inspect`]) before it took the lease: only what was appended since
    /// the inspection is read, so a cold resume reads its log once, and nothing is read when
    /// `stored_len`, the log's length as the lease's grant saw it
    /// ([`SessionPersistence::acquire_lease_with_length`]), is the inspection's. The header is
    /// the inspection's (a stored header never changes).
    ///
    /// # Errors
    /// As [`SessionPersistence::prepare`].
    fn prepare_inspected(
        &self,
        id: SessionId,
        lease: Option<LeaseEpoch>,
        inspected: StoredSession,
        stored_len: Option<u64>,
    ) -> BoxFuture<'_, Result<StoredSession>> {
        Box::pin(async move {
            let StoredSession {
                header,
                mut events,
                unrepaired,
            } = inspected;
            events.truncate(events.len().saturating_sub(unrepaired));
            let next = seq_of(events.len())?;
            // Past the seed the session's own stored log answers alone.
            let appended = if stored_len == Some(next) {
                Vec::new()
            } else if next >= header.first_stored_seq() {
                self.read_stored(id, next, u64::MAX).await?
            } else {
                self.read_from(id, next).await?
            };
            events.extend(appended);
            repair_durably(self, id, lease, header, events).await
        })
    }
}

/// `events` as a resume loads them: an interrupted last turn is closed durably (appended under
/// `lease` and flushed) before the balanced log is returned.
async fn repair_durably<S: SessionPersistence + ?Sized>(
    store: &S,
    id: SessionId,
    lease: Option<LeaseEpoch>,
    header: SessionHeader,
    mut events: Vec<Arc<SessionEvent>>,
) -> Result<StoredSession> {
    let closers = close_interrupted(&events)?;
    if !closers.is_empty() {
        let next = seq_of(events.len())?;
        tracing::info!(session_id = %id, repaired = closers.len(), "repairing an interrupted turn");
        store.append(id, next, closers.clone(), lease).await?;
        store.flush(id).await?;
        events.extend(closers);
    }
    Ok(StoredSession {
        header,
        events,
        unrepaired: 0,
    })
}

/// The closer events for a stored log, numbered after its last event.
fn close_interrupted(events: &[Arc<SessionEvent>]) -> Result<Vec<Arc<SessionEvent>>> {
    Ok(closers_from(
        LogShape::default(),
        seq_of(events.len())?,
        events,
    ))
}

/// The closers for `events`, which follow a log part of shape `shape`, numbered from `next`.
fn closers_from(
    shape: LogShape,
    next: u64,
    events: &[Arc<SessionEvent>],
) -> Vec<Arc<SessionEvent>> {
    // Only what follows the last turn end can be open: every resume and inspection looks, and
    // most logs end balanced.
    let (shape, open) = match after_last_turn_end(events.iter()) {
        Some((shape, from)) => (shape, &events[events.partition_point(|e| e.seq < from)..]),
        None => (shape, events),
    };
    interrupted_turn_closers_after(shape, open)
        .into_iter()
        .zip(next..)
        .map(|(kind, seq)| Arc::new(SessionEvent::new(seq, kind)))
        .collect()
}

/// How many events a chunked read of a long log asks for at a time ([`read_chunked`]).
pub(crate) const READ_CHUNK: u64 = 4096;

/// Reads session `id`'s events from `from` and below `before` (every one, with `u64::MAX`) a
/// chunk of [`READ_CHUNK`] at a time, handing each chunk to `chunk` in order until it answers
/// `false`: a long log is never read whole into memory. A seed stored by reference (its first
/// `seed_end` events, [`SessionHeader::first_stored_seq`]) is one chunk, since every read
/// inside it checks the reference's digest.
///
/// # Errors
/// The store's, and `chunk`'s.
pub(crate) async fn read_chunked<S: SessionPersistence + ?Sized>(
    store: &S,
    id: SessionId,
    (mut from, seed_end): (u64, u64),
    before: u64,
    mut chunk: impl FnMut(Vec<Arc<SessionEvent>>) -> Result<bool>,
) -> Result<()> {
    while from < before {
        let until = if from < seed_end {
            seed_end
        } else {
            from.saturating_add(READ_CHUNK)
        }
        .min(before);
        let events = store.read_between(id, from, until).await?;
        let read = u64::try_from(events.len()).unwrap_or(u64::MAX);
        // A short chunk is the log's end.
        let whole = read == until - from;
        from = from.saturating_add(read);
        if !chunk(events)? || !whole {
            break;
        }
    }
    Ok(())
}

/// [`SessionPersistence::inspect`] of `store`, through its own reads (so a wrapping store that
/// intercepts the inspection still sees them).
pub(crate) async fn inspection<S: SessionPersistence + ?Sized>(
    store: &S,
    id: SessionId,
) -> Result<StoredSession> {
    let header = store.header(id).await?;
    let events = store.read_from(id, 0).await?;
    inspected(header, events)
}

/// A session as an inspection shows it: `events` (its whole log, read raw) with an interrupted
/// last turn closed in memory.
pub(crate) fn inspected(
    header: SessionHeader,
    mut events: Vec<Arc<SessionEvent>>,
) -> Result<StoredSession> {
    let closers = close_interrupted(&events)?;
    let unrepaired = closers.len();
    events.extend(closers);
    Ok(StoredSession {
        header,
        events,
        unrepaired,
    })
}

/// [`SessionPersistence::inspect_own`] of `store`, through its own reads (so a wrapping store
/// that intercepts the inspection still sees them).
async fn own_inspection<S: SessionPersistence + ?Sized>(
    store: &S,
    id: SessionId,
) -> Result<OwnEvents> {
    let mut own = store.read_own(id).await?;
    let next = own
        .header
        .seed_len()
        .saturating_add(seq_of(own.events.len())?);
    let closers = closers_from(own.seed_shape.clone(), next, &own.events);
    own.events.extend(closers);
    Ok(own)
}

/// A session's stored log does not read back as a whole.
fn corrupt(id: SessionId, why: String) -> SubagentError {
    SubagentError::new(ErrorCode::StoreCorrupt, format!("session {id}: {why}"))
}

fn seq_of(len: usize) -> Result<u64> {
    u64::try_from(len).map_err(|_| SubagentError::bug("log length exceeds u64"))
}

/// Checks that `events` continue a log whose next seq is `next`.
pub(crate) fn check_contiguous<E: std::borrow::Borrow<SessionEvent>>(
    id: SessionId,
    next: u64,
    events: &[E],
) -> Result<()> {
    for (event, expected) in events.iter().map(std::borrow::Borrow::borrow).zip(next..) {
        if event.seq != expected {
            return Err(SubagentError::new(
                ErrorCode::StoreConflict,
                format!(
                    "session {id}: append expected seq {expected}, got {}",
                    event.seq
                ),
            ));
        }
    }
    Ok(())
}

/// The compare step of compare-and-append: the caller's expected next seq must be the stored
/// one, and its lease (when given) must be the stored epoch.
pub(crate) fn check_append(
    id: SessionId,
    expected_next_seq: u64,
    stored_next_seq: u64,
    lease: Option<LeaseEpoch>,
    stored_lease: u64,
) -> Result<()> {
    // The lease first: a fenced writer's seq is stale too, and the lease says why.
    if lease.is_some_and(|LeaseEpoch(epoch)| epoch != stored_lease) {
        return Err(lease::lease_lost(id));
    }
    if stored_next_seq != expected_next_seq {
        return Err(SubagentError::new(
            ErrorCode::StoreConflict,
            format!(
                "session {id}: expected next seq {expected_next_seq}, stored {stored_next_seq}"
            ),
        ));
    }
    Ok(())
}

/// The lease a leased creation granted: a creation written with a holder always grants one.
pub(crate) fn granted(lease: Option<Lease>) -> Result<Lease> {
    lease.ok_or_else(|| SubagentError::bug("a leased creation granted no lease"))
}

pub(crate) fn not_found(id: SessionId) -> SubagentError {
    SubagentError::new(
        ErrorCode::SessionNotFound,
        format!("no stored session {id}"),
    )
}
