//! Provides the global control tools over continuable children: `send_message` (a follow-up
//! that becomes the child's next turn), `interrupt_agent` (stops a descendant's current turn,
//! its queue kept) and `list_agents` (the caller's continuable children or descendants, with a
//! running / idle / ready status). They are registered once, whatever delegation tools exist,
//! with [`install_control_tools`].

use serde_json::{json, Value};

use crate::content::{ContentBlock, MessageSource};
use crate::error::{ErrorCode, Result};
use crate::host::AgentStatus;
use crate::ids::SessionId;
use crate::projection::SubagentListEntry;
use crate::runtime::Runtime;
use crate::seam::DelegationMode;
use crate::seam::{FollowupOptions, InterruptAuthority};
use crate::tools::plugin::{calling_agent, string_arg, GlobalTools};
use crate::tools::subagent::Services;
use crate::tools::{Concurrency, Tool, ToolCtx, ToolError, ToolOutput};

/// The `send_message` tool's name.
pub const SEND_MESSAGE: &str = "send_message";
/// The `interrupt_agent` tool's name.
pub const INTERRUPT_AGENT: &str = "interrupt_agent";
/// The `list_agents` tool's name.
pub const LIST_AGENTS: &str = "list_agents";

const SEND_MESSAGE_DESCRIPTION: &str = "Send a message to a background subagent you started. \
The message becomes the subagent's next turn: if it is busy, the message waits until its current \
turn ends and cannot redirect work already underway. No answer comes back from this call, only \
a delivery confirmation; you are told when the subagent settles. A failure means the message \
was NOT delivered.";

const INTERRUPT_AGENT_DESCRIPTION: &str = "Interrupt an agent below you: only its current turn \
stops. Messages queued for it stay parked until a later send_message; agents it started keep \
running; the target stays available for send_message. The call returns once the request is \
accepted; interrupting an agent that already finished is an accepted no-op. The target may be \
a direct child or a deeper descendant.";

const LIST_AGENTS_DESCRIPTION: &str = "List the background subagents you started, to recall \
their ids and status — not to poll: you are told when one finishes. Status: running (working \
now), idle (loaded between turns, possibly waiting on agents it started), ready (in storage \
only: resumable, not terminal, and not a result to collect). A direct child is a send_message \
candidate in every status. The list is a snapshot, not a delivery promise; a child whose record \
cannot be read appears as a diagnostic. With scope `descendants` the whole tree is listed in \
pre-order with each entry's parent and depth: only depth-1 entries may receive send_message, \
deeper ones are interrupt_agent candidates only.";

/// The installed control tools. Dropping it, or [`ControlTools::remove`], unregisters all
/// three; [`ControlTools::keep`] keeps them for the runtime's whole life.
#[must_use = "dropping the installation removes the tools"]
pub struct ControlTools {
    tools: GlobalTools,
}

impl std::fmt::Debug for ControlTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlTools").finish_non_exhaustive()
    }
}

impl ControlTools {
    /// Unregisters the three tools.
    pub fn remove(self) {
        drop(self);
    }

    /// Keeps the tools for the runtime's whole life.
    pub fn keep(self) {
        self.tools.keep();
    }
}

/// Registers `send_message`, `interrupt_agent` and `list_agents` on `rt`'s global registry.
///
/// # Errors
/// `DUPLICATE_TOOL` when one of the names is taken; nothing stays registered then.
pub fn install_control_tools(rt: &Runtime) -> Result<ControlTools> {
    let services = Services::of(rt);
    let tools = GlobalTools::register(
        rt.tools(),
        [
            send_message(services.clone()),
            interrupt_agent(services.clone()),
            list_agents(services),
        ],
    )?;
    Ok(ControlTools { tools })
}

/// A tool whose body runs `work` with the shared services.
fn control_tool<F, Fut>(
    name: &str,
    description: &str,
    parameters: Value,
    services: Services,
    work: F,
) -> Tool
where
    F: Fn(Services, Value, ToolCtx) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = std::result::Result<ToolOutput, ToolError>> + Send + 'static,
{
    Tool::new(name, description, parameters, move |args, ctx| {
        work(services.clone(), args, ctx)
    })
    .concurrency(Concurrency::Safe)
}

/// The session id argument `name`; a malformed one is refused as the model's mistake.
fn session_arg(args: &Value, name: &str) -> std::result::Result<SessionId, ToolError> {
    let raw = string_arg(args, name)?;
    raw.parse().map_err(|_| {
        ToolError::new(
            ErrorCode::InvalidArgs.as_str(),
            format!("`{name}` {raw:?} is unavailable: it is not an agent id"),
        )
    })
}

fn send_message(services: Services) -> Tool {
    control_tool(
        SEND_MESSAGE,
        SEND_MESSAGE_DESCRIPTION,
        json!({
            "type": "object",
            "properties": {
                "subagent_id": {
                    "type": "string",
                    "description": "The subagent id returned when the background subagent was started."
                },
                "message": {"type": "string", "description": "The message: the subagent's next turn."}
            },
            "required": ["subagent_id", "message"],
            "additionalProperties": false
        }),
        services,
        |services, args, ctx| async move {
            let child = session_arg(&args, "subagent_id")?;
            let message = string_arg(&args, "message")?;
            let parent = calling_agent(&ctx, SEND_MESSAGE)?;
            let mut options = FollowupOptions::new(MessageSource::CoordinatorRelay {
                sender_session_id: parent.id(),
            });
            options.cancel = ctx.cancel.clone();
            let message_id = services
                .subagents
                .followup(&parent, child, vec![ContentBlock::text(message)], options)
                .await?;
            Ok(ToolOutput {
                value: Some(json!({"messageId": message_id})),
                ..ToolOutput::text(format!(
                    "message queued as the next turn for subagent {child}"
                ))
            })
        },
    )
}

