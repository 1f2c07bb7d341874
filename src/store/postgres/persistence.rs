//! [`SessionPersistence`] over a [`PostgresStore`]: compare-and-appends, reads, creations, lease
//! grants and releases batched (each append still one compare, batch and head move), flushes as
//! synchronous commits shared by every flush asked while one is in flight.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use super::appends::AppendRequest;
use super::cache_puts::CachePutRequest;
use super::leases::LeaseRequest;
use super::reads::ReadRequest;
use super::reconnect::reconnecting;
use super::{connection, io, seq_column, uuid_of, PostgresStore, FLUSH_SLOTS};
use crate::error::Result;
use crate::ids::SessionId;
use crate::session::{SessionEvent, SessionHeader};
use crate::store::codec::{decode_cache_row, encode_batch, put_value_row};
use crate::store::lease::{lease_lost, Lease, LeaseEpoch, LeaseHolder};
use crate::store::{
    check_contiguous, granted, inspected, inspection, EncodedRow, ListedSession,
    SessionPersistence, StoredSession,
};

impl SessionPersistence for PostgresStore {
    fn create(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
    ) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { self.write_creation(header, events, None).await.map(drop) })
    }

    fn create_leased(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
        holder: LeaseHolder,
    ) -> BoxFuture<'_, Result<Lease>> {
        Box::pin(async move { granted(self.write_creation(header, events, Some(holder)).await?) })
    }

    fn append(
        &self,
        id: SessionId,
        expected_next_seq: u64,
        events: Vec<Arc<SessionEvent>>,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            check_contiguous(id, expected_next_seq, &events)?;
            let Some(encoded) = encode_batch(id, &events)? else {
                return Ok(());
            };
            let count = u64::try_from(events.len()).unwrap_or(u64::MAX);
            let request = AppendRequest {
                id,
                expected: seq_column(expected_next_seq)?,
                next: seq_column(expected_next_seq.saturating_add(count))?,
                epoch: lease
                    .map(|LeaseEpoch(epoch)| seq_column(epoch))
                    .transpose()?,
                events: encoded.into(),
            };
            self.appends.call(request).await
        })
    }

    fn flush(&self, id: SessionId) -> BoxFuture<'_, Result<()>> {
        self.flush_counts.asked.fetch_add(1, Ordering::Relaxed);
        Box::pin(self.flushes.flush_session(id, || self.synchronous_commit()))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        Box::pin(self.listing(None))
    }

    fn list_children(&self, parent: SessionId) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        Box::pin(self.listing(Some(parent)))
    }

    fn header(&self, id: SessionId) -> BoxFuture<'_, Result<SessionHeader>> {
        Box::pin(async move { self.reads.call(ReadRequest::header(id)).await?.header() })
    }

    fn read_stored(
        &self,
        id: SessionId,
        from_seq: u64,
        before_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Arc<SessionEvent>>>> {
        Box::pin(async move {
            self.reads
                .call(ReadRequest::events(id, from_seq, before_seq))
                .await?
                .events()
        })
    }

    /// One read for the header and the stored log (two on the other stores); a seed stored by
    /// reference is resolved as [`SessionPersistence::read_from`] does.
    fn inspect(&self, id: SessionId) -> BoxFuture<'_, Result<StoredSession>> {
        Box::pin(async move {
            let stored = self
                .reads
                .call(ReadRequest::events(id, 0, u64::MAX).and_header())
                .await?;
            let header = stored.header()?;
            if header.first_stored_seq() > 0 {
                return inspection(self, id).await;
            }
            inspected(header, stored.events()?)
        })
    }

    fn acquire_lease(&self, id: SessionId, holder: LeaseHolder) -> BoxFuture<'_, Result<Lease>> {
        Box::pin(async move {
            let (lease, _) = self.acquire_lease_with_length(id, holder).await?;
            Ok(lease)
        })
    }

    /// The lease and the log's length, both from the grant's transaction (the session's row
    /// it locks holds the length): a cold resume learns with its lease whether its
    /// inspection is the whole log.
    fn acquire_lease_with_length(
        &self,
        id: SessionId,
        holder: LeaseHolder,
    ) -> BoxFuture<'_, Result<(Lease, Option<u64>)>> {
        Box::pin(async move {
            let granted = self.leases.call(LeaseRequest { id, holder }).await?;
            Ok((granted.lease, Some(granted.stored_len)))
        })
    }

    fn renew_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.reconnecting("renewing a lease", |_| async move {
            let epoch = seq_column(epoch.0)?;
            let client = self.client().await?;
            let renewed = client
                .execute(
                    &client.prepare_cached("UPDATE subagents_leases SET expires_at = now() + make_interval(secs => $3)
                     WHERE session = $1 AND epoch = $2").await.map_err(io("preparing a statement"))?,
                    &[&uuid_of(id), &epoch, &self.lease_ttl.as_secs_f64()],
                )
                .await
                .map_err(io(format!("renewing the lease of session {id}")))?;
            if renewed == 0 {
                return Err(lease_lost(id));
            }
            Ok(())
            })
            .await
        })
    }

    fn release_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.releases
                .call((id, epoch))
                .await
                .map_err(|error| error.about(format_args!("releasing the lease of session {id}")))
        })
    }

    fn cache_get(&self, unit: &str, id: SessionId) -> BoxFuture<'_, Result<Option<Value>>> {
        let unit = unit.to_owned();
        Box::pin(async move {
            let row = self.cache_bytes(&unit, id).await?;
            row.map(|bytes| decode_cache_row(&unit, id, &bytes))
                .transpose()
        })
    }

    fn cache_get_encoded(
        &self,
        unit: &str,
        id: SessionId,
    ) -> BoxFuture<'_, Result<Option<EncodedRow>>> {
        let unit = unit.to_owned();
        Box::pin(async move {
            let row = self.cache_bytes(&unit, id).await?;
            Ok(row.map(EncodedRow::stored))
        })
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
        let unit: Arc<str> = unit.into();
        Box::pin(async move {
            let request = CachePutRequest {
                unit,
                id,
                row: row.into_bytes().into(),
                epoch: lease
                    .map(|LeaseEpoch(epoch)| seq_column(epoch))
                    .transpose()?,
            };
            self.cache_puts.call(request).await
        })
    }
}

