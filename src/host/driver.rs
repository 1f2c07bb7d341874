//! Provides the turn driver: the async loop that runs one turn of an agent.
//!
//! A turn (the numbers follow the TypeScript runtime's algorithm):
//! 1. `turn/start` and the first claim are done by the agent actor before the driver starts.
//! 2. Pre-step: run the pre-step waterfall over the claimed messages.
//! 3. Early exits: `reject` ends the turn `blocked`; a first step with no messages ends it
//!    `completed` with no step; no messages after an ending stops the loop.
//! 4. `step/start`, then one `user/message` per entered message.
//! 5. The step: request → streamed `assistant/chunk`s → `assistant/message` → tool calls.
//! 6. `step/end`, always.
//! 7. The ending is updated; `max-tokens` is sticky.
//! 8. The next step claims `next-step`; an ending with nothing claimed stops the loop.
//! 9. `turn/end`: `aborted` if cancelled, `error` for a failure, otherwise the ending.
//!
//! An agent with a budget (see [`crate::host::budget`]) is charged as the turn runs: a turn that
//! opens on a spent budget ends at once, a step that reaches the token limit is the turn's last,
//! and the wall-time limit cancels the turn where it stands; each ends `budget-exhausted`.
//!
//! The driver never touches the inbox directly: it claims through [`InboxPort`], so the actor
//! stays the single owner of pending work.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use std::panic::AssertUnwindSafe;

use futures::future::{BoxFuture, FutureExt};
use futures::stream::{self, StreamExt};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::actors::agent::AgentRef;
use crate::content::{ContentBlock, Message};
use crate::error::{ErrorCode, SubagentError};
use crate::host::scope::{
    assemble_system_prompt, AgentScope, PreStep, PreStepDecision, ToolResultSeen,
};
use crate::host::{AgentEnv, AgentOptions, BudgetLimit, BudgetMeter, FlushPolicy};
use crate::ids::{CallId, SessionId};
use crate::model::{FinishReason, GenerateRequest, LlmAdapter, StreamChunk};
use crate::session::{
    interrupted_turn_closers_after, CancelCause, EventKind, History, LlmFailure, LogShape,
    SessionLog, TokenUsage, TurnEndReason,
};
use crate::tools::{self, Concurrency, ToolCtx, ToolExecutionResult};

/// How many concurrency-safe calls of one step run at once.
const MAX_PARALLEL_TOOL_CALLS: usize = 10;

/// How the driver reaches the agent's inbox.
pub(crate) trait InboxPort: Send + Sync + 'static {
    /// Claims all of `next-step` for `turn`.
    fn claim_next_step(&self, turn: u64) -> BoxFuture<'static, Vec<Message>>;
    /// Queues context messages into `next-step` without waking.
    fn queue_context(&self, messages: Vec<Message>);
}

/// A turn's cancellation: a token plus the first cause recorded.
#[derive(Debug, Clone, Default)]
pub(crate) struct TurnCancel {
    token: CancellationToken,
    cause: Arc<OnceLock<Halt>>,
}

/// Why a turn was stopped from outside its steps.
#[derive(Debug, Clone)]
enum Halt {
    /// Someone cancelled it.
    Cancelled(CancelCause),
    /// Its budget's wall time ran out.
    Exhausted(BudgetLimit),
}

impl TurnCancel {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Cancels the turn; the first cause wins.
    pub(crate) fn cancel(&self, cause: CancelCause) {
        self.halt(Halt::Cancelled(cause));
    }

    /// Stops the turn because its budget ran out; a cancel that came first still wins.
    fn exhaust(&self, limit: BudgetLimit) {
        self.halt(Halt::Exhausted(limit));
    }

