//! Provides [`ContinuationManager`], the supervisor of continuable children: it owns the
//! Activation map, the materializations in flight, the admission cutoffs (scoped and
//! manager-wide), the ownership graph between Activations, and child-first disposal.
//!
//! # One handler is the per-child lock
//! Every decision about a child — admission, authorization, delivery, the settlement decision,
//! opening a disposal — is made inside one handler of this actor, reading one map, with no
//! await in between. The reference serializes these with a per-child promise chain; here the
//! mailbox does it, and no decision ever waits on another actor. What takes time (creating or
//! resuming the child's agent, reading the store, tearing an epoch down) runs outside the
//! handler and comes back as a message whose handler re-checks admission and authority.
//!
//! # Data flow
//! caller → `Subagents` → manager → the child's agent mailbox. A delivery is posted to the
//! agent in mailbox order from inside the handler that admitted it (so a later cancel can never
//! overtake it), and its id enters the Activation's `accepted` set in the same span. The agent
//! reports back only [`Activity`] (claimed, discarded, idle), in its own order.
//!
//! # Residency
//! An Activation is **running** while its agent runs a turn or an accepted message is still
//! unclaimed, **waiting** while it owns a child Activation, and **settled** otherwise. A settled
//! Activation's disposal opens in the same handler that saw it settle, so a racing delivery
//! either was admitted first or sees the disposal and cold-resumes after it.
//!
//! # Disposal, child first
//! Opening a disposal cancels the child's turn (inbox discarded) and opens every owned child's
//! disposal in the same span, so cancellation runs top-down before any await. The epoch's
//! [`Activation`] then awaits the children, captures the epoch's facts and disposes the handle;
//! the manager removes the Activation, sends the parent its settled notice **before** releasing
//! the ownership that lets the parent settle, and emits `subagent/end`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use actix::prelude::*;
use futures::future::{join_all, BoxFuture, FutureExt, Shared};
use tokio_util::sync::CancellationToken;

use crate::actors::activation::{Activation, Disposal, Teardown, Terminal};
use crate::actors::agent::{Activity, AgentRef, InboxPolicy, PostTarget, Wake};
use crate::actors::agents::Agents;
use crate::actors::service::{LookupContinuable, SubagentService};
use crate::content::{ContentBlock, Message, MessageSource};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::events::EventBus;
use crate::host::{
    AgentHandle, AgentOptions, AgentScope, Budget, BudgetMeter, BudgetRaise, BudgetSpent,
    CreateAgent, ResumeAgent, SetupCommit,
};
use crate::ids::{MessageId, RunId, SessionId};
use crate::seam::budget;
use crate::seam::child_run::{child_options, ChildComposition};
use crate::seam::continuable::{
    report_content, settled_notice, ContinuableStart, ContinuableStartSpec, InterruptAuthority,
    ReportDelivery,
};
use crate::seam::depth::resolve_child_depth;
use crate::seam::setup::{SetupBatch, SetupRegistry};
use crate::seam::{
    ContinuableCreateRequest, DelegationMode, SubagentDescriptor, SubagentEvent,
    SubagentRunEndInfo, SubagentRunInfo,
};
use crate::session::{CancelCause, InboxTarget, SessionLog};

/// Something in flight that others wait for; resolves when it is over, whatever its outcome.
type Signal = Shared<BoxFuture<'static, ()>>;

fn signal() -> (tokio::sync::oneshot::Sender<()>, Signal) {
    let (done, over) = tokio::sync::oneshot::channel::<()>();
    (
        done,
        async move {
            let _ = over.await;
        }
        .boxed()
        .shared(),
    )
}

/// An admitted creation or cold resume that has not been installed or rolled back yet.
struct Materialization {
    /// The lineage below which it runs (its parent, then the parent's ancestors).
    lineage: Vec<SessionId>,
    over: Signal,
}

/// A scoped drain's cutoff: admission is closed below `root` until it leaves the registry.
struct ClosingScope {
    root: AgentRef,
    /// The drained Activations and their lineages.
    members: HashSet<SessionId>,
}

/// The manager's record of one resident Activation.
struct Resident {
    agent: AgentRef,
    activation: Addr<Activation>,
    /// The exact parent the Activation was materialized under; its id is the child's durable
    /// direct parent (`header.parentSession`), and notices go to it when it is not resident.
    parent: AgentRef,
    /// The child, its parent and the parent's ancestors, observed at materialization; it
    /// survives intermediates leaving the registry.
    ancestry: Vec<SessionId>,
    /// The parent's id when the parent is itself a resident Activation.
    owner: Option<SessionId>,
    owned: HashSet<SessionId>,
    /// Waking sends the agent has not yet claimed or discarded.
    accepted: HashSet<MessageId>,
    /// Whether the agent is running, as its activity last said.
    busy: bool,
    /// Whether a message was ever submitted (before that, an idle agent is not settled).
    armed: bool,
    /// Whether a caller ever received an id for this epoch (a rolled-back start never did).
    announced: bool,
    disposal: Option<Disposal>,
    run: SubagentRunInfo,
    /// The child's budget and spending, shared with its agent's turn driver.
    budget: BudgetMeter,
}

