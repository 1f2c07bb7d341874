//! The child's side of a cluster (see [`crate::cluster`]): what this node serves of its peers'
//! asks. A child placed here by a parent on another node is an ordinary resident whose parent
//! is a [`ParentLink::Remote`]; what its parent asks arrives as a delivery, is authorized by
//! the node incarnation holding the parent's lease, and is decided in the manager's handlers
//! like any local request. A child's notice or report for a parent here arrives the same way,
//! authorized by the parent's record of where it placed the child.

use serde_json::Value;
use tracing::Instrument as _;

use super::control::header_of;
use super::materialize::{create_and_install, FreshChild};
use super::*;
use crate::cluster::{decode_op, encode_answer, FollowupAnswer, NoticeKind, RemoteOp, RemoteStart};
use crate::session::{EventKind, Seed, SeedReference, SessionEvent};
use crate::store::deliveries::{Delivery as NodeDelivery, DeliveryHandler};

/// Internal: a parent on another node starts a child here.
#[derive(Message)]
#[rtype(result = "Result<ContinuableStart>")]
struct StartPlaced {
    start: RemoteStart,
    sender: NodeId,
}

impl Handler<StartPlaced> for ContinuationManager {
    type Result = ResponseFuture<Result<ContinuableStart>>;

    fn handle(&mut self, msg: StartPlaced, ctx: &mut Context<Self>) -> Self::Result {
        let admitted = self.admit_placed(&msg.start, ctx);
        let manager = ctx.address();
        let agents = self.agents.clone();
        let registry = Arc::clone(&self.setup);
        Box::pin(async move {
            let (mut fresh, _guard) = admitted?;
            if let Some(prefix) = msg.start.seed {
                fresh.seed = inherited_seed(&agents, prefix).await?;
            }
            let parent = ParentLink::remote(msg.start.parent, msg.sender);
            let token = CancellationToken::new();
            let started =
                create_and_install(manager, agents.clone(), registry, parent, fresh, token).await?;
            // Answered once durable: a node that dies after answering still has the child
            // and its prompt. (One gone already was released, which flushes.)
            if let Some(child) = agents.get(started.child_id).await {
                child.log().flush().await?;
            }
            Ok(started)
        })
    }
}

/// The seed of a fork placed here: its parent's prefix, read from the shared store (where the
/// parent's node flushed it before asking) and checked against the reference.
async fn inherited_seed(agents: &Agents, prefix: SeedReference) -> Result<Seed> {
    let store = agents.env().store.clone().ok_or_else(|| {
        SubagentError::new(
            ErrorCode::PersistenceUnavailable,
            "continuable children require session persistence",
        )
    })?;
    let events = store.read_between(prefix.session, 0, prefix.length).await?;
    Seed::resolved(prefix, events)
}

impl ContinuationManager {
    /// Admission, persistence, the descriptor and this node's composition of a placed start.
    fn admit_placed(
        &mut self,
        start: &RemoteStart,
        ctx: &Context<Self>,
    ) -> Result<(FreshChild, MaterializationGuard)> {
        self.assert_admitting(&start.lineage)?;
        let env = Arc::clone(self.agents.env());
        if env.store.is_none() {
            return Err(SubagentError::new(
                ErrorCode::PersistenceUnavailable,
                "continuable children require session persistence",
            ));
        }
        let descriptor = SubagentDescriptor::from_json(&start.descriptor)?
            .filter(|descriptor| descriptor.mode == DelegationMode::Continuable)
            .ok_or_else(|| {
                SubagentError::new(
                    ErrorCode::InvalidDescriptor,
                    "a placed child's descriptor is not a continuable one",
                )
            })?;
        let composition = ChildComposition::new(
            &env,
            Some(start.policy.clone()),
            descriptor.persona.as_deref(),
            descriptor.tool_filter.clone(),
        )?;
        let guard = self.register_materialization(start.lineage.clone(), None, ctx);
        let fresh = FreshChild {
            child: start.child,
            depth: start.depth,
            lineage: start.lineage.clone(),
            options: start.options.clone(),
            descriptor,
            composition,
            seed: Seed::default(),
            cwd: start.cwd.clone().map(Into::into),
            provider: start.provider.clone(),
            prompt: start.prompt.clone(),
            trace: crate::trace::served_span("serve start", start.traceparent.as_deref()),
        };
        Ok((fresh, guard))
    }
}

/// Internal: a parent on another node sends its resident child here a follow-up.
#[derive(Message)]
#[rtype(result = "Result<FollowupAnswer>")]
struct PlacedFollowup {
    parent: SessionId,
    sender: NodeId,
    child: SessionId,
    delivery: Delivery,
}

