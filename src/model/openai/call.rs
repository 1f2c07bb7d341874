//! Provides one model call: sending, retrying with backoff, and reading the streamed body.

use super::*;

/// The state of one streaming call, driven by `stream::unfold`.
pub(super) struct Call {
    pub(super) dispatch: Dispatch,
    pub(super) state: CallState,
    /// Chunks decoded but not yet yielded (one event can give several).
    pub(super) pending: VecDeque<StreamChunk>,
    /// A failure to yield once `pending` is drained.
    pub(super) failure: Option<LlmFailure>,
}

/// What sending one call's request needs; shared (`&self`) by the attempts of that call.
pub(super) struct Dispatch {
    pub(super) inner: Arc<Inner>,
    pub(super) body: Value,
    /// The caller's token; it owns the call until the stream ends or is dropped.
    pub(super) cancel: CancellationToken,
}

/// Where a call is.
pub(super) enum CallState {
    /// Nothing sent yet.
    Start,
    /// Response headers received; reading the event stream.
    Streaming(Box<Streaming>),
    /// Ended: finished, failed or aborted.
    Finished,
}

/// An accepted response being read.
pub(super) struct Streaming {
    pub(super) response: Response,
    pub(super) decoder: SseDecoder,
    pub(super) assembly: Assembly,
    pub(super) request_id: Option<String>,
}

/// Whether the body has more to read.
pub(super) enum Flow {
    More,
    End,
}

/// Whether a failed attempt may be retried.
pub(super) enum Retry {
    Never,
    Allowed,
}

/// A failed attempt.
pub(super) struct Rejected {
    pub(super) failure: LlmFailure,
    pub(super) retry: Retry,
}

impl Rejected {
    pub(super) fn never(failure: LlmFailure) -> Self {
        Self {
            failure,
            retry: Retry::Never,
        }
    }
}

