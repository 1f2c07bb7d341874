//! Provides [`ScriptedModel`]: a deterministic [`LlmAdapter`] for tests, demos and load runs.
//!
//! Each model call consumes the next [`ScriptStep`]: canned chunks, a failure, a hang until the
//! turn is cancelled, or chunks held behind a [`Gate`] until the test releases them. A call
//! that names a model with a script of its own ([`ScriptedModel::push_for_model`]: a child
//! started with that model name) consumes that script instead, so a parent's turns never eat
//! a child's steps. When the script runs out, the optional fallback responder answers; without
//! one the call fails with `SCRIPT_EXHAUSTED` naming the script, so the turn ends `error`.
//! Every request is recorded.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::watch;

use crate::content::ContentBlock;
use crate::ids::CallId;
use crate::model::{BlockType, FinishReason, GenerateRequest, LlmAdapter, StreamChunk};
use crate::session::{LlmFailure, TokenUsage};

/// A rendezvous a test controls: a scripted call waits at the gate until it is released.
///
/// [`Gate::reached`] lets the test wait until a call is actually held, so ordering comes from
/// the gate and never from sleeping.
#[derive(Debug, Clone)]
pub struct Gate {
    /// One pointer: every call held at the gate keeps a copy (a scale run holds a million).
    shared: Arc<GateState>,
}

#[derive(Debug)]
struct GateState {
    reached: watch::Sender<bool>,
    released: watch::Sender<bool>,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self {
            shared: Arc::new(GateState {
                reached: watch::channel(false).0,
                released: watch::channel(false).0,
            }),
        }
    }

    /// Opens the gate; every held and future call goes through.
    pub fn release(&self) {
        self.shared.released.send_replace(true);
    }

    /// Resolves once a call has reached the gate.
    pub async fn reached(&self) {
        let mut reached = self.shared.reached.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = reached.wait_for(|reached| *reached).await;
    }

    /// Marks the gate reached and waits until it is released.
    pub async fn pass(&self) {
        self.shared.reached.send_replace(true);
        let mut released = self.shared.released.subscribe();
        let _ = released.wait_for(|released| *released).await;
    }
}

/// Computes a response from the request.
pub type Responder = Arc<dyn Fn(&GenerateRequest) -> Vec<StreamChunk> + Send + Sync>;

/// One scripted response.
#[derive(Clone)]
pub enum ScriptStep {
    /// Stream these chunks.
    Chunks(Vec<StreamChunk>),
    /// Hold at the gate, then stream the chunks.
    Gated(Gate, Vec<StreamChunk>),
    /// Fail the call.
    Fail(LlmFailure),
    /// Stream a partial text (`"partial"`), then wait until the turn is cancelled.
    Hang,
    /// Stream these chunks, then wait until the turn is cancelled.
    HangAfter(Vec<StreamChunk>),
    /// Stream `head`, hold at the gate, then stream `tail`: a test can act mid-stream once
    /// [`Gate::reached`] resolves, knowing `head` was delivered.
    Split {
        /// Streamed before the gate.
        head: Vec<StreamChunk>,
        /// The gate.
        gate: Gate,
        /// Streamed after the gate opens.
        tail: Vec<StreamChunk>,
    },
    /// Compute the chunks from the request.
    Respond(Responder),
}

impl std::fmt::Debug for ScriptStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Chunks(chunks) => f.debug_tuple("Chunks").field(chunks).finish(),
            Self::Gated(_, chunks) => f.debug_tuple("Gated").field(chunks).finish(),
            Self::Fail(failure) => f.debug_tuple("Fail").field(failure).finish(),
            Self::Hang => f.write_str("Hang"),
            Self::HangAfter(chunks) => f.debug_tuple("HangAfter").field(chunks).finish(),
            Self::Split { head, tail, .. } => f
                .debug_struct("Split")
                .field("head", head)
                .field("tail", tail)
                .finish(),
            Self::Respond(_) => f.write_str("Respond(..)"),
        }
    }
}

