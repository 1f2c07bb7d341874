//! Provides [`FaultInjectingStore`]: a [`SessionPersistence`] wrapper that fails chosen
//! operations on demand (of every session, or of one), or holds them until released, so tests
//! reach the error paths of every store I/O, the backpressure of a slow store, and the calls a
//! caller abandons while they wait.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::future::{self, BoxFuture};
use serde_json::Value;

use super::{
    EncodedRow, Lease, LeaseEpoch, LeaseHolder, ListedSession, OwnEvents, SessionPersistence,
    SharedStore, StoredSession,
};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::session::{SessionEvent, SessionHeader};

/// A store operation that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreOperation {
    /// [`SessionPersistence::create`].
    Create,
    /// [`SessionPersistence::append`].
    Append,
    /// [`SessionPersistence::flush`].
    Flush,
    /// [`SessionPersistence::read_from`] and [`SessionPersistence::header`].
    Read,
    /// [`SessionPersistence::inspect`] and [`SessionPersistence::inspect_own`] (an inspection,
    /// and a listing's read of a cold child).
    Inspect,
    /// [`SessionPersistence::acquire_lease`].
    AcquireLease,
    /// [`SessionPersistence::renew_lease`].
    RenewLease,
    /// [`SessionPersistence::release_lease`].
    ReleaseLease,
    /// [`SessionPersistence::cache_put`] (a projection checkpoint).
    CachePut,
}

/// Wraps a store; each armed operation fails with `STORE_IO` until disarmed, and each held
/// operation waits until released.
pub struct FaultInjectingStore {
    inner: SharedStore,
    /// Armed operations: of every session (`None`) or of one.
    armed: Mutex<HashSet<(StoreOperation, Option<SessionId>)>>,
    held: tokio::sync::watch::Sender<HashSet<StoreOperation>>,
    /// How many calls have waited at a hold so far.
    waited: tokio::sync::watch::Sender<usize>,
    /// How many held calls were dropped before their hold was released.
    abandoned: Arc<AtomicUsize>,
    flushes: AtomicUsize,
    /// Every projection cache row written: its unit and session, in order.
    cache_puts: Mutex<Vec<(String, SessionId)>>,
    /// How many stored events were read of each session, and the most one read returned.
    events_read: Mutex<HashMap<SessionId, (usize, usize)>>,
}

/// Counts a held call dropped before it got through its hold.
struct Abandonment {
    count: Arc<AtomicUsize>,
    passed: bool,
}

