//! Provides the model-facing job tools over [`Jobs`]: `job_output` (read, optionally wait),
//! `job_list` and `job_kill`, installed with [`install_job_tools`]. Installing them attaches
//! the job controller producers need, and delivers each unobserved completion to the job's
//! owner as a notice: it opens a turn on an idle owner (`wakeup`, the default) or waits in a
//! busy owner's next step.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{ControllerGuard, JobSnapshot, Jobs, KillOutcome, ListenerGuard};
use crate::actors::agent::Wake;
use crate::content::{ContentBlock, Message, MessageSource};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::{AgentStatus, PromptSection};
use crate::ids::SessionId;
use crate::runtime::Runtime;
use crate::session::InboxTarget;
use crate::tools::plugin::{calling_agent, string_arg, GlobalTools};
use crate::tools::{Concurrency, Tool, ToolCtx, ToolError, ToolOutput};

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

/// The installed job tools. Dropping it, or [`JobTools::remove`], unregisters them, stops
/// the completion notices and detaches the controller (later background starts are refused);
/// [`JobTools::keep`] keeps them for the runtime's whole life.
#[must_use = "dropping the installation removes the job tools"]
pub struct JobTools {
    tools: GlobalTools,
    notices: ListenerGuard,
    controller: ControllerGuard,
}

impl std::fmt::Debug for JobTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobTools").finish_non_exhaustive()
    }
}

impl JobTools {
    /// Unregisters the tools, stops the notices and detaches the controller.
    pub fn remove(self) {
        drop(self);
    }

    /// Keeps the tools, the notices and the controller for the runtime's whole life.
    pub fn keep(self) {
        self.tools.keep();
        self.notices.keep();
        self.controller.keep();
    }
}

/// Registers `job_output`, `job_list` and `job_kill`, attaches the job controller, and
/// delivers completion notices to owners.
///
/// # Errors
/// `INVALID_ARGS` when the default wait is zero or exceeds the cap; `DUPLICATE_TOOL` when a
/// name is taken (nothing stays registered).
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
    let tools = GlobalTools::register(
        rt.tools(),
        [
            job_output(jobs.clone(), config),
            job_list(jobs.clone()),
            job_kill(jobs.clone()),
        ],
    )?;
    let delivery = config.completion_delivery;
    let notices = jobs.on_job_done(Arc::new(move |snapshot, owner| {
        let notice = vec![ContentBlock::text(completion_notice(snapshot))];
        let source = MessageSource::Plugin {
            plugin: JOBS_PLUGIN.to_owned(),
        };
        let owner = owner.clone();
        // Sending is a message to the owner's actor; the listener runs inside the registry.
        tokio::spawn(async move {
            let (target, wake) = match delivery {
                // An idle owner gets a turn of its own; a busy one reads the notice at its next
                // step, and a steer also wakes it if that turn ends first, so it is never
                // stranded.
                CompletionDelivery::Wakeup => {
                    let idle = matches!(owner.status().await,
                        Ok(snapshot) if snapshot.status == AgentStatus::Idle);
                    if idle {
                        (InboxTarget::NextTurn, Wake::Wake)
                    } else {
                        (InboxTarget::NextStep, Wake::Wake)
                    }
                }
                CompletionDelivery::Quiet => (InboxTarget::NextStep, Wake::Quiet),
            };
            // The runtime's own notice: it reaches a continuable child's inbox too.
            let delivered = owner
                .deliver_for_runtime(Message::user(notice, source), target, wake)
                .await;
            if let Err(error) = delivered {
                // The owner is gone: its jobs ended with it.
                tracing::debug!(owner = %owner.id(), %error, "a job completion notice was not delivered");
            }
        });
    }));
    Ok(JobTools {
        tools,
        notices,
        controller: jobs.attach_controller(),
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

/// The calling agent's session: a job is reachable only by its owner.
fn owner_of(ctx: &ToolCtx, tool: &str) -> std::result::Result<SessionId, ToolError> {
    calling_agent(ctx, tool).map(|agent| agent.id())
}

fn invalid(message: String) -> ToolError {
    ToolError::new(ErrorCode::InvalidArgs.as_str(), message)
}

fn job_id(args: &Value) -> std::result::Result<String, ToolError> {
    let id = string_arg(args, "job_id")?;
    if id.is_empty() {
        return Err(invalid(
            "invalid job_id: expected a non-empty string, got \"\"".to_owned(),
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
                let owner = owner_of(&ctx, JOB_OUTPUT)?;
                let id = job_id(&args)?;
                let wait = match args.get("wait") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(wait)) => *wait,
                    Some(other) => return Err(invalid(format!("wait must be a boolean, not {other}"))),
                };
                if wait {
                    let cap = config.max_wait_timeout;
                    let timeout = match args.get("timeout_ms") {
                        None | Some(Value::Null) => config.wait_timeout,
                        Some(Value::Number(ms)) => match ms.as_f64() {
                            Some(ms) if ms.is_finite() && ms > 0.0 => {
                                // Clamped before converting: a huge value is just the cap.
                                let capped = ms.min(cap.as_secs_f64() * 1000.0);
                                Duration::from_secs_f64(capped / 1000.0)
                            }
                            _ => {
                                return Err(invalid(format!(
                                    "invalid wait timeout: expected a positive number of milliseconds, got {ms}"
                                )))
                            }
                        },
                        Some(other) => {
                            return Err(invalid(format!(
                                "invalid wait timeout: expected a positive number of milliseconds, got {other}"
                            )))
                        }
                    };
                    jobs.wait(&id, owner, timeout, &ctx.cancel).await?;
                }
                let (text, snapshot) = jobs.read(&id, owner)?;
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
            let listed = owner_of(&ctx, JOB_LIST).map(|owner| jobs.list(owner));
            async move {
                let listed = listed?;
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
                "reason": {"type": "string", "description": "Optional short reason, handed to the job's producer."}
            },
            "required": ["job_id"],
            "additionalProperties": false
        }),
        move |args, ctx| {
            let outcome = owner_of(&ctx, JOB_KILL).and_then(|owner| {
                let id = job_id(&args)?;
                let reason = match args.get("reason") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(reason)) => Some(reason.clone()),
                    Some(other) => return Err(invalid(format!("reason must be a string, not {other}"))),
                };
                let killed = jobs.kill(&id, owner, reason)?;
                let snapshot = jobs.get(&id, owner)?;
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
