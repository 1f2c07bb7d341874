//! Provides the in-process one-shot driver shared by the spawn and fork providers:
//! `start_in_process_run` creates, publishes and drives one child agent in this runtime, and
//! [`completed_turn_prefix`] cuts the balanced seed a fork child inherits.
//!
//! # A run, step by step
//! 1. Check `max_depth`; a request already cancelled fails before anything exists.
//! 2. Resolve the child's depth (parent depth + 1, checked against the cap).
//! 3. Capture the delegated policy synchronously, then create the child in one transaction:
//!    header (cwd, parent, origin `subagent`, depth, seed length), options (the parent's route
//!    and token cap, overridden by the request, stamped with the depth), and a setup that appends
//!    the policy events, adds the delegation context, the persona, the tool restriction, the
//!    structured-output capture, and the hook that appends the descriptor inside the first turn.
//!    Any failure — or the request's token firing — rolls the creation back.
//! 4. Once published, one task drives the run: the request's token now cancels the child's work
//!    (cause `parent`); it is re-checked when the task first runs, so a cancel in between is
//!    never lost. The prompt goes in as a follow-up, and the result is read once the child is
//!    idle.
//! 5. The result folds the child's own events (after the seed): output, stop reason (one-shot
//!    table), `aborted` when the owner cancelled before completion, and the structured value —
//!    a clean finish without a capture is `error` (no re-prompt).
//!
//! The run adds no final durability checkpoint: disposal drains the child's log into the store
//! without forcing it to disk.

use std::borrow::Borrow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::FutureExt;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::actors::agent::{AgentRef, InboxPolicy};
use crate::content::{ContentBlock, MessageSource};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::{
    interpolate_prompt, AgentEnv, AgentOptions, AgentScope, DelegatedPolicy, PromptSection,
};
use crate::host::{AgentHandle, CreateAgent};
use crate::seam::depth::{check_max_depth, resolve_child_depth};
use crate::seam::run::LocalWiring;
use crate::seam::run_outcome::{RunOutcome, SettleGuard};
use crate::seam::{ChildAgentOptions, ResolvedSubagentStartRequest, SubagentResult, SubagentRun};
use crate::session::log::CreationCommit;
use crate::session::{
    fold_consumed_work, one_shot_stop_reason, AssistantOutputFold, CancelCause, EventKind,
    EventList, Seed, SessionEvent, SessionLog, SessionLogView,
};
use crate::stop_reason::StopReason;
use crate::tools::structured_output::StructuredCapture;
use crate::tools::ToolFilter;

/// The persona section's name: an agent's persona shadows the deployment persona.
pub const PERSONA_SECTION: &str = "deployment:persona";

/// The delegation statement's context name and order.
pub const DELEGATION_CONTEXT: &str = "subagent:delegation";
const DELEGATION_ORDER: f64 = 120.0;

/// The balanced prefix of `log` a fork child inherits: every event through the last `turn/end`
/// (the in-flight turn is left out), or nothing before the first completed turn. Shared with
/// the parent's log and stored by reference (see [`Seed::completed_turns_of`]).
pub fn completed_turn_prefix(log: &SessionLogView) -> Seed {
    Seed::completed_turns_of(log.inner())
}

/// The child's model options: the parent's route and token cap, overridden by the request,
/// stamped with the child's depth.
pub(crate) fn child_options(
    parent: &AgentRef,
    overrides: Option<ChildAgentOptions>,
    depth: u64,
) -> AgentOptions {
    let inherited = parent.options();
    let overrides = overrides.unwrap_or_default();
    AgentOptions {
        provider: overrides.provider.or_else(|| inherited.provider.clone()),
        model: overrides.model.unwrap_or_else(|| inherited.model.clone()),
        max_tokens: overrides.max_tokens.or(inherited.max_tokens),
        subagent_depth: depth,
        // A one-shot child adds no durability checkpoint of its own, whatever its parent does.
        flush: crate::host::FlushPolicy::default(),
        // A child's log is short-lived: it is not paged out, whatever its parent does.
        resident_events: None,
    }
}