impl Call {
    /// The next stream item, or `None` once the call ended.
    pub(super) async fn next_item(
        &mut self,
    ) -> Option<std::result::Result<StreamChunk, LlmFailure>> {
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
            read = patiently(
                streaming.response.chunk(),
                idle,
                self.dispatch.inner.config.wait_notice,
                "the next piece of the model's response",
            ) => read,
        };
        let bytes = match read {
            None => {
                return Err(failure(
                    codes::TIMEOUT,
                    Some(FailureCategory::Provider),
                    format!(
                        "the model provider sent nothing for {} ms; the stream timed out",
                        millis(idle)
                    ),
                ))
            }
            Some(Err(error)) => {
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
            Some(Ok(None)) => {
                streaming.decoder.finish()?;
                if !streaming.assembly.finished() {
                    return Err(protocol(
                        "the event stream ended before the provider finished the response",
                    ));
                }
                streaming.assembly.close(&mut self.pending);
                return Ok(Flow::End);
            }
            Some(Ok(Some(bytes))) => bytes,
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

/// Awaits `work` for at most `limit`; `None` when `limit` passed first. Every `every` of the
/// wait (never when zero) it says on the log what it is waiting for and how long it has: a
/// person watching a slow provider otherwise sees a hang.
async fn patiently<T>(
    work: impl std::future::Future<Output = T>,
    limit: Duration,
    every: Duration,
    waiting_for: &'static str,
) -> Option<T> {
    let began = tokio::time::Instant::now();
    // A limit too far to be an instant is no limit.
    let deadline = began.checked_add(limit);
    tokio::pin!(work);
    loop {
        let notice = (!every.is_zero())
            .then(|| tokio::time::Instant::now().checked_add(every))
            .flatten();
        let (wake, at_deadline) = match (notice, deadline) {
            (Some(notice), Some(deadline)) if notice < deadline => (Some(notice), false),
            (_, Some(deadline)) => (Some(deadline), true),
            (notice, None) => (notice, false),
        };
        let woken = async {
            match wake {
                Some(wake) => tokio::time::sleep_until(wake).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // What finished wins over a deadline reached in the same instant.
            biased;
            done = &mut work => return Some(done),
            () = woken => {
                if at_deadline {
                    return None;
                }
                tracing::warn!(
                    waited_ms = millis(began.elapsed()),
                    limit_ms = millis(limit),
                    "still waiting for {waiting_for}"
                );
            }
        }
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
            sent = patiently(
                builder.send(),
                config.request_timeout,
                config.wait_notice,
                "the model's response to start",
            ) => sent,
        };
        let response = match sent {
            None => {
                return Err(Rejected::never(failure(
                    codes::TIMEOUT,
                    Some(FailureCategory::Provider),
                    format!(
                        "the model provider sent no response within {} ms; the request timed out",
                        millis(config.request_timeout)
                    ),
                )))
            }
            Some(Err(error)) => return Err(transport_rejection(&error)),
            Some(Ok(response)) => response,
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
        let hint = if status == StatusCode::NOT_FOUND {
            missing_version_hint(&self.inner.endpoint)
        } else {
            String::new()
        };
        let mut failure = failure(
            code,
            category,
            format!(
                "the model provider answered HTTP {}: {}{hint}",
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
pub(super) fn transport_rejection(error: &reqwest::Error) -> Rejected {
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
pub(super) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
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
pub(super) fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

/// A failure with a code, a category and a message.
pub(super) fn failure(
    code: &str,
    category: Option<FailureCategory>,
    message: impl Into<String>,
) -> LlmFailure {
    let mut failure = LlmFailure::new(code, message);
    failure.category = category;
    failure
}

/// A protocol failure.
pub(super) fn protocol(message: impl Into<String>) -> LlmFailure {
    failure(
        codes::PROTOCOL_ERROR,
        Some(FailureCategory::Protocol),
        message,
    )
}

/// The failure a cancelled call ends with.
pub(super) fn aborted() -> LlmFailure {
    LlmFailure::new(codes::ABORTED, "the model call was cancelled")
}

// ---------------------------------------------------------------------------------------------
// Provider error bodies.
// ---------------------------------------------------------------------------------------------

/// What a provider said about a failure: `{"error": {"message", "type", "code"}}` or
/// `{"error": "message"}`, or failing that the raw body.
#[derive(Debug, Default)]
pub(super) struct ProviderError {
    pub(super) message: Option<String>,
    pub(super) kind: Option<String>,
    pub(super) code: Option<String>,
    pub(super) raw: String,
}

impl ProviderError {
    /// Parses an error body; anything unparseable is kept raw.
    pub(super) fn from_body(body: &str) -> Self {
        let parsed = serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|value| value.get("error").map(Self::from_error));
        let mut detail = parsed.unwrap_or_default();
        detail.raw = body.trim().chars().take(MESSAGE_EXCERPT).collect();
        detail
    }

    /// Reads an `error` value.
    pub(super) fn from_error(error: &Value) -> Self {
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
    pub(super) fn is_quota(&self) -> bool {
        [&self.code, &self.kind]
            .into_iter()
            .any(|field| field.as_deref() == Some("insufficient_quota"))
    }

    /// The provider's message, else the raw body, else the status's reason.
    pub(super) fn describe(&self, status: StatusCode) -> String {
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

/// For a `404` from `endpoint`: a hint when its base URL names no API version (`/v1`), the
/// commonest reason an OpenAI-compatible endpoint is not found; empty otherwise.
fn missing_version_hint(endpoint: &reqwest::Url) -> String {
    let base = endpoint
        .as_str()
        .trim_end_matches("/chat/completions")
        .trim_end_matches('/');
    let versioned = endpoint.path_segments().is_some_and(|mut segments| {
        segments.any(|segment| {
            segment.len() > 1
                && segment.starts_with('v')
                && segment[1..].bytes().all(|b| b.is_ascii_digit())
        })
    });
    if versioned {
        String::new()
    } else {
        format!(
            " ({endpoint} was not found: OpenAI-compatible APIs are usually served under a \
             version, so the base URL may be missing /v1, as in {base}/v1)"
        )
    }
}
