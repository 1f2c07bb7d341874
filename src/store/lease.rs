//! Provides session leases: [`LeaseHolder`] (one runtime), [`Lease`] (what a holder was granted)
//! and the in-process lease table the embedded stores keep.
//!
//! # Why leases
//! A live session is written by exactly one runtime. The runtime takes the session's lease when
//! it creates or resumes an agent, names the lease's fencing epoch on every append, renews it
//! while the agent lives (when the store asks for renewal) and releases it on disposal. A second
//! runtime asking for a held lease is refused with `SESSION_LEASED`; a writer whose epoch is no
//! longer current (its lease expired and another runtime took it) is refused with `LEASE_LOST`.
//!
//! # Embedded stores
//! Only one process opens a sled directory, so a lease recorded by an earlier process is void:
//! the holders live in memory, and a lease is free again once its holder (every clone of the
//! runtime's [`LeaseHolder`]) is dropped, or once its time-to-live passes unrenewed. The epoch
//! itself is durable, so fencing survives a reopen.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::{FastHashMap, SessionId};

/// A session lease's fencing epoch: larger is newer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseEpoch(pub u64);

/// Who holds leases: one runtime. Clones are the same holder.
#[derive(Debug, Clone)]
pub struct LeaseHolder {
    /// Its id, in an allocation whose strong count says whether the holder is alive: a lease
    /// table keeps one weak pointer per lease for both.
    identity: Arc<HolderIdentity>,
}

/// A holder's identity, shared by its clones.
#[derive(Debug)]
pub(crate) struct HolderIdentity {
    id: uuid::Uuid,
}

/// A holder as a lease table remembers it: gone once every clone of it is dropped.
pub(crate) type HolderLiveness = Weak<HolderIdentity>;

impl Default for LeaseHolder {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseHolder {
    /// A new holder with a fresh id.
    pub fn new() -> Self {
        Self {
            identity: Arc::new(HolderIdentity {
                id: uuid::Uuid::new_v4(),
            }),
        }
    }

    /// A holder with a chosen id: a cluster node that runs under a configured id (a process
    /// restarted under it joins as a new incarnation of the node; one whose node was declared
    /// dead cannot join under it again). One holder per id in a process: a second one would
    /// count as a different holder of the same id's leases.
    pub fn with_id(id: uuid::Uuid) -> Self {
        Self {
            identity: Arc::new(HolderIdentity { id }),
        }
    }

    /// The holder's id, as a networked store would record it.
    pub fn id(&self) -> uuid::Uuid {
        self.identity.id
    }

    pub(crate) fn liveness(&self) -> HolderLiveness {
        Arc::downgrade(&self.identity)
    }
}

/// A granted lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The fencing epoch every append must name.
    pub epoch: LeaseEpoch,
    /// How long the lease lasts unrenewed; `None` when it lasts until released or until the
    /// holder is gone (the embedded stores' default).
    pub ttl: Option<Duration>,
    /// Whether the grant took the lease over from another holder whose lease had lapsed
    /// (expired unrenewed, its holder gone, or its node declared dead) rather than finding it
    /// free or the asker's own.
    pub taken_over: bool,
}

/// One held lease, as an embedded store records it: 16 bytes, as a table holds one for every
/// live session (a million resident children hold a million).
#[derive(Debug)]
struct HeldLease {
    holder: HolderLiveness,
    epoch: u64,
}

impl HeldLease {
    /// The id of its holder, while the holder is alive.
    fn live_holder(&self) -> Option<uuid::Uuid> {
        self.holder.upgrade().map(|identity| identity.id)
    }
}

/// The in-process record of who holds which session's lease (the embedded stores' half of
/// leasing; the epoch itself lives with the session).
#[derive(Debug, Default)]
pub(crate) struct LeaseTable {
    held: FastHashMap<SessionId, HeldLease>,
    /// When each lease lapses unrenewed; kept only by a table with a time-to-live.
    expiries: FastHashMap<SessionId, Instant>,
    ttl: Option<Duration>,
}

impl LeaseTable {
    /// A table whose leases last `ttl` unrenewed (`None`: until released or the holder is gone).
    pub(crate) fn new(ttl: Option<Duration>) -> Self {
        Self {
            held: FastHashMap::default(),
            expiries: FastHashMap::default(),
            ttl,
        }
    }

