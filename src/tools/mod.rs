//! Provides tools: [`Tool`] (a definition plus an async body), the global [`ToolRegistry`], the
//! per-agent [`ToolLayer`] with its restrictions and guards, and the execution result vocabulary.
//!
//! # Layers
//! A tool registered on the global registry is visible to every agent; one registered on an
//! agent's layer is visible to that agent only and shadows a global tool of the same name.
//! [`ToolLayer::restrict`] masks global tools for one agent: masks intersect, `allow` excludes
//! globals registered later, `deny` admits them. A masked tool is gone from the schemas and
//! refuses to run (`UNKNOWN_TOOL`): visibility, not authority.
//!
//! # Guards
//! A guard sees each call before it runs and may refuse it with a reason; refusals are
//! monotonic (any guard refusing wins).

pub mod control;
pub(crate) mod plugin;
pub mod report;
pub mod structured_output;
pub mod subagent;

pub use control::{
    install_control_tools, ControlTools, INTERRUPT_AGENT, LIST_AGENTS, SEND_MESSAGE,
};
pub use plugin::NO_CALLING_AGENT;
pub use report::{install_report_tool, REPORT, REPORT_SECTION};
pub use subagent::{
    install_subagent_tool, BackgroundMode, MaxDepthPolicy, SubagentToolConfig,
    SubagentToolInstallation,
};

use std::collections::BTreeSet;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures::future::{BoxFuture, FutureExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::actors::agent::AgentRef;
use crate::content::{ContentBlock, Message};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::PromptSection;
use crate::ids::{CallId, SessionId};
use crate::model::ToolSchema;

/// Whether calls to a tool may run beside other calls of the same step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Concurrency {
    /// The call is a barrier: it runs alone.
    #[default]
    Exclusive,
    /// The call may run in parallel with other concurrency-safe calls.
    Safe,
}

/// What the tool body receives besides its arguments.
#[derive(Debug, Clone)]
pub struct ToolCtx {
    /// The calling agent's session.
    pub agent: SessionId,
    /// The call id.
    pub call_id: CallId,
    /// The tool name.
    pub name: String,
    /// Cancelled when the turn is cancelled.
    pub cancel: CancellationToken,
    /// The exact calling agent: the authority a tool acting for it presents to the delegation API.
    caller: Option<AgentRef>,
    execution: u64,
    concludes: Arc<AtomicBool>,
}

/// Mints execution ids: unique per call in this process, even when the model reuses call ids.
static EXECUTIONS: AtomicU64 = AtomicU64::new(1);

impl ToolCtx {
    /// A context for one call that names a session but carries no calling agent: a tool
    /// that acts for its caller (delegation, control, report, jobs) refuses it.
    pub fn new(agent: SessionId, call_id: CallId, name: String, cancel: CancellationToken) -> Self {
        Self {
            agent,
            caller: None,
            call_id,
            name,
            cancel,
            execution: EXECUTIONS.fetch_add(1, Ordering::Relaxed),
            concludes: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A context for one call made by `agent` itself. Holding the exact [`AgentRef`] is the
    /// authority: the same reference the delegation API's own calls (`followup`, `interrupt`, ...)
    /// take.
    pub fn for_agent(
        agent: &AgentRef,
        call_id: CallId,
        name: String,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            caller: Some(agent.clone()),
            ..Self::new(agent.id(), call_id, name, cancel)
        }
    }

    /// The exact calling agent, when the call carries one (every call a turn makes does).
    pub fn caller(&self) -> Option<&AgentRef> {
        self.caller.as_ref()
    }

    /// This execution's identity: distinct for every call, even one that reuses a call id.
    pub fn execution(&self) -> u64 {
        self.execution
    }

    /// Marks a successful result as ending the turn: no further model step follows.
    pub fn conclude_turn(&self) {
        self.concludes.store(true, Ordering::Release);
    }

    fn concluded(&self) -> bool {
        self.concludes.load(Ordering::Acquire)
    }
}

/// A successful tool outcome.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolOutput {
    /// What the model sees.
    pub content: Vec<ContentBlock>,
    /// A structured value for observers.
    pub value: Option<Value>,
    /// Metadata kept in the log.
    pub meta: Option<Value>,
    /// Context messages queued into the agent's next step.
    pub additional_contexts: Vec<Message>,
}

