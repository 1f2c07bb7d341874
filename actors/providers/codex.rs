//! The Codex provider: each one-shot run starts a fresh `codex app-server --stdio` and drives
//! one ephemeral thread and one turn over its NDJSON JSON-RPC wire: `initialize` →
//! `initialized` → `thread/start` → (publication) → `turn/start`, then the turn's notifications
//! and unattended server requests until `turn/completed`. Failures are reported only in safe
//! words (stage, category, HTTP status, exit facts and the latest unattended decision), never
//! in the product's own text.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::ChildStderr;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::process::{process_provider, ProcessShell};
use crate::content::text_of;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::out_of_process::codex::turn::{Fatal, Turn, TurnEnd};
use crate::out_of_process::codex::{FailureLine, Stage, StderrSignatures, PREFIX, PRODUCT};
use crate::out_of_process::diagnostic::log_run_failure;
use crate::out_of_process::launch::{publish, startup_within, Startup, Teardown};
use crate::out_of_process::ndjson::{FrameReader, FrameWriter, Read, FRAME_TOO_LONG};
use crate::out_of_process::{
    child_env, dispose_grace, grace_ms, no_parent_cwd, positive_bytes, require_non_empty,
    task_texts, usable_cwd, with_trace_context, ChildProcess, CwdLabel, ExitOutcome, PartialOutput,
    ProcessSpec, StderrMode,
};
use crate::seam::{ResolvedSubagentStartRequest, SubagentResult, SubagentRun};
use crate::stop_reason::StopReason;

mod config;
pub use config::{CodexPermissionMode, CodexProviderConfig};
use config::{CodexSettings, CODEX_ENV};

/// The Codex provider: one-shot runs only, no start capabilities, no parent context.
pub struct CodexProvider {
    shell: ProcessShell<CodexSettings>,
}

process_provider!(CodexProvider, CodexSettings, start_run);

impl CodexProvider {
    /// Checks `config` and builds the provider; loading starts no process.
    ///
    /// # Errors
    /// `INVALID_CONFIG` for an empty name or command, or a grace that is not positive,
    /// finite and at most 2147483647 ms.
    pub fn new(config: CodexProviderConfig) -> Result<Self> {
        require_non_empty(PREFIX, "providerName", &config.provider_name)?;
        require_non_empty(PREFIX, "command", &config.command)?;
        let grace = dispose_grace(PREFIX, config.dispose_grace_ms)?;
        let startup_timeout = grace_ms(PREFIX, "startupTimeoutMs", config.startup_timeout_ms)?;
        Ok(Self {
            shell: ProcessShell::new(CodexSettings {
                name: config.provider_name,
                argv: std::iter::once(config.command)
                    .chain(config.args)
                    .map(OsString::from)
                    .collect(),
                env: config.env,
                inherit_env: config.inherit_env,
                max_frame_bytes: positive_bytes(PREFIX, "maxFrameBytes", config.max_frame_bytes)?,
                mode: config.permission_mode,
                startup_timeout,
                grace,
            }),
        })
    }
}

fn aborted(when: &str) -> SubagentError {
    SubagentError::new(
        ErrorCode::AbortedBeforePublication,
        format!("{PREFIX}: request was aborted before {when}"),
    )
}