    fn halt(&self, halt: Halt) {
        // A second cause is ignored on purpose: the first one is what the log records.
        let _ = self.cause.set(halt);
        self.token.cancel();
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// How a stopped turn ends: `aborted` with the first cause, or `budget-exhausted`.
    fn end_reason(&self) -> TurnEndReason {
        match self.cause.get() {
            Some(Halt::Exhausted(limit)) => TurnEndReason::BudgetExhausted { limit: *limit },
            Some(Halt::Cancelled(cause)) => TurnEndReason::Aborted {
                reason: cause.clone(),
            },
            None => TurnEndReason::Aborted {
                reason: CancelCause::User,
            },
        }
    }
}

/// Everything one turn needs.
///
/// The agent's log and options are reached through `caller`, which holds both: a held turn
/// keeps its context for its whole life, and every resident child holds a turn.
pub(crate) struct TurnContext {
    /// The agent's exact reference, handed to its tool calls.
    pub caller: AgentRef,
    pub env: Arc<AgentEnv>,
    pub scope: Arc<AgentScope>,
    pub cancel: TurnCancel,
    pub inbox: Arc<dyn InboxPort>,
    /// The agent's budget, when it has one.
    pub budget: Option<BudgetMeter>,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Completed,
    MaxTokens,
    Blocked,
    /// The budget ran out; the turn ends here.
    Exhausted(BudgetLimit),
}

/// Why a turn stopped early. The failure is boxed: every step's outcome is a `Result` with
/// this error, and a held turn's state keeps room for one.
enum Fault {
    Aborted,
    Failed(Box<LlmFailure>),
}

impl Fault {
    fn failed(failure: LlmFailure) -> Self {
        Self::Failed(Box::new(failure))
    }
}

impl TurnContext {
    /// The agent's session.
    pub(crate) fn agent(&self) -> SessionId {
        self.caller.id()
    }

    /// The agent's log.
    fn log(&self) -> &SessionLog {
        self.caller.log().inner()
    }

    /// The agent's options.
    fn options(&self) -> &AgentOptions {
        self.caller.options()
    }

    fn append(&self, kind: EventKind) -> Result<u64, Fault> {
        self.append_with_sources(kind, Vec::new())
    }

    fn append_with_sources(&self, kind: EventKind, sources: Vec<u64>) -> Result<u64, Fault> {
        self.check_fault()?;
        self.log()
            .append_with_sources(kind, sources)
            .map_err(|error| Fault::failed(LlmFailure::new("UNKNOWN", error.to_string())))
    }

    /// A faulted log ends the turn: nothing more it does could be made durable.
    fn check_fault(&self) -> Result<(), Fault> {
        match self.log().is_faulted() {
            true => Err(Fault::failed(self.fault_failure())),
            false => Ok(()),
        }
    }

    fn fault_failure(&self) -> LlmFailure {
        let error = self.log().fault();
        let (code, message) = error.map_or_else(
            || ("STORE_IO".to_owned(), "a durable write failed".to_owned()),
            |error| (error.code().as_str().to_owned(), error.message().to_owned()),
        );
        LlmFailure::new(
            code,
            format!("the session could not be persisted: {message}"),
        )
    }

