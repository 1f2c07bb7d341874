//! The OpenAI-compatible adapter against a scripted local HTTP server: streamed text, reasoning
//! and tool calls, usage, finish reasons, retries, cancellation, timeouts, malformed streams,
//! the request body, the API key, and one turn through the runtime.
//!
//! Each test starts its own server on `127.0.0.1:0`. It answers one connection per scripted
//! `Reply`, in order, and records every request. A reply can hold on a gate (a `Notify`) that
//! the test never releases, so ordering comes from gates and the stream itself, never from
//! sleeping.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use subagents::model::openai::{codes, OpenAiAdapter, OpenAiConfig};
use subagents::model::{BlockAssembler, BlockType, FinishReason, StreamChunk, ToolSchema};
use subagents::session::{final_assistant_output, FailureCategory, LlmFailure, TokenUsage};
use subagents::{
    CallId, ContentBlock, CreateAgent, ErrorCode, EventKind, GenerateRequest, LlmAdapter,
    MemoryStore, Message, MessageSource, Runtime, TurnEndReason,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::support::{run_prompt, within};

// ---------------------------------------------------------------------------------------------
// The scripted server.
// ---------------------------------------------------------------------------------------------

/// One request as the server read it.
#[derive(Debug, Clone)]
struct Recorded {
    request_line: String,
    /// Lower-cased names.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Recorded {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(candidate, _)| candidate == name)
            .map(|(_, value)| value.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("the request body is JSON")
    }
}

/// One piece of a scripted response body.
enum Part {
    /// Written (and flushed to the socket) as one write.
    Bytes(Vec<u8>),
    /// Waits until the gate is released.
    Hold(Arc<Notify>),
}

/// One scripted HTTP response. Every response closes its connection, so a streamed body ends
/// when the server closes the socket.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    /// Held before the status line is written.
    stall: Option<Arc<Notify>>,
    parts: Vec<Part>,
}

impl Reply {
    /// A `200` event stream with no body yet.
    fn stream() -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            stall: None,
            parts: Vec::new(),
        }
    }

    /// A `200` event stream: one write per event, then `data: [DONE]`.
    fn events(events: &[Value]) -> Self {
        events
            .iter()
            .fold(Self::stream(), |reply, event| reply.then(&sse(event)))
            .then("data: [DONE]\n\n")
    }

    /// An error response with a JSON body.
    fn error(status: u16, body: &Value) -> Self {
        let body = body.to_string();
        Self {
            status,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("content-length".into(), body.len().to_string()),
            ],
            stall: None,
            parts: vec![Part::Bytes(body.into_bytes())],
        }
    }

    fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Writes `text` next.
    fn then(mut self, text: &str) -> Self {
        self.parts.push(Part::Bytes(text.as_bytes().to_vec()));
        self
    }

    /// Holds at `gate` next.
    fn hold(mut self, gate: &Arc<Notify>) -> Self {
        self.parts.push(Part::Hold(Arc::clone(gate)));
        self
    }

    /// Holds at `gate` before sending anything.
    fn stalled(mut self, gate: &Arc<Notify>) -> Self {
        self.stall = Some(Arc::clone(gate));
        self
    }
}

/// A local HTTP/1.1 server answering with scripted replies.
struct Server {
    url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
    /// Notified after each reply was written completely.
    served: Arc<Notify>,
}

impl Server {
    async fn start(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the test server binds");
        let url = format!(
            "http://{}/v1",
            listener.local_addr().expect("the server has an address")
        );
        let requests = Arc::new(Mutex::new(Vec::new()));
        let served = Arc::new(Notify::new());
        let (record, done) = (Arc::clone(&requests), Arc::clone(&served));
        tokio::spawn(async move {
            for reply in replies {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let Ok(request) = read_request(&mut socket).await else {
                    return;
                };
                record.lock().unwrap().push(request);
                if respond(&mut socket, reply).await.is_ok() {
                    done.notify_one();
                }
            }
        });
        Self {
            url,
            requests,
            served,
        }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    /// A configuration for this server with fast backoff.
    fn config(&self) -> OpenAiConfig {
        OpenAiConfig::new(self.url.clone(), "gpt-test")
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
    }
}

async fn read_request(socket: &mut TcpStream) -> std::io::Result<Recorded> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break at;
        }
        let read = socket.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let read = socket.read(&mut chunk).await?;
        if read == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..read]);
    }
    Ok(Recorded {
        request_line,
        headers,
        body,
    })
}

