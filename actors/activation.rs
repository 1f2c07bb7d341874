//! Provides [`Activation`], the actor that holds one resident continuable child: its retained
//! [`AgentHandle`] and the epoch's boundary in the child's log.
//!
//! The continuation manager decides everything about an Activation (admission, ownership,
//! settlement) in its own handler; the Activation carries out the one long piece of work that
//! must not hold the manager up: the teardown of its epoch. Teardown awaits the owned children's
//! disposals (already opened top-down by the manager), waits for the child to be quiescent,
//! takes one of the manager's release permits, makes its log durable (best effort: a failure is
//! logged), captures the epoch's terminal facts while the child is still registered, and
//! disposes the handle (which drains the session log into the store and releases the lease).
//! It then settles the epoch through the [`Settlement`] the manager handed it (the manager
//! hears the facts, the parent its notice, the disposal's awaiters the outcome) and stops.

use std::sync::Arc;

use actix::prelude::*;
use futures::future::{BoxFuture, Shared};
use tokio::sync::Semaphore;

use crate::actors::manager::Settlement;
use crate::content::ContentBlock;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::{AgentHandle, BudgetLimit};
use crate::session::{
    continuable_stop_reason, final_assistant_output, fold_consumed_work, TurnEndReason,
};
use crate::stop_reason::StopReason;

/// A disposal in progress, shared by everyone who waits for it.
pub(crate) type Disposal = Shared<BoxFuture<'static, Result<()>>>;

/// Waits for every disposal in `disposals` and answers their outcomes in order.
///
/// Each disposal is driven by a task of its own, so a waiter only observes it: awaiting them
/// one after another costs each one poll when it is over. A concurrent join would instead keep
/// a hundred thousand of them in one poll set, re-polling them whenever the runtime's
/// cooperative budget runs out, which made a large drain quadratic.
pub(crate) async fn outcomes(disposals: Vec<Disposal>) -> Vec<Result<()>> {
    let mut outcomes = Vec::with_capacity(disposals.len());
    for disposal in disposals {
        outcomes.push(disposal.await);
    }
    outcomes
}

/// How an epoch ended, as the parent's notice and `subagent/end` report it.
#[derive(Debug, Clone)]
pub(crate) struct Terminal {
    /// The epoch's own stop reason (`error` when any teardown step failed).
    pub(crate) stop_reason: StopReason,
    /// The epoch's final assistant output; withheld when teardown failed.
    pub(crate) output: Option<Vec<ContentBlock>>,
    /// Every teardown failure, combined.
    pub(crate) failure: Option<SubagentError>,
    /// The budget limit the epoch's last turn reached, when it ended `budget-exhausted`.
    pub(crate) exhausted: Option<BudgetLimit>,
}

impl Terminal {
    /// An epoch whose teardown failed: `error`, output withheld.
    pub(crate) fn failed(failure: SubagentError) -> Self {
        Self {
            stop_reason: StopReason::Error,
            output: None,
            failure: Some(failure),
            exhausted: None,
        }
    }
}

/// One resident continuable child.
pub(crate) struct Activation {
    handle: Option<AgentHandle>,
    /// The child's log length when this epoch began: a resumed epoch never reports an earlier
    /// epoch's answer.
    boundary: usize,
}

impl Activation {
    fn new(handle: AgentHandle, boundary: usize) -> Self {
        Self {
            handle: Some(handle),
            boundary,
        }
    }

    /// Starts the Activation of `handle`'s epoch (from log length `boundary`) on its child's
    /// worker, so the teardown (the final flush, the capture, the release with its checkpoint)
    /// runs beside the child and not on the manager's thread: a drain on two workers, or a
    /// load run settling tens of thousands of epochs, then spreads it over both. When the
    /// worker has stopped (the system is shutting down), it starts on the calling arbiter, as
    /// every Activation did before.
    pub(crate) fn start_beside(handle: AgentHandle, boundary: usize) -> Addr<Self> {
        if let Some(worker) = handle.arbiter().cloned() {
            let beside = handle.clone();
            let activation = Self::start_in_arbiter(&worker, move |_| Self::new(beside, boundary));
            if activation.connected() {
                return activation;
            }
        }
        Self::new(handle, boundary).start()
    }
}

