//! The parent's side of a cluster (see [`crate::cluster`]): children this runtime's parents
//! placed on other nodes.
//!
//! A parent's node keeps a [`RemoteChild`] record for each child it placed elsewhere: the
//! parent owns it as it would a resident child (it waits while the child is resident, and its
//! release releases the child first), its follow-ups and interrupts route there, and the
//! record ends with the child's settled notice (or with its node: `node-stopped`). What the
//! child's node serves of these asks is in `served.rs`.

use super::followup::{Followup, Routed};
use super::*;
use crate::cluster::{FollowupAnswer, NoticeKind, RemoteOp, RemoteStart};

/// Asks `node` to create the child a parent here prepared, then records it as the parent's.
pub(super) async fn place(
    manager: Addr<ContinuationManager>,
    (cluster, node): (ClusterLink, NodeId),
    parent: AgentRef,
    start: RemoteStart,
) -> Result<ContinuableStart> {
    let child = start.child;
    // A node that is not there is refused by name, before anything is recorded or sent.
    cluster.require_live(node).await?;
    // Recorded first: the child may report, or even settle, before its start is answered. A
    // release asked meanwhile waits for the start's answer (it must not overtake it).
    let (answered, starting) = signal();
    manager
        .send(RemotePlaced {
            child,
            parent,
            node,
            incarnation: None,
            starting: Some(starting),
        })
        .await
        .map_err(SubagentError::from)??;
    // Once sent, the start is the child's node's: the caller's token no longer stops it (a
    // child created there and unknown here would have no parent to answer to).
    let op = RemoteOp::Start(Box::new(start));
    let mut asked = 0;
    let started = loop {
        asked += 1;
        match cluster
            .ask_served::<ContinuableStart>(node, child, &op)
            .await
        {
            // Taken and not answered in time: the child may have been created there. Asked
            // again under its id, its node answers with that start.
            Err(error)
                if error.code() == ErrorCode::NodeUnresponsive && asked <= UNANSWERED_ASKS => {}
            started => break started,
        }
    };
    match &started {
        Ok((_, incarnation)) => manager.do_send(RecordAnswered {
            child,
            answered: Answered::Start(*incarnation),
        }),
        // Still unanswered: the child may live there, so the record stays; the parent's
        // release asks that node to release it, and the sweep hears of the node's end.
        Err(error) if error.code() == ErrorCode::NodeUnresponsive => {
            manager.do_send(RecordAnswered {
                child,
                answered: Answered::Start(None),
            });
        }
        Err(_) => manager.do_send(ForgetRemote {
            child,
            node,
            why: Forgotten::Done,
            discarded: false,
        }),
    }
    let _ = answered.send(());
    started.map(|(started, _)| started)
}

/// What of a placed child's record an answer from its node ends.
enum Answered {
    /// Its start, served by this incarnation of its node: it is an ordinary placed child from
    /// now on.
    Start(Option<uuid::Uuid>),
    /// A release that failed: a later one asks again.
    FailedRelease,
}

/// Internal: `child`'s node answered a start or a release.
#[derive(Message)]
#[rtype(result = "()")]
struct RecordAnswered {
    child: SessionId,
    answered: Answered,
}

impl Handler<RecordAnswered> for ContinuationManager {
    type Result = ();

    fn handle(&mut self, msg: RecordAnswered, _: &mut Context<Self>) {
        if let Some(record) = self.remote_children.get_mut(&msg.child) {
            match msg.answered {
                Answered::Start(incarnation) => {
                    record.starting = None;
                    record.incarnation = incarnation;
                }
                Answered::FailedRelease => record.release = None,
            }
        }
    }
}

/// A node that stopped holds nothing any more (its leases expire with it): there is nothing
/// left to stop or release there.
fn unless_gone(outcome: Result<()>) -> Result<()> {
    match outcome {
        Err(error) if error.code() == ErrorCode::SessionLeased => Ok(()),
        outcome => outcome,
    }
}

