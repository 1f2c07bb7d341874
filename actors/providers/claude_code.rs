//! The Claude Code provider: each one-shot run starts a fresh `claude` CLI in stream-json mode
//! (`--input-format stream-json --output-format stream-json`), writes the task as one user
//! message, answers every permission prompt with a denial (no human is ever asked, except in
//! `bypassPermissions` mode where none is asked at all), and consumes the whole message stream:
//! the last strict success is the answer, anything else fails in safe words.
//!
//! The reference drives the CLI through its TypeScript SDK; Rust has none, so this speaks the
//! CLI's own stream-json wire, whose frames live in [`wire`] so they can be corrected against
//! a capture of the pinned CLI.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::process::{process_provider, ProcessShell};
use crate::content::ContentBlock;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::out_of_process::diagnostic::{log_run_failure, Fact, FailureLine};
use crate::out_of_process::launch::{publish, Teardown};
use crate::out_of_process::ndjson::{FrameReader, FrameWriter, Read, FRAME_TOO_LONG};
use crate::out_of_process::{
    child_env, dispose_grace, no_parent_cwd, positive_bytes, require_non_empty, task_texts,
    usable_cwd, with_trace_context, ChildProcess, CwdLabel, PartialOutput, ProcessSpec, StderrMode,
};
use crate::seam::{ResolvedSubagentStartRequest, SubagentResult, SubagentRun};
use crate::stop_reason::StopReason;

const PREFIX: &str = "subagent-claude-code";
/// What Claude Code documents that it reads to start, inherited whenever set: where its own
/// configuration and login live (an API key reaches it only through `env` or `inheritEnv`).
const CLAUDE_CODE_ENV: [&str; 1] = ["CLAUDE_CONFIG_DIR"];

/// The product, as the failure line and the facts name it.
const PRODUCT: &str = "Claude Code";

/// The Claude CLI's stream-json frames: the one place to correct against a capture.
pub mod wire {
    use serde_json::{json, Value};

    /// The denial every permission prompt gets.
    pub const DENY_MESSAGE: &str =
        "This unattended Claude Code subagent cannot request human approval.";

    /// The task as the one user message.
    pub fn user_message(task: &str) -> Value {
        json!({
            "type": "user",
            "session_id": "",
            "message": {"role": "user", "content": [{"type": "text", "text": task}]},
            "parent_tool_use_id": null,
        })
    }

    /// The answer to a `control_request` whose `request.subtype` is `can_use_tool`.
    pub fn deny_tool(request_id: &Value) -> Value {
        control_success(
            request_id,
            json!({"behavior": "deny", "message": DENY_MESSAGE}),
        )
    }

    /// The answer to an MCP elicitation request.
    pub fn decline_elicitation(request_id: &Value) -> Value {
        control_success(request_id, json!({"action": "decline"}))
    }

    /// The refusal of a control request this provider does not serve.
    pub fn control_error(request_id: &Value, message: &str) -> Value {
        json!({"type": "control_response",
               "response": {"subtype": "error", "request_id": request_id, "error": message}})
    }

    fn control_success(request_id: &Value, response: Value) -> Value {
        json!({"type": "control_response",
               "response": {"subtype": "success", "request_id": request_id, "response": response}})
    }

    /// The interrupt sent when a run is cancelled or disposed mid-stream.
    pub fn interrupt(request_id: &str) -> Value {
        json!({"type": "control_request", "request_id": request_id,
               "request": {"subtype": "interrupt"}})
    }
}

/// The permission mode every run starts in. `default` (interactive) is not offered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum ClaudePermissionMode {
    /// Deny anything not already allowed, without asking.
    #[default]
    #[serde(rename = "dontAsk")]
    DontAsk,
    /// Accept file edits; deny other prompts.
    #[serde(rename = "acceptEdits")]
    AcceptEdits,
    /// Let Claude Code decide; deny prompts.
    #[serde(rename = "auto")]
    Auto,
    /// Plan only (`ExitPlanMode` is disallowed).
    #[serde(rename = "plan")]
    Plan,
    /// Skip every permission check.
    #[serde(rename = "bypassPermissions")]
    BypassPermissions,
}