    /// Waits for room in the write-behind queue (backpressure); a fault ends the turn.
    async fn reserve(&self) -> Result<(), Fault> {
        if self.log().has_room() {
            return Ok(());
        }
        // Boxed: the queue is rarely full, and a held turn's state should not carry the wait.
        Box::pin(self.log().reserve())
            .await
            .map_err(|_| Fault::failed(self.fault_failure()))
    }
}

/// Runs turn `turn`, which the actor opened with `claimed`, and returns how it ended (after
/// appending `turn/end`).
///
/// Whatever happens inside — a fault, a refused append, even a panic in a hook or in this
/// crate — the turn is closed: open tool calls get results, an open step gets `step/end`, so the
/// log stays balanced and the agent can run its next turn.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in the turn's state"
)]
pub(crate) fn run_turn(
    ctx: TurnContext,
    turn: u64,
    claimed: Vec<Message>,
) -> impl Future<Output = TurnEndReason> + 'static {
    // Not `async fn`s, this and the driver functions it nests: an `async fn` keeps its
    // arguments twice in its state (captured, and again as the body's locals), and every held
    // turn carries all of them. The turn owns its context, so no wrapper holds it beside them.
    async move {
        let ctx = &ctx;
        let started = Instant::now();
        let outcome = match ctx.budget.as_ref().and_then(BudgetMeter::exhausted) {
            // Opened on a spent budget: the claimed work ends here, before any step.
            Some(limit) => Ok(Some(Ending::Exhausted(limit))),
            None => AssertUnwindSafe(drive_within_budget(ctx, turn, claimed))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    tracing::error!(session_id = %ctx.agent(), turn, "the turn driver panicked");
                    Err(Fault::failed(LlmFailure::new(
                        "UNKNOWN",
                        "the turn driver panicked",
                    )))
                }),
        };
        if let Some(meter) = &ctx.budget {
            meter.charge_wall_time(started.elapsed());
        }
        let reason = match outcome {
            // A faulted log ends the turn with the fault, whatever else happened.
            _ if ctx.log().is_faulted() => TurnEndReason::Error {
                error: ctx.fault_failure(),
            },
            // A failure that follows a cancel is the cancel's doing.
            Err(Fault::Aborted | Fault::Failed(_)) if ctx.cancel.is_cancelled() => {
                ctx.cancel.end_reason()
            }
            Err(Fault::Aborted) => ctx.cancel.end_reason(),
            Err(Fault::Failed(error)) => TurnEndReason::Error { error: *error },
            Ok(Some(Ending::Exhausted(limit))) => TurnEndReason::BudgetExhausted { limit },
            Ok(Some(Ending::MaxTokens)) => TurnEndReason::MaxTokens,
            Ok(Some(Ending::Blocked)) => TurnEndReason::Blocked,
            Ok(Some(Ending::Completed) | None) => TurnEndReason::Completed,
        };
        close_turn(ctx, turn, reason.clone());
        reason
    }
}

/// Appends what closes the turn: results for open calls and `step/end` if a fault left them
/// open (the crash-repair closers, minus their `turn/end`), then `turn/end` with `reason`.
fn close_turn(ctx: &TurnContext, turn: u64, reason: TurnEndReason) {
    let dangling = if ctx.log().has_open_step() {
        // From the open turn's start on: what came before is settled (and may be paged out).
        ctx.log().with_events(|events| {
            let start = events
                .iter()
                .rev()
                .find(|event| matches!(event.kind, EventKind::TurnStart { turn: open } if open == turn))
                .map_or(0, |event| usize::try_from(event.seq).unwrap_or(usize::MAX));
            interrupted_turn_closers_after(
                LogShape::after_turn(turn.saturating_sub(1)),
                events.iter_from(start),
            )
        })
    } else {
        Vec::new()
    };
    let closers = dangling
        .into_iter()
        .filter(|kind| !matches!(kind, EventKind::TurnEnd { .. }))
        .chain(std::iter::once(EventKind::TurnEnd {
            turn,
            reason,
            traceparent: crate::trace::traceparent_of(&tracing::Span::current()),
        }));
    for closer in closers {
        if let Err(error) = ctx.log().append(closer) {
            tracing::error!(session_id = %ctx.agent(), turn, %error, "could not close the turn");
        }
    }
}

/// Runs the steps of a turn, cancelling it where it stands when its budget's wall time runs out.
/// A plain function choosing the future, not an `async fn` awaiting it: a held turn's state
/// then carries no frame of its own here.
fn drive_within_budget(
    ctx: &TurnContext,
    turn: u64,
    claimed: Vec<Message>,
) -> impl Future<Output = Result<Option<Ending>, Fault>> + '_ {
    match ctx.budget.as_ref().and_then(BudgetMeter::wall_time_left) {
        None => futures::future::Either::Left(drive(ctx, turn, claimed)),
        // Boxed: only a turn racing a wall-time limit pays for the race in its state (a held
        // turn's state is what a resident child costs).
        Some(left) => {
            futures::future::Either::Right(Box::pin(drive_until(ctx, turn, claimed, left)))
        }
    }
}

