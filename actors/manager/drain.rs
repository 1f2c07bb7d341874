//! Drains: scoped (below exact parents) and manager-wide, each releasing child first and
//! aggregating failures. The manager decides and opens every disposal top-down in one
//! handler; a host-owned parent's share of the waiting is carried out by its ownership node
//! ([`OwnerNode`]), a continuable parent's here.

use super::remote::{discard_parked, release_unrecorded};
use super::*;
use crate::actors::activation::outcomes;
use crate::actors::owner::aggregate;
use std::collections::hash_map::Entry;

/// What one drained parent releases: the creations admitted below it, then its branches.
struct Share {
    parent: SessionId,
    admitted: Vec<Signal>,
    branches: Vec<Disposal>,
}

impl ContinuationManager {
    /// Hands each share to its parent's ownership node (a host-owned parent) or waits for it
    /// here (a continuable parent, whose Activation stays resident); the future combines
    /// every share's outcome.
    fn release_shares(
        &mut self,
        shares: Vec<Share>,
        ctx: &Context<Self>,
    ) -> BoxFuture<'static, Result<()>> {
        let releases: Vec<BoxFuture<'static, Result<()>>> = shares
            .into_iter()
            .filter(|share| !share.admitted.is_empty() || !share.branches.is_empty())
            .map(|share| {
                if self.residents.contains_key(&share.parent) {
                    async move {
                        join_all(share.admitted).await;
                        aggregate(outcomes(share.branches).await)
                    }
                    .boxed()
                } else {
                    self.release_through_owner(share.parent, share.admitted, share.branches, ctx)
                }
            })
            .collect();
        async move { aggregate(join_all(releases).await) }.boxed()
    }
}

/// Closes admission below the exact live parents and disposes their continuable descendants.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub(crate) struct DrainDescendants {
    pub(crate) parents: Vec<AgentRef>,
    /// The drain's span: the releases it sends other nodes continue its trace.
    pub(crate) trace: tracing::Span,
}

impl Handler<DrainDescendants> for ContinuationManager {
    type Result = ResponseFuture<Result<()>>;

