//! Provides [`SledStore`]: the embedded default [`SessionPersistence`], on sled.
//!
//! # Layout
//! - `headers`: session id (16 bytes) → header JSON.
//! - `heads`: session id → next seq (u64 big-endian) ‖ lease epoch (u64 big-endian).
//! - `event_batches`: session id ‖ first seq (u64 big-endian) → one append's events, a JSON
//!   array in seq order, LZ4-compressed when that shortens it (`compress_batch`: about half the
//!   bytes on disk and in sled's page cache; rows stored plain by earlier versions read back as
//!   they are); big-endian keys keep a session's batches contiguous and in seq order.
//!   One row per append, not per event: sled's cost is per row (a turn's 14 events cost
//!   135 µs as 14 rows and 23 µs as one).
//! - `children`: parent id ‖ child id → empty; lists children without reading any log.
//! - `projection_cache`: unit name ‖ 0x00 ‖ session id → row JSON.
//!
//! A session that never appended an event (created with an empty log) is left out of the
//! listings until it does.
//!
//! # Commit points
//! Writes need no sled transaction; each has one commit point, written last:
//! - **create** writes the seed events, the head, the children-index row, and last the header.
//!   The header is the commit point: a session without one does not exist, and readers skip
//!   whatever a crash left of it (an index row whose child has no header is not listed).
//! - **append** writes its events as one sled batch, then moves the head. Readers trust events
//!   only below the head, so a crash between the two loses that batch whole and nothing else.
//!
//! Within this process a writer lock makes compare-and-append atomic (it also guards the lease
//! table); sled's directory lock keeps other processes out. Creations, appends and
//! projection-cache writes run on their caller's thread while they all come from one thread,
//! and on the store's own [`WriteThread`], in the order asked for, once they come from several
//! (a runtime spread over worker threads): see that type for why. The sessions the store created most
//! recently are also kept decoded ([`RecentLogs`]), mirrored under that lock after each committed
//! write, so reading one back, or checking an append against its head, reads no row. sled itself writes its log to the OS
//! every 500 ms; [`SessionPersistence::flush`] (an fsync of the whole database) is the
//! durability point.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::future::{self, BoxFuture, FutureExt};
use serde_json::Value;

use super::codec::{
    assemble, before_the_stored_log, compress_batch, decode_cache_row, decode_header, encode_batch,
    put_value_row,
};
use super::group_flush::GroupFlush;
use super::lease::LeaseTable;
use super::recent_logs::{RecentLogs, RECENT_LOG_BYTES};
use super::write_thread::WriteThread;
use super::{
    check_append, check_contiguous, not_found, EncodedRow, Lease, LeaseEpoch, LeaseHolder,
    ListedSession, SessionPersistence,
};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::session::{SessionEvent, SessionHeader};

/// The sled-backed store. Clones share one database.
#[derive(Debug, Clone)]
pub struct SledStore {
    db: sled::Db,
    headers: sled::Tree,
    heads: sled::Tree,
    batches: sled::Tree,
    children: sled::Tree,
    cache: sled::Tree,
    /// The writer lock; the lease holders of this process live under it.
    writing: Arc<Mutex<LeaseTable>>,
    /// Durability flushes, one at a time and shared.
    flushes: Arc<GroupFlush>,
    /// The sessions created most recently, kept decoded (updated under the writer lock).
    recent: Arc<Mutex<RecentLogs>>,
    /// Where creations, appends and projection-cache writes run once they come from several
    /// threads.
    writes: Arc<WriteThread>,
}

const LOCK_RETRY: Duration = Duration::from_millis(5);

const SEQ_LEN: usize = 8;
const LEGACY_EVENTS: &[u8] = b"events";
const ID_LEN: usize = 16;

impl SledStore {
    /// The bytes of the projection-cache row for (`unit`, `id`), as stored.
    fn cache_bytes(&self, unit: &str, id: SessionId) -> Result<Option<sled::IVec>> {
        self.cache
            .get(cache_key(unit, id))
            .map_err(|e| SubagentError::store_io("reading the projection cache", e))
    }

    /// How long [`SledStore::open`] waits for a busy directory lock.
    pub const LOCK_WAIT: Duration = Duration::from_secs(2);