    /// Grants `holder` the lease of `id`, whose stored epoch is `stored_epoch`; the caller
    /// persists the returned epoch.
    ///
    /// # Errors
    /// `SESSION_LEASED` when another live holder holds an unexpired lease.
    pub(crate) fn acquire(
        &mut self,
        id: SessionId,
        holder: &LeaseHolder,
        stored_epoch: u64,
    ) -> Result<Lease> {
        let now = Instant::now();
        let mut taken_over = false;
        if let Some(held) = self.held.get(&id) {
            let unexpired = self.expiries.get(&id).is_none_or(|at| *at > now);
            let other = held.live_holder().is_some_and(|live| live != holder.id());
            if other && unexpired {
                return Err(SubagentError::new(
                    ErrorCode::SessionLeased,
                    format!("session {id} is live in another runtime (its lease is held)"),
                ));
            }
            taken_over = held.live_holder() != Some(holder.id());
        }
        let epoch = stored_epoch
            .checked_add(1)
            .ok_or_else(|| SubagentError::bug("lease epoch overflow"))?;
        self.held.insert(
            id,
            HeldLease {
                holder: holder.liveness(),
                epoch,
            },
        );
        if let Some(ttl) = self.ttl {
            self.expiries.insert(id, now + ttl);
        }
        Ok(Lease {
            epoch: LeaseEpoch(epoch),
            ttl: self.ttl,
            taken_over,
        })
    }

    /// Extends the lease of `id` if `epoch` is still its current one.
    ///
    /// # Errors
    /// `LEASE_LOST` when the lease was released, or expired and taken by another holder.
    pub(crate) fn renew(&mut self, id: SessionId, epoch: LeaseEpoch) -> Result<()> {
        let now = Instant::now();
        match self.held.get(&id) {
            Some(held) if held.epoch == epoch.0 => {
                if let Some(ttl) = self.ttl {
                    self.expiries.insert(id, now + ttl);
                }
                Ok(())
            }
            _ => Err(lease_lost(id)),
        }
    }

    /// Frees the lease of `id` if `epoch` is its current one; a stale release is a no-op.
    pub(crate) fn release(&mut self, id: SessionId, epoch: LeaseEpoch) {
        if self.held.get(&id).is_some_and(|held| held.epoch == epoch.0) {
            self.held.remove(&id);
            self.expiries.remove(&id);
        }
    }
}

/// The error of a writer whose lease is no longer current.
pub(crate) fn lease_lost(id: SessionId) -> SubagentError {
    SubagentError::new(
        ErrorCode::LeaseLost,
        format!("session {id}: this writer's lease is no longer current (fenced by a newer one)"),
    )
}

/// A write under the latest epoch of a lease that is no longer live: its holder's node was
/// declared dead, or the lease expired unrenewed, and nobody has taken it yet.
pub(crate) fn lease_expired(id: SessionId) -> SubagentError {
    SubagentError::new(
        ErrorCode::LeaseLost,
        format!(
            "session {id}: this writer's lease is no longer live (its node was declared dead, or \
             it expired unrenewed)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // A lease table keeps one record per live session; a million resident children hold a
    // million of them.
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn a_held_lease_is_two_words() {
        assert_eq!(std::mem::size_of::<HeldLease>(), 16);
    }

    #[test]
    fn a_lease_passes_on_once_its_holder_is_gone_and_not_before() {
        let mut table = LeaseTable::new(None);
        let id = SessionId::new();
        let first = LeaseHolder::new();
        let lease = table.acquire(id, &first, 0).expect("a free lease");
        assert!(!lease.taken_over, "a free lease is no takeover");
        let second = LeaseHolder::new();
        assert_eq!(
            table
                .acquire(id, &second, lease.epoch.0)
                .unwrap_err()
                .code(),
            ErrorCode::SessionLeased,
            "a live holder keeps its lease"
        );
        let again = table
            .acquire(id, &first.clone(), lease.epoch.0)
            .expect("a clone of the holder is the same holder");
        assert!(!again.taken_over, "a holder's own lease is no takeover");
        drop(first);
        let taken = table
            .acquire(id, &second, again.epoch.0)
            .expect("a gone holder holds nothing");
        assert!(taken.epoch > again.epoch);
        assert!(taken.taken_over, "a gone holder's lease is taken over");
        table.release(id, taken.epoch);
        let released = table.acquire(id, &second, taken.epoch.0).unwrap();
        assert!(!released.taken_over, "a released lease is free");
    }
}