/// Runs the steps of a turn, cancelling it where it stands once `left` has passed.
async fn drive_until(
    ctx: &TurnContext,
    turn: u64,
    claimed: Vec<Message>,
    left: Duration,
) -> Result<Option<Ending>, Fault> {
    let driving = drive(ctx, turn, claimed);
    tokio::pin!(driving);
    tokio::select! {
        outcome = &mut driving => outcome,
        () = tokio::time::sleep(left) => {
            ctx.cancel.exhaust(BudgetLimit::WallTime);
            // The driver sees the cancel and closes what is open.
            driving.await
        }
    }
}

/// Runs the steps of a turn. Returns the turn's ending: the last step ending, except that
/// `max-tokens` is sticky.
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in the turn's state"
)]
fn drive(
    ctx: &TurnContext,
    turn: u64,
    mut entering: Vec<Message>,
) -> impl Future<Output = Result<Option<Ending>, Fault>> + '_ {
    async move {
        let mut step = 0;
        let mut turn_ending: Option<Ending> = None;
        // Whether the previous step ended the turn's work (no tool results left for the model).
        let mut step_ended = false;
        loop {
            if ctx.cancel.is_cancelled() {
                return Err(Fault::Aborted);
            }
            // Runtime context rides along with real input only; it never opens a step by itself.
            if !entering.is_empty() {
                entering.extend(ctx.scope.runtime_context_message_after(ctx.log()));
            }
            let pre_step = PreStep {
                agent: ctx.agent(),
                turn,
                step: step + 1,
                log: ctx.log(),
            };
            let messages = match ctx.scope.pre_step(
                &ctx.env.pre_step,
                &pre_step,
                PreStepDecision::Enter(entering),
            ) {
                PreStepDecision::Reject => return Ok(Some(Ending::Blocked)),
                PreStepDecision::Fail(message) => {
                    return Err(Fault::failed(LlmFailure::new("UNKNOWN", message)))
                }
                PreStepDecision::Enter(messages) => messages,
            };
            if messages.is_empty() && step == 0 {
                return Ok(Some(Ending::Completed));
            }
            if messages.is_empty() && step_ended {
                return Ok(turn_ending);
            }
            ctx.reserve().await?;
            // A cancel that landed while the queue was full must not open a step.
            if ctx.cancel.is_cancelled() {
                return Err(Fault::Aborted);
            }
            ctx.scope.step_entered(&pre_step);
            step += 1;
            if step == 1 {
                if let Some(meter) = &ctx.budget {
                    meter.charge_turn();
                }
            }
            ctx.append(EventKind::StepStart { turn, step })?;
            for message in messages {
                ctx.append(EventKind::UserMessage(message))?;
            }
            let stepped = run_step(ctx, turn, step).await;
            ctx.append(EventKind::StepEnd { turn, step })?;
            // A cancelled step ends its turn, and the turn's end checkpoints the log (or, on the
            // way to a release, the disposal does): a throttled checkpoint here would be a second
            // one beside it, and a drain cancels a million turns at once.
            if !ctx.cancel.is_cancelled() {
                crate::projection::cache::checkpoint_if_due(&ctx.env, ctx.log());
            }
            if ctx.options().flush == FlushPolicy::EveryStep && ctx.log().flush().await.is_err() {
                // The log is faulted; the turn ends with the fault.
                return Err(Fault::failed(ctx.fault_failure()));
            }
            let step_ending = stepped?;
            if let Some(Ending::Exhausted(limit)) = step_ending {
                return Ok(Some(Ending::Exhausted(limit)));
            }
            if let Some(ending) = step_ending {
                if turn_ending != Some(Ending::MaxTokens) {
                    turn_ending = Some(ending);
                }
            }
            step_ended = step_ending.is_some();
            entering = ctx.inbox.claim_next_step(turn).await;
            if step_ended && entering.is_empty() {
                let stopping = PreStep {
                    agent: ctx.agent(),
                    turn,
                    step: step + 1,
                    log: ctx.log(),
                };
                entering = ctx.scope.turn_stopping(&stopping);
                if entering.is_empty() {
                    return Ok(turn_ending);
                }
            }
        }
    }
}

