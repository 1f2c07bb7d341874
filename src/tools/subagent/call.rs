//! One `subagent` call: its arguments, its route, and how its outcome reads to the model.

use serde_json::{json, Value};

use super::{BackgroundMode, MaxDepthPolicy, Services, SubagentToolConfig};
use crate::content::ContentBlock;
use crate::seam::{ContinuableStartSpec, SubagentResult, SubagentStartRequest};
use crate::stop_reason::StopReason;
use crate::tools::plugin::{calling_agent, string_arg};
use crate::tools::{ToolCtx, ToolError, ToolOutput};

/// The code of a background one-shot call in a runtime without a jobs service.
pub const BACKGROUND_JOBS_UNAVAILABLE: &str = "BACKGROUND_JOBS_UNAVAILABLE";

/// A mounted instance's call path.
pub(super) struct SubagentCall {
    pub(super) config: SubagentToolConfig,
    pub(super) services: Services,
}

impl SubagentCall {
    pub(super) async fn run(
        &self,
        args: Value,
        ctx: ToolCtx,
    ) -> std::result::Result<ToolOutput, ToolError> {
        let description = string_arg(&args, "description")?;
        let prompt = string_arg(&args, "prompt")?;
        let requested = match args.get("run_in_background") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(flag)) => Some(*flag),
            Some(other) => {
                return Err(ToolError::new(
                    "INVALID_ARGS",
                    format!("run_in_background must be a boolean, not {other}"),
                ))
            }
        };
        if !self.config.enable_run_in_background && requested == Some(true) {
            return Err(ToolError::new(
                "INVALID_ARGS",
                "run_in_background is disabled for this tool instance (enableRunInBackground: false)",
            ));
        }
        let parent = calling_agent(&self.services.agents, &ctx, "subagent").await?;
        let background = self.config.enable_run_in_background
            && requested.unwrap_or(self.config.background_mode == BackgroundMode::Continuable);
        let prompt = vec![ContentBlock::text(prompt)];
        if !background {
            return self.foreground(&parent, description, prompt, &ctx).await;
        }
        match self.config.background_mode {
            BackgroundMode::Continuable => {
                let mut spec = ContinuableStartSpec::new(
                    self.config.provider.clone(),
                    description,
                    &parent,
                    prompt,
                );
                spec.agent_options.clone_from(&self.config.agent_options);
                spec.persona.clone_from(&self.config.persona);
                spec.tool_filter.clone_from(&self.config.tool_filter);
                spec.max_depth = self.max_depth();
                spec.cancel = ctx.cancel.clone();
                let started = self.services.subagents.start_continuable(spec).await?;
                Ok(ToolOutput {
                    value: Some(json!({"kind": "continuable", "subagentId": started.child_id})),
                    ..ToolOutput::text(format!("started subagent {}", started.child_id))
                })
            }
            BackgroundMode::OneShot => Err(ToolError::new(
                BACKGROUND_JOBS_UNAVAILABLE,
                "background jobs unavailable: this runtime has no jobs service; call without \
                 run_in_background to wait for the result",
            )),
        }
    }

    fn max_depth(&self) -> Option<u64> {
        match self.config.max_depth {
            MaxDepthPolicy::Limit(limit) => Some(limit),
            MaxDepthPolicy::ProviderManaged => None,
        }
    }

    /// Starts a one-shot child, awaits its result, and always disposes it once.
    async fn foreground(
        &self,
        parent: &crate::actors::agent::AgentRef,
        description: String,
        prompt: Vec<ContentBlock>,
        ctx: &ToolCtx,
    ) -> std::result::Result<ToolOutput, ToolError> {
        let mut request = SubagentStartRequest::new(parent, prompt);
        request.label = Some(description);
        request.agent_options.clone_from(&self.config.agent_options);
        request.persona.clone_from(&self.config.persona);
        request.tool_filter.clone_from(&self.config.tool_filter);
        request.max_depth = self.max_depth();
        request.cancel = ctx.cancel.clone();
        let run = self
            .services
            .subagents
            .start(&self.config.provider, request)
            .await?;
        let result = run.result().await;
        let disposed = run.dispose().await;
        match (result, disposed) {
            (Ok(result), Ok(())) => foreground_outcome(run.id(), result),
            (Ok(result), Err(dispose)) => {
                let message = match foreground_outcome(run.id(), result) {
                    Ok(_) => format!(
                        "subagent run completed, but dispose failed: {}",
                        dispose.message()
                    ),
                    Err(failed) => {
                        format!("{}; dispose failed: {}", failed.message, dispose.message())
                    }
                };
                Err(ToolError::new(dispose.code().as_str(), message))
            }
            (Err(failed), Ok(())) => Err(failed.into()),
            (Err(failed), Err(dispose)) => Err(ToolError::new(
                failed.code().as_str(),
                format!(
                    "subagent run failed: {}; dispose failed: {}",
                    failed.message(),
                    dispose.message()
                ),
            )),
        }
    }
}

/// A completed run reads as its text; any other stop reason is an error naming it, with the
/// partial output the child produced.
fn foreground_outcome(
    run_id: crate::ids::SessionId,
    result: SubagentResult,
) -> std::result::Result<ToolOutput, ToolError> {
    let text: String = result
        .output
        .iter()
        .filter_map(ContentBlock::as_text)
        .collect();
    if result.stop_reason == StopReason::Completed {
        let mut output = ToolOutput::text(text);
        output.value = Some(json!({
            "kind": "foreground",
            "runId": run_id,
            "output": result.output,
            "structured": result.structured,
        }));
        return Ok(output);
    }
    let mut message = stop_headline(&result.stop_reason);
    if !text.is_empty() {
        message.push_str("\nPartial output before the run ended:\n");
        message.push_str(&text);
    }
    Err(ToolError::new("SUBAGENT_STOPPED", message))
}

/// The first line of a failed run's error.
pub(crate) fn stop_headline(reason: &StopReason) -> String {
    match reason {
        StopReason::Completed => "subagent run completed".to_owned(),
        StopReason::Aborted => "subagent run was cancelled".to_owned(),
        StopReason::Error => "subagent run failed".to_owned(),
        StopReason::MaxTokens => "subagent run hit its token limit before finishing".to_owned(),
        StopReason::Refusal => "subagent declined the task".to_owned(),
        other => format!("subagent run ended abnormally ({})", other.as_str()),
    }
}
