//! Provides [`OpenAiAdapter`], an [`LlmAdapter`] for any OpenAI-compatible chat-completions
//! endpoint (OpenAI, vLLM, DeepSeek, llama.cpp, Ollama, ...), and its [`OpenAiConfig`].
//!
//! One model call is one `POST {base}/chat/completions` with `stream: true`. The response is a
//! server-sent event stream of `chat.completion.chunk` objects; the adapter turns their deltas
//! into this crate's [`StreamChunk`] vocabulary as they arrive, so the turn driver logs text while
//! the model is still writing.
//!
//! # The request
//!
//! - `model`: the request's model, or the configured one when the request leaves it empty.
//! - `messages`: the system prompt first (a `system` message), then the history. User text and
//!   assistant text become `user` and `assistant` messages; an assistant's tool calls travel as
//!   its `tool_calls` (the arguments are sent as the raw string the model produced); each tool
//!   result becomes a `tool` message carrying its `tool_call_id`. Reasoning is never sent back.
//! - `tools`, only when the agent has some: `{type: "function", function: {name, description,
//!   parameters}}`.
//! - `max_tokens` when the request caps the response, and `stream_options: {include_usage:
//!   true}` so the provider reports token counts in a last chunk.
//!
//! # The stream
//!
//! `choices[0].delta.content` becomes a text block, `delta.reasoning_content` (DeepSeek, vLLM;
//! `delta.reasoning` is accepted too) a reasoning block, and each `delta.tool_calls[i]` a
//! tool-call block. Blocks are numbered in the order they first appear. A block's first delta is
//! preceded by `block-start`; when the provider finishes, every block is closed by a `block-end`
//! carrying the complete block, then `finish` follows. The provider's `usage` becomes a `usage`
//! chunk with disjoint counts (cached prompt tokens are taken out of `input_tokens` and reported
//! as `cache_read`; reasoning tokens are taken out of `output_tokens` and reported as
//! `reasoning`). `finish_reason` maps `stop` → stop, `length` → max-tokens, `tool_calls` and
//! `function_call` → tool-calls, `content_filter` → refusal, anything else → stop.
//!
//! The stream must end with `data: [DONE]`, or at least end cleanly after a `finish_reason`; a
//! body that ends mid-event, or before the provider finished, is a protocol failure.
//!
//! # Retries
//!
//! A `429` (unless the body says the quota is exhausted), a `408`, a `5xx` and a failed
//! connection are retried up to [`OpenAiConfig::max_retries`] times, only before the first
//! chunk was yielded (a stream that already delivered text is never replayed). The delay is the
//! provider's `Retry-After` (seconds or an HTTP date, capped by
//! [`OpenAiConfig::retry_after_cap`]) or else exponential backoff with jitter between the
//! configured base and cap.
//!
//! # Timeouts
//!
//! - *connect*: establishing the TCP (and TLS) connection;
//! - *request*: from sending the request until the response headers arrive;
//! - *idle*: the longest silence allowed between two reads of the streaming body.
//!
//! There is deliberately no total deadline: a long answer streams for as long as the provider
//! keeps sending. A timeout is never retried.
//!
//! # Cancellation
//!
//! Every wait (the request, each read, each backoff sleep) also waits on the request's `cancel`
//! token. When it fires the HTTP request is dropped at once (closing the connection) and the
//! stream yields one `Err` with code [`codes::ABORTED`], then ends. Dropping the stream aborts
//! the request the same way: nothing runs in the background.
//!
//! # Failures
//!
//! Every failure is one `Err(LlmFailure)` item that ends the stream. Its `code` is one of
//! [`codes`], its `category` tells who must act:
//!
//! | what happened | category | code |
//! | --- | --- | --- |
//! | `401`, `403` | auth | [`codes::AUTH_FAILED`] |
//! | `429` | quota | [`codes::RATE_LIMITED`] |
//! | a body saying `insufficient_quota` | quota | [`codes::INSUFFICIENT_QUOTA`] |
//! | `5xx`, an error event in the stream | provider | [`codes::PROVIDER_ERROR`] |
//! | a timeout | provider | [`codes::TIMEOUT`] |
//! | no connection | provider | [`codes::CONNECT_FAILED`] |
//! | a connection that broke mid-request or mid-body | provider | [`codes::TRANSPORT_ERROR`] |
//! | malformed events or JSON, a truncated stream | protocol | [`codes::PROTOCOL_ERROR`] |
//! | any other `4xx` (a request the provider refused) | none | [`codes::REQUEST_REJECTED`] |
//!
//! The failure carries the HTTP `status`, the provider's retry hint
//! (`provider_retry_after_ms`) and its `x-request-id` when they are known, and the provider's
//! `error.message` in its message. Malformed input never panics.
//!
//! # The API key
//!
//! [`OpenAiConfig::api_key_env`] names an environment variable; [`OpenAiAdapter::new`] reads it
//! once and sends it as `Authorization: Bearer …`. The key is held outside the configuration,
//! never logged, and prints as `<redacted>` in `Debug` output.
//!
//! # Why `reqwest` with rustls
//!
//! The HTTP client is `reqwest` 0.12 with `default-features = false` and the `rustls-tls`,
//! `stream` and `json` features. rustls is a pure-Rust TLS stack, so the crate builds and
//! runs without a system OpenSSL. reqwest's streaming response body (read chunk by chunk), its
//! connect timeout and its JSON request bodies cover everything this adapter needs; the
//! request and idle timeouts are enforced around those reads so they can name what timed out.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use subagents::model::openai::{OpenAiAdapter, OpenAiConfig};
//! use subagents::{MemoryStore, Runtime};
//!
//! # fn main() -> Result<(), subagents::SubagentError> {
//! actix::System::new().block_on(async {
//!     let config = OpenAiConfig::new("https://api.openai.com/v1", "gpt-4o-mini")
//!         .api_key_env("OPENAI_API_KEY")
//!         .idle_timeout(Duration::from_secs(90))
//!         .max_retries(3);
//!     let rt = Runtime::builder()
//!         .store(MemoryStore::new())
//!         .model("openai", OpenAiAdapter::new(config)?)
//!         .build()?;
//!     rt.shutdown().await
//! })
//! # }
//! ```

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::stream::{self, BoxStream, StreamExt};
use reqwest::header::{HeaderMap, ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Response, StatusCode, Url};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::content::{ContentBlock, Message, Role};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::CallId;
use crate::model::{
    fallback_call_id, BlockType, FinishReason, GenerateRequest, LlmAdapter, StreamChunk, ToolSchema,
};
use crate::session::{FailureCategory, LlmFailure, TokenUsage};