/// The policy `parent` hands a child: the one captured when the delegation was called, else
/// the deployment's answer now.
pub(crate) fn delegated_policy(
    parent: &AgentRef,
    captured: Option<DelegatedPolicy>,
) -> DelegatedPolicy {
    captured
        .or_else(|| {
            parent
                .agents()
                .env()
                .delegation
                .as_ref()
                .map(|policy| policy.capture(parent.id()))
        })
        .unwrap_or_default()
}

/// The statement every delegated child sees as runtime context (after its task, as the
/// reference orders them): what being delegated means for what it may do.
pub const DELEGATION_STATEMENT: &str = "You are a delegated subagent: your permission scope was \
     fixed when you were started and cannot be widened from inside this session \u{2014} operations \
     that require approval are rejected automatically. When the task needs access beyond that \
     scope, do not retry the denied operation; state the limitation in your reply so the \
     delegating agent can handle it.";

/// The sandbox and approval sentences, as their own contexts before the delegation statement.
const SANDBOX_CONTEXT: (&str, f64) = ("sandbox:policy", 110.0);
const APPROVAL_CONTEXT: (&str, f64) = ("approval:policy", 115.0);

/// The runtime contexts a delegated child carries: its sandbox mode and approval pin (when
/// the policy has them) and the delegation statement.
fn delegation_contexts(policy: &DelegatedPolicy) -> Vec<PromptSection> {
    let mut contexts = Vec::new();
    if let Some(mode) = &policy.sandbox_mode {
        contexts.push(PromptSection::new(
            SANDBOX_CONTEXT.0,
            SANDBOX_CONTEXT.1,
            format!(
                "Current DSH file policy: {mode}. Any available operation outside it is refused."
            ),
        ));
    }
    if policy.approval_pinned {
        contexts.push(PromptSection::new(
            APPROVAL_CONTEXT.0,
            APPROVAL_CONTEXT.1,
            "Approval prompts are disabled in this session: actions that require approval are \
             rejected automatically \u{2014} do not request sandbox escalation.",
        ));
    }
    contexts.push(PromptSection::new(
        DELEGATION_CONTEXT,
        DELEGATION_ORDER,
        DELEGATION_STATEMENT,
    ));
    contexts
}

/// The log event recording a session's sandbox mode (the last one is in force).
const SANDBOX_MODE_EVENT: &str = "sandbox/mode";
/// The log event recording a session's approval policy (the last one is in force).
const APPROVAL_POLICY_EVENT: &str = "approval/policy";

/// The policy events a child records at creation, after any seed.
fn policy_events(policy: &DelegatedPolicy) -> Vec<EventKind> {
    let mut events = Vec::new();
    if let Some(mode) = &policy.sandbox_mode {
        events.push(EventKind::Extension {
            event_type: SANDBOX_MODE_EVENT.into(),
            data: json!({"mode": mode, "source": "delegation"}),
        });
    }
    if policy.approval_pinned {
        events.push(EventKind::Extension {
            event_type: APPROVAL_POLICY_EVENT.into(),
            data: json!({"policy": "never", "source": "delegation"}),
        });
    }
    events
}

/// The policy a child's log records now: the last `sandbox/mode` and the last
/// `approval/policy` win, whoever recorded them, so a switch the child made after its
/// delegation wins over the snapshot (and a fork prefix's stale mode loses to both).
pub(crate) fn recorded_policy<E: Borrow<SessionEvent>>(events: &[E]) -> DelegatedPolicy {
    let mut policy = DelegatedPolicy::default();
    for event in events {
        if let EventKind::Extension { event_type, data } = &event.borrow().kind {
            match &**event_type {
                SANDBOX_MODE_EVENT => {
                    policy.sandbox_mode = data["mode"].as_str().map(str::to_owned);
                }
                APPROVAL_POLICY_EVENT => {
                    policy.approval_pinned = data["policy"].as_str() == Some("never");
                }
                _ => {}
            }
        }
    }
    policy
}