impl ClaudePermissionMode {
    fn as_str(self) -> &'static str {
        match self {
            Self::DontAsk => "dontAsk",
            Self::AcceptEdits => "acceptEdits",
            Self::Auto => "auto",
            Self::Plan => "plan",
            Self::BypassPermissions => "bypassPermissions",
        }
    }

    /// The CLI flags of the mode, after the stream-json ones.
    fn flags(self) -> Vec<String> {
        let mut flags = vec!["--permission-mode".to_owned(), self.as_str().to_owned()];
        let disallowed = match self {
            Self::Plan => "AskUserQuestion,ExitPlanMode",
            _ => "AskUserQuestion",
        };
        flags.extend(["--disallowedTools".to_owned(), disallowed.to_owned()]);
        if self == Self::BypassPermissions {
            // What the SDK's `allowDangerouslySkipPermissions` sets: the mode may bypass.
            flags.push("--allow-dangerously-skip-permissions".to_owned());
        } else {
            flags.extend(["--permission-prompt-tool".to_owned(), "stdio".to_owned()]);
        }
        flags.push("--no-session-persistence".to_owned());
        flags
    }
}

fn default_claude_name() -> String {
    "claude-code".to_owned()
}

fn default_claude_command() -> String {
    "claude".to_owned()
}

/// The Claude Code provider's configuration (`providerName`, `command`, `env`, `inheritEnv`,
/// `permissionMode`, `disposeGraceMs`). There is no cwd override.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaudeCodeProviderConfig {
    /// The registry name (default `claude-code`).
    #[serde(default = "default_claude_name")]
    pub provider_name: String,
    /// The CLI executable (default `claude`); configurable so tests can run a fake.
    #[serde(default = "default_claude_command")]
    pub command: String,
    /// Arguments before the provider's own flags (empty by default).
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables laid over the inherited environment (an API key goes here).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names the child inherits from this process's environment when they are set, beyond the
    /// base set ([`BASE_ENV`](crate::out_of_process::BASE_ENV), `LC_*` and `CLAUDE_CONFIG_DIR`): a proxy,
    /// a certificate bundle, a credential the host means to pass on. Nothing else is inherited.
    #[serde(default)]
    pub inherit_env: Vec<String>,
    /// The longest line of the product's output read (default 16 MiB,
    /// [`DEFAULT_MAX_FRAME_BYTES`](crate::out_of_process::DEFAULT_MAX_FRAME_BYTES)): a longer
    /// one fails the run (`category: frame-too-long`) and is skipped unread, so a child printing
    /// an endless line cannot exhaust this process's memory.
    #[serde(default = "crate::out_of_process::default_max_frame_bytes")]
    pub max_frame_bytes: usize,
    /// The permission mode (default `dontAsk`).
    #[serde(default)]
    pub permission_mode: ClaudePermissionMode,
    /// How long the tree has between SIGTERM and SIGKILL, and how long the CLI has to exit once
    /// its output closed (default 3000 ms).
    #[serde(default = "crate::out_of_process::default_dispose_grace_ms")]
    pub dispose_grace_ms: f64,
}

impl Default for ClaudeCodeProviderConfig {
    fn default() -> Self {
        Self {
            provider_name: default_claude_name(),
            command: default_claude_command(),
            args: Vec::new(),
            env: BTreeMap::new(),
            inherit_env: Vec::new(),
            max_frame_bytes: crate::out_of_process::default_max_frame_bytes(),
            permission_mode: ClaudePermissionMode::default(),
            dispose_grace_ms: crate::out_of_process::default_dispose_grace_ms(),
        }
    }
}

impl ClaudeCodeProviderConfig {
    /// A configuration that runs `command` with the defaults.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            ..Self::default()
        }
    }
}

#[derive(Debug)]
struct ClaudeSettings {
    name: String,
    argv: Vec<OsString>,
    env: BTreeMap<String, String>,
    /// Names inherited from this process's environment beyond the base set.
    inherit_env: Vec<String>,
    /// The longest line of output read.
    max_frame_bytes: usize,
    mode: ClaudePermissionMode,
    grace: Duration,
}

/// The Claude Code provider: one-shot runs only, no start capabilities, no parent context.
pub struct ClaudeCodeProvider {
    shell: ProcessShell<ClaudeSettings>,
}

process_provider!(ClaudeCodeProvider, ClaudeSettings, start_run);