impl ToolOutput {
    /// An output of one text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            content: vec![ContentBlock::text(text)],
            ..Self::default()
        }
    }
}

/// A failed tool outcome: becomes an `is_error` result the model can read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    /// A stable code (`INVALID_ARGS`, ...).
    pub code: String,
    /// What went wrong.
    pub message: String,
}

impl ToolError {
    /// A failure with a code and a message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

type ToolBody = dyn Fn(Value, ToolCtx) -> BoxFuture<'static, std::result::Result<ToolOutput, ToolError>>
    + Send
    + Sync;

/// A tool: its model-facing definition and its body. Cheap to clone.
#[derive(Clone)]
pub struct Tool {
    /// Shared by every copy: an agent's step copies the tools it sees, and the model call
    /// takes their schemas, without copying a JSON Schema each time.
    schema: Arc<ToolSchema>,
    concurrency: Concurrency,
    body: Arc<ToolBody>,
    /// Set once the installation that granted the tool is revoked: the tool is then gone from
    /// every layer holding a copy, at once.
    revoked: Option<Arc<AtomicBool>>,
    /// A system-prompt section shown exactly while the agent sees the tool.
    guidance: Option<Arc<PromptSection>>,
}

/// Revokes one [`Tool`] made with [`Tool::revocable`], wherever copies of it were installed.
#[derive(Debug, Clone)]
pub struct ToolRevocation(Arc<AtomicBool>);

impl ToolRevocation {
    /// Removes the tool from every agent that holds it: it leaves their schemas and refuses
    /// to run (`UNKNOWN_TOOL`) from now on, even mid-turn.
    pub fn revoke(&self) {
        self.0.store(true, Ordering::Release);
    }
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.schema.name)
            .finish()
    }
}

impl Tool {
    /// A tool named `name` whose body is `body`.
    pub fn new<F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        body: F,
    ) -> Self
    where
        F: Fn(Value, ToolCtx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<ToolOutput, ToolError>> + Send + 'static,
    {
        Self {
            schema: Arc::new(ToolSchema {
                name: name.into(),
                description: description.into(),
                parameters,
            }),
            concurrency: Concurrency::Exclusive,
            body: Arc::new(move |args, ctx| Box::pin(body(args, ctx))),
            revoked: None,
            guidance: None,
        }
    }

    /// Attaches a system-prompt section that goes with the tool: it is part of an agent's
    /// prompt exactly while that agent sees the tool, so it disappears when the tool is
    /// unmounted, hidden by a restriction, or revoked.
    #[must_use]
    pub fn with_guidance(mut self, section: PromptSection) -> Self {
        self.guidance = Some(Arc::new(section));
        self
    }

    /// The tool's guidance section, if it has one.
    pub fn guidance(&self) -> Option<&PromptSection> {
        self.guidance.as_deref()
    }

    /// The tool and the handle that revokes it: a scope-local grant (such as a continuable
    /// child's `report`) that must disappear from resident agents when its grant is removed.
    #[must_use]
    pub fn revocable(mut self) -> (Self, ToolRevocation) {
        let flag = Arc::new(AtomicBool::new(false));
        self.revoked = Some(Arc::clone(&flag));
        (self, ToolRevocation(flag))
    }

    /// Whether the tool's grant was revoked.
    fn is_revoked(&self) -> bool {
        self.revoked
            .as_ref()
            .is_some_and(|flag| flag.load(Ordering::Acquire))
    }

    /// Marks the tool's calls as safe to run in parallel.
    #[must_use]
    pub fn concurrency(mut self, concurrency: Concurrency) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// The tool name.
    pub fn name(&self) -> &str {
        &self.schema.name
    }

    /// The model-facing schema.
    pub fn schema(&self) -> &ToolSchema {
        &self.schema
    }

    /// The model-facing schema, shared (what a [`GenerateRequest`](crate::model::GenerateRequest)
    /// lists).
    pub fn shared_schema(&self) -> Arc<ToolSchema> {
        Arc::clone(&self.schema)
    }

    /// Whether calls may run in parallel.
    pub fn concurrency_mode(&self) -> Concurrency {
        self.concurrency
    }
}