impl Drop for Abandonment {
    fn drop(&mut self) {
        if !self.passed {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl FaultInjectingStore {
    /// Wraps `inner` with nothing armed.
    pub fn new(inner: SharedStore) -> Self {
        Self {
            inner,
            armed: Mutex::new(HashSet::new()),
            held: tokio::sync::watch::Sender::new(HashSet::new()),
            waited: tokio::sync::watch::Sender::new(0),
            abandoned: Arc::default(),
            flushes: AtomicUsize::new(0),
            cache_puts: Mutex::default(),
            events_read: Mutex::default(),
        }
    }

    /// Makes `operation` wait (before reaching the inner store) until [`FaultInjectingStore::release`].
    pub fn hold(&self, operation: StoreOperation) {
        self.held.send_modify(|held| {
            held.insert(operation);
        });
    }

    /// Lets held calls of `operation`, and later ones, through.
    pub fn release(&self, operation: StoreOperation) {
        self.held.send_modify(|held| {
            held.remove(&operation);
        });
    }

    /// Resolves once `count` calls in all have waited at a hold, so a test knows a held call
    /// is really held.
    pub async fn held_calls(&self, count: usize) {
        let mut waited = self.waited.subscribe();
        // The sender lives in `self`, which this future borrows.
        let _ = waited.wait_for(|waited| *waited >= count).await;
    }

    /// Runs `call` once `operation` is not held.
    fn gated<'a, T: Send + 'a>(
        &'a self,
        operation: StoreOperation,
        call: impl FnOnce() -> BoxFuture<'a, Result<T>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T>> {
        if !self.held.borrow().contains(&operation) {
            return call();
        }
        let mut released = self.held.subscribe();
        self.waited.send_modify(|waited| *waited += 1);
        let abandonment = Abandonment {
            count: Arc::clone(&self.abandoned),
            passed: false,
        };
        Box::pin(async move {
            // Moved whole, so the guard lives exactly as long as this call.
            let mut abandonment = abandonment;
            // The sender lives as long as `self`, which this future borrows.
            let _ = released.wait_for(|held| !held.contains(&operation)).await;
            abandonment.passed = true;
            call().await
        })
    }

    /// How many held calls their callers dropped before the hold was released.
    pub fn abandoned_calls(&self) -> usize {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// The projection units whose cache row was written for `id`, in the order written (a unit
    /// written twice appears twice).
    pub fn cache_puts(&self, id: SessionId) -> Vec<String> {
        self.cache_puts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, session)| *session == id)
            .map(|(unit, _)| unit.clone())
            .collect()
    }

    /// How many stored events of `id` were read so far ([`SessionPersistence::read_stored`]
    /// through this store), so a test can tell what a reader had to decode.
    pub fn events_read(&self, id: SessionId) -> usize {
        self.reads_of(id).0
    }

    /// The most stored events of `id` one read returned, so a test can tell how much of a
    /// log its reader held at once.
    pub fn largest_read(&self, id: SessionId) -> usize {
        self.reads_of(id).1
    }

    fn reads_of(&self, id: SessionId) -> (usize, usize) {
        self.events_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .copied()
            .unwrap_or_default()
    }

    /// How many flushes were asked for (armed or not).
    pub fn flush_count(&self) -> usize {
        self.flushes.load(Ordering::SeqCst)
    }

    /// Makes `operation` fail, for every session, until [`FaultInjectingStore::disarm`].
    pub fn arm(&self, operation: StoreOperation) {
        self.lock().insert((operation, None));
    }

    /// Makes `operation` fail for session `id` only (creates are never per session).
    pub fn arm_for(&self, operation: StoreOperation, id: SessionId) {
        self.lock().insert((operation, Some(id)));
    }

    /// Lets `operation` through again, for every session it was armed for.
    pub fn disarm(&self, operation: StoreOperation) {
        self.lock().retain(|(armed, _)| *armed != operation);
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<(StoreOperation, Option<SessionId>)>> {
        self.armed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn injected<T: Send + 'static>(
        &self,
        operation: StoreOperation,
        id: Option<SessionId>,
    ) -> Option<BoxFuture<'static, Result<T>>> {
        let armed = self.lock();
        let hit = armed.contains(&(operation, None))
            || id.is_some_and(|id| armed.contains(&(operation, Some(id))));
        hit.then(|| {
            let error = SubagentError::new(
                ErrorCode::StoreIo,
                format!("injected {operation:?} failure"),
            );
            Box::pin(future::ready(Err(error))) as BoxFuture<'static, Result<T>>
        })
    }
}

impl SessionPersistence for FaultInjectingStore {
    fn create(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
    ) -> BoxFuture<'_, Result<()>> {
        self.injected(StoreOperation::Create, None)
            .unwrap_or_else(|| {
                self.gated(StoreOperation::Create, move || {
                    self.inner.create(header, events)
                })
            })
    }

    /// Atomic as the inner store's: an armed create or lease fails it before anything is
    /// written, and a held create holds it whole.
    fn create_leased(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
        holder: LeaseHolder,
    ) -> BoxFuture<'_, Result<Lease>> {
        let id = header.id;
        self.injected(StoreOperation::Create, None)
            .or_else(|| self.injected(StoreOperation::AcquireLease, Some(id)))
            .unwrap_or_else(|| {
                self.gated(StoreOperation::Create, move || {
                    self.inner.create_leased(header, events, holder)
                })
            })
    }

    fn append(
        &self,
        id: SessionId,
        expected_next_seq: u64,
        events: Vec<Arc<SessionEvent>>,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        self.injected(StoreOperation::Append, Some(id))
            .unwrap_or_else(|| {
                self.gated(StoreOperation::Append, move || {
                    self.inner.append(id, expected_next_seq, events, lease)
                })
            })
    }

