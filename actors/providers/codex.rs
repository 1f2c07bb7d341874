//! The Codex provider: each one-shot run starts a fresh `codex app-server --stdio` and drives
//! one ephemeral thread and one turn over its NDJSON JSON-RPC wire: `initialize` →
//! `initialized` → `thread/start` → (publication) → `turn/start`, then the turn's notifications
//! and unattended server requests until `turn/completed`. Failures are reported only in safe
//! words (stage, category, HTTP status, exit facts and the latest unattended decision), never
//! in the product's own text.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;
use futures::FutureExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::content::{text_of, ContentBlock};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::out_of_process::codex::turn::{Fatal, Turn, TurnEnd};
use crate::out_of_process::codex::{Failure, Stage, StderrSignatures, PREFIX};
use crate::out_of_process::{
    child_env, grace_ms, out_of_process_run, usable_cwd, ChildProcess, CwdLabel, ExitOutcome,
    PartialOutput, ProcessSpec, StderrMode, NO_START_CAPABILITIES,
};
use crate::seam::{
    ResolvedSubagentStartRequest, SubagentCapabilities, SubagentProvider, SubagentResult,
    SubagentRun,
};
use crate::stop_reason::StopReason;

/// The unattended permission mode of every thread the provider starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CodexPermissionMode {
    /// `approvalPolicy: never`: Codex never asks.
    #[default]
    Never,
    /// `approvalPolicy: on-request` reviewed automatically, in a workspace-write sandbox.
    ApproveForMe,
    /// `approvalPolicy: never` with no sandbox at all.
    DangerouslyBypassApprovalsAndSandbox,
}

impl CodexPermissionMode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::ApproveForMe => "approve-for-me",
            Self::DangerouslyBypassApprovalsAndSandbox => {
                "dangerously-bypass-approvals-and-sandbox"
            }
        }
    }

    /// The `thread/start` fields of the mode.
    fn thread_fields(self) -> Value {
        match self {
            Self::Never => json!({"approvalPolicy": "never"}),
            Self::ApproveForMe => json!({
                "approvalPolicy": "on-request",
                "approvalsReviewer": "auto_review",
                "sandbox": "workspace-write",
            }),
            Self::DangerouslyBypassApprovalsAndSandbox => {
                json!({"approvalPolicy": "never", "sandbox": "danger-full-access"})
            }
        }
    }
}

fn default_codex_name() -> String {
    "codex".to_owned()
}

fn default_codex_command() -> String {
    "codex".to_owned()
}

fn default_codex_args() -> Vec<String> {
    vec!["app-server".to_owned(), "--stdio".to_owned()]
}

fn default_grace_ms() -> f64 {
    3000.0
}

/// The Codex provider's configuration (`providerName`, `command`, `args`, `env`,
/// `permissionMode`, `disposeGraceMs`). There is no cwd override: a child always runs in its
/// parent session's cwd.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CodexProviderConfig {
    /// The registry name (default `codex`).
    #[serde(default = "default_codex_name")]
    pub provider_name: String,
    /// The Codex executable (default `codex`); configurable so tests can run a fake.
    #[serde(default = "default_codex_command")]
    pub command: String,
    /// Its arguments (default `app-server --stdio`).
    #[serde(default = "default_codex_args")]
    pub args: Vec<String>,
    /// Variables laid over the scrubbed environment (an API key goes here).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The unattended permission mode (default `never`).
    #[serde(default)]
    pub permission_mode: CodexPermissionMode,
    /// How long the tree has between SIGTERM and SIGKILL, and how long a closed wire waits for
    /// the exit (default 3000 ms).
    #[serde(default = "default_grace_ms")]
    pub dispose_grace_ms: f64,
}

impl CodexProviderConfig {
    /// A configuration that runs `command app-server --stdio` with the defaults.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            ..Self::default()
        }
    }
}

impl Default for CodexProviderConfig {
    fn default() -> Self {
        Self {
            provider_name: default_codex_name(),
            command: default_codex_command(),
            args: default_codex_args(),
            env: BTreeMap::new(),
            permission_mode: CodexPermissionMode::default(),
            dispose_grace_ms: default_grace_ms(),
        }
    }
}

