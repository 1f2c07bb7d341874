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
//! [`Activation`] then awaits the children, captures the epoch's facts, disposes the handle and
//! settles the epoch through the [`Settlement`] it was handed: the manager removes the
//! Activation, sends the parent its settled notice **before** releasing the ownership that lets
//! the parent settle, and emits `subagent/end`.
//!
//! # Parents
//! A child's parent is its durable direct parent **session** (`header.parentSession`): the
//! authority checks compare sessions, so a parent disposed and resumed while its child runs is
//! the same parent, and the child's reports and settled notice reach whichever agent of the
//! session is live (or, for a notice while none is, its stored inbox; see `parent.rs`).
//!
//! # Host-owned parents
//! A host-owned parent (one that is not itself a continuable child) has an [`OwnerNode`]
//! actor while it has resident continuable children or a release in flight, as the design card
//! draws it. The decisions stay here, in the one handler above, with no await: admission,
//! authority, the drain's cutoff (a [`ClosingScope`] keyed by the parent's id) and opening each
//! disposal top-down. The node carries out what takes time, as an [`Activation`] carries out an
//! epoch's teardown: it waits for the creations admitted below its parent, then for each
//! branch to be released child first, and reports back. The manager starts it with the
//! parent's first resident child and lets it stop with the last.
//!
//! # Files
//! This file holds the manager's state and the decisions every operation shares (admission,
//! submission, settlement, disposal, the ownership nodes); `materialize.rs` the fresh start and
//! the install-then-submit sequence, `followup.rs` routing by residency and the cold resume,
//! `control.rs` interrupts and reports, `parent.rs` the notices and reports that reach a
//! parent session, `drain.rs` the drains, `settlement.rs` an epoch's settlement once its
//! teardown is over, `remote.rs` the cluster's parent side (children placed elsewhere) and
//! `served.rs` its child side (what this node serves of its peers' asks).

mod control;
mod drain;
mod followup;
mod gone_nodes;
mod materialize;
mod parent;
mod records;
mod remote;
mod served;
mod settlement;
#[cfg(test)]
mod test_runtime;

use records::{ClosingScope, Materialization, OwnerRecord, RemoteChild, Resident};
pub(crate) use records::{ParentLink, RemoteParent};

pub(crate) use control::{
    authorize_absent, Interrupt, InterruptAbsent, InterruptRouted, ReportFrom,
};
pub(crate) use drain::{
    DrainAll, DrainDescendants, OwnerNodeCount, OwnerReleased, ResidentCount, ResidentIds,
};
pub(crate) use materialize::{Delivery, StartContinuable};
pub(crate) use remote::{ask_interrupt, route_followup};
pub(crate) use served::delivery_handler;
pub(crate) use settlement::Settlement;

use std::sync::Arc;

use actix::prelude::*;
use futures::future::{join_all, BoxFuture, FutureExt, Shared};
use tokio_util::sync::CancellationToken;

use crate::actors::activation::{Activation, Disposal, Teardown, Terminal, RELEASES_AT_ONCE};
use crate::actors::agent::{Activity, ActivityObserver, AgentRef, InboxPolicy, PostTarget, Wake};
use crate::actors::agents::Agents;
use crate::actors::owner::{OwnerNode, ReleaseChildren};
use crate::actors::service::{LookupContinuable, SubagentService};
use crate::cluster::{ClusterLink, NodeId};
use crate::content::{ContentBlock, Message, MessageSource};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::events::EventBus;
use crate::host::{
    AgentHandle, AgentOptions, AgentScope, Budget, BudgetMeter, BudgetRaise, BudgetSpent,
    CreateAgent, ResumeAgent, SetupCommit,
};
use crate::ids::{FastHashMap, FastHashSet, MessageId, RunId, SessionId};
use crate::metrics::{Metrics, Residency};
use crate::seam::budget;
use crate::seam::child_run::{child_options, ChildComposition};
use crate::seam::continuable::{
    report_content, settled_notice, ContinuableStart, ContinuableStartSpec, InterruptAuthority,
    ReportDelivery,
};
use crate::seam::depth::resolve_child_depth;
use crate::seam::setup::{SetupBatch, SetupRegistry};
use crate::seam::{
    ContinuableCreateRequest, DelegationMode, SubagentDescriptor, SubagentEvent, SubagentRunEndInfo,
};
use crate::session::{CancelCause, InboxTarget, SessionLog};
use crate::store::NodeIncarnation;
use crate::trace::SentFrom;

