//! Provides [`AgentHandle`]: ownership of a published agent, whose idempotent
//! [`AgentHandle::dispose`] releases the agent and, first, every child it owns.
//!
//! # Disposal order (child first)
//! 1. The agent is marked retiring (a flag the registry reads; an agent that has had children
//!    also asks the registry for its live ones): it takes no new children, and a child still
//!    being created under it is refused at publication.
//! 2. With children, the agent's running turn is cancelled first (cause `disposed`) and new
//!    sends are refused, so cancellation reaches the agent before its children (top-down).
//! 3. Every live child is disposed, each by these same steps (its own children first).
//! 4. The agent's actor retires (pending work discarded, scope unwound, actor stopped).
//! 5. The log's write-behind is closed: what is left is written and the session's lease is
//!    released. The store then holds the whole log (not forced to disk: flush first where that
//!    matters).
//! 6. The registry frees the id (`agent/disposed`). Until then no resume can load a store that
//!    lacks this log's tail.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use actix::Addr;
use futures::future::{BoxFuture, FutureExt, Shared};

use crate::actors::agent::{retire, AgentActor, AgentRef, Cancel, InboxPolicy, SentBy};
use crate::actors::registry::{BeginRetire, Release};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::projection::cache::checkpoint_at_disposal;
use crate::session::CancelCause;

type SharedOutcome = Shared<BoxFuture<'static, Result<()>>>;

/// Finishes a shared task in the background if its last caller stopped waiting for it.
struct FinishOnDrop(Option<SharedOutcome>);

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if let Some(rest) = self.0.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                tokio::spawn(rest);
            }
        }
    }
}

/// Two flags an agent's disposal and the registry share.
///
/// The disposal sets `retiring`, then reads `has_children`; the registry, reserving a child,
/// sets `has_children`, then reads `retiring` (and refuses the child if it is set). Both are
/// sequentially consistent, so at least one side sees the other: either the disposal knows it
/// has children (and asks the registry for them), or the registry refuses the child.
#[derive(Default)]
pub(crate) struct Ownership {
    retiring: AtomicBool,
    has_children: AtomicBool,
}

impl Ownership {
    /// The registry's side: records that a child is being reserved; false if the owner is
    /// retiring (the child must be refused).
    pub(crate) fn admit_child(&self) -> bool {
        self.has_children.store(true, Ordering::SeqCst);
        !self.retiring.load(Ordering::SeqCst)
    }

    /// Whether the owner has begun retiring.
    pub(crate) fn is_retiring(&self) -> bool {
        self.retiring.load(Ordering::SeqCst)
    }

    /// The disposal's side: marks the agent retiring; returns whether it may own children.
    fn retire(&self) -> bool {
        self.retiring.store(true, Ordering::SeqCst);
        self.has_children.load(Ordering::SeqCst)
    }
}

/// Work started at most once and awaited by every caller; dropping a caller never stops it
/// (the work then finishes in a task of its own).
#[derive(Default)]
pub(crate) struct OnceTask {
    task: OnceLock<SharedOutcome>,
}

impl OnceTask {
    /// Starts `start()` as its own task on the first call; every call awaits its outcome.
    ///
    /// # Errors
    /// The task's outcome; `NO_ACTOR_SYSTEM` when called outside a runtime before the task
    /// started (nothing is taken then, so a later call inside the system can start it).
    pub(crate) async fn run(
        &self,
        start: impl FnOnce() -> BoxFuture<'static, Result<()>>,
    ) -> Result<()> {
        if self.task.get().is_none() && tokio::runtime::Handle::try_current().is_err() {
            return Err(SubagentError::new(
                ErrorCode::NoActorSystem,
                "dispose must be called inside the actor system",
            ));
        }
        let shared = self.shared(start);
        // The caller drives the work; if it stops waiting first, the guard hands the rest to a
        // task of its own, so the work always completes (and costs no spawn when awaited).
        let mut guard = FinishOnDrop(Some(shared.clone()));
        let outcome = shared.await;
        guard.0 = None;
        outcome
    }

    fn shared(&self, start: impl FnOnce() -> BoxFuture<'static, Result<()>>) -> SharedOutcome {
        self.task.get_or_init(|| start().shared()).clone()
    }

    /// Whether the task was started.
    pub(crate) fn started(&self) -> bool {
        self.task.get().is_some()
    }
}

struct HandleShared {
    /// Ownership flags shared with the registry, so a childless agent's disposal needs no
    /// registry round trip to retire (see [`Ownership`]).
    ownership: Ownership,
    /// The one strong address of the agent's actor: it runs while an owning handle (the
    /// registry's copy included) exists. References hold it weakly.
    actor: Addr<AgentActor>,
    /// The worker the actor runs on; `None` when it runs on the arbiter that started it.
    arbiter: Option<actix::ArbiterHandle>,
    disposal: OnceTask,
}

