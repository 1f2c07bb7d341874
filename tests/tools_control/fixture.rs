//! The `tools_control` tests' fixture: the runtime, scripted routes and readers they share.

use super::*;

/// The shared two-route fixture with the control tools installed.
pub(super) struct Setup(Routed);

impl std::ops::Deref for Setup {
    type Target = Routed;

    fn deref(&self) -> &Routed {
        &self.0
    }
}

impl Setup {
    pub(super) async fn new() -> Self {
        Self::on(Arc::new(MemoryStore::new())).await
    }

    pub(super) async fn on(store: Arc<dyn SessionPersistence>) -> Self {
        let routed = Routed::on(store).await;
        install_control_tools(&routed.rt).unwrap().keep();
        Self(routed)
    }

    /// Scripts the parent's model with `steps` and a closing text, runs one prompt, and returns
    /// the tool results that prompt produced, in model order.
    pub(super) async fn run_parent(
        &self,
        steps: impl IntoIterator<Item = ScriptStep>,
    ) -> Vec<(bool, String)> {
        let from = self.parent().log().len();
        self.parent_model.push_all(steps);
        self.parent_model.push(ScriptStep::text("done"));
        run_prompt(self.parent(), "use your tools").await;
        tool_results(&self.parent().log().events_from(from))
    }
}

pub(super) fn send(call: &str, child: SessionId, message: &str) -> ScriptStep {
    let args = json!({"subagent_id": child.to_string(), "message": message});
    ScriptStep::tool_call(call, SEND_MESSAGE, args)
}

pub(super) fn interrupt(call: &str, target: SessionId) -> ScriptStep {
    ScriptStep::tool_call(
        call,
        INTERRUPT_AGENT,
        json!({"agent_id": target.to_string()}),
    )
}

pub(super) fn list(call: &str, args: Value) -> ScriptStep {
    ScriptStep::tool_call(call, LIST_AGENTS, args)
}

pub(super) fn queued_line(child: SessionId) -> String {
    format!("message queued as the next turn for subagent {child}")
}

pub(super) fn interrupted_line(target: SessionId) -> String {
    format!("interrupt requested for agent {target}")
}

/// Runs one call of the global tool `name` as the session `caller`: as that exact agent while
/// it is live, as a bare session id (no calling agent) once it is gone.
pub(super) async fn call_direct(
    rt: &Runtime,
    caller: SessionId,
    name: &str,
    args: Value,
) -> ToolExecutionResult {
    let cancel = CancellationToken::new();
    let ctx = match rt.agents().get(caller).await {
        Some(agent) => ToolCtx::for_agent(&agent, CallId::new("direct"), name.to_owned(), cancel),
        None => ToolCtx::new(caller, CallId::new("direct"), name.to_owned(), cancel),
    };
    execute(&ToolLayer::default(), rt.tools(), ctx, &args.to_string()).await
}

pub(super) fn result_text(result: &ToolExecutionResult) -> String {
    result
        .content
        .iter()
        .filter_map(ContentBlock::as_text)
        .collect()
}

/// The names of the global tools, as an agent without restrictions sees them.
pub(super) fn global_names(rt: &Runtime) -> Vec<String> {
    let visible = ToolLayer::default().visible(rt.tools());
    visible.iter().map(|tool| tool.name().to_owned()).collect()
}

pub(super) fn global_schema(rt: &Runtime, name: &str) -> subagents::model::ToolSchema {
    let tool = ToolLayer::default().get(rt.tools(), name);
    tool.unwrap_or_else(|| panic!("{name} is registered"))
        .schema()
        .clone()
}

/// The last prompt-bearing user message (a resumed child's runtime context is not one).
pub(super) fn last_user_message(events: &[SessionEvent]) -> Message {
    let mut messages = events.iter().rev().filter_map(|event| match &event.kind {
        EventKind::UserMessage(message)
            if !matches!(message.source, MessageSource::Plugin { .. }) =>
        {
            Some(message.clone())
        }
        _ => None,
    });
    messages.next().expect("a user message")
}

/// The header of a stored delegated child of `parent`.
pub(super) fn delegated(parent: SessionId, created_at: u64) -> SessionHeader {
    SessionHeader {
        created_at,
        parent_session: Some(parent),
        origin: Some(SessionOrigin::Subagent),
        delegation_depth: Some(1),
        ..SessionHeader::new(SessionId::new())
    }
}

pub(super) fn continuable(label: &str) -> Value {
    SubagentDescriptor::continuable("spawn", label).to_json()
}

pub(super) fn one_shot(label: &str) -> Value {
    SubagentDescriptor::one_shot("spawn", Some(label.to_owned())).to_json()
}

/// A settled child log: one completed turn holding one descriptor payload.
pub(super) fn settled_log(descriptor: Value) -> Vec<EventKind> {
    vec![
        EventKind::TurnStart { turn: 1 },
        EventKind::Extension {
            event_type: "subagent/descriptor".into(),
            data: descriptor,
        },
        EventKind::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Completed,
            traceparent: None,
        },
    ]
}