async fn respond(socket: &mut TcpStream, reply: Reply) -> std::io::Result<()> {
    if let Some(gate) = &reply.stall {
        gate.notified().await;
    }
    let mut head = format!(
        "HTTP/1.1 {} Scripted\r\nconnection: close\r\n",
        reply.status
    );
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    socket.write_all(head.as_bytes()).await?;
    for part in reply.parts {
        match part {
            Part::Bytes(bytes) => socket.write_all(&bytes).await?,
            Part::Hold(gate) => gate.notified().await,
        }
    }
    socket.shutdown().await
}

// ---------------------------------------------------------------------------------------------
// Wire helpers and the client side.
// ---------------------------------------------------------------------------------------------

/// One server-sent event.
fn sse(event: &Value) -> String {
    format!("data: {event}\n\n")
}

fn delta(delta: Value) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": null}],
    })
}

fn finish(reason: &str) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
    })
}

fn usage(prompt: u64, completion: u64) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    })
}

/// A streamed text answer as OpenAI sends it: a role-only delta, the pieces, `stop`, usage.
fn text_reply(pieces: &[&str]) -> Reply {
    let mut events = vec![delta(json!({"role": "assistant", "content": ""}))];
    events.extend(pieces.iter().map(|piece| delta(json!({"content": piece}))));
    events.push(finish("stop"));
    events.push(usage(12, 2));
    Reply::events(&events)
}

fn request(cancel: &CancellationToken) -> GenerateRequest {
    GenerateRequest {
        provider: "openai".into(),
        model: String::new(),
        messages: vec![Message::user(
            vec![ContentBlock::text("hi")],
            MessageSource::User,
        )]
        .into(),
        system: None,
        tools: vec![],
        max_tokens: None,
        session_id: None,
        cancel: cancel.clone(),
    }
}

fn adapter(config: OpenAiConfig) -> OpenAiAdapter {
    OpenAiAdapter::new(config).expect("the adapter builds")
}

type Item = Result<StreamChunk, LlmFailure>;

/// Streams one call to its end.
async fn run_call(adapter: &OpenAiAdapter, request: GenerateRequest) -> Vec<Item> {
    within(
        "the model stream to end",
        adapter.stream(request).collect::<Vec<_>>(),
    )
    .await
}

fn ok_chunks(items: Vec<Item>) -> Vec<StreamChunk> {
    items
        .into_iter()
        .map(|item| item.unwrap_or_else(|failure| panic!("unexpected failure: {failure:?}")))
        .collect()
}

fn final_failure(items: &[Item]) -> LlmFailure {
    match items.last() {
        Some(Err(failure)) => failure.clone(),
        other => panic!("the stream should end with a failure, it ended with {other:?}"),
    }
}

/// Calls a server that answers one `status` error with `body` (retries allowed) and returns the
/// failure and how many requests the server saw.
async fn refused_once(status: u16, body: Value) -> (LlmFailure, usize) {
    let server = Server::start(vec![Reply::error(status, &body)]).await;
    let items = run_call(
        &adapter(server.config().max_retries(2)),
        request(&CancellationToken::new()),
    )
    .await;
    (final_failure(&items), server.requests().len())
}

/// The blocks the deltas alone build (`block-end` left out).
fn assemble_deltas(chunks: &[StreamChunk]) -> Vec<ContentBlock> {
    let mut assembler = BlockAssembler::new();
    for chunk in chunks {
        if !matches!(chunk, StreamChunk::BlockEnd { .. }) {
            assembler.push(chunk);
        }
    }
    assembler.blocks()
}

