//! Provides [`LeaseBook`]: what a [`PostgresStore`](super::PostgresStore) remembers about the
//! lease holders of its own process, shared with its lease batches.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::{LeaseTerms, HOLDERS_SWEPT_FROM};
use crate::store::lease::{HolderLiveness, Lease, LeaseEpoch, LeaseHolder};

/// The holders this process granted leases to, and which of them are cluster members.
pub(super) struct LeaseBook {
    /// How long a lease lasts unrenewed.
    pub(super) lease_ttl: Duration,
    /// How long a member's node row lives without a heartbeat.
    pub(super) node_ttl: Duration,
    /// The holders this process granted leases to: one that is gone holds nothing. A gone
    /// one is forgotten once no lease row names it (see
    /// [`LeaseBook::forget_released_holders`]).
    holders: Mutex<HashMap<uuid::Uuid, HolderLiveness>>,
    /// How many holders may be remembered before the next sweep of gone ones.
    holders_sweep_at: AtomicUsize,
    /// The holders of this process that are cluster members now (their leases need no
    /// renewal), each with the incarnation it joined as.
    members: Mutex<HashMap<uuid::Uuid, uuid::Uuid>>,
    /// The nodes whose membership this process lost (declared dead): it cannot join under
    /// them again (its agents may still act on what the node held).
    lost_members: Mutex<HashSet<uuid::Uuid>>,
}

impl LeaseBook {
    /// An empty book for leases of these time-to-lives.
    pub(super) fn new(lease_ttl: Duration, node_ttl: Duration) -> Self {
        Self {
            lease_ttl,
            node_ttl,
            holders: Mutex::default(),
            holders_sweep_at: AtomicUsize::new(HOLDERS_SWEPT_FROM),
            members: Mutex::default(),
            lost_members: Mutex::default(),
        }
    }

    /// Remembers `holder` as a holder of this process.
    pub(super) fn remember(&self, holder: &LeaseHolder) {
        self.holders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(holder.id(), holder.liveness());
    }

    /// How many lease holders of this process the book remembers.
    pub(super) fn remembered_holders(&self) -> usize {
        self.holders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Forgets the gone holders no lease row names any more, once the remembered ones doubled
    /// since the last sweep: such a holder can never hold anything again, so forgetting it
    /// changes no answer. A failed sweep is retried at the next lease.
    pub(super) async fn forget_released_holders(&self, client: &tokio_postgres::Client) {
        let gone: Vec<uuid::Uuid> = {
            let holders = self.holders.lock().unwrap_or_else(PoisonError::into_inner);
            if holders.len() < self.holders_sweep_at.load(Ordering::Relaxed) {
                return;
            }
            holders
                .iter()
                .filter(|(_, alive)| alive.strong_count() == 0)
                .map(|(holder, _)| *holder)
                .collect()
        };
        let still_named = match client
            .query(
                "SELECT DISTINCT holder FROM subagents_leases WHERE holder = ANY($1)",
                &[&gone],
            )
            .await
        {
            Ok(rows) => rows
                .iter()
                .map(|row| row.get(0))
                .collect::<HashSet<uuid::Uuid>>(),
            Err(error) => {
                tracing::debug!(%error, "sweeping gone lease holders failed");
                return;
            }
        };
        let mut holders = self.holders.lock().unwrap_or_else(PoisonError::into_inner);
        for holder in gone {
            if !still_named.contains(&holder) {
                holders.remove(&holder);
            }
        }
        self.holders_sweep_at.store(
            (2 * holders.len()).max(HOLDERS_SWEPT_FROM),
            Ordering::Relaxed,
        );
    }

    /// Whether `holder` is a holder of this process that is gone.
    pub(super) fn is_gone(&self, holder: uuid::Uuid) -> bool {
        self.holders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&holder)
            .is_some_and(|alive| alive.strong_count() == 0)
    }

    pub(super) fn remember_member(&self, node: uuid::Uuid, incarnation: uuid::Uuid) {
        self.members
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(node, incarnation);
    }

    pub(super) fn remember_lost(&self, node: uuid::Uuid) {
        self.lost_members
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(node);
    }

    pub(super) fn was_lost(&self, node: uuid::Uuid) -> bool {
        self.lost_members
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&node)
    }

    /// The incarnation `holder` joined the cluster as, while it is a member.
    pub(super) fn member_incarnation(&self, holder: uuid::Uuid) -> Option<uuid::Uuid> {
        self.members
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&holder)
            .copied()
    }

    pub(super) fn forget_member(&self, node: uuid::Uuid) {
        self.members
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&node);
    }

    /// The lease `holder` is granted: a member's lives while its node's incarnation heartbeats
    /// (its row's own expiry is not read); anyone else's lasts the lease time-to-live unless
    /// renewed.
    pub(super) fn lease_terms(&self, holder: uuid::Uuid, epoch: LeaseEpoch) -> LeaseTerms {
        match self.member_incarnation(holder) {
            Some(incarnation) => LeaseTerms {
                lease: Lease {
                    epoch,
                    ttl: None,
                    taken_over: false,
                },
                row_ttl: self.node_ttl.as_secs_f64(),
                incarnation: Some(incarnation),
            },
            None => LeaseTerms {
                lease: Lease {
                    epoch,
                    ttl: Some(self.lease_ttl),
                    taken_over: false,
                },
                row_ttl: self.lease_ttl.as_secs_f64(),
                incarnation: None,
            },
        }
    }
}
