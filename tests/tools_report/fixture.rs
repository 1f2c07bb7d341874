//! The `tools_report` tests' fixture: the runtime, scripted routes and readers they share.

use super::*;

pub(super) const ACCEPTED: &str = "report accepted by the agent that started you as message ";
pub(super) const GUIDANCE: &str = "Deliver your result with the report tool before you finish";

/// The shared two-route fixture (the report tool is installed per test).
pub(super) use crate::support::Routed as Setup;

impl Routed {
    /// Holds the parent inside a turn; the returned gate lets it finish.
    pub(super) async fn hold_parent(&self) -> Gate {
        let gate = Gate::new();
        self.parent_model
            .push(ScriptStep::text("busy").gated(&gate));
        self.parent()
            .followup(text("work"), MessageSource::User)
            .await
            .unwrap();
        gate.reached().await;
        gate
    }
}

pub(super) fn report_call(call: &str, output: &str) -> ScriptStep {
    ScriptStep::tool_call(call, REPORT, json!({"output": output}))
}

/// What the parent receives for a report of `output` by `child`.
pub(super) fn report_content(child: SessionId, output: &str) -> Vec<ContentBlock> {
    vec![
        ContentBlock::text(format!("Background subagent {child} reported:")),
        ContentBlock::text(output),
    ]
}

pub(super) fn report_output(report: &Message) -> String {
    report
        .content
        .get(1)
        .and_then(ContentBlock::as_text)
        .unwrap_or_default()
        .to_owned()
}

pub(super) fn user_messages(
    events: &[SessionEvent],
    keep: impl Fn(&MessageSource) -> bool,
) -> Vec<Message> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::UserMessage(message) if keep(&message.source) => Some(message.clone()),
            _ => None,
        })
        .collect()
}

pub(super) fn reports_in(events: &[SessionEvent]) -> Vec<Message> {
    user_messages(events, |source| {
        matches!(source, MessageSource::SubagentReportRelay { .. })
    })
}

pub(super) fn notices_in(events: &[SessionEvent]) -> Vec<Message> {
    user_messages(events, |source| {
        matches!(source, MessageSource::SubagentSettledNotice { .. })
    })
}

/// The turn in which the message `id` entered the log.
pub(super) fn turn_of(events: &[SessionEvent], id: MessageId) -> Option<u64> {
    let mut current = None;
    for event in events {
        match &event.kind {
            EventKind::TurnStart { turn, .. } => current = Some(*turn),
            EventKind::UserMessage(message) if message.id == id => return current,
            _ => {}
        }
    }
    None
}

pub(super) fn position_of(events: &[SessionEvent], id: MessageId) -> usize {
    events
        .iter()
        .position(|event| matches!(&event.kind, EventKind::UserMessage(m) if m.id == id))
        .expect("the message is in the log")
}

pub(super) fn requests_of(model: &ScriptedModel, session: SessionId) -> Vec<GenerateRequest> {
    let requests = model.requests().into_iter();
    requests
        .filter(|request| request.session_id == Some(session))
        .collect()
}

pub(super) fn tool_names(request: &GenerateRequest) -> Vec<String> {
    request.tools.iter().map(|tool| tool.name.clone()).collect()
}

pub(super) fn offers_report(request: &GenerateRequest) -> bool {
    request.tools.iter().any(|tool| tool.name == REPORT)
}

pub(super) fn has_guidance(request: &GenerateRequest) -> bool {
    request
        .system
        .as_deref()
        .is_some_and(|system| system.contains(GUIDANCE))
}

/// Polls `agent`'s status until `done` holds; that status.
pub(super) async fn status_until(
    agent: &AgentRef,
    what: &str,
    done: impl Fn(&AgentSnapshot) -> bool,
) -> AgentSnapshot {
    within(what, async {
        loop {
            let status = agent.status().await.expect("the agent is live");
            if done(&status) {
                return status;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}