fn block_ends(chunks: &[StreamChunk]) -> Vec<ContentBlock> {
    chunks
        .iter()
        .filter_map(|chunk| match chunk {
            StreamChunk::BlockEnd { block, .. } => Some(block.clone()),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Streaming.
// ---------------------------------------------------------------------------------------------

#[actix_rt::test]
async fn streamed_text_arrives_as_deltas_and_ends_with_the_complete_block() {
    let server = Server::start(vec![text_reply(&["Hel", "lo"])]).await;
    let items = run_call(
        &adapter(server.config()),
        request(&CancellationToken::new()),
    )
    .await;
    assert_eq!(
        ok_chunks(items),
        vec![
            StreamChunk::BlockStart {
                index: 0,
                block_type: BlockType::Text
            },
            StreamChunk::TextDelta {
                index: 0,
                text: "Hel".into()
            },
            StreamChunk::TextDelta {
                index: 0,
                text: "lo".into()
            },
            StreamChunk::Usage {
                usage: TokenUsage {
                    input_tokens: 12,
                    output_tokens: 2,
                    ..TokenUsage::default()
                }
            },
            StreamChunk::BlockEnd {
                index: 0,
                block: ContentBlock::text("Hello")
            },
            StreamChunk::Finish {
                reason: FinishReason::Stop
            },
        ]
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "one request, no retry");
    assert_eq!(
        requests[0].request_line,
        "POST /v1/chat/completions HTTP/1.1"
    );
    let body = requests[0].json();
    assert_eq!(
        body["model"], "gpt-test",
        "an empty request model falls back"
    );
    assert!(
        body.get("tools").is_none(),
        "no tools are sent when none exist"
    );
    assert!(
        body.get("max_tokens").is_none(),
        "no cap is sent when none is set"
    );
    assert!(
        requests[0].header("authorization").is_none(),
        "no key configured"
    );
}

#[actix_rt::test]
async fn reasoning_deltas_open_a_reasoning_block_before_the_text() {
    let server = Server::start(vec![Reply::events(&[
        delta(json!({"role": "assistant", "reasoning_content": "Six times seven."})),
        delta(json!({"reasoning_content": null, "content": "42"})),
        finish("stop"),
    ])])
    .await;
    let items = run_call(
        &adapter(server.config()),
        request(&CancellationToken::new()),
    )
    .await;
    assert_eq!(
        ok_chunks(items),
        vec![
            StreamChunk::BlockStart {
                index: 0,
                block_type: BlockType::Reasoning
            },
            StreamChunk::ReasoningDelta {
                index: 0,
                text: "Six times seven.".into()
            },
            StreamChunk::BlockStart {
                index: 1,
                block_type: BlockType::Text
            },
            StreamChunk::TextDelta {
                index: 1,
                text: "42".into()
            },
            StreamChunk::BlockEnd {
                index: 0,
                block: ContentBlock::Reasoning {
                    text: "Six times seven.".into()
                }
            },
            StreamChunk::BlockEnd {
                index: 1,
                block: ContentBlock::text("42")
            },
            StreamChunk::Finish {
                reason: FinishReason::Stop
            },
        ]
    );
}

#[actix_rt::test]
async fn two_parallel_tool_calls_split_across_many_deltas_assemble_into_two_calls() {
    let call = |index: u64, id: &str, name: &str| {
        delta(json!({"tool_calls": [{
            "index": index, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""},
        }]}))
    };
    let arguments = |index: u64, piece: &str| {
        delta(json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    };
    let server = Server::start(vec![Reply::events(&[
        delta(json!({"role": "assistant", "content": null})),
        call(0, "call_a", "search"),
        call(1, "call_b", "fetch"),
        arguments(0, r#"{"query":"#),
        arguments(1, r#"{"url":"#),
        arguments(0, r#""rust actors"}"#),
        arguments(1, r#""https://example.com"}"#),
        finish("tool_calls"),
        usage(40, 25),
    ])])
    .await;
    let chunks = ok_chunks(
        run_call(
            &adapter(server.config()),
            request(&CancellationToken::new()),
        )
        .await,
    );
    let expected = vec![
        ContentBlock::ToolCall {
            id: CallId::new("call_a"),
            name: "search".into(),
            arguments: r#"{"query":"rust actors"}"#.into(),
        },
        ContentBlock::ToolCall {
            id: CallId::new("call_b"),
            name: "fetch".into(),
            arguments: r#"{"url":"https://example.com"}"#.into(),
        },
    ];
    assert_eq!(block_ends(&chunks), expected, "block-end is authoritative");
    assert_eq!(
        assemble_deltas(&chunks),
        expected,
        "the deltas alone build the same calls"
    );
    assert_eq!(
        chunks
            .iter()
            .filter(|chunk| matches!(chunk, StreamChunk::ToolCallDelta { .. }))
            .count(),
        6,
        "every provider delta is forwarded"
    );
    assert_eq!(
        chunks.last(),
        Some(&StreamChunk::Finish {
            reason: FinishReason::ToolCalls
        })
    );
}

#[actix_rt::test]
async fn usage_details_become_disjoint_counts() {
    let server = Server::start(vec![Reply::events(&[
        delta(json!({"content": "ok"})),
        finish("stop"),
        json!({
            "choices": [],
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 30,
                "total_tokens": 130,
                "prompt_tokens_details": {"cached_tokens": 40},
                "completion_tokens_details": {"reasoning_tokens": 12},
            },
        }),
    ])])
    .await;
    let chunks = ok_chunks(
        run_call(
            &adapter(server.config()),
            request(&CancellationToken::new()),
        )
        .await,
    );
    let usages: Vec<TokenUsage> = chunks
        .iter()
        .filter_map(|chunk| match chunk {
            StreamChunk::Usage { usage } => Some(*usage),
            _ => None,
        })
        .collect();
    assert_eq!(
        usages,
        [TokenUsage {
            input_tokens: 60,
            output_tokens: 18,
            cache_read: Some(40),
            cache_write: None,
            reasoning: Some(12),
        }]
    );
}

#[actix_rt::test]
async fn every_finish_reason_maps_to_the_crate_vocabulary() {
    for (wire, expected) in [
        ("stop", FinishReason::Stop),
        ("length", FinishReason::MaxTokens),
        ("tool_calls", FinishReason::ToolCalls),
        ("function_call", FinishReason::ToolCalls),
        ("content_filter", FinishReason::Refusal),
        ("something_new", FinishReason::Stop),
    ] {
        let server = Server::start(vec![Reply::events(&[
            delta(json!({"content": "text"})),
            finish(wire),
        ])])
        .await;
        let chunks = ok_chunks(
            run_call(
                &adapter(server.config()),
                request(&CancellationToken::new()),
            )
            .await,
        );
        assert_eq!(
            chunks.last(),
            Some(&StreamChunk::Finish { reason: expected }),
            "finish_reason {wire:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Retries and HTTP failures.
// ---------------------------------------------------------------------------------------------

#[actix_rt::test]
async fn a_rate_limit_with_retry_after_zero_is_retried_once_and_succeeds() {
    let server = Server::start(vec![
        Reply::error(
            429,
            &json!({"error": {
                "message": "Rate limit reached",
                "type": "requests",
                "code": "rate_limit_exceeded",
            }}),
        )
        .header("retry-after", "0"),
        text_reply(&["after the wait"]),
    ])
    .await;
    let chunks = ok_chunks(
        run_call(
            &adapter(server.config().max_retries(2)),
            request(&CancellationToken::new()),
        )
        .await,
    );
    assert_eq!(block_ends(&chunks), [ContentBlock::text("after the wait")]);
    assert_eq!(server.requests().len(), 2, "the 429, then the retry");
}

// A 404 from a base URL without an API version says the `/v1` is likely missing; one with it
// does not guess.
#[actix_rt::test]
async fn a_not_found_endpoint_without_a_version_hints_at_the_missing_v1() {
    for (base, hinted) in [("", true), ("/v1", false)] {
        let server = Server::start(vec![Reply::error(404, &json!({"error": "not found"}))]).await;
        let url = server.url.trim_end_matches("/v1").to_owned() + base;
        let config = OpenAiConfig::new(url.clone(), "gpt-test").max_retries(0);
        let failure =
            final_failure(&run_call(&adapter(config), request(&CancellationToken::new())).await);
        assert_eq!(failure.status, Some(404));
        assert_eq!(
            failure.message.contains(&format!("as in {url}/v1")),
            hinted,
            "{base:?}: {}",
            failure.message
        );
    }
}

// A command against a real endpoint shows its retries on stderr (without RUST_LOG), so a slow
// provider does not look like a hang.
/// Runs `subagents demo` against `server` (without `RUST_LOG`), with `args` after the model
/// flags.
async fn demo_against(server: &Server, args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    tokio::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["demo", "--store", "memory", "--model", "openai"])
        .arg("--base-url")
        .arg(&server.url)
        .args(["--model-name", "gpt-test"])
        .args(args)
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap()
}

#[actix_rt::test]
async fn the_cli_shows_a_model_calls_retries_on_stderr() {
    let overloaded = || Reply::error(500, &json!({"error": {"message": "overloaded"}}));
    let server = Server::start(vec![overloaded(), overloaded()]).await;
    let output = demo_against(&server, &["--max-retries", "1"]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("retrying the model call"), "{stderr}");
    assert_eq!(server.requests().len(), 2, "the call and its one retry");
}

// A call that waits for the endpoint says so on stderr while it waits (a person would otherwise
// see a hang), and then goes on: the server holds its reply until the notice has been read.
#[actix_rt::test]
async fn the_cli_says_it_is_still_waiting_for_a_slow_model() {
    use tokio::io::AsyncBufReadExt;
    let gate = Arc::new(Notify::new());
    let server = Server::start(vec![text_reply(&["late ", "answer"]).stalled(&gate)]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut demo = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["demo", "--store", "memory", "--model", "openai"])
        .arg("--base-url")
        .arg(&server.url)
        .args(["--model-name", "gpt-test", "--prompt", "take your time"])
        .args(["--wait-notice-ms", "20"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(demo.stderr.take().unwrap()).lines();
    let notice = within("the notice", async {
        loop {
            let line = stderr
                .next_line()
                .await
                .unwrap()
                .expect("stderr stays open");
            if line.contains("still waiting for the model's response to start") {
                return line;
            }
        }
    })
    .await;
    assert!(notice.contains("waited_ms"), "{notice}");
    gate.notify_one();
    let output = within("the demo", demo.wait_with_output()).await.unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("answer: late answer"), "{stdout}");
}

// A failed turn is said once, as an error: its session log is printed only with --verbose.
#[actix_rt::test]
async fn a_failed_demo_prints_its_session_log_only_with_verbose() {
    let overloaded = || Reply::error(500, &json!({"error": {"message": "overloaded"}}));
    for verbose in [false, true] {
        let server = Server::start(vec![overloaded()]).await;
        let mut args = vec!["--max-retries", "0"];
        if verbose {
            args.push("--verbose");
        }
        let output = demo_against(&server, &args).await;
        assert_eq!(output.status.code(), Some(2));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("the turn failed"), "{stderr}");
        assert_eq!(
            stdout.contains("turn/start"),
            verbose,
            "verbose {verbose}: {stdout}"
        );
        assert_eq!(
            stdout.contains("--verbose prints them"),
            !verbose,
            "{stdout}"
        );
    }
}

// `demo --prompt` asks a real model the user's own question, with the delegation tools on
// offer, and prints its answer.
#[actix_rt::test]
async fn the_demo_asks_a_real_model_the_users_prompt_with_the_delegation_tools() {
    let server = Server::start(vec![text_reply(&["hello ", "there"])]).await;
    let output = demo_against(&server, &["--prompt", "say hello"]).await;
    crate::support::assert_succeeded(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("answer: hello there"), "{stdout}");
    let body = server.requests()[0].json();
    assert!(body.to_string().contains("say hello"), "{body}");
    let tools: Vec<&str> = body["tools"]
        .as_array()
        .expect("tools are offered")
        .iter()
        .filter_map(|tool| tool["function"]["name"].as_str())
        .collect();
    for tool in ["subagent", "subagent_fork", "subagent_continuable"] {
        assert!(tools.contains(&tool), "{tool} missing from {tools:?}");
    }
    // The scripted model answers its own script: a prompt is refused with it, by name.
    let refused = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["demo", "--store", "memory", "--prompt", "say hello"])
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--prompt needs --model openai"));
}

#[actix_rt::test]
async fn server_errors_exhaust_the_retries_and_report_a_provider_failure() {
    let max_retries = 2;
    let replies = (0..=max_retries)
        .map(|_| {
            Reply::error(500, &json!({"error": {"message": "upstream overloaded"}}))
                .header("x-request-id", "req-500")
        })
        .collect();
    let server = Server::start(replies).await;
    let items = run_call(
        &adapter(server.config().max_retries(max_retries)),
        request(&CancellationToken::new()),
    )
    .await;
    assert_eq!(items.len(), 1, "only the failure: nothing was streamed");
    let failure = final_failure(&items);
    assert_eq!(failure.category, Some(FailureCategory::Provider));
    assert_eq!(failure.code, codes::PROVIDER_ERROR);
    assert_eq!(failure.status, Some(500));
    assert_eq!(failure.request_id.as_deref(), Some("req-500"));
    assert!(
        failure.message.contains("upstream overloaded"),
        "the provider's message is kept: {}",
        failure.message
    );
    assert_eq!(
        server.requests().len(),
        usize::try_from(max_retries + 1).unwrap(),
        "one request plus max_retries retries"
    );
}

#[actix_rt::test]
async fn an_exhausted_quota_is_a_quota_failure_and_is_not_retried() {
    let (failure, requests) = refused_once(
        429,
        json!({"error": {
            "message": "You exceeded your current quota, please check your plan.",
            "type": "insufficient_quota",
            "code": "insufficient_quota",
        }}),
    )
    .await;
    assert_eq!(failure.category, Some(FailureCategory::Quota));
    assert_eq!(failure.code, codes::INSUFFICIENT_QUOTA);
    assert_eq!(failure.status, Some(429));
    assert!(failure.message.contains("exceeded your current quota"));
    assert_eq!(requests, 1, "a quota failure is final");
}

#[actix_rt::test]
async fn refused_credentials_are_an_auth_failure_and_are_not_retried() {
    let (failure, requests) = refused_once(
        401,
        json!({"error": {
            "message": "Incorrect API key provided",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }}),
    )
    .await;
    assert_eq!(failure.category, Some(FailureCategory::Auth));
    assert_eq!(failure.code, codes::AUTH_FAILED);
    assert_eq!(failure.status, Some(401));
    assert!(failure.message.contains("Incorrect API key provided"));
    assert_eq!(requests, 1);
}

#[actix_rt::test]
async fn a_rate_limit_without_retries_reports_the_providers_hint() {
    let server = Server::start(vec![Reply::error(
        429,
        &json!({"error": {"message": "Rate limit reached"}}),
    )
    .header("retry-after", "7")])
    .await;
    let items = run_call(
        &adapter(server.config().max_retries(0)),
        request(&CancellationToken::new()),
    )
    .await;
    let failure = final_failure(&items);
    assert_eq!(failure.category, Some(FailureCategory::Quota));
    assert_eq!(failure.code, codes::RATE_LIMITED);
    assert_eq!(failure.provider_retry_after_ms, Some(7_000));
}

// ---------------------------------------------------------------------------------------------
// Cancellation.
// ---------------------------------------------------------------------------------------------

#[actix_rt::test]
async fn cancelling_mid_stream_ends_the_stream_with_an_aborted_failure_at_once() {
    let never = Arc::new(Notify::new());
    let server = Server::start(vec![Reply::stream()
        .then(&sse(&delta(json!({"content": "partial"}))))
        .hold(&never)])
    .await;
    let cancel = CancellationToken::new();
    // A long idle timeout: only the cancel can end this call quickly.
    let adapter = adapter(server.config().idle_timeout(Duration::from_secs(60)));
    let mut stream = adapter.stream(request(&cancel));
    assert_eq!(
        within("the block start", stream.next()).await,
        Some(Ok(StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Text
        }))
    );
    assert_eq!(
        within("the first delta", stream.next()).await,
        Some(Ok(StreamChunk::TextDelta {
            index: 0,
            text: "partial".into()
        }))
    );
    // Virtual time from here: a prompt abort lets none pass; one that waited for a timeout
    // would have advanced it.
    tokio::time::pause();
    let cancelled_at = tokio::time::Instant::now();
    cancel.cancel();
    match within("the abort", stream.next()).await {
        Some(Err(failure)) => assert_eq!(failure.code, codes::ABORTED),
        other => panic!("expected an ABORTED failure, got {other:?}"),
    }
    assert_eq!(
        cancelled_at.elapsed(),
        Duration::ZERO,
        "the abort is prompt, not a timeout"
    );
    assert_eq!(
        within("the end of the stream", stream.next()).await,
        None,
        "nothing follows the abort"
    );
}

#[actix_rt::test]
async fn cancelling_during_a_backoff_wait_aborts_without_another_request() {
    let server = Server::start(vec![Reply::error(
        503,
        &json!({"error": {"message": "busy"}}),
    )
    .header("retry-after", "30")])
    .await;
    let cancel = CancellationToken::new();
    let stream = adapter(server.config().max_retries(3)).stream(request(&cancel));
    let consumer = tokio::spawn(stream.collect::<Vec<_>>());
    within("the 503 to be written", server.served.notified()).await;
    cancel.cancel();
    let items = within("the cancelled call", consumer)
        .await
        .expect("the consumer completes");
    assert_eq!(items.len(), 1);
    assert_eq!(final_failure(&items).code, codes::ABORTED);
    assert_eq!(server.requests().len(), 1, "the retry never went out");
}

// ---------------------------------------------------------------------------------------------
// Malformed streams and timeouts.
// ---------------------------------------------------------------------------------------------

#[actix_rt::test]
async fn an_event_that_is_not_json_is_a_protocol_failure() {
    let server = Server::start(vec![Reply::stream().then("data: {not json}\n\n")]).await;
    let items = run_call(
        &adapter(server.config()),
        request(&CancellationToken::new()),
    )
    .await;
    assert_eq!(items.len(), 1);
    let failure = final_failure(&items);
    assert_eq!(failure.category, Some(FailureCategory::Protocol));
    assert_eq!(failure.code, codes::PROTOCOL_ERROR);
}

#[actix_rt::test]
async fn a_stream_cut_mid_event_or_before_finishing_is_a_protocol_failure() {
    let first = sse(&delta(json!({"content": "hi"})));
    for (what, tail) in [
        ("cut mid-event", r#"data: {"choi"#),
        ("ended without finish or [DONE]", ""),
    ] {
        let server = Server::start(vec![Reply::stream().then(&first).then(tail)]).await;
        let items = run_call(
            &adapter(server.config()),
            request(&CancellationToken::new()),
        )
        .await;
        let failure = final_failure(&items);
        assert_eq!(failure.category, Some(FailureCategory::Protocol), "{what}");
        let streamed: Vec<_> = items[..items.len() - 1]
            .iter()
            .map(|item| item.clone().expect("only the last item fails"))
            .collect();
        assert_eq!(
            streamed,
            [
                StreamChunk::BlockStart {
                    index: 0,
                    block_type: BlockType::Text
                },
                StreamChunk::TextDelta {
                    index: 0,
                    text: "hi".into()
                },
            ],
            "{what}: what streamed before the cut is delivered"
        );
    }
}

#[actix_rt::test]
async fn a_silent_stream_hits_the_idle_timeout() {
    // Paused time: the timeout fires as soon as the runtime has nothing else to do.
    tokio::time::pause();
    let never = Arc::new(Notify::new());
    let server = Server::start(vec![Reply::stream()
        .then(&sse(&delta(json!({"content": "slow"}))))
        .hold(&never)])
    .await;
    let items = run_call(
        &adapter(server.config().idle_timeout(Duration::from_millis(200))),
        request(&CancellationToken::new()),
    )
    .await;
    let failure = final_failure(&items);
    assert_eq!(failure.category, Some(FailureCategory::Provider));
    assert_eq!(failure.code, codes::TIMEOUT);
    assert!(
        failure.message.contains("timed out"),
        "the message names the timeout: {}",
        failure.message
    );
}

#[actix_rt::test]
async fn a_server_that_never_answers_hits_the_request_timeout() {
    tokio::time::pause();
    let never = Arc::new(Notify::new());
    let server = Server::start(vec![Reply::stream().stalled(&never)]).await;
    let items = run_call(
        &adapter(server.config().request_timeout(Duration::from_millis(200))),
        request(&CancellationToken::new()),
    )
    .await;
    assert_eq!(items.len(), 1);
    let failure = final_failure(&items);
    assert_eq!(failure.category, Some(FailureCategory::Provider));
    assert_eq!(failure.code, codes::TIMEOUT);
    assert!(
        failure.message.contains("timed out"),
        "the message names the timeout: {}",
        failure.message
    );
}

// ---------------------------------------------------------------------------------------------
// The request.
// ---------------------------------------------------------------------------------------------

#[actix_rt::test]
async fn the_request_body_carries_system_history_tools_and_the_token_cap() {
    let server = Server::start(vec![text_reply(&["ok"])]).await;
    let cancel = CancellationToken::new();
    let mut call = request(&cancel);
    call.model = "gpt-override".into();
    call.system = Some("Be brief.".into());
    call.max_tokens = Some(256);
    call.tools = vec![Arc::new(ToolSchema {
        name: "weather".into(),
        description: "Looks up the weather.".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    })];
    call.messages = vec![
        Message::user(
            vec![ContentBlock::text("Weather in Oslo?")],
            MessageSource::User,
        ),
        Message::assistant(
            vec![
                ContentBlock::Reasoning {
                    text: "The user wants the weather.".into(),
                },
                ContentBlock::text("Checking."),
                ContentBlock::ToolCall {
                    id: CallId::new("call_1"),
                    name: "weather".into(),
                    arguments: r#"{"city":"Oslo"}"#.into(),
                },
            ],
            "openai",
            "gpt-test",
        ),
        Message::tool_result(
            CallId::new("call_1"),
            vec![ContentBlock::text("sunny")],
            false,
        ),
    ]
    .into();
    ok_chunks(run_call(&adapter(server.config()), call).await);
    let requests = server.requests();
    assert_eq!(requests[0].header("content-type"), Some("application/json"));
    assert_eq!(requests[0].header("accept"), Some("text/event-stream"));
    assert_eq!(
        requests[0].json(),
        json!({
            "model": "gpt-override",
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": 256,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": "Checking.",
                    "tool_calls": [{
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
                    }],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "tools": [{
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Looks up the weather.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }],
        })
    );
}

#[actix_rt::test]
async fn the_api_key_from_the_named_variable_is_sent_and_never_printed() {
    const KEY_VARIABLE: &str = "SUBAGENTS_TEST_OPENAI_API_KEY";
    const SECRET: &str = "sk-test-4f1c9e0b-do-not-print";
    // Only this test touches this variable.
    std::env::set_var(KEY_VARIABLE, SECRET);
    let server = Server::start(vec![text_reply(&["ok"])]).await;
    let config = server.config().api_key_env(KEY_VARIABLE);
    let adapter = adapter(config.clone());
    ok_chunks(run_call(&adapter, request(&CancellationToken::new())).await);
    assert_eq!(
        server.requests()[0].header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    assert!(!format!("{config:?}").contains(SECRET), "{config:?}");
    assert!(!format!("{adapter:?}").contains(SECRET), "{adapter:?}");
}

#[test]
fn an_unset_key_variable_or_a_bad_url_refuses_to_build() {
    for config in [
        OpenAiConfig::new("http://127.0.0.1:9/v1", "gpt-test")
            .api_key_env("SUBAGENTS_TEST_OPENAI_KEY_THAT_IS_NEVER_SET"),
        OpenAiConfig::new("127.0.0.1:9/v1", "gpt-test"),
    ] {
        let error = OpenAiAdapter::new(config.clone()).unwrap_err();
        assert_eq!(error.code(), ErrorCode::ModelUnavailable, "{config:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Through the runtime.
// ---------------------------------------------------------------------------------------------

#[actix_rt::test]
async fn a_turn_through_the_runtime_ends_completed_with_the_streamed_text() {
    let server = Server::start(vec![text_reply(&["Hello ", "from the server"])]).await;
    let rt = Runtime::builder()
        .store(MemoryStore::new())
        .model("openai", adapter(server.config()))
        .build()
        .unwrap();
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let events = run_prompt(handle.agent(), "hi").await;
    match events.last().map(|event| &event.kind) {
        Some(EventKind::TurnEnd { reason, .. }) => assert_eq!(*reason, TurnEndReason::Completed),
        other => panic!("the log should end with turn/end, it ends with {other:?}"),
    }
    assert_eq!(
        final_assistant_output(&events),
        [ContentBlock::text("Hello from the server")]
    );
    let body = server.requests()[0].json();
    assert_eq!(
        body["messages"]
            .as_array()
            .and_then(|messages| messages.last()),
        Some(&json!({"role": "user", "content": "hi"})),
        "the prompt is the last message sent"
    );
    handle.dispose().await.unwrap();
}
