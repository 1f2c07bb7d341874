//! Provides the structured-output capture: a child-scoped `structured_output` tool whose
//! parameters are the requested schema, plus its guard, commit observer and prompt section.
//!
//! # How a capture happens
//! 1. The child calls `structured_output`. Arguments that fail the schema are an `INVALID_ARGS`
//!    error result (the model may retry in the same turn).
//! 2. Valid arguments are **staged** under the call's execution identity (never its call id,
//!    which a model may reuse), the turn is concluded, and the tool answers
//!    "Structured output recorded.".
//! 3. When the call's final result is observed (after every post-execute hook), its stage is
//!    taken: an error result discards it, a success commits it. The first commit wins.
//! 4. From then on the guard refuses every call of the child, so calls after the capture in the
//!    same response never run. Calls before it already ran.
//!
//! There is no re-prompt: a structured child that ends a clean turn without a capture fails.
//! Everything is registered on the child's own scope, so it dies with the child, concurrent
//! children each see their own schema, and plain agents never see the tool.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{json, Value};

use crate::error::Result;
use crate::host::{AgentScope, PromptSection};
use crate::schema::ObjectSchema;
use crate::tools::{Tool, ToolError, ToolOutput};

/// The capture tool's name.
pub const STRUCTURED_OUTPUT_TOOL: &str = "structured_output";

/// The prompt section that carries the capture instruction, at the end of the tool-guidance band.
pub const STRUCTURED_OUTPUT_SECTION: &str = "tool:structured_output";

/// The section's order.
pub const STRUCTURED_OUTPUT_ORDER: f64 = 190.0;

/// The instruction appended to a structured child's system prompt.
pub const STRUCTURED_OUTPUT_INSTRUCTION: &str = "When your work is complete, call the \
structured_output tool exactly once with your final answer as its arguments, matching its \
schema. That call ends your turn; do not answer in prose instead.";

/// One structured child's capture state. Cheap to clone; clones share the state.
#[derive(Clone, Debug, Default)]
pub struct StructuredCapture {
    state: Arc<Mutex<CaptureState>>,
}

#[derive(Debug, Default)]
struct CaptureState {
    staged: HashMap<u64, Value>,
    captured: Option<Value>,
}

impl StructuredCapture {
    fn lock(&self) -> MutexGuard<'_, CaptureState> {
        // Every critical section is a single map or option update.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The committed value, if any.
    pub fn captured(&self) -> Option<Value> {
        self.lock().captured.clone()
    }

    /// Registers the capture tool, guard, observer and prompt section on a child's scope.
    ///
    /// # Errors
    /// `DUPLICATE_TOOL` when the scope already has a `structured_output` tool.
    pub fn attach(scope: &mut AgentScope, schema: ObjectSchema) -> Result<Self> {
        let capture = Self::default();
        let staging = capture.clone();
        let tool = Tool::new(
            STRUCTURED_OUTPUT_TOOL,
            "Record the final structured result of this task. Calling it ends the turn.",
            schema.as_value().clone(),
            move |arguments: Value, ctx: crate::tools::ToolCtx| {
                let outcome = match schema.validate(&arguments) {
                    Err(violations) => Err(ToolError::new(
                        "INVALID_ARGS",
                        format!(
                            "structured output does not match the schema: {}",
                            violations.join("; ")
                        ),
                    )),
                    Ok(()) => {
                        staging.lock().staged.insert(ctx.execution(), arguments);
                        ctx.conclude_turn();
                        Ok(ToolOutput {
                            value: Some(json!({"recorded": true})),
                            ..ToolOutput::text("Structured output recorded.")
                        })
                    }
                };
                futures::future::ready(outcome)
            },
        );
        scope.register_tool(tool)?;
        let guarded = capture.clone();
        scope.guard(Arc::new(move |call| {
            guarded.lock().captured.is_some().then(|| {
                format!(
                    "structured output already recorded: the run is complete, so `{}` is not executed",
                    call.name
                )
            })
        }));
        let committing = capture.clone();
        scope.on_tool_result(Arc::new(move |seen| {
            if seen.name != STRUCTURED_OUTPUT_TOOL {
                return;
            }
            let mut state = committing.lock();
            let staged = state.staged.remove(&seen.execution);
            if let (Some(value), false) = (staged, seen.result.is_error) {
                state.captured.get_or_insert(value);
            }
        }));
        scope.section(PromptSection::new(
            STRUCTURED_OUTPUT_SECTION,
            STRUCTURED_OUTPUT_ORDER,
            STRUCTURED_OUTPUT_INSTRUCTION,
        ));
        Ok(capture)
    }
}
