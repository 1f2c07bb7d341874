//! Provides [`SubagentEvent`]: the delegation lifecycle events (`subagent/start`,
//! `subagent/end`, `subagent/provider-added`, `subagent/provider-removed`).
//!
//! Start and end are scoped to the delegating parent, so a parent-scoped listener observes only
//! its own delegations; provider events are unscoped.

use crate::content::ContentBlock;
use crate::events::ScopedEvent;
use crate::ids::{RunId, SessionId};
use crate::stop_reason::StopReason;

/// The identity of one observed run (one-shot) or Activation epoch (continuable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubagentRunInfo {
    /// A fresh id per run or epoch.
    pub run_id: RunId,
    /// The provider that started it (not a claim that it is still registered).
    pub provider: String,
    /// The child's session id (or a remote run id).
    pub id: SessionId,
    /// Whether the run has a local in-process child.
    pub local: bool,
    /// The delegating parent's session.
    pub parent: SessionId,
}

/// A run's terminal edge.
#[derive(Debug, Clone, PartialEq)]
pub struct SubagentRunEndInfo {
    /// The run's identity, equal to its start's.
    pub info: SubagentRunInfo,
    /// Why it ended (`error` when the result failed as infrastructure).
    pub stop_reason: StopReason,
    /// The final output; `None` when it was empty or the result failed.
    pub last_assistant_message: Option<Vec<ContentBlock>>,
}

/// A delegation lifecycle event.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SubagentEvent {
    /// A provider established a published child (for in-process providers the child is
    /// registered while this is delivered).
    Start(SubagentRunInfo),
    /// A published child settled.
    End(SubagentRunEndInfo),
    /// A provider became resolvable.
    ProviderAdded(String),
    /// A provider left the registry; accepted runs remain holder-owned.
    ProviderRemoved(String),
}

impl ScopedEvent for SubagentEvent {
    type Key = SessionId;

    fn scope_key(&self) -> Option<SessionId> {
        match self {
            Self::Start(info) => Some(info.parent),
            Self::End(end) => Some(end.info.parent),
            Self::ProviderAdded(_) | Self::ProviderRemoved(_) => None,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Start(_) => "subagent/start",
            Self::End(_) => "subagent/end",
            Self::ProviderAdded(_) => "subagent/provider-added",
            Self::ProviderRemoved(_) => "subagent/provider-removed",
        }
    }
}