    fn handle(&mut self, msg: DrainDescendants, ctx: &mut Context<Self>) -> Self::Result {
        // Stale copies are ignored: they cannot close a live same-id agent's forest.
        let roots: Vec<AgentRef> = msg.parents.into_iter().filter(AgentRef::is_alive).collect();
        let traceparent = crate::trace::traceparent_of(&msg.trace);
        let root_ids: Vec<SessionId> = roots.iter().map(AgentRef::id).collect();
        for root in roots {
            let fresh = || ClosingScope {
                root: root.clone(),
                members: FastHashSet::default(),
            };
            match self.closing.entry(root.id()) {
                // Concurrent drains of the same exact root merge.
                Entry::Occupied(scope) if scope.get().root == root => {}
                // An earlier incarnation's cutoff ended with it (it is swept at the next
                // admission): kept, it would take the live root's cutoff away with it.
                Entry::Occupied(mut scope) => *scope.get_mut() = fresh(),
                Entry::Vacant(scope) => {
                    scope.insert(fresh());
                }
            }
        }
        // Strict descendants only: a continuable root itself survives.
        let mut targets: Vec<(usize, SessionId)> = self
            .residents
            .iter()
            .filter(|(_, resident)| {
                resident.ancestry[1..]
                    .iter()
                    .any(|id| root_ids.contains(id))
            })
            .map(|(id, resident)| (resident.ancestry.len(), *id))
            .collect();
        targets.sort_unstable();
        let target_ids: FastHashSet<SessionId> = targets.iter().map(|(_, id)| *id).collect();
        for (_, target) in &targets {
            let ancestry = self.residents[target].ancestry.clone();
            for root in &root_ids {
                if let Some(scope) = self.closing.get_mut(root) {
                    if ancestry.contains(root) {
                        scope.members.extend(ancestry.iter().copied());
                    }
                }
            }
        }
        // One share per root: the creations admitted below it, and the children placed on
        // other nodes by a parent at or below it.
        let mut shares: Vec<Share> = root_ids
            .iter()
            .map(|root| Share {
                parent: *root,
                admitted: self
                    .materializations
                    .values()
                    .filter(|m| m.lineage.contains(root))
                    .map(|m| m.over.clone())
                    .collect(),
                branches: self.release_remote_below(Some(&[*root]), traceparent.as_deref(), ctx),
            })
            .collect();
        // Children no node holds below a root (handed over, or left by a stopped node): their
        // lineage refuses the follow-up that would resume them, so what waits in their logs
        // is discarded, as a release would.
        let mut unparked = Vec::new();
        // Only a cluster parks children.
        for (share, root) in root_ids.iter().enumerate() {
            let Some(cluster) = &self.cluster else { break };
            let below: Vec<SessionId> = self
                .parked
                .iter()
                .filter(|(_, parent)| self.lineage_of(parent).contains(root))
                .map(|(child, _)| *child)
                .collect();
            for child in below {
                self.parked.remove(&child);
                unparked.push(child);
                shares[share].branches.push(discard_parked(
                    (cluster.clone(), self.agents.clone()),
                    child,
                ));
            }
        }
        // Children this node placed before it was restarted under its id, or its predecessor
        // or a stopped node ran, of which this process has no record: found by their leases,
        // and released on their nodes or discarded from here.
        if let Some(cluster) = self.cluster.clone() {
            let known: FastHashSet<SessionId> = self
                .remote_children
                .keys()
                .chain(self.residents.keys())
                .chain(&unparked)
                .copied()
                .collect();
            for (share, root) in root_ids.iter().enumerate() {
                shares[share].branches.push(release_unrecorded(
                    (cluster.clone(), self.agents.clone()),
                    *root,
                    known.clone(),
                ));
            }
        }
        // Every target's disposal opens now, top-down, before any await; a branch not owned
        // by another target joins the share of the root nearest above it.
        for (_, target) in &targets {
            let resident = &self.residents[target];
            let owned_by_target = resident
                .owner()
                .is_some_and(|owner| target_ids.contains(&owner));
            let nearest = resident.ancestry[1..]
                .iter()
                .find_map(|id| root_ids.iter().position(|root| root == id));
            if let Some(disposal) = self.open_disposal(*target, ctx) {
                if let (false, Some(share)) = (owned_by_target, nearest) {
                    shares[share].branches.push(disposal);
                }
            }
        }
        self.release_shares(shares, ctx)
    }
}

/// The manager-wide drain (on shutdown): closes admission everywhere, waits for admitted
/// materializations, then disposes every forest child first.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub(crate) struct DrainAll;

impl Handler<DrainAll> for ContinuationManager {
    type Result = ResponseFuture<Result<()>>;

    fn handle(&mut self, _: DrainAll, ctx: &mut Context<Self>) -> Self::Result {
        self.draining = true;
        self.leaving = self.cluster.is_some();
        let materializations: Vec<Signal> = self
            .materializations
            .values()
            .map(|m| m.over.clone())
            .collect();
        let manager = ctx.address();
        Box::pin(async move {
            join_all(materializations).await;
            match manager.send(DrainRoots).await {
                Ok(released) => released.await,
                // The manager stopped: nothing is left resident to release.
                Err(_) => Ok(()),
            }
        })
    }
}

/// Internal: opens every forest root's disposal (their owned children follow top-down) and
/// hands each host-owned parent's share to its node.
#[derive(Message)]
#[rtype(result = "BoxFuture<'static, Result<()>>")]
struct DrainRoots;

impl Handler<DrainRoots> for ContinuationManager {
    type Result = MessageResult<DrainRoots>;

