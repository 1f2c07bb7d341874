//! Provides the `report` tool: a continuable child's way to tell its direct parent something
//! before (or instead of waiting for) its settlement. It is not a global tool: it is granted
//! to each continuable in-process child through a continuable setup contribution
//! ([`install_report_tool`]), together with its guidance section `tool:report`, so roots,
//! one-shot children and siblings never see it, and a child's own tool filter does not remove
//! it. Removing the installation revokes the tool and its section from resident children at
//! once; a grant made later reaches a child at its next Activation.

use std::str::FromStr;

use serde_json::json;

use crate::content::ContentBlock;
use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::{AgentScope, PromptSection};
use crate::runtime::Runtime;
use crate::seam::{ReportDelivery, ReportOptions, SetupDisposer, SetupRegistration};
use crate::tools::plugin::{calling_agent, string_arg};
use crate::tools::subagent::Services;
use crate::tools::{Concurrency, Tool, ToolOutput};

/// The `report` tool's name.
pub const REPORT: &str = "report";
/// The name of the prompt section granted with the tool.
pub const REPORT_SECTION: &str = "tool:report";
const REPORT_SECTION_ORDER: f64 = 117.0;

const REPORT_DESCRIPTION: &str = "Report to the agent that started you. Report once before you \
finish, with a self-contained result, and earlier for findings that change what your parent \
does next. Your parent shares your workspace but does not see your transcript, tool output or \
reasoning, so say what matters and reference relevant shared paths. Reporting does not end \
your turn, and only your direct parent receives it. A failed call may still have arrived, so \
do not blindly repeat it.";

const REPORT_GUIDANCE: &str = "You were started by another agent, which waits for what you \
find. Deliver your result with the report tool before you finish; report earlier when a \
finding changes what your parent should do next. Your parent does not see your transcript, \
and reporting never ends your turn.";

impl FromStr for ReportDelivery {
    type Err = SubagentError;

    /// `quiet` or `wakeup`; anything else (including the later reference's `next-step`) is
    /// refused with a message naming the value.
    fn from_str(value: &str) -> Result<Self> {
        match value {
            "quiet" => Ok(Self::Quiet),
            "wakeup" => Ok(Self::Wakeup),
            other => Err(SubagentError::new(
                ErrorCode::InvalidArgs,
                format!("tool-subagent-report: reportDelivery must be `quiet` or `wakeup`, not `{other}`"),
            )),
        }
    }
}

/// Grants every later continuable child of `rt` its own `report` tool and `tool:report`
/// section, delivering reports as `delivery` (a deployment policy: a call cannot choose).
/// The returned registration revokes the grant from resident children when removed.
pub fn install_report_tool(rt: &Runtime, delivery: ReportDelivery) -> SetupRegistration {
    let services = Services::of(rt);
    rt.subagents()
        .register_continuable_setup(std::sync::Arc::new(
            move |scope: &mut AgentScope| -> Result<SetupDisposer> {
                // The section goes with the tool: revoking one revokes both at once.
                let (tool, revocation) = report_tool(services.clone(), delivery)
                    .with_guidance(PromptSection::new(
                        REPORT_SECTION,
                        REPORT_SECTION_ORDER,
                        REPORT_GUIDANCE,
                    ))
                    .revocable();
                scope.register_tool(tool)?;
                Ok(Box::new(move || {
                    revocation.revoke();
                    Ok(())
                }))
            },
        ))
}

fn report_tool(services: Services, delivery: ReportDelivery) -> Tool {
    Tool::new(
        REPORT,
        REPORT_DESCRIPTION,
        json!({
            "type": "object",
            "properties": {
                "output": {
                    "type": "string",
                    "description": "Actionable content for your parent; summarize conclusions and reference relevant shared paths."
                }
            },
            "required": ["output"],
            "additionalProperties": false
        }),
        move |args, ctx| {
            let services = services.clone();
            async move {
                let output = string_arg(&args, "output")?;
                let child = calling_agent(&ctx, REPORT)?;
                let mut options = ReportOptions::new(delivery);
                options.cancel = ctx.cancel.clone();
                let message_id = services
                    .subagents
                    .report_from(&child, vec![ContentBlock::text(output)], options)
                    .await?;
                Ok(ToolOutput {
                    value: Some(json!({"messageId": message_id})),
                    ..ToolOutput::text(format!(
                        "report accepted by the agent that started you as message {message_id}"
                    ))
                })
            }
        },
    )
    .concurrency(Concurrency::Safe)
}
