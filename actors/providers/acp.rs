//! The ACP provider: each one-shot run starts a fresh Agent Client Protocol agent process over
//! stdio, speaks `initialize` → `session/new` → `session/prompt` through the official
//! `agent-client-protocol` crate, collects the agent's message chunks as the output, answers
//! permission requests by policy (never asking a human), and disposes the process with the
//! EOF-then-signal ladder.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock as AcpBlock, ContentChunk, InitializeRequest,
    PermissionOptionKind, PromptRequest, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionNotification, SessionUpdate,
};
use agent_client_protocol::{v1, Agent, ByteStreams, Client, UntypedMessage};
use serde::Deserialize;
use tokio::sync::oneshot;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use tokio_util::sync::CancellationToken;

use super::process::{process_provider, ProcessShell};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::out_of_process::diagnostic::{log_run_failure, FailureLine};
use crate::out_of_process::launch::{publish, startup_within, Startup, Teardown};
use crate::out_of_process::ndjson::{LineBounded, FRAME_TOO_LONG};
use crate::out_of_process::stderr_tail::StderrTail;
use crate::out_of_process::{
    child_env, grace_ms, positive_bytes, resolve_child_cwd, validate_configured_cwd, ChildProcess,
    ExitOutcome, PartialOutput, ProcessSpec, StderrMode,
};
use crate::seam::{ResolvedSubagentStartRequest, SubagentResult, SubagentRun};
use crate::stop_reason::StopReason;

/// The message prefix of this provider's errors.
const PREFIX: &str = "subagent-acp";

/// How the provider answers an agent's `session/request_permission`: no human is ever asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AcpPermission {
    /// Select the first option whose kind is `allow_once` or `allow_always`; cancel when there
    /// is none.
    Allow,
    /// Always answer `cancelled`.
    #[default]
    Reject,
}

fn default_acp_name() -> String {
    "acp".to_owned()
}

/// The ACP provider's configuration, in the TypeScript runtime's keys (`providerName`, `command`,
/// `args`, `cwd`, `permission`, `env`, `disposeEofGraceMs`, `disposeGraceMs`), and this runtime's
/// `inheritEnv`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AcpProviderConfig {
    /// The registry name (default `acp`).
    #[serde(default = "default_acp_name")]
    pub provider_name: String,
    /// The agent executable, started once per run.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// A working-directory override for every child (also the cwd announced in
    /// `session/new`); a relative one resolves against the launch directory. Absent: each
    /// child runs in its parent session's cwd.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The permission policy (default `reject`).
    #[serde(default)]
    pub permission: AcpPermission,
    /// Variables laid over the inherited environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names the child inherits from this process's environment when they are set, beyond the
    /// base set ([`BASE_ENV`](crate::out_of_process::BASE_ENV) and `LC_*`): a proxy, a
    /// certificate bundle, a credential the host means to pass on. Nothing else is inherited.
    #[serde(default)]
    pub inherit_env: Vec<String>,
    /// The longest line of the agent's output read (default 16 MiB,
    /// [`DEFAULT_MAX_FRAME_BYTES`](crate::out_of_process::DEFAULT_MAX_FRAME_BYTES)): past it the
    /// connection fails and the run with it (`category: frame-too-long`), so an agent printing
    /// an endless line cannot exhaust this process's memory.
    #[serde(default = "crate::out_of_process::default_max_frame_bytes")]
    pub max_frame_bytes: usize,
    /// How long the agent has to answer `initialize` and `session/new` (default 60000 ms):
    /// past it the start fails (`CHILD_START_FAILED`, `stage: startup; category: timeout`) and
    /// the child is reaped, so an agent that never answers cannot hold its caller.
    #[serde(default = "crate::out_of_process::default_startup_timeout_ms")]
    pub startup_timeout_ms: f64,
    /// How long a disposed child has to exit after its stdin closes (default 6000 ms; it
    /// outlasts the SIGTERM grace so a child that flushes on EOF can finish).
    #[serde(default = "crate::out_of_process::default_dispose_eof_grace_ms")]
    pub dispose_eof_grace_ms: f64,
    /// How long the tree has between SIGTERM and SIGKILL (default 3000 ms).
    #[serde(default = "crate::out_of_process::default_dispose_grace_ms")]
    pub dispose_grace_ms: f64,
}