/// How a delegated child is composed, for one-shot and continuable children alike: the
/// delegated policy (recorded as events on creation, shown as runtime context), the persona in
/// the deployment persona's place, and the tool restriction. A child never copies its parent's
/// registrations: it gets a flat scope of its own.
pub(crate) struct ChildComposition {
    /// The policy to record at creation; `None` on a cold resume, which never re-records it.
    record: Option<DelegatedPolicy>,
    contexts: Vec<PromptSection>,
    persona: Option<PromptSection>,
    tool_filter: Option<ToolFilter>,
}

impl ChildComposition {
    /// Interpolates `persona` against the deployment's prompt variables.
    ///
    /// # Errors
    /// `UNKNOWN_PROMPT_VARIABLE`.
    pub(crate) fn new(
        env: &AgentEnv,
        record: Option<DelegatedPolicy>,
        persona: Option<&str>,
        tool_filter: Option<ToolFilter>,
    ) -> Result<Self> {
        // The persona takes the deployment persona's place in the prompt.
        let persona_order = env
            .sections
            .iter()
            .find(|section| section.name == PERSONA_SECTION)
            .map_or(0.0, |section| section.order);
        let persona = persona
            .map(|template| interpolate_prompt(template, &env.variables))
            .transpose()?
            .map(|text| PromptSection::new(PERSONA_SECTION, persona_order, text));
        Ok(Self {
            contexts: delegation_contexts(record.as_ref().unwrap_or(&DelegatedPolicy::default())),
            record,
            persona,
            tool_filter,
        })
    }

    /// A resumed child's composition: nothing is recorded again (the parent is never
    /// re-captured), and the runtime context states the policy its log records now.
    ///
    /// # Errors
    /// As [`ChildComposition::new`].
    pub(crate) fn resumed(
        env: &AgentEnv,
        recorded: &DelegatedPolicy,
        persona: Option<&str>,
        tool_filter: Option<ToolFilter>,
    ) -> Result<Self> {
        let mut composition = Self::new(env, None, persona, tool_filter)?;
        composition.contexts = delegation_contexts(recorded);
        Ok(composition)
    }

    /// Records the policy (fresh children only) and composes the scope.
    ///
    /// # Errors
    /// `UNKNOWN_TOOL` for a filter naming an unknown tool; a journal error.
    pub(crate) fn apply(self, scope: &mut AgentScope, log: &SessionLog) -> Result<()> {
        if let Some(policy) = &self.record {
            for event in policy_events(policy) {
                log.append(event)?;
            }
        }
        for context in self.contexts {
            scope.context(context);
        }
        if let Some(persona) = self.persona {
            scope.section(persona);
        }
        if let Some(filter) = self.tool_filter {
            scope.restrict(filter)?;
        }
        Ok(())
    }
}

/// Where a one-shot child's agent runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Where the runtime places agents: on the next worker, or on the calling arbiter without
    /// a worker pool.
    Runtime,
    /// On the arbiter running the start (already a worker), beside the task that drives it.
    Here,
}