impl ClaudeCodeProvider {
    /// Checks `config` and builds the provider; loading starts no process.
    ///
    /// # Errors
    /// `INVALID_CONFIG` for an empty name or command, or a grace that is not positive,
    /// finite and at most 2147483647 ms.
    pub fn new(config: ClaudeCodeProviderConfig) -> Result<Self> {
        require_non_empty(PREFIX, "providerName", &config.provider_name)?;
        require_non_empty(PREFIX, "command", &config.command)?;
        let grace = dispose_grace(PREFIX, config.dispose_grace_ms)?;
        let mode = config.permission_mode;
        let argv = std::iter::once(config.command)
            .chain(config.args)
            .chain(
                [
                    "--output-format",
                    "stream-json",
                    "--verbose",
                    "--input-format",
                    "stream-json",
                ]
                .map(str::to_owned),
            )
            .chain(mode.flags())
            .map(OsString::from)
            .collect();
        Ok(Self {
            shell: ProcessShell::new(ClaudeSettings {
                name: config.provider_name,
                argv,
                env: config.env,
                inherit_env: config.inherit_env,
                max_frame_bytes: positive_bytes(PREFIX, "maxFrameBytes", config.max_frame_bytes)?,
                mode,
                grace,
            }),
        })
    }
}

/// A failure of a Claude Code run at `stage` in `category`.
fn failure(stage: &'static str, category: impl Into<String>) -> FailureLine {
    FailureLine::new(PRODUCT, stage, category)
}

/// The unattended decisions of a Claude Code run, in fixed words.
mod facts {
    use crate::out_of_process::diagnostic::Fact;

    pub(super) const PROMPT_DENIED: Fact = Fact::new(
        "tool permission",
        "denied",
        "the provider does not request human approval",
    );
    pub(super) const DENIED_BEFORE_PROMPT: Fact = Fact::new(
        "tool permission",
        "denied",
        "Claude Code denied the request before an interactive prompt",
    );
    pub(super) const ELICITATION_DECLINED: Fact = Fact::new(
        "MCP elicitation",
        "declined",
        "the provider does not collect interactive MCP input",
    );
}

const ERROR_SUBTYPES: [&str; 4] = [
    "error_during_execution",
    "error_max_turns",
    "error_max_budget_usd",
    "error_max_structured_output_retries",
];

/// The failure category of the error the CLI puts on an assistant message when its API call
/// failed (the Agent SDK's `SDKAssistantMessageError`); the CLI's own word is never repeated.
fn assistant_error_category(error: &str) -> &'static str {
    match error {
        "authentication_failed" => "authentication",
        "billing_error" => "billing",
        "rate_limit" => "rate-limit",
        "invalid_request" => "invalid-request",
        "server_error" => "server-error",
        _ => "unknown",
    }
}

fn aborted_before_start() -> SubagentError {
    SubagentError::new(
        ErrorCode::AbortedBeforePublication,
        format!("{PREFIX}: request was aborted before SDK startup"),
    )
}

