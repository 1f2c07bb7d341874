//! The Codex provider's configuration, as a host or the CLI gives it, and the settings a run
//! starts from.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

/// What Codex documents that it reads to start, inherited whenever set: where its own
/// configuration and login live (an API key reaches it only through `env` or `inheritEnv`).
pub(super) const CODEX_ENV: [&str; 1] = ["CODEX_HOME"];

/// The unattended permission mode of every thread the provider starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CodexPermissionMode {
    /// `approvalPolicy: untrusted` (the default): Codex asks before anything but its
    /// known-safe read-only commands, and the provider declines every ask, so nothing that
    /// changes anything runs unless the host picks another mode.
    #[default]
    Untrusted,
    /// `approvalPolicy: never`: Codex never asks; what runs is bounded by the sandbox its own
    /// configuration sets.
    Never,
    /// `approvalPolicy: on-request` reviewed automatically, in a workspace-write sandbox.
    ApproveForMe,
    /// `approvalPolicy: never` with no sandbox at all.
    DangerouslyBypassApprovalsAndSandbox,
}

impl CodexPermissionMode {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Untrusted => "untrusted",
            Self::Never => "never",
            Self::ApproveForMe => "approve-for-me",
            Self::DangerouslyBypassApprovalsAndSandbox => {
                "dangerously-bypass-approvals-and-sandbox"
            }
        }
    }

    /// The `thread/start` fields of the mode.
    pub(super) fn thread_fields(self) -> Value {
        match self {
            Self::Untrusted => json!({"approvalPolicy": "untrusted"}),
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

/// The Codex provider's configuration (`providerName`, `command`, `args`, `env`, `inheritEnv`,
/// `maxFrameBytes`, `permissionMode`, `startupTimeoutMs`, `disposeGraceMs`). There is no cwd override: a child always runs in its
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
    /// Variables laid over the inherited environment (an API key goes here).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names the child inherits from this process's environment when they are set, beyond the
    /// base set ([`BASE_ENV`](crate::out_of_process::BASE_ENV), `LC_*` and `CODEX_HOME`): a proxy,
    /// a certificate bundle, a credential the host means to pass on. Nothing else is inherited.
    #[serde(default)]
    pub inherit_env: Vec<String>,
    /// The longest line of the product's output read (default 16 MiB,
    /// [`DEFAULT_MAX_FRAME_BYTES`](crate::out_of_process::DEFAULT_MAX_FRAME_BYTES)): a longer
    /// one fails the run (`category: frame-too-long`) and is skipped unread, so a child printing
    /// an endless line cannot exhaust this process's memory.
    #[serde(default = "crate::out_of_process::default_max_frame_bytes")]
    pub max_frame_bytes: usize,
    /// The unattended permission mode (default `untrusted`: every ask declined).
    #[serde(default)]
    pub permission_mode: CodexPermissionMode,
    /// How long the app-server has to answer `initialize` and `thread/start` (default
    /// 60000 ms): past it the start fails (`CHILD_START_FAILED`, `stage: startup; category:
    /// timeout`) and the child is reaped, so an app-server that never answers cannot hold its
    /// caller.
    #[serde(default = "crate::out_of_process::default_startup_timeout_ms")]
    pub startup_timeout_ms: f64,
    /// How long the tree has between SIGTERM and SIGKILL, and how long a closed wire waits for
    /// the exit (default 3000 ms).
    #[serde(default = "crate::out_of_process::default_dispose_grace_ms")]
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
            inherit_env: Vec::new(),
            max_frame_bytes: crate::out_of_process::default_max_frame_bytes(),
            permission_mode: CodexPermissionMode::default(),
            startup_timeout_ms: crate::out_of_process::default_startup_timeout_ms(),
            dispose_grace_ms: crate::out_of_process::default_dispose_grace_ms(),
        }
    }
}

#[derive(Debug)]
pub(super) struct CodexSettings {
    pub(super) name: String,
    pub(super) argv: Vec<OsString>,
    pub(super) env: BTreeMap<String, String>,
    /// Names inherited from this process's environment beyond the base set.
    pub(super) inherit_env: Vec<String>,
    /// The longest line of output read.
    pub(super) max_frame_bytes: usize,
    pub(super) mode: CodexPermissionMode,
    /// How long the handshake and the thread's start may take.
    pub(super) startup_timeout: Duration,
    pub(super) grace: Duration,
}