impl Handler<PlacedFollowup> for ContinuationManager {
    type Result = ResponseFuture<Result<FollowupAnswer>>;

    fn handle(&mut self, msg: PlacedFollowup, ctx: &mut Context<Self>) -> Self::Result {
        let Some(resident) = self.residents.get_mut(&msg.child) else {
            return Box::pin(async { Ok(FollowupAnswer::Absent) });
        };
        if let Some(disposal) = resident.disposal.clone() {
            // Settling: once it is gone, the parent's node resumes it.
            return Box::pin(async move {
                let _ = disposal.await;
                Ok(FollowupAnswer::Absent)
            });
        }
        // The parent may have moved between nodes: its notices go where it is now.
        if let ParentLink::Remote(remote) = &mut resident.parent {
            if remote.id == msg.parent {
                remote.node = msg.sender;
            }
        }
        let log = resident.agent.log().clone();
        let parent = ParentLink::remote(msg.parent, msg.sender);
        let token = CancellationToken::new();
        let accepted = self.submit(msg.child, &parent, msg.delivery, &token, ctx);
        Box::pin(async move {
            let id = accepted?.await?;
            // Answered once durable: the parent's node never resends what was accepted, so a
            // node that dies after answering must still have it.
            log.flush().await?;
            Ok(FollowupAnswer::Accepted(id))
        })
    }
}

/// Internal: a parent (or an ancestor) on another node interrupts its resident child here.
#[derive(Message)]
#[rtype(result = "Result<()>")]
struct PlacedInterrupt {
    parent: SessionId,
    child: SessionId,
    cause: CancelCause,
}

impl Handler<PlacedInterrupt> for ContinuationManager {
    type Result = Result<()>;

    fn handle(&mut self, msg: PlacedInterrupt, _: &mut Context<Self>) -> Result<()> {
        let Some(resident) = self.residents.get(&msg.child) else {
            return Ok(());
        };
        // The asking node holds `parent`'s lease (checked before this): the child's parent on
        // that node, or one of its ancestors (a grandchild its child placed, interrupted from
        // above).
        let in_lineage =
            resident.parent.is_remote(msg.parent) || resident.ancestry[1..].contains(&msg.parent);
        if !in_lineage {
            return Err(unauthorized(format!(
                "continuable child {} is not a descendant of agent {}",
                msg.child, msg.parent
            )));
        }
        if resident.disposal.is_none() {
            resident.agent.cancel_now(msg.cause, InboxPolicy::Keep);
        }
        Ok(())
    }
}

impl ContinuationManager {
    /// `child`'s record when it is resident here, refused unless `parent` on another node is
    /// its parent; `None` when it is not resident (nothing to act on).
    fn placed_by(&self, parent: SessionId, child: SessionId) -> Result<Option<&Resident>> {
        let Some(resident) = self.residents.get(&child) else {
            return Ok(None);
        };
        if !resident.parent.is_remote(parent) {
            return Err(unauthorized(format!(
                "continuable child {child} belongs to another parent session"
            )));
        }
        Ok(Some(resident))
    }
}

/// Internal: a parent on another node releases its child here (child first, its own release
/// waits for this one).
#[derive(Message)]
#[rtype(result = "Result<Option<ServedRelease>>")]
struct PlacedRelease {
    parent: SessionId,
    child: SessionId,
}

/// A placed child's disposal on its node, as a release of it found it.
struct ServedRelease {
    disposal: Disposal,
    /// Whether the disposal hands the child over (this node leaves) instead of releasing it:
    /// what it accepted and did not run stays in its log, for its parent's node to discard.
    handed_over: bool,
}

impl Handler<PlacedRelease> for ContinuationManager {
    type Result = Result<Option<ServedRelease>>;

    fn handle(&mut self, msg: PlacedRelease, ctx: &mut Context<Self>) -> Self::Result {
        if self.placed_by(msg.parent, msg.child)?.is_none() {
            return Ok(None);
        }
        let Some(disposal) = self.open_disposal(msg.child, ctx) else {
            return Ok(None);
        };
        let handed_over = self
            .residents
            .get(&msg.child)
            .is_some_and(|resident| resident.handed_over);
        Ok(Some(ServedRelease {
            disposal,
            handed_over,
        }))
    }
}

/// Internal: a child on another node sends its parent here a settled notice or a report.
#[derive(Message)]
#[rtype(result = "Result<BoxFuture<'static, Result<MessageId>>>")]
struct PlacedNotice {
    parent: SessionId,
    /// The parent's live agent here, as the registry answered (a host-owned parent is not
    /// resident, and its child's record may not exist yet).
    live: Option<AgentRef>,
    sender: NodeIncarnation,
    child: SessionId,
    message: Message,
    kind: NoticeKind,
    /// The span the notice or report is served in (continuing its sender's trace).
    trace: tracing::Span,
}

