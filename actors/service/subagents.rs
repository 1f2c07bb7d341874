//! Provides [`Subagents`], the [`SubagentService`]'s cheap public handle: the delegation API.

use std::sync::Arc;

use actix::prelude::*;
use futures::TryStreamExt;
use tracing::Instrument as _;

use crate::actors::agent::AgentRef;
use crate::actors::agents::Agents;
use crate::actors::manager::{
    ask_interrupt, authorize_absent, delivery_handler, route_followup, ContinuationManager,
    Delivery, DrainAll, DrainDescendants, Interrupt, InterruptAbsent, InterruptRouted,
    OwnerNodeCount, ReportFrom, ResidentCount, ResidentIds, StartContinuable,
};
use crate::cluster::ClusterLink;
use crate::content::{require_content, ContentBlock, Message};
use crate::error::{Result, SubagentError};
use crate::events::EventBus;
use crate::ids::{MessageId, SessionId};
use crate::projection::listing::Listing;
use crate::projection::{
    SubagentDescendantListEntry, SubagentForestEntry, SubagentForestTree, SubagentListEntry,
};
use crate::seam::budget;
use crate::seam::continuable::{
    ContinuableStart, ContinuableStartSpec, FollowupOptions, InterruptAuthority, ReportOptions,
};
use crate::seam::setup::{ContinuableSetupContribution, SetupRegistration, SetupRegistry};
use crate::seam::{
    Settlements, SubagentEvent, SubagentProvider, SubagentRun, SubagentStartRequest,
};
use tokio_util::sync::CancellationToken;

use super::{observe_run, List, Lookup, Register, Remove, ResolvedStart, Start, SubagentService};

/// The delegation API: providers, one-shot starts, continuable children and
/// lifecycle events. Cheap to clone.
#[derive(Clone)]
pub struct Subagents {
    agents: Agents,
    service: Addr<SubagentService>,
    manager: Addr<ContinuationManager>,
    setup: Arc<SetupRegistry>,
    events: Arc<EventBus<SubagentEvent>>,
    cluster: Option<ClusterLink>,
}

impl std::fmt::Debug for Subagents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subagents").finish_non_exhaustive()
    }
}

/// Keeps a provider registered; [`ProviderRegistration::remove`] (or dropping it after
/// [`ProviderRegistration::keep`] was not called) unregisters it.
#[must_use = "dropping the registration removes the provider; call keep() to keep it"]
pub struct ProviderRegistration {
    id: u64,
    name: String,
    service: Option<Addr<SubagentService>>,
}

impl ProviderRegistration {
    /// The registered name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Removes the provider: later starts fail with `NO_PROVIDER`; runs already returned are
    /// not revoked.
    pub fn remove(mut self) {
        self.unregister();
    }

    /// Keeps the provider registered for the service's whole life.
    pub fn keep(mut self) {
        self.service = None;
    }

    fn unregister(&mut self) {
        if let Some(service) = self.service.take() {
            // Enqueued before any later start from this task, so that start sees the removal.
            service.do_send(Remove(self.id));
        }
    }
}

impl Drop for ProviderRegistration {
    fn drop(&mut self) {
        self.unregister();
    }
}

impl std::fmt::Debug for ProviderRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderRegistration")
            .field("name", &self.name)
            .finish()
    }
}

impl Subagents {
    /// Starts the provider service and the continuation manager, which creates and resumes
    /// continuable children through `agents`; a cluster node serves its deliveries from now on.
    ///
    /// # Errors
    /// `INVALID_ARGS` when the node's deliveries are served already (by another runtime).
    pub(crate) fn start_service(agents: Agents, cluster: Option<ClusterLink>) -> Result<Self> {
        let events = EventBus::new();
        let setup = Arc::new(SetupRegistry::default());
        let service = SubagentService {
            providers: Vec::new(),
            next_registration: 0,
            events: Arc::clone(&events),
        }
        .start();
        let manager = ContinuationManager::new(
            agents.clone(),
            service.clone(),
            Arc::clone(&events),
            Arc::clone(&setup),
            cluster.clone(),
        )
        .start();
        if let Some(cluster) = &cluster {
            let handler = delivery_handler(manager.clone(), agents.clone(), cluster.clone());
            cluster.membership().serve(handler)?;
        }
        Ok(Self {
            agents,
            service,
            manager,
            setup,
            events,
            cluster,
        })
    }