/// The history a model call gets: the one the log holds, unless the log paged out entries the
/// adapter reads (it reads the whole history, or more of the newest entries than are held),
/// which are then read back from the store (see [`crate::session::history`]).
async fn history_for(ctx: &TurnContext, adapter: &dyn LlmAdapter) -> Result<History, Fault> {
    let history = ctx.log().history();
    let held = history.first_resident().map(|first| history.len() - first);
    let covered = history.is_complete()
        || held
            .zip(adapter.history_window())
            .is_some_and(|(held, window)| held >= window.min(history.len()));
    if covered {
        return Ok(history);
    }
    let read_back = match &ctx.env.store {
        Some(store) => ctx.log().complete_history(store.as_ref()).await,
        None => Err(SubagentError::new(
            ErrorCode::StoreIo,
            "the log paged out events and the runtime has no store to read them back from",
        )),
    };
    read_back
        .map_err(|error| Fault::failed(LlmFailure::new(error.code().as_str(), error.message())))
}

#[expect(
    clippy::manual_async_fn,
    reason = "an async fn keeps its arguments twice in the turn's state"
)]
fn run_step(
    ctx: &TurnContext,
    turn: u64,
    step: u64,
) -> impl Future<Output = Result<Option<Ending>, Fault>> + '_ {
    async move {
        let (provider, adapter) = ctx
            .env
            .models
            .route(ctx.options().provider.as_deref())
            .map_err(Fault::failed)?;
        let chat = crate::trace::chat_span(&provider, &ctx.options().model, step);
        let messages = history_for(ctx, adapter.as_ref()).await?;
        let mut stream = {
            let visible = ctx.scope.tools().visible(&ctx.env.tools);
            let request = GenerateRequest {
                provider: provider.clone(),
                model: ctx.options().model.clone(),
                messages,
                system: assemble_system_prompt(
                    &ctx.env.sections,
                    ctx.scope.sections(),
                    &visible
                        .iter()
                        .filter_map(|tool| tool.guidance())
                        .collect::<Vec<_>>(),
                ),
                tools: visible.iter().map(tools::Tool::shared_schema).collect(),
                max_tokens: ctx.options().max_tokens,
                session_id: Some(ctx.agent()),
                cancel: ctx.cancel.token.clone(),
            };
            if ctx.env.trace_content {
                crate::trace::record_request(&chat, &request);
            }
            adapter.stream(request)
        };
        let mut streamed = Streamed::default();
        let received = async {
            loop {
                // Matched as a temporary: only the chunk outlives this statement, so a turn
                // waiting for room below does not also hold the received item in its state.
                let chunk = match tokio::select! {
                    biased;
                    () = ctx.cancel.token.cancelled() => None,
                    item = stream.next() => Some(item),
                } {
                    Some(None) => break,
                    Some(Some(Ok(chunk))) => chunk,
                    Some(Some(Err(failure))) if !ctx.cancel.is_cancelled() => {
                        return Err(Fault::failed(failure));
                    }
                    // Cancelled: seen first, or surfacing as the stream's failure.
                    None | Some(Some(Err(_))) => {
                        return Err(record_interrupted(
                            ctx,
                            turn,
                            step,
                            &streamed.assembler,
                            std::mem::take(&mut streamed.chunk_seqs),
                        ));
                    }
                };
                ctx.reserve().await?;
                match &chunk {
                    StreamChunk::Usage { usage } => streamed.usage = Some(Box::new(*usage)),
                    StreamChunk::Finish { reason } => {
                        streamed.finish = Some(Box::new(reason.clone()))
                    }
                    _ => {}
                }
                streamed.assembler.push(&chunk);
                let seq = ctx.append(EventKind::AssistantChunk { turn, step, chunk })?;
                streamed.chunk_seqs.push(seq);
            }
            Ok(())
        }
        .await;
        crate::trace::record_response(&chat, streamed.usage.as_deref(), streamed.finish.as_deref());
        if ctx.env.trace_content {
            let output = streamed.assembler.blocks();
            crate::trace::record_output(&chat, &output, streamed.finish.as_deref());
        }
        received?;
        // The request (and its history snapshot) goes with the stream, before the history grows:
        // the log then extends its history in place instead of copying it.
        drop(stream);
        let (answered, spent) = conclude_step(ctx, turn, step, &provider, streamed)?;
        let ending = match answered {
            Answered::Ended(ending) => ending,
            // Boxed: a step that calls no tool (every held model call) does not pay for the tools'
            // state in its own.
            Answered::Called(calls) => Box::pin(run_tools(ctx, turn, step, calls)).await?,
        };
        Ok(match spent {
            true => Some(Ending::Exhausted(BudgetLimit::Tokens)),
            false => ending,
        })
    }
}

