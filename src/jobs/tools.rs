//! Provides the model-facing job tools over [`Jobs`]: `job_output` (read, optionally wait),
//! `job_list` and `job_kill`, installed with [`install_job_tools`]. Installing them attaches
//! the job controller producers need, and delivers each unobserved completion to the job's
//! owner as a notice: it opens a turn on an idle owner (`wakeup`, the default) or waits in a
//! busy owner's next step.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{ControllerGuard, JobSnapshot, Jobs, KillOutcome};
use crate::content::{ContentBlock, MessageSource};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::{AgentStatus, PromptSection};
use crate::runtime::Runtime;
use crate::tools::plugin::string_arg;
use crate::tools::{Concurrency, Tool, ToolError, ToolOutput, ToolRegistry};

/// `job_output`.
pub const JOB_OUTPUT: &str = "job_output";
/// `job_list`.
pub const JOB_LIST: &str = "job_list";
/// `job_kill`.
pub const JOB_KILL: &str = "job_kill";
/// The plugin name on completion notices.
pub const JOBS_PLUGIN: &str = "tool-jobs";

const GUIDANCE: &str = "Track every background job id you start. You are notified in-session \
when a job finishes — do not busy-poll or sleep on one; keep working on independent steps and \
do not duplicate a running job's work. Before giving a final answer, collect every \
still-relevant job with job_output (set wait: true only when you are genuinely blocked on it), \
and job_kill jobs that stopped mattering.";

/// How a completion reaches an idle owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompletionDelivery {
    /// Opens a turn on an idle owner.
    #[default]
    Wakeup,
    /// Waits for something else to wake the owner.
    Quiet,
}

/// The job tools' settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobToolsConfig {
    /// The wait of a `job_output` with `wait: true` and no `timeout_ms`.
    pub wait_timeout: Duration,
    /// The cap on any wait.
    pub max_wait_timeout: Duration,
    /// How a completion reaches an idle owner.
    pub completion_delivery: CompletionDelivery,
}

impl Default for JobToolsConfig {
    fn default() -> Self {
        Self {
            wait_timeout: Duration::from_secs(30),
            max_wait_timeout: Duration::from_secs(600),
            completion_delivery: CompletionDelivery::Wakeup,
        }
    }
}

/// The installed job tools. Dropping it, or [`JobTools::remove`], unregisters them and
/// detaches the controller (later background starts are refused); [`JobTools::keep`] keeps
/// them for the runtime's whole life.
#[must_use = "dropping the installation removes the job tools"]
pub struct JobTools {
    registry: Option<Arc<ToolRegistry>>,
    controller: Option<ControllerGuard>,
}

impl std::fmt::Debug for JobTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobTools")
            .field("installed", &self.registry.is_some())
            .finish()
    }
}

impl JobTools {
    /// Unregisters the tools and detaches the controller.
    pub fn remove(mut self) {
        self.release();
    }

    /// Keeps the tools and the controller for the runtime's whole life.
    pub fn keep(mut self) {
        self.registry = None;
        if let Some(controller) = self.controller.take() {
            controller.keep();
        }
    }

    fn release(&mut self) {
        if let Some(registry) = self.registry.take() {
            for name in [JOB_OUTPUT, JOB_LIST, JOB_KILL] {
                registry.unregister(name);
            }
        }
        self.controller = None;
    }
}

impl Drop for JobTools {
    fn drop(&mut self) {
        self.release();
    }
}

/// Registers `job_output`, `job_list` and `job_kill`, attaches the job controller, and
/// delivers completion notices to owners.
///
/// # Errors
/// `INVALID_ARGS` when the default wait exceeds the cap; `DUPLICATE_TOOL` when a name is
/// taken (nothing stays registered).
pub fn install_job_tools(rt: &Runtime, config: JobToolsConfig) -> Result<JobTools> {
    if config.wait_timeout > config.max_wait_timeout || config.wait_timeout.is_zero() {
        return Err(SubagentError::new(
            ErrorCode::InvalidArgs,
            format!(
                "tool-jobs: waitTimeoutMs ({} ms) must be positive and at most maxWaitTimeoutMs ({} ms)",
                config.wait_timeout.as_millis(),
                config.max_wait_timeout.as_millis()
            ),
        ));
    }
    let jobs = rt.jobs().clone();
    let registry = Arc::clone(rt.tools());
    let tools = [
        job_output(jobs.clone(), config),
        job_list(jobs.clone()),
        job_kill(jobs.clone()),
    ];
    for (index, tool) in tools.into_iter().enumerate() {
        if let Err(error) = registry.register(tool) {
            for name in &[JOB_OUTPUT, JOB_LIST, JOB_KILL][..index] {
                registry.unregister(name);
            }
            return Err(error);
        }
    }
    let delivery = config.completion_delivery;
    jobs.on_job_done(Arc::new(move |snapshot, owner| {
        let notice = vec![ContentBlock::text(completion_notice(snapshot))];
        let source = MessageSource::Plugin {
            plugin: JOBS_PLUGIN.to_owned(),
        };
        let owner = owner.clone();
        // Sending is a message to the owner's actor; the listener runs inside the registry.
        tokio::spawn(async move {
            let idle = matches!(owner.status().await, Ok(snapshot) if snapshot.status == AgentStatus::Idle);
            let delivered = if idle && delivery == CompletionDelivery::Wakeup {
                owner.followup(notice, source).await.map(drop)
            } else {
                owner.inject(notice, source).await.map(drop)
            };
            if let Err(error) = delivered {
                // The owner is gone: its jobs ended with it.
                tracing::debug!(owner = %owner.id(), %error, "a job completion notice was not delivered");
            }
        });
    }));
    Ok(JobTools {
        registry: Some(registry),
        controller: Some(jobs.attach_controller()),
    })
}

