//! The ACP provider's fixture: a runtime whose root agent has a cwd, and an `acp` provider
//! that runs `subagents acp-agent` (the reference peer) scripted through `ACP_AGENT_*`.

use std::path::{Path, PathBuf};

use subagents::testing::ScriptedModel;
use subagents::{
    AcpProvider, AcpProviderConfig, AgentHandle, CreateAgent, Runtime, SubagentRun,
    SubagentStartRequest,
};
use tempfile::TempDir;

pub use crate::support::{alive, appears, gone};
use crate::support::{memory_runtime, text, within};

/// The `subagents` binary, which serves `acp-agent`.
pub const BINARY: &str = env!("CARGO_BIN_EXE_subagents");

/// A provider configuration that runs the reference peer with short dispose graces, scripted
/// by `script`.
pub fn peer_config(script: &[(&str, &str)]) -> AcpProviderConfig {
    let mut config = AcpProviderConfig::new(BINARY);
    config.args = ["acp-agent", "--store", "memory"]
        .map(str::to_owned)
        .to_vec();
    config.dispose_eof_grace_ms = 2_000.0;
    config.dispose_grace_ms = 500.0;
    config.env = script
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    config
}

pub struct Acp {
    pub rt: Runtime,
    pub parent: AgentHandle,
    /// The parent's cwd, and where the scripts write their files.
    pub dir: TempDir,
}

impl Acp {
    /// A runtime with `config` registered and a root parent whose cwd is a fresh directory;
    /// `{dir}` in the config's env values names that directory.
    pub async fn new(mut config: AcpProviderConfig) -> Self {
        let rt = memory_runtime(&ScriptedModel::new());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap().to_owned();
        for value in config.env.values_mut() {
            *value = value.replace("{dir}", &path);
        }
        let parent = rt
            .agents()
            .create(CreateAgent::new().cwd(dir.path()))
            .await
            .unwrap();
        rt.subagents()
            .register_provider(AcpProvider::new(config).unwrap())
            .await
            .unwrap()
            .keep();
        Self { rt, parent, dir }
    }

    /// The peer scripted by `script` (`{dir}` names the fixture's directory).
    pub async fn peer(script: &[(&str, &str)]) -> Self {
        Self::new(peer_config(script)).await
    }

    /// A path under the fixture's directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn request(&self, prompt: &str) -> SubagentStartRequest {
        SubagentStartRequest::new(self.parent.agent(), text(prompt))
    }

    pub async fn start(&self, prompt: &str) -> subagents::Result<SubagentRun> {
        within(
            "the ACP start",
            self.rt.subagents().start("acp", self.request(prompt)),
        )
        .await
    }
}

/// The pid written to `file`.
pub fn pid_in(file: &Path) -> u32 {
    std::fs::read_to_string(file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
