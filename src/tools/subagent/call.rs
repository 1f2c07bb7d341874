//! One `subagent` call: its arguments, its route, and how its outcome reads to the model.

use serde_json::{json, Value};

use super::{BackgroundMode, MaxDepthPolicy, Services, SubagentToolConfig};
use tokio_util::sync::CancellationToken;

use crate::actors::agent::AgentRef;
use crate::content::{text_of, ContentBlock};
use crate::error::{ErrorCode, SubagentError};
use crate::jobs::{JobHooks, JobOutcome, JobStatus};
use crate::seam::{ContinuableStartSpec, SubagentResult, SubagentStartRequest};
use crate::stop_reason::StopReason;
use crate::tools::plugin::{calling_agent, string_arg};
use crate::tools::{ToolCtx, ToolError, ToolOutput};

/// The code of a foreground run that ended with a stop reason other than `completed`.
pub const SUBAGENT_STOPPED: &str = "SUBAGENT_STOPPED";

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
        let parent = calling_agent(&ctx, "subagent")?;
        let description = string_arg(&args, "description")?;
        let prompt = string_arg(&args, "prompt")?;
        let requested = match args.get("run_in_background") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(flag)) => Some(*flag),
            Some(other) => {
                return Err(ToolError::new(
                    ErrorCode::InvalidArgs.as_str(),
                    format!("run_in_background must be a boolean, not {other}"),
                ))
            }
        };
        if !self.config.enable_run_in_background && requested == Some(true) {
            return Err(ToolError::new(
                ErrorCode::InvalidArgs.as_str(),
                "run_in_background is disabled for this tool instance (enableRunInBackground: false)",
            ));
        }
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
            BackgroundMode::OneShot => self.background(&parent, description, prompt),
        }
    }

    fn max_depth(&self) -> Option<u64> {
        match self.config.max_depth {
            MaxDepthPolicy::Limit(limit) => Some(limit),
            MaxDepthPolicy::ProviderManaged => None,
        }
    }

    /// The one-shot request this instance sends, cancelled by `cancel`.
    fn request(
        &self,
        parent: &AgentRef,
        description: String,
        prompt: Vec<ContentBlock>,
        cancel: CancellationToken,
    ) -> SubagentStartRequest {
        let mut request = SubagentStartRequest::new(parent, prompt);
        request.label = Some(description);
        request.agent_options.clone_from(&self.config.agent_options);
        request.persona.clone_from(&self.config.persona);
        request.tool_filter.clone_from(&self.config.tool_filter);
        request.max_depth = self.max_depth();
        request.cancel = cancel;
        request
    }

    /// Starts a `subagent` job that runs a one-shot child to its end; the job, not the tool
    /// call, owns the child's cancellation.
    fn background(
        &self,
        parent: &AgentRef,
        description: String,
        prompt: Vec<ContentBlock>,
    ) -> std::result::Result<ToolOutput, ToolError> {
        let cancel = CancellationToken::new();
        let request = self.request(parent, description.clone(), prompt, cancel.clone());
        let subagents = self.services.subagents.clone();
        let provider = self.config.provider.clone();
        let id = self
            .services
            .jobs
            .start("subagent", &description, parent, move || {
                // Called once the job's preflight passed, still within the tool call: the
                // parent's delegated policy is captured now.
                let start = subagents.start(&provider, request);
                let kill = cancel.clone();
                JobHooks {
                    cancel: Box::new(move |_reason| kill.cancel()),
                    done: Box::pin(async move { background_outcome(start.await, &cancel).await }),
                }
            })?;
        Ok(ToolOutput {
            value: Some(json!({"kind": "background", "jobId": id})),
            ..ToolOutput::text(format!("started background subagent job {id}"))
        })
    }

    /// Starts a one-shot child, awaits its result, and always disposes it once.
    async fn foreground(
        &self,
        parent: &AgentRef,
        description: String,
        prompt: Vec<ContentBlock>,
        ctx: &ToolCtx,
    ) -> std::result::Result<ToolOutput, ToolError> {
        let request = self.request(parent, description, prompt, ctx.cancel.clone());
        let start = self
            .services
            .subagents
            .start(&self.config.provider, request);
        // One task owns the run from start to disposal: a call dropped mid-await (its turn was
        // cancelled, which cancels the run too) still disposes the child it started.
        let owned = tokio::spawn(async move {
            let run = start.await?;
            let result = run.result().await;
            let disposed = run.dispose().await;
            if let Err(error) = &disposed {
                tracing::warn!(child_id = %run.id(), %error, "disposing a foreground subagent run failed");
            }
            Ok::<_, SubagentError>((run.id(), result, disposed))
        });
        let (id, result, disposed) = owned.await.map_err(|error| {
            ToolError::new(
                ErrorCode::ReportableBug.as_str(),
                format!("the subagent run's task failed: {error}"),
            )
        })??;
        match (result, disposed) {
            (Ok(result), Ok(())) => foreground_outcome(id, result),
            (Ok(result), Err(dispose)) => {
                let message = match foreground_outcome(id, result) {
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

/// How a background run's job ends: `completed` with the text; `killed` when cancelled (or
/// refused after the kill); `failed` with the stop reason or the error as its detail, and a
/// failed disposal appended.
async fn background_outcome(
    started: crate::error::Result<crate::seam::SubagentRun>,
    cancel: &CancellationToken,
) -> JobOutcome {
    let failed = |detail: String| JobOutcome {
        status: JobStatus::Failed,
        detail: Some(detail),
        output: None,
    };
    let run = match started {
        Ok(run) => run,
        Err(_) if cancel.is_cancelled() => {
            return JobOutcome {
                status: JobStatus::Killed,
                detail: None,
                output: None,
            }
        }
        Err(error) => return failed(format!("Error: {}", error.message())),
    };
    let result = run.result().await;
    let disposed = run.dispose().await;
    let mut outcome = match result {
        Ok(result) => {
            let text = text_of(&result.output);
            match result.stop_reason {
                StopReason::Completed => JobOutcome {
                    status: JobStatus::Completed,
                    detail: None,
                    output: Some(text),
                },
                // Only a completed job has output to collect.
                StopReason::Aborted => JobOutcome {
                    status: JobStatus::Killed,
                    detail: None,
                    output: None,
                },
                other => failed(other.as_str().to_owned()),
            }
        }
        Err(error) => failed(format!("Error: {}", error.message())),
    };
    if let Err(error) = disposed {
        let appended = format!("dispose failed: {}", error.message());
        outcome.status = JobStatus::Failed;
        outcome.detail = Some(match outcome.detail {
            Some(detail) => format!("{detail}; {appended}"),
            None => appended,
        });
    }
    outcome
}

/// A completed run reads as its text (its structured value as JSON, when it has one); any
/// other stop reason is an error naming it, with the partial output the child produced.
fn foreground_outcome(
    run_id: crate::ids::SessionId,
    result: SubagentResult,
) -> std::result::Result<ToolOutput, ToolError> {
    let text = text_of(&result.output);
    if result.stop_reason == StopReason::Completed {
        // A structured result is what the caller asked for: the model reads it as JSON.
        let shown = result
            .structured
            .as_ref()
            .map_or(text, |value| value.to_string());
        let mut output = ToolOutput::text(shown);
        let mut value = json!({"kind": "foreground", "runId": run_id, "output": result.output});
        if let Some(structured) = result.structured {
            value["structured"] = structured;
        }
        output.value = Some(value);
        return Ok(output);
    }
    let mut message = stop_headline(&result.stop_reason);
    if let Some(diagnostic) = &result.diagnostic {
        message.push_str("\nDiagnostic: ");
        message.push_str(diagnostic);
    }
    if !text.is_empty() {
        message.push_str("\nPartial output before the run ended:\n");
        message.push_str(&text);
    }
    Err(ToolError::new(SUBAGENT_STOPPED, message))
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