async fn start_run(
    settings: Arc<CodexSettings>,
    resolved: ResolvedSubagentStartRequest,
) -> Result<SubagentRun> {
    let request = resolved.request;
    let parent_cwd = request
        .parent
        .header()
        .cwd
        .ok_or_else(|| no_parent_cwd(PREFIX))?;
    let cwd = match usable_cwd(PREFIX, CwdLabel::ParentSession, &parent_cwd) {
        Ok(cwd) => cwd,
        Err(_) if request.cancel.is_cancelled() => return Err(aborted("app-server startup")),
        Err(error) => return Err(Stage::Initialize.unknown().start_error(PREFIX, error)),
    };
    let texts: Vec<String> = task_texts(PREFIX, &request.prompt)?
        .into_iter()
        .map(str::to_owned)
        .collect();
    if request.cancel.is_cancelled() {
        return Err(aborted("app-server startup"));
    }
    let process = ChildProcess::spawn(&ProcessSpec {
        argv: settings.argv.clone(),
        cwd: cwd.clone(),
        env: with_trace_context(
            child_env(
                std::env::vars_os(),
                CODEX_ENV
                    .into_iter()
                    .chain(settings.inherit_env.iter().map(String::as_str)),
                &settings.env,
            ),
            &request.trace,
        ),
        stderr: StderrMode::Piped,
        grace: settings.grace,
    })
    .map_err(|error| Stage::Initialize.unknown().start_error(PREFIX, error))?;
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
        writer: FrameWriter::new(stdin),
        reader: FrameReader::new(stdout, settings.max_frame_bytes),
        stderr: process.take_stderr(),
        signatures: StderrSignatures::default(),
        stderr_chunk: vec![0; 8192],
        process: Arc::clone(&process),
        partial: partial.clone(),
        local: local.clone(),
        shutdown: shutdown.clone(),
        exited: None,
        cancel_seen: false,
        interrupt_sent: false,
    };
    let connection = tokio::spawn(session.run(started_tx, answer_tx));
    let teardown = Teardown::terminate_after(process, connection, &shutdown, settings.grace);
    let started = startup_within(&request.cancel, settings.startup_timeout, started_rx).await;
    let failure = match started {
        Startup::Answered(Ok(Ok(()))) => None,
        Startup::Cancelled => Some(None),
        Startup::TimedOut => Some(Some((
            Stage::Startup.failure("timeout"),
            protocol(format!(
                "{PREFIX}: no answer to the handshake within {} ms",
                settings.startup_timeout.as_millis()
            )),
        ))),
        Startup::Answered(Ok(Err(failure))) => Some(Some(failure)),
        Startup::Answered(Err(_)) => Some(Some((
            Stage::Initialize.unknown(),
            SubagentError::bug("the Codex session ended during startup"),
        ))),
    };
    if let Some(failure) = failure {
        teardown.run().await;
        return Err(match failure {
            Some((failure, cause)) if !request.cancel.is_cancelled() => {
                failure.start_error(PREFIX, cause)
            }
            _ => aborted("run publication"),
        });
    }
    let attempt = async move {
        answer_rx
            .await
            .map_err(|_| SubagentError::bug("the Codex session ended before the turn was answered"))
    };
    Ok(publish(
        format!("{PREFIX} \"{}\"", settings.name),
        attempt,
        partial,
        local,
        teardown,
    ))
}

/// The stage a turn is in: before its start was accepted, or running.
fn turn_stage(turn: &Turn) -> Stage {
    if turn.ids().is_some() {
        Stage::Turn
    } else {
        Stage::TurnStart
    }
}

/// What the run's loop waits for.
enum Event {
    Frame(Value),
    /// A line longer than `maxFrameBytes` (skipped): the run fails.
    FrameTooLong,
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

type StartupFailure = (FailureLine, SubagentError);

/// One run's protocol side: the handshake, the turn, and the settlement.
struct CodexSession {
    name: String,
    mode: CodexPermissionMode,
    grace: Duration,
    cwd: String,
    texts: Vec<String>,
    writer: FrameWriter,
    reader: FrameReader,
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
    cancel_seen: bool,
    /// `turn/interrupt` was sent (at most once).
    interrupt_sent: bool,
}

fn protocol(message: impl Into<String>) -> SubagentError {
    SubagentError::new(ErrorCode::ChildStartFailed, message)
}

impl CodexSession {
    /// The next thing to handle. Stderr comes before stdout: what the child wrote there first
    /// is observed first.
    async fn next_event(&mut self) -> Event {
        let exited = self.exited.is_some();
        let cancelled = self.cancel_seen;
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
            read = stderr => Event::Stderr(read),
            read = self.reader.next() => match read {
                Read::Frame(frame) => Event::Frame(frame),
                // Unparseable and non-object lines are ignored.
                Read::Garbage => Event::Frame(Value::Null),
                Read::TooLong => Event::FrameTooLong,
                Read::Eof => Event::Eof,
            },
            outcome = self.process.exited(), if !exited => Event::Exited(outcome),
            () = self.local.cancelled(), if !cancelled => Event::Cancelled,
        }
    }

    /// Sends a request and returns its id (`req_` and 32 hex digits).
    async fn request(&mut self, method: &str, params: Value) -> String {
        let id = format!("req_{}", uuid::Uuid::new_v4().simple());
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.writer.send(&frame).await;
        id
    }