    fn flush(&self, id: SessionId) -> BoxFuture<'_, Result<()>> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.injected(StoreOperation::Flush, Some(id))
            .unwrap_or_else(|| self.gated(StoreOperation::Flush, move || self.inner.flush(id)))
    }

    fn size_on_disk(&self) -> Option<u64> {
        self.inner.size_on_disk()
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        self.inner.list()
    }

    fn list_children(&self, parent: SessionId) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        self.inner.list_children(parent)
    }

    fn header(&self, id: SessionId) -> BoxFuture<'_, Result<SessionHeader>> {
        self.injected(StoreOperation::Read, Some(id))
            .unwrap_or_else(|| self.inner.header(id))
    }

    fn read_stored(
        &self,
        id: SessionId,
        from_seq: u64,
        before_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Arc<SessionEvent>>>> {
        self.injected(StoreOperation::Read, Some(id))
            .unwrap_or_else(|| {
                Box::pin(async move {
                    let events = self.inner.read_stored(id, from_seq, before_seq).await?;
                    let mut reads = self
                        .events_read
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    let (total, largest) = reads.entry(id).or_default();
                    *total += events.len();
                    *largest = (*largest).max(events.len());
                    drop(reads);
                    Ok(events)
                })
            })
    }

    fn acquire_lease(&self, id: SessionId, holder: LeaseHolder) -> BoxFuture<'_, Result<Lease>> {
        self.injected(StoreOperation::AcquireLease, Some(id))
            .unwrap_or_else(|| {
                self.gated(StoreOperation::AcquireLease, move || {
                    self.inner.acquire_lease(id, holder)
                })
            })
    }

    fn renew_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        self.injected(StoreOperation::RenewLease, Some(id))
            .unwrap_or_else(|| {
                self.gated(StoreOperation::RenewLease, move || {
                    self.inner.renew_lease(id, epoch)
                })
            })
    }

    fn release_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        self.injected(StoreOperation::ReleaseLease, Some(id))
            .unwrap_or_else(|| {
                self.gated(StoreOperation::ReleaseLease, move || {
                    self.inner.release_lease(id, epoch)
                })
            })
    }

    fn inspect(&self, id: SessionId) -> BoxFuture<'_, Result<StoredSession>> {
        self.injected(StoreOperation::Inspect, Some(id))
            .unwrap_or_else(|| {
                self.gated(StoreOperation::Inspect, move || {
                    Box::pin(super::inspection(self, id))
                })
            })
    }

    fn inspect_own(&self, id: SessionId) -> BoxFuture<'_, Result<OwnEvents>> {
        self.injected(StoreOperation::Inspect, Some(id))
            .unwrap_or_else(|| {
                self.gated(StoreOperation::Inspect, move || {
                    Box::pin(super::own_inspection(self, id))
                })
            })
    }

    fn cache_get(&self, unit: &str, id: SessionId) -> BoxFuture<'_, Result<Option<Value>>> {
        self.inner.cache_get(unit, id)
    }

    fn cache_get_encoded(
        &self,
        unit: &str,
        id: SessionId,
    ) -> BoxFuture<'_, Result<Option<EncodedRow>>> {
        self.inner.cache_get_encoded(unit, id)
    }

    fn cache_put(
        &self,
        unit: &str,
        id: SessionId,
        row: Value,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        super::codec::put_value_row(self, unit, id, &row, lease)
    }

    fn cache_put_encoded(
        &self,
        unit: &str,
        id: SessionId,
        row: EncodedRow,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        self.cache_puts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((unit.to_owned(), id));
        let unit = unit.to_owned();
        self.injected(StoreOperation::CachePut, Some(id))
            .unwrap_or_else(|| {
                self.gated(StoreOperation::CachePut, move || {
                    Box::pin(
                        async move { self.inner.cache_put_encoded(&unit, id, row, lease).await },
                    )
                })
            })
    }
}