fn interrupt_agent(services: Services) -> Tool {
    control_tool(
        INTERRUPT_AGENT,
        INTERRUPT_AGENT_DESCRIPTION,
        json!({
            "type": "object",
            "properties": {
                "agent_id": {"type": "string", "description": "The id of the agent to interrupt."}
            },
            "required": ["agent_id"],
            "additionalProperties": false
        }),
        services,
        |services, args, ctx| async move {
            let target = session_arg(&args, "agent_id")?;
            let caller = calling_agent(&ctx, INTERRUPT_AGENT)?;
            services
                .subagents
                .interrupt(target, InterruptAuthority::Ancestor(caller))
                .await?;
            Ok(ToolOutput {
                value: Some(json!({"accepted": true})),
                ..ToolOutput::text(format!("interrupt requested for agent {target}"))
            })
        },
    )
}

/// Which part of the tree `list_agents` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Children,
    Descendants,
}

fn list_agents(services: Services) -> Tool {
    control_tool(
        LIST_AGENTS,
        LIST_AGENTS_DESCRIPTION,
        json!({
            "type": "object",
            "properties": {
                "scope": {
                    "type": "string",
                    "enum": ["children", "descendants"],
                    "description": "children (the default): your direct subagents; descendants: the whole tree below you."
                }
            },
            "additionalProperties": false
        }),
        services,
        |services, args, ctx| async move {
            let scope = match args.get("scope") {
                None | Some(Value::Null) => Scope::Children,
                Some(Value::String(scope)) if scope == "children" => Scope::Children,
                Some(Value::String(scope)) if scope == "descendants" => Scope::Descendants,
                Some(other) => {
                    return Err(ToolError::new(
                        ErrorCode::InvalidArgs.as_str(),
                        format!("scope must be `children` or `descendants`, not {other}"),
                    ))
                }
            };
            let caller = calling_agent(&ctx, LIST_AGENTS)?;
            let rows: Vec<(SubagentListEntry, Option<(SessionId, u64)>)> = match scope {
                Scope::Children => services
                    .subagents
                    .list_children(caller.id(), ctx.cancel.clone())
                    .await?
                    .into_iter()
                    .map(|entry| (entry, None))
                    .collect(),
                Scope::Descendants => services
                    .subagents
                    .list_descendants(caller.id(), ctx.cancel.clone())
                    .await?
                    .into_iter()
                    .map(|row| (row.entry, Some((row.parent_id, row.depth))))
                    .collect(),
            };
            let mut entries = Vec::new();
            for (entry, position) in rows {
                if let Some(line) = listed(&services, entry, position).await {
                    entries.push(line);
                }
            }
            let text = if entries.is_empty() {
                "(no subagents)".to_owned()
            } else {
                entries
                    .iter()
                    .map(|entry| entry.line.clone())
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            Ok(ToolOutput {
                value: Some(Value::Array(
                    entries.into_iter().map(|entry| entry.value).collect(),
                )),
                ..ToolOutput::text(text)
            })
        },
    )
}

/// One rendered `list_agents` entry.
struct Listed {
    line: String,
    value: Value,
}

/// The entry for a listing row: continuable children and diagnostics are kept, one-shot
/// children dropped (their continuable descendants are rows of their own).
async fn listed(
    services: &Services,
    entry: SubagentListEntry,
    position: Option<(SessionId, u64)>,
) -> Option<Listed> {
    let place = position
        .map(|(parent, depth)| format!(" parent={parent} depth={depth}"))
        .unwrap_or_default();
    let (line, mut value) = match entry {
        SubagentListEntry::Child {
            id, mode, label, ..
        } => {
            if mode != DelegationMode::Continuable {
                return None;
            }
            let status = match services.agents.get(id).await {
                None => "ready",
                Some(agent) => match agent.status().await {
                    Ok(snapshot) if snapshot.status == AgentStatus::Running => "running",
                    Ok(_) => "idle",
                    // Gone between the lookup and the status: it is in storage now.
                    Err(_) => "ready",
                },
            };
            // A continuable child always has a label; this is only a guard.
            let label = label.unwrap_or_else(|| "(no label)".to_owned());
            (
                format!("{id} [{status}]{place} — {label}"),
                json!({"kind": "child", "id": id, "label": label, "status": status}),
            )
        }
        SubagentListEntry::Diagnostic { id, reason } => {
            let reason = reason.as_str();
            (
                format!("{id} [diagnostic: {reason}]{place}"),
                json!({"kind": "diagnostic", "id": id, "reason": reason}),
            )
        }
    };
    if let Some((parent, depth)) = position {
        value["parent"] = json!(parent);
        value["depth"] = json!(depth);
    }
    Some(Listed { line, value })
}