impl Handler<PlacedNotice> for ContinuationManager {
    type Result = Result<BoxFuture<'static, Result<MessageId>>>;

    fn handle(&mut self, msg: PlacedNotice, ctx: &mut Context<Self>) -> Self::Result {
        let PlacedNotice {
            parent,
            live,
            sender,
            child,
            message,
            kind,
            trace,
        } = msg;
        // Each epoch's notice is heard once: an epoch accounted as ended with its node
        // (`node-stopped`) was heard of already, and a late notice from that incarnation of
        // the node is its second.
        let accounted = self
            .ended_with_node
            .get(&child)
            .is_some_and(|ended| ended.may_be(&sender));
        // A child's record names the node incarnation holding it: another speaks for it no
        // more. (A child resumed here since has no record: its former node's notice is that
        // of the epoch before, which its parent has not heard yet.)
        let moved = self
            .remote_children
            .get(&child)
            .is_some_and(|record| !record.holder().may_be(&sender));
        if accounted || moved {
            return Err(unauthorized(format!(
                "node {} no longer holds continuable child {child}",
                sender.node
            )));
        }
        let recorded = self
            .remote_children
            .get(&child)
            .filter(|record| record.parent.id() == parent)
            .map(|record| record.parent.clone());
        let captured = recorded
            .or_else(|| {
                self.residents
                    .get(&parent)
                    .map(|resident| resident.agent.clone())
            })
            .or(live)
            .ok_or_else(|| {
                SubagentError::new(
                    ErrorCode::ParentUnavailable,
                    format!("agent {parent} is not resident on this node"),
                )
            })?;
        if kind == NoticeKind::HandedOver {
            self.parked.insert(child, captured.clone());
        }
        match kind {
            NoticeKind::Settled | NoticeKind::HandedOver => {
                let id = message.id;
                // Its node may ask again under the notice's id (an answer it did not get in
                // time): the parent answers with the first acceptance.
                let delivery =
                    self.post_settled_notice(child, &captured, message, true, trace.into(), ctx);
                self.forget_remote(child, sender.node, ctx);
                // Answered once delivered (or stored for a parent that is away).
                Ok(async move {
                    delivery.await;
                    Ok(id)
                }
                .boxed())
            }
            NoticeKind::Report(delivery) => self.post_report(
                child,
                &captured,
                message,
                delivery,
                super::parent::ReportOrigin::Peer(trace),
                ctx,
            ),
        }
    }
}

/// The answer an earlier ask of `start` got, when it created the child: its parent's node took
/// no answer in time and asks again under the child's id. A child is stored only once its
/// prompt is accepted, so one stored under this parent was started, with the first message
/// its inbox accepted as its prompt. (One session's deliveries are served in order: an
/// earlier ask is over when this one is served.)
async fn started_before(agents: &Agents, start: &RemoteStart) -> Result<Option<ContinuableStart>> {
    let child = start.child;
    let header = header_of(agents, child).await?;
    if header.and_then(|header| header.parent_session) != Some(start.parent) {
        return Ok(None);
    }
    fn prompt<'a>(events: impl IntoIterator<Item = &'a Arc<SessionEvent>>) -> Option<MessageId> {
        events.into_iter().find_map(|event| match &event.kind {
            EventKind::InboxSpliced { inserted, .. } => inserted.first().map(|message| message.id),
            _ => None,
        })
    }
    let message_id = match agents.get(child).await {
        Some(live) => live.log().with_events(|events| prompt(events)),
        None => match agents.env().store.clone() {
            Some(store) => prompt(&store.read_from(child, 0).await?),
            None => None,
        },
    };
    Ok(message_id.map(|message_id| ContinuableStart {
        child_id: child,
        message_id,
    }))
}

/// Checks that `sender` holds `parent`'s lease: only the node incarnation a parent is resident
/// on may act for it (a node that lost its leases, a process restarted since, or a node that
/// never had this parent, is refused).
async fn authorize(
    cluster: &ClusterLink,
    parent: SessionId,
    sender: NodeIncarnation,
) -> Result<()> {
    match cluster.membership().holder_of(parent).await? {
        Some(holder) if holder.may_be(&sender) => Ok(()),
        _ => Err(unauthorized(format!(
            "node {} does not hold agent {parent}'s session and cannot act for it",
            sender.node
        ))),
    }
}