impl ScriptStep {
    /// A text answer: one text block, usage `{10, len}`, finish `stop`.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Chunks(text_chunks(text.into(), FinishReason::Stop))
    }

    /// A text answer cut by the token limit.
    pub fn max_tokens(text: impl Into<String>) -> Self {
        Self::Chunks(text_chunks(text.into(), FinishReason::MaxTokens))
    }

    /// A refusal (content filter) with an explanation.
    pub fn refusal(text: impl Into<String>) -> Self {
        Self::Chunks(text_chunks(text.into(), FinishReason::Refusal))
    }

    /// One tool call, its arguments split across two deltas, usage `{10, 5}`, finish
    /// `tool-calls`.
    pub fn tool_call(id: &str, name: &str, arguments: serde_json::Value) -> Self {
        Self::tool_calls(&[(id, name, arguments)])
    }

    /// Several tool calls in one response.
    pub fn tool_calls(calls: &[(&str, &str, serde_json::Value)]) -> Self {
        Self::Chunks(tool_call_chunks(calls))
    }

    /// The chunks a fixed step answers with (`None` for a failure, a hang or a responder): a
    /// responder composes its answers from the constructors above.
    pub fn into_chunks(self) -> Option<Vec<StreamChunk>> {
        match self {
            Self::Chunks(chunks) | Self::Gated(_, chunks) => Some(chunks),
            _ => None,
        }
    }

    /// A failure with `code` and `message`.
    pub fn fail(code: &str, message: &str) -> Self {
        Self::Fail(LlmFailure::new(code, message))
    }

    /// Holds `step`'s chunks behind `gate`.
    ///
    /// A step without fixed chunks (a failure, a hang, a responder) is returned unchanged.
    pub fn gated(self, gate: &Gate) -> Self {
        match self {
            Self::Chunks(chunks) | Self::Gated(_, chunks) => Self::Gated(gate.clone(), chunks),
            other => other,
        }
    }
}

/// The chunks of a response making `calls` (each call's arguments split across two deltas),
/// usage `{10, 5}`, finish `tool-calls`.
pub(crate) fn tool_call_chunks(calls: &[(&str, &str, serde_json::Value)]) -> Vec<StreamChunk> {
    {
        let mut chunks = Vec::new();
        for ((id, name, arguments), index) in calls.iter().zip(0u32..) {
            let text = arguments.to_string();
            let middle = text
                .char_indices()
                .nth(text.chars().count() / 2)
                .map_or(0, |(i, _)| i);
            let (head, tail) = text.split_at(middle);
            chunks.push(StreamChunk::BlockStart {
                index,
                block_type: BlockType::ToolCall,
            });
            chunks.push(StreamChunk::ToolCallDelta {
                index,
                id: (*id).to_owned(),
                name: Some((*name).to_owned()),
                arguments_delta: head.to_owned(),
            });
            chunks.push(StreamChunk::ToolCallDelta {
                index,
                id: String::new(),
                name: None,
                arguments_delta: tail.to_owned(),
            });
            chunks.push(StreamChunk::BlockEnd {
                index,
                block: ContentBlock::ToolCall {
                    id: CallId::new(*id),
                    name: (*name).to_owned(),
                    arguments: text.clone(),
                },
            });
        }
        chunks.push(usage(10, 5));
        chunks.push(StreamChunk::Finish {
            reason: FinishReason::ToolCalls,
        });
        chunks
    }
}

fn usage(input_tokens: u64, output_tokens: u64) -> StreamChunk {
    StreamChunk::Usage {
        usage: TokenUsage {
            input_tokens,
            output_tokens,
            ..TokenUsage::default()
        },
    }
}

/// The chunks of a one-block text response ending with `finish`.
pub(crate) fn text_chunks(text: String, finish: FinishReason) -> Vec<StreamChunk> {
    let length = u64::try_from(text.chars().count()).unwrap_or(u64::MAX);
    vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Text,
        },
        StreamChunk::TextDelta { index: 0, text },
        usage(10, length),
        StreamChunk::Finish { reason: finish },
    ]
}

/// A deterministic model. Clones share the script and the request record.
#[derive(Clone, Default)]
pub struct ScriptedModel {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<ScriptState>,
}