impl AcpProviderConfig {
    /// A configuration that runs `command` with the defaults.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            provider_name: default_acp_name(),
            command: command.into(),
            args: Vec::new(),
            cwd: None,
            permission: AcpPermission::default(),
            env: BTreeMap::new(),
            inherit_env: Vec::new(),
            max_frame_bytes: crate::out_of_process::default_max_frame_bytes(),
            startup_timeout_ms: crate::out_of_process::default_startup_timeout_ms(),
            dispose_eof_grace_ms: crate::out_of_process::default_dispose_eof_grace_ms(),
            dispose_grace_ms: crate::out_of_process::default_dispose_grace_ms(),
        }
    }
}

/// What a start needs, checked once at load.
#[derive(Debug)]
struct AcpSettings {
    /// The message prefix (`subagent-acp`, or `subagent-sdk` for the SDK provider).
    prefix: &'static str,
    /// What messages call the child (`ACP`, or `SDK`).
    child_kind: &'static str,
    /// Whether a failed start says what the child wrote to stderr (the SDK provider's child is
    /// this crate's own binary, whose last words name the problem).
    stderr_tail: bool,
    name: String,
    argv: Vec<OsString>,
    cwd: Option<PathBuf>,
    permission: AcpPermission,
    env: BTreeMap<String, String>,
    /// Names inherited from this process's environment beyond the base set.
    inherit_env: Vec<String>,
    /// The longest line of output read.
    max_frame_bytes: usize,
    /// How long the handshake and the session's creation may take.
    startup_timeout: Duration,
    eof_grace: Duration,
    grace: Duration,
}

/// The ACP provider: one-shot runs only, no start capabilities, no parent context.
pub struct AcpProvider {
    shell: ProcessShell<AcpSettings>,
}

process_provider!(AcpProvider, AcpSettings, start_run);

impl AcpProvider {
    /// Checks `config` (the graces and the cwd override, resolved against this process's
    /// working directory) and builds the provider. Nothing is started until a run.
    ///
    /// # Errors
    /// `INVALID_CONFIG` with the TypeScript runtime's message for an empty name or command, a grace
    /// that is not positive, finite and at most 2147483647 ms, or an unusable cwd override.
    pub fn new(config: AcpProviderConfig) -> Result<Self> {
        Self::with_launch_dir(config, &Self::launch_dir(PREFIX)?)
    }

    /// [`AcpProvider::new`] with relative cwd overrides resolved against `launch_dir`.
    ///
    /// # Errors
    /// As [`AcpProvider::new`].
    pub fn with_launch_dir(config: AcpProviderConfig, launch_dir: &Path) -> Result<Self> {
        Self::build((PREFIX, "ACP"), config, launch_dir)
    }

    /// The launch directory relative cwd overrides resolve against.
    pub(crate) fn launch_dir(prefix: &str) -> Result<PathBuf> {
        std::env::current_dir().map_err(|error| {
            SubagentError::new(
                ErrorCode::InvalidConfig,
                format!("{prefix}: the launch directory is unreadable"),
            )
            .with_source(error)
        })
    }