/// What a step's response streamed so far. The rarely set parts are boxed: a turn held on its
/// model call keeps this in its state, and a resident child is mostly that state.
#[derive(Default)]
struct Streamed {
    assembler: crate::model::BlockAssembler,
    chunk_seqs: Vec<u64>,
    usage: Option<Box<TokenUsage>>,
    finish: Option<Box<FinishReason>>,
}

/// What a step's answer asks for next.
enum Answered {
    /// The step ended (how, if the answer says).
    Ended(Option<Ending>),
    /// The model called tools: they run before the step ends.
    Called(Vec<(CallId, String, String)>),
}

/// Appends the step's assistant message from what streamed, and says what comes next and
/// whether the message spent the token budget.
fn conclude_step(
    ctx: &TurnContext,
    turn: u64,
    step: u64,
    provider: &str,
    streamed: Streamed,
) -> Result<(Answered, bool), Fault> {
    let finish = streamed.finish.map_or(FinishReason::Stop, |finish| *finish);
    let content = match &finish {
        FinishReason::Error { failure } | FinishReason::Aborted { failure } => {
            if ctx.cancel.is_cancelled() {
                return Err(record_interrupted(
                    ctx,
                    turn,
                    step,
                    &streamed.assembler,
                    streamed.chunk_seqs,
                ));
            }
            return Err(Fault::failed(failure.clone()));
        }
        FinishReason::MaxTokens => streamed.assembler.text_blocks(),
        FinishReason::Stop | FinishReason::ToolCalls | FinishReason::Refusal => {
            streamed.assembler.blocks()
        }
    };
    let message = Message::assistant(content, provider, &ctx.options().model);
    let calls: Vec<(CallId, String, String)> = message
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::ToolCall {
                id,
                name,
                arguments,
            } => Some((id.clone(), name.clone(), arguments.clone())),
            _ => None,
        })
        .collect();
    // The step that reaches the token limit is the turn's last; its tool calls still run, so
    // the history stays whole.
    let spent = match (&ctx.budget, &streamed.usage) {
        (Some(meter), Some(usage)) => meter.charge_tokens(usage),
        _ => false,
    };
    ctx.append_with_sources(
        EventKind::AssistantMessage {
            turn,
            step,
            message,
            usage: streamed.usage,
            interrupted: false,
        },
        streamed.chunk_seqs,
    )?;
    let answered = match finish {
        FinishReason::MaxTokens => Answered::Ended(Some(Ending::MaxTokens)),
        FinishReason::Refusal => Answered::Ended(Some(Ending::Blocked)),
        _ if calls.is_empty() => Answered::Ended(Some(Ending::Completed)),
        _ => Answered::Called(calls),
    };
    Ok((answered, spent))
}

/// Records what streamed before a cancel (non-blank text or reasoning only) and reports the
/// abort.
fn record_interrupted(
    ctx: &TurnContext,
    turn: u64,
    step: u64,
    assembler: &crate::model::BlockAssembler,
    chunk_seqs: Vec<u64>,
) -> Fault {
    if assembler.has_visible_text() {
        let provider = ctx
            .env
            .models
            .default_provider()
            .unwrap_or_default()
            .to_owned();
        let provider = ctx.options().provider.clone().unwrap_or(provider);
        let message = Message::assistant(assembler.text_blocks(), &provider, &ctx.options().model);
        let appended = ctx.append_with_sources(
            EventKind::AssistantMessage {
                turn,
                step,
                message,
                usage: None,
                interrupted: true,
            },
            chunk_seqs,
        );
        if appended.is_err() {
            tracing::error!(session_id = %ctx.agent(), turn, step, "could not record the interrupted message");
        }
    }
    Fault::Aborted
}