#[derive(Debug)]
struct CodexSettings {
    name: String,
    argv: Vec<OsString>,
    env: BTreeMap<String, String>,
    mode: CodexPermissionMode,
    grace: Duration,
}

/// The Codex provider: one-shot runs only, no start capabilities, no parent context.
pub struct CodexProvider {
    settings: Arc<CodexSettings>,
    addr: OnceLock<Addr<CodexProviderActor>>,
}

impl std::fmt::Debug for CodexProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodexProvider")
            .field("name", &self.settings.name)
            .finish_non_exhaustive()
    }
}

impl CodexProvider {
    /// Checks `config` and builds the provider; loading starts no process.
    ///
    /// # Errors
    /// `INVALID_CONFIG` for an empty name or command, or a grace that is not positive,
    /// finite and at most 2147483647 ms.
    pub fn new(config: CodexProviderConfig) -> Result<Self> {
        let invalid = |message: &str| {
            SubagentError::new(ErrorCode::InvalidConfig, format!("{PREFIX}: {message}"))
        };
        if config.provider_name.is_empty() {
            return Err(invalid("providerName must not be empty"));
        }
        if config.command.is_empty() {
            return Err(invalid("command must not be empty"));
        }
        crate::out_of_process::positive_finite(PREFIX, "disposeGraceMs", config.dispose_grace_ms)?;
        let grace = grace_ms(PREFIX, "disposeGraceMs", config.dispose_grace_ms)
            .map_err(|_| invalid("disposeGraceMs must be no greater than 2147483647"))?;
        Ok(Self {
            settings: Arc::new(CodexSettings {
                name: config.provider_name,
                argv: std::iter::once(config.command)
                    .chain(config.args)
                    .map(OsString::from)
                    .collect(),
                env: config.env,
                mode: config.permission_mode,
                grace,
            }),
            addr: OnceLock::new(),
        })
    }

    fn addr(&self) -> Addr<CodexProviderActor> {
        self.addr
            .get_or_init(|| {
                CodexProviderActor {
                    settings: Arc::clone(&self.settings),
                    started: 0,
                }
                .start()
            })
            .clone()
    }
}

impl SubagentProvider for CodexProvider {
    fn name(&self) -> &str {
        &self.settings.name
    }

    fn capabilities(&self) -> SubagentCapabilities {
        NO_START_CAPABILITIES
    }

    fn inherits_parent_context(&self) -> bool {
        false
    }

    fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> BoxFuture<'static, Result<SubagentRun>> {
        let addr = self.addr();
        Box::pin(async move {
            addr.send(StartCodexRun(request))
                .await
                .map_err(SubagentError::from)?
        })
    }
}

/// The provider's actor: it counts its runs and starts each one; every run then lives in tasks
/// of its own.
struct CodexProviderActor {
    settings: Arc<CodexSettings>,
    started: u64,
}

impl Actor for CodexProviderActor {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "Result<SubagentRun>")]
struct StartCodexRun(ResolvedSubagentStartRequest);

impl Handler<StartCodexRun> for CodexProviderActor {
    type Result = ResponseFuture<Result<SubagentRun>>;

    fn handle(&mut self, msg: StartCodexRun, _: &mut Context<Self>) -> Self::Result {
        self.started += 1;
        tracing::debug!(provider = %self.settings.name, started = self.started, "Codex run start");
        Box::pin(start_run(Arc::clone(&self.settings), msg.0))
    }
}

fn aborted(when: &str) -> SubagentError {
    SubagentError::new(
        ErrorCode::AbortedBeforePublication,
        format!("{PREFIX}: request was aborted before {when}"),
    )
}

/// A startup failure in safe words; the raw cause stays the source.
fn startup_failure(failure: &Failure, cause: SubagentError) -> SubagentError {
    SubagentError::new(
        ErrorCode::ChildStartFailed,
        format!("{PREFIX}: {}", failure.line()),
    )
    .with_source(cause)
}