/// Owns a published agent. Clones (and the registry's own copy) share one disposal.
///
/// Dropping a handle does not dispose the agent: the registry still owns it, and
/// [`crate::Runtime::shutdown`] releases it. Dispose what you create.
#[derive(Clone)]
#[must_use = "an agent lives until it is disposed: call `dispose` when done with it"]
pub struct AgentHandle {
    agent: AgentRef,
    shared: Arc<HandleShared>,
}

impl std::fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHandle")
            .field("agent", &self.agent)
            .finish()
    }
}

impl AgentHandle {
    /// A handle owning `actor`, which runs on `arbiter` (`None`: the arbiter that started it).
    /// It reaches the registry through the agent's runtime (a handle of its own would allocate
    /// a sender for every agent).
    pub(crate) fn new(
        agent: AgentRef,
        actor: Addr<AgentActor>,
        arbiter: Option<actix::ArbiterHandle>,
    ) -> Self {
        Self {
            agent,
            shared: Arc::new(HandleShared {
                ownership: Ownership::default(),
                actor,
                arbiter,
                disposal: OnceTask::default(),
            }),
        }
    }

    /// The agent.
    pub fn agent(&self) -> &AgentRef {
        &self.agent
    }

    /// The actor's one strong address.
    pub(crate) fn actor(&self) -> &Addr<AgentActor> {
        &self.shared.actor
    }

    /// The worker the agent's actor runs on; `None` when it runs on the arbiter that started it.
    pub(crate) fn arbiter(&self) -> Option<&actix::ArbiterHandle> {
        self.shared.arbiter.as_ref()
    }

    /// Whether disposal has begun.
    pub fn is_disposing(&self) -> bool {
        self.shared.disposal.started()
    }

    /// The ownership flags the registry shares with this agent's disposal.
    pub(crate) fn ownership(&self) -> &Ownership {
        &self.shared.ownership
    }

    /// Releases the agent and, first, every child it owns, in the order of the module docs.
    /// Idempotent: every call, concurrent or later, returns the first call's outcome.
    ///
    /// # Errors
    /// The fault of this agent's log (a durable write that failed, now or earlier), else the
    /// first error of a child's disposal. The agent and its children are released all the same.
    ///
    /// # Cancel safety
    /// Cancel safe: the caller drives the disposal; a call dropped before it finishes hands
    /// the rest to a task of its own, so it is never stranded, and every later call awaits the
    /// same outcome.
    pub async fn dispose(&self) -> Result<()> {
        let handle = self.clone();
        self.shared
            .disposal
            .run(move || release_boxed(handle))
            .await
    }

    /// The disposal of each child, type-erased: disposal recurses through the ownership tree.
    fn dispose_boxed(&self) -> BoxFuture<'static, Result<()>> {
        let handle = self.clone();
        Box::pin(async move { handle.dispose().await })
    }

    async fn release(self) -> Result<()> {
        let agent = &self.agent;
        let exact = (agent.id(), agent.incarnation());
        let children = if self.shared.ownership.retire() {
            agent
                .agents()
                .registry()
                .send(BeginRetire(exact))
                .await
                .unwrap_or_default()
        } else {
            // Never owned a child, and none can be admitted from here on.
            Vec::new()
        };
        let actor = &self.shared.actor;
        if !children.is_empty() {
            // Top-down: this agent stops before its children do (without children, `Retire`
            // below cancels it). A stopped actor has nothing left to cancel.
            let _ = actor
                .send(Cancel {
                    cause: CancelCause::Disposed,
                    inbox: InboxPolicy::Discard,
                    releasing: true,
                    hand_over: false,
                    by: SentBy::Runtime,
                })
                .await;
        }
        let released_children =
            futures::future::join_all(children.iter().map(AgentHandle::dispose_boxed)).await;
        // Refuses new work, waits for the cancelled turn to close, unwinds the scope, stops.
        retire(actor).await;
        let closed = agent.log().inner().close().await;
        if closed.is_ok() {
            // Everything is in the store now, so the last checkpoint cannot get ahead of it.
            checkpoint_at_disposal(agent.agents().env(), agent.log().inner()).await;
        }
        // A disposed agent keeps its events for readers, and nothing else.
        agent.log().inner().retire();
        agent.agents().registry().send(Release(exact)).await.ok();
        closed?;
        released_children.into_iter().collect()
    }
}

fn release_boxed(handle: AgentHandle) -> BoxFuture<'static, Result<()>> {
    Box::pin(handle.release())
}
