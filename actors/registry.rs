//! Provides [`AgentRegistry`]: the actor that knows every live agent by session id, with exact
//! identity, and the ownership edges between them.
//!
//! # Invariants
//! 1. An id is in at most one slot: reserved by one creation in progress, or live.
//! 2. A child's edge to its owner is recorded when the child's id is reserved, and only if the
//!    owner is exactly live (same incarnation) and not retiring; the child is published only if
//!    that still holds, so no child ever outlives, or escapes, its owner.
//! 3. A retiring agent takes no new children; its live children are handed to its disposal,
//!    which releases them before it releases the owner (child first). An agent that never had
//!    a child retires without asking the registry (see `host::handle::Ownership`).
//! 4. `agent/disposed` is emitted as a live slot is freed, in registry order, so it precedes
//!    the `agent/created` of a later incarnation of the same id.

use std::collections::BTreeSet;
use std::sync::Arc;

use actix::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::error::{ErrorCode, Result, SubagentError};
use crate::events::EventBus;
use crate::host::handle::AgentHandle;
use crate::host::{AgentEvent, AgentEventKind};
use crate::ids::{FastHashMap, SessionId};

/// An exact agent identity: session id and incarnation.
pub(crate) type Exact = (SessionId, u64);

/// One id's entry.
struct Slot {
    incarnation: u64,
    /// The owner this agent was created under, when it has one in this runtime.
    owner: Option<SessionId>,
    /// Ids reserved or live under this agent.
    children: BTreeSet<SessionId>,
    state: SlotState,
}

enum SlotState {
    /// A creation in progress.
    Reserved,
    /// A write into the stored session while no agent of it is live (a settled notice for a
    /// parent that is away): held briefly, and waited out by a resume rather than refused.
    Writing,
    /// Published; the handle shares its disposal with every other handle of the agent.
    Live { handle: AgentHandle, retiring: bool },
}

/// The registry of live agents.
pub struct AgentRegistry {
    /// Boxed, as the manager's residents are: buckets stay pointer-sized at a million agents.
    slots: FastHashMap<SessionId, Box<Slot>>,
    /// Set by shutdown: new reservations are refused.
    closing: bool,
    /// Callers waiting for a transient slot (a creation or a write in progress) to become
    /// live or free: kept apart, since almost no slot ever has one.
    waiting: FastHashMap<SessionId, Vec<tokio::sync::oneshot::Sender<()>>>,
    /// Shutdown waits here until no creation is in progress.
    settled: Vec<tokio::sync::oneshot::Sender<()>>,
    events: Arc<EventBus<AgentEvent>>,
}

impl Actor for AgentRegistry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        crate::actors::unbounded_mailbox(ctx);
    }
}

fn owner_gone(owner: SessionId) -> SubagentError {
    SubagentError::new(
        ErrorCode::AgentDisposed,
        format!("owner agent {owner} is not live or is being disposed (inactive context)"),
    )
}

impl AgentRegistry {
    pub(crate) fn new(events: Arc<EventBus<AgentEvent>>) -> Self {
        Self {
            slots: FastHashMap::default(),
            closing: false,
            waiting: FastHashMap::default(),
            settled: Vec::new(),
            events,
        }
    }

    fn reserved(&self) -> usize {
        self.slots
            .values()
            .filter(|slot| matches!(slot.state, SlotState::Reserved | SlotState::Writing))
            .count()
    }

    /// Tells whoever waits on `id` that its slot changed (it became live, or it is free).
    fn wake_waiting(&mut self, id: SessionId) {
        for waiter in self.waiting.remove(&id).unwrap_or_default() {
            // A waiter that stopped listening needs no answer.
            let _ = waiter.send(());
        }
    }

    fn notify_if_settled(&mut self) {
        if !self.settled.is_empty() && self.reserved() == 0 {
            for waiter in self.settled.drain(..) {
                // A waiter that stopped listening needs no answer.
                let _ = waiter.send(());
            }
        }
    }