struct ScriptState {
    steps: VecDeque<ScriptStep>,
    /// Scripts of their own, by the model name a request asks for.
    by_model: std::collections::HashMap<String, VecDeque<ScriptStep>>,
    /// Shared with the calls it answers (see [`Next`]).
    fallback: Option<Arc<ScriptStep>>,
    latency: Option<Duration>,
    requests: Vec<GenerateRequest>,
    request_count: usize,
    recording: bool,
}

impl Default for ScriptState {
    fn default() -> Self {
        Self {
            steps: VecDeque::new(),
            by_model: std::collections::HashMap::new(),
            fallback: None,
            latency: None,
            requests: Vec::new(),
            request_count: 0,
            recording: true,
        }
    }
}

impl ScriptedModel {
    /// A model with an empty script.
    pub fn new() -> Self {
        Self::default()
    }

    /// A model that answers with `steps` in order.
    pub fn with_script(steps: impl IntoIterator<Item = ScriptStep>) -> Self {
        let model = Self::new();
        model.push_all(steps);
        model
    }

    /// A model that answers every call with `step` (for demos and load runs).
    pub fn repeating(step: ScriptStep) -> Self {
        let model = Self::new();
        model.set_fallback(step);
        model
    }

    /// Adds a step at the end of the script.
    pub fn push(&self, step: ScriptStep) {
        self.lock().steps.push_back(step);
    }

    /// Adds steps at the end of the script.
    pub fn push_all(&self, steps: impl IntoIterator<Item = ScriptStep>) {
        self.lock().steps.extend(steps);
    }

    /// Adds `steps` to the script of the calls that name model `model` (an agent's
    /// `AgentOptions::model`, a child's `ChildAgentOptions::model`): those calls consume it
    /// instead of the shared script, so a parent's turns (its settled notices, say) never eat
    /// the steps meant for a child started with that model name.
    pub fn push_for_model(
        &self,
        model: impl Into<String>,
        steps: impl IntoIterator<Item = ScriptStep>,
    ) {
        self.lock()
            .by_model
            .entry(model.into())
            .or_default()
            .extend(steps);
    }

    /// Answers every call after the script runs out with `step`.
    pub fn set_fallback(&self, step: ScriptStep) {
        self.lock().fallback = Some(Arc::new(step));
    }

    /// Delays every response by `latency` (cancellable), simulating a remote model.
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = Some(latency);
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<GenerateRequest> {
        self.lock().requests.clone()
    }

    /// How many requests were received (counted even when recording is off).
    pub fn request_count(&self) -> usize {
        self.lock().request_count
    }

    /// Turns the record of requests on (the default) or off. Load runs turn it off: the record
    /// keeps every request's history, so it grows with every call.
    pub fn set_recording(&self, recording: bool) {
        let mut state = self.lock();
        state.recording = recording;
        if !recording {
            state.requests = Vec::new();
        }
    }

    fn lock(&self) -> MutexGuard<'_, ScriptState> {
        // No code path panics with the lock held; a poisoned state is still consistent.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn canned(chunks: Vec<StreamChunk>) -> BoxStream<'static, Result<StreamChunk, LlmFailure>> {
    stream::iter(chunks.into_iter().map(Ok)).boxed()
}

fn aborted() -> LlmFailure {
    LlmFailure::new("ABORTED", "the model call was cancelled")
}

/// Yields `chunks`, then waits for cancellation and fails as aborted.
fn hang_after(
    chunks: Vec<StreamChunk>,
    cancel: tokio_util::sync::CancellationToken,
) -> BoxStream<'static, Result<StreamChunk, LlmFailure>> {
    let tail = stream::once(async move {
        cancel.cancelled().await;
        Err(aborted())
    });
    canned(chunks).chain(tail).boxed()
}

/// The step a call answers with: its own, taken from the script, or the shared fallback.
enum Next {
    Own(ScriptStep),
    Fallback(Arc<ScriptStep>),
}

/// Holds at `gate` (or fails as aborted on cancel), then yields the chunks `chunks` makes.
/// They are made once the gate opens: a call held at a gate holds no copy of a repeated
/// step's chunks (a scale run holds a million such calls).
fn gated(
    gate: Gate,
    chunks: impl FnOnce() -> Vec<StreamChunk> + Send + 'static,
    cancel: tokio_util::sync::CancellationToken,
) -> BoxStream<'static, Result<StreamChunk, LlmFailure>> {
    opened_by(async move {
        tokio::select! {
            () = gate.pass() => Ok(canned(chunks())),
            () = cancel.cancelled() => Err(aborted()),
        }
    })
}