/// The `code` strings of the failures [`OpenAiAdapter`] reports. Match on these, never on the
/// message.
pub mod codes {
    /// The request's cancellation token fired (or the stream was cancelled mid-way).
    pub const ABORTED: &str = "ABORTED";
    /// The provider refused the credentials (`401`, `403`).
    pub const AUTH_FAILED: &str = "AUTH_FAILED";
    /// The provider's rate limit was hit (`429`), and retries, if any, did not help.
    pub const RATE_LIMITED: &str = "RATE_LIMITED";
    /// The account's quota or credit is exhausted (`insufficient_quota`); never retried.
    pub const INSUFFICIENT_QUOTA: &str = "INSUFFICIENT_QUOTA";
    /// The provider failed (`5xx`, `408`, or an error event inside the stream).
    pub const PROVIDER_ERROR: &str = "PROVIDER_ERROR";
    /// A connect, request or idle timeout elapsed.
    pub const TIMEOUT: &str = "TIMEOUT";
    /// No connection could be made to the provider.
    pub const CONNECT_FAILED: &str = "CONNECT_FAILED";
    /// The connection broke while sending the request or reading the body.
    pub const TRANSPORT_ERROR: &str = "TRANSPORT_ERROR";
    /// The response broke the protocol: a malformed event, invalid JSON, a truncated stream.
    pub const PROTOCOL_ERROR: &str = "PROTOCOL_ERROR";
    /// The provider refused the request itself (another `4xx`, such as an unknown model).
    pub const REQUEST_REJECTED: &str = "REQUEST_REJECTED";
}

/// How much of an error body is read.
const ERROR_BODY_LIMIT: usize = 64 * 1024;
/// The longest single event line or event the stream may hold before it is a protocol failure.
const EVENT_LIMIT: usize = 16 * 1024 * 1024;
/// How much of an unparsed error body goes into a failure message, in characters.
const MESSAGE_EXCERPT: usize = 500;

/// Where and how [`OpenAiAdapter`] calls the provider.
///
/// Built with [`OpenAiConfig::new`] and refined with the chained setters; every duration must
/// be non-zero. [`OpenAiAdapter::new`] validates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    base_url: String,
    model: String,
    api_key_env: Option<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    idle_timeout: Duration,
    max_retries: u32,
    backoff_base: Duration,
    backoff_cap: Duration,
    retry_after_cap: Duration,
}

impl OpenAiConfig {
    /// A configuration for the API under `base_url` (such as `https://api.openai.com/v1`; the
    /// adapter appends `/chat/completions`) calling `model` when a request names none.
    ///
    /// Defaults: no API key; connect timeout 10 s; request timeout (until the response headers)
    /// 60 s; idle timeout (between body reads) 120 s; 2 retries; backoff from 500 ms up to 8 s;
    /// `Retry-After` honored up to 60 s.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            api_key_env: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(120),
            max_retries: 2,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(8),
            retry_after_cap: Duration::from_secs(60),
        }
    }

    /// Reads the API key from the environment variable `name` when the adapter is built, and
    /// sends it as a bearer token. Only the variable's name is kept here.
    #[must_use]
    pub fn api_key_env(mut self, name: impl Into<String>) -> Self {
        self.api_key_env = Some(name.into());
        self
    }

    /// The longest wait to establish a connection (default 10 s).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The longest wait from sending a request until its response headers arrive (default
    /// 60 s). It does not bound the streamed body; see [`OpenAiConfig::idle_timeout`].
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The longest silence allowed between two reads of the streamed body (default 120 s).
    #[must_use]
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// How many times a retryable failure is retried before it is reported (default 2; `0`
    /// disables retries).
    #[must_use]
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// The exponential backoff: the first retry waits about `base`, each later one twice as
    /// long, never more than `cap` (defaults 500 ms and 8 s). Jitter keeps each wait between
    /// half and all of that.
    #[must_use]
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_cap = cap;
        self
    }

    /// The longest provider `Retry-After` the adapter waits for; a longer hint is cut to this
    /// (default 60 s).
    #[must_use]
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.retry_after_cap = cap;
        self
    }

    /// The API base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The model used when a request names none.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Checks the configuration without touching the environment or the network.
    ///
    /// # Errors
    /// `MODEL_UNAVAILABLE` when the base URL is not an absolute `http`/`https` URL, the model
    /// or the key variable's name is empty, a timeout is zero, or the backoff base exceeds its
    /// cap.
    pub fn validate(&self) -> Result<()> {
        self.endpoint()?;
        if self.model.trim().is_empty() {
            return Err(config_error("the model name is empty"));
        }
        if self
            .api_key_env
            .as_deref()
            .is_some_and(|name| name.trim().is_empty())
        {
            return Err(config_error("the API key variable's name is empty"));
        }
        for (what, timeout) in [
            ("connect", self.connect_timeout),
            ("request", self.request_timeout),
            ("idle", self.idle_timeout),
        ] {
            if timeout.is_zero() {
                return Err(config_error(format!("the {what} timeout is zero")));
            }
        }
        if self.backoff_base > self.backoff_cap {
            return Err(config_error("the backoff base exceeds the backoff cap"));
        }
        Ok(())
    }

    /// The chat-completions URL under the base URL.
    fn endpoint(&self) -> Result<Url> {
        let base = self.base_url.trim().trim_end_matches('/');
        let url = Url::parse(&format!("{base}/chat/completions")).map_err(|error| {
            config_error(format!(
                "the base URL {:?} is invalid: {error}",
                self.base_url
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(config_error(format!(
                "the base URL {:?} is not an http or https URL",
                self.base_url
            )));
        }
        Ok(url)
    }

    /// The wait before retry number `retry` (from 1): the provider's hint, capped, or else the
    /// jittered backoff.
    fn retry_delay(&self, retry: u32, provider_hint_ms: Option<u64>) -> Duration {
        match provider_hint_ms {
            Some(hint) => Duration::from_millis(hint).min(self.retry_after_cap),
            None => self.backoff_delay(retry),
        }
    }

    /// `base * 2^(retry-1)`, capped, then jittered into its upper half.
    fn backoff_delay(&self, retry: u32) -> Duration {
        let base = millis(self.backoff_base);
        let cap = millis(self.backoff_cap);
        let ceiling = base
            .saturating_mul(2u64.saturating_pow(retry.saturating_sub(1)))
            .min(cap);
        let floor = ceiling / 2;
        Duration::from_millis(floor.saturating_add(jitter(ceiling - floor, retry)))
    }
}

/// A configuration error.
fn config_error(message: impl Into<String>) -> SubagentError {
    SubagentError::new(ErrorCode::ModelUnavailable, message)
}

/// A duration in whole milliseconds, saturating.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A random number in `0..=max`, from the standard library's randomly keyed hasher.
fn jitter(max: u64, salt: u32) -> u64 {
    if max == 0 {
        return 0;
    }
    RandomState::new().hash_one(salt) % max.saturating_add(1)
}

/// The API key read from the environment; prints as `<redacted>`.
struct ApiKey(String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl ApiKey {
    /// Reads the key from the variable `name`. The value never appears in an error.
    fn from_env(name: &str) -> Result<Self> {
        // `VarError`'s own message would quote a non-Unicode value: never print it.
        let value = std::env::var(name).map_err(|error| match error {
            std::env::VarError::NotPresent => {
                config_error(format!("the API key variable {name} is not set"))
            }
            std::env::VarError::NotUnicode(_) => {
                config_error(format!("the API key variable {name} is not valid Unicode"))
            }
        })?;
        let value = value.trim();
        if value.is_empty() {
            return Err(config_error(format!(
                "the API key variable {name} is empty"
            )));
        }
        if !value.chars().all(|c| c.is_ascii_graphic()) {
            return Err(config_error(format!(
                "the API key in {name} holds characters an HTTP header cannot carry"
            )));
        }
        Ok(Self(value.to_owned()))
    }
}

/// An [`LlmAdapter`] for an OpenAI-compatible chat-completions endpoint.
///
/// Cheap to clone: clones share one HTTP client (and its connection pool). See the
/// [module documentation](crate::model::openai) for the wire mapping, retries, timeouts and
/// failures.
#[derive(Clone)]
pub struct OpenAiAdapter {
    inner: Arc<Inner>,
}

/// What every call of one adapter shares.
struct Inner {
    config: OpenAiConfig,
    endpoint: Url,
    api_key: Option<ApiKey>,
    client: reqwest::Client,
}

impl fmt::Debug for OpenAiAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiAdapter")
            .field("endpoint", &self.inner.endpoint.as_str())
            .field("config", &self.inner.config)
            .field("api_key", &self.inner.api_key)
            .finish()
    }
}

impl OpenAiAdapter {
    /// Validates `config`, reads the API key from its environment variable (when one is
    /// named) and builds the HTTP client.
    ///
    /// # Errors
    /// `MODEL_UNAVAILABLE` for an invalid configuration (see [`OpenAiConfig::validate`]), an
    /// unset, empty or unusable API key variable, or an HTTP client that cannot be built.
    ///
    /// # Panics
    /// Never.
    pub fn new(config: OpenAiConfig) -> Result<Self> {
        config.validate()?;
        let endpoint = config.endpoint()?;
        let api_key = config
            .api_key_env
            .as_deref()
            .map(ApiKey::from_env)
            .transpose()?;
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .user_agent(concat!("subagents/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| {
                config_error(format!("the HTTP client cannot be built: {error}")).with_source(error)
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                endpoint,
                api_key,
                client,
            }),
        })
    }

    /// The configuration this adapter was built from.
    pub fn config(&self) -> &OpenAiConfig {
        &self.inner.config
    }
}