    fn handle(&mut self, _: DrainRoots, ctx: &mut Context<Self>) -> Self::Result {
        let mut roots: Vec<(SessionId, ParentLink)> = self
            .residents
            .iter()
            .filter(|(_, resident)| !resident.owned_by_parent)
            .map(|(id, resident)| (*id, resident.parent.clone()))
            .collect();
        roots.sort_unstable_by_key(|(id, _)| *id);
        // One share per host-owned parent; a child of a parent on another node has none.
        let mut shares: Vec<Share> = Vec::new();
        let share_of = |parent: SessionId, shares: &mut Vec<Share>| {
            shares
                .iter()
                .position(|share| share.parent == parent)
                .unwrap_or_else(|| {
                    shares.push(Share {
                        parent,
                        admitted: Vec::new(),
                        branches: Vec::new(),
                    });
                    shares.len() - 1
                })
        };
        // Children of this node's parents that no node holds: nobody resumes them past this
        // drain, so what waits in their logs is discarded.
        let mut parked: Vec<SessionId> = self.parked.drain().map(|(child, _)| child).collect();
        parked.sort_unstable();
        // Only a cluster parks children.
        let mut unowned: Vec<Disposal> = match &self.cluster {
            Some(cluster) => parked
                .into_iter()
                .map(|child| discard_parked((cluster.clone(), self.agents.clone()), child))
                .collect(),
            None => Vec::new(),
        };
        for (root, parent) in roots {
            let Some(disposal) = self.open_disposal(root, ctx) else {
                continue;
            };
            match parent {
                ParentLink::Local(parent) => {
                    let share = share_of(parent.id(), &mut shares);
                    shares[share].branches.push(disposal);
                }
                ParentLink::Remote(_) => unowned.push(disposal),
            }
        }
        // Children placed on other nodes: those of resident parents are in the branches
        // already (memoized), those of host-owned parents join their parent's share.
        let mut placed: Vec<(SessionId, SessionId)> = self
            .remote_children
            .iter()
            .map(|(child, record)| (*child, record.parent.id()))
            .collect();
        placed.sort_unstable();
        for (child, parent) in placed {
            if let Some(release) = self.release_remote(child, None, ctx) {
                let share = share_of(parent, &mut shares);
                shares[share].branches.push(release);
            }
        }
        let released = self.release_shares(shares, ctx);
        // Notices of children released before this drain (and by it) that are on their way.
        let mut notices = self.notices.subscribe();
        MessageResult(
            async move {
                let mut outcomes = outcomes(unowned).await;
                outcomes.push(released.await);
                // The manager keeps the sender: an error would mean nothing is left to wait for.
                let _ = notices.wait_for(|on_their_way| *on_their_way == 0).await;
                aggregate(outcomes)
            }
            .boxed(),
        )
    }
}

/// A host-owned parent's ownership node reports a release carried out: its node may stop once
/// the parent has neither a resident child nor another release in flight.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct OwnerReleased {
    pub(crate) parent: SessionId,
}

impl Handler<OwnerReleased> for ContinuationManager {
    type Result = ();

    fn handle(&mut self, msg: OwnerReleased, _: &mut Context<Self>) {
        if let Some(record) = self.owners.get_mut(&msg.parent) {
            record.releasing = record.releasing.saturating_sub(1);
        }
        self.forget_owner_if_idle(msg.parent);
    }
}

/// How many Activations are resident (for tests and the load report).
#[derive(Message)]
#[rtype(result = "usize")]
pub(crate) struct ResidentCount;

impl Handler<ResidentCount> for ContinuationManager {
    type Result = usize;

    fn handle(&mut self, _: ResidentCount, _: &mut Context<Self>) -> usize {
        self.residents.len()
    }
}

/// The sessions of the resident Activations (for the history checker).
#[derive(Message)]
#[rtype(result = "Vec<SessionId>")]
pub(crate) struct ResidentIds;

impl Handler<ResidentIds> for ContinuationManager {
    type Result = MessageResult<ResidentIds>;

    fn handle(&mut self, _: ResidentIds, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.residents.keys().copied().collect())
    }
}

/// How many host-owned parents have an ownership node now (for tests).
#[derive(Message)]
#[rtype(result = "usize")]
pub(crate) struct OwnerNodeCount;

impl Handler<OwnerNodeCount> for ContinuationManager {
    type Result = usize;

    fn handle(&mut self, _: OwnerNodeCount, _: &mut Context<Self>) -> usize {
        self.owners.len()
    }
}
