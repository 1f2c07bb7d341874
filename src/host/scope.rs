//! Provides [`AgentScope`]: one agent's registration layer (tools, restrictions, guards, prompt
//! sections, pre-step hooks, tool-result observers) and the [`AgentSetup`] step of the creation
//! transaction that fills it.
//!
//! A child gets a new, flat scope: nothing is copied from its parent's scope. Disposing the
//! agent unwinds the scope: its disposers run in reverse registration order.

use std::borrow::Cow;
use std::num::NonZeroU64;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::content::{ContentBlock, Message, MessageSource};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::{CallId, SessionId};
use crate::session::{EventKind, SessionEvent, SessionLog, SurfaceOp};
use crate::tools::{Guard, Tool, ToolExecutionResult, ToolFilter, ToolLayer, ToolRegistry};

/// A named, ordered piece of the system prompt.
///
/// Name and text borrow `'static` strings when they can: the runtime's own sections are
/// constants, and every delegated child carries some, so an owned copy would be paid per child.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSection {
    /// The section name; an agent's section shadows a global one of the same name.
    pub name: Cow<'static, str>,
    /// Sort key, ascending.
    pub order: f64,
    /// The text; an empty section is left out.
    pub text: Cow<'static, str>,
}

impl PromptSection {
    /// A section.
    pub fn new(
        name: impl Into<Cow<'static, str>>,
        order: f64,
        text: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self {
            name: name.into(),
            order,
            text: text.into(),
        }
    }
}

/// Interpolates `{{name}}` placeholders strictly: every name must be a registered variable.
///
/// # Errors
/// `UNKNOWN_PROMPT_VARIABLE` naming the first unknown variable, or an unclosed `{{`.
pub fn interpolate_prompt(
    template: &str,
    variables: &std::collections::BTreeMap<String, String>,
) -> Result<String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or_else(|| {
            SubagentError::new(
                ErrorCode::UnknownPromptVariable,
                "unclosed {{ in a prompt template",
            )
        })?;
        let name = after[..close].trim();
        let value = variables.get(name).ok_or_else(|| {
            SubagentError::new(
                ErrorCode::UnknownPromptVariable,
                format!("prompt variable \"{name}\" is not registered"),
            )
        })?;
        out.push_str(value);
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Assembles the system prompt: sections sorted by order, agent sections shadowing global ones
/// of the same name, empty sections left out, joined by blank lines. `guidance` is the
/// guidance of the tools the agent sees (see [`crate::tools::Tool::with_guidance`]): it ranks
/// below the agent's own sections and above global ones.
pub fn assemble_system_prompt(
    global: &[PromptSection],
    scoped: &[PromptSection],
    guidance: &[&PromptSection],
) -> Option<String> {
    let mut sections: Vec<&PromptSection> = scoped.iter().collect();
    for section in guidance {
        if !sections.iter().any(|s| s.name == section.name) {
            sections.push(section);
        }
    }
    let named = sections.clone();
    sections.extend(
        global
            .iter()
            .filter(|g| !named.iter().any(|s| s.name == g.name)),
    );
    sections.retain(|section| !section.text.trim().is_empty());
    sections.sort_by(|a, b| a.order.total_cmp(&b.order));
    (!sections.is_empty()).then(|| {
        sections
            .iter()
            .map(|section| section.text.as_ref())
            .collect::<Vec<_>>()
            .join("\n\n")
    })
}

/// The runtime contexts that last entered a step (see [`AgentScope::runtime_context_message`]).
#[derive(Debug, Clone, Copy)]
struct SentContexts {
    /// Never zero, so an absent one costs no more room than one that is present.
    version: NonZeroU64,
    fingerprint: u64,
}

/// The runtime context a log last stated to its model, folded an event at a time: a paged
/// resume sees each event once and keeps only the newest, so the statement an unchanged context
/// would repeat may be gone from the history it holds (see
/// [`AgentScope::count_as_sent`]).
#[derive(Debug, Default)]
pub(crate) struct StatedContext(Option<u64>);