/// The task's text: a non-empty list of text blocks, not all blank.
fn task_text(prompt: &[ContentBlock]) -> Result<Vec<String>> {
    let texts: Option<Vec<String>> = prompt
        .iter()
        .map(|block| block.as_text().map(str::to_owned))
        .collect();
    let texts = texts.filter(|texts| !texts.is_empty()).ok_or_else(|| {
        SubagentError::new(
            ErrorCode::InvalidArgs,
            format!("{PREFIX}: the one-shot task must contain only text blocks"),
        )
    })?;
    if texts.iter().all(|text| text.trim().is_empty()) {
        return Err(SubagentError::new(
            ErrorCode::InvalidArgs,
            format!("{PREFIX}: the one-shot task must not be empty"),
        ));
    }
    Ok(texts)
}

async fn start_run(
    settings: Arc<CodexSettings>,
    resolved: ResolvedSubagentStartRequest,
) -> Result<SubagentRun> {
    let request = resolved.request;
    let Some(parent_cwd) = request.parent.header().cwd else {
        return Err(SubagentError::new(
            ErrorCode::InvalidConfig,
            format!(
                "{PREFIX}: no working directory for the child — delegate from a parent session \
                 that has one"
            ),
        ));
    };
    let cwd = match usable_cwd(PREFIX, CwdLabel::ParentSession, &parent_cwd) {
        Ok(cwd) => cwd,
        Err(_) if request.cancel.is_cancelled() => return Err(aborted("app-server startup")),
        Err(error) => return Err(startup_failure(&Failure::unknown(Stage::Initialize), error)),
    };
    let texts = task_text(&request.prompt)?;
    if request.cancel.is_cancelled() {
        return Err(aborted("app-server startup"));
    }
    let process = ChildProcess::spawn(&ProcessSpec {
        argv: settings.argv.clone(),
        cwd: cwd.clone(),
        env: child_env(std::env::vars_os(), &settings.env),
        stderr: StderrMode::Piped,
        grace: settings.grace,
    })
    .map_err(|error| startup_failure(&Failure::unknown(Stage::Initialize), error))?;
    let process = Arc::new(process);
    let (Some(stdin), Some(stdout)) = (process.take_stdin(), process.take_stdout()) else {
        return Err(SubagentError::bug("a child started without its pipes"));
    };
    let local = request.cancel.child_token();
    let shutdown = CancellationToken::new();
    let partial = PartialOutput::default();
    let (started_tx, started_rx) = oneshot::channel();
    let (answer_tx, answer_rx) = oneshot::channel();
    let session = CodexSession {
        name: settings.name.clone(),
        mode: settings.mode,
        grace: settings.grace,
        cwd: cwd.display().to_string(),
        texts,
        wire: Wire {
            stdin: Some(stdin),
            lines: BufReader::new(stdout).lines(),
        },
        stderr: process.take_stderr(),
        signatures: StderrSignatures::default(),
        stderr_chunk: vec![0; 8192],
        process: Arc::clone(&process),
        partial: partial.clone(),
        local: local.clone(),
        shutdown: shutdown.clone(),
        exited: None,
        interrupted: false,
        interrupt_sent: false,
    };
    let connection = tokio::spawn(session.run(started_tx, answer_tx));
    let teardown = Teardown {
        process,
        connection,
        shutdown: shutdown.drop_guard(),
        grace: settings.grace,
    };
    let started = tokio::select! {
        biased;
        () = request.cancel.cancelled() => None,
        started = started_rx => Some(started),
    };
    let failure = match started {
        Some(Ok(Ok(()))) => None,
        None => Some(None),
        Some(Ok(Err(failure))) => Some(Some(failure)),
        Some(Err(_)) => Some(Some((
            Failure::unknown(Stage::Initialize),
            SubagentError::bug("the Codex session ended during startup"),
        ))),
    };
    if let Some(failure) = failure {
        teardown.run().await;
        return Err(match failure {
            Some((failure, cause)) if !request.cancel.is_cancelled() => {
                startup_failure(&failure, cause)
            }
            _ => aborted("run publication"),
        });
    }
    let attempt = async move {
        answer_rx
            .await
            .map_err(|_| SubagentError::bug("the Codex session ended before the turn was answered"))
    };
    Ok(out_of_process_run(
        format!("{PREFIX} \"{}\"", settings.name),
        attempt,
        partial,
        local,
        move || {
            async move {
                teardown.run().await;
                Ok(())
            }
            .boxed()
        },
    ))
}