/// Something in flight that others wait for; resolves when it is over, whatever its outcome.
pub(crate) type Signal = Shared<BoxFuture<'static, ()>>;

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

/// The continuation manager actor.
pub(crate) struct ContinuationManager {
    agents: Agents,
    service: Addr<SubagentService>,
    events: Arc<EventBus<SubagentEvent>>,
    setup: Arc<SetupRegistry>,
    /// Boxed: a bucket holds a pointer, not a whole record, so a map grown for a million
    /// children does not pay the record's size for every empty bucket.
    residents: FastHashMap<SessionId, Box<Resident>>,
    materializations: FastHashMap<u64, Materialization>,
    /// Children whose cold resume is in flight: another delivery waits for it.
    resuming: FastHashMap<SessionId, Signal>,
    /// Authorized interrupts of children whose cold resume is in flight: each reaches the
    /// turn its resume opens, as the resume submits its message.
    interrupts: FastHashMap<SessionId, CancelCause>,
    /// How many settled notices are on their way to a parent session whose child's record is
    /// gone already: shutdown waits until none is, so none is cut off by the registry closing.
    notices: tokio::sync::watch::Sender<usize>,
    closing: FastHashMap<SessionId, ClosingScope>,
    draining: bool,
    /// Set when the runtime shuts down as a node of a cluster (it leaves): its children of
    /// parents on other nodes are handed over, not discarded.
    leaving: bool,
    next_materialization: u64,
    /// Bounds the Activations releasing their child at once (see [`RELEASES_AT_ONCE`]).
    releases: Arc<tokio::sync::Semaphore>,
    /// The observer every resident child reports its activity through: one for all of them,
    /// where one each would hold a manager address apiece (a few allocations per child).
    /// Dropped when no child is resident, so the manager never keeps its own address alive.
    activity: Option<ActivityObserver>,
    /// The ownership nodes of host-owned parents (see [`OwnerNode`]).
    owners: FastHashMap<SessionId, OwnerRecord>,
    /// This runtime's cluster, when it joined one.
    cluster: Option<ClusterLink>,
    /// Children this runtime's parents placed on other nodes.
    remote_children: FastHashMap<SessionId, RemoteChild>,
    /// Placed children whose epoch on a node was accounted as ended with that node
    /// (`node-stopped`), by the node incarnation it ended with: a late notice from there is
    /// that epoch's second. Cleared when the child is placed (or found) on a node again.
    ended_with_node: FastHashMap<SessionId, NodeIncarnation>,
    /// Placed children no node holds now, by parent (handed over by a node that left, or
    /// left behind by one that stopped): what they accepted and did not run waits in their
    /// logs for the next follow-up, which resumes them. A drain of their lineage, which
    /// refuses that follow-up, discards it instead (`remote::discard_parked`).
    parked: FastHashMap<SessionId, AgentRef>,
    /// Whether a look for stopped nodes is in flight.
    sweeping: bool,
    /// The timer that looks for stopped nodes, armed only while a child is placed elsewhere: a
    /// pending timer keeps an actix actor alive, and the manager must stop once its addresses
    /// are gone.
    sweep: Option<SpawnHandle>,
}