    /// Checks `config` under the message prefix `prefix`.
    pub(crate) fn build(
        (prefix, child_kind): (&'static str, &'static str),
        config: AcpProviderConfig,
        launch_dir: &Path,
    ) -> Result<Self> {
        let invalid = |message: &str| {
            SubagentError::new(ErrorCode::InvalidConfig, format!("{prefix}: {message}"))
        };
        if config.provider_name.is_empty() {
            return Err(invalid("providerName must not be empty"));
        }
        if config.command.is_empty() {
            return Err(invalid("command must not be empty"));
        }
        let startup_timeout = grace_ms(prefix, "startupTimeoutMs", config.startup_timeout_ms)?;
        let eof_grace = grace_ms(prefix, "disposeEofGraceMs", config.dispose_eof_grace_ms)?;
        let grace = grace_ms(prefix, "disposeGraceMs", config.dispose_grace_ms)?;
        let cwd = validate_configured_cwd(prefix, config.cwd.as_deref(), launch_dir)?;
        let argv = std::iter::once(config.command)
            .chain(config.args)
            .map(OsString::from)
            .collect();
        Ok(Self {
            shell: ProcessShell::new(AcpSettings {
                prefix,
                child_kind,
                stderr_tail: child_kind == "SDK",
                name: config.provider_name,
                argv,
                cwd,
                permission: config.permission,
                env: config.env,
                inherit_env: config.inherit_env,
                max_frame_bytes: positive_bytes(prefix, "maxFrameBytes", config.max_frame_bytes)?,
                startup_timeout,
                eof_grace,
                grace,
            }),
        })
    }
}

fn aborted_before_start(child_kind: &str) -> SubagentError {
    SubagentError::new(
        ErrorCode::AbortedBeforePublication,
        format!("subagent request was aborted before the {child_kind} child started"),
    )
}

/// What an ACP error says: its message, and its data when it carries any (agents put the
/// cause there). Logged at debug level only, cut to [`AGENT_TEXT_LOGGED`] bytes: it is the
/// agent's own text, which may name files, commands or secrets.
fn describe(error: &agent_client_protocol::Error) -> String {
    let mut said = match &error.data {
        None | Some(serde_json::Value::Null) => error.message.clone(),
        Some(serde_json::Value::String(data)) => format!("{} ({data})", error.message),
        Some(data) => format!("{} ({data})", error.message),
    };
    if said.len() > AGENT_TEXT_LOGGED {
        crate::seam::result::truncate_at_char(&mut said, AGENT_TEXT_LOGGED);
        said.push('…');
    }
    said
}

/// The most of an agent's own error text the debug log keeps.
const AGENT_TEXT_LOGGED: usize = 512;

/// What the diagnostics call the child: an ACP agent, or this crate's own binary.
fn product_of(child_kind: &str) -> &'static str {
    if child_kind == "SDK" {
        "subagents SDK child"
    } else {
        "ACP agent"
    }
}

/// The safe account of a JSON-RPC error the agent answered at `stage`: its code, never its
/// text (which goes to the debug log).
fn rpc_failure(
    prefix: &str,
    product: &'static str,
    stage: &'static str,
    error: &agent_client_protocol::Error,
) -> FailureLine {
    tracing::debug!(stage, "{prefix}: the agent answered: {}", describe(error));
    FailureLine::json_rpc(product, stage, i64::from(i32::from(error.code)))
}

fn start_failed(
    prefix: &str,
    product: &'static str,
    stage: &'static str,
    error: &agent_client_protocol::Error,
) -> SubagentError {
    let line = rpc_failure(prefix, product, stage, error).line();
    SubagentError::new(ErrorCode::ChildStartFailed, format!("{prefix}: {line}"))
}

/// A startup failure with how the child ended, when it had ended on its own (`…; exit code:
/// 3`).
fn with_exit(error: SubagentError, outcome: Option<ExitOutcome>) -> SubagentError {
    let said = outcome
        .map(|outcome| outcome.to_string())
        .unwrap_or_default();
    if said.is_empty() {
        error
    } else {
        SubagentError::new(error.code(), format!("{}; {said}", error.message()))
    }
}