/// How this node serves what its peers ask of it.
pub(crate) fn delivery_handler(
    manager: Addr<ContinuationManager>,
    agents: Agents,
    cluster: ClusterLink,
) -> DeliveryHandler {
    Arc::new(move |delivery: NodeDelivery| {
        let (manager, agents, cluster) = (manager.clone(), agents.clone(), cluster.clone());
        async move { serve(&manager, &agents, &cluster, delivery).await }.boxed()
    })
}

async fn serve(
    manager: &Addr<ContinuationManager>,
    agents: &Agents,
    cluster: &ClusterLink,
    delivery: NodeDelivery,
) -> Result<Value> {
    let sender = NodeIncarnation {
        node: delivery.sender,
        incarnation: delivery.sent_by,
    };
    match decode_op(delivery.payload)? {
        RemoteOp::Start(start) => {
            authorize(cluster, start.parent, sender).await?;
            // Asked again (its answer was not heard in time): the first ask's acceptance.
            if let Some(started) = started_before(agents, &start).await? {
                return encode_answer(&started);
            }
            let started = manager
                .send(StartPlaced {
                    start: *start,
                    sender: sender.node,
                })
                .await
                .map_err(SubagentError::from)??;
            encode_answer(&started)
        }
        RemoteOp::Followup {
            parent,
            child,
            message,
            raise,
            may_repeat,
            traceparent,
        } => {
            authorize(cluster, parent, sender).await?;
            let raise = raise.map(budget::normalize).transpose()?;
            let answer = manager
                .send(PlacedFollowup {
                    parent,
                    sender: sender.node,
                    child,
                    delivery: Delivery {
                        message,
                        raise,
                        may_repeat,
                        trace: crate::trace::served_span("serve follow-up", traceparent.as_deref()),
                    },
                })
                .await
                .map_err(SubagentError::from)??;
            encode_answer(&answer)
        }
        RemoteOp::Interrupt {
            parent,
            child,
            cause,
            traceparent,
        } => {
            let served = crate::trace::served_span("serve interrupt", traceparent.as_deref());
            async {
                authorize(cluster, parent, sender).await?;
                manager
                    .send(PlacedInterrupt {
                        parent,
                        child,
                        cause,
                    })
                    .await
                    .map_err(SubagentError::from)??;
                Ok(Value::Null)
            }
            .instrument(served)
            .await
        }
        RemoteOp::Release {
            parent,
            child,
            traceparent,
        } => {
            let served = crate::trace::served_span("serve release", traceparent.as_deref());
            async {
                authorize(cluster, parent, sender).await?;
                let release = manager
                    .send(PlacedRelease { parent, child })
                    .await
                    .map_err(SubagentError::from)??;
                // Answered whether the child was released here.
                let Some(release) = release else {
                    return encode_answer(&false);
                };
                // The child's release may wait on releases on other nodes: this delivery holds
                // no serving slot meanwhile.
                crate::store::deliveries::yield_slot();
                release.disposal.await?;
                // Handed over as this node leaves, it kept what it accepted: not released
                // here, so the parent's node discards that from the store (its lease is free
                // now). Answered "released", it stayed pending with nothing to run it.
                encode_answer(&!release.handed_over)
            }
            .instrument(served)
            .await
        }
        RemoteOp::Notify {
            parent,
            child,
            message,
            kind,
            traceparent,
        } => {
            // Only the child's node speaks for it: after its release nobody holds it, and
            // while it runs its node does; once this node resumed it, its former node's
            // settled notice is the epoch before's.
            if let Some(holder) = cluster.membership().holder_of(child).await? {
                let holds = holder.may_be(&sender);
                let resumed_here = holder.node == cluster.node() && kind.is_settled();
                if !holds && !resumed_here {
                    return Err(unauthorized(format!(
                        "node {} does not hold continuable child {child}",
                        sender.node
                    )));
                }
            }
            // And only for a child of that parent: a made-up id, or a child of another
            // session, is no one's to announce.
            let named = header_of(agents, child)
                .await?
                .and_then(|header| header.parent_session);
            if named != Some(parent) {
                return Err(unauthorized(format!(
                    "no continuable child {child} of agent {parent} is stored"
                )));
            }
            let live = agents.get(parent).await;
            let accepted = manager
                .send(PlacedNotice {
                    parent,
                    live,
                    sender,
                    child,
                    message,
                    kind,
                    trace: crate::trace::served_span("serve notice", traceparent.as_deref()),
                })
                .await
                .map_err(SubagentError::from)??;
            let id = accepted.await?;
            // Answered once durable: the child's node never sends again what was accepted.
            if let Some(parent) = agents.get(parent).await {
                parent.log().flush().await?;
            }
            encode_answer(&id)
        }
    }
}