impl LlmAdapter for OpenAiAdapter {
    fn stream(
        &self,
        request: GenerateRequest,
    ) -> BoxStream<'static, std::result::Result<StreamChunk, LlmFailure>> {
        let call = Call {
            dispatch: Dispatch {
                body: request_body(&self.inner.config, &request),
                inner: Arc::clone(&self.inner),
                cancel: request.cancel,
            },
            state: CallState::Start,
            pending: VecDeque::new(),
            failure: None,
        };
        stream::unfold(call, |mut call| async move {
            let item = call.next_item().await?;
            Some((item, call))
        })
        .fuse()
        .boxed()
    }
}

// ---------------------------------------------------------------------------------------------
// The request body.
// ---------------------------------------------------------------------------------------------

/// The JSON body of one chat-completions call.
fn request_body(config: &OpenAiConfig, request: &GenerateRequest) -> Value {
    let model = if request.model.trim().is_empty() {
        config.model.clone()
    } else {
        request.model.clone()
    };
    let mut body = Map::new();
    body.insert("model".into(), Value::String(model));
    body.insert(
        "messages".into(),
        Value::Array(wire_messages(request.system.as_deref(), &request.messages)),
    );
    body.insert("stream".into(), Value::Bool(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if !request.tools.is_empty() {
        body.insert(
            "tools".into(),
            Value::Array(request.tools.iter().map(wire_tool).collect()),
        );
    }
    if let Some(max_tokens) = request.max_tokens {
        body.insert("max_tokens".into(), Value::from(max_tokens));
    }
    Value::Object(body)
}

/// One tool as a `function` tool.
fn wire_tool(tool: &ToolSchema) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    })
}

/// The system prompt and the history as chat messages.
fn wire_messages(system: Option<&str>, messages: &[Message]) -> Vec<Value> {
    let mut wire = Vec::with_capacity(messages.len().saturating_add(1));
    if let Some(system) = system.filter(|system| !system.is_empty()) {
        wire.push(json!({"role": "system", "content": system}));
    }
    for message in messages {
        match message.role {
            Role::User => push_user(&mut wire, message),
            Role::Assistant => push_assistant(&mut wire, message),
        }
    }
    wire
}

/// A user-role message: each tool result as a `tool` message (they must directly follow the
/// assistant's calls), then the text, if any, as a `user` message.
fn push_user(wire: &mut Vec<Value>, message: &Message) {
    let mut text = String::new();
    for block in &message.content {
        match block {
            ContentBlock::Text { text: piece } => text.push_str(piece),
            ContentBlock::ToolResult {
                tool_call_id,
                content,
                ..
            } => wire.push(json!({
                "role": "tool",
                "tool_call_id": tool_call_id.as_str(),
                "content": plain_text(content),
            })),
            ContentBlock::Reasoning { .. } | ContentBlock::ToolCall { .. } => {}
        }
    }
    if !text.is_empty() {
        wire.push(json!({"role": "user", "content": text}));
    }
}

/// An assistant message: its text and its tool calls; reasoning is left out, and a message
/// with neither text nor calls is not sent.
fn push_assistant(wire: &mut Vec<Value>, message: &Message) {
    let mut text = String::new();
    let mut calls = Vec::new();
    for block in &message.content {
        match block {
            ContentBlock::Text { text: piece } => text.push_str(piece),
            ContentBlock::ToolCall {
                id,
                name,
                arguments,
            } => calls.push(json!({
                "id": id.as_str(),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            })),
            ContentBlock::Reasoning { .. } | ContentBlock::ToolResult { .. } => {}
        }
    }
    if text.is_empty() && calls.is_empty() {
        return;
    }
    let mut entry = Map::new();
    entry.insert("role".into(), Value::String("assistant".into()));
    entry.insert(
        "content".into(),
        if text.is_empty() {
            Value::Null
        } else {
            Value::String(text)
        },
    );
    if !calls.is_empty() {
        entry.insert("tool_calls".into(), Value::Array(calls));
    }
    wire.push(Value::Object(entry));
}

