//! Provides [`SubagentStartRequest`] (what a caller asks for when starting a one-shot child) and
//! [`ResolvedSubagentStartRequest`] (what the provider receives once the service validated it).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::actors::agent::AgentRef;
use crate::content::ContentBlock;
use crate::host::DelegatedPolicy;
use crate::schema::ObjectSchema;
use crate::seam::SubagentDescriptor;
use crate::tools::ToolFilter;

/// Model options a request may set for the child; unset fields come from the parent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildAgentOptions {
    /// The child's model provider route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The child's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The child's response token cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

/// What a caller asks for when starting a one-shot subagent.
///
/// `output_schema`, `max_depth`, `tool_filter` and `persona` each need the matching
/// [`crate::seam::SubagentCapabilities`] flag of the chosen provider.
#[derive(Debug, Clone)]
pub struct SubagentStartRequest {
    /// A short display label persisted with a session-backed child.
    pub label: Option<String>,
    /// The child's prompt.
    pub prompt: Vec<ContentBlock>,
    /// The delegating agent: in-process providers read its cwd, lineage and depth.
    pub parent: AgentRef,
    /// The single cancellation channel, before and after the child is published: before, the
    /// start fails and leaves nothing behind; after, the child's remaining work is cancelled.
    pub cancel: CancellationToken,
    /// Model options for the child.
    pub agent_options: Option<ChildAgentOptions>,
    /// An object-rooted JSON Schema within the enforced subset.
    pub output_schema: Option<Value>,
    /// An absolute cap on the child's delegation depth.
    pub max_depth: Option<u64>,
    /// Global tools hidden from (and refused to) the child.
    pub tool_filter: Option<ToolFilter>,
    /// A persona that shadows the deployment persona for this child (`{{var}}` interpolated).
    pub persona: Option<String>,
    /// The parent's delegated policy, captured when the start was called (before any await).
    pub(crate) policy: Option<DelegatedPolicy>,
    /// The span current where the start was called, captured with the policy: the child's
    /// turns continue that trace.
    pub(crate) trace: tracing::Span,
}

impl SubagentStartRequest {
    /// A request to run `prompt` under `parent`, with a fresh cancellation token.
    pub fn new(parent: &AgentRef, prompt: Vec<ContentBlock>) -> Self {
        Self {
            label: None,
            prompt,
            parent: parent.clone(),
            cancel: CancellationToken::new(),
            agent_options: None,
            output_schema: None,
            max_depth: None,
            tool_filter: None,
            persona: None,
            policy: None,
            trace: tracing::Span::none(),
        }
    }

    /// Sets the label.
    #[must_use]
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Sets the cancellation token.
    #[must_use]
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }

    /// Sets the child's model options.
    #[must_use]
    pub fn agent_options(mut self, options: ChildAgentOptions) -> Self {
        self.agent_options = Some(options);
        self
    }

    /// Requests structured output against `schema`.
    #[must_use]
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Caps the child's delegation depth.
    #[must_use]
    pub fn max_depth(mut self, depth: u64) -> Self {
        self.max_depth = Some(depth);
        self
    }

    /// Scopes the child's global tools.
    #[must_use]
    pub fn tool_filter(mut self, filter: ToolFilter) -> Self {
        self.tool_filter = Some(filter);
        self
    }

    /// Sets the child's persona.
    #[must_use]
    pub fn persona(mut self, persona: impl Into<String>) -> Self {
        self.persona = Some(persona.into());
        self
    }
}

impl SubagentStartRequest {
    /// Captures the parent's delegated policy now, unless it already was.
    pub(crate) fn capture_policy(&mut self) {
        self.trace = tracing::Span::current();
        if self.policy.is_none() {
            let parent = self.parent.id();
            self.policy = self
                .parent
                .agents()
                .env()
                .delegation
                .as_ref()
                .map(|policy| policy.capture(parent));
        }
    }
}

/// The provider-facing request: the caller's request after the service checked every
/// capability, validated depth and schema, and snapshotted the durable descriptor.
#[derive(Debug, Clone)]
pub struct ResolvedSubagentStartRequest {
    /// The caller's request (a copy: the provider never sees the caller's own object).
    pub request: SubagentStartRequest,
    /// The descriptor a session-backed provider appends inside the child's first turn.
    pub descriptor: SubagentDescriptor,
    /// The validated output schema, when one was requested.
    pub output_schema: Option<ObjectSchema>,
}