impl StatedContext {
    /// Folds in `event`, one of the log's own (not inherited) events, in order.
    pub(crate) fn fold(&mut self, event: &SessionEvent) {
        // A splice over the history may have taken the statement out of what the model sees.
        if matches!(event.surface_op, Some(SurfaceOp::Replace { .. })) {
            self.0 = None;
        }
        if let EventKind::UserMessage(message) = &event.kind {
            if is_runtime_context(message) {
                self.0 = match &message.content[..] {
                    [ContentBlock::Text { text }] => Some(fingerprint(text)),
                    _ => None,
                };
            }
        }
    }
}

/// Whether `message` is a runtime-context snapshot (see [`AgentScope::context`]).
fn is_runtime_context(message: &Message) -> bool {
    matches!(&message.source, MessageSource::Plugin { plugin } if plugin == RUNTIME_CONTEXT_PLUGIN)
}

/// A fingerprint of a rendered runtime-context text: equal texts have equal fingerprints, and
/// different ones collide with odds of one in 2^64.
fn fingerprint(text: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::default().hash_one(text)
}

/// The runtime-context message text of `contexts`, if any section has text.
fn render_contexts(contexts: &[PromptSection]) -> Option<String> {
    assemble_system_prompt(&[], contexts, &[]).map(|sections| {
        // Sized exactly: the text lives in the log for the session's life.
        [RUNTIME_CONTEXT_HEADER, "\n\n", &sections].concat()
    })
}

/// What a pre-step hook sees.
#[derive(Debug)]
pub struct PreStep<'a> {
    /// The agent.
    pub agent: SessionId,
    /// The current turn.
    pub turn: u64,
    /// The step about to start (1 for the turn's first).
    pub step: u64,
    /// The agent's log; a hook may append between-step events (the one-shot descriptor).
    pub log: &'a SessionLog,
}

/// A pre-step decision: enter the step with these messages, reject it, or fail it. Either of
/// the last two ends the turn before the step opens, and the claimed messages are lost.
#[derive(Debug, Clone, PartialEq)]
pub enum PreStepDecision {
    /// Enter with these messages.
    Enter(Vec<Message>),
    /// Refuse the step: a deliberate policy decision; the turn ends `blocked`.
    Reject,
    /// The hook could not decide: the turn ends `error` with this message.
    Fail(String),
}

