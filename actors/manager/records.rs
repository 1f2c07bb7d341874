//! What the continuation manager keeps about each child, parent and creation in flight.

use actix::prelude::*;

use crate::actors::activation::{Activation, Disposal};
use crate::actors::agent::AgentRef;
use crate::actors::owner::OwnerNode;
use crate::cluster::NodeId;
use crate::host::BudgetMeter;
use crate::ids::{FastHashSet, MessageId, RunId, SessionId};
use crate::seam::SubagentRunInfo;
use crate::store::NodeIncarnation;

use super::Signal;

/// An admitted creation or cold resume that has not been installed or rolled back yet.
pub(super) struct Materialization {
    /// The lineage below which it runs (its parent, then the parent's ancestors).
    pub(super) lineage: Vec<SessionId>,
    pub(super) over: Signal,
}

/// A host-owned parent's ownership node, while the parent has resident children or a release
/// in flight.
pub(super) struct OwnerRecord {
    pub(super) node: Addr<OwnerNode>,
    /// Its resident continuable children.
    pub(super) residents: usize,
    /// Releases handed to the node and not yet reported back.
    pub(super) releasing: usize,
}

/// A scoped drain's cutoff: admission is closed below `root` until it leaves the registry.
pub(super) struct ClosingScope {
    pub(super) root: AgentRef,
    /// The drained Activations and their lineages.
    pub(super) members: FastHashSet<SessionId>,
}

/// A resident child's durable direct parent: an agent of this runtime, or one resident on
/// another node of the cluster (whose authority each delivery from it proves by holding the
/// parent's lease).
#[derive(Clone)]
pub(crate) enum ParentLink {
    Local(AgentRef),
    /// Boxed: the record stays in its allocation class, and remote parents are the exception.
    Remote(Box<RemoteParent>),
}

/// A parent resident on another node.
#[derive(Clone)]
pub(crate) struct RemoteParent {
    pub(super) id: SessionId,
    /// The node it was resident on when it last reached this one.
    pub(super) node: NodeId,
}

impl ParentLink {
    pub(super) fn remote(id: SessionId, node: NodeId) -> Self {
        Self::Remote(Box::new(RemoteParent { id, node }))
    }

    pub(super) fn id(&self) -> SessionId {
        match self {
            Self::Local(agent) => agent.id(),
            Self::Remote(remote) => remote.id,
        }
    }

    /// A local parent while its exact agent lives; a remote one always (its node's authority
    /// is checked by lease on each delivery, and a notice to a dead node is dropped).
    pub(super) fn is_alive(&self) -> bool {
        match self {
            Self::Local(agent) => agent.is_alive(),
            Self::Remote(_) => true,
        }
    }

    /// Whether this is `id`, resident on another node.
    pub(super) fn is_remote(&self, id: SessionId) -> bool {
        matches!(self, Self::Remote(remote) if remote.id == id)
    }

    /// Whether `other` names this parent in the same place (an id alone does not: a remote
    /// sender never speaks for a local parent).
    pub(super) fn same_as(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Local(agent), Self::Local(other)) => agent.id() == other.id(),
            (Self::Remote(remote), Self::Remote(other)) => remote.id == other.id,
            _ => false,
        }
    }
}

/// A child this runtime's parent placed on another node: the parent's node keeps the record,
/// so that follow-ups route to it, the parent waits while it is resident, and the parent's
/// release releases it first.
pub(super) struct RemoteChild {
    pub(super) parent: AgentRef,
    pub(super) node: NodeId,
    /// The incarnation of `node` that holds it, once known: a node restarted under its id
    /// holds it no more.
    pub(super) incarnation: Option<uuid::Uuid>,
    /// Resolves once its start was answered: a release must not overtake the start.
    pub(super) starting: Option<Signal>,
    /// Its release, once asked for (memoized: a drain and a disposal may both ask).
    pub(super) release: Option<Disposal>,
}

impl RemoteChild {
    /// The node incarnation known to hold it.
    pub(super) fn holder(&self) -> NodeIncarnation {
        NodeIncarnation {
            node: self.node,
            incarnation: self.incarnation,
        }
    }