/// The continuation manager actor.
pub(crate) struct ContinuationManager {
    agents: Agents,
    service: Addr<SubagentService>,
    events: Arc<EventBus<SubagentEvent>>,
    setup: Arc<SetupRegistry>,
    residents: HashMap<SessionId, Resident>,
    materializations: HashMap<u64, Materialization>,
    /// Children whose cold resume is in flight: another delivery waits for it.
    resuming: HashMap<SessionId, Signal>,
    closing: HashMap<SessionId, ClosingScope>,
    draining: bool,
    next_materialization: u64,
}

impl Actor for ContinuationManager {
    type Context = Context<Self>;
}

fn cancelled() -> SubagentError {
    SubagentError::new(
        ErrorCode::Cancelled,
        "the caller cancelled before the message was accepted",
    )
}

fn draining() -> SubagentError {
    SubagentError::new(
        ErrorCode::Draining,
        "continuable admission is closed: a drain is in progress below this agent",
    )
}

fn unauthorized(message: String) -> SubagentError {
    SubagentError::new(ErrorCode::Unauthorized, message)
}

impl ContinuationManager {
    pub(crate) fn new(
        agents: Agents,
        service: Addr<SubagentService>,
        events: Arc<EventBus<SubagentEvent>>,
        setup: Arc<SetupRegistry>,
    ) -> Self {
        Self {
            agents,
            service,
            events,
            setup,
            residents: HashMap::new(),
            materializations: HashMap::new(),
            resuming: HashMap::new(),
            closing: HashMap::new(),
            draining: false,
            next_materialization: 0,
        }
    }

    /// `agent`, then its ancestors as far as they can be read without waiting: the header's
    /// direct parent, then resident Activations' recorded ancestry.
    fn lineage_of(&self, agent: &AgentRef) -> Vec<SessionId> {
        if let Some(resident) = self.residents.get(&agent.id()) {
            if resident.agent == *agent {
                return resident.ancestry.clone();
            }
        }
        let mut lineage = vec![agent.id()];
        if let Some(parent) = agent.header().parent_session {
            match self.residents.get(&parent) {
                Some(resident) => {
                    for id in &resident.ancestry {
                        if !lineage.contains(id) {
                            lineage.push(*id);
                        }
                    }
                }
                None => lineage.push(parent),
            }
        }
        lineage
    }

    /// `DRAINING` when a manager-wide drain runs, or a scoped drain's root (still live) is in
    /// `lineage` or recorded `lineage[0]` as a member.
    fn assert_admitting(&mut self, lineage: &[SessionId]) -> Result<()> {
        if self.draining {
            return Err(draining());
        }
        // A scoped cutoff lasts until its exact root leaves the registry.
        self.closing.retain(|_, scope| scope.root.is_alive());
        let closed = self.closing.iter().any(|(root, scope)| {
            lineage.contains(root) || lineage.first().is_some_and(|id| scope.members.contains(id))
        });
        if closed {
            Err(draining())
        } else {
            Ok(())
        }
    }

    fn is_closing(&mut self, lineage: &[SessionId]) -> bool {
        self.assert_admitting(lineage).is_err()
    }

    /// Registers an admitted materialization below `lineage` (and, for a cold resume, as the
    /// child's resume in flight); the guard ends it on every exit path.
    fn register_materialization(
        &mut self,
        lineage: Vec<SessionId>,
        resuming: Option<SessionId>,
        ctx: &Context<Self>,
    ) -> MaterializationGuard {
        self.next_materialization += 1;
        let id = self.next_materialization;
        let (done, over) = signal();
        if let Some(child) = resuming {
            self.resuming.insert(child, over.clone());
        }
        self.materializations
            .insert(id, Materialization { lineage, over });
        MaterializationGuard {
            manager: ctx.address(),
            id,
            resuming,
            done: Some(done),
        }
    }

