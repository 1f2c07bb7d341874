//! What the model-facing subagent tools share: finding the calling agent, reading string
//! arguments, and turning a seam error into the tool error the model reads.

use serde_json::Value;

use crate::actors::agent::AgentRef;
use crate::actors::agents::Agents;
use crate::error::SubagentError;
use crate::tools::{ToolCtx, ToolError};

/// The code of a call whose agent is no longer live.
pub const NO_CALLING_AGENT: &str = "NO_CALLING_AGENT";

impl From<SubagentError> for ToolError {
    /// The seam's stable code and its message: the model reads `Error: <message>`.
    fn from(error: SubagentError) -> Self {
        Self::new(error.code().as_str(), error.message())
    }
}

/// The exact live agent making the call.
///
/// # Errors
/// `NO_CALLING_AGENT` when the calling agent is no longer live.
pub(crate) async fn calling_agent(
    agents: &Agents,
    ctx: &ToolCtx,
    tool: &str,
) -> Result<AgentRef, ToolError> {
    agents.get(ctx.agent).await.ok_or_else(|| {
        ToolError::new(
            NO_CALLING_AGENT,
            format!(
                "{tool} requires a calling agent (agent {} is not live)",
                ctx.agent
            ),
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