    /// Opens (or creates) the store in directory `path`, with sled's own page cache (1 GiB,
    /// which sled overshoots: a process that writes many sessions and reads back mostly recent
    /// ones may bound its memory with [`SledStore::open_with_cache_capacity`], as
    /// `subagents load` does with 256 MiB).
    ///
    /// sled holds an exclusive file lock on the directory. A store dropped in this process
    /// releases it only once sled's background flusher has stopped, so `open` retries a busy
    /// lock for up to [`SledStore::LOCK_WAIT`] before giving up; this is the only time it blocks its thread.
    ///
    /// # Errors
    /// `STORE_IO` when sled cannot open the directory (for example, another process holds it).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_configured(path.as_ref(), Self::LOCK_WAIT, Self::config)
    }

    /// [`SledStore::open`] with a page cache of at most `cache_bytes` (sled's own default is
    /// 1 GiB): for a process that reads through a large store once, such as `subagents tree`,
    /// whose memory then stays bounded by the cache instead of growing toward sled's default.
    ///
    /// # Errors
    /// As [`SledStore::open`].
    pub fn open_with_cache_capacity(path: impl AsRef<Path>, cache_bytes: u64) -> Result<Self> {
        Self::open_with_cache(path, cache_bytes, Self::LOCK_WAIT)
    }

    /// [`SledStore::open`] with a page cache of at most `cache_bytes` (sled's own default is
    /// 1 GiB), waiting up to `lock_wait` for a busy directory: for a short-lived store opened
    /// right after its previous holder in this process let go, such as the load harness's
    /// reopening of the store its run closed.
    ///
    /// # Errors
    /// As [`SledStore::open`].
    pub(crate) fn open_with_cache(
        path: impl AsRef<Path>,
        cache_bytes: u64,
        lock_wait: Duration,
    ) -> Result<Self> {
        Self::open_configured(path.as_ref(), lock_wait, || {
            Self::config().cache_capacity(cache_bytes)
        })
    }

    /// Opens `path` with the configuration `config` makes (one per attempt: sled's builder
    /// refuses a configuration shared with a clone), retrying a busy lock for `lock_wait`.
    fn open_configured(
        path: &Path,
        lock_wait: Duration,
        config: impl Fn() -> sled::Config,
    ) -> Result<Self> {
        let deadline = Instant::now() + lock_wait;
        loop {
            match config().path(path).open() {
                Ok(db) => return Self::from_db(db),
                Err(sled::Error::Io(error))
                    if error.to_string().contains("could not acquire lock")
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(LOCK_RETRY);
                }
                Err(sled::Error::Io(error))
                    if error.to_string().contains("could not acquire lock") =>
                {
                    return Err(SubagentError::new(
                        ErrorCode::StoreIo,
                        format!(
                            "the store {} is in use by another process (its directory is locked)",
                            path.display()
                        ),
                    ))
                }
                Err(sled::Error::Corruption { at, .. }) => {
                    let at = at.map_or_else(
                        || "its configuration (conf)".to_owned(),
                        |at| format!("its log (db, blobs/) at {at:?}"),
                    );
                    return Err(SubagentError::new(
                        ErrorCode::StoreCorrupt,
                        format!(
                            "the store {} is damaged: sled found corrupted data in {at} and \
                             cannot open it; nothing in it was changed. Move the directory \
                             aside (keep it to report the damage) and open a new store in \
                             another directory",
                            path.display()
                        ),
                    ));
                }
                Err(error) => {
                    return Err(SubagentError::store_io(
                        format!("opening the store {}", path.display()),
                        error,
                    ))
                }
            }
        }
    }

    /// A store in a temporary directory that is deleted when the store is dropped.
    ///
    /// # Errors
    /// `STORE_IO`.
    pub fn temporary() -> Result<Self> {
        let db = Self::config()
            .temporary(true)
            .open()
            .map_err(|e| SubagentError::store_io("opening a temporary store", e))?;
        Self::from_db(db)
    }

    /// sled's configuration (its defaults: the high-throughput mode measured no faster here).
    fn config() -> sled::Config {
        sled::Config::new()
    }

    fn from_db(db: sled::Db) -> Result<Self> {
        // The first layout kept one row per event under `events`; it is not read any more.
        if db
            .tree_names()
            .iter()
            .any(|name| name.as_ref() == LEGACY_EVENTS)
        {
            let legacy = db
                .open_tree(LEGACY_EVENTS)
                .map_err(|e| SubagentError::store_io("opening tree events", e))?;
            if !legacy.is_empty() {
                return Err(SubagentError::new(
                    ErrorCode::StoreCorrupt,
                    "this store was written in the per-event layout of an earlier subagents; \
                     it cannot be read by this version",
                ));
            }
            db.drop_tree(LEGACY_EVENTS)
                .map_err(|e| SubagentError::store_io("dropping tree events", e))?;
        }
        let tree = |name: &str| {
            db.open_tree(name)
                .map_err(|e| SubagentError::store_io(format!("opening tree {name}"), e))
        };
        Ok(Self {
            headers: tree("headers")?,
            heads: tree("heads")?,
            batches: tree("event_batches")?,
            children: tree("children")?,
            cache: tree("projection_cache")?,
            writing: Arc::default(),
            flushes: Arc::default(),
            recent: Arc::new(Mutex::new(RecentLogs::new(RECENT_LOG_BYTES))),
            writes: Arc::default(),
            db,
        })
    }

    /// Serializes the check-then-write of creates, appends and leases in this process (sled's
    /// directory lock keeps other processes out), so compare-and-append needs no transaction.
    fn write_lock(&self) -> MutexGuard<'_, LeaseTable> {
        // Every lease-table change is one map operation: a panic cannot leave it half-done.
        self.writing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The recently created sessions this store holds decoded.
    fn recent(&self) -> MutexGuard<'_, RecentLogs> {
        // Every change is whole before the lock is let go: a panic cannot leave one half-done.
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The session's head. A head without its header is what a crash left of an uncommitted
    /// creation (the header is written last): that session does not exist.
    fn read_head(&self, id: SessionId) -> Result<Head> {
        if let Some((next_seq, lease)) = self.recent().head(id) {
            return Ok(Head { next_seq, lease });
        }
        if !self
            .headers
            .contains_key(id.as_bytes())
            .map_err(io("reading a header"))?
        {
            return Err(not_found(id));
        }
        let stored = self
            .heads
            .get(id.as_bytes())
            .map_err(io("reading a head"))?
            .ok_or_else(|| not_found(id))?;
        Head::decode(id, &stored)
    }

    fn read_header(&self, id: SessionId) -> Result<SessionHeader> {
        if let Some(header) = self.recent().header(id) {
            return Ok(header);
        }
        let bytes = self
            .headers
            .get(id.as_bytes())
            .map_err(|e| SubagentError::store_io(format!("reading header {id}"), e))?
            .ok_or_else(|| not_found(id))?;
        decode_header(id, &bytes)
    }

    /// The listing row of a committed session (its header bytes in hand), or `None` for one that
    /// never appended an event. A header whose head is missing or unreadable is corrupt: the
    /// head is written before the header.
    fn listed(&self, id: SessionId, header: &[u8]) -> Option<ListedSession> {
        let corrupt = |error| ListedSession::Corrupt {
            id: Some(id),
            error,
        };
        match self.read_head(id) {
            Ok(head) if head.next_seq == 0 => return None,
            Ok(_) => {}
            Err(error) if error.code() == ErrorCode::SessionNotFound => {
                return Some(corrupt(SubagentError::new(
                    ErrorCode::StoreCorrupt,
                    format!("session {id}: header without a head"),
                )))
            }
            Err(error) => return Some(corrupt(error)),
        }
        Some(match decode_header(id, header) {
            Ok(header) => ListedSession::Header(header),
            Err(error) => corrupt(error),
        })
    }

    /// Appends `events` at `expected_next_seq` now, on the calling thread (see
    /// [`SessionPersistence::append`]).
    fn append_now(
        &self,
        id: SessionId,
        expected_next_seq: u64,
        events: &[Arc<SessionEvent>],
        lease: Option<LeaseEpoch>,
    ) -> Result<()> {
        check_contiguous(id, expected_next_seq, events)?;
        let Some(encoded) = encode_batch(id, events)? else {
            return Ok(());
        };
        let count =
            u64::try_from(events.len()).map_err(|_| SubagentError::bug("batch too long"))?;
        let bytes = encoded.len();
        let row = compress_batch(encoded);
        let _writing = self.write_lock();
        let head = self.read_head(id)?;
        check_append(id, expected_next_seq, head.next_seq, lease, head.lease)?;
        // The events first, then the head that commits them: a reader trusts events only
        // below the head, so a crash between the two loses the batch whole.
        self.batches
            .insert(event_key(id, expected_next_seq), row)
            .map_err(io("appending events"))?;
        let next_seq = head.next_seq + count;
        self.heads
            .insert(id.as_bytes(), &Head { next_seq, ..head }.encode())
            .map_err(io("committing an append"))?;
        self.recent().appended(id, expected_next_seq, events, bytes);
        Ok(())
    }

    /// Carries `write` out through the store's [`WriteThread`]: here while every write comes
    /// from one thread, else on that thread, behind every write asked for before it.
    fn write<T: Send + 'static>(
        &self,
        write: impl FnOnce(&Self) -> Result<T> + Send + 'static,
    ) -> BoxFuture<'static, Result<T>> {
        if self.writes.here() {
            return Box::pin(future::ready(write(self)));
        }
        let store = self.clone();
        self.writes.queue(move || write(&store))
    }

    /// Writes a new session's records in commit order, stopping after `steps` writes when given
    /// (the failpoint the crash tests use); see the module docs.
    fn write_creation(
        &self,
        header: &SessionHeader,
        events: &[Arc<SessionEvent>],
        steps: Option<usize>,
    ) -> Result<()> {
        self.write_leased_creation(header, events, None, steps)
            .map(drop)
    }

    /// [`SledStore::write_creation`], granting `holder` the new session's first lease in the
    /// same head write.
    fn write_leased_creation(
        &self,
        header: &SessionHeader,
        events: &[Arc<SessionEvent>],
        holder: Option<&LeaseHolder>,
        steps: Option<usize>,
    ) -> Result<Option<Lease>> {
        header.validate()?;
        let first = header.first_stored_seq();
        check_contiguous(header.id, first, events)?;
        let id = header.id;
        let header_bytes = serde_json::to_vec(header)
            .map_err(|e| SubagentError::new(ErrorCode::InvalidHeader, e.to_string()))?;
        let encoded = encode_batch(header.id, events)?;
        // The recent logs are bounded by what their events take encoded, not compressed.
        let encoded_len = encoded.as_ref().map_or(0, Vec::len);
        let row = encoded.map(compress_batch);
        let next_seq = u64::try_from(events.len())
            .ok()
            .and_then(|len| first.checked_add(len))
            .ok_or_else(|| SubagentError::bug("seed too long"))?;
        let mut leases = self.write_lock();
        if self
            .headers
            .contains_key(id.as_bytes())
            .map_err(io("creating a session"))?
        {
            return Err(SubagentError::new(
                ErrorCode::SessionExists,
                format!("session {id} is already stored"),
            ));
        }
        let lease = holder
            .map(|holder| leases.acquire(id, holder, 0))
            .transpose()?;
        let epoch = lease.as_ref().map_or(0, |lease| lease.epoch.0);
        let mut budget = steps.unwrap_or(usize::MAX);
        let mut step = |write: &mut dyn FnMut() -> Result<()>| -> Result<bool> {
            if budget == 0 {
                return Ok(false);
            }
            budget -= 1;
            write().map(|()| true)
        };
        let mut writes = || -> Result<bool> {
            Ok(step(&mut || match &row {
                Some(bytes) => self
                    .batches
                    .insert(event_key(id, first), bytes.as_slice())
                    .map(drop)
                    .map_err(io("writing a seed")),
                None => Ok(()),
            })? && step(&mut || {
                self.heads
                    .insert(
                        id.as_bytes(),
                        &Head {
                            next_seq,
                            lease: epoch,
                        }
                        .encode(),
                    )
                    .map(drop)
                    .map_err(io("writing a head"))
            })? && step(&mut || match header.parent_session {
                Some(parent) => self
                    .children
                    .insert(pair_key(parent, id), &[])
                    .map(drop)
                    .map_err(io("indexing a child")),
                None => Ok(()),
            })? && step(&mut || {
                // The commit point.
                self.headers
                    .insert(id.as_bytes(), header_bytes.as_slice())
                    .map(drop)
                    .map_err(io("writing a header"))
            })?)
        };
        match writes() {
            Ok(written) => {
                if written {
                    let bytes = encoded_len + header_bytes.len();
                    self.recent().created(header, events, bytes, epoch);
                } else {
                    tracing::debug!(session_id = %id, "creation stopped at a failpoint");
                }
                Ok(lease)
            }
            Err(error) => {
                // Nothing was committed: the lease granted with it goes too.
                if let Some(lease) = &lease {
                    leases.release(id, lease.epoch);
                }
                Err(error)
            }
        }
    }
}