/// `background job <id> (<kind>: <label>) finished [status: ...]. Read its output with job_output.`
pub fn completion_notice(snapshot: &JobSnapshot) -> String {
    format!(
        "background job {} ({}: {}) finished {}. Read its output with job_output.",
        snapshot.id,
        snapshot.kind,
        snapshot.label,
        snapshot.status_line()
    )
}

fn job_id(args: &Value) -> std::result::Result<String, ToolError> {
    let id = string_arg(args, "job_id")?;
    if id.is_empty() {
        return Err(ToolError::new(
            "INVALID_ARGS",
            "invalid job_id: expected a non-empty string, got \"\"",
        ));
    }
    Ok(id)
}

fn job_value(snapshot: &JobSnapshot) -> Value {
    serde_json::to_value(snapshot).unwrap_or(Value::Null)
}

fn job_output(jobs: Jobs, config: JobToolsConfig) -> Tool {
    Tool::new(
        JOB_OUTPUT,
        "Read a background job. Final-output jobs return their result after settlement. Every \
         response ends with `[status: ...]`. Reads are non-blocking unless `wait: true`, which \
         waits up to the configured cap.",
        json!({
            "type": "object",
            "properties": {
                "job_id": {"type": "string", "description": "Job id returned by the tool that started the background work."},
                "wait": {"type": "boolean", "description": "Block until the job reaches a terminal status or the timeout expires. A timed-out wait returns [status: running] and leaves the job alive."},
                "timeout_ms": {"type": "number", "description": "Max wait in milliseconds (only meaningful with wait: true). Defaults to the configured wait timeout; capped by the configured maximum."}
            },
            "required": ["job_id"],
            "additionalProperties": false
        }),
        move |args, ctx| {
            let jobs = jobs.clone();
            async move {
                let id = job_id(&args)?;
                if args.get("wait").and_then(Value::as_bool) == Some(true) {
                    let timeout = match args.get("timeout_ms").and_then(Value::as_f64) {
                        Some(ms) if ms.is_finite() && ms > 0.0 => {
                            Duration::from_secs_f64(ms / 1000.0).min(config.max_wait_timeout)
                        }
                        Some(ms) => {
                            return Err(ToolError::new(
                                "INVALID_ARGS",
                                format!("invalid wait timeout: expected a positive number of milliseconds, got {ms}"),
                            ))
                        }
                        None => config.wait_timeout,
                    };
                    jobs.wait(&id, ctx.agent, timeout, &ctx.cancel).await?;
                }
                let (text, snapshot) = jobs.read(&id, ctx.agent)?;
                let body = if text.is_empty() {
                    "(no new output)".to_owned()
                } else {
                    text.strip_suffix('\n').unwrap_or(&text).to_owned()
                };
                Ok(ToolOutput {
                    value: Some(json!({"text": text, "job": job_value(&snapshot)})),
                    ..ToolOutput::text(format!("{body}\n{}", snapshot.status_line()))
                })
            }
        },
    )
    .concurrency(Concurrency::Safe)
    .with_guidance(PromptSection::new("tool:jobs", 106.0, GUIDANCE))
}

fn job_list(jobs: Jobs) -> Tool {
    Tool::new(
        JOB_LIST,
        "List your background jobs (running and finished) with their ids, kinds, and statuses.",
        json!({"type": "object", "properties": {}, "additionalProperties": false}),
        move |_, ctx| {
            let listed = jobs.list(ctx.agent);
            async move {
                let text = if listed.is_empty() {
                    "(no background jobs)".to_owned()
                } else {
                    listed
                        .iter()
                        .map(|job| {
                            format!(
                                "{} [{}] {} — {}",
                                job.id,
                                job.kind,
                                job.status.as_str(),
                                job.label
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                Ok(ToolOutput {
                    value: Some(Value::Array(listed.iter().map(job_value).collect())),
                    ..ToolOutput::text(text)
                })
            }
        },
    )
    .concurrency(Concurrency::Safe)
}

fn job_kill(jobs: Jobs) -> Tool {
    Tool::new(
        JOB_KILL,
        "Request cancellation of a running background job by job id. Returns immediately; the \
         job settles as killed once its work actually stops.",
        json!({
            "type": "object",
            "properties": {
                "job_id": {"type": "string", "description": "Job id returned by the tool that started the background work."},
                "reason": {"type": "string", "description": "Optional short reason, recorded in the log and forwarded to the job."}
            },
            "required": ["job_id"],
            "additionalProperties": false
        }),
        move |args, ctx| {
            let outcome = job_id(&args).and_then(|id| {
                let reason = args.get("reason").and_then(Value::as_str).map(str::to_owned);
                let killed = jobs.kill(&id, ctx.agent, reason)?;
                let snapshot = jobs.get(&id, ctx.agent)?;
                Ok((killed, snapshot))
            });
            async move {
                let (killed, snapshot) = outcome?;
                let text = match killed {
                    KillOutcome::AlreadyFinished => format!(
                        "job {} had already finished {}",
                        snapshot.id,
                        snapshot.status_line()
                    ),
                    KillOutcome::Requested => format!("requested cancellation of job {}", snapshot.id),
                };
                Ok(ToolOutput {
                    value: Some(json!({"job": job_value(&snapshot)})),
                    ..ToolOutput::text(text)
                })
            }
        },
    )
    .concurrency(Concurrency::Safe)
}