/// Creates, publishes and drives one child for a resolved one-shot request, seeded with `seed`
/// (a fork prefix) or fresh, with its agent at `placement`.
///
/// The request is checked and the creation prepared when this is called (with
/// [`Placement::Here`], on the arbiter the child will live on); the returned future publishes
/// the child and wires its run. It keeps no second copy of the request beside the creation's,
/// as an `async fn` would: the future is allocated and moved once per child.
///
/// # Errors
/// Before publication only, with nothing left behind: `ABORTED_BEFORE_PUBLICATION`,
/// `INVALID_ARGS` (an empty prompt), `INVALID_MAX_DEPTH`, `INVALID_SUBAGENT_DEPTH`, `DEPTH_OVERFLOW`, `DEPTH_EXCEEDED`,
/// `UNKNOWN_TOOL` (tool filter), `UNKNOWN_PROMPT_VARIABLE` (persona), store errors.
pub(crate) fn start_in_process_run(
    resolved: ResolvedSubagentStartRequest,
    seed: Seed,
    placement: Placement,
) -> impl std::future::Future<Output = Result<SubagentRun>> + Send + 'static {
    match prepare_in_process_run(resolved, seed, placement) {
        Ok((creation, wiring)) => futures::future::Either::Left(creation.map(move |created| {
            let handle = created.map_err(|error| {
                if error.code() == ErrorCode::Cancelled {
                    aborted_before_publication()
                } else {
                    error
                }
            })?;
            tracing::debug!(parent = %wiring.parent, child_id = %handle.agent().id(), "one-shot child published");
            Ok(drive_published_run(handle, wiring))
        })),
        Err(error) => futures::future::Either::Right(std::future::ready(Err(error))),
    }
}

/// What a published one-shot child's run is wired with, beside its handle.
struct RunWiring {
    parent: crate::ids::SessionId,
    prompt: Vec<ContentBlock>,
    token: CancellationToken,
    boundary: u64,
    capture: Arc<std::sync::OnceLock<StructuredCapture>>,
    /// On a worker, the run's disposal goes back to it: the release talks to the agent, its
    /// log and its writer, which all live there, and the caller's thread only waits.
    home: Option<actix::ArbiterHandle>,
}

/// Checks a one-shot request and prepares its child's creation: the depth, the delegated
/// policy, the composition and the setup that records the descriptor in the first turn.
fn prepare_in_process_run(
    resolved: ResolvedSubagentStartRequest,
    seed: Seed,
    placement: Placement,
) -> Result<(
    impl std::future::Future<Output = Result<AgentHandle>> + Send + 'static,
    RunWiring,
)> {
    let parent = &resolved.request.parent;
    let token = resolved.request.cancel.clone();
    check_max_depth(resolved.request.max_depth)?;
    if token.is_cancelled() {
        return Err(aborted_before_publication());
    }
    crate::content::require_content("a start prompt", &resolved.request.prompt)?;
    let depth = resolve_child_depth(parent, resolved.request.max_depth)?;
    // A disposed (or replaced) parent's actor has stopped.
    if !parent.is_alive() {
        return Err(SubagentError::new(
            ErrorCode::AgentDisposed,
            format!(
                "parent agent {} is not live (inactive context)",
                parent.id()
            ),
        ));
    }
    let env = Arc::clone(parent.agents().env());
    let policy = delegated_policy(parent, resolved.request.policy.clone());
    let composition = ChildComposition::new(
        &env,
        Some(policy),
        resolved.request.persona.as_deref(),
        resolved.request.tool_filter.clone(),
    )?;
    let options = child_options(parent, resolved.request.agent_options.clone(), depth);
    let boundary = u64::try_from(seed.len()).map_err(|_| SubagentError::bug("seed too long"))?;
    let capture: Arc<std::sync::OnceLock<StructuredCapture>> = Arc::default();
    let setup_slot = Arc::clone(&capture);
    let ResolvedSubagentStartRequest {
        request,
        descriptor,
        output_schema,
    } = resolved;
    let setup = move |scope: &mut AgentScope,
                      log: &SessionLog|
          -> Result<Option<crate::host::SetupCommit>> {
        composition.apply(scope, log)?;
        if let Some(schema) = output_schema {
            // The slot is fresh per run, so it is always empty here.
            let _ = setup_slot.set(StructuredCapture::attach(scope, schema)?);
        }
        // Taken by the first step, not cloned: a one-shot run's descriptor is a JSON map, and
        // a deep copy of it cost seven allocations a run.
        let event = std::sync::Mutex::new(Some(descriptor.event()));
        scope.on_step_entered(Arc::new(move |step| {
            let first = event
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(event) = first {
                if let Err(error) = step.log.append(event) {
                    tracing::error!(session_id = %step.agent, %error, "could not record the descriptor");
                }
                // The child is stored from here, with the descriptor that names it: a child
                // cut short before its first step (refused, cancelled, or by a crash) leaves
                // nothing in the store to be listed as damaged.
                step.log.commit_creation();
            }
        }));
        Ok(None)
    };
    let parent = request.parent;
    let mut create = CreateAgent::new()
        .owned_by(&parent, depth)
        .seed(seed, boundary)
        .options(options)
        .setup(setup)
        .cancel(token.clone())
        .short_lived()
        .stored_on(CreationCommit::Explicit);
    if let Some(cwd) = parent.header().cwd {
        create = create.cwd(cwd);
    }
    if placement == Placement::Here {
        create = create.on_current_arbiter();
    }
    let creation = parent.agents().create(create);
    Ok((
        creation,
        RunWiring {
            parent: parent.id(),
            prompt: request.prompt,
            token,
            boundary,
            capture,
            home: (placement == Placement::Here).then(actix::Arbiter::current),
        },
    ))
}