    /// Admits `message` for `child` under `parent` and posts it, in one span: the caller's
    /// token, admission, the disposal cutoff, the parent's authority, then the `accepted` set
    /// and the post. The returned future resolves at inbox acceptance.
    fn submit(
        &mut self,
        child: SessionId,
        parent: &AgentRef,
        delivery: Delivery,
        token: &CancellationToken,
        ctx: &mut Context<Self>,
    ) -> Result<BoxFuture<'static, Result<MessageId>>> {
        let Delivery { message, raise } = delivery;
        if token.is_cancelled() {
            return Err(cancelled());
        }
        let lineage = self.lineage_of(parent);
        self.assert_admitting(&lineage)?;
        let resident = self.residents.get_mut(&child).ok_or_else(|| {
            SubagentError::new(
                ErrorCode::ActivationClosing,
                format!("continuable child {child} is no longer resident"),
            )
        })?;
        if resident.disposal.is_some() {
            return Err(SubagentError::new(
                ErrorCode::ActivationClosing,
                format!("continuable child {child} is already settling"),
            ));
        }
        if !parent.is_alive() {
            return Err(unauthorized(format!(
                "agent {} is not the exact live parent of continuable child {child}",
                parent.id()
            )));
        }
        if resident.parent.id() != parent.id() {
            return Err(unauthorized(format!(
                "continuable child {child} belongs to another parent session"
            )));
        }
        let (current, spent) = resident.budget.snapshot();
        budget::admit(child, &raise.unwrap_or(current), &spent)?;
        let raise = raise.map(|budget| BudgetRaise {
            budget,
            record: budget::budget_event(&budget),
        });
        let id = message.id;
        resident.accepted.insert(id);
        resident.armed = true;
        resident.announced = true;
        let accepted = resident.agent.post(
            message,
            PostTarget::Inbox(InboxTarget::NextTurn, Wake::Wake),
            raise,
        );
        let manager = ctx.address();
        Ok(async move {
            let outcome = accepted.await;
            if outcome.is_err() {
                manager.do_send(Refused { child, message: id });
            }
            outcome
        }
        .boxed())
    }

    /// Re-evaluates `child`'s residency and opens its disposal once it settled.
    fn evaluate(&mut self, child: SessionId, ctx: &mut Context<Self>) {
        let settled = self.residents.get(&child).is_some_and(|resident| {
            resident.armed
                && resident.disposal.is_none()
                && !resident.busy
                && resident.accepted.is_empty()
                && resident.owned.is_empty()
        });
        if settled {
            tracing::debug!(%child, "continuable child settled");
            let _ = self.open_disposal(child, ctx);
        }
    }

    /// Opens `child`'s disposal (memoized): cancels its turn and discards its inbox, opens
    /// every owned child's disposal in the same span (top-down), and starts the teardown.
    fn open_disposal(&mut self, child: SessionId, ctx: &mut Context<Self>) -> Option<Disposal> {
        let resident = self.residents.get_mut(&child)?;
        if let Some(disposal) = &resident.disposal {
            return Some(disposal.clone());
        }
        resident
            .agent
            .cancel_now(CancelCause::Parent, InboxPolicy::Discard);
        let activation = resident.activation.clone();
        let mut owned: Vec<SessionId> = resident.owned.iter().copied().collect();
        owned.sort_unstable();
        // A placeholder memo first: nothing below can reach this child again, but the memo
        // must exist before any other work is opened.
        let (done, over) = signal();
        resident.disposal = Some(over.map(|()| Ok(())).boxed().shared());
        let children: Vec<Disposal> = owned
            .into_iter()
            .filter_map(|owned| self.open_disposal(owned, ctx))
            .collect();
        let manager = ctx.address();
        let disposal: Disposal = async move {
            let terminal = activation
                .send(Teardown { children })
                .await
                .unwrap_or_else(|_| {
                    Terminal::failed(SubagentError::bug("an Activation stopped before teardown"))
                });
            let outcome = manager
                .send(Finished { child, terminal })
                .await
                .unwrap_or_else(|error| Err(SubagentError::from(error)));
            let _ = done.send(());
            outcome
        }
        .boxed()
        .shared();
        if let Some(resident) = self.residents.get_mut(&child) {
            resident.disposal = Some(disposal.clone());
        }
        // Driven on its own: a teardown never depends on anyone awaiting it.
        let driven = disposal.clone();
        tokio::spawn(async move {
            if let Err(error) = driven.await {
                tracing::warn!(%child, %error, "activation teardown failed");
            }
        });
        Some(disposal)
    }

    /// Delivers the settled notice for a finished epoch to the child's durable parent.
    fn notify_settlement(
        &mut self,
        resident: &Resident,
        terminal: &Terminal,
        ctx: &mut Context<Self>,
    ) {
        let child = resident.agent.id();
        let (content, source) = settled_notice(
            child,
            &terminal.stop_reason,
            terminal.exhausted,
            terminal.output.clone(),
        );
        let message = Message::user(content, source);
        let parent_lineage = self.lineage_of(&resident.parent);
        let closing = self.is_closing(&parent_lineage);
        // A parent whose lineage is tearing down, or whose own disposal has begun, records the
        // notice without a wake: waking it would start a turn its teardown must then cancel.
        let recipient = match self.residents.get_mut(&resident.parent.id()) {
            Some(parent) if !closing && parent.disposal.is_none() => {
                // Counted before the send, so the parent cannot look settled meanwhile.
                parent.accepted.insert(message.id);
                Some((parent.agent.clone(), true, false))
            }
            Some(parent) => Some((parent.agent.clone(), false, true)),
            None if resident.parent.is_alive() => Some((resident.parent.clone(), false, closing)),
            None => None,
        };
        let Some((parent, counted, quiet)) = recipient else {
            tracing::debug!(%child, "the settled child's parent is gone; its session is the record");
            return;
        };
        let target = if quiet {
            PostTarget::Inbox(InboxTarget::NextStep, Wake::Quiet)
        } else {
            PostTarget::TurnOrStep
        };
        let id = message.id;
        let parent_id = parent.id();
        let accepted = parent.post(message, target, None);
        let manager = ctx.address();
        tokio::spawn(async move {
            if let Err(error) = accepted.await {
                tracing::warn!(%child, parent = %parent_id, %error, "settlement notice was not delivered to its parent");
                if counted {
                    manager.do_send(Refused {
                        child: parent_id,
                        message: id,
                    });
                }
            }
        });
    }
}

/// Internal: a post was refused; its id leaves `accepted`.
#[derive(Message)]
#[rtype(result = "()")]
struct Refused {
    child: SessionId,
    message: MessageId,
}

impl Handler<Refused> for ContinuationManager {
    type Result = ();

