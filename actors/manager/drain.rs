//! Drains: scoped (below exact parents) and manager-wide, each releasing child first and
//! aggregating failures.

use super::*;
use crate::actors::activation::outcomes;

/// Combines teardown outcomes: `Ok`, the one failure, or one aggregate naming them all.
fn aggregate(outcomes: Vec<Result<()>>) -> Result<()> {
    let mut failures: Vec<SubagentError> = outcomes.into_iter().filter_map(Result::err).collect();
    match failures.len() {
        0 => Ok(()),
        1 => Err(failures.remove(0)),
        n => Err(SubagentError::new(
            ErrorCode::ActivationTeardownFailed,
            format!(
                "{n} continuable branches failed to tear down: {}",
                failures
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        )),
    }
}

/// Closes admission below exact live parents and disposes their continuable descendants.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub(crate) struct DrainDescendants(pub(crate) Vec<AgentRef>);

impl Handler<DrainDescendants> for ContinuationManager {
    type Result = ResponseFuture<Result<()>>;

    fn handle(&mut self, msg: DrainDescendants, ctx: &mut Context<Self>) -> Self::Result {
        // Stale copies are ignored: they cannot close a live same-id agent's forest.
        let roots: Vec<AgentRef> = msg.0.into_iter().filter(AgentRef::is_alive).collect();
        let root_ids: Vec<SessionId> = roots.iter().map(AgentRef::id).collect();
        for root in roots {
            self.closing
                .entry(root.id())
                .or_insert_with(|| ClosingScope {
                    root,
                    members: HashSet::new(),
                });
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
        let target_ids: HashSet<SessionId> = targets.iter().map(|(_, id)| *id).collect();
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
        let materializations: Vec<Signal> = self
            .materializations
            .values()
            .filter(|m| m.lineage.iter().any(|id| root_ids.contains(id)))
            .map(|m| m.over.clone())
            .collect();
        // Every target's disposal opens now, top-down, before any await; children placed on
        // other nodes by a parent at or below a root are released there.
        let mut branches = self.release_remote_below(Some(&root_ids), ctx);
        for (_, target) in &targets {
            let owned_by_target = self.residents[target]
                .owner()
                .is_some_and(|owner| target_ids.contains(&owner));
            if let Some(disposal) = self.open_disposal(*target, ctx) {
                if !owned_by_target {
                    branches.push(disposal);
                }
            }
        }
        Box::pin(async move {
            join_all(materializations).await;
            aggregate(outcomes(branches).await)
        })
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
        let materializations: Vec<Signal> = self
            .materializations
            .values()
            .map(|m| m.over.clone())
            .collect();
        let manager = ctx.address();
        Box::pin(async move {
            join_all(materializations).await;
            let branches = manager.send(DrainRoots).await.unwrap_or_default();
            aggregate(outcomes(branches).await)
        })
    }
}

/// Internal: opens every forest root's disposal (their owned children follow top-down).
#[derive(Message)]
#[rtype(result = "Vec<Disposal>")]
struct DrainRoots;

impl Handler<DrainRoots> for ContinuationManager {
    type Result = MessageResult<DrainRoots>;

    fn handle(&mut self, _: DrainRoots, ctx: &mut Context<Self>) -> Self::Result {
        let mut roots: Vec<SessionId> = self
            .residents
            .iter()
            .filter(|(_, resident)| !resident.owned_by_parent)
            .map(|(id, _)| *id)
            .collect();
        roots.sort_unstable();
        let mut branches: Vec<Disposal> = roots
            .into_iter()
            .filter_map(|root| self.open_disposal(root, ctx))
            .collect();
        // Children placed on other nodes: those of resident parents are in the branches
        // already (memoized), those of host-owned parents are released here.
        branches.extend(self.release_remote_below(None, ctx));
        MessageResult(branches)
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