fn aborted_before_publication() -> SubagentError {
    SubagentError::new(
        ErrorCode::AbortedBeforePublication,
        "subagent request was aborted before child publication",
    )
}

/// Wires a published child into a run: one task sends the prompt, watches the request's
/// token, and reads the result; the disposal releases the child and tells the store, on
/// `home` (the child's worker) when given.
fn drive_published_run(handle: AgentHandle, wiring: RunWiring) -> SubagentRun {
    let RunWiring {
        prompt,
        token,
        boundary,
        capture,
        home,
        ..
    } = wiring;
    let capture = capture.get().cloned();
    let child = handle.agent().clone();
    let cancelled = Arc::new(AtomicBool::new(false));
    let outcome = Arc::new(RunOutcome::new());
    let work = {
        // The owning handle, not the reference: its strong address reaches the actor without
        // upgrading (which allocates a sender) at each message.
        let owned = handle.clone();
        let cancelled = Arc::clone(&cancelled);
        let work = async move {
            let child = owned.agent();
            // The owner has cancelled once the token fired or the run is being disposed.
            let owner_cancelled = || cancelled.load(Ordering::SeqCst) || token.is_cancelled();
            let turn = async {
                // Re-checked here, on the task's first poll, so a cancel that landed between
                // publication and now ends the run `aborted` without sending the prompt.
                if !owner_cancelled() {
                    // The prompt and the wait for the child to be idle again, in one message.
                    let sent = child
                        .followup_until_idle(owned.actor(), prompt, MessageSource::User)
                        .await;
                    match sent {
                        // A closed wait means the actor stopped: it is idle for good.
                        Ok(idle) => {
                            let _ = idle.await;
                        }
                        // A child disposed under us was cancelled, not broken.
                        Err(error) if !owner_cancelled() => return Err(error),
                        Err(_) => child.when_idle().await,
                    }
                }
                Ok(())
            };
            let mut turn = std::pin::pin!(turn);
            // The turn is polled first, so a prompt it sends is in the child's mailbox before
            // a cancel sent here: the cancel then ends that very turn.
            let finished = tokio::select! {
                biased;
                outcome = &mut turn => Some(outcome),
                () = token.cancelled() => None,
            };
            match finished {
                Some(outcome) => outcome?,
                None => {
                    cancelled.store(true, Ordering::SeqCst);
                    // A child already gone has nothing left to cancel.
                    // Boxed: the cold path should not size the task every run allocates.
                    let _ = Box::pin(child.cancel(CancelCause::Parent, InboxPolicy::Discard)).await;
                    turn.await?;
                }
            }
            let cancelled = owner_cancelled();
            Ok(child.log().with_events(|events| {
                let own = usize::try_from(boundary).unwrap_or(usize::MAX);
                read_result(events, own, cancelled, capture.as_ref())
            }))
        };
        // Settles even when `work` panics or the task is dropped at shutdown. A combinator
        // rather than an `async` block, which would keep a second copy of `work` beside the
        // one it awaits.
        let guard = SettleGuard::new(Arc::clone(&outcome));
        work.map(move |result| guard.settle(result))
    };
    // Detached: the run's outcome is read from its cell, not from the task's join handle.
    drop(tokio::spawn(tracing::Instrument::in_current_span(work)));
    let settled = Arc::clone(&outcome);
    let id = child.id();
    let store = child.agents().env().store.clone();
    let wiring = LocalWiring {
        outcome,
        home: home.clone(),
    };
    SubagentRun::local(child, wiring, move || {
        let release = async move {
            cancelled.store(true, Ordering::SeqCst);
            let released = handle.dispose().await;
            // Disposal returns once the result is settled too; only a release failure is
            // reported here (a failed result stays on the result channel).
            settled.wait().await;
            if released.is_ok() {
                if let Some(store) = store {
                    store.one_shot_disposed(id);
                }
            }
            released
        };
        match home {
            Some(worker) => Box::pin(on_worker(worker, release)),
            None => Box::pin(release),
        }
    })
}