    fn handle(&mut self, msg: Refused, ctx: &mut Context<Self>) {
        if let Some(resident) = self.residents.get_mut(&msg.child) {
            resident.accepted.remove(&msg.message);
            self.evaluate(msg.child, ctx);
        }
    }
}

/// Internal: what a resident child's agent did (sent by the agent, in its order).
#[derive(Message)]
#[rtype(result = "()")]
struct AgentActivity {
    child: SessionId,
    activity: Activity,
}

impl Handler<AgentActivity> for ContinuationManager {
    type Result = ();

    fn handle(&mut self, msg: AgentActivity, ctx: &mut Context<Self>) {
        let Some(resident) = self.residents.get_mut(&msg.child) else {
            return;
        };
        match msg.activity {
            Activity::Claimed(id) => {
                resident.accepted.remove(&id);
                resident.busy = true;
            }
            Activity::Discarded(id) => {
                resident.accepted.remove(&id);
            }
            Activity::Idle => resident.busy = false,
        }
        self.evaluate(msg.child, ctx);
    }
}

/// Removes a finished materialization and wakes whoever waits for it, on every exit path.
struct MaterializationGuard {
    manager: Addr<ContinuationManager>,
    id: u64,
    resuming: Option<SessionId>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for MaterializationGuard {
    fn drop(&mut self) {
        // Queued before the waiters wake, so their next message sees it gone.
        self.manager.do_send(MaterializationOver {
            id: self.id,
            resuming: self.resuming,
        });
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }
}

/// Internal: a materialization is over (installed or rolled back).
#[derive(Message)]
#[rtype(result = "()")]
struct MaterializationOver {
    id: u64,
    resuming: Option<SessionId>,
}

impl Handler<MaterializationOver> for ContinuationManager {
    type Result = ();

    fn handle(&mut self, msg: MaterializationOver, _: &mut Context<Self>) {
        self.materializations.remove(&msg.id);
        if let Some(child) = msg.resuming {
            self.resuming.remove(&child);
        }
    }
}

/// The setup every Activation gets (fresh or resumed): its composition and the deployment's
/// setup contributions, whose batch is committed once the agent is published.
fn activation_setup(
    composition: ChildComposition,
    descriptor: Option<SubagentDescriptor>,
    registry: Arc<SetupRegistry>,
    slot: Arc<std::sync::Mutex<Option<SetupBatch>>>,
) -> impl FnOnce(&mut AgentScope, &SessionLog) -> Result<Option<SetupCommit>> + Send + 'static {
    move |scope: &mut AgentScope, log: &SessionLog| {
        // The descriptor precedes the delegated policy and the first turn (fresh children).
        if let Some(descriptor) = descriptor {
            log.append(descriptor.event())?;
        }
        composition.apply(scope, log)?;
        let batch = registry.apply(scope)?;
        *slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(batch);
        Ok(None)
    }
}

/// Commits a published child's setup batch, or disposes the child when a contribution was
/// revoked while it was built.
async fn commit_setup(
    handle: &AgentHandle,
    slot: &std::sync::Mutex<Option<SetupBatch>>,
) -> Result<()> {
    let batch = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(batch) = batch {
        if let Err(error) = batch.commit() {
            if let Err(release) = handle.dispose().await {
                tracing::warn!(%release, "a revoked child failed to dispose");
            }
            return Err(error);
        }
    }
    Ok(())
}

fn map_cancelled(error: SubagentError) -> SubagentError {
    if error.code() == ErrorCode::Cancelled {
        cancelled()
    } else {
        error
    }
}

/// What is installed once a child's agent is published.
struct Installing {
    handle: AgentHandle,
    parent: AgentRef,
    lineage: Vec<SessionId>,
    provider: String,
    boundary: usize,
    budget: BudgetMeter,
}

/// A message for a resident child, and the budget it raises (if it does).
#[derive(Clone)]
pub(crate) struct Delivery {
    pub(crate) message: Message,
    pub(crate) raise: Option<Budget>,
}

/// Installs an Activation and submits its first message; rolls back on any failure.
async fn install_and_submit(
    manager: Addr<ContinuationManager>,
    installing: Installing,
    delivery: Delivery,
    token: CancellationToken,
) -> Result<MessageId> {
    let handle = installing.handle.clone();
    let child = handle.agent().id();
    let parent = installing.parent.clone();
    let installed = manager
        .send(Install {
            installing,
            token: token.clone(),
        })
        .await
        .map_err(SubagentError::from)
        .and_then(|outcome| outcome);
    if let Err(error) = installed {
        // Never installed: no lifecycle edge, no notice; just release the agent.
        if let Err(release) = handle.dispose().await {
            tracing::warn!(%child, %release, "an uninstalled child failed to dispose");
        }
        return Err(error);
    }
    let accepted = match manager
        .send(Submit {
            child,
            parent,
            delivery,
            token,
        })
        .await
        .map_err(SubagentError::from)
        .and_then(|outcome| outcome)
    {
        Ok(accepted) => accepted.await,
        Err(error) => Err(error),
    };
    match accepted {
        Ok(id) => Ok(id),
        Err(error) => {
            // Installed and announced to listeners, never to the caller: a full disposal
            // (its `subagent/end`), but no settled notice.
            if let Ok(Some(disposal)) = manager.send(Rollback { child }).await {
                if let Err(teardown) = disposal.await {
                    tracing::warn!(%child, %teardown, "a rolled-back child failed to tear down");
                }
            }
            Err(error)
        }
    }
}