    /// Waits for the response to `id`, answering what arrives meanwhile through `turn`.
    async fn response(
        &mut self,
        id: &str,
        turn: &mut Turn,
        stage: Stage,
    ) -> std::result::Result<Value, Option<StartupFailure>> {
        loop {
            let event = self.next_event().await;
            let frame = match event {
                Event::Shutdown => return Err(None),
                Event::Frame(frame) => frame,
                Event::FrameTooLong => {
                    let failure = stage.failure(FRAME_TOO_LONG);
                    let cause = protocol(format!(
                        "{PREFIX}: app-server wrote a line longer than maxFrameBytes"
                    ));
                    return Err(Some((failure, cause)));
                }
                Event::Eof => {
                    let outcome = self.exit_within(self.grace).await;
                    let failure = stage.unknown().with_outcome(outcome);
                    let cause = protocol(format!("{PREFIX}: app-server protocol stream closed"));
                    return Err(Some((failure, cause)));
                }
                Event::Exited(outcome) => {
                    self.exited = Some(outcome);
                    // Frames already on the pipe get their turn before the exit counts.
                    while let Some(frame) = self.queued_frame().await {
                        if let Some(settled) = self.startup_frame(id, turn, stage, frame).await {
                            return settled;
                        }
                    }
                    let failure = stage.unknown().with_outcome(Some(outcome));
                    let cause = protocol(format!("{PREFIX}: app-server exited"));
                    return Err(Some((failure, cause)));
                }
                Event::Stderr(read) => {
                    self.on_stderr(turn, read).await;
                    continue;
                }
                // Before publication the start itself watches the caller's cancellation.
                Event::Cancelled => {
                    self.cancel_seen = true;
                    continue;
                }
            };
            if let Some(settled) = self.startup_frame(id, turn, stage, frame).await {
                return settled;
            }
        }
    }

    /// One frame during startup: the response to `id` settles it; requests are answered and
    /// notifications checked through `turn`.
    async fn startup_frame(
        &mut self,
        id: &str,
        turn: &mut Turn,
        stage: Stage,
        frame: Value,
    ) -> Option<std::result::Result<Value, Option<StartupFailure>>> {
        let failed = |message: String| Some(Err(Some((stage.unknown(), protocol(message)))));
        match classify(frame) {
            Some(Frame::Response {
                id: answered,
                outcome,
            }) if answered == id => {
                Some(outcome.map_err(|error| {
                    Some((stage.unknown(), protocol(format!("{PREFIX}: {error}"))))
                }))
            }
            Some(Frame::Request { id, method, params }) => {
                match self.answer(turn, id, &method, &params).await {
                    Ok(()) => None,
                    Err(fatal) => failed(fatal.message),
                }
            }
            Some(Frame::Notification { method, params }) => match turn.notify(&method, &params) {
                Ok(()) => None,
                Err(fatal) => failed(fatal.message),
            },
            _ => None,
        }
    }

