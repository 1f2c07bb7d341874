//! The SDK provider: the TypeScript runtime's "another harness process" provider. Each one-shot run
//! starts a child `subagents acp-agent` (a whole runtime of this crate in its own process) and
//! delegates to it over ACP, so it needs no second protocol: it is the ACP provider with the
//! command line, the name and the messages of its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use futures::future::BoxFuture;
use serde::Deserialize;

use crate::error::Result;
use crate::seam::{
    ResolvedSubagentStartRequest, SubagentCapabilities, SubagentProvider, SubagentRun,
};

use super::acp::{AcpPermission, AcpProvider, AcpProviderConfig};

const PREFIX: &str = "subagent-sdk";

fn default_sdk_name() -> String {
    "sdk".to_owned()
}

fn default_command() -> String {
    "subagents".to_owned()
}

/// The SDK provider's configuration (`providerName`, `command`, `args`, `cwd`, `env`,
/// `inheritEnv`, `disposeEofGraceMs`, `disposeGraceMs`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SdkProviderConfig {
    /// The registry name (default `sdk`).
    #[serde(default = "default_sdk_name")]
    pub provider_name: String,
    /// The `subagents` executable (default `subagents`, looked up on `PATH`).
    #[serde(default = "default_command")]
    pub command: String,
    /// Arguments after `acp-agent` (for example `--store DIR`).
    #[serde(default)]
    pub args: Vec<String>,
    /// A working-directory override, as for the ACP provider.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Variables laid over the inherited environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names the child inherits from this process's environment when they are set, beyond the
    /// base set ([`BASE_ENV`](crate::out_of_process::BASE_ENV) and `LC_*`): a proxy, a
    /// certificate bundle, a credential the host means to pass on. Nothing else is inherited.
    #[serde(default)]
    pub inherit_env: Vec<String>,
    /// The longest line of the child's output read (default 16 MiB; see
    /// [`AcpProviderConfig::max_frame_bytes`]).
    #[serde(default = "crate::out_of_process::default_max_frame_bytes")]
    pub max_frame_bytes: usize,
    /// How long the child has to answer the handshake and open its session (default 60000 ms;
    /// see [`AcpProviderConfig::startup_timeout_ms`]).
    #[serde(default = "crate::out_of_process::default_startup_timeout_ms")]
    pub startup_timeout_ms: f64,
    /// How long a disposed child has to exit after its stdin closes (default 6000 ms).
    #[serde(default = "crate::out_of_process::default_dispose_eof_grace_ms")]
    pub dispose_eof_grace_ms: f64,
    /// How long the tree has between SIGTERM and SIGKILL (default 3000 ms).
    #[serde(default = "crate::out_of_process::default_dispose_grace_ms")]
    pub dispose_grace_ms: f64,
}

impl Default for SdkProviderConfig {
    fn default() -> Self {
        Self {
            provider_name: default_sdk_name(),
            command: default_command(),
            args: Vec::new(),
            cwd: None,
            env: BTreeMap::new(),
            inherit_env: Vec::new(),
            max_frame_bytes: crate::out_of_process::default_max_frame_bytes(),
            startup_timeout_ms: crate::out_of_process::default_startup_timeout_ms(),
            dispose_eof_grace_ms: crate::out_of_process::default_dispose_eof_grace_ms(),
            dispose_grace_ms: crate::out_of_process::default_dispose_grace_ms(),
        }
    }
}

/// Runs each one-shot child as a `subagents acp-agent` process: no start capabilities, no
/// parent context, permission requests always refused.
#[derive(Debug)]
pub struct SdkProvider(AcpProvider);

impl SdkProvider {
    /// Checks `config` as the ACP provider does (messages prefixed `subagent-sdk`).
    ///
    /// # Errors
    /// `INVALID_CONFIG`, as [`AcpProvider::new`].
    pub fn new(config: SdkProviderConfig) -> Result<Self> {
        Self::with_launch_dir(config, &AcpProvider::launch_dir(PREFIX)?)
    }

    /// [`SdkProvider::new`] with relative cwd overrides resolved against `launch_dir`.
    ///
    /// # Errors
    /// As [`SdkProvider::new`].
    pub fn with_launch_dir(config: SdkProviderConfig, launch_dir: &Path) -> Result<Self> {
        let acp = AcpProviderConfig {
            provider_name: config.provider_name,
            command: config.command,
            args: std::iter::once("acp-agent".to_owned())
                .chain(config.args)
                .collect(),
            cwd: config.cwd,
            permission: AcpPermission::Reject,
            env: config.env,
            inherit_env: config.inherit_env,
            max_frame_bytes: config.max_frame_bytes,
            startup_timeout_ms: config.startup_timeout_ms,
            dispose_eof_grace_ms: config.dispose_eof_grace_ms,
            dispose_grace_ms: config.dispose_grace_ms,
        };
        AcpProvider::build((PREFIX, "SDK"), acp, launch_dir).map(Self)
    }
}

impl SubagentProvider for SdkProvider {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn capabilities(&self) -> SubagentCapabilities {
        self.0.capabilities()
    }

    fn inherits_parent_context(&self) -> bool {
        false
    }

    fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> BoxFuture<'static, Result<SubagentRun>> {
        self.0.start(request)
    }
}