/// Internal: installs a published child as a resident Activation (re-checking the token,
/// admission, the parent and its disposal), then emits `subagent/start`.
#[derive(Message)]
#[rtype(result = "Result<()>")]
struct Install {
    installing: Installing,
    token: CancellationToken,
}

impl Handler<Install> for ContinuationManager {
    type Result = Result<()>;

    fn handle(&mut self, msg: Install, ctx: &mut Context<Self>) -> Result<()> {
        let Installing {
            handle,
            parent,
            lineage,
            provider,
            boundary,
            budget,
        } = msg.installing;
        if msg.token.is_cancelled() {
            return Err(cancelled());
        }
        self.assert_admitting(&lineage)?;
        let child = handle.agent().clone();
        let id = child.id();
        if !parent.is_alive() {
            return Err(unauthorized(format!(
                "agent {} is no longer the exact live parent of continuable child {id}",
                parent.id()
            )));
        }
        if self.residents.contains_key(&id) {
            return Err(SubagentError::new(
                ErrorCode::DuplicateAgent,
                format!("continuable child {id} already has an Activation"),
            ));
        }
        let owner = match self.residents.get_mut(&parent.id()) {
            Some(resident) if resident.agent == parent => {
                if resident.disposal.is_some() {
                    return Err(SubagentError::new(
                        ErrorCode::ActivationClosing,
                        format!("parent Activation {} is already settling", parent.id()),
                    ));
                }
                resident.owned.insert(id);
                Some(parent.id())
            }
            _ => None,
        };
        let manager = ctx.address();
        child.observe(
            Arc::new(move |child, activity| {
                manager.do_send(AgentActivity { child, activity });
            }),
            Some(budget.clone()),
        );
        let activation = Activation::new(handle, boundary).start();
        let mut ancestry = Vec::with_capacity(lineage.len() + 1);
        ancestry.push(id);
        ancestry.extend(lineage);
        let run = SubagentRunInfo {
            run_id: RunId::new(),
            provider,
            id,
            local: true,
            parent: parent.id(),
        };
        self.residents.insert(
            id,
            Resident {
                agent: child,
                activation,
                parent,
                ancestry,
                owner,
                owned: HashSet::new(),
                accepted: HashSet::new(),
                busy: false,
                armed: false,
                announced: false,
                disposal: None,
                run: run.clone(),
                budget,
            },
        );
        self.events.emit(&SubagentEvent::Start(run));
        Ok(())
    }
}

/// Internal: admits and posts a message to a resident child (see `submit`).
#[derive(Message)]
#[rtype(result = "Result<BoxFuture<'static, Result<MessageId>>>")]
struct Submit {
    child: SessionId,
    parent: AgentRef,
    delivery: Delivery,
    token: CancellationToken,
}

impl Handler<Submit> for ContinuationManager {
    type Result = Result<BoxFuture<'static, Result<MessageId>>>;

    fn handle(&mut self, msg: Submit, ctx: &mut Context<Self>) -> Self::Result {
        self.submit(msg.child, &msg.parent, msg.delivery, &msg.token, ctx)
    }
}

/// Internal: disposes a child whose first message was never accepted.
#[derive(Message)]
#[rtype(result = "Option<Disposal>")]
struct Rollback {
    child: SessionId,
}

impl Handler<Rollback> for ContinuationManager {
    type Result = Option<Disposal>;

    fn handle(&mut self, msg: Rollback, ctx: &mut Context<Self>) -> Self::Result {
        if let Some(resident) = self.residents.get_mut(&msg.child) {
            resident.announced = false;
        }
        self.open_disposal(msg.child, ctx)
    }
}

/// Internal: an epoch's teardown is over. Removes the Activation, sends the settled notice,
/// releases ownership, emits `subagent/end`; answers the teardown failure.
#[derive(Message)]
#[rtype(result = "Result<()>")]
struct Finished {
    child: SessionId,
    terminal: Terminal,
}

impl Handler<Finished> for ContinuationManager {
    type Result = Result<()>;

    fn handle(&mut self, msg: Finished, ctx: &mut Context<Self>) -> Result<()> {
        let Some(resident) = self.residents.remove(&msg.child) else {
            return Ok(());
        };
        let terminal = msg.terminal;
        if resident.announced {
            self.notify_settlement(&resident, &terminal, ctx);
        }
        if let Some(owner) = resident.owner {
            if let Some(parent) = self.residents.get_mut(&owner) {
                parent.owned.remove(&msg.child);
                self.evaluate(owner, ctx);
            }
        }
        let last_assistant_message = terminal.output.filter(|output| !output.is_empty());
        self.events.emit(&SubagentEvent::End(SubagentRunEndInfo {
            info: resident.run,
            stop_reason: terminal.stop_reason,
            last_assistant_message,
        }));
        terminal.failure.map_or(Ok(()), Err)
    }
}

/// Starts a continuable child; answers at inbox acceptance of its prompt.
#[derive(Message)]
#[rtype(result = "Result<ContinuableStart>")]
pub(crate) struct StartContinuable(pub(crate) ContinuableStartSpec);

impl Handler<StartContinuable> for ContinuationManager {
    type Result = ResponseFuture<Result<ContinuableStart>>;