    /// Lists `parent`'s direct delegated children, live and stored, in (created-at, id)
    /// order, without loading or resuming any of them (see [`crate::projection`]): each is a
    /// child entry or, when its identity cannot be served, a diagnostic. Without a store the
    /// listing is live-only.
    ///
    /// # Errors
    /// `SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE` (checked before any read) when the runtime
    /// was built without projections; `CANCELLED` when `cancel` fired; the store's error when
    /// listing its sessions fails.
    pub async fn list_children(
        &self,
        parent: SessionId,
        cancel: CancellationToken,
    ) -> Result<Vec<SubagentListEntry>> {
        Listing::open(&self.agents, cancel)
            .await?
            .children(parent)
            .await
    }

    /// Lists `root`'s whole descendant tree in stable pre-order, from the same corpus as
    /// [`Subagents::list_children`]: ordinary and one-shot sessions are walked through, so
    /// continuable descendants below them are found; each entry carries its durable parent and
    /// its depth below `root`.
    ///
    /// # Errors
    /// As [`Subagents::list_children`].
    pub async fn list_descendants(
        &self,
        root: SessionId,
        cancel: CancellationToken,
    ) -> Result<Vec<SubagentDescendantListEntry>> {
        Listing::open(&self.agents, cancel)
            .await?
            .descendants(root)
            .await
    }

    /// Lists the whole durable forest from one read of the store: every root session (one
    /// with no parent, or whose parent is not stored) that has delegated descendants, oldest
    /// first, each with its descendants as [`Subagents::list_descendants`] lists them. One
    /// corpus serves every root, so a store holding many roots is read once, not once a root.
    ///
    /// # Errors
    /// As [`Subagents::list_children`].
    pub async fn list_forest(&self, cancel: CancellationToken) -> Result<Vec<SubagentForestTree>> {
        let entries = self.stream_forest(cancel).await?;
        entries
            .try_fold(
                Vec::new(),
                |mut forest: Vec<SubagentForestTree>, SubagentForestEntry { root, entry }| {
                    match forest.last_mut() {
                        Some(tree) if tree.root == root => tree.descendants.push(entry),
                        _ => forest.push(SubagentForestTree {
                            root,
                            descendants: vec![entry],
                        }),
                    }
                    std::future::ready(Ok(forest))
                },
            )
            .await
    }

