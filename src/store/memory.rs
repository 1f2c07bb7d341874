//! Provides [`MemoryStore`]: an in-memory [`SessionPersistence`] for tests and load runs that
//! need no disk. It upholds every guarantee of [`SessionPersistence`] except surviving the process.

use std::collections::BTreeMap;

use crate::ids::{FastHashMap, FastHashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::future::{self, BoxFuture};
use serde_json::Value;

use super::codec::{decode_cache_row, put_value_row};
use super::lease::{lease_lost, LeaseTable};
use super::{
    check_append, check_contiguous, not_found, EncodedRow, Lease, LeaseEpoch, LeaseHolder,
    ListedSession, SessionPersistence,
};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::session::{SessionEvent, SessionHeader};

/// An in-memory store. Cheap to create; everything is lost when it is dropped.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<MemoryState>,
    /// Drop a one-shot child's session once it is disposed.
    forget_one_shots: bool,
}

#[derive(Debug, Default)]
struct MemoryState {
    /// Boxed: a B-tree node holds eleven values whether or not they are in use, and a
    /// session record is large.
    sessions: BTreeMap<SessionId, Box<MemorySession>>,
    /// Projection cache rows as their JSON bytes, as a persistent store keeps them: a row held
    /// as a `Value` tree takes several times its encoding, and a store holds one for every
    /// continuable child it has seen released.
    cache: FastHashMap<(String, SessionId), Box<[u8]>>,
    leases: LeaseTable,
    /// How many stored sessions' seeds reference each session: a session a seed references
    /// stays readable while that seed's session is stored.
    referenced: FastHashMap<SessionId, usize>,
    /// One-shot sessions disposed while still referenced, dropped once the last reference is.
    disposed: FastHashSet<SessionId>,
}

impl MemoryState {
    /// Drops the disposed one-shot session `id` unless a stored seed still references it; a
    /// session dropped releases its own seed's reference in turn.
    fn forget(&mut self, mut id: SessionId) {
        loop {
            if self.referenced.get(&id).is_some_and(|count| *count > 0) {
                self.disposed.insert(id);
                return;
            }
            self.disposed.remove(&id);
            let Some(session) = self.sessions.remove(&id) else {
                return;
            };
            let Some(reference) = session.header.seed_reference else {
                return;
            };
            let source = reference.session;
            let left = self.referenced.get_mut(&source).map_or(0, |count| {
                *count = count.saturating_sub(1);
                *count
            });
            if left > 0 {
                return;
            }
            self.referenced.remove(&source);
            if !self.disposed.contains(&source) {
                return;
            }
            id = source;
        }
    }
}

#[derive(Debug)]
struct MemorySession {
    header: SessionHeader,
    /// The session's own stored events, from [`SessionHeader::first_stored_seq`] on. Shared
    /// with the log that wrote them (events are immutable): a deep copy per append doubled the
    /// allocations of every turn and made the lifecycle 4x slower as the store grew.
    events: Vec<Arc<SessionEvent>>,
    lease: u64,
}

impl MemorySession {
    /// The next seq to store.
    fn next_seq(&self) -> Result<u64> {
        u64::try_from(self.events.len())
            .ok()
            .and_then(|len| self.header.first_stored_seq().checked_add(len))
            .ok_or_else(|| SubagentError::bug("log length exceeds u64"))
    }
}

impl MemoryStore {
    /// An empty store whose leases last until released or until their holder is gone.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose leases expire unless renewed within `ttl`, as a networked store's
    /// do; the runtime then renews every live session's lease on its own.
    pub fn with_lease_ttl(ttl: std::time::Duration) -> Self {
        let store = Self::default();
        store.lock().leases = LeaseTable::new(Some(ttl));
        store
    }

