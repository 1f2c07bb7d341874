//! Provides the model interface: [`LlmAdapter`] (one streaming call), its request and chunk
//! vocabulary, the [`ModelRouter`] that picks an adapter by provider name, and the
//! [`BlockAssembler`] that turns chunks into content blocks.
//!
//! Adapters only stream. The turn driver normalizes every outcome: an `Err` item or a stream
//! that ends without `finish` still ends the step (`error`, or `stop` for a silent end).

mod assembler;
pub mod openai;
pub(crate) mod scripted;

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::content::ContentBlock;
use crate::ids::{CallId, SessionId};
use crate::session::{History, LlmFailure, TokenUsage};

pub use assembler::BlockAssembler;
pub use openai::{OpenAiAdapter, OpenAiConfig};

/// The kind of block a `block-start` chunk opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockType {
    /// Text.
    Text,
    /// Reasoning.
    Reasoning,
    /// A tool call.
    ToolCall,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FinishReason {
    /// A natural stop.
    Stop,
    /// The model asked for tool calls.
    ToolCalls,
    /// The token limit cut the response; tool calls are dropped.
    MaxTokens,
    /// The provider refused (content filter); the turn ends `blocked`.
    Refusal,
    /// The provider reported an abort.
    Aborted {
        /// Details.
        failure: LlmFailure,
    },
    /// The provider failed.
    Error {
        /// Details.
        failure: LlmFailure,
    },
}

/// One streamed piece of a model response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum StreamChunk {
    /// A block opens at `index`.
    #[serde(rename_all = "camelCase")]
    BlockStart {
        /// Block position.
        index: u32,
        /// Its kind.
        block_type: BlockType,
    },
    /// Text for the block at `index`.
    TextDelta {
        /// Block position.
        index: u32,
        /// The text.
        text: String,
    },
    /// Reasoning for the block at `index`.
    ReasoningDelta {
        /// Block position.
        index: u32,
        /// The text.
        text: String,
    },
    /// Part of a tool call at `index`.
    #[serde(rename_all = "camelCase")]
    ToolCallDelta {
        /// Block position.
        index: u32,
        /// The call id (may be empty until known).
        #[serde(default)]
        id: String,
        /// The tool name, once known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// More argument text.
        #[serde(default)]
        arguments_delta: String,
    },
    /// The complete, authoritative block at `index`.
    BlockEnd {
        /// Block position.
        index: u32,
        /// The block.
        block: ContentBlock,
    },
    /// Token counts.
    Usage {
        /// The counts.
        usage: TokenUsage,
    },
    /// The response ends.
    Finish {
        /// Why.
        reason: FinishReason,
    },
}

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    /// The tool name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// One model call.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The provider route name.
    pub provider: String,
    /// The model name.
    pub model: String,
    /// The history (surface messages), oldest first: a shared snapshot, cheap to clone.
    pub messages: History,
    /// The assembled system prompt.
    pub system: Option<String>,
    /// The tools the agent may call, shared with the tools that declare them (cheap to
    /// clone).
    pub tools: Vec<Arc<ToolSchema>>,
    /// The response token cap.
    pub max_tokens: Option<u32>,
    /// The calling session.
    pub session_id: Option<SessionId>,
    /// Cancelled when the turn is cancelled; an adapter must stop promptly.
    pub cancel: CancellationToken,
}

/// A model adapter: one streaming call per request.
///
/// # The chunk protocol
/// A response streams as [`StreamChunk`]s, which the turn driver assembles into content blocks
/// (see [`BlockAssembler`]):
/// 1. Each content block opens with `BlockStart { index, block_type }`; indexes count from 0 in
///    the order blocks open.
/// 2. Its content follows as `TextDelta`, `ReasoningDelta` or `ToolCallDelta` chunks naming the
///    same index (deltas of different blocks may interleave).
/// 3. `BlockEnd { index, .. }` closes it; its content, when given, is authoritative over the
///    deltas.
/// 4. `Usage` (at most once; counts are disjoint) and then `Finish { reason }` end the response.
///
/// Then the stream ends. An `Err` item ends it as a failure (the step ends `error`); a stream
/// that ends without `Finish` counts as `stop`. The adapter must stop promptly once
/// [`GenerateRequest::cancel`] fires, and must never panic: report failures as
/// [`crate::LlmFailure`] items.
pub trait LlmAdapter: Send + Sync + 'static {
    /// Streams the response to `request`. An `Err` item ends the stream as a failure.
    fn stream(
        &self,
        request: GenerateRequest,
    ) -> BoxStream<'static, Result<StreamChunk, LlmFailure>>;

    /// How many of the newest history entries this adapter reads, beside the history's
    /// length: `None` (the default) when it reads the whole history. An agent that pages its
    /// log out ([`crate::AgentOptions::resident_events`]) hands a model with a window the
    /// entries it holds when they cover the window, instead of reading the paged-out history
    /// back from the store before every call.
    fn history_window(&self) -> Option<usize> {
        None
    }
}

/// Routes a request to an adapter by provider name; the first registered adapter is the default.
#[derive(Clone, Default)]
pub struct ModelRouter {
    routes: HashMap<String, Arc<dyn LlmAdapter>>,
    default: Option<String>,
}

impl ModelRouter {
    /// An empty router.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `adapter` under `provider`; the first registration becomes the default.
    pub fn register(&mut self, provider: impl Into<String>, adapter: Arc<dyn LlmAdapter>) {
        let provider = provider.into();
        self.default.get_or_insert_with(|| provider.clone());
        self.routes.insert(provider, adapter);
    }

    /// The default provider name.
    pub fn default_provider(&self) -> Option<&str> {
        self.default.as_deref()
    }

    /// The adapter for `provider` (the default when `None`).
    ///
    /// # Errors
    /// An `NO_MODEL_ROUTE` failure, recorded by the driver as the turn's error.
    pub fn route(
        &self,
        provider: Option<&str>,
    ) -> Result<(String, Arc<dyn LlmAdapter>), LlmFailure> {
        let name = provider
            .or(self.default.as_deref())
            .ok_or_else(|| LlmFailure::new("NO_MODEL_ROUTE", "no model adapter is registered"))?;
        self.routes
            .get(name)
            .map(|adapter| (name.to_owned(), Arc::clone(adapter)))
            .ok_or_else(|| {
                LlmFailure::new("NO_MODEL_ROUTE", format!("no model adapter named {name:?}"))
            })
    }
}

/// The id given to a tool call the model sent without one.
pub fn fallback_call_id(index: u32) -> CallId {
    CallId::new(format!("call-{index}"))
}
