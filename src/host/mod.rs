//! Provides the parts of an agent that are not actors: its options, inbox, scope, events, the
//! creation requests, the owning handle, the actor's state machine and the turn driver. The
//! actors themselves live in `actors/agent.rs` (one agent) and `actors/registry.rs`.

pub mod budget;
pub(crate) mod driver;
pub mod handle;
pub(crate) mod inbox;
pub mod request;
pub mod scope;
pub(crate) mod state;
pub(crate) mod stored_inbox;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::SubagentError;
use crate::events::{EventBus, ScopedEvent};
use crate::ids::{MessageId, SessionId};
use crate::model::ModelRouter;
use crate::projection::ProjectionRegistry;
use crate::session::{InboxTarget, TurnEndReason};
use crate::store::SharedStore;
use crate::tools::ToolRegistry;

pub use budget::{Budget, BudgetLimit, BudgetSpent};
pub(crate) use budget::{BudgetMeter, BudgetRaise};
pub use handle::AgentHandle;
pub(crate) use inbox::Inbox;
pub use request::{CreateAgent, ResumeAgent};
pub use scope::{
    assemble_system_prompt, interpolate_prompt, AgentScope, AgentSetup, Disposer, PreStep,
    PreStepDecision, PreStepHook, PromptSection, SetupCommit, StepEnteredHook, ToolResultObserver,
    ToolResultSeen, TurnStoppingHook, RUNTIME_CONTEXT_PLUGIN,
};

/// When a running agent makes its log durable on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlushPolicy {
    /// Only when asked ([`crate::SessionLog::flush`], disposal, a settle path).
    #[default]
    OnRequest,
    /// Also at the end of every step, so a crash loses at most the step in flight.
    EveryStep,
}

/// How an agent calls its model.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AgentOptions {
    /// The model provider route (the router's default when `None`).
    pub provider: Option<String>,
    /// The model name passed to the adapter.
    pub model: String,
    /// The response token cap.
    pub max_tokens: Option<u32>,
    /// The agent's runtime delegation depth (a floor beside the header's).
    pub subagent_depth: u64,
    /// When the agent flushes its log on its own.
    pub flush: FlushPolicy,
    /// Page out the log's settled events beyond this many (a long-lived agent's bounded
    /// working set): at each turn's end, the events the store already has, before the newest
    /// this many and before the last turn's end, leave memory with the history entries they
    /// carry. A model call then reads the history back from the store unless the model reads
    /// only the newest entries ([`crate::LlmAdapter::history_window`]). `None` (the default)
    /// keeps the whole log in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_events: Option<std::num::NonZeroU32>,
}

/// Whether an agent is running a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentStatus {
    /// No driver is active.
    Idle,
    /// From a waking send until the driver exits.
    Running,
}

/// What happened to an agent, for observers.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentEvent {
    /// The agent.
    pub agent: SessionId,
    /// What happened.
    pub kind: AgentEventKind,
}

/// The agent lifecycle and inbox events.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AgentEventKind {
    /// The agent was published.
    Created,
    /// A message entered the inbox.
    InboxInserted {
        /// The message.
        message: MessageId,
        /// Its list.
        target: InboxTarget,
    },
    /// A turn claimed a message.
    InboxClaimed {
        /// The message.
        message: MessageId,
        /// The claiming turn.
        turn: u64,
    },
    /// A pending message was discarded by a cancel.
    InboxDiscarded {
        /// The message.
        message: MessageId,
    },
    /// A turn ended.
    TurnEnded {
        /// The turn.
        turn: u64,
        /// How.
        reason: TurnEndReason,
    },
    /// A durable write of the agent's session failed: the running turn ends with an error, new
    /// sends are refused (`AGENT_FAULTED`), and `flush`/`dispose` return this error.
    Faulted {
        /// The failed write's error.
        error: SubagentError,
    },
    /// The agent was disposed and unregistered.
    Disposed,
}

impl ScopedEvent for AgentEvent {
    type Key = SessionId;

    fn scope_key(&self) -> Option<SessionId> {
        Some(self.agent)
    }

    fn name(&self) -> &'static str {
        match self.kind {
            AgentEventKind::Created => "agent/created",
            AgentEventKind::InboxInserted { .. } => "agent/inbox/inserted",
            AgentEventKind::InboxClaimed { .. } => "agent/inbox/claimed",
            AgentEventKind::InboxDiscarded { .. } => "agent/inbox/discarded",
            AgentEventKind::TurnEnded { .. } => "agent/turn-ended",
            AgentEventKind::Faulted { .. } => "agent/faulted",
            AgentEventKind::Disposed => "agent/disposed",
        }
    }
}

/// What every agent of a runtime shares: models, global tools and prompt, events, the store.
pub struct AgentEnv {
    /// Model adapters by provider.
    pub models: ModelRouter,
    /// The global tool layer.
    pub tools: Arc<ToolRegistry>,
    /// Global prompt sections.
    pub sections: Vec<PromptSection>,
    /// Agent events.
    pub events: Arc<EventBus<AgentEvent>>,
    /// The session store, when persistence is configured.
    pub store: Option<SharedStore>,
    /// Prompt variables for `{{name}}` interpolation (personas).
    pub variables: BTreeMap<String, String>,
    /// The deployment's delegation policy, when it has sandbox or approval services.
    pub delegation: Option<Arc<dyn DelegationPolicy>>,
    /// Pre-step hooks every agent runs before its own (a plugin's `agent/pre-step` listeners).
    pub pre_step: Vec<PreStepHook>,
    /// The session projection registry (durable listing needs it).
    pub projections: Option<Arc<ProjectionRegistry>>,
    /// Whether delegated children's projection checkpoints are cached in the store.
    pub projection_cache: bool,
    /// The runtime's metrics, when it was built with a meter.
    pub(crate) metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Whether spans record content (prompts, outputs, tool arguments and results).
    pub(crate) trace_content: bool,
}

/// The policy a delegating parent hands to its children, captured synchronously at delegation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelegatedPolicy {
    /// The parent's explicit sandbox override (never the deployment default).
    pub sandbox_mode: Option<String>,
    /// Whether an approval service exists; children then run with approvals pinned to `never`.
    pub approval_pinned: bool,
}

/// A deployment's sandbox and approval services, as delegation sees them.
pub trait DelegationPolicy: Send + Sync + 'static {
    /// The policy `parent` hands to a child delegated now.
    fn capture(&self, parent: SessionId) -> DelegatedPolicy;
}

impl std::fmt::Debug for AgentEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentEnv")
            .field("sections", &self.sections)
            .field("persistent", &self.store.is_some())
            .finish_non_exhaustive()
    }
}