/// Discards what a child no node holds accepted and did not run (handed over by a node that
/// left, or left behind by one that stopped): resumed here for that alone, its own leased
/// children released first (on their nodes, or discarded from here the same way: nobody else
/// would look below a child nobody holds), its pending messages discarded as a release
/// discards them (before anything below is released), and disposed. Nothing it was left with
/// runs: a released child's settled notice may wake a turn meanwhile, which runs that notice
/// alone and which the disposal cancels. One resident somewhere again, or being resumed here,
/// is left alone.
pub(super) fn discard_parked(
    (cluster, agents): (ClusterLink, Agents),
    child: SessionId,
) -> Disposal {
    async move {
        let handle = match agents.resume(ResumeAgent::new(child)).await {
            Ok(handle) => handle,
            Err(error)
                if matches!(
                    error.code(),
                    ErrorCode::SessionLeased | ErrorCode::DuplicateAgent
                ) =>
            {
                return Ok(())
            }
            Err(error) => return Err(error),
        };
        // What it was left with is discarded before anything below is released: a released
        // child's settled notice may wake a turn meanwhile, and that turn must not run it.
        handle
            .agent()
            .cancel_now(CancelCause::Parent, InboxPolicy::Discard);
        // Child first, while this node holds the child's lease: a release of one of its
        // children on another node is this node's to ask for now.
        let below =
            release_unrecorded((cluster, agents.clone()), child, FastHashSet::default()).await;
        handle
            .agent()
            .cancel_now(CancelCause::Parent, InboxPolicy::Discard);
        let disposed = handle.dispose().await;
        below.and(disposed)
    }
    .boxed()
    .shared()
}