/// The NDJSON JSON-RPC wire to the app-server.
struct Wire {
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Wire {
    /// Writes one frame; a closed wire is noticed by the reader, so write errors are dropped.
    async fn send(&mut self, frame: &Value) {
        if let Some(stdin) = &mut self.stdin {
            let mut line = frame.to_string();
            line.push('\n');
            if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                self.stdin = None;
            }
        }
    }

    /// Sends a request and returns its id (`req_` and 32 hex digits).
    async fn request(&mut self, method: &str, params: Value) -> String {
        let id = format!("req_{}", uuid::Uuid::new_v4().simple());
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }
}

/// What the run's loop waits for.
enum Event {
    Frame(Value),
    Eof,
    /// This many bytes of stderr are in the session's chunk buffer (0: stderr closed).
    Stderr(usize),
    Exited(ExitOutcome),
    Cancelled,
    Shutdown,
}

/// A JSON-RPC frame, classified: `id` and `method` make a request, `id` alone a response,
/// `method` alone a notification. Non-object params read as `{}`.
enum Frame {
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Response {
        id: Value,
        outcome: std::result::Result<Value, Value>,
    },
    Notification {
        method: String,
        params: Value,
    },
}

fn classify(frame: Value) -> Option<Frame> {
    let Value::Object(mut object) = frame else {
        return None;
    };
    let params = match object.remove("params") {
        Some(params @ Value::Object(_)) => params,
        _ => json!({}),
    };
    let method = object
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let id = object
        .remove("id")
        .filter(|id| id.is_string() || id.is_number());
    match (id, method) {
        (Some(id), Some(method)) => Some(Frame::Request { id, method, params }),
        (Some(id), None) => {
            let outcome = match object.remove("error") {
                Some(error @ Value::Object(_)) => Err(error),
                _ => Ok(object.remove("result").unwrap_or(Value::Null)),
            };
            Some(Frame::Response { id, outcome })
        }
        (None, Some(method)) => Some(Frame::Notification { method, params }),
        (None, None) => None,
    }
}

type StartupFailure = (Failure, SubagentError);

/// One run's protocol side: the handshake, the turn, and the settlement.
struct CodexSession {
    name: String,
    mode: CodexPermissionMode,
    grace: Duration,
    cwd: String,
    texts: Vec<String>,
    wire: Wire,
    /// The child's stderr: forwarded verbatim to ours, and read for the permission signatures.
    stderr: Option<ChildStderr>,
    signatures: StderrSignatures,
    stderr_chunk: Vec<u8>,
    process: Arc<ChildProcess>,
    partial: PartialOutput,
    local: CancellationToken,
    shutdown: CancellationToken,
    exited: Option<ExitOutcome>,
    /// The caller's cancellation was seen.
    interrupted: bool,
    /// `turn/interrupt` was sent (at most once).
    interrupt_sent: bool,
}

fn protocol(message: impl Into<String>) -> SubagentError {
    SubagentError::new(ErrorCode::ChildStartFailed, message)
}