impl PostgresStore {
    /// The bytes of the projection-cache row for (`unit`, `id`), as stored.
    async fn cache_bytes(&self, unit: &str, id: SessionId) -> Result<Option<Vec<u8>>> {
        self.reconnecting("reading the projection cache", |_| async move {
            let client = self.client().await?;
            let statement = client
                .prepare_cached(
                    "SELECT row FROM subagents_projection_cache WHERE unit = $1 AND session = $2",
                )
                .await
                .map_err(io("preparing a statement"))?;
            let row = client
                .query_opt(&statement, &[&unit, &uuid_of(id)])
                .await
                .map_err(io(format!("reading the {unit} cache of session {id}")))?;
            Ok(row.map(|row| row.get(0)))
        })
        .await
    }

    /// One synchronous commit, which makes every append committed before it began durable.
    ///
    /// Appends commit without waiting for the disk (the connections run with
    /// `synchronous_commit` off). A transaction that writes and commits synchronously flushes
    /// the write-ahead log up to its own commit, and the log is one sequence, so every earlier
    /// append of every session, on any connection, is durable once it returns: one commit
    /// serves every flush asked before it began ([`GroupFlush`]). One statement, its own
    /// transaction: the local setting holds at its commit. The row is the connection's slot,
    /// so the table stays small.
    ///
    /// [`GroupFlush`]: crate::store::group_flush::GroupFlush
    fn synchronous_commit(&self) -> BoxFuture<'static, Result<()>> {
        let pool = self.pool.clone();
        let commits = Arc::clone(&self.flush_counts);
        let (deadline, target) = (self.call_deadline, self.target());
        Box::pin(async move {
            reconnecting("flushing", deadline, |_| {
                let (pool, commits, target) = (&pool, &commits, &target);
                async move {
                    let client = connection(pool, || target.clone()).await?;
                    let touch = client
                        .prepare_cached(
                            "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true))
                             INSERT INTO subagents_flushes (slot, at)
                             SELECT pg_backend_pid() % $1, now() FROM durable
                             ON CONFLICT (slot) DO UPDATE SET at = excluded.at",
                        )
                        .await
                        .map_err(io("flushing"))?;
                    commits.commits.fetch_add(1, Ordering::Relaxed);
                    client
                        .execute(&touch, &[&FLUSH_SLOTS])
                        .await
                        .map_err(io("flushing"))?;
                    Ok(())
                }
            })
            .await
        })
    }
}