    fn handle(&mut self, msg: StartContinuable, ctx: &mut Context<Self>) -> Self::Result {
        let spec = msg.0;
        let admitted = self.admit_start(&spec, ctx);
        let manager = ctx.address();
        let service = self.service.clone();
        let agents = self.agents.clone();
        let registry = Arc::clone(&self.setup);
        Box::pin(async move {
            let (plan, _guard) = admitted?;
            let StartPlan {
                child,
                depth,
                lineage,
                options,
                descriptor,
                composition,
            } = plan;
            let descriptor_budget = descriptor.budget;
            let ContinuableStartSpec {
                provider,
                parent,
                prompt,
                cancel: token,
                ..
            } = spec;
            if token.is_cancelled() {
                return Err(cancelled());
            }
            let prepared = service
                .send(LookupContinuable(provider.clone()))
                .await
                .map_err(SubagentError::from)??;
            let prepare = prepared
                .continuable()
                .ok_or_else(|| unsupported_continuable(&provider))?
                .prepare_continuable(ContinuableCreateRequest {
                    session_id: child,
                    parent: parent.clone(),
                    cancel: token.clone(),
                });
            let created = prepare.await?;
            if token.is_cancelled() {
                return Err(cancelled());
            }
            let seed = created.seed.unwrap_or_default();
            let inherited =
                u64::try_from(seed.len()).map_err(|_| SubagentError::bug("seed too long"))?;
            let slot = Arc::default();
            let mut create = CreateAgent::new()
                .id(child)
                .delegated_by(parent.id(), depth)
                .seed(seed, inherited)
                .options(options)
                .setup(activation_setup(
                    composition,
                    Some(descriptor),
                    registry,
                    Arc::clone(&slot),
                ))
                .cancel(token.clone());
            if let Some(cwd) = parent.header().cwd {
                create = create.cwd(cwd);
            }
            let handle = agents.create(create).await.map_err(map_cancelled)?;
            commit_setup(&handle, &slot).await?;
            let boundary = usize::try_from(handle.agent().log().len()).unwrap_or(usize::MAX);
            let installing = Installing {
                handle,
                parent,
                lineage,
                provider,
                boundary,
                budget: BudgetMeter::new(
                    descriptor_budget.unwrap_or_default(),
                    BudgetSpent::default(),
                ),
            };
            let delivery = Delivery {
                message: Message::user(prompt, MessageSource::User),
                raise: None,
            };
            let message_id = install_and_submit(manager, installing, delivery, token).await?;
            Ok(ContinuableStart {
                child_id: child,
                message_id,
            })
        })
    }
}

fn unsupported_continuable(provider: &str) -> SubagentError {
    SubagentError::new(
        ErrorCode::UnsupportedCapability,
        format!("subagent provider \"{provider}\" does not support continuable children"),
    )
}

/// What a continuable start resolved before its first await.
struct StartPlan {
    child: SessionId,
    depth: u64,
    lineage: Vec<SessionId>,
    options: AgentOptions,
    descriptor: SubagentDescriptor,
    composition: ChildComposition,
}

impl ContinuationManager {
    /// The synchronous part of a start: admission, persistence, depth, the descriptor
    /// snapshot and the composition (policy captured at the call), then the materialization
    /// is registered so drains wait for it.
    fn admit_start(
        &mut self,
        spec: &ContinuableStartSpec,
        ctx: &Context<Self>,
    ) -> Result<(StartPlan, MaterializationGuard)> {
        let parent = &spec.parent;
        let lineage = self.lineage_of(parent);
        self.assert_admitting(&lineage)?;
        let env = Arc::clone(self.agents.env());
        if env.store.is_none() {
            return Err(SubagentError::new(
                ErrorCode::PersistenceUnavailable,
                "continuable children require session persistence",
            ));
        }
        let depth = resolve_child_depth(parent, spec.max_depth)?;
        if !parent.is_alive() {
            return Err(unauthorized(format!(
                "agent {} is not live and cannot delegate",
                parent.id()
            )));
        }
        let options = child_options(parent, spec.agent_options.clone(), depth);
        let mut descriptor = SubagentDescriptor::continuable(&spec.provider, &spec.label);
        descriptor.agent_provider.clone_from(&options.provider);
        descriptor.agent_model = (!options.model.is_empty()).then(|| options.model.clone());
        descriptor.persona.clone_from(&spec.persona);
        descriptor.tool_filter.clone_from(&spec.tool_filter);
        if let Some(limits) = &spec.budget {
            budget::validate(limits)?;
        }
        descriptor.budget = spec.budget;
        let composition = ChildComposition::new(
            &env,
            Some(spec.policy.clone().unwrap_or_default()),
            spec.persona.as_deref(),
            spec.tool_filter.clone(),
        )?;
        let materialization = self.register_materialization(lineage.clone(), None, ctx);
        Ok((
            StartPlan {
                child: SessionId::new(),
                depth,
                lineage,
                options,
                descriptor,
                composition,
            },
            materialization,
        ))
    }
}

/// How a follow-up was routed.
pub(crate) enum Routed {
    /// Accepted with this id.
    Accepted(MessageId),
    /// The child was settling or being resumed; route again.
    Retry,
}