async fn start_run(
    settings: Arc<ClaudeSettings>,
    resolved: ResolvedSubagentStartRequest,
) -> Result<SubagentRun> {
    let request = resolved.request;
    let parent_cwd = request
        .parent
        .header()
        .cwd
        .ok_or_else(|| no_parent_cwd(PREFIX))?;
    // Text blocks joined with no separator.
    let task = task_texts(PREFIX, &request.prompt)?.concat();
    if request.cancel.is_cancelled() {
        return Err(aborted_before_start());
    }
    let query_start = failure("query-start", "unknown");
    let cwd = usable_cwd(PREFIX, CwdLabel::ParentSession, &parent_cwd).map_err(|error| {
        tracing::warn!(%error, "{PREFIX} \"{}\": child start failed", settings.name);
        query_start.start_error(PREFIX, error)
    })?;
    let process = ChildProcess::spawn(&ProcessSpec {
        argv: settings.argv.clone(),
        cwd,
        env: with_trace_context(
            child_env(
                std::env::vars_os(),
                CLAUDE_CODE_ENV
                    .into_iter()
                    .chain(settings.inherit_env.iter().map(String::as_str)),
                &settings.env,
            ),
            &request.trace,
        ),
        stderr: StderrMode::Inherit,
        grace: settings.grace,
    })
    .map_err(|error| query_start.start_error(PREFIX, error))?;
    let process = Arc::new(process);
    let (Some(stdin), Some(stdout)) = (process.take_stdin(), process.take_stdout()) else {
        return Err(SubagentError::bug("a child started without its pipes"));
    };
    let shutdown = CancellationToken::new();
    let local = request.cancel.child_token();
    let (answer_tx, answer_rx) = oneshot::channel();
    let session = ClaudeSession {
        name: settings.name.clone(),
        mode: settings.mode,
        writer: FrameWriter::new(stdin),
        reader: FrameReader::new(stdout, settings.max_frame_bytes),
        process: Arc::clone(&process),
        local: local.clone(),
        shutdown: shutdown.clone(),
        fact: None,
        success: None,
        assistant_error: None,
        cancel_seen: false,
        interrupt_sent: false,
        exit_grace: settings.grace,
    };
    let connection = tokio::spawn(session.run(task, answer_tx));
    let teardown = Teardown::terminate_after(process, connection, &shutdown, settings.grace);
    if request.cancel.is_cancelled() {
        teardown.run().await;
        return Err(aborted_before_start());
    }
    let attempt = async move {
        answer_rx
            .await
            .map_err(|_| SubagentError::bug("the Claude Code session ended before it answered"))
    };
    Ok(publish(
        format!("{PREFIX} \"{}\"", settings.name),
        attempt,
        PartialOutput::default(),
        local,
        teardown,
    ))
}

/// One run's stream: the messages, the permission prompts, the settlement.
struct ClaudeSession {
    name: String,
    mode: ClaudePermissionMode,
    writer: FrameWriter,
    reader: FrameReader,
    process: Arc<ChildProcess>,
    local: CancellationToken,
    shutdown: CancellationToken,
    /// The latest unattended decision.
    fact: Option<Fact>,
    /// The last strict success so far.
    success: Option<String>,
    /// The category of the error the CLI last put on an assistant message (its API call
    /// failed: `authentication_failed`, `rate_limit`, ...), which names a failing result.
    assistant_error: Option<&'static str>,
    /// The caller's cancellation was seen.
    cancel_seen: bool,
    /// The interrupt was sent (at most once).
    interrupt_sent: bool,
    /// How long the CLI has to exit once its output closed (`disposeGraceMs`).
    exit_grace: Duration,
}

enum Step {
    Message(Value),
    Garbage,
    /// A line longer than `maxFrameBytes` (skipped): the run fails.
    TooLong,
    Eof,
    Cancelled,
    Shutdown,
}

impl ClaudeSession {
    /// Asks the CLI to stop its turn, once, while its input is open.
    async fn interrupt(&mut self) {
        if !self.interrupt_sent && self.writer.is_open() {
            self.interrupt_sent = true;
            let id = format!("interrupt-{}", uuid::Uuid::new_v4().simple());
            self.writer.send(&wire::interrupt(&id)).await;
        }
    }