impl Actor for Activation {
    type Context = Context<Self>;
}

/// Tears the epoch down (owned children first, then the child itself) and settles it. Sent
/// once per Activation (the manager memoizes the disposal).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Teardown {
    /// The owned children's disposals, opened before this one's.
    pub(crate) children: Vec<Disposal>,
    /// The manager's bound on releases under way at once (see [`RELEASES_AT_ONCE`]).
    pub(crate) releases: Arc<Semaphore>,
    /// Carried out once the epoch is torn down (or, dropped unsettled, by the manager).
    pub(crate) settlement: Settlement,
}

/// How many Activations release their child at once. A release holds the child's final flush
/// and its projection checkpoint in memory; a drain opens every disposal at once, so without a
/// bound a drain of a million children would hold a million checkpoints together. A permit is
/// taken only once the owned children are gone and the child is quiescent, and never while
/// waiting on another disposal, so the bound cannot deadlock a child-first drain.
pub(crate) const RELEASES_AT_ONCE: usize = 512;

impl Handler<Teardown> for Activation {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: Teardown, _: &mut Context<Self>) -> Self::Result {
        let handle = self.handle.take();
        let boundary = self.boundary;
        let Teardown {
            children,
            releases,
            settlement,
        } = msg;
        Box::pin(
            async move {
                let terminal = tear_down(handle, boundary, children, releases).await;
                settlement.settle(terminal).await;
            }
            .into_actor(self)
            .map(|(), _, ctx| ctx.stop()),
        )
    }
}

/// Tears an epoch down: waits for the owned children's disposals, then for the child to be
/// quiescent, takes a release permit (given back before the epoch settles), makes the log
/// durable, captures the epoch's facts and disposes the handle.
async fn tear_down(
    handle: Option<AgentHandle>,
    boundary: usize,
    children: Vec<Disposal>,
    releases: Arc<Semaphore>,
) -> Terminal {
    let mut failures = Vec::new();
    let children = outcomes(children).await;
    let failed_children = children.iter().filter(|outcome| outcome.is_err()).count();
    if failed_children > 0 {
        failures.push(format!(
            "child teardown failed ({failed_children} branch(es))"
        ));
    }
    let Some(handle) = handle else {
        return Terminal::failed(SubagentError::bug("an Activation was torn down twice"));
    };
    let child = handle.agent().clone();
    child.when_idle().await;
    // The semaphore is never closed; a closed one would only lift the bound.
    let _release = releases.acquire_owned().await.ok();
    // The best-effort final flush (the seed's durability barrier before release),
    // after the cancel and before capture. Not `log.flush()`: a failed write-behind
    // flush faults the log, and disposal would then fail the epoch. A failure is
    // logged, never the Activation's.
    if let Some(store) = child.agents().env().store.clone() {
        let flushed = match child.log().drain().await {
            Ok(()) => store.flush(child.id()).await,
            Err(error) => Err(error),
        };
        if let Err(error) = flushed {
            tracing::warn!(
                child = %child.id(),
                %error,
                "best-effort final session flush failed; a later resume may find \
                 the child's state missing or stale"
            );
        }
    }
    // Captured while the child is still registered, from this epoch's events only.
    let (work, output) = child.log().with_events(|events| {
        (
            fold_consumed_work(events.iter_from(boundary)),
            final_assistant_output(events.iter_from(boundary)),
        )
    });
    let exhausted = match &work.end {
        Some(TurnEndReason::BudgetExhausted { limit }) => Some(*limit),
        _ => None,
    };
    if let Err(error) = handle.dispose().await {
        failures.push(format!("the child's handle failed to dispose: {error}"));
    }
    if failures.is_empty() {
        Terminal {
            stop_reason: continuable_stop_reason(&work),
            output: Some(output),
            failure: None,
            exhausted,
        }
    } else {
        Terminal::failed(SubagentError::new(
            ErrorCode::ActivationTeardownFailed,
            format!(
                "continuable child {} failed to tear down: {}",
                child.id(),
                failures.join("; ")
            ),
        ))
    }
}