/// Delivers a follow-up: enqueue (running), wake (waiting) or cold-resume (absent).
#[derive(Message)]
#[rtype(result = "Result<Routed>")]
pub(crate) struct Followup {
    pub(crate) parent: AgentRef,
    pub(crate) child: SessionId,
    pub(crate) delivery: Delivery,
    pub(crate) token: CancellationToken,
}

impl Handler<Followup> for ContinuationManager {
    type Result = ResponseFuture<Result<Routed>>;

    fn handle(&mut self, msg: Followup, ctx: &mut Context<Self>) -> Self::Result {
        let lineage = self.lineage_of(&msg.parent);
        if let Err(error) = self.assert_admitting(&lineage) {
            return Box::pin(async move { Err(error) });
        }
        if msg.token.is_cancelled() {
            return Box::pin(async { Err(cancelled()) });
        }
        if let Some(resident) = self.residents.get(&msg.child) {
            if let Some(disposal) = resident.disposal.clone() {
                // Lost the race with settlement: wait for the teardown, then cold-resume.
                return Box::pin(async move {
                    let _ = disposal.await;
                    Ok(Routed::Retry)
                });
            }
            let accepted = self.submit(msg.child, &msg.parent, msg.delivery, &msg.token, ctx);
            return Box::pin(async move { Ok(Routed::Accepted(accepted?.await?)) });
        }
        if let Some(resuming) = self.resuming.get(&msg.child).cloned() {
            return Box::pin(async move {
                resuming.await;
                Ok(Routed::Retry)
            });
        }
        let guard = self.register_materialization(lineage.clone(), Some(msg.child), ctx);
        let resume = ColdResume {
            manager: ctx.address(),
            agents: self.agents.clone(),
            registry: Arc::clone(&self.setup),
            lineage,
        };
        Box::pin(async move {
            let _guard = guard;
            let id = resume
                .run(msg.parent, msg.child, msg.delivery, msg.token)
                .await?;
            Ok(Routed::Accepted(id))
        })
    }
}

/// A cold resume of an absent child, run outside the manager's handler.
struct ColdResume {
    manager: Addr<ContinuationManager>,
    agents: Agents,
    registry: Arc<SetupRegistry>,
    lineage: Vec<SessionId>,
}

impl ColdResume {
    async fn run(
        self,
        parent: AgentRef,
        child: SessionId,
        delivery: Delivery,
        token: CancellationToken,
    ) -> Result<MessageId> {
        let env = Arc::clone(self.agents.env());
        let store = env.store.clone().ok_or_else(|| {
            SubagentError::new(
                ErrorCode::PersistenceUnavailable,
                "a cold resume requires session persistence",
            )
        })?;
        let stored = tokio::select! {
            () = token.cancelled() => return Err(cancelled()),
            stored = store.inspect(child) => stored,
        }
        .map_err(|error| {
            SubagentError::new(
                ErrorCode::NotResumable,
                format!("continuable child {child} is unavailable: {error}"),
            )
        })?;
        if token.is_cancelled() {
            return Err(cancelled());
        }
        // Authority is checked against the persisted header before anything is folded.
        if stored.header.parent_session != Some(parent.id()) {
            return Err(unauthorized(format!(
                "continuable child {child} belongs to another parent session"
            )));
        }
        let own = usize::try_from(stored.header.seed_len())
            .unwrap_or(usize::MAX)
            .min(stored.events.len());
        let own = &stored.events[own..];
        let descriptor = SubagentDescriptor::fold(own)?
            .filter(|descriptor| descriptor.mode == DelegationMode::Continuable)
            .ok_or_else(|| {
                SubagentError::new(
                    ErrorCode::NotResumable,
                    format!(
                        "{child} has no supported continuation state and cannot be resumed; \
                         do not retry send_message with this id"
                    ),
                )
            })?;
        // A spent budget refuses before anything is loaded or leased.
        let recorded = budget::current(own, descriptor.budget)?.unwrap_or_default();
        let spent = BudgetSpent::fold(own);
        budget::admit(child, &delivery.raise.unwrap_or(recorded), &spent)?;
        // Only the recorded route: no token cap, no depth (the header's depth is the floor).
        let options = AgentOptions {
            provider: descriptor.agent_provider.clone(),
            model: descriptor.agent_model.clone().unwrap_or_default(),
            ..AgentOptions::default()
        };
        let composition = ChildComposition::new(
            &env,
            None,
            descriptor.persona.as_deref(),
            descriptor.tool_filter.clone(),
        )?;
        let slot = Arc::default();
        let resume = ResumeAgent::new(child)
            .options(options)
            .setup(activation_setup(
                composition,
                None,
                self.registry,
                Arc::clone(&slot),
            ))
            .cancel(token.clone());
        let handle = self.agents.resume(resume).await.map_err(map_cancelled)?;
        commit_setup(&handle, &slot).await?;
        let boundary = usize::try_from(handle.agent().log().len()).unwrap_or(usize::MAX);
        let installing = Installing {
            handle,
            parent,
            lineage: self.lineage,
            provider: descriptor.provider,
            boundary,
            budget: BudgetMeter::new(recorded, spent),
        };
        install_and_submit(self.manager, installing, delivery, token).await
    }
}

/// Interrupts a resident child's turn, keeping its inbox (see `Subagents::interrupt`).
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub(crate) struct Interrupt {
    pub(crate) target: SessionId,
    pub(crate) authority: InterruptAuthority,
}

