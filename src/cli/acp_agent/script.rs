//! Provides [`AcpAgentScript`]: the environment vocabulary that scripts `subagents acp-agent`,
//! after the TypeScript runtime's mock ACP server, so tests (ours and a host's) can drive every
//! protocol path of an ACP client deterministically.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use subagents::{ErrorCode, Result, SubagentError};

/// The stop reason the agent reports for a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScriptedStop {
    /// The turn's own outcome (`end_turn` when the model answers).
    #[default]
    EndTurn,
    /// The model's answer is cut at its token limit: the turn ends `max-tokens`.
    MaxTokens,
    /// The model refuses: the turn ends blocked, reported `refusal`.
    Refusal,
    /// Reported as `cancelled` after the turn.
    Cancelled,
    /// Reported as `max_turn_requests` after the turn.
    MaxTurnRequests,
}

/// How `subagents acp-agent` behaves, read from `ACP_AGENT_*` variables. Every field defaults
/// to a well-behaved agent that answers `mock child answer` and ends its turn.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcpAgentScript {
    /// `ACP_AGENT_TEXT`: the model's answer (default `mock child answer`).
    pub text: Option<String>,
    /// `ACP_AGENT_ECHO_ENV=<NAME>`: answer with `$NAME`, or `<NAME unset>`.
    pub echo_env: Option<String>,
    /// `ACP_AGENT_ECHO_CWD=1`: answer `<process cwd>\n<session cwd>`.
    pub echo_cwd: bool,
    /// `ACP_AGENT_STOP`: `end_turn`, `max_tokens`, `refusal`, `cancelled` or
    /// `max_turn_requests`.
    pub stop: ScriptedStop,
    /// `ACP_AGENT_SESSION_ID`: a fixed protocol session id (default: the agent's session id).
    pub session_id: Option<String>,
    /// `ACP_AGENT_MISSING_SESSION_ID=1`: `session/new` answers `{}`.
    pub missing_session_id: bool,
    /// `ACP_AGENT_THOUGHT=1`: stream an `agent_thought_chunk` before the answer.
    pub thought: bool,
    /// `ACP_AGENT_PERMISSION=1`: ask `session/request_permission` (options `yes`/allow_once
    /// and `no`/reject_once) before answering; a `cancelled` outcome ends the prompt
    /// `cancelled`.
    pub permission: bool,
    /// `ACP_AGENT_NO_ALLOW=1`: the permission request offers only `no`/reject_once.
    pub no_allow: bool,
    /// `ACP_AGENT_HANG=1`: stream the answer as a partial chunk, then hold the turn until
    /// `session/cancel` arrives (reported `cancelled`).
    pub hang: bool,
    /// `ACP_AGENT_IGNORE_CANCEL=1`: receive `session/cancel` and do nothing.
    pub ignore_cancel: bool,
    /// `ACP_AGENT_CANCEL_FILE`: touched when `session/cancel` arrives.
    pub cancel_file: Option<PathBuf>,
    /// `ACP_AGENT_CRASH_ON_CANCEL=1`: exit 1 when `session/cancel` arrives.
    pub crash_on_cancel: bool,
    /// `ACP_AGENT_CRASH_ON_PROMPT=1`: exit 1 when the prompt arrives.
    pub crash_on_prompt: bool,
    /// `ACP_AGENT_PROMPT_ERROR=TEXT`: answer every prompt with a JSON-RPC internal error
    /// whose data is TEXT (an agent failing in its own words).
    pub prompt_error: Option<String>,
    /// `ACP_AGENT_DELAY_MS`: wait this long before answering a prompt.
    pub delay: Option<Duration>,
    /// `ACP_AGENT_READY_FILE`: touched once the prompt is in flight.
    pub ready_file: Option<PathBuf>,
    /// `ACP_AGENT_NEWSESSION_READY`: touched when `session/new` arrives.
    pub new_session_ready: Option<PathBuf>,
    /// `ACP_AGENT_NEWSESSION_GO`: `session/new` waits until this file exists.
    pub new_session_go: Option<PathBuf>,
    /// `ACP_AGENT_FLUSH_ON_EOF=<file>`: on stdin EOF wait `ACP_AGENT_FLUSH_DELAY_MS` (default
    /// 150), write the file, exit 0.
    pub flush_on_eof: Option<PathBuf>,
    /// `ACP_AGENT_FLUSH_DELAY_MS`.
    pub flush_delay: Duration,
    /// `ACP_AGENT_IGNORE_EOF=1`: stay alive past stdin EOF.
    pub ignore_eof: bool,
    /// `ACP_AGENT_SIGTERM_FILE`: on SIGTERM write this file and exit 0.
    pub sigterm_file: Option<PathBuf>,
    /// `ACP_AGENT_TRAP_SIGTERM=1`: ignore SIGTERM (only SIGKILL ends the agent).
    pub trap_sigterm: bool,
    /// `ACP_AGENT_ASK_FS=1`: call the client's `fs/read_text_file` first and answer with the
    /// JSON-RPC error code it returned (`fs -32601` from a client without file access).
    pub ask_fs: bool,
    /// `ACP_AGENT_PID_FILE`: the agent writes its pid here at start.
    pub pid_file: Option<PathBuf>,
    /// `ACP_AGENT_GRANDCHILD_PID_FILE`: the agent starts a long-lived grandchild (`sleep`) in
    /// its process group and writes the grandchild's pid here.
    pub grandchild_pid_file: Option<PathBuf>,
}