impl Actor for ContinuationManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        crate::actors::unbounded_mailbox(ctx);
    }
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
    /// The activity observer resident children report through (see the field).
    fn activity_observer(&mut self, ctx: &Context<Self>) -> ActivityObserver {
        let observer = self.activity.get_or_insert_with(|| {
            let manager = ctx.address();
            Arc::new(move |child, activity| {
                manager.do_send(AgentActivity { child, activity });
            })
        });
        Arc::clone(observer)
    }

    pub(crate) fn new(
        agents: Agents,
        service: Addr<SubagentService>,
        events: Arc<EventBus<SubagentEvent>>,
        setup: Arc<SetupRegistry>,
        cluster: Option<ClusterLink>,
    ) -> Self {
        Self {
            cluster,
            remote_children: FastHashMap::default(),
            ended_with_node: FastHashMap::default(),
            parked: FastHashMap::default(),
            sweeping: false,
            sweep: None,
            agents,
            service,
            events,
            setup,
            residents: FastHashMap::default(),
            activity: None,
            materializations: FastHashMap::default(),
            resuming: FastHashMap::default(),
            interrupts: FastHashMap::default(),
            notices: tokio::sync::watch::Sender::new(0),
            owners: FastHashMap::default(),
            closing: FastHashMap::default(),
            draining: false,
            leaving: false,
            next_materialization: 0,
            releases: Arc::new(tokio::sync::Semaphore::new(RELEASES_AT_ONCE)),
        }
    }

    /// The ownership node of host-owned parent `parent`, started if it has none.
    fn owner_node(&mut self, parent: SessionId, ctx: &Context<Self>) -> &mut OwnerRecord {
        self.owners.entry(parent).or_insert_with(|| OwnerRecord {
            node: OwnerNode::new(parent, ctx.address().downgrade()).start(),
            residents: 0,
            releasing: 0,
        })
    }

    /// Lets `parent`'s node stop once it has neither a resident child nor a release in
    /// flight (its only strong address is the manager's).
    fn forget_owner_if_idle(&mut self, parent: SessionId) {
        if self
            .owners
            .get(&parent)
            .is_some_and(|record| record.residents == 0 && record.releasing == 0)
        {
            self.owners.remove(&parent);
        }
    }

    /// Hands the release of `branches` (opened already), after `admitted`, to host-owned
    /// parent `parent`'s node; the future answers the node's combined outcome.
    fn release_through_owner(
        &mut self,
        parent: SessionId,
        admitted: Vec<Signal>,
        branches: Vec<Disposal>,
        ctx: &Context<Self>,
    ) -> BoxFuture<'static, Result<()>> {
        let record = self.owner_node(parent, ctx);
        record.releasing += 1;
        let released = record.node.send(ReleaseChildren { admitted, branches });
        async move { released.await.unwrap_or_else(|error| Err(error.into())) }.boxed()
    }

    /// The runtime's metrics, when it records them.
    fn metrics(&self) -> Option<&Metrics> {
        self.agents.env().metrics.as_deref()
    }

    /// `agent`, then its ancestors: a resident Activation's recorded ancestry, or the ones the
    /// agent was published with (its owner's, or those its admission saw), completed by the
    /// recorded ancestry of the nearest of them that is resident. An intermediate that is not
    /// resident (a one-shot child, a child between its cold resume and its install, or one gone
    /// since) therefore never cuts the lineage short of a drained root above it.
    fn lineage_of(&self, agent: &AgentRef) -> Vec<SessionId> {
        if let Some(resident) = self.residents.get(&agent.id()) {
            if resident.agent == *agent {
                return resident.ancestry.clone();
            }
        }
        let mut lineage = Vec::with_capacity(1 + agent.ancestors().len());
        lineage.push(agent.id());
        let mut extend = |ids: &[SessionId]| {
            for id in ids {
                if !lineage.contains(id) {
                    lineage.push(*id);
                }
            }
        };
        extend(agent.ancestors());
        let nearest_resident = agent
            .ancestors()
            .iter()
            .find_map(|id| self.residents.get(id));
        if let Some(resident) = nearest_resident {
            extend(&resident.ancestry);
        }
        lineage
    }

    /// The lineage a delivery from `parent` to `child` is admitted under: a local parent's own,
    /// or for a remote parent the ancestry its child was placed with.
    fn caller_lineage(&self, child: SessionId, parent: &ParentLink) -> Vec<SessionId> {
        match parent {
            ParentLink::Local(agent) => self.lineage_of(agent),
            ParentLink::Remote(remote) => self
                .residents
                .get(&child)
                .filter(|resident| resident.parent.same_as(parent))
                .map_or_else(
                    || vec![remote.id],
                    |resident| resident.ancestry[1..].to_vec(),
                ),
        }
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
        if let Some(metrics) = self.metrics() {
            metrics.residency(Residency::Starting);
        }
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
        parent: &ParentLink,
        delivery: Delivery,
        token: &CancellationToken,
        ctx: &mut Context<Self>,
    ) -> Result<BoxFuture<'static, Result<MessageId>>> {
        let Delivery {
            message,
            raise,
            may_repeat,
            trace,
        } = delivery;
        if token.is_cancelled() {
            return Err(cancelled());
        }
        let lineage = self.caller_lineage(child, parent);
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
        if !resident.parent.same_as(parent) {
            return Err(unauthorized(format!(
                "continuable child {child} belongs to another parent session"
            )));
        }
        // The parent is the session: once the agent the child was materialized under is gone,
        // the incarnation speaking for the session now is the one notices and reports go to.
        if let (ParentLink::Local(recorded), ParentLink::Local(sender)) = (&resident.parent, parent)
        {
            if !recorded.is_alive() {
                resident.parent = ParentLink::Local(sender.clone());
            }
        }
        let (current, spent) = resident.budget.snapshot();
        budget::admit(child, &raise.unwrap_or(current), &spent)?;
        let raise = raise.map(|budget| BudgetRaise {
            budget,
            record: budget::budget_event(&budget),
        });
        let id = message.id;
        resident.accept(id);
        resident.armed = true;
        resident.announced = true;
        // Its context, not the span: the call that opened the epoch returns long before the
        // epoch settles, and a held span would stay open until then.
        if let Some(context) = crate::trace::span_context(&trace) {
            resident.epoch_trace = Some(Box::new(context));
        }
        let accepted = resident.agent.post(
            message,
            PostTarget::Inbox(InboxTarget::NextTurn, Wake::Wake),
            raise,
            may_repeat,
            SentFrom::from(trace),
        );
        // An interrupt that came while this child was being resumed reaches the turn the
        // message just opened (or parks it, when the turn has not claimed it yet).
        if let Some(cause) = self.interrupts.remove(&child) {
            resident.agent.cancel_now(cause, InboxPolicy::Keep);
        }
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
                && !resident.has_accepted()
                && resident.owns_none()
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
        if let Some(metrics) = &self.agents.env().metrics {
            metrics.residency(Residency::Settling);
        }
        // A node leaving the cluster hands a child of a parent on another node over: its
        // accepted, unclaimed follow-ups stay in its log for the resume that comes next.
        if self.leaving && matches!(resident.parent, ParentLink::Remote(_)) {
            resident.agent.cancel_for_hand_over();
            resident.handed_over = true;
        } else {
            resident.agent.cancel_for_release();
        }
        let activation = resident.activation.clone();
        let mut owned: Vec<SessionId> = resident
            .owned
            .iter()
            .flat_map(|owned| owned.iter().copied())
            .collect();
        owned.sort_unstable();
        // The memo first: nothing below can reach this child again, but the memo must exist
        // before any other work is opened.
        let (settlement, disposal) = Settlement::new(ctx.address(), child);
        resident.disposal = Some(disposal.clone());
        // A child placed on another node is released in the trace of this child's epoch.
        let traceparent = resident
            .epoch_trace
            .as_deref()
            .and_then(crate::trace::traceparent_of_context);
        let children: Vec<Disposal> = owned
            .into_iter()
            .filter_map(|owned| {
                self.open_disposal(owned, ctx)
                    .or_else(|| self.release_remote(owned, traceparent.as_deref(), ctx))
            })
            .collect();
        // Carried out by the Activation on its own: a teardown never depends on anyone
        // awaiting it. An Activation already gone drops the settlement, which then settles
        // the epoch as failed.
        activation.do_send(Teardown {
            children,
            releases: Arc::clone(&self.releases),
            settlement,
        });
        Some(disposal)
    }
}

