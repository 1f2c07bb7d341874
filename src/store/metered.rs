//! Provides [`MeteredStore`]: the store of a runtime built with a meter, which times every
//! append and flush and counts the leases it grants over a lapsed holder
//! ([`crate::metrics`]). Every other call goes straight to the store it wraps, overridden
//! defaults included, so a backend's own reads and repairs stay its own.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use serde_json::Value;

use super::{
    EncodedRow, Lease, LeaseEpoch, LeaseHolder, ListedSession, OwnEvents, SessionPersistence,
    SharedStore, StoredSession,
};
use crate::error::Result;
use crate::ids::SessionId;
use crate::metrics::Metrics;
use crate::session::{SessionEvent, SessionHeader};

/// A store whose appends, flushes and lease grants are recorded in a runtime's metrics.
pub(crate) struct MeteredStore {
    inner: SharedStore,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    /// `inner`, recorded in `metrics`.
    pub(crate) fn wrap(inner: SharedStore, metrics: Arc<Metrics>) -> SharedStore {
        Arc::new(Self { inner, metrics })
    }

    fn granted(&self, lease: Result<Lease>) -> Result<Lease> {
        if lease.as_ref().is_ok_and(|lease| lease.taken_over) {
            self.metrics.lease_taken_over();
        }
        lease
    }
}

impl SessionPersistence for MeteredStore {
    fn create(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
    ) -> BoxFuture<'_, Result<()>> {
        self.inner.create(header, events)
    }

    fn create_leased(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
        holder: LeaseHolder,
    ) -> BoxFuture<'_, Result<Lease>> {
        self.inner.create_leased(header, events, holder)
    }

    fn append(
        &self,
        id: SessionId,
        expected_next_seq: u64,
        events: Vec<Arc<SessionEvent>>,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let began = Instant::now();
            let appended = self
                .inner
                .append(id, expected_next_seq, events, lease)
                .await;
            self.metrics.append(&appended, began);
            appended
        })
    }

    fn flush(&self, id: SessionId) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let began = Instant::now();
            let flushed = self.inner.flush(id).await;
            self.metrics.flush(&flushed, began);
            flushed
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        self.inner.list()
    }

    fn list_children(&self, parent: SessionId) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        self.inner.list_children(parent)
    }

    fn header(&self, id: SessionId) -> BoxFuture<'_, Result<SessionHeader>> {
        self.inner.header(id)
    }

    fn read_stored(
        &self,
        id: SessionId,
        from_seq: u64,
        before_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Arc<SessionEvent>>>> {
        self.inner.read_stored(id, from_seq, before_seq)
    }

    fn read_from(
        &self,
        id: SessionId,
        from_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Arc<SessionEvent>>>> {
        self.inner.read_from(id, from_seq)
    }

    fn read_between(
        &self,
        id: SessionId,
        from_seq: u64,
        before_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Arc<SessionEvent>>>> {
        self.inner.read_between(id, from_seq, before_seq)
    }

    fn acquire_lease(&self, id: SessionId, holder: LeaseHolder) -> BoxFuture<'_, Result<Lease>> {
        Box::pin(async move { self.granted(self.inner.acquire_lease(id, holder).await) })
    }

    fn acquire_lease_with_length(
        &self,
        id: SessionId,
        holder: LeaseHolder,
    ) -> BoxFuture<'_, Result<(Lease, Option<u64>)>> {
        Box::pin(async move {
            let (lease, stored_len) = self.inner.acquire_lease_with_length(id, holder).await?;
            Ok((self.granted(Ok(lease))?, stored_len))
        })
    }

    fn renew_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        self.inner.renew_lease(id, epoch)
    }

    fn release_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        self.inner.release_lease(id, epoch)
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
        self.inner.cache_put(unit, id, row, lease)
    }

    fn cache_put_encoded(
        &self,
        unit: &str,
        id: SessionId,
        row: EncodedRow,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        self.inner.cache_put_encoded(unit, id, row, lease)
    }

    fn one_shot_disposed(&self, id: SessionId) {
        self.inner.one_shot_disposed(id);
    }

    fn size_on_disk(&self) -> Option<u64> {
        self.inner.size_on_disk()
    }

    fn inspect(&self, id: SessionId) -> BoxFuture<'_, Result<StoredSession>> {
        self.inner.inspect(id)
    }

    fn read_own(&self, id: SessionId) -> BoxFuture<'_, Result<OwnEvents>> {
        self.inner.read_own(id)
    }

    fn inspect_own(&self, id: SessionId) -> BoxFuture<'_, Result<OwnEvents>> {
        self.inner.inspect_own(id)
    }

    fn prepare(
        &self,
        id: SessionId,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<StoredSession>> {
        self.inner.prepare(id, lease)
    }

    fn prepare_inspected(
        &self,
        id: SessionId,
        lease: Option<LeaseEpoch>,
        inspected: StoredSession,
        stored_len: Option<u64>,
    ) -> BoxFuture<'_, Result<StoredSession>> {
        self.inner
            .prepare_inspected(id, lease, inspected, stored_len)
    }
}