/// The text blocks of a tool result, concatenated.
fn plain_text(content: &[ContentBlock]) -> String {
    content.iter().filter_map(ContentBlock::as_text).collect()
}

// ---------------------------------------------------------------------------------------------
// One call: connect (with retries), then stream.
// ---------------------------------------------------------------------------------------------

/// The state of one streaming call, driven by `stream::unfold`.
struct Call {
    dispatch: Dispatch,
    state: CallState,
    /// Chunks decoded but not yet yielded (one event can give several).
    pending: VecDeque<StreamChunk>,
    /// A failure to yield once `pending` is drained.
    failure: Option<LlmFailure>,
}

/// What sending one call's request needs; shared (`&self`) by the attempts of that call.
struct Dispatch {
    inner: Arc<Inner>,
    body: Value,
    /// The caller's token; it owns the call until the stream ends or is dropped.
    cancel: CancellationToken,
}

/// Where a call is.
enum CallState {
    /// Nothing sent yet.
    Start,
    /// Response headers received; reading the event stream.
    Streaming(Box<Streaming>),
    /// Ended: finished, failed or aborted.
    Finished,
}

/// An accepted response being read.
struct Streaming {
    response: Response,
    decoder: SseDecoder,
    assembly: Assembly,
    request_id: Option<String>,
}

/// Whether the body has more to read.
enum Flow {
    More,
    End,
}

/// Whether a failed attempt may be retried.
enum Retry {
    Never,
    Allowed,
}

/// A failed attempt.
struct Rejected {
    failure: LlmFailure,
    retry: Retry,
}

impl Rejected {
    fn never(failure: LlmFailure) -> Self {
        Self {
            failure,
            retry: Retry::Never,
        }
    }
}

impl Call {
    /// The next stream item, or `None` once the call ended.
    async fn next_item(&mut self) -> Option<std::result::Result<StreamChunk, LlmFailure>> {
        loop {
            let ended = matches!(self.state, CallState::Finished)
                && self.pending.is_empty()
                && self.failure.is_none();
            if ended {
                return None;
            }
            if self.dispatch.cancel.is_cancelled() {
                self.pending.clear();
                self.failure = None;
                // Dropping the response closes the connection.
                self.state = CallState::Finished;
                return Some(Err(aborted()));
            }
            if let Some(chunk) = self.pending.pop_front() {
                return Some(Ok(chunk));
            }
            if let Some(failure) = self.failure.take() {
                return Some(Err(failure));
            }
            match std::mem::replace(&mut self.state, CallState::Finished) {
                CallState::Finished => return None,
                CallState::Start => match self.dispatch.connect().await {
                    Ok(streaming) => self.state = CallState::Streaming(streaming),
                    Err(failure) => self.failure = Some(failure),
                },
                CallState::Streaming(mut streaming) => match self.read(&mut streaming).await {
                    Ok(Flow::More) => self.state = CallState::Streaming(streaming),
                    Ok(Flow::End) => {}
                    Err(mut failure) => {
                        if failure.request_id.is_none() {
                            failure.request_id = streaming.request_id.take();
                        }
                        self.failure = Some(failure);
                    }
                },
            }
        }
    }

    /// Reads the next piece of the body and decodes it into `pending`.
    async fn read(&mut self, streaming: &mut Streaming) -> std::result::Result<Flow, LlmFailure> {
        let idle = self.dispatch.inner.config.idle_timeout;
        let read = tokio::select! {
            biased;
            () = self.dispatch.cancel.cancelled() => return Err(aborted()),
            read = tokio::time::timeout(idle, streaming.response.chunk()) => read,
        };
        let bytes = match read {
            Err(_elapsed) => {
                return Err(failure(
                    codes::TIMEOUT,
                    Some(FailureCategory::Provider),
                    format!(
                        "the model provider sent nothing for {} ms; the stream timed out",
                        millis(idle)
                    ),
                ))
            }
            Ok(Err(error)) => {
                return Err(failure(
                    if error.is_timeout() {
                        codes::TIMEOUT
                    } else {
                        codes::TRANSPORT_ERROR
                    },
                    Some(FailureCategory::Provider),
                    format!("the response stream broke off: {}", error_chain(&error)),
                ))
            }
            Ok(Ok(None)) => {
                streaming.decoder.finish()?;
                if !streaming.assembly.finished() {
                    return Err(protocol(
                        "the event stream ended before the provider finished the response",
                    ));
                }
                streaming.assembly.close(&mut self.pending);
                return Ok(Flow::End);
            }
            Ok(Ok(Some(bytes))) => bytes,
        };
        for data in streaming.decoder.feed(&bytes)? {
            if data.trim() == "[DONE]" {
                streaming.assembly.close(&mut self.pending);
                return Ok(Flow::End);
            }
            let chunk: ChunkBody = serde_json::from_str(&data)
                .map_err(|error| protocol(format!("a stream event is not valid JSON: {error}")))?;
            streaming.assembly.apply(chunk, &mut self.pending)?;
        }
        Ok(Flow::More)
    }
}