fn event_key(id: SessionId, seq: u64) -> [u8; ID_LEN + SEQ_LEN] {
    let mut key = [0; ID_LEN + SEQ_LEN];
    key[..ID_LEN].copy_from_slice(id.as_bytes());
    key[ID_LEN..].copy_from_slice(&seq.to_be_bytes());
    key
}

fn pair_key(first: SessionId, second: SessionId) -> [u8; 2 * ID_LEN] {
    let mut key = [0; 2 * ID_LEN];
    key[..ID_LEN].copy_from_slice(first.as_bytes());
    key[ID_LEN..].copy_from_slice(second.as_bytes());
    key
}

fn cache_key(unit: &str, id: SessionId) -> Vec<u8> {
    let mut key = Vec::with_capacity(unit.len() + 1 + ID_LEN);
    key.extend_from_slice(unit.as_bytes());
    key.push(0);
    key.extend_from_slice(id.as_bytes());
    key
}

/// A session's head record: next seq and lease epoch.
#[derive(Debug, Clone, Copy)]
struct Head {
    next_seq: u64,
    lease: u64,
}

impl Head {
    fn encode(self) -> [u8; 2 * SEQ_LEN] {
        let mut bytes = [0; 2 * SEQ_LEN];
        bytes[..SEQ_LEN].copy_from_slice(&self.next_seq.to_be_bytes());
        bytes[SEQ_LEN..].copy_from_slice(&self.lease.to_be_bytes());
        bytes
    }