impl ContinuationManager {
    /// Counts a settled notice's delivery among those on their way (see the `notices` field)
    /// until it is over or dropped; answers the delivery for its epoch's disposal to await.
    fn track_notice(&self, delivery: BoxFuture<'static, ()>) -> BoxFuture<'static, ()> {
        let on_its_way = NoticeOnItsWay::new(&self.notices);
        async move {
            delivery.await;
            drop(on_its_way);
        }
        .boxed()
    }
}

/// One settled notice counted as on its way while this lives.
struct NoticeOnItsWay(tokio::sync::watch::Sender<usize>);

impl NoticeOnItsWay {
    fn new(notices: &tokio::sync::watch::Sender<usize>) -> Self {
        notices.send_modify(|count| *count += 1);
        Self(notices.clone())
    }
}

impl Drop for NoticeOnItsWay {
    fn drop(&mut self) {
        self.0.send_modify(|count| *count = count.saturating_sub(1));
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
            resident.forget_accepted(&msg.message);
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
                resident.forget_accepted(&id);
                resident.busy = true;
            }
            // Accepted long before: this acceptance answered the first one, and nothing of
            // it is on its way to a turn.
            Activity::Discarded(id) | Activity::Repeated(id) => {
                resident.forget_accepted(&id);
            }
            Activity::Idle => resident.busy = false,
            // Accepted work a faulted agent holds will never be claimed: it no longer keeps
            // the Activation resident, so the child settles (its teardown reports the fault).
            Activity::Faulted => resident.accepted = None,
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
        if self.materializations.remove(&msg.id).is_some() {
            if let Some(metrics) = self.metrics() {
                metrics.residency(Residency::Started);
            }
        }
        if let Some(child) = msg.resuming {
            self.resuming.remove(&child);
            // A resume that ended without submitting leaves nothing running to interrupt.
            self.interrupts.remove(&child);
        }
    }
}