    async fn next(&mut self) -> Step {
        let cancelled = self.cancel_seen;
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => Step::Shutdown,
            read = self.reader.next() => match read {
                Read::Frame(message) => Step::Message(message),
                Read::Garbage => Step::Garbage,
                Read::TooLong => Step::TooLong,
                Read::Eof => Step::Eof,
            },
            () = self.local.cancelled(), if !cancelled => Step::Cancelled,
        }
    }

    async fn run(mut self, task: String, answer: oneshot::Sender<SubagentResult>) {
        // A CLI that is already gone closes the pipe; the stream's end then tells how it went.
        self.writer.send(&wire::user_message(&task)).await;
        let settled = loop {
            match self.next().await {
                Step::Shutdown => {
                    self.interrupt().await;
                    return;
                }
                Step::Cancelled => {
                    self.cancel_seen = true;
                    self.interrupt().await;
                }
                Step::Message(message) => {
                    if let Err(failure) = self.message(&message).await {
                        break Err(failure);
                    }
                }
                Step::Garbage => {}
                Step::TooLong => break Err(failure("query-run", FRAME_TOO_LONG)),
                Step::Eof => match self.ended().await {
                    Some(settled) => break settled,
                    None => return,
                },
            }
        };
        let result = match settled {
            Ok(answer) => {
                SubagentResult::with_output(StopReason::Completed, vec![ContentBlock::text(answer)])
            }
            Err(failure) => {
                let line = failure.line();
                log_run_failure!(PREFIX, &self.name, &line, self.local.is_cancelled());
                let fact = self.fact.map(|fact| fact.text(PRODUCT, self.mode.as_str()));
                SubagentResult::empty(StopReason::Error).with_diagnostic(failure.diagnostic(fact))
            }
        };
        let _ = answer.send(result);
        // Hold the pipes until disposal, reading so the CLI never blocks on a full pipe.
        loop {
            match self.next().await {
                Step::Shutdown => break,
                Step::Eof => {
                    self.shutdown.cancelled().await;
                    break;
                }
                Step::Cancelled => self.cancel_seen = true,
                Step::Message(_) | Step::Garbage | Step::TooLong => {}
            }
        }
        self.interrupt().await;
    }

    /// One stream-json message; a failing result fails the run at once (with how the process
    /// ended, if it already had).
    async fn message(&mut self, message: &Value) -> std::result::Result<(), FailureLine> {
        let field = |name: &str| message.get(name).and_then(Value::as_str);
        match (field("type"), field("subtype")) {
            (Some("system"), Some("permission_denied")) => {
                self.fact = Some(facts::DENIED_BEFORE_PROMPT);
            }
            (Some("control_request"), _) => {
                let id = message.get("request_id").cloned().unwrap_or(Value::Null);
                let subtype = message
                    .get("request")
                    .and_then(|request| request.get("subtype"))
                    .and_then(Value::as_str);
                let reply = match subtype {
                    Some("can_use_tool") => {
                        self.fact = Some(facts::PROMPT_DENIED);
                        wire::deny_tool(&id)
                    }
                    Some("elicitation") => {
                        self.fact = Some(facts::ELICITATION_DECLINED);
                        wire::decline_elicitation(&id)
                    }
                    _ => wire::control_error(&id, "unsupported control request"),
                };
                self.writer.send(&reply).await;
            }
            (Some("assistant"), _) => {
                if let Some(error) = field("error") {
                    self.assistant_error = Some(assistant_error_category(error));
                }
            }
            (Some("result"), subtype) => {
                let is_error = message.get("is_error").and_then(Value::as_bool) != Some(false);
                let result = field("result").filter(|text| !text.trim().is_empty());
                let category = match (subtype, is_error, result) {
                    (Some("success"), false, Some(text)) => {
                        self.success = Some(text.to_owned());
                        // One task per run: the input ends once it is answered.
                        self.writer.close();
                        return Ok(());
                    }
                    // A failed API call the CLI reported as a failing "success" is named by
                    // what failed.
                    (Some("success"), _, _) => self.assistant_error.unwrap_or("invalid-success"),
                    (Some(subtype), _, _) if ERROR_SUBTYPES.contains(&subtype) => subtype,
                    _ => "unknown",
                };
                return Err(failure("query-run", category).with_outcome(self.process.outcome()));
            }
            _ => {}
        }
        Ok(())
    }

    /// The stream ended: how the process exits decides between the answer and a failure. A
    /// CLI that closed its output but does not exit within `exit_grace` (a child of its own
    /// holding it up, or a hang at exit) fails the run (`query-run`, `unknown`) rather than
    /// hold it unsettled until disposal. `None` when disposal came first.
    async fn ended(&mut self) -> Option<std::result::Result<String, FailureLine>> {
        let outcome = tokio::select! {
            biased;
            () = self.shutdown.cancelled() => return None,
            outcome = tokio::time::timeout(self.exit_grace, self.process.exited()) => match outcome {
                Ok(outcome) => outcome,
                Err(_) => return Some(Err(failure("query-run", "unknown"))),
            },
        };
        let clean = outcome.code == Some(0);
        Some(match (self.success.take(), clean) {
            (Some(answer), true) => Ok(answer),
            (Some(_), false) => Err(failure("query-run", "unknown").with_outcome(Some(outcome))),
            (None, true) => Err(failure("query-run", "missing-result")),
            (None, false) => Err(failure("process", "process-exit").with_outcome(Some(outcome))),
        })
    }
}
