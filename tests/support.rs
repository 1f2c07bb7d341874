//! Fixtures shared by every test area: runtimes over a fresh store, content helpers, and a
//! safety-net timeout whose message names what was awaited.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use subagents::{
    AgentEvent, AgentEventKind, ContentBlock, EventKind, EventScope, MemoryStore, Runtime,
    ScriptedModel, SessionEvent, SessionId, Subscription,
};

/// Awaits `future`, failing the test if it takes longer than 20 s. Ordering never depends on
/// this timeout: it only turns a hang into a failure that names what hung.
pub async fn within<F: Future>(what: &str, future: F) -> F::Output {
    match tokio::time::timeout(Duration::from_secs(20), future).await {
        Ok(output) => output,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// A runtime over a fresh in-memory store with `model` as its only model.
pub fn memory_runtime(model: &ScriptedModel) -> Runtime {
    Runtime::builder()
        .store(MemoryStore::new())
        .model("scripted", model.clone())
        .build()
        .expect("runtime builds inside the actix system")
}

/// One text block.
pub fn text(value: &str) -> Vec<ContentBlock> {
    vec![ContentBlock::text(value)]
}

/// The event types of a log, in order.
pub fn types(events: &[SessionEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| e.kind.type_name().to_owned())
        .collect()
}

/// The `turn/end` reasons of a log, in order.
pub fn turn_ends(events: &[SessionEvent]) -> Vec<subagents::TurnEndReason> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TurnEnd { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

/// The texts of the `user/message` events of a log, in order.
pub fn user_texts(events: &[SessionEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::UserMessage(message) => Some(message.text()),
            _ => None,
        })
        .collect()
}

/// Records the agent events of one agent.
pub struct EventRecorder {
    pub seen: Arc<Mutex<Vec<AgentEventKind>>>,
    _subscription: Subscription,
}

impl EventRecorder {
    pub fn new(rt: &Runtime, agent: SessionId) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let subscription =
            rt.events()
                .subscribe(EventScope::Key(agent), move |event: &AgentEvent| {
                    sink.lock().unwrap().push(event.kind.clone());
                });
        Self {
            seen,
            _subscription: subscription,
        }
    }

    pub fn kinds(&self) -> Vec<AgentEventKind> {
        self.seen.lock().unwrap().clone()
    }
}

/// Sends `prompt` as a follow-up, waits until the agent is idle, and returns its whole log.
pub async fn run_prompt(agent: &subagents::AgentRef, prompt: &str) -> Vec<SessionEvent> {
    agent
        .followup(text(prompt), subagents::MessageSource::User)
        .await
        .expect("the follow-up is accepted");
    within("the agent to go idle", agent.when_idle()).await;
    agent.log().events()
}

/// The error codes of the failed tool results of a log, in order.
pub fn tool_error_codes(events: &[SessionEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { error, .. } => error.as_ref().map(|e| e.code.clone()),
            _ => None,
        })
        .collect()
}

/// Creates an agent whose setup runs `configure` on its fresh scope.
pub async fn agent_with(
    rt: &Runtime,
    configure: impl FnOnce(&mut subagents::AgentScope) + Send + Sync + 'static,
) -> subagents::AgentHandle {
    rt.agents()
        .create(subagents::CreateAgent::new().setup(
            move |scope: &mut subagents::AgentScope, _: &subagents::SessionLog| {
                configure(scope);
                Ok(None)
            },
        ))
        .await
        .expect("the agent is created")
}