/// A call a guard inspects.
#[derive(Debug, Clone)]
pub struct GuardedCall<'a> {
    /// The calling agent.
    pub agent: SessionId,
    /// The tool name.
    pub name: &'a str,
    /// The parsed arguments.
    pub arguments: &'a Value,
}

/// A guard: returns a refusal reason to stop the call.
pub type Guard = Arc<dyn Fn(&GuardedCall<'_>) -> Option<String> + Send + Sync>;

/// What a pre-execute listener decides about a pending call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PreToolDecision {
    /// Let the call through to the guards.
    Allow,
    /// Refuse the call with a reason.
    Deny {
        /// Why, shown to the model in the call's error result.
        reason: String,
    },
    /// Ask an approval service. This runtime composes none, so an ask is a refusal.
    Ask {
        /// Why approval is needed.
        reason: Option<String>,
    },
}

/// A pre-execute listener: sees a pending call and `next`, the decision of the listeners after
/// it (allow when there are none), and returns the decision to keep. Listeners form a waterfall:
/// the outermost runs first. Whatever they decide, the guards run after an allow and can only
/// refuse, so no listener can resurrect a call a guard refuses.
pub type PreExecuteHook =
    Arc<dyn Fn(&GuardedCall<'_>, &dyn Fn() -> PreToolDecision) -> PreToolDecision + Send + Sync>;

/// A post-execute hook: sees a ran call's result and returns the result to keep. It may accept,
/// replace the content, or block (turn a success into a failure with feedback). Hooks run in
/// registration order, global before agent-scoped: the last one is authoritative.
pub type PostExecuteHook =
    Arc<dyn Fn(&GuardedCall<'_>, ToolExecutionResult) -> ToolExecutionResult + Send + Sync>;

/// An allow and/or deny list of global tool names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFilter {
    /// Only these globals stay visible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<BTreeSet<String>>,
    /// These globals are hidden.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub deny: BTreeSet<String>,
}

impl ToolFilter {
    /// Keeps only `names` visible.
    pub fn allow<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        Self {
            allow: Some(names.into_iter().map(Into::into).collect()),
            deny: BTreeSet::new(),
        }
    }

    /// Hides `names`.
    pub fn deny<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        Self {
            allow: None,
            deny: names.into_iter().map(Into::into).collect(),
        }
    }

    fn admits(&self, name: &str) -> bool {
        self.allow.as_ref().is_none_or(|allow| allow.contains(name)) && !self.deny.contains(name)
    }

    fn names(&self) -> impl Iterator<Item = &String> {
        self.allow.iter().flatten().chain(&self.deny)
    }

    fn is_empty(&self) -> bool {
        self.allow.is_none() && self.deny.is_empty()
    }
}

/// The global tool layer, shared by every agent of a runtime.
///
/// It is configuration, read at each step and rarely written, so it is a short read-write lock
/// rather than an actor; no lock is held across an `.await`.
#[derive(Default)]
pub struct ToolRegistry {
    state: RwLock<GlobalTools>,
}

#[derive(Default)]
struct GlobalTools {
    tools: Vec<Tool>,
    guards: Vec<Guard>,
    pre_execute: Vec<PreExecuteHook>,
    post_execute: Vec<PostExecuteHook>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, GlobalTools> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, GlobalTools> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The global tool `name`, if registered.
    pub fn get(&self, name: &str) -> Option<Tool> {
        self.read()
            .tools
            .iter()
            .find(|tool| tool.name() == name)
            .cloned()
    }

    /// Registers a global tool.
    ///
    /// # Errors
    /// `DUPLICATE_TOOL` when a global tool has that name.
    pub fn register(&self, tool: Tool) -> Result<()> {
        let mut state = self.write();
        if state.tools.iter().any(|t| t.name() == tool.name()) {
            return Err(duplicate(tool.name()));
        }
        state.tools.push(tool);
        Ok(())
    }

