//! Provides the narrated tour that `subagents demo` runs: a parent agent whose model uses the
//! model-facing tools end to end — it delegates to a `spawn` child and a `fork` child in
//! parallel, starts a continuable child, sends it a follow-up, receives its report and its
//! settled notice, and lists its agents.
//!
//! [`TourModel`] answers from the request alone (the last prompt and how many tool results
//! followed it), so the parent and its children may call it in any order and every run makes
//! the same calls. [`run_tour`] drives it on a runtime and returns the transcript: one line per
//! prompt, tool call and tool result of the parent, in log order.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use futures::stream::{self, BoxStream, StreamExt};
use serde_json::json;

use crate::content::{text_of, ContentBlock, Message, MessageSource, Role};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::events::EventScope;
use crate::host::AgentEvent;
use crate::ids::SessionId;
use crate::model::scripted::{text_chunks, tool_call_chunks};
use crate::model::{FinishReason, GenerateRequest, LlmAdapter, StreamChunk};
use crate::runtime::Runtime;
use crate::seam::ReportDelivery;
use crate::session::{EventKind, EventList, LlmFailure, SessionEvent};
use crate::tools::{
    install_control_tools, install_report_tool, install_subagent_tool, BackgroundMode,
    SubagentToolConfig,
};
use crate::CreateAgent;

/// The parent's opening prompt.
pub const TOUR_PROMPT: &str = "Prepare the v0.2 release.";
const SURVEY: &str = "Survey the changelog since v0.1.";
const ANNOUNCE: &str = "Draft the release announcement.";
const WATCH: &str = "Watch CI on main and report what you see.";
const FLAKY: &str = "Also re-run the flaky test three times.";
const FLAKY_ANSWER: &str = "The flaky test passed three times in a row.";
/// The parent's closing line, once its agents are listed.
pub const TOUR_DONE: &str =
    "Release prepared: changelog surveyed, announcement drafted, CI watched.";

/// The tour's model: a pure function of the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct TourModel;