/// Releases the children of `parent` with a lease that this runtime has no record of (not in
/// `known`): this node placed them before it was restarted under its id, or its predecessor
/// ran them, or a node that stopped did. A live lease's node releases its child as it would a
/// recorded one (what it accepted and did not run is discarded); one its node no longer holds
/// (handed over as the node left, or settled) is discarded from here, as a recorded one would
/// be, and so is one a dead lease names: its holder stopped with it resident, and nothing runs
/// what it waits with.
pub(super) fn release_unrecorded(
    (cluster, agents): (ClusterLink, Agents),
    parent: SessionId,
    known: FastHashSet<SessionId>,
) -> Disposal {
    async move {
        for leased in cluster.membership().leased_children(parent).await? {
            let (child, holder) = (leased.child, leased.holder);
            if known.contains(&child) {
                continue;
            }
            if !leased.live {
                discard_parked((cluster.clone(), agents.clone()), child).await?;
                continue;
            }
            if holder.node == cluster.node() {
                continue;
            }
            let op = RemoteOp::Release {
                parent,
                child,
                traceparent: None,
            };
            match cluster.ask::<bool>(holder.node, child, &op).await {
                Ok(true) => {}
                Ok(false) => discard_parked((cluster.clone(), agents.clone()), child).await?,
                // Its node stopped meanwhile: it holds nothing any more.
                Err(error) if error.code() == ErrorCode::SessionLeased => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
    .boxed()
    .shared()
}

/// How many times a follow-up is asked again, under its id, of a node that did not answer it
/// within the delivery deadline.
const UNANSWERED_ASKS: u32 = 2;

/// How many times a follow-up follows its child to another node before it gives up with
/// `SESSION_LEASED` (a child moving that often is being resumed and settled elsewhere).
const MAX_MOVES: u32 = 8;

/// Delivers a follow-up wherever its child is: enqueued, woken or cold-resumed here, or asked
/// on the node it was placed on (or found on by its lease); a child that left the node it was
/// asked on (it settled there, or the node stopped) is routed again.
pub(crate) async fn route_followup(
    manager: &Addr<ContinuationManager>,
    cluster: Option<&ClusterLink>,
    parent: &AgentRef,
    child: SessionId,
    delivery: &Delivery,
    token: &CancellationToken,
) -> Result<MessageId> {
    let mut moved = 0;
    // Asks a node took and did not answer within the delivery deadline.
    let mut unanswered = 0;
    // Time spent waiting for a lease to pass on.
    let mut waited = std::time::Duration::ZERO;
    let mut delivery = delivery.clone();
    loop {
        let routed = manager
            .send(Followup {
                parent: parent.clone(),
                child,
                delivery: delivery.clone(),
                token: token.clone(),
            })
            .await
            .map_err(SubagentError::from)?;
        // Whether the child was found on another node by its lease (not placed from here).
        let mut found = false;
        let (cluster, node, incarnation) = match routed {
            Ok(Routed::Accepted(id)) => return Ok(id),
            Ok(Routed::Retry) => continue,
            Ok(Routed::Remote(node)) => {
                let cluster = cluster.ok_or_else(|| {
                    SubagentError::bug("a child was placed on another node of no cluster")
                })?;
                (cluster, node, None)
            }
            Err(error) if error.code() == ErrorCode::SessionLeased => {
                tracing::debug!(%child, %error, "the child is leased elsewhere; looking for its node");
                let Some(cluster) = cluster else {
                    return Err(error);
                };
                match cluster.other_holder(child).await? {
                    Some(holder) if moved < MAX_MOVES => {
                        found = true;
                        (cluster, holder.node, holder.incarnation)
                    }
                    Some(_) => return Err(error),
                    None => {
                        // Leased when this node asked, by no other node when it looked: the
                        // lease is changing hands (released, or its holder restarted). Asked
                        // again shortly, for as long as a stopped node's lease may take.
                        wait_out_lease(cluster, &mut waited, LEASE_IN_FLUX, error).await?;
                        continue;
                    }
                }
            }
            Err(error) => return Err(error),
        };
        if found {
            // Recorded as the parent's, as if placed there, before it is asked: it waits for
            // the child's notice (which may come before the answer), and its release releases
            // it.
            let placed = RemotePlaced {
                child,
                parent: parent.clone(),
                node,
                incarnation,
                starting: None,
            };
            manager.send(placed).await.map_err(SubagentError::from)??;
        }
        let asked = ask_followup(cluster, node, parent.id(), child, &delivery).await;
        // An ask that was not answered `Accepted` may still have been accepted there (the node
        // stopped after accepting it): wherever it goes next, it is accepted at most once.
        delivery.may_repeat |= !matches!(asked, Ok((FollowupAnswer::Accepted(_), _)));
        // Not answered within the deadline, it may have been accepted there all the same: it
        // is asked again under its id, served there after the first ask (a node serves one
        // session's deliveries in order) and answered with that acceptance, if any. A caller
        // hears "it may have been accepted" only once the node stayed silent every time.
        if let Err(error) = &asked {
            if error.code() == ErrorCode::NodeUnresponsive && unanswered < UNANSWERED_ASKS {
                unanswered += 1;
                tracing::debug!(%child, %node, %error, "a follow-up was not answered in time; asking again under its id");
                continue;
            }
        }
        // Settled there, or its node stopped: resumed from the store (here, once the stopped
        // node's lease expired).
        let left = match &asked {
            Ok((FollowupAnswer::Absent, by)) => Some(Forgotten::Absent(*by)),
            Err(error) if error.code() == ErrorCode::SessionLeased => Some(Forgotten::NodeStopped),
            Err(_) if found => Some(Forgotten::Done),
            Err(_) | Ok((FollowupAnswer::Accepted(_), _)) => None,
        };
        // A child that left, or one found there that refused, leaves no record behind.
        if let Some(why) = left {
            manager
                .send(ForgetRemote {
                    child,
                    node,
                    why,
                    discarded: false,
                })
                .await
                .map_err(SubagentError::from)?;
        }
        let left = matches!(left, Some(Forgotten::Absent(_) | Forgotten::NodeStopped));
        match asked.map(|(answer, _)| answer) {
            Ok(FollowupAnswer::Accepted(id)) => return Ok(id),
            Err(error) if !left => return Err(error),
            Ok(FollowupAnswer::Absent) => {
                tracing::debug!(%child, %node, "the child left the node it was asked on; routing again");
                moved += 1;
            }
            Err(error) => {
                // Its node stopped: the child passes on once that node's lease is gone, within
                // a node time-to-live.
                tracing::debug!(%child, %node, "the child's node stopped; waiting for its lease");
                wait_out_lease(
                    cluster,
                    &mut waited,
                    crate::store::deliveries::RECHECK,
                    error,
                )
                .await?;
            }
        }
    }
}

/// How long a follow-up waits before asking again for a child whose lease is changing hands.
const LEASE_IN_FLUX: std::time::Duration = std::time::Duration::from_millis(50);

/// Waits `every` before a follow-up asks again for a child whose lease is not free yet;
/// `error` once the waits (counted in `waited`, in time) passed two node time-to-lives, the
/// longest a stopped node's lease may take to pass on.
async fn wait_out_lease(
    cluster: &ClusterLink,
    waited: &mut std::time::Duration,
    every: std::time::Duration,
    error: SubagentError,
) -> Result<()> {
    if *waited >= 2 * cluster.membership().node_ttl() {
        return Err(error);
    }
    *waited += every;
    tokio::time::sleep(every).await;
    Ok(())
}

/// Asks `node` to accept a follow-up from `parent` for `child`; answers also which incarnation
/// of `node` served it.
async fn ask_followup(
    cluster: &ClusterLink,
    node: NodeId,
    parent: SessionId,
    child: SessionId,
    delivery: &Delivery,
) -> Result<(FollowupAnswer, Option<uuid::Uuid>)> {
    let op = RemoteOp::Followup {
        parent,
        child,
        message: delivery.message.clone(),
        raise: delivery.raise,
        may_repeat: delivery.may_repeat,
        traceparent: crate::trace::traceparent_of(&delivery.trace),
    };
    cluster.ask_served(node, child, &op).await
}

/// Asks `node` to interrupt `child` for `parent`.
pub(crate) async fn ask_interrupt(
    cluster: &ClusterLink,
    node: NodeId,
    parent: SessionId,
    child: SessionId,
    cause: CancelCause,
) -> Result<()> {
    let op = RemoteOp::Interrupt {
        parent,
        child,
        cause,
        traceparent: crate::trace::traceparent_of(&tracing::Span::current()),
    };
    unless_gone(cluster.ask::<()>(node, child, &op).await)
}

impl ContinuationManager {
    /// The node a start asks for, when it is another node than this one.
    pub(super) fn placement(&self, node: Option<NodeId>) -> Result<Option<(ClusterLink, NodeId)>> {
        let Some(node) = node else {
            return Ok(None);
        };
        match &self.cluster {
            Some(cluster) if cluster.node() == node => Ok(None),
            Some(cluster) => Ok(Some((cluster.clone(), node))),
            None => Err(SubagentError::new(
                ErrorCode::InvalidArgs,
                format!("a child cannot be placed on node {node}: this runtime is in no cluster"),
            )),
        }
    }

    /// Releases a child a parent here placed on another node (memoized); `None` when there is
    /// no such child.
    pub(super) fn release_remote(
        &mut self,
        child: SessionId,
        traceparent: Option<&str>,
        ctx: &Context<Self>,
    ) -> Option<Disposal> {
        let cluster = self.cluster.clone()?;
        let manager = ctx.address();
        let agents = self.agents.clone();
        let record = self.remote_children.get_mut(&child)?;
        if let Some(release) = &record.release {
            return Some(release.clone());
        }
        let (node, parent, starting) = (record.node, record.parent.id(), record.starting.clone());
        let traceparent = traceparent.map(str::to_owned);
        let release: Disposal = async move {
            if let Some(starting) = starting {
                starting.await;
            }
            let op = RemoteOp::Release {
                parent,
                child,
                traceparent,
            };
            // Not released there (its node stopped, or the node does not hold it: it settled
            // there, was handed over as it left, or was restarted since): what the child
            // accepted and did not run may wait in its log, and the release discards it from
            // here, as it would have there. An epoch that ended with its node is `node-stopped`
            // to its parent.
            let discard = || discard_parked((cluster.clone(), agents), child);
            let (outcome, why) = match cluster.ask_served::<bool>(node, child, &op).await {
                Ok((true, _)) => (Ok(()), Forgotten::Done),
                Ok((false, by)) => (discard().await, Forgotten::Absent(by)),
                Err(error) if error.code() == ErrorCode::SessionLeased => {
                    (discard().await, Forgotten::NodeStopped)
                }
                Err(error) => (Err(error), Forgotten::Done),
            };
            // Discarded from here unless its node released it (or the ask failed).
            let discarded = why != Forgotten::Done;
            // Released (or gone): the parent no longer waits for it, notice or not. A release
            // that failed keeps the record (the child may still run there) and may be asked
            // again.
            if outcome.is_ok() {
                manager.do_send(ForgetRemote {
                    child,
                    node,
                    why,
                    discarded,
                });
            } else {
                manager.do_send(RecordAnswered {
                    child,
                    answered: Answered::FailedRelease,
                });
            }
            outcome
        }
        .boxed()
        .shared();
        record.release = Some(release.clone());
        Some(release)
    }

    /// The releases of every child placed elsewhere by a parent here at or below one of
    /// `roots` (by any parent, with no roots).
    pub(super) fn release_remote_below(
        &mut self,
        roots: Option<&[SessionId]>,
        traceparent: Option<&str>,
        ctx: &Context<Self>,
    ) -> Vec<Disposal> {
        let mut children: Vec<SessionId> = self
            .remote_children
            .iter()
            .filter(|(_, record)| {
                roots.is_none_or(|roots| {
                    self.lineage_of(&record.parent)
                        .iter()
                        .any(|id| roots.contains(id))
                })
            })
            .map(|(child, _)| *child)
            .collect();
        children.sort_unstable();
        children
            .into_iter()
            .filter_map(|child| self.release_remote(child, traceparent, ctx))
            .collect()
    }

    /// Sends `child`'s settled notice to its parent's node (tracked, so a leaving node sends
    /// its last notices before it goes). A parent no node holds (its node died, or it was
    /// disposed) gets the notice in its session's stored inbox, as a local parent would: it
    /// hears it once when it is resumed.
    ///
    /// The returned future resolves once the parent's node took the notice (or it was given
    /// up): the epoch's disposal awaits it, so a release the parent's node asked for is
    /// answered only after its notice reached that node, not after the parent is gone.
    pub(super) fn notify_remote(
        &self,
        remote: &RemoteParent,
        child: SessionId,
        message: Message,
        (kind, traceparent): (NoticeKind, Option<String>),
    ) -> BoxFuture<'static, ()> {
        let Some(cluster) = self.cluster.clone() else {
            return futures::future::ready(()).boxed();
        };
        let (parent, node) = (remote.id, remote.node);
        let agents = self.agents.clone();
        let (told, delivered) = tokio::sync::oneshot::channel::<()>();
        cluster.clone().track(async move {
            let mut lookups = 0;
            let told_parent = loop {
                lookups += 1;
                let told = tell_parent(
                    &cluster,
                    (parent, node),
                    child,
                    message.clone(),
                    kind,
                    traceparent.clone(),
                );
                match told.await {
                    // No node has the parent live: its stored inbox keeps the notice.
                    Err(error)
                        if matches!(
                            error.code(),
                            ErrorCode::SessionLeased | ErrorCode::ParentUnavailable
                        ) =>
                    {
                        // The parent's node may have taken it before it stopped answering.
                        match agents.enqueue_stored(parent, message.clone(), Some(0)).await {
                            // It came live meanwhile (its node resumed it): tell it there.
                            Err(error)
                                if matches!(
                                    error.code(),
                                    ErrorCode::SessionLeased | ErrorCode::DuplicateAgent
                                ) && lookups < PARENT_LOOKUPS => {}
                            stored => break stored.map(drop),
                        }
                    }
                    told => break told.map(drop),
                }
            };
            if let Err(error) = told_parent {
                tracing::warn!(%child, %parent, %node, %error, "a settled notice reached neither its parent's node nor its parent's stored inbox; the child's session is the record");
            }
            let _ = told.send(());
        });
        async move {
            let _ = delivered.await;
        }
        .boxed()
    }

    /// Sends `child`'s report to its parent's node; resolves with the parent's acceptance.
    pub(super) fn report_remote(
        &self,
        remote: &RemoteParent,
        child: SessionId,
        message: Message,
        (kind, traceparent): (NoticeKind, Option<String>),
    ) -> BoxFuture<'static, Result<MessageId>> {
        let cluster = self.cluster.clone();
        let (parent, node) = (remote.id, remote.node);
        async move {
            let cluster = cluster.ok_or_else(|| SubagentError::bug("a remote parent without a cluster"))?;
            tell_parent(&cluster, (parent, node), child, message, kind, traceparent)
                .await
                .map_err(|error| match error.code() {
                    ErrorCode::SessionLeased => SubagentError::new(
                        ErrorCode::ParentUnavailable,
                        format!("the parent of continuable child {child} is not live on any node: {error}"),
                    ),
                    _ => error,
                })
        }
        .boxed()
    }
}

/// How many times a settled notice looks for its parent (a live agent of it on some node, or
/// its stored inbox) while the parent comes live and goes away under it.
const PARENT_LOOKUPS: u32 = 4;

/// How many times a notice or report is tried before it is given up.
const NOTICE_ATTEMPTS: u32 = 5;

/// Delivers `child`'s notice or report to `parent`, on the node it was last known on, or,
/// once that node stopped, on the node holding the parent now; a passing fault is retried.
async fn tell_parent(
    cluster: &ClusterLink,
    (parent, mut node): (SessionId, NodeId),
    child: SessionId,
    message: Message,
    kind: NoticeKind,
    traceparent: Option<String>,
) -> Result<MessageId> {
    let op = RemoteOp::Notify {
        parent,
        child,
        message,
        kind,
        traceparent,
    };
    let mut attempt = 1;
    loop {
        let error = match cluster.ask::<MessageId>(node, child, &op).await {
            Ok(id) => return Ok(id),
            Err(error) => error,
        };
        if attempt >= NOTICE_ATTEMPTS {
            return Err(error);
        }
        attempt += 1;
        match error.code() {
            // The parent's node stopped (or no longer has it): ask where it is now.
            ErrorCode::SessionLeased | ErrorCode::ParentUnavailable => {
                match cluster.membership().holder_of(parent).await? {
                    Some(holder) if holder.node != node => node = holder.node,
                    _ => return Err(error),
                }
            }
            ErrorCode::StoreIo => tokio::time::sleep(crate::store::deliveries::RECHECK).await,
            // Taken and not answered in time: it may have been accepted. Asked again under the
            // message's id, the parent's node answers with that acceptance.
            ErrorCode::NodeUnresponsive => {}
            _ => return Err(error),
        }
    }
}

/// Records a child a parent here places (or finds) on another node, before it is asked
/// there; refused with `DRAINING` (or `ACTIVATION_CLOSING`) when the parent's lineage is
/// closing, and then nothing is recorded.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub(crate) struct RemotePlaced {
    pub(crate) child: SessionId,
    pub(crate) parent: AgentRef,
    pub(crate) node: NodeId,
    /// The incarnation of `node` known to hold it, if known yet (a start learns it from the
    /// answer).
    pub(crate) incarnation: Option<uuid::Uuid>,
    /// Resolves once the child's start was answered (a placement; `None` for a child found on
    /// its node by a follow-up).
    pub(crate) starting: Option<Signal>,
}