    /// Removes a global tool; returns whether it existed.
    pub fn unregister(&self, name: &str) -> bool {
        let mut state = self.write();
        let before = state.tools.len();
        state.tools.retain(|t| t.name() != name);
        state.tools.len() != before
    }

    /// Adds a global guard.
    pub fn guard(&self, guard: Guard) {
        self.write().guards.push(guard);
    }

    /// Adds a global post-execute hook.
    pub fn post_execute(&self, hook: PostExecuteHook) {
        self.write().post_execute.push(hook);
    }

    /// Adds a global pre-execute listener inside those already added (it runs after them).
    pub fn pre_execute(&self, hook: PreExecuteHook) {
        self.write().pre_execute.push(hook);
    }

    /// Adds a global pre-execute listener outside every other (it runs first): the TypeScript
    /// runtime's `prepend`.
    pub fn pre_execute_first(&self, hook: PreExecuteHook) {
        self.write().pre_execute.insert(0, hook);
    }

    fn contains(&self, name: &str) -> bool {
        self.read().tools.iter().any(|t| t.name() == name)
    }
}

fn duplicate(name: &str) -> SubagentError {
    SubagentError::new(
        ErrorCode::DuplicateTool,
        format!("tool {name:?} is already registered"),
    )
}

/// Runs `listeners[0]` with a `next` that runs the rest; the end of the chain allows.
fn waterfall(listeners: &[PreExecuteHook], call: &GuardedCall<'_>) -> PreToolDecision {
    let Some((first, rest)) = listeners.split_first() else {
        return PreToolDecision::Allow;
    };
    let next = || waterfall(rest, call);
    catch_unwind(AssertUnwindSafe(|| first(call, &next))).unwrap_or_else(|_| {
        tracing::error!(session_id = %call.agent, tool = call.name, "a pre-execute listener panicked");
        PreToolDecision::Deny {
            reason: "a pre-execute listener failed".to_owned(),
        }
    })
}

/// One agent's tool layer: its own tools, masks over the globals, its pre-execute listeners
/// and its guards.
#[derive(Default, Clone)]
pub struct ToolLayer {
    tools: Vec<Tool>,
    masks: Vec<ToolFilter>,
    pre_execute: Vec<PreExecuteHook>,
    guards: Vec<Guard>,
    post_execute: Vec<PostExecuteHook>,
}

impl std::fmt::Debug for ToolLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolLayer")
            .field("tools", &self.tools)
            .field("masks", &self.masks)
            .finish_non_exhaustive()
    }
}

impl ToolLayer {
    /// Registers an agent-scoped tool; it shadows a global tool of the same name.
    ///
    /// # Errors
    /// `DUPLICATE_TOOL` when this layer already has that name.
    pub fn register(&mut self, tool: Tool) -> Result<()> {
        if self.tools.iter().any(|t| t.name() == tool.name()) {
            return Err(duplicate(tool.name()));
        }
        self.tools.push(tool);
        Ok(())
    }

    /// Masks global tools for this agent.
    ///
    /// # Errors
    /// `INVALID_RESTRICTION` for an empty filter or a name of this layer's own tools;
    /// `UNKNOWN_TOOL` for a name no global tool has. A failed restriction changes nothing, so
    /// the caller's transaction can roll back cleanly.
    pub fn restrict(&mut self, globals: &ToolRegistry, filter: ToolFilter) -> Result<()> {
        if filter.is_empty() {
            return Err(SubagentError::new(
                ErrorCode::InvalidRestriction,
                "a tool restriction needs allow or deny",
            ));
        }
        for name in filter.names() {
            if self.tools.iter().any(|t| t.name() == name) {
                return Err(SubagentError::new(
                    ErrorCode::InvalidRestriction,
                    format!("tool {name:?} is agent-scoped; restrictions mask global tools only"),
                ));
            }
            if !globals.contains(name) {
                return Err(SubagentError::new(
                    ErrorCode::UnknownTool,
                    format!("unknown global tool \"{name}\" in a tool restriction"),
                ));
            }
        }
        self.masks.push(filter);
        Ok(())
    }

