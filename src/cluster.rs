//! Provides what one runtime of a cluster asks another about continuable children: the
//! operations that cross nodes as deliveries, and the link that sends them and finds which
//! node holds a session. The public part is [`NodeId`]; a runtime joins a cluster through
//! [`crate::RuntimeBuilder::cluster`].
//!
//! # Placement
//! A continuable child is resident on at most one node: the one holding its session lease. A
//! parent places a child on another node with [`crate::ContinuableStartSpec::on_node`]; the
//! parent's node prepares the start (admission, depth, options, descriptor, the delegated
//! policy) and the target node creates the child under a *remote parent*. From then on:
//! - the parent's follow-ups and interrupts travel to the child's node as deliveries, and the
//!   child's node checks the sender's authority by who holds the parent's lease;
//! - the child's reports and its settled notice travel back to the parent's node;
//! - a parent whose child lives elsewhere is waiting while it does, and its release (a drain,
//!   a disposal) releases the child on its node first;
//! - a child whose node died is cold-resumed by its parent's node once the dead node's leases
//!   expired, on the next follow-up.
//!
//! A node serves the deliveries about one session one at a time (a child's start, follow-ups,
//! interrupt and release arrive in the order they were sent), and different sessions' at once.
//! A handler awaits only local work (an inbox acceptance, a flush, a teardown), except that a
//! child's release waits for the release of the children it placed on other nodes in turn:
//! each level of a forest spread across nodes holds one delivery slot while the level below
//! releases.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::content::{ContentBlock, Message};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::{AgentOptions, Budget, DelegatedPolicy};
use crate::ids::{MessageId, SessionId};
use crate::metrics::Metrics;
use crate::seam::ReportDelivery;
use crate::session::CancelCause;
use crate::store::{NodeIncarnation, NodeMembership};

/// A node's id: the id of the lease holder that joined the cluster.
pub type NodeId = uuid::Uuid;

/// What one node asks another about a continuable child.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub(crate) enum RemoteOp {
    /// Create a child under a parent resident on the sender, and accept its prompt.
    Start(Box<RemoteStart>),
    /// Accept a parent's follow-up into its child's inbox.
    Followup {
        parent: SessionId,
        child: SessionId,
        message: Message,
        raise: Option<Budget>,
        /// Whether the child may have accepted the message already (a retry).
        #[serde(default)]
        may_repeat: bool,
        /// The sender's W3C trace context: the epoch it opens continues that trace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        traceparent: Option<String>,
    },
    /// Interrupt a child's turn under its parent's authority (inbox kept).
    Interrupt {
        parent: SessionId,
        child: SessionId,
        cause: CancelCause,
        /// The W3C trace context of the span the interrupt was asked from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        traceparent: Option<String>,
    },
    /// A child's settled notice or report, for its parent resident on the target.
    Notify {
        parent: SessionId,
        child: SessionId,
        message: Message,
        kind: NoticeKind,
        /// The W3C trace context of the epoch or report call: the parent's turn it wakes
        /// continues that trace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        traceparent: Option<String>,
    },
    /// Release a child placed by a parent on the sender (its parent is being released).
    Release {
        parent: SessionId,
        child: SessionId,
        /// The W3C trace context of the drain or the parent's epoch that releases it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        traceparent: Option<String>,
    },
}

impl RemoteOp {
    /// The operation's name, as metrics record it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Start(_) => "start",
            Self::Followup { .. } => "follow-up",
            Self::Interrupt { .. } => "interrupt",
            Self::Notify { .. } => "notify",
            Self::Release { .. } => "release",
        }
    }
}

/// Which message a child sends its remote parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum NoticeKind {
    /// The epoch's settled notice: the child is no longer resident.
    Settled,
    /// The settled notice of an epoch its node ended by leaving the cluster: the child was
    /// handed over, and what it accepted and did not run waits in its log for the next resume.
    HandedOver,
    /// A report, delivered as asked.
    Report(ReportDelivery),
}

impl NoticeKind {
    /// Whether this is an epoch's settled notice (not a report).
    pub(crate) fn is_settled(self) -> bool {
        matches!(self, Self::Settled | Self::HandedOver)
    }
}

/// Everything a node needs to create a child its parent's node prepared.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RemoteStart {
    pub(crate) child: SessionId,
    pub(crate) parent: SessionId,
    /// The parent, then its ancestors.
    pub(crate) lineage: Vec<SessionId>,
    pub(crate) depth: u64,
    pub(crate) options: AgentOptions,
    /// The descriptor's payload, as recorded.
    pub(crate) descriptor: Value,
    pub(crate) policy: DelegatedPolicy,
    pub(crate) cwd: Option<String>,
    pub(crate) provider: String,
    pub(crate) prompt: Vec<ContentBlock>,
    /// A fork's seed: the parent's stored prefix, which the child's node reads from the
    /// shared store (the seed itself never travels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) seed: Option<crate::session::SeedReference>,
    /// The starting caller's W3C trace context: the child's first epoch continues that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) traceparent: Option<String>,
}

/// How a node answered a follow-up.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum FollowupAnswer {
    /// Accepted into the child's inbox with this id.
    Accepted(MessageId),
    /// The child is not resident there (it settled, or never was): resume it elsewhere.
    Absent,
}

/// A runtime's link to its cluster: its membership, shared with the delivery server, and the
/// notices it is still sending to other nodes.
#[derive(Debug, Clone)]
pub(crate) struct ClusterLink {
    membership: Arc<NodeMembership>,
    notices: tokio_util::task::TaskTracker,
    metrics: Option<Arc<Metrics>>,
}