    fn decode(id: SessionId, bytes: &[u8]) -> Result<Self> {
        let corrupt = || {
            SubagentError::new(
                ErrorCode::StoreCorrupt,
                format!("session {id}: bad head record"),
            )
        };
        let next: [u8; SEQ_LEN] = bytes
            .get(..SEQ_LEN)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(corrupt)?;
        let lease: [u8; SEQ_LEN] = bytes
            .get(SEQ_LEN..)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(corrupt)?;
        Ok(Self {
            next_seq: u64::from_be_bytes(next),
            lease: u64::from_be_bytes(lease),
        })
    }
}

fn id_from_key(key: &[u8]) -> Option<SessionId> {
    let bytes: [u8; ID_LEN] = key.get(..ID_LEN)?.try_into().ok()?;
    Some(SessionId::from_uuid(uuid::Uuid::from_bytes(bytes)))
}

fn io(what: &'static str) -> impl Fn(sled::Error) -> SubagentError {
    move |error| SubagentError::store_io(what, error)
}

impl SessionPersistence for SledStore {
    fn create(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
    ) -> BoxFuture<'_, Result<()>> {
        self.write(move |store| store.write_creation(&header, &events, None))
    }

    fn create_leased(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
        holder: LeaseHolder,
    ) -> BoxFuture<'_, Result<Lease>> {
        self.write(move |store| {
            store
                .write_leased_creation(&header, &events, Some(&holder), None)
                .and_then(super::granted)
        })
    }

    fn append(
        &self,
        id: SessionId,
        expected_next_seq: u64,
        events: Vec<Arc<SessionEvent>>,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        self.write(move |store| store.append_now(id, expected_next_seq, &events, lease))
    }

    fn flush(&self, id: SessionId) -> BoxFuture<'_, Result<()>> {
        // One fsync of the whole database at a time, shared by everyone it covers.
        Box::pin(self.flushes.flush_session(id, || {
            let db = self.db.clone();
            async move {
                db.flush_async()
                    .await
                    .map(drop)
                    .map_err(|e| SubagentError::store_io("flushing the store", e))
            }
            .boxed()
        }))
    }

    fn one_shot_disposed(&self, id: SessionId) {
        // Never read again by the runtime: its place among the recent logs goes to others.
        self.recent().forget(id);
    }

    fn size_on_disk(&self) -> Option<u64> {
        self.db.size_on_disk().ok()
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        let mut rows = Vec::new();
        let outcome = self.headers.iter().try_for_each(|row| {
            let (key, bytes) = row.map_err(|e| SubagentError::store_io("listing sessions", e))?;
            match id_from_key(&key) {
                Some(id) if key.len() == ID_LEN => rows.extend(self.listed(id, &bytes)),
                _ => rows.push(ListedSession::Corrupt {
                    id: None,
                    error: SubagentError::new(
                        ErrorCode::StoreCorrupt,
                        "header key is not a session id",
                    ),
                }),
            }
            Ok(())
        });
        Box::pin(future::ready(outcome.map(|()| rows)))
    }

    fn list_children(&self, parent: SessionId) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        let mut rows = Vec::new();
        let outcome = self
            .children
            .scan_prefix(parent.as_bytes())
            .try_for_each(|row| {
                let (key, _) = row.map_err(|e| SubagentError::store_io("listing children", e))?;
                let Some(child) = key.get(ID_LEN..).and_then(id_from_key) else {
                    rows.push(ListedSession::Corrupt {
                        id: None,
                        error: SubagentError::new(
                            ErrorCode::StoreCorrupt,
                            "child index key is malformed",
                        ),
                    });
                    return Ok(());
                };
                let header = self
                    .headers
                    .get(child.as_bytes())
                    .map_err(|e| SubagentError::store_io(format!("reading header {child}"), e))?;
                // No header: a creation that never reached its commit point.
                if let Some(header) = header {
                    rows.extend(self.listed(child, &header));
                }
                Ok(())
            });
        Box::pin(future::ready(outcome.map(|()| rows)))
    }

    fn header(&self, id: SessionId) -> BoxFuture<'_, Result<SessionHeader>> {
        Box::pin(future::ready(self.read_header(id)))
    }

    fn read_stored(
        &self,
        id: SessionId,
        from_seq: u64,
        before_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Arc<SessionEvent>>>> {
        if let Some(events) = self.recent().read(id, from_seq, before_seq) {
            return Box::pin(future::ready(Ok(events)));
        }
        let outcome = (|| {
            // The head is the commit point: events at or past it are an unfinished append.
            let next_seq = self.read_head(id)?.next_seq.min(before_seq);
            if from_seq >= next_seq {
                return Ok(Vec::new());
            }
            // The batch holding `from_seq` starts at or before it.
            let first = self
                .batches
                .range(event_key(id, 0)..=event_key(id, from_seq))
                .next_back()
                .transpose()
                .map_err(|e| SubagentError::store_io(format!("reading session {id}"), e))?
                .map_or_else(|| event_key(id, 0).to_vec(), |(key, _)| key.to_vec());
            let start_of = |key: &[u8]| {
                key.get(ID_LEN..)
                    .and_then(|seq| <[u8; SEQ_LEN]>::try_from(seq).ok())
                    .map(u64::from_be_bytes)
            };
            let mut rows = self
                .batches
                .range(first..event_key(id, next_seq).to_vec())
                .map(|row| {
                    let (key, bytes) = row
                        .map_err(|e| SubagentError::store_io(format!("reading session {id}"), e))?;
                    Ok((start_of(&key), bytes.to_vec()))
                })
                .peekable();
            if rows.peek().is_none() {
                // Nothing in range: a range inside a seed stored by reference, or lost rows.
                let first_stored = self
                    .batches
                    .scan_prefix(id.as_bytes())
                    .next()
                    .transpose()
                    .map_err(|e| SubagentError::store_io(format!("reading session {id}"), e))?
                    .and_then(|(key, _)| start_of(&key));
                if before_the_stored_log(first_stored, next_seq) {
                    return Ok(Vec::new());
                }
            }
            let events = assemble(id, from_seq, next_seq, rows)?;
            Ok(events)
        })();
        Box::pin(future::ready(outcome))
    }

    fn acquire_lease(&self, id: SessionId, holder: LeaseHolder) -> BoxFuture<'_, Result<Lease>> {
        let outcome = (|| {
            let mut leases = self.write_lock();
            let head = self.read_head(id)?;
            let lease = leases.acquire(id, &holder, head.lease)?;
            let durable = Head {
                lease: lease.epoch.0,
                ..head
            };
            if let Err(error) = self.heads.insert(id.as_bytes(), &durable.encode()) {
                leases.release(id, lease.epoch);
                return Err(SubagentError::store_io("acquiring a lease", error));
            }
            self.recent().leased(id, lease.epoch.0);
            Ok(lease)
        })();
        Box::pin(future::ready(outcome))
    }

    fn renew_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        Box::pin(future::ready(self.write_lock().renew(id, epoch)))
    }

    fn release_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        self.write_lock().release(id, epoch);
        Box::pin(future::ready(Ok(())))
    }

    fn cache_get(&self, unit: &str, id: SessionId) -> BoxFuture<'_, Result<Option<Value>>> {
        let outcome = self.cache_bytes(unit, id).and_then(|row| {
            row.map(|bytes| decode_cache_row(unit, id, &bytes))
                .transpose()
        });
        Box::pin(future::ready(outcome))
    }

    fn cache_get_encoded(
        &self,
        unit: &str,
        id: SessionId,
    ) -> BoxFuture<'_, Result<Option<EncodedRow>>> {
        let outcome = self
            .cache_bytes(unit, id)
            .map(|row| row.map(|bytes| EncodedRow::stored(bytes.to_vec())));
        Box::pin(future::ready(outcome))
    }

    fn cache_put(
        &self,
        unit: &str,
        id: SessionId,
        row: Value,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        put_value_row(self, unit, id, &row, lease)
    }

    fn cache_put_encoded(
        &self,
        unit: &str,
        id: SessionId,
        row: EncodedRow,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        let key = cache_key(unit, id);
        self.write(move |store| {
            // Under the writer lock, as an append: a fenced row lands only under the current
            // epoch.
            let _writing = lease.map(|_| store.write_lock());
            if let Some(LeaseEpoch(epoch)) = lease {
                if store.read_head(id)?.lease != epoch {
                    return Err(super::lease::lease_lost(id));
                }
            }
            store
                .cache
                .insert(key, row.into_bytes())
                .map(drop)
                .map_err(|e| SubagentError::store_io("writing the projection cache", e))
        })
    }
}