impl Dispatch {
    /// Sends the request until it is accepted, retrying what may be retried.
    async fn connect(&self) -> std::result::Result<Box<Streaming>, LlmFailure> {
        let config = &self.inner.config;
        let mut retries: u32 = 0;
        loop {
            let rejected = match self.attempt().await {
                Ok(streaming) => return Ok(streaming),
                Err(rejected) => rejected,
            };
            if matches!(rejected.retry, Retry::Never) || retries >= config.max_retries {
                return Err(rejected.failure);
            }
            retries = retries.saturating_add(1);
            let delay = config.retry_delay(retries, rejected.failure.provider_retry_after_ms);
            tracing::warn!(
                retry = retries,
                code = %rejected.failure.code,
                status = ?rejected.failure.status,
                delay_ms = millis(delay),
                "retrying the model call"
            );
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(aborted()),
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// One HTTP attempt, up to the response headers.
    async fn attempt(&self) -> std::result::Result<Box<Streaming>, Rejected> {
        let config = &self.inner.config;
        let mut builder = self
            .inner
            .client
            .post(self.inner.endpoint.clone())
            .header(ACCEPT, "text/event-stream")
            .json(&self.body);
        if let Some(key) = &self.inner.api_key {
            builder = builder.bearer_auth(&key.0);
        }
        let sent = tokio::select! {
            biased;
            () = self.cancel.cancelled() => return Err(Rejected::never(aborted())),
            sent = tokio::time::timeout(config.request_timeout, builder.send()) => sent,
        };
        let response = match sent {
            Err(_elapsed) => {
                return Err(Rejected::never(failure(
                    codes::TIMEOUT,
                    Some(FailureCategory::Provider),
                    format!(
                        "the model provider sent no response within {} ms; the request timed out",
                        millis(config.request_timeout)
                    ),
                )))
            }
            Ok(Err(error)) => return Err(transport_rejection(&error)),
            Ok(Ok(response)) => response,
        };
        let request_id = header_text(response.headers(), "x-request-id");
        if !response.status().is_success() {
            return Err(self.rejection(response, request_id).await);
        }
        let json_body = header_text(response.headers(), CONTENT_TYPE.as_str())
            .is_some_and(|kind| kind.trim_start().starts_with("application/json"));
        if json_body {
            return Err(Rejected::never(
                self.not_a_stream(response, request_id).await,
            ));
        }
        Ok(Box::new(Streaming {
            response,
            decoder: SseDecoder::default(),
            assembly: Assembly::default(),
            request_id,
        }))
    }

    /// Classifies a non-success response.
    async fn rejection(&self, mut response: Response, request_id: Option<String>) -> Rejected {
        let status = response.status();
        let retry_after = header_text(response.headers(), RETRY_AFTER.as_str())
            .and_then(|value| parse_retry_after(&value, SystemTime::now()));
        let Some(body) = self.read_error_body(&mut response).await else {
            return Rejected::never(aborted());
        };
        let detail = ProviderError::from_body(&body);
        let (code, category, retry) = if detail.is_quota() {
            (
                codes::INSUFFICIENT_QUOTA,
                Some(FailureCategory::Quota),
                Retry::Never,
            )
        } else {
            match status.as_u16() {
                401 | 403 => (
                    codes::AUTH_FAILED,
                    Some(FailureCategory::Auth),
                    Retry::Never,
                ),
                429 => (
                    codes::RATE_LIMITED,
                    Some(FailureCategory::Quota),
                    Retry::Allowed,
                ),
                408 => (
                    codes::TIMEOUT,
                    Some(FailureCategory::Provider),
                    Retry::Allowed,
                ),
                500..=599 => (
                    codes::PROVIDER_ERROR,
                    Some(FailureCategory::Provider),
                    Retry::Allowed,
                ),
                _ => (codes::REQUEST_REJECTED, None, Retry::Never),
            }
        };
        let mut failure = failure(
            code,
            category,
            format!(
                "the model provider answered HTTP {}: {}",
                status.as_u16(),
                detail.describe(status)
            ),
        );
        failure.status = Some(status.as_u16());
        failure.provider_retry_after_ms = retry_after.map(millis);
        failure.request_id = request_id;
        Rejected { failure, retry }
    }

    /// A success status with a JSON body where an event stream was asked for.
    async fn not_a_stream(&self, mut response: Response, request_id: Option<String>) -> LlmFailure {
        let status = response.status();
        let Some(body) = self.read_error_body(&mut response).await else {
            return aborted();
        };
        let detail = ProviderError::from_body(&body);
        let mut failure = failure(
            codes::PROTOCOL_ERROR,
            Some(FailureCategory::Protocol),
            format!(
                "the model provider answered with JSON instead of an event stream: {}",
                detail.describe(status)
            ),
        );
        failure.status = Some(status.as_u16());
        failure.request_id = request_id;
        failure
    }

    /// Reads (a bounded prefix of) an error body; `None` when cancelled. A body that cannot be
    /// read in time is treated as empty.
    async fn read_error_body(&self, response: &mut Response) -> Option<String> {
        let limit = self.inner.config.request_timeout;
        let read = tokio::select! {
            biased;
            () = self.cancel.cancelled() => return None,
            read = tokio::time::timeout(limit, read_limited(response)) => read,
        };
        Some(match read {
            Ok(Ok(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            Ok(Err(_)) | Err(_) => String::new(),
        })
    }
}

/// Reads up to `ERROR_BODY_LIMIT` bytes of a body.
async fn read_limited(response: &mut Response) -> reqwest::Result<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let take = ERROR_BODY_LIMIT.saturating_sub(body.len()).min(chunk.len());
        body.extend_from_slice(&chunk[..take]);
        if body.len() >= ERROR_BODY_LIMIT {
            break;
        }
    }
    Ok(body)
}

/// A transport error before the response headers.
fn transport_rejection(error: &reqwest::Error) -> Rejected {
    let chain = error_chain(error);
    if error.is_connect() {
        return Rejected {
            failure: failure(
                codes::CONNECT_FAILED,
                Some(FailureCategory::Provider),
                format!("could not connect to the model provider: {chain}"),
            ),
            retry: Retry::Allowed,
        };
    }
    if error.is_timeout() {
        return Rejected::never(failure(
            codes::TIMEOUT,
            Some(FailureCategory::Provider),
            format!("the request to the model provider timed out: {chain}"),
        ));
    }
    Rejected::never(failure(
        codes::TRANSPORT_ERROR,
        Some(FailureCategory::Provider),
        format!("the request to the model provider failed: {chain}"),
    ))
}

/// An error and its causes, joined.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A header's value as text, when present and visible ASCII.
fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

/// A failure with a code, a category and a message.
fn failure(
    code: &str,
    category: Option<FailureCategory>,
    message: impl Into<String>,
) -> LlmFailure {
    let mut failure = LlmFailure::new(code, message);
    failure.category = category;
    failure
}

/// A protocol failure.
fn protocol(message: impl Into<String>) -> LlmFailure {
    failure(
        codes::PROTOCOL_ERROR,
        Some(FailureCategory::Protocol),
        message,
    )
}

/// The failure a cancelled call ends with.
fn aborted() -> LlmFailure {
    LlmFailure::new(codes::ABORTED, "the model call was cancelled")
}

// ---------------------------------------------------------------------------------------------
// Provider error bodies.
// ---------------------------------------------------------------------------------------------

/// What a provider said about a failure: `{"error": {"message", "type", "code"}}` or
/// `{"error": "message"}`, or failing that the raw body.
#[derive(Debug, Default)]
struct ProviderError {
    message: Option<String>,
    kind: Option<String>,
    code: Option<String>,
    raw: String,
}

impl ProviderError {
    /// Parses an error body; anything unparseable is kept raw.
    fn from_body(body: &str) -> Self {
        let parsed = serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|value| value.get("error").map(Self::from_error));
        let mut detail = parsed.unwrap_or_default();
        detail.raw = body.trim().chars().take(MESSAGE_EXCERPT).collect();
        detail
    }

    /// Reads an `error` value.
    fn from_error(error: &Value) -> Self {
        let as_text = |value: Option<&Value>| match value {
            Some(Value::String(text)) => Some(text.clone()),
            Some(Value::Number(number)) => Some(number.to_string()),
            _ => None,
        };
        match error {
            Value::String(message) => Self {
                message: Some(message.clone()),
                ..Self::default()
            },
            Value::Object(fields) => Self {
                message: as_text(fields.get("message")),
                kind: as_text(fields.get("type")),
                code: as_text(fields.get("code")),
                raw: String::new(),
            },
            _ => Self::default(),
        }
    }

    /// Whether the account's quota is exhausted (retrying cannot help).
    fn is_quota(&self) -> bool {
        [&self.code, &self.kind]
            .into_iter()
            .any(|field| field.as_deref() == Some("insufficient_quota"))
    }

    /// The provider's message, else the raw body, else the status's reason.
    fn describe(&self, status: StatusCode) -> String {
        if let Some(message) = self.message.as_deref().filter(|m| !m.trim().is_empty()) {
            return match self.code.as_deref().or(self.kind.as_deref()) {
                Some(code) => format!("{message} ({code})"),
                None => message.to_owned(),
            };
        }
        if !self.raw.is_empty() {
            return self.raw.clone();
        }
        status
            .canonical_reason()
            .unwrap_or("no error message")
            .to_owned()
    }
}

// ---------------------------------------------------------------------------------------------
// Retry-After.
// ---------------------------------------------------------------------------------------------

/// A `Retry-After` value (delay seconds, or an IMF-fixdate HTTP date) as a wait from `now`.
/// Anything else is ignored.
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = parse_http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Parses an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form HTTP/1.1 senders must
/// use; the obsolete forms are not accepted.
fn parse_http_date(value: &str) -> Option<SystemTime> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let parts: Vec<&str> = value.split_ascii_whitespace().collect();
    let [weekday, day, month, year, time, zone] = parts.as_slice() else {
        return None;
    };
    if !weekday.ends_with(',') || *zone != "GMT" {
        return None;
    }
    let day: u32 = day.parse().ok().filter(|day| (1..=31).contains(day))?;
    let month = MONTHS.iter().position(|name| name == month)?;
    let month = u32::try_from(month).ok()?.checked_add(1)?;
    let year: i64 = year.parse().ok().filter(|year| (1..=9999).contains(year))?;
    let clock: Vec<&str> = time.split(':').collect();
    let [hour, minute, second] = clock.as_slice() else {
        return None;
    };
    let hour: i64 = hour.parse().ok().filter(|hour| (0..24).contains(hour))?;
    let minute: i64 = minute
        .parse()
        .ok()
        .filter(|minute| (0..60).contains(minute))?;
    let second: i64 = second
        .parse()
        .ok()
        .filter(|second| (0..=60).contains(second))?;
    let days = days_from_civil(year, month, day);
    let seconds = days
        .checked_mul(86_400)?
        .checked_add(hour * 3_600 + minute * 60 + second)?;
    let seconds = u64::try_from(seconds).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (i64::from(month) + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

// ---------------------------------------------------------------------------------------------
// Server-sent events.
// ---------------------------------------------------------------------------------------------

/// Splits a byte stream into server-sent events and yields each event's `data`.
///
/// Lines end with `\n` (a `\r` before it is dropped). `data:` lines of one event are joined
/// with `\n`; an empty line ends the event; comment lines (`:`) and other fields (`event`,
/// `id`, `retry`) are ignored.
#[derive(Debug, Default)]
struct SseDecoder {
    /// Bytes after the last complete line.
    buffer: Vec<u8>,
    /// The data of the event being read.
    data: Option<String>,
}

impl SseDecoder {
    /// Feeds bytes; returns the data of every event they complete.
    fn feed(&mut self, bytes: &[u8]) -> std::result::Result<Vec<String>, LlmFailure> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(newline) = self.buffer.iter().position(|&byte| byte == b'\n') {
            let mut line: Vec<u8> = self.buffer.drain(..=newline).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8(line)
                .map_err(|_| protocol("a stream event is not valid UTF-8"))?;
            if let Some(data) = self.line(&line) {
                events.push(data);
            }
        }
        let held = self
            .buffer
            .len()
            .saturating_add(self.data.as_ref().map_or(0, String::len));
        if held > EVENT_LIMIT {
            return Err(protocol(format!(
                "a stream event exceeds {EVENT_LIMIT} bytes"
            )));
        }
        Ok(events)
    }

    /// Takes one line; returns the event's data when the line ends an event.
    fn line(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            return self.data.take();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
        None
    }

    /// Checks that the body ended between events.
    fn finish(&self) -> std::result::Result<(), LlmFailure> {
        if self.buffer.is_empty() && self.data.is_none() {
            Ok(())
        } else {
            Err(protocol("the event stream ended mid-event"))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Chunk objects and their assembly into blocks.
// ---------------------------------------------------------------------------------------------

/// A `chat.completion.chunk` (only the fields the adapter reads; all optional, nulls allowed).
#[derive(Deserialize)]
struct ChunkBody {
    choices: Option<Vec<ChoiceBody>>,
    usage: Option<UsageBody>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChoiceBody {
    index: Option<u64>,
    delta: Option<DeltaBody>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct DeltaBody {
    content: Option<String>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    tool_calls: Option<Vec<ToolCallBody>>,
}

#[derive(Deserialize)]
struct ToolCallBody {
    index: Option<u64>,
    id: Option<String>,
    function: Option<FunctionBody>,
}

#[derive(Deserialize)]
struct FunctionBody {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct UsageBody {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    reasoning_tokens: Option<u64>,
}

impl UsageBody {
    /// Disjoint counts: cached prompt tokens and reasoning tokens are split out.
    fn token_usage(&self) -> TokenUsage {
        let cache_read = self
            .prompt_tokens_details
            .as_ref()
            .and_then(|details| details.cached_tokens);
        let reasoning = self
            .completion_tokens_details
            .as_ref()
            .and_then(|details| details.reasoning_tokens);
        TokenUsage {
            input_tokens: self
                .prompt_tokens
                .unwrap_or(0)
                .saturating_sub(cache_read.unwrap_or(0)),
            output_tokens: self
                .completion_tokens
                .unwrap_or(0)
                .saturating_sub(reasoning.unwrap_or(0)),
            cache_read,
            cache_write: None,
            reasoning,
        }
    }
}

/// Maps a provider `finish_reason`.
fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "length" => FinishReason::MaxTokens,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::Refusal,
        _ => FinishReason::Stop,
    }
}

/// Which text-like block a delta extends.
#[derive(Clone, Copy)]
enum TextKind {
    Text,
    Reasoning,
}

/// A text or reasoning block being streamed.
struct TextBlock {
    index: u32,
    text: String,
}

/// A tool call being streamed.
struct CallBlock {
    index: u32,
    id: String,
    name: String,
    arguments: String,
}

/// Turns the deltas of one response into chunks, numbering blocks as they first appear.
#[derive(Default)]
struct Assembly {
    next_index: u32,
    reasoning: Option<TextBlock>,
    text: Option<TextBlock>,
    /// Tool calls by the provider's call index.
    calls: BTreeMap<u64, CallBlock>,
    /// The provider index of the call the last delta extended.
    last_call: Option<u64>,
    finish: Option<FinishReason>,
}

impl Assembly {
    /// Whether the provider sent a `finish_reason`.
    fn finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Applies one chunk object, queuing what it yields.
    fn apply(
        &mut self,
        chunk: ChunkBody,
        out: &mut VecDeque<StreamChunk>,
    ) -> std::result::Result<(), LlmFailure> {
        if let Some(error) = chunk.error.filter(|error| !error.is_null()) {
            let detail = ProviderError::from_error(&error);
            let (code, category) = if detail.is_quota() {
                (codes::INSUFFICIENT_QUOTA, FailureCategory::Quota)
            } else {
                (codes::PROVIDER_ERROR, FailureCategory::Provider)
            };
            let message = detail
                .message
                .unwrap_or_else(|| "the provider reported an error mid-stream".to_owned());
            return Err(failure(
                code,
                Some(category),
                format!("the model provider failed mid-stream: {message}"),
            ));
        }
        if let Some(usage) = &chunk.usage {
            out.push_back(StreamChunk::Usage {
                usage: usage.token_usage(),
            });
        }
        let choice = chunk
            .choices
            .unwrap_or_default()
            .into_iter()
            .find(|choice| choice.index.unwrap_or(0) == 0);
        let Some(choice) = choice else {
            return Ok(());
        };
        if let Some(delta) = choice.delta {
            let reasoning = [delta.reasoning_content, delta.reasoning]
                .into_iter()
                .flatten()
                .find(|text| !text.is_empty());
            if let Some(text) = reasoning {
                self.append_text(TextKind::Reasoning, text, out)?;
            }
            if let Some(text) = delta.content.filter(|text| !text.is_empty()) {
                self.append_text(TextKind::Text, text, out)?;
            }
            for call in delta.tool_calls.unwrap_or_default() {
                self.append_call(call, out)?;
            }
        }
        if let Some(reason) = choice.finish_reason {
            self.finish = Some(finish_reason(&reason));
        }
        Ok(())
    }

    /// Ends the response: every block's `block-end` in index order, then `finish` when the
    /// provider sent a reason.
    fn close(&mut self, out: &mut VecDeque<StreamChunk>) {
        let mut blocks: Vec<(u32, ContentBlock)> = Vec::new();
        if let Some(block) = self.reasoning.take() {
            blocks.push((block.index, ContentBlock::Reasoning { text: block.text }));
        }
        if let Some(block) = self.text.take() {
            blocks.push((block.index, ContentBlock::Text { text: block.text }));
        }
        for call in std::mem::take(&mut self.calls).into_values() {
            let id = if call.id.is_empty() {
                fallback_call_id(call.index)
            } else {
                CallId::new(call.id)
            };
            blocks.push((
                call.index,
                ContentBlock::ToolCall {
                    id,
                    name: call.name,
                    arguments: call.arguments,
                },
            ));
        }
        blocks.sort_by_key(|(index, _)| *index);
        out.extend(
            blocks
                .into_iter()
                .map(|(index, block)| StreamChunk::BlockEnd { index, block }),
        );
        if let Some(reason) = self.finish.take() {
            out.push_back(StreamChunk::Finish { reason });
        }
    }

    /// The next block index.
    fn open(&mut self) -> std::result::Result<u32, LlmFailure> {
        let index = self.next_index;
        self.next_index = index
            .checked_add(1)
            .ok_or_else(|| protocol("the response has too many blocks"))?;
        Ok(index)
    }

    fn slot(&mut self, kind: TextKind) -> &mut Option<TextBlock> {
        match kind {
            TextKind::Text => &mut self.text,
            TextKind::Reasoning => &mut self.reasoning,
        }
    }

    /// Extends the text or reasoning block, opening it first if needed.
    fn append_text(
        &mut self,
        kind: TextKind,
        text: String,
        out: &mut VecDeque<StreamChunk>,
    ) -> std::result::Result<(), LlmFailure> {
        let existing = self.slot(kind).as_ref().map(|block| block.index);
        let index = match existing {
            Some(index) => index,
            None => {
                let index = self.open()?;
                let block_type = match kind {
                    TextKind::Text => BlockType::Text,
                    TextKind::Reasoning => BlockType::Reasoning,
                };
                out.push_back(StreamChunk::BlockStart { index, block_type });
                *self.slot(kind) = Some(TextBlock {
                    index,
                    text: String::new(),
                });
                index
            }
        };
        if let Some(block) = self.slot(kind).as_mut() {
            block.text.push_str(&text);
        }
        out.push_back(match kind {
            TextKind::Text => StreamChunk::TextDelta { index, text },
            TextKind::Reasoning => StreamChunk::ReasoningDelta { index, text },
        });
        Ok(())
    }

    /// Extends a tool call, opening it first if needed.
    fn append_call(
        &mut self,
        call: ToolCallBody,
        out: &mut VecDeque<StreamChunk>,
    ) -> std::result::Result<(), LlmFailure> {
        let id = call.id.unwrap_or_default();
        let (name, arguments) = call
            .function
            .map(|function| {
                (
                    function.name.unwrap_or_default(),
                    function.arguments.unwrap_or_default(),
                )
            })
            .unwrap_or_default();
        let key = self.call_key(call.index, &id);
        let existing = self.calls.get(&key).map(|block| block.index);
        let index = match existing {
            Some(index) => index,
            None => {
                let index = self.open()?;
                out.push_back(StreamChunk::BlockStart {
                    index,
                    block_type: BlockType::ToolCall,
                });
                self.calls.insert(
                    key,
                    CallBlock {
                        index,
                        id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    },
                );
                index
            }
        };
        if let Some(block) = self.calls.get_mut(&key) {
            if block.id.is_empty() {
                block.id.clone_from(&id);
            }
            if block.name.is_empty() {
                block.name.clone_from(&name);
            }
            block.arguments.push_str(&arguments);
        }
        self.last_call = Some(key);
        let carries_news = !id.is_empty() || !name.is_empty() || !arguments.is_empty();
        if carries_news {
            out.push_back(StreamChunk::ToolCallDelta {
                index,
                id,
                name: (!name.is_empty()).then_some(name),
                arguments_delta: arguments,
            });
        }
        Ok(())
    }

    /// The provider index of a call delta; a provider that omits the index continues the last
    /// call unless the delta brings a new id.
    fn call_key(&self, index: Option<u64>, id: &str) -> u64 {
        if let Some(index) = index {
            return index;
        }
        let last = self
            .last_call
            .and_then(|key| self.calls.get(&key).map(|block| (key, block)));
        match last {
            Some((key, block)) if id.is_empty() || block.id == id => key,
            _ => self
                .calls
                .keys()
                .next_back()
                .map_or(0, |key| key.saturating_add(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(pieces: &[&str]) -> (Vec<String>, SseDecoder) {
        let mut decoder = SseDecoder::default();
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(decoder.feed(piece.as_bytes()).unwrap());
        }
        (events, decoder)
    }

    #[test]
    fn sse_events_split_across_reads_join_their_data_lines() {
        let (events, decoder) = decode(&[
            ": keep-alive\n\nda",
            "ta: {\"a\":\r\ndata: 1}\r\n",
            "\r\nevent: message\nid: 7\ndata:[DONE]\n\n",
        ]);
        assert_eq!(events, ["{\"a\":\n1}", "[DONE]"]);
        assert!(decoder.finish().is_ok(), "the body ended between events");
    }

    #[test]
    fn a_body_ending_mid_event_is_a_protocol_failure() {
        let (_, partial_line) = decode(&["data: {\"choi"]);
        let (_, unterminated) = decode(&["data: {}\n"]);
        for decoder in [partial_line, unterminated] {
            let failure = decoder.finish().unwrap_err();
            assert_eq!(failure.category, Some(FailureCategory::Protocol));
        }
    }

    #[test]
    fn invalid_utf8_is_a_protocol_failure() {
        let failure = SseDecoder::default().feed(b"data: \xff\n\n").unwrap_err();
        assert_eq!(failure.code, codes::PROTOCOL_ERROR);
    }

    #[test]
    fn retry_after_takes_seconds_or_an_http_date() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_770);
        assert_eq!(parse_retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse_retry_after(
                "Sun, 06 Nov 1994 08:49:37 GMT",
                now + Duration::from_secs(60)
            ),
            Some(Duration::ZERO),
            "a date in the past means retry now"
        );
        for garbage in ["soon", "-1", "Sun, 06 Foo 1994 08:49:37 GMT", "1.5", ""] {
            assert_eq!(parse_retry_after(garbage, now), None, "{garbage:?}");
        }
    }

    #[test]
    fn http_dates_match_known_epochs() {
        assert_eq!(
            parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"),
            Some(UNIX_EPOCH)
        );
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2000 12:00:00 GMT"),
            Some(UNIX_EPOCH + Duration::from_secs(951_825_600))
        );
    }

    #[test]
    fn backoff_grows_jittered_and_capped() {
        let config = OpenAiConfig::new("http://localhost/v1", "m")
            .backoff(Duration::from_millis(100), Duration::from_millis(1_000));
        for _ in 0..50 {
            let first = config.backoff_delay(1);
            assert!((Duration::from_millis(50)..=Duration::from_millis(100)).contains(&first));
            let third = config.backoff_delay(3);
            assert!((Duration::from_millis(200)..=Duration::from_millis(400)).contains(&third));
            let late = config.backoff_delay(40);
            assert!((Duration::from_millis(500)..=Duration::from_millis(1_000)).contains(&late));
        }
        assert_eq!(
            config.retry_delay(1, Some(120_000)),
            Duration::from_secs(60),
            "a provider hint is capped"
        );
    }

    #[test]
    fn finish_reasons_map_to_the_crate_vocabulary() {
        assert_eq!(finish_reason("stop"), FinishReason::Stop);
        assert_eq!(finish_reason("length"), FinishReason::MaxTokens);
        assert_eq!(finish_reason("tool_calls"), FinishReason::ToolCalls);
        assert_eq!(finish_reason("function_call"), FinishReason::ToolCalls);
        assert_eq!(finish_reason("content_filter"), FinishReason::Refusal);
        assert_eq!(finish_reason("eos"), FinishReason::Stop);
    }

    #[test]
    fn a_call_delta_without_an_index_continues_the_last_call() {
        let mut assembly = Assembly::default();
        let mut out = VecDeque::new();
        for body in [
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"g"}}]},"finish_reason":"tool_calls"}]}"#,
        ] {
            assembly
                .apply(serde_json::from_str(body).unwrap(), &mut out)
                .unwrap();
        }
        assembly.close(&mut out);
        let ends: Vec<_> = out
            .into_iter()
            .filter_map(|chunk| match chunk {
                StreamChunk::BlockEnd { block, .. } => Some(block),
                _ => None,
            })
            .collect();
        assert_eq!(
            ends,
            [
                ContentBlock::ToolCall {
                    id: CallId::new("a"),
                    name: "f".into(),
                    arguments: "{}".into()
                },
                ContentBlock::ToolCall {
                    id: CallId::new("b"),
                    name: "g".into(),
                    arguments: String::new()
                },
            ]
        );
    }

    #[test]
    fn error_bodies_yield_their_message_and_quota_flag() {
        let detail = ProviderError::from_body(
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
        );
        assert!(detail.is_quota());
        assert_eq!(
            detail.describe(StatusCode::TOO_MANY_REQUESTS),
            "You exceeded your current quota (insufficient_quota)"
        );
        let raw = ProviderError::from_body("upstream exploded");
        assert!(!raw.is_quota());
        assert_eq!(raw.describe(StatusCode::BAD_GATEWAY), "upstream exploded");
        assert_eq!(
            ProviderError::from_body("").describe(StatusCode::BAD_GATEWAY),
            "Bad Gateway"
        );
    }

    #[test]
    fn the_config_is_validated() {
        let valid = OpenAiConfig::new("http://127.0.0.1:1/v1/", "m");
        assert!(valid.validate().is_ok());
        assert_eq!(
            valid.endpoint().unwrap().as_str(),
            "http://127.0.0.1:1/v1/chat/completions"
        );
        for invalid in [
            OpenAiConfig::new("not a url", "m"),
            OpenAiConfig::new("ftp://host/v1", "m"),
            OpenAiConfig::new("http://host/v1", " "),
            OpenAiConfig::new("http://host/v1", "m").idle_timeout(Duration::ZERO),
            OpenAiConfig::new("http://host/v1", "m")
                .backoff(Duration::from_secs(2), Duration::from_secs(1)),
            OpenAiConfig::new("http://host/v1", "m").api_key_env(""),
        ] {
            let error = invalid.validate().unwrap_err();
            assert_eq!(error.code(), ErrorCode::ModelUnavailable, "{invalid:?}");
        }
    }
}
