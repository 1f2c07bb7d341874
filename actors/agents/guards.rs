//! The guards of a creation or resume in progress: its reservation of an id in the registry,
//! and the session lease it took, each freed if the transaction does not complete.

use std::sync::Arc;

use actix::prelude::*;

use crate::actors::registry::{Abandon, AgentRegistry, Exact};
use crate::error::Result;
use crate::ids::SessionId;
use crate::store::{Lease, LeaseHolder, SharedStore};

/// Frees a registry reservation (or disposes what it published) unless the creation completed.
/// Borrows the registry's address: a clone of an actix address allocates a sender of its own.
pub(super) struct Reservation<'a> {
    pub(super) registry: &'a Addr<AgentRegistry>,
    pub(super) agent: Option<Exact>,
}

impl Reservation<'_> {
    pub(super) fn keep(mut self) {
        self.agent = None;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(agent) = self.agent.take() {
            // The registry outlives every creation; a stopped registry has nothing to free.
            self.registry.do_send(Abandon(agent));
        }
    }
}

/// A session lease taken by a creation in progress: released if the creation fails or is
/// dropped before write-behind takes it over.
pub(super) struct LeaseGuard {
    store: SharedStore,
    id: SessionId,
    pub(super) lease: Lease,
    held: bool,
}

impl LeaseGuard {
    pub(super) async fn acquire(
        store: &SharedStore,
        id: SessionId,
        holder: &LeaseHolder,
    ) -> Result<Self> {
        let lease = store.acquire_lease(id, holder.clone()).await?;
        Ok(Self::held(store, id, lease))
    }

    /// [`LeaseGuard::acquire`], with the stored log's length at the grant when the store
    /// tells it (see [`SessionPersistence::acquire_lease_with_length`]).
    pub(super) async fn acquire_with_length(
        store: &SharedStore,
        id: SessionId,
        holder: &LeaseHolder,
    ) -> Result<(Self, Option<u64>)> {
        let (lease, stored_len) = store.acquire_lease_with_length(id, holder.clone()).await?;
        Ok((Self::held(store, id, lease), stored_len))
    }

    /// Guards `lease`, already granted on `id`.
    pub(super) fn held(store: &SharedStore, id: SessionId, lease: Lease) -> Self {
        Self {
            store: Arc::clone(store),
            id,
            lease,
            held: true,
        }
    }

    /// Hands the lease to write-behind, which releases it when the log closes.
    pub(super) fn hand_over(mut self) -> Lease {
        self.held = false;
        self.lease
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let (store, id, epoch) = (Arc::clone(&self.store), self.id, self.lease.epoch);
        // Drop runs inside the actor system (creations are async); without a runtime there is no
        // one left to hold the lease against, and an embedded store frees it with its holder.
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(async move {
                if let Err(error) = store.release_lease(id, epoch).await {
                    tracing::warn!(session_id = %id, %error, "releasing an unused lease failed");
                }
            });
        }
    }
}
