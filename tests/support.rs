//! Fixtures shared by every test area: runtimes over a fresh store, content helpers, and a
//! safety-net timeout whose message names what was awaited.

pub mod postgres;

use std::borrow::Borrow;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use subagents::testing::ScriptedModel;
use subagents::{
    AgentEvent, AgentEventKind, ContentBlock, EventKind, EventScope, MemoryStore, Runtime,
    SessionEvent, SessionId, Subscription,
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
pub fn types<E: Borrow<SessionEvent>>(events: &[E]) -> Vec<String> {
    events
        .iter()
        .map(|e| e.borrow().kind.type_name().to_owned())
        .collect()
}

/// The `turn/end` reasons of a log, in order.
pub fn turn_ends<E: Borrow<SessionEvent>>(events: &[E]) -> Vec<subagents::TurnEndReason> {
    events
        .iter()
        .filter_map(|e| match &e.borrow().kind {
            EventKind::TurnEnd { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

/// The texts of the `user/message` events of a log, in order.
pub fn user_texts<E: Borrow<SessionEvent>>(events: &[E]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.borrow().kind {
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

/// The `(is_error, text)` of every tool result in `events`, in order.
pub fn tool_results(events: &[SessionEvent]) -> Vec<(bool, String)> {
    let result = |block: &ContentBlock| -> Option<(bool, String)> {
        match block {
            ContentBlock::ToolResult {
                content, is_error, ..
            } => Some((
                *is_error,
                content.iter().filter_map(ContentBlock::as_text).collect(),
            )),
            _ => None,
        }
    };
    let results = events.iter().filter_map(|event| match &event.kind {
        EventKind::ToolResult { message, .. } => message.content.iter().find_map(result),
        _ => None,
    });
    results.collect()
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

/// A runtime over a fresh in-memory store, built from `builder`, with the in-process `spawn`
/// and `fork` providers registered for its whole life.
pub async fn seam_runtime_from(builder: subagents::RuntimeBuilder) -> Runtime {
    seam_runtime_on(builder, Arc::new(MemoryStore::new())).await
}

/// [`seam_runtime_from`] over `store`.
pub async fn seam_runtime_on(
    builder: subagents::RuntimeBuilder,
    store: Arc<dyn subagents::SessionPersistence>,
) -> Runtime {
    let rt = builder
        .shared_store(store)
        .build()
        .expect("runtime builds inside the actix system");
    rt.subagents()
        .register_in_process_providers()
        .await
        .expect("the in-process providers register");
    rt
}

/// [`seam_runtime_from`] with `model` as the only model.
pub async fn seam_runtime(model: &ScriptedModel) -> Runtime {
    seam_runtime_from(Runtime::builder().model("scripted", model.clone())).await
}

/// A root agent to delegate from.
pub async fn root(rt: &Runtime) -> subagents::AgentHandle {
    rt.agents()
        .create(subagents::CreateAgent::new())
        .await
        .expect("the root agent is created")
}

/// A runtime whose model answers "answer", on a memory store (returned too, to read back
/// without being counted) behind a fault injector (which counts the reads).
pub async fn injected_runtime() -> (
    Runtime,
    ScriptedModel,
    Arc<MemoryStore>,
    Arc<subagents::testing::FaultInjectingStore>,
) {
    let model = ScriptedModel::repeating(subagents::testing::ScriptStep::text("answer"));
    let inner = Arc::new(MemoryStore::new());
    let store = Arc::new(subagents::testing::FaultInjectingStore::new(
        Arc::clone(&inner) as Arc<dyn subagents::SessionPersistence>,
    ));
    let rt = seam_runtime_on(
        Runtime::builder().model("scripted", model.clone()),
        Arc::clone(&store) as Arc<dyn subagents::SessionPersistence>,
    )
    .await;
    (rt, model, inner, store)
}

/// Runs `turns` prompts through `agent`, its log written to the store before each (a turn's
/// end pages out only what the store has).
pub async fn converse(agent: &subagents::AgentHandle, turns: u32) {
    for turn in 1..=turns {
        agent.agent().log().drain().await.unwrap();
        run_prompt(agent.agent(), &format!("prompt {turn}")).await;
    }
}

/// The settled notices `events` insert into an inbox, each with the position its splice
/// names in its list, in log order.
pub fn notice_splices<E: Borrow<SessionEvent>>(events: &[E]) -> Vec<(u64, subagents::Message)> {
    let is_notice = |message: &&subagents::Message| {
        matches!(
            message.source,
            subagents::MessageSource::SubagentSettledNotice { .. }
        )
    };
    events
        .iter()
        .filter_map(|event| match &event.borrow().kind {
            EventKind::InboxSpliced {
                start, inserted, ..
            } => Some(
                inserted
                    .iter()
                    .filter(is_notice)
                    .map(move |message| (*start, message.clone())),
            ),
            _ => None,
        })
        .flatten()
        .collect()
}

/// How many settled notices `events`' inbox journal inserted (pending or since claimed).
pub fn notices_inserted<E: Borrow<SessionEvent>>(events: &[E]) -> usize {
    notice_splices(events).len()
}

/// Resumes the parent `id`, which was away when a child settled, and checks that the child's
/// settled notice waits in its inbox (the one message pending).
pub async fn resumed_with_the_notice_pending(
    rt: &Runtime,
    id: SessionId,
) -> subagents::AgentHandle {
    let back = rt
        .agents()
        .resume(subagents::ResumeAgent::new(id))
        .await
        .expect("the parent resumes");
    assert_eq!(
        back.agent().status().await.unwrap().next_turn,
        1,
        "the notice waits in the resumed parent's inbox"
    );
    back
}

/// Records the seam's lifecycle events of one scope, and lets a test wait for them.
pub struct SeamRecorder {
    pub seen: Arc<Mutex<Vec<subagents::SubagentEvent>>>,
    changed: tokio::sync::watch::Receiver<usize>,
    _subscription: Subscription,
}

impl SeamRecorder {
    pub fn new(rt: &Runtime, scope: EventScope<SessionId>) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let (tick, changed) = tokio::sync::watch::channel(0usize);
        let subscription =
            rt.subagents()
                .events()
                .subscribe(scope, move |event: &subagents::SubagentEvent| {
                    sink.lock().unwrap().push(event.clone());
                    tick.send_modify(|count| *count += 1);
                });
        Self {
            seen,
            changed,
            _subscription: subscription,
        }
    }

    /// Waits (with the safety-net timeout) until `done` holds for the recorded events.
    pub async fn wait_until(&self, what: &str, done: impl Fn(&[subagents::SubagentEvent]) -> bool) {
        let mut changed = self.changed.clone();
        within(what, changed.wait_for(|_| done(&self.seen.lock().unwrap())))
            .await
            .expect("the recorder lives as long as the test");
    }

    /// Waits until `count` events were recorded.
    pub async fn wait_for_count(&self, count: usize) {
        self.wait_until("lifecycle events", |events| events.len() >= count)
            .await;
    }

    pub fn events(&self) -> Vec<subagents::SubagentEvent> {
        self.seen.lock().unwrap().clone()
    }

    /// The names of the recorded events, in order.
    pub fn names(&self) -> Vec<&'static str> {
        use subagents::events::ScopedEvent;
        self.events().iter().map(|e| e.name()).collect()
    }
}

/// Starts a plain one-shot run of `prompt` on `provider` under `parent`.
pub async fn start_run(
    rt: &Runtime,
    provider: &str,
    parent: &subagents::AgentRef,
    prompt: &str,
) -> subagents::SubagentRun {
    rt.subagents()
        .start(
            provider,
            subagents::SubagentStartRequest::new(parent, text(prompt)),
        )
        .await
        .expect("the run starts")
}

/// Starts a continuable `spawn` child labelled "child task" under `parent`.
pub async fn start_continuable(
    rt: &Runtime,
    parent: &subagents::AgentRef,
    prompt: &str,
) -> subagents::ContinuableStart {
    rt.subagents()
        .start_continuable(subagents::ContinuableStartSpec::new(
            "spawn",
            "child task",
            parent,
            text(prompt),
        ))
        .await
        .expect("the continuable start is accepted")
}

/// Sends `prompt` to the continuable `child` of `parent`.
pub async fn followup_child(
    rt: &Runtime,
    parent: &subagents::AgentRef,
    child: SessionId,
    prompt: &str,
) -> subagents::Result<subagents::MessageId> {
    rt.subagents()
        .followup(
            parent,
            child,
            text(prompt),
            subagents::FollowupOptions::new(subagents::MessageSource::User),
        )
        .await
}

/// The `subagent/end` events recorded for `child`, in order.
pub fn ends_of(
    recorder: &SeamRecorder,
    child: SessionId,
) -> Vec<subagents::seam::SubagentRunEndInfo> {
    recorder
        .events()
        .into_iter()
        .filter_map(|event| match event {
            subagents::SubagentEvent::End(end) if end.info.id == child => Some(end),
            _ => None,
        })
        .collect()
}

/// Waits until `child` has settled `epochs` times.
pub async fn settled(recorder: &SeamRecorder, child: SessionId, epochs: usize) {
    recorder
        .wait_until("the child to settle", |events| {
            events
                .iter()
                .filter(|event| {
                    matches!(event, subagents::SubagentEvent::End(end) if end.info.id == child)
                })
                .count()
                >= epochs
        })
        .await;
}

/// The persisted log of `id`.
pub async fn persisted(rt: &Runtime, id: SessionId) -> Vec<SessionEvent> {
    rt.store()
        .expect("the runtime has a store")
        .read_from(id, 0)
        .await
        .expect("the session is persisted")
        .iter()
        .map(|event| (**event).clone())
        .collect()
}

/// Waits (with the safety-net timeout) until `holds` is true, letting the actors run between
/// checks. For conditions no event announces, such as a message reaching a parent's log.
pub async fn eventually(what: &str, holds: impl Fn() -> bool) {
    within(what, async {
        while !holds() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Waits until `agent` is idle having run at least `turns` turns.
pub async fn idle_after_turns(agent: &subagents::AgentRef, turns: u64) {
    within("the agent's turns", async {
        loop {
            agent.when_idle().await;
            if agent.log().last_turn() >= turns {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// The texts of the settled notices in `agent`'s log.
pub fn notices(agent: &subagents::AgentRef) -> Vec<String> {
    agent
        .log()
        .events()
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::UserMessage(message)
                if matches!(
                    message.source,
                    subagents::MessageSource::SubagentSettledNotice { .. }
                ) =>
            {
                Some(message.text())
            }
            _ => None,
        })
        .collect()
}

/// The texts of the messages delivered to a log (runtime context left out), in order.
pub fn delivered(events: &[SessionEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::UserMessage(message)
                if !matches!(message.source, subagents::MessageSource::Plugin { .. }) =>
            {
                Some(message.text())
            }
            _ => None,
        })
        .collect()
}

/// The parent a [`sparing_the_parent`] hook leaves alone, once the test names it.
pub type SparedParent = Arc<Mutex<Option<SessionId>>>;

/// A runtime-wide pre-step hook that leaves the parent's steps alone and lets `decide` rule
/// every other agent's (a deployment participant acting on the children). Name the parent in
/// the returned cell once it exists.
pub fn sparing_the_parent(
    decide: impl Fn(
            &subagents::host::PreStep<'_>,
            subagents::host::PreStepDecision,
        ) -> subagents::host::PreStepDecision
        + Send
        + Sync
        + 'static,
) -> (subagents::host::PreStepHook, SparedParent) {
    let parent = SparedParent::default();
    let spared = Arc::clone(&parent);
    let hook: subagents::host::PreStepHook = Arc::new(move |step, decision| {
        if Some(step.agent) == *spared.lock().unwrap() {
            decision
        } else {
            decide(step, decision)
        }
    });
    (hook, parent)
}

/// Starts a continuable child of `parent` that must be refused; the refusal.
pub async fn refused_start(rt: &Runtime, parent: &subagents::AgentRef) -> subagents::SubagentError {
    rt.subagents()
        .start_continuable(subagents::ContinuableStartSpec::new(
            "spawn",
            "t",
            parent,
            text("go"),
        ))
        .await
        .expect_err("the start is refused")
}

/// A seam runtime, one root parent, and a recorder of the lifecycle events scoped to it.
pub async fn fixture(model: &ScriptedModel) -> (Runtime, subagents::AgentHandle, SeamRecorder) {
    let rt = seam_runtime(model).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    (rt, parent, recorder)
}

/// Starts a continuable grandchild under the resident child `child`, as the child's own tool
/// would.
pub async fn grandchild(rt: &Runtime, child: &subagents::AgentRef) -> subagents::ContinuableStart {
    rt.subagents()
        .start_continuable(subagents::ContinuableStartSpec::new(
            "spawn",
            "grandchild task",
            child,
            text("grandchild task"),
        ))
        .await
        .expect("the grandchild starts")
}

/// A child of `parent` held mid-turn at `child_gate`, and a grandchild started under it held
/// mid-turn at `grand_gate` (the model must hand out the child's gated step first): the
/// child's start, its live agent, and the grandchild's start.
pub async fn held_forest(
    rt: &Runtime,
    parent: &subagents::AgentRef,
    child_gate: &subagents::testing::Gate,
    grand_gate: &subagents::testing::Gate,
) -> (
    subagents::ContinuableStart,
    subagents::AgentRef,
    subagents::ContinuableStart,
) {
    let started = start_continuable(rt, parent, "child task").await;
    child_gate.reached().await;
    let child = rt
        .agents()
        .get(started.child_id)
        .await
        .expect("the held child is live");
    let grand = grandchild(rt, &child).await;
    grand_gate.reached().await;
    (started, child, grand)
}

/// A seam runtime over a fault-injecting in-memory store, and a root parent.
pub async fn faulty(
    model: &ScriptedModel,
) -> (
    Runtime,
    Arc<subagents::testing::FaultInjectingStore>,
    subagents::AgentHandle,
) {
    let faults = Arc::new(subagents::testing::FaultInjectingStore::new(Arc::new(
        MemoryStore::new(),
    )));
    let rt = seam_runtime_on(
        Runtime::builder().model("scripted", model.clone()),
        faults.clone(),
    )
    .await;
    let parent = root(&rt).await;
    (rt, faults, parent)
}

/// Collects this thread's `tracing` output at WARN and above while it lives.
///
/// One subscriber serves the whole test binary, installed once as the global default, and
/// writes each event to the capture of the thread that emits it (if any). A subscriber set
/// per test with `set_default` raced with other threads registering the same call sites: a
/// call site first hit elsewhere at the wrong moment cached "never" and the capture missed it.
pub struct Warnings {
    buffer: Arc<Mutex<Vec<u8>>>,
}

thread_local! {
    /// The capture of this thread, while one lives.
    static CAPTURE: std::cell::RefCell<Option<Arc<Mutex<Vec<u8>>>>> =
        const { std::cell::RefCell::new(None) };
}

/// A writer appending to the emitting thread's capture, or nowhere.
struct ThreadCapture;

impl std::io::Write for ThreadCapture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|capture| {
            if let Some(buffer) = capture.borrow().as_ref() {
                buffer.lock().unwrap().extend_from_slice(bytes);
            }
        });
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Warnings {
    /// Captures on this thread: the manager, the agents and their spawned tasks all run on the
    /// test's single-threaded actix system (no worker pool is configured).
    pub fn capture() -> Self {
        install_subscriber();
        let buffer = Arc::new(Mutex::new(Vec::new()));
        CAPTURE.with(|capture| *capture.borrow_mut() = Some(Arc::clone(&buffer)));
        Self { buffer }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buffer.lock().unwrap()).into_owned()
    }
}

impl Drop for Warnings {
    fn drop(&mut self) {
        CAPTURE.with(|capture| capture.borrow_mut().take());
    }
}

/// Installs the test binary's one global subscriber: WARN events to the emitting thread's
/// [`Warnings`] capture. (A [`SpanCapture`] installs a subscriber of its own on its thread.)
fn install_subscriber() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::Layer as _;
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let warnings = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(|| ThreadCapture)
            .with_filter(tracing_subscriber::filter::LevelFilter::WARN);
        let subscriber = tracing_subscriber::registry().with(warnings);
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in the test binary");
    });
}

/// One span as OpenTelemetry exported it from a [`SpanCapture`]: its name (the first word of
/// its OpenTelemetry name: `execute_tool`, `invoke_agent`, …), its parent's index in the
/// capture (`None` for a root), its attributes as text, its events and its links.
#[derive(Debug, Clone)]
pub struct CapturedSpan {
    pub name: String,
    pub parent: Option<usize>,
    pub fields: std::collections::BTreeMap<String, String>,
    pub span_id: opentelemetry::trace::SpanId,
    pub trace_id: opentelemetry::trace::TraceId,
    pub end: std::time::SystemTime,
    /// Each event: its name and attributes as text.
    pub events: Vec<(String, std::collections::BTreeMap<String, String>)>,
    /// The span ids each link names.
    pub links: Vec<opentelemetry::trace::SpanId>,
}

/// The spans an in-test OpenTelemetry pipeline exported, as each ended.
#[derive(Debug, Clone, Default)]
struct KeptSpans(Arc<Mutex<Vec<opentelemetry_sdk::trace::SpanData>>>);

impl opentelemetry_sdk::trace::SpanExporter for KeptSpans {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

/// Exports the runtime's spans (target `subagents::trace`) recorded on this thread, through
/// `tracing-opentelemetry` as a host would, into memory while it lives. The test's actix system
/// runs every actor and spawned task on this thread (no worker pool is configured).
pub struct SpanCapture {
    kept: KeptSpans,
    _provider: opentelemetry_sdk::trace::SdkTracerProvider,
    _default: tracing::subscriber::DefaultGuard,
}

impl SpanCapture {
    pub fn start() -> Self {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::Layer as _;
        install_subscriber();
        let kept = KeptSpans::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_simple_exporter(kept.clone())
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("test"))
            .with_filter(tracing_subscriber::filter::filter_fn(|metadata| {
                metadata.target() == "subagents::trace"
            }));
        let subscriber = tracing_subscriber::registry().with(layer);
        Self {
            kept,
            _provider: provider,
            _default: tracing::subscriber::set_default(subscriber),
        }
    }

    /// Every span exported so far (each once it ended), in the order they started.
    pub fn spans(&self) -> Vec<CapturedSpan> {
        fn text(value: &opentelemetry::Value) -> String {
            match value {
                opentelemetry::Value::String(text) => text.as_str().to_owned(),
                other => other.to_string(),
            }
        }
        let mut exported = self.kept.0.lock().unwrap().clone();
        exported.sort_by_key(|span| span.start_time);
        let index: std::collections::HashMap<opentelemetry::trace::SpanId, usize> = exported
            .iter()
            .enumerate()
            .map(|(at, span)| (span.span_context.span_id(), at))
            .collect();
        exported
            .iter()
            .map(|span| CapturedSpan {
                name: span.name.split(' ').next().unwrap_or_default().to_owned(),
                parent: index.get(&span.parent_span_id).copied(),
                fields: span
                    .attributes
                    .iter()
                    .map(|attribute| (attribute.key.to_string(), text(&attribute.value)))
                    .collect(),
                span_id: span.span_context.span_id(),
                trace_id: span.span_context.trace_id(),
                end: span.end_time,
                events: span
                    .events
                    .iter()
                    .map(|event| {
                        let attributes = event
                            .attributes
                            .iter()
                            .map(|attribute| (attribute.key.to_string(), text(&attribute.value)))
                            .collect();
                        (event.name.to_string(), attributes)
                    })
                    .collect(),
                links: span
                    .links
                    .iter()
                    .map(|link| link.span_context.span_id())
                    .collect(),
            })
            .collect()
    }
}

/// The property names of a tool's parameter schema, sorted.
pub fn property_keys(parameters: &serde_json::Value) -> Vec<String> {
    let properties = parameters["properties"]
        .as_object()
        .expect("an object schema");
    let mut keys: Vec<String> = properties.keys().cloned().collect();
    keys.sort_unstable();
    keys
}

/// The live agent of `id`.
pub async fn live(rt: &Runtime, id: SessionId) -> subagents::AgentRef {
    rt.agents().get(id).await.expect("the agent is live")
}

/// Waits until `id` is no longer live (a settled child is released after its end event).
pub async fn released(rt: &Runtime, id: SessionId) {
    within("the child's release", async {
        while rt.agents().get(id).await.is_some() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// The model route continuable children start on in a [`Routed`] fixture.
pub const CHILD_ROUTE: &str = "child";

/// A seam runtime whose root parent answers from `parent_model` (route `scripted`) and whose
/// continuable children answer from `child_model` (route [`CHILD_ROUTE`]), so neither consumes
/// the other's script, with a recorder of the lifecycle events scoped to the parent.
pub struct Routed {
    pub rt: Runtime,
    pub parent: subagents::AgentHandle,
    pub recorder: SeamRecorder,
    pub parent_model: ScriptedModel,
    pub child_model: ScriptedModel,
}

impl Routed {
    /// Over a fresh in-memory store.
    pub async fn new() -> Self {
        Self::on(Arc::new(MemoryStore::new())).await
    }

    /// Over `store`.
    pub async fn on(store: Arc<dyn subagents::SessionPersistence>) -> Self {
        let parent_model = ScriptedModel::repeating(subagents::testing::ScriptStep::text("noted"));
        let child_model =
            ScriptedModel::repeating(subagents::testing::ScriptStep::text("child ok"));
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

    /// The root parent.
    pub fn parent(&self) -> &subagents::AgentRef {
        self.parent.agent()
    }

    /// Starts a continuable `spawn` child of the parent on the child route.
    pub async fn start_child(&self, label: &str, prompt: &str) -> SessionId {
        start_under(&self.rt, self.parent(), label, prompt).await
    }
}

/// A continuable `spawn` start under `parent` on the child route (a grandchild inherits it).
pub fn child_spec(
    parent: &subagents::AgentRef,
    label: &str,
    prompt: &str,
) -> subagents::ContinuableStartSpec {
    let options = subagents::ChildAgentOptions {
        provider: Some(CHILD_ROUTE.into()),
        model: None,
        max_tokens: None,
    };
    subagents::ContinuableStartSpec::new("spawn", label, parent, text(prompt))
        .agent_options(options)
}

/// Starts `spec` and returns the accepted child's id.
pub async fn start_spec(rt: &Runtime, spec: subagents::ContinuableStartSpec) -> SessionId {
    let started = rt.subagents().start_continuable(spec).await;
    started.expect("the continuable start is accepted").child_id
}

/// Starts a continuable `spawn` child of `parent` on the child route.
pub async fn start_under(
    rt: &Runtime,
    parent: &subagents::AgentRef,
    label: &str,
    prompt: &str,
) -> SessionId {
    start_spec(rt, child_spec(parent, label, prompt)).await
}

/// Stores a session directly, as an earlier process would have left it.
pub async fn author(
    store: &dyn subagents::SessionPersistence,
    header: subagents::SessionHeader,
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

/// Whether `pid` is a live process (a zombie awaiting its reaper is dead).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rfind(')')
            .and_then(|end| stat[end + 1..].split_whitespace().next().map(str::to_owned));
        !matches!(state.as_deref(), Some("Z" | "X") | None)
    })
}

/// Waits until `file` exists (a peer process's ready signal), with the safety-net timeout. A
/// file whose content is then read must be renamed into place by its writer: a redirection
/// creates it empty before writing.
pub async fn appears(file: &std::path::Path) {
    within(&format!("{} to appear", file.display()), async {
        while !file.exists() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Waits (with the safety-net timeout) until `pid` has exited: its exit is asynchronous to
/// whatever released it. The kernel announces it on a pidfd (any process's, not only a child's),
/// polled on a blocking thread with the same bound; a process already gone has none to open.
pub async fn gone(pid: u32) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    use rustix::process::{pidfd_open, Pid, PidfdFlags};
    let raw = i32::try_from(pid).expect("a pid fits an i32");
    let Some(process) = Pid::from_raw(raw) else {
        panic!("pid {pid} names no process");
    };
    let exit = match pidfd_open(process, PidfdFlags::empty()) {
        Ok(exit) => exit,
        Err(rustix::io::Errno::SRCH) => return,
        Err(error) => panic!("opening process {pid}'s pidfd: {error}"),
    };
    let announced = tokio::task::spawn_blocking(move || {
        let bound = Timespec::try_from(Duration::from_secs(20)).expect("a timespec");
        let mut exit = [PollFd::new(&exit, PollFlags::IN)];
        loop {
            match poll(&mut exit, Some(&bound)) {
                Err(rustix::io::Errno::INTR) => {}
                Ok(0) => panic!("process {pid} still runs after 20 s"),
                Ok(_) => return,
                Err(error) => panic!("waiting on the pidfd: {error}"),
            }
        }
    });
    within(&format!("process {pid} to exit"), announced)
        .await
        .expect("the wait on the pidfd ends");
}

/// Registers a continuable provider named `held` whose creations wait at `gate` inside their
/// admitted window (after admission, before the child exists).
pub async fn held_provider(rt: &Runtime, gate: &subagents::testing::Gate) {
    rt.subagents()
        .register_provider(
            subagents::testing::ScriptedProvider::new("held")
                .prepares_continuable()
                .gated_start(gate),
        )
        .await
        .expect("the held provider registers")
        .keep();
}

/// Asserts that `child`, whose start was refused, left nothing behind: it is not stored, not
/// listed (as a child or a descendant), and a follow-up to it resumes nothing (refused with
/// `followup_refusal`: `NOT_RESUMABLE`, or `DRAINING` while a drain's cutoff still stands).
pub async fn assert_no_ghost(
    rt: &Runtime,
    parent: &subagents::AgentRef,
    child: subagents::SessionId,
    followup_refusal: subagents::ErrorCode,
) {
    let store = rt.store().expect("a stored runtime");
    assert!(
        store.list_children(parent.id()).await.unwrap().is_empty(),
        "the refused child was never stored"
    );
    let listed = rt
        .subagents()
        .list_children(parent.id(), subagents::CancellationToken::new())
        .await
        .unwrap();
    assert!(listed.is_empty(), "nothing listed: {listed:?}");
    let tree = rt
        .subagents()
        .list_descendants(parent.id(), subagents::CancellationToken::new())
        .await
        .unwrap();
    assert!(tree.is_empty(), "no descendant: {tree:?}");
    let error = followup_child(rt, parent, child, "anyone there?")
        .await
        .unwrap_err();
    assert_eq!(error.code(), followup_refusal, "{error}");
}

/// Asserts that a command exited successfully, showing what it said otherwise.
pub fn assert_succeeded(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
}

/// Asserts that a command whose standard output could not be written (`/dev/full`) said so and
/// exited 2, without calling it a store failure.
pub fn assert_output_failure_said(output: &std::process::Output) {
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("error: writing the output"), "{stderr}");
    assert!(!stderr.contains("STORE_IO"), "{stderr}");
}