/// What the model answers.
enum Answer {
    Text(String),
    Calls(Vec<(String, &'static str, serde_json::Value)>),
}

/// The answer to `request`: read from its last prompt (the last user message that is not a
/// tool result) and the tool results that followed it.
fn answer(request: &GenerateRequest) -> Answer {
    let messages: Vec<&Message> = request.messages.messages().collect();
    // Tool results and plugin context (the runtime context a child carries) are not prompts.
    let prompt_at = messages.iter().rposition(|message| {
        message.role == Role::User
            && !matches!(
                message.source,
                MessageSource::Tool { .. } | MessageSource::Plugin { .. }
            )
    });
    let Some(prompt_at) = prompt_at else {
        return Answer::Text("Nothing to do.".to_owned());
    };
    let prompt = messages[prompt_at];
    let results: Vec<String> = messages[prompt_at + 1..]
        .iter()
        .filter(|message| matches!(message.source, MessageSource::Tool { .. }))
        .map(|message| {
            message
                .content
                .iter()
                .filter_map(|block| match block {
                    ContentBlock::ToolResult { content, .. } => Some(text_of(content)),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let text = prompt.text();
    let call = |id: &str, tool: &'static str, arguments: serde_json::Value| {
        Answer::Calls(vec![(id.to_owned(), tool, arguments)])
    };
    match &prompt.source {
        MessageSource::SubagentReportRelay { .. } => {
            return Answer::Text("Noted the watcher's report.".to_owned())
        }
        MessageSource::SubagentSettledNotice { .. } => {
            if !text.contains(FLAKY_ANSWER) {
                return Answer::Text("Noted; the watcher has more to do.".to_owned());
            }
            return if results.is_empty() {
                call("list-1", "list_agents", json!({}))
            } else {
                Answer::Text(TOUR_DONE.to_owned())
            };
        }
        _ => {}
    }
    if text.contains(SURVEY) {
        return Answer::Text("Three fixes and one feature since v0.1.".to_owned());
    }
    if text.contains(ANNOUNCE) {
        return Answer::Text("Announcing v0.2: children you can talk to again.".to_owned());
    }
    if text.contains(FLAKY) {
        return Answer::Text(FLAKY_ANSWER.to_owned());
    }
    if text.contains(WATCH) {
        return if results.is_empty() {
            call(
                "report-1",
                "report",
                json!({"output": "CI is green on main."}),
            )
        } else {
            Answer::Text("Watching CI: green so far.".to_owned())
        };
    }
    if text.contains(TOUR_PROMPT) {
        return match results.len() {
            0 => Answer::Calls(vec![
                (
                    "survey-1".to_owned(),
                    "subagent",
                    json!({"description": "survey the changelog", "prompt": SURVEY}),
                ),
                (
                    "announce-1".to_owned(),
                    "subagent_fork",
                    json!({"description": "draft the announcement", "prompt": ANNOUNCE}),
                ),
            ]),
            2 => call(
                "watch-1",
                "subagent_continuable",
                json!({"description": "watch CI", "prompt": WATCH}),
            ),
            3 => {
                let child = results[2]
                    .strip_prefix("started subagent ")
                    .unwrap_or_default()
                    .to_owned();
                call(
                    "followup-1",
                    "send_message",
                    json!({"subagent_id": child, "message": FLAKY}),
                )
            }
            _ => Answer::Text("The watcher is on it; I will hear when it settles.".to_owned()),
        };
    }
    Answer::Text("Done.".to_owned())
}

impl LlmAdapter for TourModel {
    fn stream(
        &self,
        request: GenerateRequest,
    ) -> BoxStream<'static, std::result::Result<StreamChunk, LlmFailure>> {
        let chunks = match answer(&request) {
            Answer::Text(text) => text_chunks(text, FinishReason::Stop),
            Answer::Calls(calls) => {
                let calls: Vec<(&str, &str, serde_json::Value)> = calls
                    .iter()
                    .map(|(id, tool, arguments)| (id.as_str(), *tool, arguments.clone()))
                    .collect();
                tool_call_chunks(&calls)
            }
        };
        stream::iter(chunks.into_iter().map(Ok)).boxed()
    }
}

/// Registers the tour's providers and tools on `rt`: `spawn` and `fork`, a `subagent` tool on
/// each (`subagent`, `subagent_fork`), a continuable `subagent_continuable` on `spawn`, the
/// control tools, and the `report` tool (wakeup delivery). The tour itself needs `rt` to route
/// model `tour` to a [`TourModel`]; any other model may use the same tools (`demo --prompt`).
///
/// # Errors
/// Registration errors (a name already taken).
pub async fn install_tour(rt: &Runtime) -> Result<()> {
    rt.subagents().register_in_process_providers().await?;
    install_subagent_tool(rt, SubagentToolConfig::new("spawn"))
        .await?
        .keep();
    let mut fork = SubagentToolConfig::new("fork");
    fork.tool_name = "subagent_fork".to_owned();
    install_subagent_tool(rt, fork).await?.keep();
    let mut continuable = SubagentToolConfig::new("spawn");
    continuable.tool_name = "subagent_continuable".to_owned();
    continuable.background_mode = BackgroundMode::Continuable;
    install_subagent_tool(rt, continuable).await?.keep();
    install_control_tools(rt)?.keep();
    install_report_tool(rt, ReportDelivery::Wakeup).keep();
    Ok(())
}

/// The tour transcript's lines for one event of the parent (none for most events).
fn describe(event: &SessionEvent) -> Vec<String> {
    match &event.kind {
        EventKind::UserMessage(message) => {
            let who = match &message.source {
                MessageSource::SubagentReportRelay { .. } => "report",
                MessageSource::SubagentSettledNotice { .. } => "notice",
                _ => "user",
            };
            let text: Vec<&str> = message
                .content
                .iter()
                .filter_map(ContentBlock::as_text)
                .collect();
            vec![format!("{who}: {}", text.join(" ").replace('\n', " "))]
        }
        EventKind::AssistantMessage { message, .. } => {
            let mut parts = Vec::new();
            for block in &message.content {
                match block {
                    ContentBlock::Text { text } if !text.is_empty() => {
                        parts.push(format!("parent: {text}"));
                    }
                    ContentBlock::ToolCall {
                        name, arguments, ..
                    } => parts.push(format!("call {name} {arguments}")),
                    _ => {}
                }
            }
            parts
        }
        EventKind::ToolResult { message, .. } => message
            .content
            .iter()
            .filter_map(|block| match block {
                ContentBlock::ToolResult {
                    content, is_error, ..
                } => {
                    let text = text_of(content);
                    let label = if *is_error { "error" } else { "result" };
                    Some(format!("{label}: {}", text.replace('\n', " | ")))
                }
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Runs the tour on `rt` (prepared by [`install_tour`]): creates the parent, sends it
/// [`TOUR_PROMPT`], waits until it has listed its agents and closed with [`TOUR_DONE`]
/// (at most `within`), and returns the parent's id and its transcript.
///
/// # Errors
/// `REPORTABLE_BUG` when the tour does not finish within `within`; agent errors as they are.
pub async fn run_tour(rt: &Runtime, within: Duration) -> Result<(SessionId, Vec<String>)> {
    let parent = rt.agents().create(CreateAgent::new()).await?;
    let agent = parent.agent().clone();
    // Every event of the parent (a notice arriving, a turn starting) is a reason to look again.
    let changed = Arc::new(Notify::new());
    let signal = Arc::clone(&changed);
    let _watch = rt
        .events()
        .subscribe(EventScope::Key(agent.id()), move |_: &AgentEvent| {
            signal.notify_one();
        });
    agent
        .followup(vec![ContentBlock::text(TOUR_PROMPT)], MessageSource::User)
        .await?;
    let closed = |events: &EventList| {
        events.iter().any(|event| {
            matches!(&event.kind, EventKind::AssistantMessage { message, .. }
                if message.text() == TOUR_DONE)
        })
    };
    let finished = async {
        loop {
            agent.when_idle().await;
            if agent.log().with_events(closed) {
                return;
            }
            changed.notified().await;
        }
    };
    let transcript = || -> Vec<String> {
        agent
            .log()
            .with_events(|events| events.iter().flat_map(|event| describe(event)).collect())
    };
    if tokio::time::timeout(within, finished).await.is_err() {
        return Err(SubagentError::new(
            ErrorCode::ReportableBug,
            format!(
                "the tour did not finish within {within:?}; the parent's transcript so far:\n{}",
                transcript().join("\n")
            ),
        ));
    }
    agent.log().flush().await?;
    Ok((agent.id(), transcript()))
}