#[cfg(test)]
mod tests {
    use futures::executor::block_on;

    use super::*;
    use crate::content::Message;
    use crate::session::EventKind;

    fn seed() -> Vec<Arc<SessionEvent>> {
        vec![Arc::new(SessionEvent::new(
            0,
            EventKind::UserMessage(Message::user(
                vec![crate::content::ContentBlock::text("seed")],
                crate::content::MessageSource::User,
            )),
        ))]
    }

    /// What the recent logs answer is what the rows say: random creates, appends (stale ones
    /// too, fenced or not), lease grants, disposals and reads on a store whose recent logs
    /// hold only a few sessions, each read also made on a clone of the store that holds none
    /// (the same database), so evictions, refused appends and moved leases are all compared.
    mod recent_logs_agree_with_the_rows {
        use proptest::prelude::*;

        use super::*;
        use crate::store::recent_logs::tests::events;

        #[derive(Debug, Clone)]
        enum Op {
            Create {
                session: usize,
                seeded: u64,
            },
            Append {
                session: usize,
                count: u64,
                stale: bool,
                fenced: bool,
            },
            Lease {
                session: usize,
            },
            Disposed {
                session: usize,
            },
            Read {
                session: usize,
                from: u64,
                len: u64,
            },
        }

        fn op() -> impl Strategy<Value = Op> {
            let session = 0..4usize;
            prop_oneof![
                (session.clone(), 0..3u64)
                    .prop_map(|(session, seeded)| Op::Create { session, seeded }),
                (
                    session.clone(),
                    1..4u64,
                    proptest::bool::weighted(0.2),
                    any::<bool>()
                )
                    .prop_map(|(session, count, stale, fenced)| Op::Append {
                        session,
                        count,
                        stale,
                        fenced
                    }),
                session.clone().prop_map(|session| Op::Lease { session }),
                session.clone().prop_map(|session| Op::Disposed { session }),
                (session, 0..12u64, 0..12u64).prop_map(|(session, from, len)| Op::Read {
                    session,
                    from,
                    len
                }),
            ]
        }