    /// Whether `owner` is exactly live and takes children (invariant 2).
    fn check_owner(&self, (owner, incarnation): Exact) -> Result<()> {
        match self.slots.get(&owner).map(Box::as_ref) {
            Some(Slot {
                incarnation: live,
                state: SlotState::Live { handle, retiring },
                ..
            }) if *live == incarnation && !*retiring && !handle.ownership().is_retiring() => Ok(()),
            _ => Err(owner_gone(owner)),
        }
    }

    /// [`AgentRegistry::check_owner`], and tells the owner's disposal that it has a child.
    fn admit_child(&self, owner: Exact) -> Result<()> {
        self.check_owner(owner)?;
        match &self.slots.get(&owner.0).map(|slot| &slot.state) {
            Some(SlotState::Live { handle, .. }) if handle.ownership().admit_child() => Ok(()),
            _ => Err(owner_gone(owner.0)),
        }
    }

    fn reserve(
        &mut self,
        (id, incarnation): Exact,
        owner: Option<Exact>,
        purpose: Purpose,
    ) -> Result<Reserved> {
        if self.closing {
            return Err(SubagentError::new(
                ErrorCode::Draining,
                "the runtime is shutting down: no agent can be created",
            ));
        }
        if let Some(slot) = self.slots.get(&id) {
            let passing = match slot.state {
                SlotState::Writing => true,
                SlotState::Reserved => purpose != Purpose::Create,
                SlotState::Live { .. } => false,
            };
            if !passing {
                return Err(SubagentError::new(
                    ErrorCode::DuplicateAgent,
                    format!("agent {id} is already live"),
                ));
            }
            let (freed, wait) = tokio::sync::oneshot::channel();
            self.waiting.entry(id).or_default().push(freed);
            return Ok(Reserved::Busy(wait));
        }
        if let Some(owner) = owner {
            self.admit_child(owner)?;
            if let Some(slot) = self.slots.get_mut(&owner.0) {
                slot.children.insert(id);
            }
        }
        self.slots.insert(
            id,
            Box::new(Slot {
                incarnation,
                owner: owner.map(|(owner, _)| owner),
                children: BTreeSet::new(),
                state: match purpose {
                    Purpose::Write => SlotState::Writing,
                    Purpose::Create | Purpose::Resume => SlotState::Reserved,
                },
            }),
        );
        Ok(Reserved::Done)
    }

    /// Makes a reserved id live, if its owner (when it has one) still takes children;
    /// otherwise frees the reservation and refuses.
    fn publish(
        &mut self,
        handle: AgentHandle,
        owner: Option<Exact>,
        cancel: Option<&CancellationToken>,
    ) -> Result<()> {
        let agent = handle.agent();
        let exact = (agent.id(), agent.incarnation());
        let reserved = matches!(
            self.slots.get(&exact.0).map(Box::as_ref),
            Some(Slot { incarnation, state: SlotState::Reserved, .. }) if *incarnation == exact.1
        );
        let outcome = if !reserved {
            Err(SubagentError::bug(format!(
                "agent {} was published without its reservation",
                exact.0
            )))
        } else if cancel.is_some_and(CancellationToken::is_cancelled) {
            // The token owns the creation until this instant.
            Err(SubagentError::new(
                ErrorCode::Cancelled,
                "agent creation was cancelled before publication",
            ))
        } else if let Some(owner) = owner {
            self.check_owner(owner)
        } else {
            Ok(())
        };
        match outcome {
            Ok(()) => {
                if let Some(slot) = self.slots.get_mut(&exact.0) {
                    slot.state = SlotState::Live {
                        handle,
                        retiring: false,
                    };
                }
                self.wake_waiting(exact.0);
            }
            Err(ref error) => {
                // With a `do_send` publication nobody hears this reply: say it here.
                tracing::debug!(session_id = %exact.0, %error, "publication refused");
                self.remove(exact);
            }
        }
        self.notify_if_settled();
        outcome
    }