    /// Whether `incarnation` of its node is another than the one known to hold it: the node
    /// was restarted under its id, and the epoch ended with its predecessor.
    pub(super) fn held_by_predecessor_of(&self, incarnation: Option<uuid::Uuid>) -> bool {
        let other = NodeIncarnation {
            node: self.node,
            incarnation,
        };
        !self.holder().may_be(&other)
    }
}

/// The manager's record of one resident Activation.
pub(super) struct Resident {
    pub(super) agent: AgentRef,
    pub(super) activation: Addr<Activation>,
    /// The exact parent the Activation was materialized under; its id is the child's durable
    /// direct parent (`header.parentSession`), and notices go to it when it is not resident.
    pub(super) parent: ParentLink,
    /// The child, its parent and the parent's ancestors, observed at materialization; it
    /// survives intermediates leaving the registry.
    pub(super) ancestry: Vec<SessionId>,
    /// Whether the parent is itself a resident Activation, which then owns this one.
    pub(super) owned_by_parent: bool,
    /// The resident children this Activation owns (boxed: most children own none, and a
    /// million resident children would each carry an empty set): a thin optional pointer.
    pub(super) owned: Option<Box<FastHashSet<SessionId>>>,
    /// Waking sends the agent has not yet claimed or discarded (boxed, and absent when there
    /// are none: a resident child waits with none, and the record keeps to a smaller
    /// allocation class).
    pub(super) accepted: Option<Box<FastHashSet<MessageId>>>,
    /// Whether the agent is running, as its activity last said.
    pub(super) busy: bool,
    /// Whether a message was ever submitted (before that, an idle agent is not settled).
    pub(super) armed: bool,
    /// Whether a caller ever received an id for this epoch (a rolled-back start never did).
    pub(super) announced: bool,
    /// Whether its disposal hands it over (this node leaves the cluster) rather than releasing
    /// it: what it accepted and did not run stays in its log.
    pub(super) handed_over: bool,
    pub(super) disposal: Option<Disposal>,
    /// This epoch's run id (its `subagent/start` and `subagent/end` carry it).
    pub(super) run_id: RunId,
    /// The provider that started it (a `Box<str>`: the record stays within a smaller
    /// allocation class, and there may be a million).
    pub(super) provider: Box<str>,
    /// The child's budget and spending, shared with its agent's turn driver.
    pub(super) budget: BudgetMeter,
    /// The span this epoch's opening message was sent from, while a subscriber records spans:
    /// the settled notice continues that trace in the parent. Boxed: most records have none.
    pub(super) epoch_trace: Option<Box<opentelemetry::trace::SpanContext>>,
}

impl Resident {
    /// Its owner's id, when its parent is a resident Activation.
    pub(super) fn owner(&self) -> Option<SessionId> {
        self.owned_by_parent.then(|| self.parent.id())
    }

    /// Whether it owns no resident child.
    pub(super) fn owns_none(&self) -> bool {
        self.owned.as_ref().is_none_or(|owned| owned.is_empty())
    }

    /// Records a resident child it owns.
    pub(super) fn own(&mut self, child: SessionId) {
        self.owned.get_or_insert_default().insert(child);
    }

    /// Forgets a resident child it owned; the set goes once empty.
    pub(super) fn disown(&mut self, child: &SessionId) {
        if let Some(owned) = &mut self.owned {
            owned.remove(child);
            if owned.is_empty() {
                self.owned = None;
            }
        }
    }

    /// This epoch's run.
    pub(super) fn run(&self, id: SessionId) -> SubagentRunInfo {
        SubagentRunInfo {
            run_id: self.run_id,
            provider: self.provider.to_string(),
            id,
            local: true,
            parent: self.parent.id(),
        }
    }

    /// Counts a waking send until the agent claims or discards it.
    pub(super) fn accept(&mut self, id: MessageId) {
        self.accepted.get_or_insert_default().insert(id);
    }

    /// Whether a waking send is still unclaimed.
    pub(super) fn has_accepted(&self) -> bool {
        self.accepted
            .as_ref()
            .is_some_and(|accepted| !accepted.is_empty())
    }

    /// Forgets an accepted send. The set goes once empty: a resident child holds none between
    /// sends, and there may be a million of them.
    pub(super) fn forget_accepted(&mut self, id: &MessageId) {
        if let Some(accepted) = &mut self.accepted {
            accepted.remove(id);
            if accepted.is_empty() {
                self.accepted = None;
            }
        }
    }
}