/// Held by every handle of a cluster node's runtime. The delivery server and the manager keep
/// the membership itself alive, so when the last handle is dropped without
/// [`crate::Runtime::shutdown`] this guard makes the node go silent: it stops heartbeating and
/// serving, and its peers see it expire as a dead node and may take its sessions.
pub(crate) struct NodeGuard(Arc<NodeMembership>);

impl NodeGuard {
    pub(crate) fn new(link: &ClusterLink) -> Self {
        Self(Arc::clone(&link.membership))
    }
}

impl Drop for NodeGuard {
    fn drop(&mut self) {
        self.0.go_silent();
    }
}

/// The longest a leaving node waits for its last notices to reach their parents.
const LAST_NOTICES: std::time::Duration = std::time::Duration::from_secs(10);

impl ClusterLink {
    pub(crate) fn new(membership: Arc<NodeMembership>, metrics: Option<Arc<Metrics>>) -> Self {
        Self {
            membership,
            notices: tokio_util::task::TaskTracker::new(),
            metrics,
        }
    }

    /// Sends a notice as a task of its own, which a leaving node waits for.
    pub(crate) fn track(&self, notice: impl std::future::Future<Output = ()> + Send + 'static) {
        self.notices.spawn(notice);
    }

    /// Waits (bounded) for the notices still on their way, then leaves the cluster.
    pub(crate) async fn leave(&self) -> Result<()> {
        self.notices.close();
        if tokio::time::timeout(LAST_NOTICES, self.notices.wait())
            .await
            .is_err()
        {
            tracing::warn!(node = %self.node(), "leaving with notices still on their way");
        }
        self.membership.leave().await
    }

    /// The live incarnation of each of `nodes` that is a live member now (a node missing from
    /// the answer stopped).
    pub(crate) async fn live_incarnations(
        &self,
        nodes: &[NodeId],
    ) -> Result<HashMap<NodeId, Option<uuid::Uuid>>> {
        let live = self.membership.live_among(nodes).await?;
        Ok(live
            .into_iter()
            .map(|live| (live.node, live.incarnation))
            .collect())
    }

    /// Refuses a placement on `node` unless it is a live member now (`SESSION_LEASED`, saying
    /// whether no member has that id or the node stopped), before anything is sent to it.
    ///
    /// # Errors
    /// As above, and `STORE_IO`.
    pub(crate) async fn require_live(&self, node: NodeId) -> Result<()> {
        let why = match self.membership.is_live(node).await? {
            Some(true) => return Ok(()),
            Some(false) => "it stopped (its membership expired)",
            None => "it is not a member of this cluster (no node joined under that id, or it left)",
        };
        Err(SubagentError::new(
            ErrorCode::SessionLeased,
            format!("a child cannot be placed on node {node}: {why}"),
        ))
    }

    /// This node's id.
    pub(crate) fn node(&self) -> NodeId {
        self.membership.node()
    }

    pub(crate) fn membership(&self) -> &Arc<NodeMembership> {
        &self.membership
    }

    /// The live node (and its incarnation) holding `session`'s lease, when it is another node
    /// than this one.
    pub(crate) async fn other_holder(&self, session: SessionId) -> Result<Option<NodeIncarnation>> {
        // Boxed, here and below: the store's futures are kilobytes, and every follow-up's task
        // would otherwise carry them even when its child is local.
        let holder = Box::pin(self.membership.holder_of(session)).await?;
        Ok(holder.filter(|holder| holder.node != self.node()))
    }

    /// Sends `op` about `session` to `node` and decodes its answer.
    pub(crate) async fn ask<T: serde::de::DeserializeOwned>(
        &self,
        node: NodeId,
        session: SessionId,
        op: &RemoteOp,
    ) -> Result<T> {
        Ok(self.ask_served(node, session, op).await?.0)
    }

    /// [`ClusterLink::ask`], answering also which incarnation of `node` served it.
    pub(crate) async fn ask_served<T: serde::de::DeserializeOwned>(
        &self,
        node: NodeId,
        session: SessionId,
        op: &RemoteOp,
    ) -> Result<(T, Option<uuid::Uuid>)> {
        let payload = serde_json::to_value(op).map_err(|error| {
            SubagentError::bug(format!("a cluster operation did not encode: {error}"))
        })?;
        let in_flight = self
            .metrics
            .as_deref()
            .map(|metrics| metrics.delivery(op.name()));
        let served = Box::pin(self.membership.deliver_served(node, session, &payload)).await;
        if let Some(in_flight) = in_flight {
            in_flight.answered(&served);
        }
        let served = served?;
        let answer = serde_json::from_value(served.value).map_err(|error| {
            SubagentError::new(
                ErrorCode::StoreCorrupt,
                format!("node {node} answered a cluster operation unreadably: {error}"),
            )
        })?;
        Ok((answer, served.by))
    }
}

/// Decodes a delivery's payload.
pub(crate) fn decode_op(payload: Value) -> Result<RemoteOp> {
    serde_json::from_value(payload).map_err(|error| {
        SubagentError::new(
            ErrorCode::InvalidArgs,
            format!("a delivery is not a cluster operation this node knows: {error}"),
        )
    })
}

/// Encodes a handler's answer.
pub(crate) fn encode_answer<T: Serialize>(answer: &T) -> Result<Value> {
    serde_json::to_value(answer)
        .map_err(|error| SubagentError::bug(format!("an answer did not encode: {error}")))
}