    /// Adds an agent-scoped guard.
    pub fn guard(&mut self, guard: Guard) {
        self.guards.push(guard);
    }

    /// Adds an agent-scoped post-execute hook.
    pub fn post_execute(&mut self, hook: PostExecuteHook) {
        self.post_execute.push(hook);
    }

    /// Adds an agent-scoped pre-execute listener; it sees only this agent's calls and runs
    /// inside the global listeners.
    pub fn pre_execute(&mut self, hook: PreExecuteHook) {
        self.pre_execute.push(hook);
    }

    /// Runs the pre-execute waterfall (global listeners outermost), then — after an allow —
    /// the guards. Returns the refusal reason, if any. A listener that panics refuses the call.
    pub fn decide(&self, globals: &ToolRegistry, call: &GuardedCall<'_>) -> Option<String> {
        let listeners: Vec<PreExecuteHook> = globals
            .read()
            .pre_execute
            .iter()
            .chain(&self.pre_execute)
            .cloned()
            .collect();
        match waterfall(&listeners, call) {
            PreToolDecision::Allow => self.check_guards(globals, call),
            PreToolDecision::Deny { reason } => Some(reason),
            PreToolDecision::Ask { reason } => Some(match reason {
                Some(reason) => {
                    format!("approval required, and no approval service exists: {reason}")
                }
                None => "approval required, and no approval service exists".to_owned(),
            }),
        }
    }

    /// Runs the post-execute hooks over a ran call's result. A hook that panics blocks the
    /// result: a broken policy must not let a result through.
    pub fn apply_post_execute(
        &self,
        globals: &ToolRegistry,
        call: &GuardedCall<'_>,
        mut result: ToolExecutionResult,
    ) -> ToolExecutionResult {
        let global_hooks = globals.read().post_execute.clone();
        for hook in global_hooks.iter().chain(&self.post_execute) {
            let current = result;
            let fallback = ToolExecutionResult::failure(
                call.name,
                "POST_EXECUTE_FAILED",
                "a post-execute hook failed",
            );
            result = catch_unwind(AssertUnwindSafe(|| hook(call, current))).unwrap_or_else(|_| {
                tracing::error!(session_id = %call.agent, tool = call.name, "a post-execute hook panicked");
                fallback
            });
        }
        result
    }

    fn admits_global(&self, name: &str) -> bool {
        self.masks.iter().all(|mask| mask.admits(name))
    }

    /// The tools this agent sees, sorted by name: its own, and the admitted globals it does not
    /// shadow.
    pub fn visible(&self, globals: &ToolRegistry) -> Vec<Tool> {
        let state = globals.read();
        let mut tools: Vec<Tool> = self
            .tools
            .iter()
            .filter(|tool| !tool.is_revoked())
            .cloned()
            .collect();
        tools.extend(
            state
                .tools
                .iter()
                .filter(|g| {
                    self.admits_global(g.name()) && !self.tools.iter().any(|t| t.name() == g.name())
                })
                .cloned(),
        );
        tools.sort_by(|a, b| a.name().cmp(b.name()));
        tools
    }

    /// The tool `name` as this agent sees it.
    pub fn get(&self, globals: &ToolRegistry, name: &str) -> Option<Tool> {
        if let Some(tool) = self.tools.iter().find(|t| t.name() == name) {
            return (!tool.is_revoked()).then(|| tool.clone());
        }
        if !self.admits_global(name) {
            return None;
        }
        globals.get(name)
    }

    /// The first refusal among the global and agent guards.
    /// A guard that panics refuses the call: a broken policy must not let work through.
    pub fn check_guards(&self, globals: &ToolRegistry, call: &GuardedCall<'_>) -> Option<String> {
        let global_guards = globals.read().guards.clone();
        global_guards.iter().chain(&self.guards).find_map(|guard| {
            catch_unwind(AssertUnwindSafe(|| guard(call))).unwrap_or_else(|_| {
                tracing::error!(session_id = %call.agent, tool = call.name, "a tool guard panicked");
                Some("a tool guard failed".to_owned())
            })
        })
    }
}