/// A pre-step hook: a waterfall stage that receives the previous stage's decision.
pub type PreStepHook = Arc<dyn Fn(&PreStep<'_>, PreStepDecision) -> PreStepDecision + Send + Sync>;

/// A turn-stopping hook: runs when a turn is about to end with nothing left in `next-step`;
/// the messages it returns are entered as another step of the same turn (it may steer).
pub type TurnStoppingHook = Arc<dyn Fn(&PreStep<'_>) -> Vec<Message> + Send + Sync>;

/// What a tool-result observer sees: the call and its final result.
#[derive(Debug)]
pub struct ToolResultSeen<'a> {
    /// The calling agent.
    pub agent: SessionId,
    /// The call id.
    pub call_id: &'a CallId,
    /// The execution's identity (see [`crate::tools::ToolCtx::execution`]).
    pub execution: u64,
    /// The tool name.
    pub name: &'a str,
    /// The final result.
    pub result: &'a ToolExecutionResult,
}

/// Runs once the pre-step waterfall entered a step, before `step/start` (the one-shot
/// descriptor is appended here, so a rejected step never records one).
pub type StepEnteredHook = Arc<dyn Fn(&PreStep<'_>) + Send + Sync>;

/// The plugin name on runtime-context messages.
pub const RUNTIME_CONTEXT_PLUGIN: &str = "runtime-context";

/// The first line of every runtime-context message.
pub const RUNTIME_CONTEXT_HEADER: &str =
    "Current runtime context. This snapshot supersedes earlier runtime-context snapshots.";

/// Observes every final tool result (observe only).
pub type ToolResultObserver = Arc<dyn Fn(&ToolResultSeen<'_>) + Send + Sync>;

/// Runs when the agent's scope unwinds.
pub type Disposer = Box<dyn FnOnce() + Send + Sync>;

/// Called synchronously once setup succeeded and nothing else can fail before publication.
pub type SetupCommit = Box<dyn FnOnce() + Send + Sync>;

/// One agent's registration layer.
pub struct AgentScope {
    globals: Arc<ToolRegistry>,
    tools: ToolLayer,
    sections: Vec<PromptSection>,
    contexts: Vec<PromptSection>,
    /// Counts changes to `contexts`, so a step that finds them unchanged renders nothing.
    contexts_version: NonZeroU64,
    /// What the last runtime-context message to enter a step was rendered from. Kept as a
    /// version and a fingerprint of the text, not as the sections or the text: every resident
    /// child holds one.
    sent_contexts: std::sync::Mutex<Option<SentContexts>>,
    /// Absent until a hook is added: a delegated child has none, and every resident child
    /// holds a scope.
    hooks: Option<Box<Hooks>>,
    disposers: Vec<Disposer>,
}

impl std::fmt::Debug for AgentScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentScope")
            .field("tools", &self.tools)
            .field("sections", &self.sections)
            .finish_non_exhaustive()
    }
}

/// An agent's own hooks (see [`AgentScope`]).
#[derive(Default)]
struct Hooks {
    pre_step: Vec<PreStepHook>,
    step_entered: Vec<StepEnteredHook>,
    turn_stopping: Vec<TurnStoppingHook>,
    tool_results: Vec<ToolResultObserver>,
}

/// The hooks of a scope that has none.
static NO_HOOKS: Hooks = Hooks {
    pre_step: Vec::new(),
    step_entered: Vec::new(),
    turn_stopping: Vec::new(),
    tool_results: Vec::new(),
};

impl AgentScope {
    fn hooks(&self) -> &Hooks {
        self.hooks.as_deref().unwrap_or(&NO_HOOKS)
    }

    fn hooks_mut(&mut self) -> &mut Hooks {
        self.hooks.get_or_insert_default()
    }

    pub(crate) fn new(globals: Arc<ToolRegistry>) -> Self {
        Self {
            globals,
            tools: ToolLayer::default(),
            sections: Vec::new(),
            contexts: Vec::new(),
            contexts_version: NonZeroU64::MIN,
            sent_contexts: std::sync::Mutex::new(None),
            hooks: None,
            disposers: Vec::new(),
        }
    }

    /// Registers an agent-scoped tool.
    ///
    /// # Errors
    /// `DUPLICATE_TOOL`.
    pub fn register_tool(&mut self, tool: Tool) -> Result<()> {
        self.tools.register(tool)
    }

    /// Masks global tools for this agent.
    ///
    /// # Errors
    /// `INVALID_RESTRICTION` or `UNKNOWN_TOOL`; see [`ToolLayer::restrict`].
    pub fn restrict(&mut self, filter: ToolFilter) -> Result<()> {
        self.tools.restrict(&self.globals, filter)
    }

    /// Adds a guard over this agent's calls.
    pub fn guard(&mut self, guard: Guard) {
        self.tools.guard(guard);
    }

    /// Adds a prompt section.
    pub fn section(&mut self, section: PromptSection) {
        self.sections.retain(|s| s.name != section.name);
        self.sections.push(section);
    }

    /// Adds a runtime-context statement: rendered (by order) into a plugin-sourced
    /// `user/message` that enters the next step whenever the rendered text changed.
    pub fn context(&mut self, section: PromptSection) {
        self.contexts.retain(|s| s.name != section.name);
        // Exact: a child usually carries one or two contexts for its whole life.
        self.contexts.reserve_exact(1);
        self.contexts.push(section);
        self.contexts_version = self.contexts_version.saturating_add(1);
    }

    /// The runtime-context message for the next step, if the rendered contexts changed since
    /// the last one this agent saw.
    pub fn runtime_context_message(&self) -> Option<Message> {
        self.next_runtime_context(|_| false)
    }

    /// Counts `stated`, the runtime context the agent's log last stated, as what it saw: an
    /// agent resumed paged out holds only its newest history entries, and its first step would
    /// otherwise state an unchanged context again (its model reads the whole history back).
    pub(crate) fn count_as_sent(&mut self, stated: &StatedContext) {
        if let Some(fingerprint) = stated.0 {
            // No version of this scope's contexts is this one: the first step renders them and
            // compares the text.
            *self
                .sent_contexts
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(SentContexts {
                version: NonZeroU64::MAX,
                fingerprint,
            });
        }
    }

    /// As [`AgentScope::runtime_context_message`], where what the agent saw includes, at its
    /// first step, the last runtime context its own model history still holds: a resumed
    /// child states an unchanged context once in its whole log, not again every epoch. Only
    /// the agent's own part is searched: a fork's inherited prefix is its parent's, and
    /// searching it would make a fork's first step cost its parent's length.
    pub(crate) fn runtime_context_message_after(&self, log: &SessionLog) -> Option<Message> {
        self.next_runtime_context(|text| {
            let own_from = log.seed_len();
            log.history()
                .iter()
                .rev()
                .take_while(|entry| entry.seq() >= own_from)
                .find(|entry| is_runtime_context(entry))
                .is_some_and(|retained| {
                    matches!(&retained.content[..], [ContentBlock::Text { text: held }] if held == text)
                })
        })
    }

    /// The next runtime-context message; `retained` says whether a text was already seen
    /// before this scope sent anything.
    fn next_runtime_context(&self, retained: impl FnOnce(&str) -> bool) -> Option<Message> {
        let mut sent = self
            .sent_contexts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The same sections render the same text: the common case renders nothing.
        if sent.is_some_and(|sent| sent.version == self.contexts_version) {
            return None;
        }
        let text = render_contexts(&self.contexts)?;
        let fingerprint = fingerprint(&text);
        let unchanged = match *sent {
            Some(sent) => sent.fingerprint == fingerprint,
            None => retained(&text),
        };
        *sent = Some(SentContexts {
            version: self.contexts_version,
            fingerprint,
        });
        if unchanged {
            return None;
        }
        // The header tells the model this is standing context, not a request.
        Some(Message::user(
            vec![ContentBlock::text(text)],
            MessageSource::Plugin {
                plugin: RUNTIME_CONTEXT_PLUGIN.to_owned(),
            },
        ))
    }

    /// Adds a step-entered hook.
    pub fn on_step_entered(&mut self, hook: StepEnteredHook) {
        self.hooks_mut().step_entered.push(hook);
    }

    /// Runs the step-entered hooks; a panicking hook is logged and skipped.
    pub fn step_entered(&self, step: &PreStep<'_>) {
        for hook in &self.hooks().step_entered {
            if catch_unwind(AssertUnwindSafe(|| hook(step))).is_err() {
                tracing::error!(session_id = %step.agent, turn = step.turn, "a step-entered hook panicked");
            }
        }
    }

    /// Adds a pre-step hook (run after those already added).
    pub fn on_pre_step(&mut self, hook: PreStepHook) {
        self.hooks_mut().pre_step.push(hook);
    }

    /// Adds a turn-stopping hook (run serially, after those already added).
    pub fn on_turn_stopping(&mut self, hook: TurnStoppingHook) {
        self.hooks_mut().turn_stopping.push(hook);
    }

    /// Adds a tool-result observer.
    pub fn on_tool_result(&mut self, observer: ToolResultObserver) {
        self.hooks_mut().tool_results.push(observer);
    }

    /// Adds work to run when the scope unwinds.
    pub fn on_dispose(&mut self, disposer: Disposer) {
        self.disposers.push(disposer);
    }

    /// The tool layer.
    pub fn tools(&self) -> &ToolLayer {
        &self.tools
    }

    /// The global tool registry this scope masks.
    pub fn globals(&self) -> &ToolRegistry {
        &self.globals
    }

    /// The agent's prompt sections.
    pub fn sections(&self) -> &[PromptSection] {
        &self.sections
    }

    /// Runs the pre-step waterfall: the runtime-wide hooks in `global`, then this agent's. A
    /// hook that panics fails the step (the turn ends `error`): a broken policy must neither let
    /// work through nor pass for a deliberate refusal.
    pub fn pre_step(
        &self,
        global: &[PreStepHook],
        step: &PreStep<'_>,
        mut decision: PreStepDecision,
    ) -> PreStepDecision {
        for hook in global.iter().chain(&self.hooks().pre_step) {
            let current = decision;
            decision = match catch_unwind(AssertUnwindSafe(|| hook(step, current))) {
                Ok(next) => next,
                Err(_) => {
                    tracing::error!(session_id = %step.agent, turn = step.turn, "a pre-step hook panicked; failing the turn");
                    return PreStepDecision::Fail("a pre-step hook panicked".to_owned());
                }
            };
        }
        decision
    }

    /// Runs the turn-stopping hooks serially and collects the messages they steer in. A hook
    /// that panics is logged and contributes nothing.
    pub fn turn_stopping(&self, step: &PreStep<'_>) -> Vec<Message> {
        let mut steered = Vec::new();
        for hook in &self.hooks().turn_stopping {
            match catch_unwind(AssertUnwindSafe(|| hook(step))) {
                Ok(messages) => steered.extend(messages),
                Err(_) => {
                    tracing::error!(session_id = %step.agent, turn = step.turn, "a turn-stopping hook panicked")
                }
            }
        }
        steered
    }

    /// Tells every observer about a final result, each contained on its own.
    pub fn tool_result(&self, seen: &ToolResultSeen<'_>) {
        for observer in &self.hooks().tool_results {
            if catch_unwind(AssertUnwindSafe(|| observer(seen))).is_err() {
                tracing::error!(session_id = %seen.agent, tool = seen.name, "tool-result observer panicked");
            }
        }
    }

    pub(crate) fn take_disposers(&mut self) -> Vec<Disposer> {
        std::mem::take(&mut self.disposers)
    }
}

/// A scope dropped while it still owns disposers belongs to a creation that never published
/// (failed, or its future was dropped): what its setup registered is unwound here, in reverse
/// order, each disposer contained. A published agent's actor takes the disposers first.
impl Drop for AgentScope {
    fn drop(&mut self) {
        for disposer in self.disposers.drain(..).rev() {
            if catch_unwind(AssertUnwindSafe(disposer)).is_err() {
                tracing::error!("a scope disposer panicked while an unpublished scope unwound");
            }
        }
    }
}

/// The setup step of a create or resume transaction: fills the new agent's scope (and may
/// append setup events to its log) before publication. A failure rolls the creation back.
pub trait AgentSetup: Send + 'static {
    /// Runs the setup; an optional commit runs once nothing else can fail.
    fn run<'a>(
        self: Box<Self>,
        scope: &'a mut AgentScope,
        log: &'a SessionLog,
    ) -> BoxFuture<'a, Result<Option<SetupCommit>>>;
}