/// The three phases: validation (nothing started), startup (spawn, handshake, session; a
/// failure reaps the child first), publication.
async fn start_run(
    settings: Arc<AcpSettings>,
    resolved: ResolvedSubagentStartRequest,
) -> Result<SubagentRun> {
    let request = resolved.request;
    let parent_cwd = request.parent.header().cwd;
    let (prefix, child_kind) = (settings.prefix, settings.child_kind);
    let cwd = resolve_child_cwd(prefix, settings.cwd.as_deref(), parent_cwd.as_deref())?;
    if request.cancel.is_cancelled() {
        return Err(aborted_before_start(child_kind));
    }
    let process = ChildProcess::spawn(&ProcessSpec {
        argv: settings.argv.clone(),
        cwd: cwd.clone(),
        env: child_env(
            std::env::vars_os(),
            settings.inherit_env.iter().map(String::as_str),
            &settings.env,
        ),
        stderr: if settings.stderr_tail {
            StderrMode::Piped
        } else {
            StderrMode::Inherit
        },
        grace: settings.grace,
    })?;
    let (Some(stdin), Some(stdout)) = (process.take_stdin(), process.take_stdout()) else {
        return Err(SubagentError::bug("a child started without its pipes"));
    };
    let stderr = process.take_stderr().map(StderrTail::forward);
    let local = request.cancel.child_token();
    let partial = PartialOutput::default();
    let shutdown = CancellationToken::new();
    let (started_tx, started_rx) = oneshot::channel();
    let (answer_tx, answer_rx) = oneshot::channel();
    let too_long = Arc::new(AtomicBool::new(false));
    // The delegating span's W3C trace context, for the agent to continue (`_meta`).
    let traceparent = crate::trace::traceparent_of(&request.trace);
    let session = Session {
        prefix,
        cwd,
        traceparent,
        prompt: request
            .prompt
            .iter()
            .filter_map(|block| block.as_text())
            .map(|text| AcpBlock::from(text.to_owned()))
            .collect(),
        permission: settings.permission,
        partial: partial.clone(),
        local: local.clone(),
        started: started_tx,
        answer: answer_tx,
        product: product_of(child_kind),
        too_long: Arc::clone(&too_long),
    };
    // The agent's lines are bounded before the protocol's reader sees them.
    let stdout = LineBounded::new(stdout, settings.max_frame_bytes, Arc::clone(&too_long));
    let connection = tokio::spawn(connect(session, stdin, stdout, shutdown.clone()));
    let teardown =
        Teardown::eof_first(Arc::new(process), connection, &shutdown, settings.eof_grace);
    let started = startup_within(&request.cancel, settings.startup_timeout, started_rx).await;
    let failure = match started {
        Startup::Answered(Ok(Ok(()))) => None,
        Startup::Cancelled => Some((aborted_before_start(child_kind), false)),
        Startup::TimedOut => {
            let line = FailureLine::new(product_of(child_kind), "startup", "timeout").line();
            Some((
                SubagentError::new(
                    ErrorCode::ChildStartFailed,
                    format!(
                        "{prefix}: {line}; no answer to the handshake within {} ms",
                        settings.startup_timeout.as_millis()
                    ),
                ),
                false,
            ))
        }
        Startup::Answered(Ok(Err(failure))) => Some((failure.error, failure.child_closed)),
        // The connection ends on its own only when the child closed its side.
        Startup::Answered(Err(_)) if too_long.load(Ordering::Acquire) => {
            let line = FailureLine::new(product_of(child_kind), "startup", FRAME_TOO_LONG).line();
            Some((
                SubagentError::new(ErrorCode::ChildStartFailed, format!("{prefix}: {line}")),
                true,
            ))
        }
        Startup::Answered(Err(_)) => Some((
            SubagentError::new(
                ErrorCode::ChildStartFailed,
                format!("{prefix}: the {child_kind} child closed the connection during startup"),
            ),
            true,
        )),
    };
    if let Some((error, child_closed)) = failure {
        let (before, after) = teardown.run().await;
        if request.cancel.is_cancelled() {
            return Err(aborted_before_start(child_kind));
        }
        let error = with_exit(error, if child_closed { after } else { before });
        let said = match stderr {
            Some(stderr) => stderr.text(Duration::from_secs(1)).await,
            None => String::new(),
        };
        return Err(if said.is_empty() {
            error
        } else {
            SubagentError::new(error.code(), format!("{}; stderr: {said}", error.message()))
        });
    }
    if let Some(stderr) = stderr {
        stderr.detach();
    }
    let output = partial.clone();
    let product = product_of(child_kind);
    let name = settings.name.clone();
    let run_cancel = local.clone();
    let attempt_too_long = Arc::clone(&too_long);
    let attempt = async move {
        // A connection gone before the answer ended the run as a failure of its prompt.
        let answered = answer_rx.await.unwrap_or_else(|_| {
            Err(FailureLine::new(
                product,
                "prompt",
                lost_connection(&attempt_too_long),
            ))
        });
        let failure = match answered {
            Ok(stop) => match harness_stop_reason(&stop) {
                StopReason::Error => FailureLine::new(product, "prompt", unusable_stop(&stop)),
                reason => return Ok(SubagentResult::with_output(reason, output.snapshot())),
            },
            Err(failure) => failure,
        };
        let line = failure.line();
        log_run_failure!(prefix, &name, &line, run_cancel.is_cancelled());
        Ok(SubagentResult::with_output(StopReason::Error, output.snapshot()).with_diagnostic(line))
    };
    Ok(publish(
        format!("{prefix} \"{}\"", settings.name),
        attempt,
        partial,
        local,
        teardown,
    ))
}