/// The final result of one call, as the driver records it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolExecutionResult {
    /// Whether the call failed.
    pub is_error: bool,
    /// What the model sees.
    pub content: Vec<ContentBlock>,
    /// Set on failure.
    pub error: Option<crate::session::ToolErrorInfo>,
    /// A success that ends the turn.
    pub concludes_turn: bool,
    /// Context messages for the next step.
    pub additional_contexts: Vec<Message>,
    /// The structured value of a success.
    pub value: Option<Value>,
    /// Metadata kept in the log.
    pub meta: Option<Value>,
}

impl ToolExecutionResult {
    /// A failure: content `Error: <message>`.
    pub fn failure(name: &str, code: &str, message: &str) -> Self {
        Self {
            is_error: true,
            content: vec![ContentBlock::text(format!("Error: {message}"))],
            error: Some(crate::session::ToolErrorInfo {
                name: name.to_owned(),
                code: code.to_owned(),
            }),
            concludes_turn: false,
            additional_contexts: Vec::new(),
            value: None,
            meta: None,
        }
    }

    fn success(output: ToolOutput, concludes_turn: bool) -> Self {
        Self {
            is_error: false,
            content: output.content,
            error: None,
            concludes_turn,
            additional_contexts: output.additional_contexts,
            value: output.value,
            meta: output.meta,
        }
    }
}

/// Parses the model's raw argument text: `""` is `{}`, invalid JSON passes through as a string.
pub fn parse_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

/// The result code of a call that never started because the turn was cancelled first.
pub const ABORTED_BEFORE_DISPATCH: &str = "ABORTED_BEFORE_DISPATCH";

/// Runs one call to completion: lookup, the pre-execute waterfall, guards, body, post-execute
/// hooks.
///
/// A call whose turn is already cancelled never starts (`ABORTED_BEFORE_DISPATCH`); a
/// cancellation while the body runs yields `ABORTED` (the body lost the race to the cancel); a
/// body that panics yields `TOOL_PANICKED`. None of them unwinds into the caller.
pub async fn execute(
    layer: &ToolLayer,
    globals: &ToolRegistry,
    ctx: ToolCtx,
    raw_arguments: &str,
) -> ToolExecutionResult {
    let name = ctx.name.clone();
    if ctx.cancel.is_cancelled() {
        return ToolExecutionResult::failure(
            &name,
            ABORTED_BEFORE_DISPATCH,
            "tool call aborted before dispatch",
        );
    }
    let Some(tool) = layer.get(globals, &name) else {
        return ToolExecutionResult::failure(
            &name,
            ErrorCode::UnknownTool.as_str(),
            &format!("unknown tool \"{name}\""),
        );
    };
    let arguments = parse_arguments(raw_arguments);
    let call = GuardedCall {
        agent: ctx.agent,
        name: &name,
        arguments: &arguments,
    };
    if let Some(reason) = layer.decide(globals, &call) {
        return ToolExecutionResult::failure(&name, "TOOL_DENIED", &reason);
    }
    let cancel = ctx.cancel.clone();
    let body = AssertUnwindSafe(async { (tool.body)(arguments.clone(), ctx.clone()).await })
        .catch_unwind();
    let ran = tokio::select! {
        biased;
        outcome = body => match outcome {
            Ok(Ok(output)) => ToolExecutionResult::success(output, ctx.concluded()),
            Ok(Err(error)) => ToolExecutionResult::failure(&name, &error.code, &error.message),
            Err(_) => {
                tracing::error!(session_id = %ctx.agent, tool = %name, "a tool body panicked");
                ToolExecutionResult::failure(&name, "TOOL_PANICKED", "the tool failed unexpectedly")
            }
        },
        () = cancel.cancelled() => {
            return ToolExecutionResult::failure(&name, "ABORTED", "tool call aborted");
        }
    };
    let call = GuardedCall {
        agent: ctx.agent,
        name: &name,
        arguments: &arguments,
    };
    layer.apply_post_execute(globals, &call, ran)
}