    /// A frame already waiting on stdout (each read bounded to a moment), if any.
    async fn queued_frame(&mut self) -> Option<Value> {
        loop {
            let read = tokio::time::timeout(Duration::from_millis(1), self.reader.next()).await;
            match read {
                Ok(Read::Frame(frame)) => return Some(frame),
                // After the exit, a line too long to read is one frame fewer.
                Ok(Read::Garbage | Read::TooLong) => {}
                Ok(Read::Eof) | Err(_) => return None,
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
        let (reply, outcome) = match turn.request(method, params) {
            Ok(result) => (
                json!({"jsonrpc": "2.0", "id": id, "result": result}),
                Ok(()),
            ),
            Err(fatal) => (
                json!({"jsonrpc": "2.0", "id": id,
                       "error": {"code": -32603, "message": fatal.message}}),
                Err(fatal),
            ),
        };
        self.writer.send(&reply).await;
        outcome
    }

    /// How the process ended, waiting at most `limit` for it (and not past disposal).
    async fn exit_within(&mut self, limit: Duration) -> Option<ExitOutcome> {
        if self.exited.is_none() {
            self.exited = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => None,
                outcome = tokio::time::timeout(limit, self.process.exited()) => outcome.ok(),
            };
        }
        self.exited
    }

    /// `initialize`, `initialized`, `thread/start`: the thread id.
    async fn handshake(
        &mut self,
        turn: &mut Turn,
    ) -> std::result::Result<String, Option<StartupFailure>> {
        let invalid = |stage: Stage, what: &str| {
            let cause = protocol(format!("{PREFIX}: app-server returned invalid {what}"));
            Some((stage.unknown(), cause))
        };
        let params = json!({
            "clientInfo": {"name": "deepseek-harness", "title": "DeepSeek Harness", "version": "0.0.1"},
            "capabilities": {"experimentalApi": false, "requestAttestation": false},
        });
        let id = self.request("initialize", params).await;
        let initialized = self.response(&id, turn, Stage::Initialize).await?;
        if !initialized.is_object() {
            return Err(invalid(Stage::Initialize, "initialize response"));
        }
        self.writer
            .send(&json!({"jsonrpc": "2.0", "method": "initialized"}))
            .await;
        let mut params = json!({"cwd": self.cwd, "ephemeral": true});
        if let (Some(params), Value::Object(fields)) =
            (params.as_object_mut(), self.mode.thread_fields())
        {
            params.extend(fields);
        }
        let id = self.request("thread/start", params).await;
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
            let cause = protocol(format!(
                "{PREFIX}: app-server did not create an ephemeral thread"
            ));
            return Err(Some((Stage::ThreadStart.unknown(), cause)));
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
        // Before the thread exists, no frame can name it; facts seen meanwhile stay.
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
        turn.bind(thread.clone());
        if started.send(Ok(())).is_err() {
            return;
        }
        let input: Vec<Value> = self
            .texts
            .iter()
            .map(|text| json!({"type": "text", "text": text, "text_elements": []}))
            .collect();
        let turn_start = self
            .request("turn/start", json!({"threadId": thread, "input": input}))
            .await;
        turn.turn_start_sent();
        if let Some(settled) = self.drive(&mut turn, &turn_start).await {
            self.drain_stderr(&mut turn).await;
            let result = self.settle(&mut turn, settled);
            let _ = answer.send(result);
            // Keep reading (a full pipe must never block the child) until disposal.
            loop {
                match self.next_event().await {
                    Event::Shutdown => break,
                    Event::Eof => {
                        self.shutdown.cancelled().await;
                        break;
                    }
                    Event::Exited(outcome) => self.exited = Some(outcome),
                    Event::Cancelled => self.cancel_seen = true,
                    Event::Stderr(read) => self.on_stderr(&mut turn, read).await,
                    Event::Frame(_) | Event::FrameTooLong => {}
                }
            }
        }
        // Disposal interrupts the turn, even one that ended (best effort, as the TypeScript runtime does).
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
    /// frame at hand, so it is observed first.
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
        if self.interrupt_sent || !self.writer.is_open() {
            return;
        }
        if let Some((thread, id)) = turn.ids() {
            self.interrupt_sent = true;
            let params = json!({"threadId": thread, "turnId": id});
            self.request("turn/interrupt", params).await;
        }
    }

    /// Runs the turn until it ends; `None` when disposal came first.
    async fn drive(
        &mut self,
        turn: &mut Turn,
        turn_start: &str,
    ) -> Option<std::result::Result<TurnEnd, FailureLine>> {
        loop {
            let outcome = match self.next_event().await {
                Event::Shutdown => return None,
                Event::Frame(frame) => self.on_frame(turn, turn_start, frame).await,
                Event::Stderr(read) => {
                    self.on_stderr(turn, read).await;
                    Ok(())
                }
                Event::Cancelled => {
                    self.cancel_seen = true;
                    self.interrupt(turn).await;
                    Ok(())
                }
                Event::Exited(outcome) => {
                    self.exited = Some(outcome);
                    // Frames already on the pipe get their turn before the exit counts.
                    while let Some(frame) = self.queued_frame().await {
                        if let Err(fatal) = self.on_frame(turn, turn_start, frame).await {
                            return Some(Err(fatal.stage.unknown()));
                        }
                        if let Some(end) = turn.end() {
                            return Some(Ok(end.clone()));
                        }
                    }
                    return Some(Err(Stage::Process.failure("process-exit")));
                }
                Event::FrameTooLong => return Some(Err(turn_stage(turn).failure(FRAME_TOO_LONG))),
                Event::Eof => {
                    let stage = turn_stage(turn);
                    return Some(Err(match self.exit_within(self.grace).await {
                        Some(_) => Stage::Process.failure("process-exit"),
                        None => stage.unknown(),
                    }));
                }
            };
            if let Err(fatal) = outcome {
                tracing::debug!(message = %fatal.message, "the Codex turn failed");
                return Some(Err(fatal.stage.unknown()));
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
        // What the child wrote to stderr before this frame is observed before it.
        self.drain_stderr(turn).await;
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
        settled: std::result::Result<TurnEnd, FailureLine>,
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
        if stop_reason == StopReason::Error {
            log_run_failure!(
                PREFIX,
                &self.name,
                &failure.line(),
                self.local.is_cancelled()
            );
        }
        let fact = turn
            .fact()
            .map(|fact| fact.text(PRODUCT, self.mode.as_str()));
        SubagentResult::with_output(stop_reason, turn.output())
            .with_diagnostic(failure.diagnostic(fact))
    }
}