        /// The store's state as it answers for one session: header, head, own log.
        type Answers = (
            Result<SessionHeader>,
            Result<(u64, u64)>,
            Result<Vec<Arc<SessionEvent>>>,
        );

        fn answers(store: &SledStore, id: SessionId) -> Answers {
            (
                store.read_header(id),
                store.read_head(id).map(|head| (head.next_seq, head.lease)),
                block_on(store.read_stored(id, 0, u64::MAX)),
            )
        }

        fn same<T: PartialEq + std::fmt::Debug>(held: &Result<T>, rows: &Result<T>) {
            match (held, rows) {
                (Ok(held), Ok(rows)) => assert_eq!(held, rows),
                (Err(held), Err(rows)) => assert_eq!(held.code(), rows.code()),
                _ => panic!("held {held:?}, rows {rows:?}"),
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
            #[test]
            fn under_any_history(ops in proptest::collection::vec(op(), 1..40)) {
                let rows = SledStore::temporary().unwrap();
                // Room for about two sessions' logs: most histories evict.
                let store = SledStore { recent: Arc::new(Mutex::new(RecentLogs::new(900))), ..rows.clone() };
                let rows = SledStore { recent: Arc::new(Mutex::new(RecentLogs::new(0))), ..rows };
                let ids: Vec<SessionId> = (0..4).map(|_| SessionId::new()).collect();
                let holder = LeaseHolder::new();
                let mut next = [None::<u64>; 4];
                let mut lease = [None::<LeaseEpoch>; 4];
                for op in ops {
                    match op {
                        Op::Create { session, seeded } => {
                            let created = block_on(store.create(SessionHeader::new(ids[session]), events(0, seeded)));
                            prop_assert_eq!(created.is_ok(), next[session].is_none());
                            next[session].get_or_insert(seeded);
                        }
                        Op::Append { session, count, stale, fenced } => {
                            let at = next[session].unwrap_or(0) + u64::from(stale);
                            let fence = if fenced { lease[session] } else { None };
                            let appended = block_on(store.append(ids[session], at, events(at, count), fence));
                            if appended.is_ok() {
                                next[session] = Some(at + count);
                            }
                            prop_assert_eq!(appended.is_ok(), next[session].is_some() && !stale);
                        }
                        Op::Lease { session } => {
                            if let Ok(granted) = block_on(store.acquire_lease(ids[session], holder.clone())) {
                                lease[session] = Some(granted.epoch);
                            }
                        }
                        Op::Disposed { session } => store.one_shot_disposed(ids[session]),
                        Op::Read { session, from, len } => {
                            let id = ids[session];
                            let held = block_on(store.read_stored(id, from, from + len));
                            same(&held, &block_on(rows.read_stored(id, from, from + len)));
                        }
                    }
                    for id in &ids {
                        let (header, head, log) = answers(&store, *id);
                        let (row_header, row_head, row_log) = answers(&rows, *id);
                        same(&header, &row_header);
                        same(&head, &row_head);
                        same(&log, &row_log);
                    }
                }
            }
        }
    }

