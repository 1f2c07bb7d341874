//! Provides [`InProcessProvider`], the actor behind the in-process `spawn` and `fork` providers.
//!
//! The actor serializes nothing heavy: each start is validated and its seed cut in the handler
//! (so a fork sees the parent's log as it is when the start arrives), then the child's creation
//! runs as a future beside the mailbox, so starts overlap freely. With a worker pool that future
//! runs on the child's worker instead, so the whole run lives on one thread.

use actix::prelude::*;
use futures::FutureExt;

use tokio::sync::oneshot;
use tracing::Instrument as _;

use crate::error::{ErrorCode, Result, SubagentError};
use crate::seam::child_run::{completed_turn_prefix, start_in_process_run, Placement};
use crate::seam::{
    ContinuableCreateRequest, ContinuableCreateSpec, ResolvedSubagentStartRequest, SubagentRun,
};

/// Whether children start fresh or seeded with the parent's completed turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedPolicy {
    /// A fresh child (`spawn`).
    Fresh,
    /// The parent's balanced completed-turn prefix (`fork`).
    CompletedTurns,
}

/// One in-process provider: creates children in the parent's own runtime.
pub struct InProcessProvider {
    seed: SeedPolicy,
    started: u64,
}

impl InProcessProvider {
    /// A provider with the given seed policy.
    pub fn new(seed: SeedPolicy) -> Self {
        Self { seed, started: 0 }
    }

    fn seed_for(&self, parent: &crate::actors::agent::AgentRef) -> crate::session::Seed {
        match self.seed {
            SeedPolicy::Fresh => crate::session::Seed::default(),
            SeedPolicy::CompletedTurns => completed_turn_prefix(parent.log()),
        }
    }
}

impl Actor for InProcessProvider {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        crate::actors::unbounded_mailbox(ctx);
    }
}

/// Starts one one-shot child. Sent by the provider handle's `start`; `reply` hears where the
/// run arrived: once the child is published, or with the creation's error, nothing left
/// behind. A caller that stopped waiting drops the run, which disposes its child; a stopped
/// provider actor or worker drops `reply`.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct StartOneShot {
    pub(crate) request: ResolvedSubagentStartRequest,
    pub(crate) reply: oneshot::Sender<Result<SubagentRun>>,
}

impl Handler<StartOneShot> for InProcessProvider {
    type Result = ();

    fn handle(&mut self, msg: StartOneShot, _: &mut Context<Self>) {
        self.started += 1;
        let StartOneShot { request, reply } = msg;
        let seed = self.seed_for(&request.request.parent);
        tracing::debug!(parent = %request.request.parent.id(), started = self.started, "one-shot start");
        // The start is prepared when first polled, where the child will live, and the task
        // holds the creation in place of the request (no `async` block keeping both).
        let worker = request.request.parent.agents().worker();
        let placement = if worker.is_some() {
            Placement::Here
        } else {
            Placement::Runtime
        };
        // Run in the caller's span, so the child's prompt carries the caller's trace.
        let trace = request.request.trace.clone();
        let start = futures::future::lazy(move |_| start_in_process_run(request, seed, placement))
            .flatten()
            .map(move |run| {
                let _ = reply.send(run);
            })
            .instrument(trace);
        match worker {
            // The whole run lives on the child's worker: its creation, its agent, the agent's
            // write-behind and the task that drives it, so they talk within one thread and
            // this arbiter only hands the run over. A stopped worker drops `reply`.
            Some(worker) => {
                worker.spawn(start);
            }
            None => {
                actix::spawn(start);
            }
        }
    }
}

/// The arbiter a start was handed to stopped before the child was published: the runtime is
/// shutting down.
pub(crate) fn start_abandoned() -> SubagentError {
    SubagentError::new(
        ErrorCode::AgentDisposed,
        "the child could not start: the runtime is shutting down",
    )
}

/// Prepares a continuable child's creation inputs: nothing for `spawn`, the completed-turn
/// prefix for `fork` (captured once, now).
#[derive(Message)]
#[rtype(result = "ContinuableCreateSpec")]
pub(crate) struct Prepare(pub(crate) ContinuableCreateRequest);

impl Handler<Prepare> for InProcessProvider {
    type Result = MessageResult<Prepare>;

    fn handle(&mut self, msg: Prepare, _: &mut Context<Self>) -> Self::Result {
        let seed = self.seed_for(&msg.0.parent);
        MessageResult(ContinuableCreateSpec {
            seed: (!seed.is_empty()).then_some(seed),
        })
    }
}