    /// Frees the id if its slot is exactly this incarnation; returns the freed slot.
    fn remove(&mut self, (id, incarnation): Exact) -> Option<Box<Slot>> {
        if self.slots.get(&id)?.incarnation != incarnation {
            return None;
        }
        let slot = self.slots.remove(&id)?;
        if let Some(owner) = slot.owner.and_then(|owner| self.slots.get_mut(&owner)) {
            owner.children.remove(&id);
        }
        if let SlotState::Live { .. } = slot.state {
            // Invariant 4.
            self.events.emit(&AgentEvent {
                agent: id,
                kind: AgentEventKind::Disposed,
            });
        }
        self.wake_waiting(id);
        self.notify_if_settled();
        Some(slot)
    }

    /// Marks the agent retiring and hands back its live children (invariant 3).
    fn begin_retire(&mut self, (id, incarnation): Exact) -> Vec<AgentHandle> {
        let children = match self.slots.get_mut(&id) {
            Some(slot) if slot.incarnation == incarnation => {
                if let SlotState::Live { retiring, .. } = &mut slot.state {
                    *retiring = true;
                }
                slot.children.clone()
            }
            _ => return Vec::new(),
        };
        children
            .iter()
            .filter_map(|child| self.live_handle(*child))
            .collect()
    }

    /// A creation's future was dropped: a reservation is freed; an agent it already published is
    /// disposed in the background, so it is never left without an owner.
    fn abandon(&mut self, exact: Exact) {
        match self.slots.get(&exact.0) {
            Some(slot) if slot.incarnation == exact.1 => match &slot.state {
                SlotState::Reserved | SlotState::Writing => {
                    self.remove(exact);
                }
                SlotState::Live { handle, .. } => {
                    let handle = handle.clone();
                    actix::spawn(async move {
                        if let Err(error) = handle.dispose().await {
                            tracing::warn!(session_id = %exact.0, %error, "disposing an abandoned agent failed");
                        }
                    });
                }
            },
            _ => {}
        }
    }

    fn live_handle(&self, id: SessionId) -> Option<AgentHandle> {
        match &self.slots.get(&id)?.state {
            SlotState::Live { handle, .. } => Some(handle.clone()),
            SlotState::Reserved | SlotState::Writing => None,
        }
    }

    /// Live agents whose owner is not live in this registry: the roots of the ownership forest.
    fn roots(&self) -> Vec<AgentHandle> {
        self.slots
            .iter()
            .filter(|(_, slot)| {
                slot.owner
                    .is_none_or(|owner| !self.slots.contains_key(&owner))
            })
            .filter_map(|(id, _)| self.live_handle(*id))
            .collect()
    }
}

/// What an id is reserved for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// A creation under a caller's id: an id taken in any way is `DUPLICATE_AGENT`.
    Create,
    /// A resume: an id held only for a moment (another creation or resume, a write) is waited
    /// out, so a losing resume hears `DUPLICATE_AGENT` only once the winner is live.
    Resume,
    /// A write into the stored session while no agent of it is live: waits as a resume does,
    /// and is itself waited out by every reservation.
    Write,
}

/// Whether a reservation was made.
#[derive(Debug)]
pub(crate) enum Reserved {
    /// The id is reserved.
    Done,
    /// The id is held for a moment: resolves when its slot becomes live or free, for the
    /// caller to ask again.
    Busy(tokio::sync::oneshot::Receiver<()>),
}

/// Reserves an id for `purpose`, recording its edge to `owner`. Replies `DRAINING` during
/// shutdown, `DUPLICATE_AGENT` when the id is taken (for a creation, or live), `AGENT_DISPOSED`
/// when the owner is not exactly live or is retiring, and [`Reserved::Busy`] when the caller is
/// to wait and ask again.
#[derive(Message)]
#[rtype(result = "Result<Reserved>")]
pub(crate) struct Reserve {
    pub(crate) agent: Exact,
    pub(crate) owner: Option<Exact>,
    pub(crate) purpose: Purpose,
}

impl Handler<Reserve> for AgentRegistry {
    type Result = Result<Reserved>;