    // A reader's bounded page cache reads back everything written with the default one.
    #[test]
    fn a_store_reopened_with_a_small_cache_reads_the_same_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let sessions: Vec<(SessionId, Vec<Arc<SessionEvent>>)> =
            (0..200).map(|_| (SessionId::new(), seed())).collect();
        {
            let store = SledStore::open(dir.path()).unwrap();
            for (id, events) in &sessions {
                block_on(store.create(SessionHeader::new(*id), events.clone())).unwrap();
            }
        }
        let store = SledStore::open_with_cache_capacity(dir.path(), 1 << 20).unwrap();
        let listed = block_on(store.list()).unwrap();
        assert_eq!(listed.len(), sessions.len());
        for (id, events) in &sessions {
            assert_eq!(&block_on(store.read_from(*id, 0)).unwrap(), events);
        }
    }

    /// A crash between any two of creation's writes leaves either nothing visible or the whole
    /// session: never a corrupt listing row, and the id can be created again.
    #[test]
    fn a_creation_stopped_between_any_two_writes_leaves_nothing_visible() {
        let parent = SessionId::new();
        for steps in 0..4 {
            let store = SledStore::temporary().unwrap();
            let child = SessionId::new();
            let mut header = SessionHeader::new(child);
            header.parent_session = Some(parent);
            store.write_creation(&header, &seed(), Some(steps)).unwrap();
            assert!(
                block_on(store.list()).unwrap().is_empty(),
                "{steps} writes: nothing listed"
            );
            assert!(
                block_on(store.list_children(parent)).unwrap().is_empty(),
                "{steps} writes: no child row, not even a corrupt one"
            );
            assert_eq!(
                block_on(store.header(child)).unwrap_err().code(),
                ErrorCode::SessionNotFound
            );
            block_on(store.create(header, seed())).expect("the id is free to create");
            let children = block_on(store.list_children(parent)).unwrap();
            assert_eq!(children.len(), 1);
            assert!(children[0].header().is_some(), "{steps} writes: a good row");
        }
    }