/// What a million resident children multiply: each record stays within the allocation class
/// it was cut to fit, since one byte more moves every child's copy into the next class.
#[cfg(all(test, target_pointer_width = "64"))]
mod footprint {
    use std::mem::size_of;

    use actix::Addr;
    use tokio_util::sync::CancellationToken;

    use crate::actors::agent::AgentRef;
    use crate::cluster::ClusterLink;
    use crate::ids::SessionId;

    #[test]
    fn per_child_records_stay_within_their_allocation_classes() {
        // An event lives in an `Arc` (two counts, 16 bytes): 192 bytes in all.
        assert!(size_of::<crate::session::SessionEvent>() <= 176);
        // Boxed in the manager's map: mimalloc's 256-byte class.
        assert!(size_of::<super::Resident>() <= 256);
        // Inside the actor's task with actix's context and tokio's header: a 768-byte cell.
        assert!(size_of::<crate::actors::agent::AgentActor>() <= 328);
        // Held by a running turn's future, which the actor boxes with its continuation: 768
        // bytes in all, the top of that class.
        assert!(size_of::<crate::host::driver::TurnContext>() <= 112);
    }

    /// The size of the future `make` returns, without calling it.
    fn future_size<A, F: std::future::Future>(_make: impl FnOnce(A) -> F) -> usize {
        size_of::<F>()
    }

    /// What a follow-up's routing borrows.
    type Routing = (
        &'static Addr<super::ContinuationManager>,
        Option<&'static ClusterLink>,
        &'static AgentRef,
        &'static super::Delivery,
        &'static CancellationToken,
    );

    #[test]
    fn a_follow_ups_task_does_not_carry_the_clusters_futures() {
        // Every follow-up runs as a task of this size, moved into its cell on the way: the
        // store's futures (kilobytes, on the cluster's path only) are boxed where they are
        // awaited, or a local follow-up would copy them too.
        let size = future_size(|(manager, cluster, parent, delivery, token): Routing| {
            super::route_followup(manager, cluster, parent, SessionId::new(), delivery, token)
        });
        assert!(size <= 4096, "a follow-up's task is {size} bytes");
    }
}