impl Handler<RemotePlaced> for ContinuationManager {
    type Result = Result<()>;

    fn handle(&mut self, msg: RemotePlaced, ctx: &mut Context<Self>) -> Result<()> {
        let RemotePlaced {
            child,
            parent,
            node,
            incarnation,
            starting,
        } = msg;
        let lineage = self.lineage_of(&parent);
        self.assert_admitting(&lineage)?;
        match self.residents.get_mut(&parent.id()) {
            Some(resident) if resident.agent == parent && resident.disposal.is_none() => {
                resident.own(child);
            }
            Some(resident) if resident.agent == parent => {
                return Err(SubagentError::new(
                    ErrorCode::ActivationClosing,
                    format!("parent Activation {} is already settling", parent.id()),
                ));
            }
            _ => {}
        }
        // Placed (or found) again: what it runs there now is a new epoch.
        self.ended_with_node.remove(&child);
        self.parked.remove(&child);
        self.remote_children.insert(
            child,
            RemoteChild {
                parent,
                node,
                incarnation,
                starting,
                release: None,
            },
        );
        self.watch_gone_nodes(ctx);
        Ok(())
    }
}

/// Forgets a child placed on `node` (it settled there, was released, or its node died); its
/// parent no longer waits for it.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct ForgetRemote {
    pub(crate) child: SessionId,
    pub(crate) node: NodeId,
    pub(crate) why: Forgotten,
    /// Whether its release discarded, from here, what it waited with: a notice that it was
    /// handed over, heard meanwhile, leaves nothing parked.
    pub(crate) discarded: bool,
}