    /// `count` user messages from seq `first`: a batch long enough to be stored compressed.
    fn messages(first: u64, count: u64) -> Vec<Arc<SessionEvent>> {
        (first..first + count)
            .map(|seq| {
                Arc::new(SessionEvent::new(
                    seq,
                    EventKind::UserMessage(Message::user(
                        vec![crate::content::ContentBlock::text(format!("message {seq}"))],
                        crate::content::MessageSource::User,
                    )),
                ))
            })
            .collect()
    }

    /// A session's seed and appends are stored compressed, at about half their JSON's bytes,
    /// and a store opened again reads them back.
    #[test]
    fn batches_are_stored_compressed_and_read_back_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let id = SessionId::new();
        let seeded = messages(0, 8);
        let appended = messages(8, 8);
        {
            let store = SledStore::open(dir.path()).unwrap();
            block_on(store.create(SessionHeader::new(id), seeded.clone())).unwrap();
            block_on(store.append(id, 8, appended.clone(), None)).unwrap();
            for (events, key) in [(&seeded, event_key(id, 0)), (&appended, event_key(id, 8))] {
                let row = store
                    .batches
                    .get(key)
                    .unwrap()
                    .expect("the batch is stored");
                let json = encode_batch(id, events).unwrap().unwrap();
                assert_eq!(
                    row.first(),
                    Some(&crate::store::codec::LZ4_BATCH),
                    "stored compressed"
                );
                assert!(
                    row.len() * 10 < json.len() * 7,
                    "{} of {}",
                    row.len(),
                    json.len()
                );
            }
        }
        let store = SledStore::open(dir.path()).unwrap();
        let read = block_on(store.read_from(id, 0)).unwrap();
        assert_eq!(read, [seeded, appended].concat());
    }

    /// Once writes come from two threads they go through the store's write thread: each
    /// thread's creations and appends land in the order it asked for them, a stale epoch is
    /// still refused, and a store opened again after the last handle went reads back every
    /// write (the thread ran what was queued before the database closed).
    #[test]
    fn writes_from_two_threads_land_in_order_and_outlive_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        let writer = |store: SledStore| {
            move || {
                let id = SessionId::new();
                let events = messages(0, 22);
                let created = store.create_leased(
                    SessionHeader::new(id),
                    events[..1].to_vec(),
                    LeaseHolder::new(),
                );
                let lease = block_on(created).unwrap();
                // Each append asked for without waiting for the one before it.
                let appends: Vec<_> = (1..=20)
                    .map(|seq| {
                        let event = vec![Arc::clone(&events[seq])];
                        store.append(id, seq as u64, event, Some(lease.epoch))
                    })
                    .collect();
                for append in appends {
                    block_on(append).unwrap();
                }
                let stale = LeaseEpoch(lease.epoch.0 + 1);
                let refused = block_on(store.append(id, 21, events[21..].to_vec(), Some(stale)));
                assert_eq!(refused.unwrap_err().code(), ErrorCode::LeaseLost);
                (id, events[..21].to_vec())
            }
        };
        let first = std::thread::spawn(writer(store.clone()));
        let second = std::thread::spawn(writer(store.clone()));
        let written = [first.join().unwrap(), second.join().unwrap()];
        assert!(store.writes.is_started(), "the writes were queued");
        drop(store);
        let store = SledStore::open(dir.path()).unwrap();
        for (id, events) in written {
            assert_eq!(block_on(store.read_from(id, 0)).unwrap(), events);
        }
    }

    /// Rows a store kept plain before batches were compressed read back beside compressed ones.
    #[test]
    fn plain_rows_of_an_earlier_version_read_back_beside_compressed_ones() {
        let store = SledStore::temporary().unwrap();
        let id = SessionId::new();
        let seeded = messages(0, 8);
        block_on(store.create(SessionHeader::new(id), seeded.clone())).unwrap();
        let plain = encode_batch(id, &seeded).unwrap().unwrap();
        store.batches.insert(event_key(id, 0), plain).unwrap();
        let appended = messages(8, 8);
        block_on(store.append(id, 8, appended.clone(), None)).unwrap();
        // Read from the rows, as a store opened afterwards would.
        store.recent().forget(id);
        let read = block_on(store.read_from(id, 0)).unwrap();
        assert_eq!(read, [seeded, appended].concat());
    }

    #[test]
    fn a_header_without_a_head_is_listed_as_corrupt() {
        let store = SledStore::temporary().unwrap();
        let id = SessionId::new();
        block_on(store.create(SessionHeader::new(id), seed())).unwrap();
        store.heads.remove(id.as_bytes()).unwrap();
        // Damage is found on disk: as a store opened afterwards, which holds nothing decoded.
        store.recent().forget(id);
        let listed = block_on(store.list()).unwrap();
        assert!(matches!(
            &listed[..],
            [ListedSession::Corrupt { id: Some(bad), error }]
                if *bad == id && error.code() == ErrorCode::StoreCorrupt
        ));
    }
}