/// Runs the step's tool calls in model order: consecutive concurrency-safe calls run together
/// (at most [`MAX_PARALLEL_TOOL_CALLS`] at once), any other call runs alone. Results commit in
/// model order.
async fn run_tools(
    ctx: &TurnContext,
    turn: u64,
    step: u64,
    calls: Vec<(CallId, String, String)>,
) -> Result<Option<Ending>, Fault> {
    let mut concluded = false;
    let mut contexts = Vec::new();
    for group in group_calls(ctx, calls) {
        // After a cancel every call still gets its `tool/call`, and `tools::execute` answers
        // it with `ABORTED_BEFORE_DISPATCH` without starting it.
        let mut dispatched = Vec::with_capacity(group.len());
        for (call_id, name, arguments) in group {
            let seq = ctx.append(EventKind::ToolCall {
                turn,
                step,
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            })?;
            let tool_ctx = ToolCtx::for_agent(&ctx.caller, call_id, name, ctx.cancel.token.clone());
            dispatched.push((seq, tool_ctx, arguments));
        }
        let layer = ctx.scope.tools();
        let results: Vec<ToolExecutionResult> =
            stream::iter(dispatched.iter().map(|(_, tool_ctx, arguments)| {
                let span = crate::trace::tool_span(&tool_ctx.name, tool_ctx.call_id.as_str());
                let content = ctx.env.trace_content;
                if content {
                    crate::trace::record_tool_arguments(&span, arguments);
                }
                let recorded = span.clone();
                tools::execute(layer, &ctx.env.tools, tool_ctx.clone(), arguments)
                    .map(move |result| {
                        if content {
                            crate::trace::record_tool_result(&recorded, &result.content);
                        }
                        result
                    })
                    .instrument(span)
            }))
            .buffered(MAX_PARALLEL_TOOL_CALLS)
            .collect()
            .await;
        for ((seq, tool_ctx, _), result) in dispatched.into_iter().zip(results) {
            concluded |= result.concludes_turn && !result.is_error;
            contexts.extend(result.additional_contexts.iter().cloned());
            commit_result(ctx, turn, step, seq, &tool_ctx, result)?;
        }
    }
    if !contexts.is_empty() {
        ctx.inbox.queue_context(contexts);
    }
    if ctx.cancel.is_cancelled() {
        return Err(Fault::Aborted);
    }
    Ok(concluded.then_some(Ending::Completed))
}

fn group_calls(
    ctx: &TurnContext,
    calls: Vec<(CallId, String, String)>,
) -> Vec<Vec<(CallId, String, String)>> {
    let layer = ctx.scope.tools();
    let mut groups: Vec<Vec<(CallId, String, String)>> = Vec::new();
    let mut last_safe = false;
    for call in calls {
        let safe = layer
            .get(&ctx.env.tools, &call.1)
            .is_some_and(|tool| tool.concurrency_mode() == Concurrency::Safe);
        match groups.last_mut() {
            Some(group) if safe && last_safe => group.push(call),
            _ => groups.push(vec![call]),
        }
        last_safe = safe;
    }
    groups
}

fn commit_result(
    ctx: &TurnContext,
    turn: u64,
    step: u64,
    call_seq: u64,
    call: &ToolCtx,
    result: ToolExecutionResult,
) -> Result<(), Fault> {
    let message = Message::tool_result(
        call.call_id.clone(),
        result.content.clone(),
        result.is_error,
    );
    ctx.append_with_sources(
        EventKind::ToolResult {
            turn,
            step,
            message,
            error: result.error.clone().map(Box::new),
            meta: result.meta.clone().map(Box::new),
        },
        vec![call_seq],
    )?;
    ctx.scope.tool_result(&ToolResultSeen {
        agent: ctx.agent(),
        call_id: &call.call_id,
        execution: call.execution(),
        name: &call.name,
        result: &result,
    });
    Ok(())
}