/// The stream `opening` resolves to, or its failure as the one item.
fn opened_by(
    opening: impl std::future::Future<
            Output = Result<BoxStream<'static, Result<StreamChunk, LlmFailure>>, LlmFailure>,
        > + Send
        + 'static,
) -> BoxStream<'static, Result<StreamChunk, LlmFailure>> {
    stream::once(opening)
        .map(|opened| match opened {
            Ok(inner) => inner,
            Err(failure) => stream::once(async move { Err(failure) }).boxed(),
        })
        .flatten()
        .boxed()
}

impl LlmAdapter for ScriptedModel {
    fn stream(
        &self,
        request: GenerateRequest,
    ) -> BoxStream<'static, Result<StreamChunk, LlmFailure>> {
        let (step, latency, own_script) = {
            let mut state = self.lock();
            state.request_count += 1;
            if state.recording {
                state.requests.push(request.clone());
            }
            let (next, own_script) = match state.by_model.get_mut(&request.model) {
                Some(script) => (script.pop_front(), true),
                None => (state.steps.pop_front(), false),
            };
            let step = match next {
                Some(step) => Some(Next::Own(step)),
                None => state.fallback.clone().map(Next::Fallback),
            };
            (step, state.latency, own_script)
        };
        let cancel = request.cancel.clone();
        let step = match step {
            Some(Next::Fallback(fallback)) => {
                if let ScriptStep::Gated(gate, _) = &*fallback {
                    let gate = gate.clone();
                    let chunks = move || match &*fallback {
                        ScriptStep::Gated(_, chunks) => chunks.clone(),
                        _ => Vec::new(),
                    };
                    return delayed(gated(gate, chunks, cancel.clone()), latency, cancel);
                }
                Some(ScriptStep::clone(&fallback))
            }
            Some(Next::Own(step)) => Some(step),
            None => None,
        };
        let body: BoxStream<'static, Result<StreamChunk, LlmFailure>> = match step {
            None => {
                let message = if own_script {
                    format!(
                        "the scripted model has no step left in the script of model {:?}",
                        request.model
                    )
                } else {
                    "the scripted model has no step left".to_owned()
                };
                stream::once(async move { Err(LlmFailure::new("SCRIPT_EXHAUSTED", message)) })
                    .boxed()
            }
            Some(ScriptStep::Chunks(chunks)) => canned(chunks),
            Some(ScriptStep::Respond(respond)) => canned(respond(&request)),
            Some(ScriptStep::Fail(failure)) => stream::once(async move { Err(failure) }).boxed(),
            Some(ScriptStep::Hang) => hang_after(
                vec![
                    StreamChunk::BlockStart {
                        index: 0,
                        block_type: BlockType::Text,
                    },
                    StreamChunk::TextDelta {
                        index: 0,
                        text: "partial".into(),
                    },
                ],
                cancel.clone(),
            ),
            Some(ScriptStep::HangAfter(chunks)) => hang_after(chunks, cancel.clone()),
            Some(ScriptStep::Gated(gate, chunks)) => gated(gate, move || chunks, cancel.clone()),
            Some(ScriptStep::Split { head, gate, tail }) => canned(head)
                .chain(gated(gate, move || tail, cancel.clone()))
                .boxed(),
        };
        delayed(body, latency, cancel)
    }
}

/// `body`, started after `latency` when there is one (failing as aborted if cancelled first).
fn delayed(
    body: BoxStream<'static, Result<StreamChunk, LlmFailure>>,
    latency: Option<Duration>,
    cancel: tokio_util::sync::CancellationToken,
) -> BoxStream<'static, Result<StreamChunk, LlmFailure>> {
    let Some(latency) = latency else {
        return body;
    };
    opened_by(async move {
        tokio::select! {
            () = tokio::time::sleep(latency) => Ok(body),
            () = cancel.cancelled() => Err(aborted()),
        }
    })
}