/// Why a placed child's record ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forgotten {
    /// Its start failed, it was released, or a node it was found on refused: no epoch of it
    /// is owed a notice from here.
    Done,
    /// Its node stopped: the epoch it ran there ended with the node.
    NodeStopped,
    /// Its node answered that it is not resident there, served by this incarnation: one that
    /// is not the incarnation holding it was restarted under the node's id, and the epoch
    /// ended with its predecessor (the same incarnation settled it, and sends its notice).
    Absent(Option<uuid::Uuid>),
}

impl Handler<ForgetRemote> for ContinuationManager {
    type Result = ();

    fn handle(&mut self, msg: ForgetRemote, ctx: &mut Context<Self>) {
        let ended_with_node = match (msg.why, self.remote_children.get(&msg.child)) {
            (_, None) | (Forgotten::Done, _) => false,
            (_, Some(record)) if record.node != msg.node || record.starting.is_some() => false,
            (Forgotten::NodeStopped, Some(_)) => true,
            (Forgotten::Absent(by), Some(record)) => record.held_by_predecessor_of(by),
        };
        if msg.discarded {
            self.parked.remove(&msg.child);
        }
        if ended_with_node {
            if let Some(record) = self.remote_children.get(&msg.child) {
                let parent = record.parent.clone();
                self.announce_node_stopped(msg.child, msg.node, &parent, ctx);
            }
        }
        self.forget_remote(msg.child, msg.node, ctx);
    }
}

impl ContinuationManager {
    /// Ends the record of a child placed elsewhere (on `node`, when given) and lets its parent
    /// settle if it waited only for it.
    pub(super) fn forget_remote(
        &mut self,
        child: SessionId,
        node: NodeId,
        ctx: &mut Context<Self>,
    ) {
        let record = match self.remote_children.entry(child) {
            std::collections::hash_map::Entry::Occupied(entry) if entry.get().node == node => {
                entry.remove()
            }
            _ => return,
        };
        if self.remote_children.is_empty() {
            if let Some(sweep) = self.sweep.take() {
                ctx.cancel_future(sweep);
            }
        }
        let parent = record.parent.id();
        if let Some(resident) = self.residents.get_mut(&parent) {
            if resident.agent == record.parent {
                resident.disown(&child);
                self.evaluate(parent, ctx);
            }
        }
    }
}
