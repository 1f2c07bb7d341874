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
//! keeps sending. A timeout is never retried. While a request or an idle wait runs, the call
//! logs `still waiting for …` at `WARN` every [`OpenAiConfig::wait_notice`] (10 s by default), with
//! how long it has waited.
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

mod assembly;
mod call;
mod config;
mod retry_after;
mod sse;
mod wire;

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

use assembly::*;
use call::*;
pub use config::OpenAiConfig;
use config::*;
use retry_after::*;
use sse::*;
use wire::*;

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