    /// An empty store that lets go of each one-shot child's session once the child is
    /// disposed (its parent's log still records the delegation's start and end). A long run of
    /// one-shot delegations then holds only the sessions in flight: the store no longer grows
    /// with every run, at the price of those children being absent from listings afterwards.
    pub fn forgetting_one_shots() -> Self {
        Self {
            forget_one_shots: true,
            ..Self::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, MemoryState> {
        // Every mutation below checks before it writes, so a poisoned state is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores a new session and, for `holder`, its first lease, under one lock: a creation
    /// whose lease is refused leaves nothing stored.
    fn write_creation(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
        holder: Option<&LeaseHolder>,
    ) -> Result<Option<Lease>> {
        header.validate()?;
        check_contiguous(header.id, header.first_stored_seq(), &events)?;
        let mut state = self.lock();
        let MemoryState {
            sessions,
            leases,
            referenced,
            ..
        } = &mut *state;
        if sessions.contains_key(&header.id) {
            return Err(SubagentError::new(
                ErrorCode::SessionExists,
                format!("session {} is already stored", header.id),
            ));
        }
        let lease = holder
            .map(|holder| leases.acquire(header.id, holder, 0))
            .transpose()?;
        if let Some(reference) = &header.seed_reference {
            *referenced.entry(reference.session).or_default() += 1;
        }
        sessions.insert(
            header.id,
            Box::new(MemorySession {
                lease: lease.map_or(0, |lease| lease.epoch.0),
                header,
                events,
            }),
        );
        Ok(lease)
    }

    fn with_session<T>(
        &self,
        id: SessionId,
        read: impl FnOnce(&mut MemorySession) -> Result<T>,
    ) -> Result<T> {
        let mut state = self.lock();
        let session = state.sessions.get_mut(&id).ok_or_else(|| not_found(id))?;
        read(session)
    }
}

impl SessionPersistence for MemoryStore {
    fn create(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
    ) -> BoxFuture<'_, Result<()>> {
        Box::pin(future::ready(
            self.write_creation(header, events, None).map(drop),
        ))
    }

    fn create_leased(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
        holder: LeaseHolder,
    ) -> BoxFuture<'_, Result<Lease>> {
        let outcome = self
            .write_creation(header, events, Some(&holder))
            .and_then(super::granted);
        Box::pin(future::ready(outcome))
    }

    fn append(
        &self,
        id: SessionId,
        expected_next_seq: u64,
        events: Vec<Arc<SessionEvent>>,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        let outcome = self.with_session(id, |session| {
            let next = session.next_seq()?;
            check_append(id, expected_next_seq, next, lease, session.lease)?;
            check_contiguous(id, next, &events)?;
            session.events.extend(events);
            Ok(())
        });
        Box::pin(future::ready(outcome))
    }

    fn flush(&self, id: SessionId) -> BoxFuture<'_, Result<()>> {
        Box::pin(future::ready(self.with_session(id, |_| Ok(()))))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        let rows = self
            .lock()
            .sessions
            .values()
            .filter(|session| !session.events.is_empty())
            .map(|session| ListedSession::Header(session.header.clone()))
            .collect();
        Box::pin(future::ready(Ok(rows)))
    }

    fn list_children(&self, parent: SessionId) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        let rows = self
            .lock()
            .sessions
            .values()
            .filter(|session| {
                session.header.parent_session == Some(parent) && !session.events.is_empty()
            })
            .map(|session| ListedSession::Header(session.header.clone()))
            .collect();
        Box::pin(future::ready(Ok(rows)))
    }

    fn header(&self, id: SessionId) -> BoxFuture<'_, Result<SessionHeader>> {
        Box::pin(future::ready(
            self.with_session(id, |session| Ok(session.header.clone())),
        ))
    }

    fn read_stored(
        &self,
        id: SessionId,
        from_seq: u64,
        before_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Arc<SessionEvent>>>> {
        let outcome = self.with_session(id, |session| {
            let first = session.header.first_stored_seq();
            let index = |seq: u64| {
                usize::try_from(seq.saturating_sub(first))
                    .unwrap_or(usize::MAX)
                    .min(session.events.len())
            };
            let (start, end) = (index(from_seq), index(before_seq));
            Ok(session.events[start..end.max(start)].to_vec())
        });
        Box::pin(future::ready(outcome))
    }

    fn acquire_lease(&self, id: SessionId, holder: LeaseHolder) -> BoxFuture<'_, Result<Lease>> {
        let outcome = (|| {
            let mut state = self.lock();
            let MemoryState {
                sessions, leases, ..
            } = &mut *state;
            let session = sessions.get_mut(&id).ok_or_else(|| not_found(id))?;
            let lease = leases.acquire(id, &holder, session.lease)?;
            session.lease = lease.epoch.0;
            Ok(lease)
        })();
        Box::pin(future::ready(outcome))
    }

    fn renew_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        Box::pin(future::ready(self.lock().leases.renew(id, epoch)))
    }

    fn release_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        self.lock().leases.release(id, epoch);
        Box::pin(future::ready(Ok(())))
    }

    fn one_shot_disposed(&self, id: SessionId) {
        if self.forget_one_shots {
            // Disposal released the lease; one-shot children write no checkpoint rows.
            self.lock().forget(id);
        }
    }

    fn cache_get(&self, unit: &str, id: SessionId) -> BoxFuture<'_, Result<Option<Value>>> {
        let row = self
            .lock()
            .cache
            .get(&(unit.to_owned(), id))
            .map(|bytes| decode_cache_row(unit, id, bytes))
            .transpose();
        Box::pin(future::ready(row))
    }

    fn cache_get_encoded(
        &self,
        unit: &str,
        id: SessionId,
    ) -> BoxFuture<'_, Result<Option<EncodedRow>>> {
        let row = self
            .lock()
            .cache
            .get(&(unit.to_owned(), id))
            .map(|bytes| EncodedRow::stored(bytes.to_vec()));
        Box::pin(future::ready(Ok(row)))
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
        let stored = (|| {
            let mut state = self.lock();
            if let Some(LeaseEpoch(epoch)) = lease {
                let session = state.sessions.get(&id).ok_or_else(|| not_found(id))?;
                if session.lease != epoch {
                    return Err(lease_lost(id));
                }
            }
            state
                .cache
                .insert((unit.to_owned(), id), row.into_bytes().into_boxed_slice());
            Ok(())
        })();
        Box::pin(future::ready(stored))
    }
}