impl Handler<Interrupt> for ContinuationManager {
    type Result = Result<()>;

    fn handle(&mut self, msg: Interrupt, _: &mut Context<Self>) -> Result<()> {
        let target = msg.target;
        if let InterruptAuthority::Ancestor(caller) = &msg.authority {
            if !caller.is_alive() {
                return Err(unauthorized(format!(
                    "interrupting requires the exact live ancestor agent; {} is not live",
                    caller.id()
                )));
            }
            if caller.id() == target {
                return Err(unauthorized(format!(
                    "agent {target} cannot interrupt itself"
                )));
            }
        }
        let Some(resident) = self.residents.get(&target) else {
            // Unknown, one-shot or already settled: nothing to stop.
            return Ok(());
        };
        let cause = match &msg.authority {
            InterruptAuthority::User { parent_session_id } => {
                if resident.parent.id() != *parent_session_id {
                    return Err(unauthorized(format!(
                        "continuable child {target} belongs to another parent session"
                    )));
                }
                CancelCause::User
            }
            InterruptAuthority::Ancestor(caller) => {
                if !resident.ancestry[1..].contains(&caller.id()) {
                    return Err(unauthorized(format!(
                        "continuable child {target} is not a live descendant of agent {}",
                        caller.id()
                    )));
                }
                CancelCause::Parent
            }
        };
        if resident.disposal.is_none() {
            resident.agent.cancel_now(cause, InboxPolicy::Keep);
        }
        Ok(())
    }
}

/// Delivers a resident child's report to its durable parent.
#[derive(Message)]
#[rtype(result = "Result<BoxFuture<'static, Result<MessageId>>>")]
pub(crate) struct ReportFrom {
    pub(crate) child: AgentRef,
    pub(crate) content: Vec<ContentBlock>,
    pub(crate) delivery: ReportDelivery,
    pub(crate) token: CancellationToken,
}

impl Handler<ReportFrom> for ContinuationManager {
    type Result = Result<BoxFuture<'static, Result<MessageId>>>;

    fn handle(&mut self, msg: ReportFrom, ctx: &mut Context<Self>) -> Self::Result {
        if msg.token.is_cancelled() {
            return Err(cancelled());
        }
        let lineage = self.lineage_of(&msg.child);
        self.assert_admitting(&lineage)?;
        let child = msg.child.id();
        let resident = self
            .residents
            .get(&child)
            .filter(|resident| resident.agent == msg.child && msg.child.is_alive())
            .ok_or_else(|| {
                unauthorized(format!(
                    "agent {child} is not a resident continuable child and cannot report"
                ))
            })?;
        if resident.disposal.is_some() {
            return Err(SubagentError::new(
                ErrorCode::ActivationClosing,
                format!("continuable child {child} is already settling"),
            ));
        }
        let parent_session = resident.parent.id();
        let captured = resident.parent.clone();
        let message = Message::user(
            report_content(child, msg.content),
            MessageSource::SubagentReportRelay {
                sender_session_id: child,
            },
        );
        let id = message.id;
        let (parent, counted) = match (self.residents.get_mut(&parent_session), msg.delivery) {
            (Some(parent), ReportDelivery::Wakeup) if parent.disposal.is_none() => {
                parent.accepted.insert(id);
                (parent.agent.clone(), true)
            }
            (Some(parent), _) => (parent.agent.clone(), false),
            (None, _) if captured.is_alive() => (captured, false),
            (None, _) => {
                return Err(SubagentError::new(
                    ErrorCode::ParentUnavailable,
                    format!("the parent of continuable child {child} is not live"),
                ))
            }
        };
        let target = match msg.delivery {
            ReportDelivery::Quiet => PostTarget::Inbox(InboxTarget::NextStep, Wake::Quiet),
            ReportDelivery::Wakeup => PostTarget::Inbox(InboxTarget::NextTurn, Wake::Wake),
        };
        let accepted = parent.post(message, target, None);
        let manager = ctx.address();
        let parent_id = parent.id();
        Ok(async move {
            accepted.await.map_err(|error| {
                if counted {
                    manager.do_send(Refused {
                        child: parent_id,
                        message: id,
                    });
                }
                SubagentError::new(
                    ErrorCode::ParentUnavailable,
                    format!("the parent of continuable child {child} rejected the followup/inject: {error}"),
                )
            })
        }
        .boxed())
    }
}

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
        // Every target's disposal opens now, top-down, before any await.
        let mut branches = Vec::new();
        for (_, target) in &targets {
            let owned_by_target = self.residents[target]
                .owner
                .is_some_and(|owner| target_ids.contains(&owner));
            if let Some(disposal) = self.open_disposal(*target, ctx) {
                if !owned_by_target {
                    branches.push(disposal);
                }
            }
        }
        Box::pin(async move {
            join_all(materializations).await;
            aggregate(join_all(branches).await)
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
            aggregate(join_all(branches).await)
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
            .filter(|(_, resident)| resident.owner.is_none())
            .map(|(id, _)| *id)
            .collect();
        roots.sort_unstable();
        MessageResult(
            roots
                .into_iter()
                .filter_map(|root| self.open_disposal(root, ctx))
                .collect(),
        )
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