/// The failure category of an agent whose `initialize` answered a protocol version other than 1.
const PROTOCOL_VERSION_MISMATCH: &str = "protocol-version-mismatch";

/// Whether `error` is the ACP connection refusing an `initialize` answer for its protocol
/// version. ACP says an agent that cannot speak the version asked for answers the one it
/// speaks, and a client that does not support that one disconnects: the connection checks the
/// answer itself and fails the request with `-32600` and words of its own (never the agent's),
/// which are all that tells this refusal from another invalid request.
fn is_protocol_version_refusal(error: &agent_client_protocol::Error) -> bool {
    let said = error.data.as_ref().and_then(serde_json::Value::as_str);
    error.code == agent_client_protocol::ErrorCode::INVALID_REQUEST
        && said.is_some_and(|said| said.contains("ACP protocol version"))
}

/// The failure category of a connection that ended before the prompt was answered: the
/// agent's line past `maxFrameBytes`, or the connection closing.
fn lost_connection(too_long: &AtomicBool) -> &'static str {
    if too_long.load(Ordering::Acquire) {
        FRAME_TOO_LONG
    } else {
        "connection-closed"
    }
}

/// The failure category of an ACP stop reason that ends a run as an error.
fn unusable_stop(stop: &str) -> &'static str {
    if stop == "max_turn_requests" {
        "max-turn-requests"
    } else {
        "unknown-stop-reason"
    }
}

/// The harness stop reason of an ACP one: `end_turn` completes; `max_tokens`, `refusal` and
/// `cancelled` keep their meaning; `max_turn_requests` and anything newer are failures.
fn harness_stop_reason(stop: &str) -> StopReason {
    match stop {
        "end_turn" => StopReason::Completed,
        "max_tokens" => StopReason::MaxTokens,
        "refusal" => StopReason::Refusal,
        "cancelled" => StopReason::Aborted,
        _ => StopReason::Error,
    }
}

/// One run's protocol side, driven inside its connection.
struct Session {
    prefix: &'static str,
    cwd: PathBuf,
    /// The delegating span's `traceparent`, sent in the prompt's `_meta` when there is one.
    traceparent: Option<String>,
    prompt: Vec<AcpBlock>,
    permission: AcpPermission,
    partial: PartialOutput,
    local: CancellationToken,
    started: oneshot::Sender<Result<(), StartupFailure>>,
    /// The agent's stop reason, or why the prompt failed, in safe words.
    answer: oneshot::Sender<std::result::Result<String, FailureLine>>,
    /// What diagnostics call the child.
    product: &'static str,
    /// Set once the agent wrote a line past `maxFrameBytes` (the connection then fails).
    too_long: Arc<AtomicBool>,
}