impl CodexSession {
    async fn next_event(&mut self) -> Event {
        let exited = self.exited.is_some();
        let cancelled = self.interrupted;
        let (stderr, chunk) = (&mut self.stderr, &mut self.stderr_chunk);
        let stderr = async move {
            match stderr {
                Some(stderr) => stderr.read(chunk).await.unwrap_or(0),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => Event::Shutdown,
            line = self.wire.lines.next_line() => match line {
                Ok(Some(line)) => match serde_json::from_str::<Value>(line.trim()) {
                    Ok(frame) if frame.is_object() => Event::Frame(frame),
                    // Unparseable and non-object lines are ignored.
                    _ => Event::Frame(Value::Null),
                },
                Ok(None) | Err(_) => Event::Eof,
            },
            read = stderr => Event::Stderr(read),
            outcome = self.process.exited(), if !exited => Event::Exited(outcome),
            () = self.local.cancelled(), if !cancelled => Event::Cancelled,
        }
    }

    /// Waits for the response to `id`, answering what arrives meanwhile through `turn`.
    async fn response(
        &mut self,
        id: &str,
        turn: &mut Turn,
        stage: Stage,
    ) -> std::result::Result<Value, Option<StartupFailure>> {
        loop {
            match self.next_event().await {
                Event::Shutdown => return Err(None),
                Event::Frame(frame) => match classify(frame) {
                    Some(Frame::Response {
                        id: answered,
                        outcome,
                    }) if answered == id => {
                        return outcome.map_err(|error| {
                            Some((
                                Failure::unknown(stage),
                                protocol(format!("{PREFIX}: {error}")),
                            ))
                        });
                    }
                    Some(Frame::Request { id, method, params }) => {
                        if let Err(fatal) = self.answer(turn, id, &method, &params).await {
                            return Err(Some((Failure::unknown(stage), protocol(fatal.message))));
                        }
                    }
                    Some(Frame::Notification { method, params }) => {
                        if let Err(fatal) = turn.notify(&method, &params) {
                            return Err(Some((Failure::unknown(stage), protocol(fatal.message))));
                        }
                    }
                    _ => {}
                },
                Event::Eof => {
                    let outcome = self.exit_within(self.grace).await;
                    let failure = Failure::unknown(stage).with_outcome(outcome);
                    return Err(Some((
                        failure,
                        protocol(format!("{PREFIX}: app-server protocol stream closed")),
                    )));
                }
                Event::Exited(outcome) => {
                    self.exited = Some(outcome);
                    let failure = Failure::unknown(stage).with_outcome(Some(outcome));
                    return Err(Some((
                        failure,
                        protocol(format!("{PREFIX}: app-server exited")),
                    )));
                }
                Event::Stderr(read) => self.on_stderr(turn, read).await,
                // Before publication the start itself watches the caller's cancellation.
                Event::Cancelled => self.interrupted = true,
            }
        }
    }

    /// Answers one server request; a fatal answer is replied `-32603` and fails the run.
    async fn answer(
        &mut self,
        turn: &mut Turn,
        id: Value,
        method: &str,
        params: &Value,
    ) -> std::result::Result<(), Fatal> {
        match turn.request(method, params) {
            Ok(result) => {
                self.wire
                    .send(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
                    .await;
                Ok(())
            }
            Err(fatal) => {
                self.wire
                    .send(&json!({"jsonrpc": "2.0", "id": id,
                                  "error": {"code": -32603, "message": fatal.message}}))
                    .await;
                Err(fatal)
            }
        }
    }

    /// How the process ended, waiting at most `limit` for it.
    async fn exit_within(&mut self, limit: Duration) -> Option<ExitOutcome> {
        if self.exited.is_none() {
            self.exited = tokio::time::timeout(limit, self.process.exited())
                .await
                .ok();
        }
        self.exited
    }

    /// `initialize`, `initialized`, `thread/start`: the thread id.
    async fn handshake(
        &mut self,
        turn: &mut Turn,
    ) -> std::result::Result<String, Option<StartupFailure>> {
        let invalid = |stage: Stage, what: &str| {
            Some((
                Failure::unknown(stage),
                protocol(format!("{PREFIX}: app-server returned invalid {what}")),
            ))
        };
        let params = json!({
            "clientInfo": {"name": "deepseek-harness", "title": "DeepSeek Harness", "version": "0.0.1"},
            "capabilities": {"experimentalApi": false, "requestAttestation": false},
        });
        let id = self.wire.request("initialize", params).await;
        let initialized = self.response(&id, turn, Stage::Initialize).await?;
        if !initialized.is_object() {
            return Err(invalid(Stage::Initialize, "initialize response"));
        }
        self.wire
            .send(&json!({"jsonrpc": "2.0", "method": "initialized"}))
            .await;
        let mut params = json!({"cwd": self.cwd, "ephemeral": true});
        if let (Some(params), Value::Object(fields)) =
            (params.as_object_mut(), self.mode.thread_fields())
        {
            params.extend(fields);
        }
        let id = self.wire.request("thread/start", params).await;
        let started = self.response(&id, turn, Stage::ThreadStart).await?;
        if !started.is_object() {
            return Err(invalid(Stage::ThreadStart, "thread/start response"));
        }
        let thread = started
            .get("thread")
            .filter(|thread| thread.is_object())
            .ok_or_else(|| invalid(Stage::ThreadStart, "thread/start thread"))?;
        let id = thread
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .ok_or_else(|| invalid(Stage::ThreadStart, "thread/start thread id"))?;
        if thread.get("ephemeral") != Some(&Value::Bool(true)) {
            return Err(Some((
                Failure::unknown(Stage::ThreadStart),
                protocol(format!(
                    "{PREFIX}: app-server did not create an ephemeral thread"
                )),
            )));
        }
        Ok(id.to_owned())
    }

    /// The whole run: startup (reported on `started`), then the turn (reported on `answer`),
    /// then holding the wire until shutdown.
    async fn run(
        mut self,
        started: oneshot::Sender<std::result::Result<(), StartupFailure>>,
        answer: oneshot::Sender<SubagentResult>,
    ) {
        // Before the thread exists, no frame can name it.
        let mut turn = Turn::new(String::new());
        let thread = match self.handshake(&mut turn).await {
            Ok(thread) => thread,
            Err(failure) => {
                if let Some(failure) = failure {
                    let _ = started.send(Err(failure));
                }
                return;
            }
        };
        let mut turn = Turn::new(thread.clone());
        if started.send(Ok(())).is_err() {
            return;
        }
        let input: Vec<Value> = self
            .texts
            .iter()
            .map(|text| json!({"type": "text", "text": text, "text_elements": []}))
            .collect();
        let turn_start = self
            .wire
            .request("turn/start", json!({"threadId": thread, "input": input}))
            .await;
        turn.turn_start_sent();
        let settled = self.drive(&mut turn, &turn_start).await;
        if let Some(settled) = settled {
            self.drain_stderr(&mut turn).await;
            let result = self.settle(&mut turn, settled);
            let _ = answer.send(result);
        }
        // Keep reading (a full pipe must never block the child) until disposal.
        loop {
            match self.next_event().await {
                Event::Shutdown => break,
                Event::Eof => {
                    self.shutdown.cancelled().await;
                    break;
                }
                Event::Exited(outcome) => self.exited = Some(outcome),
                Event::Cancelled => self.interrupted = true,
                Event::Stderr(read) => self.on_stderr(&mut turn, read).await,
                Event::Frame(_) => {}
            }
        }
        self.interrupt(&turn).await;
    }

    /// Forwards `read` bytes of stderr and records the fact they complete, if any.
    async fn on_stderr(&mut self, turn: &mut Turn, read: usize) {
        if read == 0 {
            self.stderr = None;
            return;
        }
        let chunk = &self.stderr_chunk[..read];
        // A failed write to our own stderr changes nothing about the run.
        let _ = tokio::io::stderr().write_all(chunk).await;
        if let Some(fact) = self.signatures.observe(&String::from_utf8_lossy(chunk)) {
            turn.observe_stderr(fact);
        }
    }

    /// Reads whatever stderr already holds, without waiting: the child wrote it before the
    /// frame that settles the run, so it counts.
    async fn drain_stderr(&mut self, turn: &mut Turn) {
        while let Some(stderr) = &self.stderr {
            use std::os::fd::AsFd;
            // The pipe is non-blocking: an empty one answers EAGAIN at once.
            match rustix::io::read(stderr.as_fd(), &mut self.stderr_chunk) {
                Ok(read) => self.on_stderr(turn, read).await,
                Err(_) => break,
            }
        }
    }

    /// Sends `turn/interrupt` once, when the turn id is known and the wire open.
    async fn interrupt(&mut self, turn: &Turn) {
        if self.interrupt_sent {
            return;
        }
        if let Some((thread, id)) = turn.ids() {
            self.interrupt_sent = true;
            let params = json!({"threadId": thread, "turnId": id});
            self.wire.request("turn/interrupt", params).await;
        }
    }

    /// Runs the turn until it ends; `None` when disposal came first.
    async fn drive(
        &mut self,
        turn: &mut Turn,
        turn_start: &str,
    ) -> Option<std::result::Result<TurnEnd, Failure>> {
        loop {
            let event = self.next_event().await;
            let outcome = match event {
                Event::Shutdown => {
                    self.interrupt(turn).await;
                    return None;
                }
                Event::Frame(frame) => self.on_frame(turn, turn_start, frame).await,
                Event::Stderr(read) => {
                    self.on_stderr(turn, read).await;
                    Ok(())
                }
                Event::Cancelled => {
                    self.interrupted = true;
                    self.interrupt(turn).await;
                    Ok(())
                }
                Event::Exited(outcome) => {
                    self.exited = Some(outcome);
                    // Frames already on the pipe get their turn before the exit counts.
                    while let Ok(Ok(Some(line))) =
                        tokio::time::timeout(Duration::from_millis(1), self.wire.lines.next_line())
                            .await
                    {
                        if let Ok(frame) = serde_json::from_str::<Value>(line.trim()) {
                            if let Err(fatal) = self.on_frame(turn, turn_start, frame).await {
                                return Some(Err(Failure::unknown(fatal.stage)));
                            }
                            if let Some(end) = turn.end() {
                                return Some(Ok(end.clone()));
                            }
                        }
                    }
                    return Some(Err(Failure::new(Stage::Process, "process-exit")));
                }
                Event::Eof => {
                    let stage = if turn.ids().is_some() {
                        Stage::Turn
                    } else {
                        Stage::TurnStart
                    };
                    return Some(Err(match self.exit_within(self.grace).await {
                        Some(_) => Failure::new(Stage::Process, "process-exit"),
                        None => Failure::unknown(stage),
                    }));
                }
            };
            if let Err(fatal) = outcome {
                tracing::debug!(message = %fatal.message, "the Codex turn failed");
                return Some(Err(Failure::unknown(fatal.stage)));
            }
            if let Some(end) = turn.end() {
                return Some(Ok(end.clone()));
            }
        }
    }

    async fn on_frame(
        &mut self,
        turn: &mut Turn,
        turn_start: &str,
        frame: Value,
    ) -> std::result::Result<(), Fatal> {
        let outcome = match classify(frame) {
            Some(Frame::Response { id, outcome }) if id == turn_start => match outcome {
                Ok(result) => turn.commit(&result),
                Err(_) => Err(Fatal {
                    stage: Stage::TurnStart,
                    message: format!("{PREFIX}: turn/start failed"),
                }),
            },
            Some(Frame::Request { id, method, params }) => {
                self.answer(turn, id, &method, &params).await
            }
            Some(Frame::Notification { method, params }) => turn.notify(&method, &params),
            // Responses to anything else (a best-effort interrupt) and garbage are ignored.
            _ => Ok(()),
        };
        self.partial.set(&text_of(&turn.output()));
        outcome
    }

    /// The run's result: the answer, or the failure in safe words with the latest decision.
    fn settle(
        &mut self,
        turn: &mut Turn,
        settled: std::result::Result<TurnEnd, Failure>,
    ) -> SubagentResult {
        let (stop_reason, failure) = match settled {
            Ok(TurnEnd::Completed(output)) => {
                return SubagentResult::with_output(StopReason::Completed, output)
            }
            Ok(TurnEnd::Failed {
                stop_reason,
                failure,
                message,
            }) => {
                tracing::debug!(%message, "the Codex turn ended unsuccessfully");
                (stop_reason, failure)
            }
            Err(failure) => (StopReason::Error, failure),
        };
        let failure = failure.with_outcome(self.exited.or_else(|| self.process.outcome()));
        let line = failure.line();
        let diagnostic = match turn.fact() {
            Some(fact) => format!("{line}\n{}", fact.text(self.mode.as_str())),
            None => line.clone(),
        };
        if stop_reason == StopReason::Error {
            tracing::warn!(
                "{PREFIX} \"{}\": child run failed (error): {PREFIX}: {line}",
                self.name
            );
        }
        SubagentResult::with_output(stop_reason, turn.output()).with_diagnostic(diagnostic)
    }
}

/// The dispose ladder of one run's child: interrupt, close the wire, terminate, wait.
struct Teardown {
    process: Arc<ChildProcess>,
    connection: JoinHandle<()>,
    /// Dropping the teardown unstarted (an abandoned start) still ends the session.
    shutdown: tokio_util::sync::DropGuard,
    grace: Duration,
}

impl Teardown {
    async fn run(self) {
        let Self {
            process,
            mut connection,
            shutdown,
            grace,
        } = self;
        drop(shutdown);
        // The session sends its interrupt and drops the wire (closing stdin) as it ends.
        if tokio::time::timeout(grace, &mut connection).await.is_err() {
            connection.abort();
        }
        process.terminate().await;
        tracing::debug!(pid = process.pid(), outcome = %process.outcome().unwrap_or_default(), "Codex child released");
    }
}
