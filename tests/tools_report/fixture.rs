//! The `tools_report` tests' fixture: the runtime, scripted routes and readers they share.

use super::*;

pub(super) const CHILD_ROUTE: &str = "child";
pub(super) const ACCEPTED: &str = "report accepted by the agent that started you as message ";
pub(super) const GUIDANCE: &str = "Deliver your result with the report tool before you finish";

/// A seam runtime, a root parent answering from `parent_model`, its continuable children
/// answering from `child_model`, and a recorder of the lifecycle events scoped to the parent.
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

    pub(super) async fn start_child(&self, label: &str, prompt: &str) -> SessionId {
        start(&self.rt, child_spec(self.parent(), label, prompt)).await
    }

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

/// A continuable `spawn` start under `parent` on the child route (a grandchild inherits it).
pub(super) fn child_spec(parent: &AgentRef, label: &str, prompt: &str) -> ContinuableStartSpec {
    let options = ChildAgentOptions {
        provider: Some(CHILD_ROUTE.into()),
        model: None,
        max_tokens: None,
    };
    ContinuableStartSpec::new("spawn", label, parent, text(prompt)).agent_options(options)
}

pub(super) async fn start(rt: &Runtime, spec: ContinuableStartSpec) -> SessionId {
    let started = rt.subagents().start_continuable(spec).await;
    started.expect("the continuable start is accepted").child_id
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