/// Runs the client side of the connection until `shutdown`: the handshake, then the prompt.
/// Returning drops the transport, which closes the child's stdin.
async fn connect(
    session: Session,
    stdin: tokio::process::ChildStdin,
    stdout: LineBounded<tokio::process::ChildStdout>,
    shutdown: CancellationToken,
) {
    let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
    let session_id: Arc<OnceLock<String>> = Arc::default();
    let chunks = session.partial.clone();
    let ours = Arc::clone(&session_id);
    let permission = session.permission;
    let outcome = Client
        .v1()
        .name("subagents")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx: v1::ConnectionTo<Agent>| {
                let for_us = ours
                    .get()
                    .is_none_or(|id| **id == *notification.session_id.0);
                // Only message text counts: thoughts, tool calls, plans and non-text chunks
                // contribute nothing.
                if let (
                    true,
                    SessionUpdate::AgentMessageChunk(ContentChunk {
                        content: AcpBlock::Text(text),
                        ..
                    }),
                ) = (for_us, notification.update)
                {
                    chunks.push(&text.text);
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest,
                        responder: v1::Responder<RequestPermissionResponse>,
                        _cx: v1::ConnectionTo<Agent>| {
                responder.respond(RequestPermissionResponse::new(permission_outcome(
                    permission, &request,
                )))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async move |cx: v1::ConnectionTo<Agent>| {
            let cancel = CancelOnce::default();
            tokio::select! {
                biased;
                () = shutdown.cancelled() => {
                    // Disposed while the prompt runs: the child hears session/cancel before
                    // its stdin closes (a clean return drains what was sent).
                    cancel.send(&cx, session_id.get());
                }
                () = drive(cx.clone(), session, Arc::clone(&session_id), cancel.clone()) => {}
            }
            Ok(())
        })
        .await;
    if let Err(error) = outcome {
        // Typically a broken pipe after the child died: the run already settled from it.
        tracing::debug!(%error, "an ACP connection ended with an error");
    }
}

/// The answer to a permission request under `policy`.
fn permission_outcome(
    policy: AcpPermission,
    request: &RequestPermissionRequest,
) -> RequestPermissionOutcome {
    let allow = request.options.iter().find(|option| {
        matches!(
            option.kind,
            PermissionOptionKind::AllowOnce | PermissionOptionKind::AllowAlways
        )
    });
    match (policy, allow) {
        (AcpPermission::Allow, Some(option)) => RequestPermissionOutcome::Selected(
            SelectedPermissionOutcome::new(option.option_id.clone()),
        ),
        _ => RequestPermissionOutcome::Cancelled,
    }
}

/// The best-effort `session/cancel` of a pending prompt, sent at most once.
#[derive(Clone, Default)]
struct CancelOnce {
    prompt_pending: Arc<AtomicBool>,
    sent: Arc<AtomicBool>,
}

impl CancelOnce {
    fn send(&self, cx: &v1::ConnectionTo<Agent>, session: Option<&String>) {
        let Some(session) = session else { return };
        if self.prompt_pending.load(Ordering::Acquire)
            && !cx.is_incoming_closed()
            && !self.sent.swap(true, Ordering::AcqRel)
        {
            let _ = cx.send_notification(CancelNotification::new(session.clone()));
        }
    }
}

/// The handshake, then the prompt; then it holds the connection open until shutdown.
async fn drive(
    cx: v1::ConnectionTo<Agent>,
    session: Session,
    session_id: Arc<OnceLock<String>>,
    cancel: CancelOnce,
) {
    let Session {
        prefix,
        cwd,
        traceparent,
        prompt,
        local,
        started,
        answer,
        product,
        too_long,
        ..
    } = session;
    let id = match handshake(&cx, (prefix, product), &cwd, &too_long).await {
        Ok(id) => id,
        Err(error) => {
            let _ = started.send(Err(error));
            return;
        }
    };
    let id = session_id.get_or_init(|| id).clone();
    if started.send(Ok(())).is_err() {
        return;
    }
    // Sent untyped so that a stop reason newer than this crate's schema still maps.
    // W3C trace context travels in `_meta`, as ACP reserves it for such metadata.
    let meta = traceparent.map(|traceparent| {
        serde_json::Map::from_iter([("traceparent".to_owned(), traceparent.into())])
    });
    let prompted = match UntypedMessage::new(
        "session/prompt",
        PromptRequest::new(id.clone(), prompt).meta(meta),
    ) {
        Ok(request) => request,
        Err(error) => {
            tracing::debug!(%error, "{prefix}: session/prompt could not be built");
            let _ = answer.send(Err(FailureLine::new(product, "prompt", "invalid-request")));
            return;
        }
    };
    cancel.prompt_pending.store(true, Ordering::Release);
    let prompted = cx.send_request(prompted).block_task();
    tokio::pin!(prompted);
    let response = tokio::select! {
        response = &mut prompted => response,
        () = local.cancelled() => {
            // Best effort: the run has already settled `aborted`; the child may still stop.
            cancel.send(&cx, Some(&id));
            prompted.await
        }
    };
    cancel.prompt_pending.store(false, Ordering::Release);
    let stop = response
        .map_err(|error| {
            if too_long.load(Ordering::Acquire) {
                FailureLine::new(product, "prompt", FRAME_TOO_LONG)
            } else {
                rpc_failure(prefix, product, "prompt", &error)
            }
        })
        .and_then(|reply| {
            reply
                .get("stopReason")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| FailureLine::new(product, "prompt", "missing-stop-reason"))
        });
    let _ = answer.send(stop);
    std::future::pending::<()>().await;
}

/// `initialize` (protocol 1, no client capabilities), then `session/new` in `cwd`; returns the
/// agent's session id.
async fn handshake(
    cx: &v1::ConnectionTo<Agent>,
    (prefix, product): (&str, &'static str),
    cwd: &Path,
    too_long: &AtomicBool,
) -> Result<String, StartupFailure> {
    let failed = |what: &'static str| {
        move |error: agent_client_protocol::Error| StartupFailure {
            child_closed: agent_client_protocol::is_incoming_transport_closed(&error),
            error: if too_long.load(Ordering::Acquire) {
                let line = FailureLine::new(product, what, FRAME_TOO_LONG).line();
                SubagentError::new(ErrorCode::ChildStartFailed, format!("{prefix}: {line}"))
            } else {
                start_failed(prefix, product, what, &error)
            },
        }
    };
    cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
        .block_task()
        .await
        .map_err(|error| {
            if is_protocol_version_refusal(&error) {
                let line =
                    FailureLine::new(product, "initialize", PROTOCOL_VERSION_MISMATCH).line();
                StartupFailure {
                    child_closed: false,
                    error: SubagentError::new(
                        ErrorCode::ChildStartFailed,
                        format!("{prefix}: {line}: this client speaks ACP protocol version 1"),
                    ),
                }
            } else {
                failed("initialize")(error)
            }
        })?;
    // Sent untyped so that a reply without a session id gets the reference's message.
    let new_session = UntypedMessage::new(
        "session/new",
        serde_json::json!({ "cwd": cwd, "mcpServers": [] }),
    )
    .map_err(failed("session-new"))?;
    let reply = cx
        .send_request(new_session)
        .block_task()
        .await
        .map_err(failed("session-new"))?;
    match reply.get("sessionId").and_then(serde_json::Value::as_str) {
        Some(id) => Ok(id.to_owned()),
        None => Err(StartupFailure {
            error: SubagentError::new(
                ErrorCode::ChildStartFailed,
                "ACP child published without a session id",
            ),
            child_closed: false,
        }),
    }
}

/// Why a startup failed, and whether the child had closed its output (it is exiting on its
/// own, so how it exits belongs in the message).
struct StartupFailure {
    error: SubagentError,
    child_closed: bool,
}

#[cfg(test)]
mod tests {
    use super::harness_stop_reason;
    use crate::stop_reason::StopReason;

    // ACP-03
    #[test]
    fn an_unknown_acp_stop_reason_is_a_failure() {
        assert_eq!(harness_stop_reason("end_turn"), StopReason::Completed);
        assert_eq!(harness_stop_reason("max_turn_requests"), StopReason::Error);
        assert_eq!(harness_stop_reason("paused_for_lunch"), StopReason::Error);
    }
}