/// Runs `work` to completion on `worker` and answers its outcome; the work finishes even when
/// the caller stops waiting. A stopped worker (the runtime was shut down) runs it here instead:
/// disposal stays harmless in every configuration, and a child shutdown already released
/// answers its memoized outcome.
///
/// # Errors
/// `work`'s own.
async fn on_worker<W>(worker: actix::ArbiterHandle, work: W) -> Result<()>
where
    W: std::future::Future<Output = Result<()>> + Send + 'static,
{
    // The work waits in a slot the worker takes it from, so that a worker that stopped before
    // taking it leaves it to run here.
    let slot = Arc::new(std::sync::Mutex::new(Some(work)));
    let take = |slot: &std::sync::Mutex<Option<W>>| {
        slot.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    };
    let (done, outcome) = tokio::sync::oneshot::channel();
    let on_the_worker = Arc::clone(&slot);
    worker.spawn(async move {
        if let Some(work) = take(&on_the_worker) {
            let _ = done.send(work.await);
        }
    });
    match outcome.await {
        Ok(outcome) => outcome,
        Err(_) => match take(&slot) {
            Some(work) => work.await,
            // Taken and dropped mid-way: the worker stopped under it, which happens only once
            // the runtime's shutdown released every agent on it.
            None => {
                tracing::debug!("a run's disposal was cut short by its worker stopping");
                Ok(())
            }
        },
    }
}

/// Reads a one-shot result from the child's own events: `events` from `own` on.
fn read_result(
    events: &EventList,
    own: usize,
    cancelled: bool,
    capture: Option<&StructuredCapture>,
) -> SubagentResult {
    let work = fold_consumed_work(events.iter_from(own));
    let mut stop_reason = one_shot_stop_reason(work.end.as_ref());
    if cancelled && stop_reason != StopReason::Completed {
        stop_reason = StopReason::Aborted;
    }
    let mut fold = AssistantOutputFold::new();
    for event in events.iter_from(own) {
        fold.push_event(event);
    }
    let mut structured = None;
    if let Some(capture) = capture {
        structured = capture.captured();
        if structured.is_none() && stop_reason == StopReason::Completed {
            stop_reason = if cancelled {
                StopReason::Aborted
            } else {
                StopReason::Error
            };
        }
    }
    SubagentResult {
        output: fold.collect().unwrap_or_default(),
        structured,
        stop_reason,
        diagnostic: None,
    }
}