    fn handle(&mut self, msg: Reserve, _: &mut Context<Self>) -> Self::Result {
        self.reserve(msg.agent, msg.owner, msg.purpose)
    }
}

/// Makes a reserved id live; with `reserved` false, reserves it first in the same step (a
/// minted id, which no other creation can want). Replies as [`Reserve`] does, `CANCELLED` when
/// the creation token fired, or `AGENT_DISPOSED` when the owner stopped taking children
/// meanwhile (freeing the reservation either way); the creation then unwinds the started
/// agent.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub(crate) struct Publish {
    pub(crate) handle: AgentHandle,
    pub(crate) owner: Option<Exact>,
    pub(crate) cancel: Option<CancellationToken>,
    pub(crate) reserved: bool,
}

impl Handler<Publish> for AgentRegistry {
    type Result = Result<()>;

    fn handle(&mut self, msg: Publish, _: &mut Context<Self>) -> Self::Result {
        if !msg.reserved {
            let agent = msg.handle.agent();
            // A minted id: nothing else can hold it, so it is never busy.
            if let Reserved::Busy(_) = self.reserve(
                (agent.id(), agent.incarnation()),
                msg.owner,
                Purpose::Create,
            )? {
                return Err(SubagentError::bug("a minted id was found busy"));
            }
        }
        self.publish(msg.handle, msg.owner, msg.cancel.as_ref())
    }
}

/// Sent by a creation's drop guard (`do_send`: it must reach the registry from `Drop`).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Abandon(pub(crate) Exact);

impl Handler<Abandon> for AgentRegistry {
    type Result = ();

    fn handle(&mut self, msg: Abandon, _: &mut Context<Self>) {
        self.abandon(msg.0);
    }
}

/// Marks an agent retiring (it takes no new children) and replies with its live children.
#[derive(Message)]
#[rtype(result = "Vec<AgentHandle>")]
pub(crate) struct BeginRetire(pub(crate) Exact);

impl Handler<BeginRetire> for AgentRegistry {
    type Result = MessageResult<BeginRetire>;

    fn handle(&mut self, msg: BeginRetire, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.begin_retire(msg.0))
    }
}

/// Frees an id if its slot is exactly this incarnation.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Release(pub(crate) Exact);

impl Handler<Release> for AgentRegistry {
    type Result = ();

    fn handle(&mut self, msg: Release, _: &mut Context<Self>) {
        self.remove(msg.0);
    }
}

/// Shutdown: refuses new reservations, and resolves once no creation is in progress.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Close;

impl Handler<Close> for AgentRegistry {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Close, _: &mut Context<Self>) -> Self::Result {
        self.closing = true;
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.settled.push(sender);
        self.notify_if_settled();
        Box::pin(async move {
            // A dropped sender means the registry stopped: nothing is in progress any more.
            let _ = receiver.await;
        })
    }
}

/// Looks up the live agent of a session.
#[derive(Message)]
#[rtype(result = "Option<AgentHandle>")]
pub(crate) struct Lookup(pub(crate) SessionId);

impl Handler<Lookup> for AgentRegistry {
    type Result = Option<AgentHandle>;

    fn handle(&mut self, msg: Lookup, _: &mut Context<Self>) -> Self::Result {
        self.live_handle(msg.0)
    }
}

/// Lists every live agent.
#[derive(Message)]
#[rtype(result = "Vec<AgentHandle>")]
pub(crate) struct ListLive;

impl Handler<ListLive> for AgentRegistry {
    type Result = MessageResult<ListLive>;

    fn handle(&mut self, _: ListLive, _: &mut Context<Self>) -> Self::Result {
        MessageResult(
            self.slots
                .keys()
                .filter_map(|id| self.live_handle(*id))
                .collect(),
        )
    }
}

/// Lists the roots of the ownership forest (live agents without a live owner).
#[derive(Message)]
#[rtype(result = "Vec<AgentHandle>")]
pub(crate) struct Roots;

impl Handler<Roots> for AgentRegistry {
    type Result = MessageResult<Roots>;

    fn handle(&mut self, _: Roots, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.roots())
    }
}