impl<F> AgentSetup for F
where
    F: FnOnce(&mut AgentScope, &SessionLog) -> Result<Option<SetupCommit>> + Send + 'static,
{
    fn run<'a>(
        self: Box<Self>,
        scope: &'a mut AgentScope,
        log: &'a SessionLog,
    ) -> BoxFuture<'a, Result<Option<SetupCommit>>> {
        let outcome = (*self)(scope, log);
        Box::pin(futures::future::ready(outcome))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{EventKind, SessionEvent, SessionHeader};
    use crate::tools::ToolRegistry;

    fn scope() -> AgentScope {
        AgentScope::new(Arc::new(ToolRegistry::new()))
    }

    /// A scope stating one context.
    fn stating(text: &'static str) -> AgentScope {
        let mut scope = scope();
        scope.context(PromptSection::new("policy", 1.0, text));
        scope
    }

    /// A turn whose one step entered `message`, from `seq` on.
    fn turn_entering(seq: u64, message: Message) -> Vec<SessionEvent> {
        let kinds = [
            EventKind::TurnStart { turn: 1 },
            EventKind::StepStart { turn: 1, step: 1 },
            EventKind::UserMessage(message),
            EventKind::StepEnd { turn: 1, step: 1 },
            EventKind::TurnEnd {
                turn: 1,
                reason: crate::session::TurnEndReason::Completed,
                traceparent: None,
            },
        ];
        kinds
            .into_iter()
            .zip(seq..)
            .map(|(kind, seq)| SessionEvent::new(seq, kind))
            .collect()
    }

    // A snapshot the agent's own history holds counts as sent (a resumed child states an
    // unchanged context once); one in a fork's inherited prefix is its parent's, and is
    // neither searched (a fork's first step would cost its parent's length) nor counted.
    #[test]
    fn only_a_snapshot_in_the_agents_own_history_counts_as_sent() {
        let snapshot = stating("read only")
            .runtime_context_message()
            .expect("a snapshot");
        let mut header = SessionHeader::new(SessionId::new());
        header.seed_length = Some(5);
        let forked = SessionLog::new(header, turn_entering(0, snapshot.clone())).unwrap();
        assert!(
            stating("read only")
                .runtime_context_message_after(&forked)
                .is_some(),
            "the parent's snapshot is not the child's"
        );
        let resumed = SessionLog::new(SessionHeader::new(SessionId::new()), Vec::new()).unwrap();
        for event in turn_entering(0, snapshot) {
            resumed.append(event.kind).unwrap();
        }
        assert!(stating("read only")
            .runtime_context_message_after(&resumed)
            .is_none());
        assert!(
            stating("read write")
                .runtime_context_message_after(&resumed)
                .is_some(),
            "a changed context is stated"
        );
    }

    fn sent_text(scope: &AgentScope) -> Option<String> {
        scope
            .runtime_context_message()
            .map(|message| message.text())
    }

    // Every agent holds its scope in an `Arc` (16 bytes of counts): within mimalloc's
    // 256-byte class.
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn a_scope_stays_within_its_allocation_class() {
        assert!(std::mem::size_of::<AgentScope>() <= 240);
    }

    #[test]
    fn a_runtime_context_enters_once_and_again_only_when_its_text_changes() {
        let mut scope = scope();
        assert_eq!(sent_text(&scope), None, "no context, no message");
        scope.context(PromptSection::new("policy", 1.0, "read only"));
        let first = sent_text(&scope).expect("the first context is sent");
        assert!(first.starts_with(RUNTIME_CONTEXT_HEADER) && first.ends_with("read only"));
        assert_eq!(
            sent_text(&scope),
            None,
            "an unchanged context is not sent again"
        );

        scope.context(PromptSection::new("policy", 1.0, String::from("read only")));
        assert_eq!(
            sent_text(&scope),
            None,
            "the same text set again is unchanged"
        );

        scope.context(PromptSection::new("policy", 1.0, "read write"));
        scope.context(PromptSection::new("policy", 1.0, "read only"));
        assert_eq!(
            sent_text(&scope),
            None,
            "a change undone before the next step leaves what the model saw"
        );

        scope.context(PromptSection::new("depth", 0.5, "depth 2"));
        let second = sent_text(&scope).expect("a new section changes the text");
        assert!(second.contains("depth 2\n\nread only"), "{second}");
    }

    // What a paged load folds: the newest statement counts, a splice over the history (which
    // may have taken it out of what the model sees) forgets it, and a scope that counts it as
    // sent states an unchanged context no more, a changed one again.
    #[test]
    fn the_newest_stated_context_counts_as_sent_until_a_splice() {
        let brief = stating("be brief").runtime_context_message().unwrap();
        let thorough = stating("be thorough").runtime_context_message().unwrap();
        let stated = |events: &[SessionEvent]| {
            let mut stated = StatedContext::default();
            events.iter().for_each(|event| stated.fold(event));
            stated
        };
        let mut events = turn_entering(0, thorough);
        events.extend(turn_entering(5, brief));
        let mut scope = stating("be brief");
        scope.count_as_sent(&stated(&events));
        assert_eq!(
            scope.runtime_context_message(),
            None,
            "unchanged: not again"
        );
        let mut scope = stating("be thorough");
        scope.count_as_sent(&stated(&events));
        assert!(scope.runtime_context_message().is_some(), "changed: again");

        let mut spliced = SessionEvent::new(
            10,
            EventKind::UserMessage(Message::user(
                vec![ContentBlock::text("summary")],
                MessageSource::User,
            )),
        );
        spliced.surface_op = Some(SurfaceOp::Replace { start: 0, end: 4 });
        events.push(spliced);
        let mut scope = stating("be brief");
        scope.count_as_sent(&stated(&events));
        assert!(
            scope.runtime_context_message().is_some(),
            "after a splice the statement may be gone: stated again"
        );
    }
}
