//! What the model-facing subagent tools share: finding the calling agent, reading string
//! arguments, and turning a delegation error into the tool error the model reads.

use serde_json::Value;

use crate::actors::agent::AgentRef;
use std::sync::Arc;

use crate::error::{Result as SeamResult, SubagentError};
use crate::tools::{Tool, ToolCtx, ToolError, ToolRegistry};

/// The code of a call whose agent is no longer live.
pub const NO_CALLING_AGENT: &str = "NO_CALLING_AGENT";

impl From<SubagentError> for ToolError {
    /// The error's stable code and its message: the model reads `Error: <message>`.
    fn from(error: SubagentError) -> Self {
        Self::new(error.code().as_str(), error.message())
    }
}

/// The exact agent making the call: the authority the tool presents to the delegation API.
///
/// # Errors
/// `NO_CALLING_AGENT` for a call that carries no agent (a [`ToolCtx::new`] made outside a
/// turn).
pub(crate) fn calling_agent(ctx: &ToolCtx, tool: &str) -> Result<AgentRef, ToolError> {
    ctx.caller().cloned().ok_or_else(|| {
        ToolError::new(
            NO_CALLING_AGENT,
            format!("{tool} requires a calling agent (exec.agent was undefined)"),
        )
    })
}

/// The required string argument `name`.
///
/// # Errors
/// `INVALID_ARGS` when it is missing or not a string.
pub(crate) fn string_arg(args: &Value, name: &str) -> Result<String, ToolError> {
    args.get(name)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            ToolError::new(
                "INVALID_ARGS",
                format!("`{name}` is required and must be a string"),
            )
        })
}

/// Global tools registered together: all or none, and unregistered together.
pub(crate) struct GlobalTools {
    registry: Arc<ToolRegistry>,
    names: Vec<String>,
}

impl GlobalTools {
    /// Registers every tool of `tools`, or none of them.
    ///
    /// # Errors
    /// `DUPLICATE_TOOL` when a name is taken; the ones registered before it are withdrawn.
    pub(crate) fn register(
        registry: &Arc<ToolRegistry>,
        tools: impl IntoIterator<Item = Tool>,
    ) -> SeamResult<Self> {
        let mut installed = Self {
            registry: Arc::clone(registry),
            names: Vec::new(),
        };
        for tool in tools {
            let name = tool.name().to_owned();
            // On failure, dropping `installed` withdraws what was registered.
            registry.register(tool)?;
            installed.names.push(name);
        }
        Ok(installed)
    }

    /// Keeps the tools registered for the registry's whole life.
    pub(crate) fn keep(mut self) {
        self.names.clear();
    }
}

impl Drop for GlobalTools {
    fn drop(&mut self) {
        for name in &self.names {
            self.registry.unregister(name);
        }
    }
}