/// The default answer.
pub const DEFAULT_TEXT: &str = "mock child answer";

impl AcpAgentScript {
    /// Reads the script from this process's environment.
    ///
    /// # Errors
    /// `INVALID_CONFIG` naming the variable for an unknown stop reason or a delay that is not a
    /// whole number of milliseconds.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(std::env::vars_os())
    }

    /// Reads the script from `vars` (names other than `ACP_AGENT_*` are ignored).
    ///
    /// # Errors
    /// As [`AcpAgentScript::from_env`].
    pub fn from_vars(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Result<Self> {
        let mut script = Self {
            flush_delay: Duration::from_millis(150),
            ..Self::default()
        };
        for (name, value) in vars {
            let Some(name) = name.to_str() else { continue };
            let Some(key) = name.strip_prefix("ACP_AGENT_") else {
                continue;
            };
            let text = value.to_string_lossy().into_owned();
            let path = || Some(PathBuf::from(&value));
            let on = text == "1";
            match key {
                "TEXT" => script.text = Some(text),
                "ECHO_ENV" => script.echo_env = Some(text),
                "ECHO_CWD" => script.echo_cwd = on,
                "STOP" => script.stop = parse_stop(&text)?,
                "SESSION_ID" => script.session_id = Some(text),
                "MISSING_SESSION_ID" => script.missing_session_id = on,
                "THOUGHT" => script.thought = on,
                "PERMISSION" => script.permission = on,
                "NO_ALLOW" => script.no_allow = on,
                "HANG" => script.hang = on,
                "IGNORE_CANCEL" => script.ignore_cancel = on,
                "CANCEL_FILE" => script.cancel_file = path(),
                "CRASH_ON_CANCEL" => script.crash_on_cancel = on,
                "CRASH_ON_PROMPT" => script.crash_on_prompt = on,
                "PROMPT_ERROR" => script.prompt_error = Some(text),
                "DELAY_MS" => script.delay = Some(parse_ms(name, &text)?),
                "READY_FILE" => script.ready_file = path(),
                "NEWSESSION_READY" => script.new_session_ready = path(),
                "NEWSESSION_GO" => script.new_session_go = path(),
                "FLUSH_ON_EOF" => script.flush_on_eof = path(),
                "FLUSH_DELAY_MS" => script.flush_delay = parse_ms(name, &text)?,
                "IGNORE_EOF" => script.ignore_eof = on,
                "SIGTERM_FILE" => script.sigterm_file = path(),
                "TRAP_SIGTERM" => script.trap_sigterm = on,
                "ASK_FS" => script.ask_fs = on,
                "PID_FILE" => script.pid_file = path(),
                "GRANDCHILD_PID_FILE" => script.grandchild_pid_file = path(),
                _ => {
                    return Err(SubagentError::new(
                        ErrorCode::InvalidConfig,
                        format!("{name} is not an acp-agent script variable"),
                    ))
                }
            }
        }
        Ok(script)
    }

    /// The answer to a prompt in a session whose cwd is `session_cwd`.
    pub(crate) fn answer(&self, session_cwd: &std::path::Path) -> String {
        if let Some(name) = &self.echo_env {
            return std::env::var(name).unwrap_or_else(|_| format!("<{name} unset>"));
        }
        if self.echo_cwd {
            let own = std::env::current_dir().unwrap_or_default();
            return format!("{}\n{}", own.display(), session_cwd.display());
        }
        self.text.clone().unwrap_or_else(|| DEFAULT_TEXT.to_owned())
    }
}

fn parse_stop(text: &str) -> Result<ScriptedStop> {
    Ok(match text {
        "end_turn" => ScriptedStop::EndTurn,
        "max_tokens" => ScriptedStop::MaxTokens,
        "refusal" => ScriptedStop::Refusal,
        "cancelled" => ScriptedStop::Cancelled,
        "max_turn_requests" => ScriptedStop::MaxTurnRequests,
        other => {
            return Err(SubagentError::new(
                ErrorCode::InvalidConfig,
                format!(
                    "ACP_AGENT_STOP must be end_turn, max_tokens, refusal, cancelled or \
                     max_turn_requests, not {other:?}"
                ),
            ))
        }
    })
}

fn parse_ms(name: &str, text: &str) -> Result<Duration> {
    text.parse::<u64>().map(Duration::from_millis).map_err(|_| {
        SubagentError::new(
            ErrorCode::InvalidConfig,
            format!("{name} must be a whole number of milliseconds, not {text:?}"),
        )
    })
}
