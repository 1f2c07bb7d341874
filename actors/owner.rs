//! Provides [`OwnerNode`], the actor that carries out the release of one host-owned parent's
//! continuable children: a parent that is not itself a continuable child (a root agent the
//! host created), drawn on the design card as an ownership node.
//!
//! The continuation manager keeps every decision in its one handler: which children a drain
//! releases, the drain's admission cutoff, and opening each disposal top-down before anything
//! awaits. What takes time is handed to the parent's node, as an epoch's teardown is handed to
//! its [`crate::actors::activation::Activation`]: the node waits for the creations admitted
//! below the parent to finish or roll back, then for each branch the manager opened to be
//! released child first, answers their combined outcome, and reports back to the manager. The
//! manager starts a node with the parent's first resident child (or first release) and lets it
//! stop once the parent has neither.

use actix::prelude::*;
use actix::WeakAddr;
use futures::future::join_all;

use crate::actors::activation::{outcomes, Disposal};
use crate::actors::manager::{ContinuationManager, OwnerReleased, Signal};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;

/// The ownership node of one host-owned parent.
pub(crate) struct OwnerNode {
    parent: SessionId,
    /// Weak: the manager owns the node, not the other way round.
    manager: WeakAddr<ContinuationManager>,
}

impl OwnerNode {
    pub(crate) fn new(parent: SessionId, manager: WeakAddr<ContinuationManager>) -> Self {
        Self { parent, manager }
    }
}

impl Actor for OwnerNode {
    type Context = Context<Self>;
}

/// Releases a share of the parent's continuable children, child first. Sent by the manager
/// only, after it opened every disposal in `branches` (top-down); answers `Ok`, the one
/// failure, or an `ACTIVATION_TEARDOWN_FAILED` naming every failed branch. A node that stopped
/// fails the send, which the manager reports as the actor system's error.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub(crate) struct ReleaseChildren {
    /// Creations and cold resumes admitted below the parent before the cutoff: each ends
    /// (installed, or rolled back by the closed admission) before the branches are awaited.
    pub(crate) admitted: Vec<Signal>,
    /// The opened disposals of the parent's children that no other released child owns.
    pub(crate) branches: Vec<Disposal>,
}

impl Handler<ReleaseChildren> for OwnerNode {
    type Result = ResponseActFuture<Self, Result<()>>;

    fn handle(&mut self, msg: ReleaseChildren, _: &mut Context<Self>) -> Self::Result {
        let parent = self.parent;
        Box::pin(
            async move {
                join_all(msg.admitted).await;
                aggregate(outcomes(msg.branches).await)
            }
            .into_actor(self)
            .map(move |outcome, node, _| {
                if let Err(error) = &outcome {
                    tracing::debug!(%parent, %error, "a host-owned parent's children failed to release");
                }
                if let Some(manager) = node.manager.upgrade() {
                    manager.do_send(OwnerReleased { parent });
                }
                outcome
            }),
        )
    }
}

/// Combines teardown outcomes: `Ok`, the one failure, or one aggregate naming them all.
pub(crate) fn aggregate(outcomes: Vec<Result<()>>) -> Result<()> {
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
