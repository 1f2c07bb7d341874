//! The `tools_control` tests' fixture: the runtime, scripted routes and readers they share.

use super::*;

/// The model route continuable children are started on.
pub(super) const CHILD_ROUTE: &str = "child";

/// A seam runtime with the control tools installed, a root parent answering from
/// `parent_model`, its children answering from `child_model`, and a recorder of the lifecycle
/// events scoped to the parent.
pub(super) struct Setup {
    pub(super) rt: Runtime,
    pub(super) parent: AgentHandle,
    pub(super) recorder: SeamRecorder,
    pub(super) parent_model: ScriptedModel,
    pub(super) child_model: ScriptedModel,
}

impl Setup {
    pub(super) async fn new() -> Self {
        Self::on(Arc::new(MemoryStore::new())).await
    }

    pub(super) async fn on(store: Arc<dyn SessionPersistence>) -> Self {
        let parent_model = ScriptedModel::repeating(ScriptStep::text("noted"));
        let child_model = ScriptedModel::repeating(ScriptStep::text("child ok"));
        let builder = Runtime::builder()
            .model("scripted", parent_model.clone())
            .model(CHILD_ROUTE, child_model.clone());
        let rt = seam_runtime_on(builder, store).await;
        install_control_tools(&rt).unwrap().keep();
        let parent = root(&rt).await;
        let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
        Self {
            rt,
            parent,
            recorder,
            parent_model,
            child_model,
        }
    }

    pub(super) fn parent(&self) -> &AgentRef {
        self.parent.agent()
    }

    /// Starts a continuable `spawn` child of the parent on the child route.
    pub(super) async fn start_child(&self, label: &str, prompt: &str) -> SessionId {
        start_under(&self.rt, self.parent(), label, prompt).await
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

/// Starts a continuable `spawn` child of `parent` on the child route (a grandchild inherits it).
pub(super) async fn start_under(
    rt: &Runtime,
    parent: &AgentRef,
    label: &str,
    prompt: &str,
) -> SessionId {
    let options = ChildAgentOptions {
        provider: Some(CHILD_ROUTE.into()),
        model: None,
        max_tokens: None,
    };
    let spec =
        ContinuableStartSpec::new("spawn", label, parent, text(prompt)).agent_options(options);
    let started = rt.subagents().start_continuable(spec).await;
    started.expect("the continuable start is accepted").child_id
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
        },
    ]
}

/// Stores a session directly, as an earlier process would have left it.
pub(super) async fn author(
    store: &dyn SessionPersistence,
    header: SessionHeader,
    kinds: Vec<EventKind>,
) -> SessionId {
    let id = header.id;
    let events = kinds
        .into_iter()
        .zip(0u64..)
        .map(|(kind, seq)| Arc::new(SessionEvent::new(seq, kind)))
        .collect();
    store
        .create(header, events)
        .await
        .expect("the session is stored");
    id
}