    /// [`Subagents::list_forest`] as a stream of entries, root by root and in pre-order within
    /// a root, each yielded as soon as it is identified (at most four store reads at once): a
    /// caller that prints or counts the forest holds one entry at a time, not the whole
    /// listing. The store is read for every root once, before the first entry; a root appears
    /// only through its entries, so a root with none listed does not appear.
    ///
    /// # Errors
    /// As [`Subagents::list_children`]: reading the corpus fails the call; an entry's failure
    /// (`CANCELLED`, a store error) is the stream's next item.
    pub async fn stream_forest(
        &self,
        cancel: CancellationToken,
    ) -> Result<impl futures::Stream<Item = Result<SubagentForestEntry>> + Send + 'static> {
        Ok(Arc::new(Listing::open(&self.agents, cancel).await?).forest())
    }

    /// Registers `provider` under its name.
    ///
    /// # Errors
    /// `DUPLICATE_PROVIDER`; `LISTENER_REJECTED` when a `provider-added` listener refused it
    /// (the registration is rolled back).
    ///
    /// # Cancel safety
    /// Dropping the future may still register the provider, with no handle to remove it.
    pub async fn register_provider(
        &self,
        provider: impl SubagentProvider,
    ) -> Result<ProviderRegistration> {
        self.register_shared(Arc::new(provider)).await
    }

    /// Registers the two in-process providers, `spawn` (a fresh child) and `fork` (a child
    /// seeded with the parent's completed turns), for the service's whole life.
    ///
    /// # Errors
    /// As [`Subagents::register_provider`] (`DUPLICATE_PROVIDER` when either name is taken;
    /// `spawn` stays registered if only `fork` fails).
    pub async fn register_in_process_providers(&self) -> Result<()> {
        self.register_provider(crate::SpawnInProcess::default())
            .await?
            .keep();
        self.register_provider(crate::ForkInProcess::default())
            .await?
            .keep();
        Ok(())
    }

    /// [`Subagents::register_provider`] for a provider already behind an `Arc`.
    ///
    /// # Errors
    /// As [`Subagents::register_provider`].
    pub async fn register_shared(
        &self,
        provider: Arc<dyn SubagentProvider>,
    ) -> Result<ProviderRegistration> {
        let name = provider.name().to_owned();
        let id = self.service.send(Register(provider)).await??;
        Ok(ProviderRegistration {
            id,
            name,
            service: Some(self.service.clone()),
        })
    }

    /// The provider registered under `name`.
    pub async fn get_provider(&self, name: &str) -> Option<Arc<dyn SubagentProvider>> {
        self.service
            .send(Lookup(name.to_owned()))
            .await
            .ok()
            .flatten()
    }

    /// Registered provider names, in insertion order.
    pub async fn list(&self) -> Vec<String> {
        self.service.send(List).await.unwrap_or_default()
    }

    /// Establishes a published one-shot child on the named provider.
    ///
    /// The parent's delegated policy (sandbox override, approval pin) is captured when this is
    /// called, before the returned future first runs: a policy switched right after the call
    /// does not reach the child. The start itself is enqueued at the call too, so starts reach
    /// their provider in the order they were made.
    ///
    /// # Errors
    /// Before anything exists: `NO_PROVIDER`, `UNSUPPORTED_CAPABILITY`, `INVALID_MAX_DEPTH`,
    /// `UNSUPPORTED_SCHEMA`, and the provider's own creation errors (for in-process providers:
    /// `ABORTED_BEFORE_PUBLICATION`, `INVALID_ARGS` for an empty prompt, `DEPTH_EXCEEDED`,
    /// `UNKNOWN_TOOL`, ...). A failed start
    /// emits no lifecycle event and leaves no run to dispose.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future cancels the start, as `request.cancel` would. A start
    /// that fails then leaves nothing behind; one that published meanwhile is aborted and its
    /// unheld run disposed.
    pub fn start(
        &self,
        name: &str,
        mut request: SubagentStartRequest,
    ) -> impl std::future::Future<Output = Result<SubagentRun>> + Send + 'static {
        request.capture_policy();
        // The provider's start runs detached from this future (an actor's response); a token
        // of its own, cancelled if this future is dropped, keeps it from outliving the caller.
        let start_cancel = request.cancel.child_token();
        request.cancel = start_cancel.clone();
        // Armed before the start is sent: a future dropped unpolled cancels it too.
        let abandon = start_cancel.drop_guard();
        // Sent now, in call order (`send` enqueues at once), and without a clone of the
        // service's address in the future (a clone allocates a sender).
        let resolving = self.service.send(Start {
            name: name.to_owned(),
            request,
        });
        let events = Arc::clone(&self.events);
        let name = name.to_owned();
        async move {
            let resolved = resolving.await.map_err(SubagentError::from)?;
            let ResolvedStart { started, parent } = resolved?;
            let run = started.await?;
            abandon.disarm();
            observe_run(&events, name, parent, &run);
            Ok(run)
        }
    }

    /// The delegation lifecycle events. Start and end are scoped to the delegating parent's
    /// session.
    pub fn events(&self) -> &Arc<EventBus<SubagentEvent>> {
        &self.events
    }

    /// Waits for `parent`'s children to settle: every `subagent/end` of a child of its session
    /// from now on, each epoch's stop reason and final output. Open it before starting or
    /// following up the children it waits for (see [`Settlements`]).
    pub fn settlements(&self, parent: &AgentRef) -> Settlements {
        Settlements::open(&self.events, parent.id())
    }

    /// Starts a continuable child: the manager mints its id, snapshots its descriptor, asks
    /// the provider only for its creation spec (a fork seed or nothing), creates the child,
    /// takes ownership under a continuable parent, and submits the prompt. Resolves with
    /// `{child_id, message_id}` at inbox acceptance, without waiting for the turn: the child's
    /// session is stored with its accepted prompt in one write (the creation's commit point),
    /// and the start answers once the store has taken that write (forced to disk by the
    /// store's next flush; see the README's durability section). The parent's delegated policy
    /// is captured when this is called.
    ///
    /// # Errors
    /// With no id, no Activation, no ownership and nothing stored left behind (nothing lists
    /// or resumes a refused child): `INVALID_ARGS` (an empty prompt), `DRAINING`,
    /// `PERSISTENCE_UNAVAILABLE`, `INVALID_MAX_DEPTH`, `DEPTH_EXCEEDED`, `NO_PROVIDER`,
    /// `UNSUPPORTED_CAPABILITY` (no `prepare_continuable`), `CANCELLED` (the token fired
    /// before acceptance), `ACTIVATION_CLOSING` (the parent Activation is settling),
    /// `ACTIVATION_SETUP_REVOKED`, `INVALID_BUDGET` (a zero limit, or a wall time under
    /// 1 ms), creation errors, and the store's error when the child's creation could not be
    /// written.
    ///
    /// # Cancel safety
    /// Cancel safe: the start runs as its own task, so dropping the future leaves either an
    /// accepted child (owned by the manager) or nothing.
    pub fn start_continuable(
        &self,
        mut spec: ContinuableStartSpec,
    ) -> impl std::future::Future<Output = Result<ContinuableStart>> + Send + 'static {
        spec.capture_policy();
        let request = require_content("a start prompt", &spec.prompt)
            .map(|()| self.manager.send(StartContinuable(spec)));
        own_task(async move { request?.await.map_err(SubagentError::from)? })
    }

    /// Delivers `content` to a continuable child as its next FIFO turn: a running child
    /// enqueues it, a waiting one wakes, an absent one is cold-resumed from the store (its
    /// session lease taken first, its descriptor folded from its own events, its parent's
    /// authority checked before anything is loaded and again after every await). A delivery
    /// that loses the race with the child's settlement waits for the teardown and
    /// cold-resumes.
    ///
    /// Resolves at inbox acceptance: the message is then in the child's live log and is
    /// claimed exactly once by a turn, in acceptance order (or discarded with a recorded
    /// reason). It reaches the store behind the answer, with the child's other events: a
    /// crash of this process before that write, or before the store's next flush forces it to
    /// disk, loses it as it loses any unflushed event (see the README's durability section).
    /// In a cluster it resolves once the acceptance is stored, wherever the child is resident:
    /// a node that answered and then died leaves it in the database.
    /// A child whose store write fails faults; once resumed, a turn whose record never
    /// reached the store may run again.
    ///
    /// Idempotent by message id: a follow-up sent under an id the child already accepted
    /// ([`FollowupOptions::message_id`], a caller's retry after a lost answer), and a delivery
    /// this runtime sends again after a node that may have accepted it stopped, is answered
    /// with the first acceptance and runs no second turn (an absent child's stored log answers
    /// it, and nothing is resumed for a message it settled long ago).
    ///
    /// # Errors
    /// `INVALID_ARGS` (empty content), `DRAINING`, `CANCELLED` (before acceptance only;
    /// afterwards the token no longer matters), `UNAUTHORIZED` (not the exact live direct
    /// parent), `NOT_RESUMABLE`,
    /// `SESSION_LEASED` (resident in another runtime), `PERSISTENCE_UNAVAILABLE`,
    /// `INVALID_DESCRIPTOR`, `BUDGET_EXHAUSTED` (the child spent a limit of its budget and
    /// this follow-up does not raise it; nothing is loaded), `INVALID_BUDGET` (a raise with a
    /// zero limit, or a wall time under 1 ms), `NODE_UNRESPONSIVE` (the child's node in a
    /// cluster did not answer within `PostgresConfig::delivery_deadline`, three times: each
    /// ask after the first goes under the same message id, so one the node took late is
    /// answered with its first acceptance; unless the message says it was withdrawn, it may
    /// have been accepted there, so send under [`FollowupOptions::message_id`] to retry it
    /// safely), and resume errors as they are.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Subagents::start_continuable`].
    pub fn followup(
        &self,
        parent: &AgentRef,
        child_id: SessionId,
        content: Vec<ContentBlock>,
        options: FollowupOptions,
    ) -> impl std::future::Future<Output = Result<MessageId>> + Send + 'static {
        let manager = self.manager.clone();
        let cluster = self.cluster.clone();
        let parent = parent.clone();
        let checked = require_content("a follow-up", &content)
            .and_then(|()| options.budget.map(budget::normalize).transpose());
        let token = options.cancel;
        let source = options.source;
        let chosen_id = options.message_id;
        // Taken here, in the caller's context: the task below runs detached from it.
        let trace = tracing::Span::current();
        let sent_from = trace.clone();
        let metrics = self.agents.env().metrics.clone();
        own_task(async move {
            let routed = async {
                let mut message = Message::user(content, source);
                if let Some(id) = chosen_id {
                    message.id = id;
                }
                let delivery = Delivery {
                    message,
                    raise: checked?,
                    may_repeat: chosen_id.is_some(),
                    trace,
                };
                route_followup(
                    &manager,
                    cluster.as_ref(),
                    &parent,
                    child_id,
                    &delivery,
                    &token,
                )
                .await
            }
            .await;
            if let Some(metrics) = metrics {
                metrics.followup(&routed);
            }
            crate::trace::followup_event(&sent_from, child_id, &routed);
            routed
        })
    }

    /// Interrupts a resident continuable child's current turn under `authority`: the cancel
    /// (cause `user` or `parent`, inbox kept) is issued before this returns, without waiting
    /// for quiescence. Pending messages stay parked until the next waking send; claimed work
    /// is not requeued; descendants and the Activation are untouched.
    ///
    /// Authority is checked whatever the target's residency: a target that is not resident
    /// (one-shot, settled, or being cold-resumed) is checked against the parent and ancestors
    /// its headers record. A settled or one-shot target then has nothing to stop (an accepted
    /// no-op); one whose cold resume is in flight is interrupted as its resumed turn opens, so
    /// the interrupt is never lost to the resume. An unknown id is an accepted no-op.
    ///
    /// A child its parent here placed on another node of a cluster is interrupted there; one
    /// resident on another node that this runtime has no record of (a grandchild a child
    /// placed, or a child placed before this runtime restarted) is found by its lease and
    /// interrupted there, for the parent or ancestor session this node holds.
    ///
    /// # Errors
    /// `UNAUTHORIZED`: a wrong parent address, a caller outside the target's ancestry, a stale
    /// ancestor, or an ancestor naming itself; a store error reading a non-resident target's
    /// headers; for a child on another node, what that node answered, or `STORE_IO` when it
    /// could not be asked.
    pub async fn interrupt(&self, target: SessionId, authority: InterruptAuthority) -> Result<()> {
        let answer = self.route_interrupt(target, authority).await;
        crate::trace::interrupt_event(target, &answer);
        answer
    }

    /// [`Subagents::interrupt`], to wherever the target is.
    async fn route_interrupt(
        &self,
        target: SessionId,
        authority: InterruptAuthority,
    ) -> Result<()> {
        let routed = self
            .manager
            .send(Interrupt {
                target,
                authority: authority.clone(),
            })
            .await
            .map_err(SubagentError::from)??;
        match routed {
            InterruptRouted::Done => Ok(()),
            InterruptRouted::Absent => {
                let Some(cause) = authorize_absent(&self.agents, target, &authority).await? else {
                    return Ok(());
                };
                // Resident on another node that this runtime has no record of (a grandchild
                // its child placed, or a child placed before this runtime restarted): found by
                // its lease, as a follow-up finds it, and interrupted there for the session
                // this node acts for.
                if let Some(cluster) = &self.cluster {
                    if let Some(holder) = cluster.other_holder(target).await? {
                        let acting = match &authority {
                            InterruptAuthority::User { parent_session_id } => *parent_session_id,
                            InterruptAuthority::Ancestor(caller) => caller.id(),
                        };
                        return ask_interrupt(cluster, holder.node, acting, target, cause).await;
                    }
                }
                self.manager
                    .send(InterruptAbsent { target, cause })
                    .await
                    .map_err(SubagentError::from)
            }
            InterruptRouted::Remote {
                node,
                parent,
                cause,
            } => {
                let cluster = self.cluster.as_ref().ok_or_else(|| {
                    SubagentError::bug("a child was placed on another node of no cluster")
                })?;
                ask_interrupt(cluster, node, parent, target, cause).await
            }
        }
    }

    /// Delivers `content` from a resident continuable child to its durable direct parent,
    /// framed as one `subagent-report` message: `Wakeup` as one later parent turn, `Quiet` as
    /// context for the parent's next step. Reporting ends neither the child's turn nor its
    /// Activation; the child still gets its settled notice.
    ///
    /// # Errors
    /// `INVALID_ARGS` (empty content), `CANCELLED`, `DRAINING`, `UNAUTHORIZED` (not the
    /// exact resident child),
    /// `ACTIVATION_CLOSING`, `PARENT_UNAVAILABLE` (the parent is not live or refused).
    ///
    /// # Cancel safety
    /// Cancel safe: the report runs as its own task.
    pub fn report_from(
        &self,
        child: &AgentRef,
        content: Vec<ContentBlock>,
        options: ReportOptions,
    ) -> impl std::future::Future<Output = Result<MessageId>> + Send + 'static {
        let sent_from = tracing::Span::current();
        let child_id = child.id();
        let request = require_content("a report", &content).map(|()| {
            self.manager.send(ReportFrom {
                child: child.clone(),
                content,
                delivery: options.delivery,
                token: options.cancel,
                trace: sent_from.clone(),
            })
        });
        // Its own task: once the manager admitted the report, the delivery and its
        // compensation run to the end even if the caller stops waiting.
        own_task(async move {
            let answer = async { request?.await.map_err(SubagentError::from)??.await }.await;
            crate::trace::report_event(&sent_from, child_id, &answer);
            answer
        })
    }

    /// Registers a setup contribution installed into every later continuable child's
    /// unpublished scope (fresh or cold-resumed), after its base composition. Removing the
    /// registration revokes every resident installation at once.
    pub fn register_continuable_setup(
        &self,
        contribution: ContinuableSetupContribution,
    ) -> SetupRegistration {
        let id = self.setup.register(contribution);
        SetupRegistration::new(Arc::clone(&self.setup), id)
    }

    /// Closes continuable admission below the exact live `parents` (until each leaves the
    /// registry), opens every descendant Activation's disposal now (top-down), then waits for
    /// admitted materializations below them and releases those forests child first. A
    /// continuable parent itself survives; unrelated forests stay live; stale parents are
    /// ignored. The drain is requested when this is called, before the future is polled.
    ///
    /// # Errors
    /// `ACTIVATION_TEARDOWN_FAILED` after every branch settled, when any failed.
    pub fn drain_continuable_descendants(
        &self,
        parents: &[AgentRef],
    ) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let span = crate::trace::drain_span(parents.len());
        let request = self.manager.send(DrainDescendants {
            parents: parents.to_vec(),
            trace: span.clone(),
        });
        let metrics = self.agents.env().metrics.clone();
        async move {
            let began = metrics.as_ref().map(|_| std::time::Instant::now());
            let drained = request.await.map_err(SubagentError::from)?;
            if let (Some(metrics), Some(began)) = (metrics, began) {
                metrics.drain(&drained, began);
            }
            drained
        }
        .instrument(span)
    }

    /// The manager-wide drain run by [`crate::Runtime::shutdown`].
    pub(crate) async fn drain_all(&self) -> Result<()> {
        self.manager
            .send(DrainAll)
            .await
            .map_err(SubagentError::from)?
    }

    /// This runtime's cluster, when it is a node of one.
    pub(crate) fn cluster(&self) -> Option<&ClusterLink> {
        self.cluster.as_ref()
    }

    /// The continuation manager (for the manager's own white-box tests).
    #[cfg(test)]
    pub(crate) fn manager(&self) -> &Addr<ContinuationManager> {
        &self.manager
    }

    /// How many continuable children are resident now (for tests and benchmarks, through
    /// [`crate::testing::resident_count`]: the API itself exposes no residency query).
    pub(crate) async fn resident_count(&self) -> usize {
        self.manager.send(ResidentCount).await.unwrap_or(0)
    }

    /// The sessions of the continuable children resident now (for the history checker).
    pub(crate) async fn resident_ids(&self) -> Vec<SessionId> {
        self.manager.send(ResidentIds).await.unwrap_or_default()
    }

    /// How many host-owned parents have an ownership node now (for tests, through
    /// [`crate::testing::owner_node_count`]).
    pub(crate) async fn owner_node_count(&self) -> usize {
        self.manager.send(OwnerNodeCount).await.unwrap_or(0)
    }
}

/// Runs `work` as a task of its own, so a caller that drops the future cannot leave it half
/// done.
fn own_task<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> impl std::future::Future<Output = Result<T>> + Send + 'static {
    let task = tokio::spawn(work);
    async move {
        task.await
            .map_err(|error| SubagentError::bug(format!("a seam task failed: {error}")))?
    }
}
