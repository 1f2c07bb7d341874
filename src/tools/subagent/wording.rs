//! The `subagent` tool's model-facing words: its description and parameter schema, derived on
//! every mount from whether the provider's child sees the conversation and from the route the
//! tool takes by default.

use serde_json::{json, Value};

use super::BackgroundMode;
use crate::host::PromptSection;

/// Where a continuable instance's guidance sits in the system prompt.
const GUIDANCE_ORDER: f64 = 116.5;

/// What the wording depends on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Wording {
    /// The provider's `inherits_parent_context`.
    pub(super) inherits_parent_context: bool,
    /// Whether the instance offers `run_in_background`.
    pub(super) background_enabled: bool,
    /// The background route.
    pub(super) mode: BackgroundMode,
}

impl Wording {
    /// The tool description.
    pub(super) fn description(self) -> String {
        let mut text = if self.inherits_parent_context {
            "Delegate a task to a subagent that inherits this conversation: a child agent seeded \
             with all completed turns so far (it does not see the current in-flight turn). \
             Use it for work that builds on what was already said or done."
                .to_owned()
        } else {
            "Delegate a self-contained task to a fresh subagent: a child agent with its own \
             context and tools. Give it a complete, standalone prompt: it does not see this \
             conversation."
                .to_owned()
        };
        text.push(' ');
        text.push_str(match (self.background_enabled, self.mode) {
            (false, _) => "This call waits for the subagent and returns its result.",
            (true, BackgroundMode::OneShot) => {
                "This call waits for the result by default. Set `run_in_background: true` to \
                 return a job id; collect with `job_output` and stop with `job_kill`."
            }
            (true, BackgroundMode::Continuable) => {
                "It runs in the background by default: the call returns a durable subagent id \
                 at once, and a runtime notice arrives when the subagent settles, with its \
                 outcome and any final assistant message. Continue it with `send_message`. \
                 Set `run_in_background: false` only when your next action depends on the \
                 result."
            }
        });
        text
    }

    /// The guidance section of a continuable instance with background enabled: `tool:<name>`,
    /// shown exactly while the agent sees the tool.
    pub(super) fn guidance(self, tool_name: &str) -> Option<PromptSection> {
        (self.background_enabled && self.mode == BackgroundMode::Continuable).then(|| {
            PromptSection::new(
                format!("tool:{tool_name}"),
                GUIDANCE_ORDER,
                format!(
                    "Use {tool_name} in the background by default. Start independent \
                     delegations together, then keep working: each subagent's settlement \
                     arrives as a notice. Use send_message to continue a subagent you \
                     started, and call {tool_name} with run_in_background: false only when \
                     your very next step needs the answer."
                ),
            )
        })
    }

    /// The parameter schema: `description`, `prompt`, and `run_in_background` only when the
    /// instance offers it.
    pub(super) fn parameters(self) -> Value {
        let prompt = if self.inherits_parent_context {
            "The task for the subagent. It already sees this conversation's completed turns, \
             so build on them freely and state only what is new."
        } else {
            "The task for the subagent. It does not share this conversation's context, so \
             include everything it needs."
        };
        let mut properties = json!({
            "description": {
                "type": "string",
                "description": "A short (3-5 word) description of the delegated task, for display."
            },
            "prompt": {"type": "string", "description": prompt}
        });
        if self.background_enabled {
            let background = match self.mode {
                BackgroundMode::OneShot => {
                    "Run the subagent in the background and return a job id at once. Defaults \
                     to false; collect the output with `job_output` and stop it with \
                     `job_kill`."
                }
                BackgroundMode::Continuable => {
                    "Run the subagent in the background and return its durable id at once. \
                     Defaults to true; pass false only when your next action depends on the \
                     result."
                }
            };
            properties["run_in_background"] = json!({"type": "boolean", "description": background});
        }
        json!({
            "type": "object",
            "properties": properties,
            "required": ["description", "prompt"],
            "additionalProperties": false
        })
    }
}
