//! Provides [`AgentActor`], one live agent, and [`AgentRef`], the exact-identity reference to
//! it.
//!
//! # The inbox is the mailbox's journaled state
//! Every message for an agent (prompt, follow-up, steering, injected context) arrives as a
//! `Deliver` message in mailbox order and is journaled in the session log before it is pending.
//! The actor owns the inbox; the running turn claims from it by message (`ClaimStep`), so
//! nothing else queues work for the agent. The messages are crate-private: a host reaches the
//! actor only through [`AgentRef`] and [`crate::AgentHandle`].
//!
//! # Turns
//! A turn runs as a future spawned on the actor's context (never `ctx.wait`), so `Cancel`,
//! `Deliver` and `Status` are handled while it runs. The transitions live in one state machine
//! (`host::state`), unit-tested without an actor system:
//!
//! - **Idle** → a waking send opens a turn (`turn/start`, first claim) → **Running**.
//! - **Running** → the turn ends → another turn if `next-turn` has work and the inbox is not
//!   parked, otherwise **Idle** and every idle waiter resolves.
//! - A cancel with [`InboxPolicy::Discard`] journals the discard of everything pending (even
//!   when idle); with [`InboxPolicy::Keep`] the pending work is parked: it survives but only the
//!   next waking send resumes it, parked items first. Work the cancelled turn already claimed is
//!   never put back.
//! - A waking send that arrives after the running turn was cancelled goes to `next-turn`, and
//!   (unless the cause is disposal) its wake is latched and replayed once the turn has ended.
//! - A durable write that fails faults the agent: the running turn ends with the write's error,
//!   and sends are refused with `AGENT_FAULTED`; a faulted agent never starts another turn.
//!
//! # Stopping
//! `Retire` (sent by disposal) discards what is still pending, runs the scope's disposers in
//! reverse order and stops the actor; later sends through any [`AgentRef`] fail with
//! `AGENT_DISPOSED`.

use std::sync::Arc;

use actix::prelude::*;
use actix::WeakAddr;
use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tracing::Instrument as _;

use crate::actors::agents::Agents;
use crate::content::{ContentBlock, Message, MessageSource};
use crate::error::{Result, SubagentError};
use crate::host::driver::{run_turn, InboxPort, TurnCancel, TurnContext};
use crate::host::state::{Admission, AgentState, Next};
use crate::host::{
    AgentEnv, AgentEvent, AgentEventKind, AgentOptions, AgentScope, AgentStatus, BudgetMeter,
    BudgetRaise, Disposer, Inbox,
};
use crate::ids::{FastHashMap, MessageId, SessionId};
use crate::session::{
    CancelCause, EventKind, InboxTarget, SessionHeader, SessionLog, SessionLogView, TurnEndReason,
};
use crate::trace::SentFrom;

/// Whether a send starts (or continues) processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Start a turn on an idle agent.
    Wake,
    /// Wait for the next turn or step to pick it up.
    Quiet,
}

/// What a cancel does to pending work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxPolicy {
    /// Discard everything pending, journaled as cancellations.
    Discard,
    /// Park pending work until the next waking send.
    Keep,
}

/// Who sends a delivery or a cancel: a continuable child's inbox is reachable only through the
/// continuation manager, so the host's own calls through an [`AgentRef`] are refused there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SentBy {
    /// A host, through the public [`AgentRef`] methods.
    Host,
    /// The runtime itself (a one-shot run's prompt, a job's completion notice).
    Runtime,
}

/// A snapshot of an agent's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSnapshot {
    /// Idle or running.
    pub status: AgentStatus,
    /// The turn running, if any.
    pub turn: Option<u64>,
    /// Messages waiting in `next-turn`.
    pub next_turn: usize,
    /// Messages waiting in `next-step`.
    pub next_step: usize,
    /// Whether pending work is parked by a keep-inbox cancel.
    pub parked: bool,
    /// Whether a durable write failed: the agent refuses new work.
    pub faulted: bool,
}

/// One live agent.
pub struct AgentActor {
    id: SessionId,
    log: SessionLog,
    inbox: Inbox,
    env: Arc<AgentEnv>,
    scope: Arc<AgentScope>,
    /// Shared with every turn and every reference the agent hands out.
    options: Arc<AgentOptions>,
    /// Run in reverse at retirement (a slice: the list never grows after creation).
    disposers: Box<[Disposer]>,
    state: AgentState,
    /// Callers waiting for the agent to become idle or to retire (one list: an actor's whole
    /// state sits in its task, and every resident child has one).
    waiters: Vec<(Awaited, oneshot::Sender<()>)>,
    /// The continuation manager's view of this agent, when it is a resident Activation.
    activity: Option<ActivityObserver>,
    /// The budget every turn is charged against, when the agent has one.
    budget: Option<BudgetMeter>,
    /// Its incarnation and service: each turn builds the agent's own exact reference from
    /// them, the authority its tools act with (built per turn, so an idle agent holds none).
    identity: (u64, Agents),
    /// Set once a release is on its way: the disposal writes the projection checkpoint, so a
    /// turn cancelled ahead of it does not write the same rows beside it (a drain of a million
    /// children would otherwise hold a million checkpoints in flight at once).
    releasing: bool,
    /// Set when the release hands the session over (its node leaves the cluster): what is
    /// pending stays in the log, unclaimed, for whoever resumes the session next.
    handing_over: bool,
    /// Set once this incarnation opened a turn: its first turn links back to the last one the
    /// session ran before it was resumed (see [`crate::trace::link_resumed`]).
    opened_a_turn: bool,
    /// The span each pending message was sent from, while a subscriber records spans: the turn
    /// that claims a message continues its sender's trace (see [`crate::trace`]). Boxed and
    /// made on the first such message: every resident child carries this field.
    trace_parents: Option<Box<FastHashMap<MessageId, SentFrom>>>,
}

/// What a caller waits for the agent to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaited {
    /// Become idle (no turn running).
    Idle,
    /// Retire (disposal finished; the actor stops).
    Retired,
}

/// What an Activation's settlement watcher learns from its agent, in the agent's own order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activity {
    /// A turn claimed this message: the agent is running.
    Claimed(MessageId),
    /// A cancel discarded this pending message.
    Discarded(MessageId),
    /// A message posted again was found claimed or discarded long before: accepted once, it
    /// is not on its way to a turn.
    Repeated(MessageId),
    /// The agent became idle (its driver exited with nothing left to run).
    Idle,
    /// A durable write failed: the agent will never run its pending work (it refuses sends and
    /// opens no turn), so nothing it holds is still on its way to a turn.
    Faulted,
}

/// Where a message posted again stands (see [`AgentActor::accepted_before`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Earlier {
    /// Still in the inbox.
    Pending,
    /// Claimed or discarded.
    Settled,
}

/// Receives an agent's [`Activity`]; called on the agent's thread, so it must not block.
pub(crate) type ActivityObserver = Arc<dyn Fn(SessionId, Activity) + Send + Sync>;

impl Actor for AgentActor {
    type Context = Context<Self>;
}

impl AgentActor {
    pub(crate) fn new(
        log: SessionLog,
        inbox: Inbox,
        env: Arc<AgentEnv>,
        scope: Arc<AgentScope>,
        options: Arc<AgentOptions>,
        disposers: Vec<Disposer>,
        identity: (u64, Agents),
    ) -> Self {
        Self {
            identity,
            releasing: false,
            handing_over: false,
            opened_a_turn: false,
            trace_parents: None,
            id: log.id(),
            log,
            inbox,
            env,
            scope,
            options,
            disposers: disposers.into_boxed_slice(),
            state: AgentState::new(),
            waiters: Vec::new(),
            activity: None,
            budget: None,
        }
    }

    /// Answers every caller waiting for `what`.
    fn answer_waiters(&mut self, what: Awaited) {
        let (answered, waiting) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition::<Vec<_>, _>(|(awaited, _)| *awaited == what);
        self.waiters = waiting;
        for (_, waiter) in answered {
            // A waiter that stopped listening needs no answer.
            let _ = waiter.send(());
        }
    }

    fn notify(&self, activity: Activity) {
        if let Some(observer) = &self.activity {
            observer(self.id, activity);
        }
    }

    fn emit(&self, kind: AgentEventKind) {
        self.env.events.emit(&AgentEvent {
            agent: self.id,
            kind,
        });
    }

    /// Refuses a host's delivery or cancel to a resident continuable child: only its parent
    /// reaches it, through the manager's authority check and accepted-set bookkeeping.
    fn admit_host(&self, by: SentBy) -> Result<()> {
        if by == SentBy::Host && self.activity.is_some() {
            return Err(SubagentError::new(
                crate::error::ErrorCode::Unauthorized,
                format!(
                    "agent {} is a resident continuable child: its inbox is reached only \
                     through its parent (`Subagents::followup`, `Subagents::interrupt`)",
                    self.id
                ),
            ));
        }
        Ok(())
    }

    fn deliver(
        &mut self,
        message: Message,
        target: InboxTarget,
        wake: Wake,
        trace: SentFrom,
        ctx: &mut Context<Self>,
    ) -> Result<MessageId> {
        let (id, next) = self.insert(message, target, wake, trace)?;
        self.apply(next, ctx);
        Ok(id)
    }

    /// Where message `id` was sent from, forgotten once asked for (it was claimed).
    fn sent_from(&mut self, id: MessageId) -> Option<SentFrom> {
        self.trace_parents.as_mut()?.remove(&id)
    }

    /// Journals `message` as pending and decides what follows, without carrying it out.
    fn insert(
        &mut self,
        message: Message,
        target: InboxTarget,
        wake: Wake,
        trace: SentFrom,
    ) -> Result<(MessageId, Next)> {
        if let Some(refusal) = self.state.refusal(self.id) {
            return Err(refusal);
        }
        let target = self.state.route(target, wake);
        let id = message.id;
        self.inbox.insert(&self.log, target, message)?;
        if !trace.is_none() {
            self.trace_parents
                .get_or_insert_default()
                .insert(id, trace.detached());
        }
        self.emit(AgentEventKind::InboxInserted {
            message: id,
            target,
        });
        Ok((id, self.state.delivered(target, wake)))
    }

    /// Records a raised budget and applies it to the meter, before any turn can open on it.
    fn raise_budget(&mut self, raise: BudgetRaise) {
        if let Err(error) = self.log.append(raise.record) {
            // The log is faulted: the agent refuses work from here on, and says why.
            tracing::error!(session_id = %self.id, %error, "could not record a raised budget");
            return;
        }
        // Every continuable child is metered from its Activation's start.
        if let Some(meter) = &self.budget {
            meter.set_budget(raise.budget);
        }
    }

    /// Carries out what a transition decided.
    fn apply(&mut self, next: Next, ctx: &mut Context<Self>) {
        match next {
            Next::Stay => {}
            Next::StartTurn => self.start_turn(ctx),
            Next::Idle => self.become_idle(),
            Next::Retire => {
                self.become_idle();
                self.retire(ctx);
            }
        }
    }

    fn start_turn(&mut self, ctx: &mut Context<Self>) {
        let turn = self.log.last_turn() + 1;
        let claimed = self
            .log
            .append(EventKind::TurnStart { turn })
            .and_then(|_| self.inbox.claim(&self.log, InboxTarget::NextTurn));
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(error) => {
                // Nothing can be journaled: fault rather than retry the same turn forever.
                tracing::error!(session_id = %self.id, turn, %error, "could not open a turn");
                self.fault(error);
                self.become_idle();
                return;
            }
        };
        let mut sent_from = None;
        for message in &claimed {
            self.emit(AgentEventKind::InboxClaimed {
                message: message.id,
                turn,
            });
            self.notify(Activity::Claimed(message.id));
            if let Some(sender) = self.sent_from(message.id) {
                sent_from.get_or_insert(sender);
            }
        }
        let span = crate::trace::turn_span(sent_from.as_ref(), self.id, turn);
        if !std::mem::replace(&mut self.opened_a_turn, true) {
            crate::trace::link_resumed(&span, &self.log);
        }
        let cancel = TurnCancel::new();
        self.state.turn_started(turn, cancel.clone());
        // One address for both (each `ctx.address()` allocates a sender).
        let address = ctx.address();
        let turn_ctx = TurnContext {
            caller: AgentRef::new(
                self.id,
                self.identity.0,
                &address,
                self.log.clone(),
                Arc::clone(&self.options),
                self.identity.1.clone(),
            ),
            env: Arc::clone(&self.env),
            scope: Arc::clone(&self.scope),
            cancel,
            inbox: Arc::new(address),
            budget: self.budget.clone(),
        };
        let driver = run_turn(turn_ctx, turn, claimed).instrument(span);
        ctx.spawn(
            driver
                .into_actor(self)
                .map(|reason, actor, ctx| actor.turn_finished(reason, ctx)),
        );
    }

    /// The running turn ended. Its number is the state's (it stays running until here), not
    /// captured by the driver's continuation: every resident child holds that continuation
    /// boxed with the turn's future, at the top of its allocation class.
    fn turn_finished(&mut self, reason: TurnEndReason, ctx: &mut Context<Self>) {
        let turn = self.state.turn().unwrap_or_else(|| self.log.last_turn());
        tracing::debug!(session_id = %self.id, turn, ?reason, "turn ended");
        if !self.releasing {
            crate::projection::cache::checkpoint_after_turn(&self.env, &self.log);
        }
        if let Some(keep) = self.options.resident_events {
            if let Some(projections) = &self.env.projections {
                projections.fold_live(&self.log);
            }
            self.log
                .page_out(usize::try_from(keep.get()).unwrap_or(usize::MAX));
        }
        self.emit(AgentEventKind::TurnEnded { turn, reason });
        let next = self.state.turn_finished(self.inbox.has_next_turn());
        self.apply(next, ctx);
    }

    fn become_idle(&mut self) {
        self.answer_waiters(Awaited::Idle);
        self.notify(Activity::Idle);
    }

    fn cancel(&mut self, cause: CancelCause, policy: InboxPolicy) -> Result<()> {
        let (running, discard) = self.state.cancelled(&cause, policy);
        // The token first: a failed discard below must not leave the turn running.
        if let Some(cancel) = running {
            tracing::debug!(session_id = %self.id, ?cause, ?policy, "cancelling the running turn");
            cancel.cancel(cause);
        }
        if discard {
            self.discard_pending()?;
        }
        Ok(())
    }

    /// The log could not journal what the agent did: refuse new work, end the running turn
    /// (its end reason is the fault, see the driver), and report it.
    fn fault(&mut self, error: SubagentError) {
        self.stop_for_fault(error.clone());
        self.emit(AgentEventKind::Faulted { error });
    }

    /// A write failed: refuse new work and end the running turn. A durable write's failure is
    /// reported by the log's fault hook itself (see [`Faulted`]), whatever the actor's state.
    fn stop_for_fault(&mut self, error: SubagentError) {
        if let Some(cancel) = self.state.faulted(error) {
            // The log records why the turn stopped; its end reason is the fault itself.
            cancel.cancel(CancelCause::Hook {
                reason: "a durable write of this session failed".into(),
            });
        }
        self.notify(Activity::Faulted);
    }

    /// Whether this agent accepted message `id` before: still pending, or settled (claimed
    /// or discarded). Reads the log for a settled one: only a message that may repeat asks.
    fn accepted_before(&self, id: MessageId) -> Option<Earlier> {
        if self.inbox.is_pending(&id) {
            return Some(Earlier::Pending);
        }
        let inserted = self
            .log
            .with_events(|events| crate::host::inbox::inserts(events, id));
        inserted.then_some(Earlier::Settled)
    }

    fn discard_pending(&mut self) -> Result<()> {
        for message in self.inbox.clear(&self.log)? {
            self.emit(AgentEventKind::InboxDiscarded {
                message: message.id,
            });
            self.notify(Activity::Discarded(message.id));
        }
        self.trace_parents = None;
        Ok(())
    }

    fn snapshot(&self) -> AgentSnapshot {
        let turn = self.state.turn();
        AgentSnapshot {
            status: if turn.is_some() {
                AgentStatus::Running
            } else {
                AgentStatus::Idle
            },
            turn,
            next_turn: self.inbox.next_turn_len(),
            next_step: self.inbox.next_step_len(),
            parked: self.state.parked,
            faulted: matches!(self.state.admission, Admission::Faulted(_)),
        }
    }

    fn claim_step(&mut self, turn: u64) -> Vec<Message> {
        self.state.step_claimed();
        match self.inbox.claim(&self.log, InboxTarget::NextStep) {
            Ok(claimed) => {
                for message in &claimed {
                    self.emit(AgentEventKind::InboxClaimed {
                        message: message.id,
                        turn,
                    });
                    self.notify(Activity::Claimed(message.id));
                    // Read within the running turn, whose trace it joins.
                    self.sent_from(message.id);
                }
                claimed
            }
            Err(error) => {
                tracing::error!(session_id = %self.id, turn, %error, "could not claim next-step work");
                self.fault(error);
                Vec::new()
            }
        }
    }

    fn retire(&mut self, ctx: &mut Context<Self>) {
        self.releasing = true;
        if let Some(cancel) = self.state.retire() {
            // Stop only once the turn has closed its log; `turn_finished` comes back here.
            cancel.cancel(CancelCause::Disposed);
            return;
        }
        // Handed over, what is pending stays accepted in the log: the next resume replays it.
        if !self.handing_over {
            if let Err(error) = self.discard_pending() {
                tracing::warn!(session_id = %self.id, %error, "could not journal the final discard");
            }
        }
        for disposer in std::mem::take(&mut self.disposers)
            .into_vec()
            .into_iter()
            .rev()
        {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(disposer)).is_err() {
                tracing::error!(session_id = %self.id, "a scope disposer panicked");
            }
        }
        self.answer_waiters(Awaited::Retired);
        ctx.stop();
    }
}

/// Puts a message into the inbox. Sent by [`AgentRef::followup`], [`AgentRef::steer`] and
/// [`AgentRef::inject`]. Replies with the message id once it is journaled and pending; fails
/// with `INVALID_EVENT` for a duplicate pending id. A stopped agent fails the send
/// (`AGENT_DISPOSED`).
#[derive(Message)]
#[rtype(result = "Result<MessageId>")]
pub(crate) struct Deliver {
    pub(crate) message: Message,
    pub(crate) target: InboxTarget,
    pub(crate) wake: Wake,
    /// Told once the agent is idle again after a delivery that succeeded, as [`WhenIdle`]
    /// would be: a one-shot run's prompt waits for its turn this way, in one message.
    pub(crate) idle: Option<oneshot::Sender<()>>,
    pub(crate) by: SentBy,
    /// Where it was sent from: the turn that claims it continues that trace.
    pub(crate) trace: SentFrom,
}

impl Handler<Deliver> for AgentActor {
    type Result = Result<MessageId>;

    fn handle(&mut self, msg: Deliver, ctx: &mut Context<Self>) -> Self::Result {
        self.admit_host(msg.by)?;
        let id = self.deliver(msg.message, msg.target, msg.wake, msg.trace, ctx)?;
        if let Some(idle) = msg.idle {
            if self.state.turn().is_none() {
                let _ = idle.send(());
            } else {
                self.waiters.push((Awaited::Idle, idle));
            }
        }
        Ok(id)
    }
}

/// Where a [`Post`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PostTarget {
    /// A list and a wake, as [`Deliver`].
    Inbox(InboxTarget, Wake),
    /// A settlement notice: one later turn of an idle agent, or the next step of a running one
    /// (so notices that arrive together are read in one step).
    TurnOrStep,
}

/// [`Deliver`] for the continuation manager: sent with `do_send` so that it is in the agent's
/// mailbox, in order, the moment the manager decides (a bounded `send` could be queued behind a
/// later cancel), and answered through `reply` once journaled and pending.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Post {
    pub(crate) message: Message,
    pub(crate) target: PostTarget,
    /// A budget raised with this message: recorded and applied once the message is accepted,
    /// before it can open a turn.
    pub(crate) raise: Option<BudgetRaise>,
    /// Whether this message may have been accepted before: then an id this agent already
    /// accepted is answered with that acceptance, and nothing is inserted again.
    pub(crate) may_repeat: bool,
    /// Where it was sent from (a follow-up's caller): the turn that claims it continues that
    /// trace.
    pub(crate) trace: SentFrom,
    pub(crate) reply: oneshot::Sender<Result<MessageId>>,
}

impl Handler<Post> for AgentActor {
    type Result = ();

    fn handle(&mut self, msg: Post, ctx: &mut Context<Self>) {
        let (target, wake) = match msg.target {
            PostTarget::Inbox(target, wake) => (target, wake),
            PostTarget::TurnOrStep if self.state.turn().is_some() => {
                (InboxTarget::NextStep, Wake::Wake)
            }
            PostTarget::TurnOrStep => (InboxTarget::NextTurn, Wake::Wake),
        };
        if msg.may_repeat {
            if let Some(earlier) = self.accepted_before(msg.message.id) {
                match earlier {
                    Earlier::Settled => self.notify(Activity::Repeated(msg.message.id)),
                    // Still pending (replayed by a resume, say): it wakes the agent as its
                    // first delivery would have.
                    Earlier::Pending if self.state.refusal(self.id).is_none() => {
                        let target = self.state.route(target, wake);
                        let next = self.state.delivered(target, wake);
                        self.apply(next, ctx);
                    }
                    Earlier::Pending => {}
                }
                let _ = msg.reply.send(Ok(msg.message.id));
                return;
            }
            // A settled message of an agent that pages out its log may have left memory: the
            // store has it. The mailbox waits for the read, so later posts keep their order.
            if let (Some(paged), Some(store)) = (self.log.paged_prefix(), self.env.store.clone()) {
                let id = msg.message.id;
                let before = u64::try_from(paged.len).unwrap_or(u64::MAX);
                let read = async move {
                    let seed_end = store.header(paged.session).await?.first_stored_seq();
                    let mut inserted = false;
                    crate::store::read_chunked(&*store, paged.session, seed_end, before, |chunk| {
                        inserted = crate::host::inbox::inserts(&chunk, id);
                        Ok(!inserted)
                    })
                    .await?;
                    Ok::<_, SubagentError>(inserted)
                };
                ctx.wait(
                    read.into_actor(self)
                        .map(move |read, actor, ctx| match read {
                            Ok(true) => {
                                actor.notify(Activity::Repeated(id));
                                let _ = msg.reply.send(Ok(id));
                            }
                            Ok(false) => actor.accept_post(msg, target, wake, ctx),
                            Err(error) => {
                                let _ = msg.reply.send(Err(error));
                            }
                        }),
                );
                return;
            }
        }
        self.accept_post(msg, target, wake, ctx);
    }
}

impl AgentActor {
    /// Inserts a posted message into the inbox and answers the poster.
    fn accept_post(&mut self, msg: Post, target: InboxTarget, wake: Wake, ctx: &mut Context<Self>) {
        let outcome = self
            .insert(msg.message, target, wake, msg.trace)
            .map(|(id, next)| {
                if let Some(raise) = msg.raise {
                    self.raise_budget(raise);
                }
                self.apply(next, ctx);
                id
            });
        // A poster that stopped waiting learns nothing it needs.
        let _ = msg.reply.send(outcome);
    }
}

/// Installs the continuation manager's activity observer and the child's budget meter (sent
/// before any work is posted, so the first turn is already metered).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Observe {
    pub(crate) observer: ActivityObserver,
    pub(crate) budget: BudgetMeter,
}

impl Handler<Observe> for AgentActor {
    type Result = ();

    fn handle(&mut self, msg: Observe, _: &mut Context<Self>) {
        self.activity = Some(msg.observer);
        self.budget = Some(msg.budget);
        if self.state.turn().is_none() {
            self.notify(Activity::Idle);
        }
    }
}

/// Cancels the running turn (if any) with `cause`, and applies `inbox` to pending work. The
/// first cause of a turn wins; cancelling an idle agent does not affect later work.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub(crate) struct Cancel {
    pub(crate) cause: CancelCause,
    pub(crate) inbox: InboxPolicy,
    /// Whether the agent's release follows (see `AgentActor::releasing`).
    pub(crate) releasing: bool,
    /// Whether that release hands the session over (see `AgentActor::handing_over`).
    pub(crate) hand_over: bool,
    pub(crate) by: SentBy,
}

impl Handler<Cancel> for AgentActor {
    type Result = Result<()>;

    fn handle(&mut self, msg: Cancel, _: &mut Context<Self>) -> Self::Result {
        self.admit_host(msg.by)?;
        self.releasing |= msg.releasing;
        self.handing_over |= msg.hand_over;
        // A session handed over keeps what is pending, whatever a later cancel asks.
        let inbox = if self.handing_over {
            InboxPolicy::Keep
        } else {
            msg.inbox
        };
        self.cancel(msg.cause, inbox)
    }
}

/// Resolves when the agent is idle (the whole agent is quiescent, not one message).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct WhenIdle;

impl Handler<WhenIdle> for AgentActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: WhenIdle, _: &mut Context<Self>) -> Self::Result {
        if self.state.turn().is_none() {
            return Box::pin(async {});
        }
        let (sender, receiver) = oneshot::channel();
        self.waiters.push((Awaited::Idle, sender));
        Box::pin(async move {
            // A dropped sender means the actor stopped: it is idle for good.
            let _ = receiver.await;
        })
    }
}

/// Reads the agent's state.
#[derive(Message)]
#[rtype(result = "AgentSnapshot")]
pub(crate) struct Status;

impl Handler<Status> for AgentActor {
    type Result = MessageResult<Status>;

    fn handle(&mut self, _: Status, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.snapshot())
    }
}

/// Internal: the running turn claims `next-step` at a step boundary.
#[derive(Message)]
#[rtype(result = "Vec<Message>")]
pub(crate) struct ClaimStep {
    turn: u64,
}

impl Handler<ClaimStep> for AgentActor {
    type Result = MessageResult<ClaimStep>;

    fn handle(&mut self, msg: ClaimStep, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.claim_step(msg.turn))
    }
}

/// Internal: tool results queue context messages into `next-step` (no wake).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct QueueContext {
    messages: Vec<Message>,
}

impl Handler<QueueContext> for AgentActor {
    type Result = ();

    fn handle(&mut self, msg: QueueContext, ctx: &mut Context<Self>) {
        for message in msg.messages {
            if let Err(error) = self.deliver(
                message,
                InboxTarget::NextStep,
                Wake::Quiet,
                SentFrom::default(),
                ctx,
            ) {
                tracing::warn!(session_id = %self.id, %error, "dropped a tool context message");
            }
        }
    }
}

/// Internal, sent by disposal: discard what is left, unwind the scope, stop. Resolves once the
/// actor has stopped; a turn still running is cancelled (`disposed`) and closed first.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Retire;

impl Handler<Retire> for AgentActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Retire, ctx: &mut Context<Self>) -> Self::Result {
        let (sender, receiver) = oneshot::channel();
        self.waiters.push((Awaited::Retired, sender));
        self.retire(ctx);
        Box::pin(async move {
            // A dropped sender means the actor stopped: retired either way.
            let _ = receiver.await;
        })
    }
}

/// Internal, sent by the log's write-behind: a durable write failed, and the agent stops taking
/// work (`do_send`; a stopped agent has nothing left to fault). The fault hook that sends it
/// has emitted `agent/faulted` already.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Faulted(pub(crate) SubagentError);

impl Handler<Faulted> for AgentActor {
    type Result = ();

    fn handle(&mut self, msg: Faulted, _: &mut Context<Self>) {
        self.stop_for_fault(msg.0);
    }
}

/// A turn reaches its own agent through the actor's address: the turn runs inside the actor's
/// context, so the address goes with the turn (a weak one would allocate a sender at every
/// step to upgrade).
impl InboxPort for Addr<AgentActor> {
    fn claim_next_step(&self, turn: u64) -> BoxFuture<'static, Vec<Message>> {
        // A stopped actor answers nothing: its turn has no next step.
        let claim = self.send(ClaimStep { turn });
        Box::pin(async move { claim.await.unwrap_or_default() })
    }

    fn queue_context(&self, messages: Vec<Message>) {
        // A stopped actor has no next step to deliver the context to.
        self.do_send(QueueContext { messages });
    }
}

/// An exact reference to one live agent: its session id plus the incarnation that published
/// it. Two references are equal only when both match, so a stale reference to a replaced agent
/// is told apart from the live one.
#[derive(Clone)]
pub struct AgentRef {
    id: SessionId,
    incarnation: u64,
    /// Weak: a reference never keeps a stopped agent's mailbox alive.
    addr: WeakAddr<AgentActor>,
    log: SessionLogView,
    options: Arc<AgentOptions>,
    agents: Agents,
}

impl PartialEq for AgentRef {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.incarnation == other.incarnation
    }
}

impl Eq for AgentRef {}

impl std::fmt::Debug for AgentRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRef")
            .field("id", &self.id)
            .field("incarnation", &self.incarnation)
            .finish()
    }
}

impl AgentRef {
    pub(crate) fn new(
        id: SessionId,
        incarnation: u64,
        addr: &Addr<AgentActor>,
        log: SessionLog,
        options: Arc<AgentOptions>,
        agents: Agents,
    ) -> Self {
        Self {
            id,
            incarnation,
            addr: addr.downgrade(),
            log: SessionLogView::new(log),
            options,
            agents,
        }
    }

    /// The agents service this agent lives in (the Rust form of `agent.ctx.agents`): in-process
    /// providers create children through it.
    pub fn agents(&self) -> &Agents {
        &self.agents
    }

    /// The session id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// The incarnation number that published this agent.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The agent's session log, read-only: only the agent's actor writes it.
    pub fn log(&self) -> &SessionLogView {
        &self.log
    }

    /// The agent's session header.
    pub fn header(&self) -> SessionHeader {
        self.log.header()
    }

    /// The agent's options.
    pub fn options(&self) -> &AgentOptions {
        &self.options
    }

    /// Whether the agent's actor still runs.
    pub fn is_alive(&self) -> bool {
        self.addr().is_some_and(|addr| addr.connected())
    }

    /// The actor's address, while it runs.
    pub(crate) fn addr(&self) -> Option<Addr<AgentActor>> {
        self.addr.upgrade()
    }

    fn live_addr(&self) -> Result<Addr<AgentActor>> {
        self.addr()
            .ok_or_else(|| SubagentError::agent_gone(self.id))
    }

    async fn deliver(
        &self,
        message: Message,
        target: InboxTarget,
        wake: Wake,
    ) -> Result<MessageId> {
        self.deliver_via(None, message, target, wake, None, SentBy::Host)
            .await
    }

    /// Delivers `message` on the runtime's own behalf (a job's completion notice): unlike the
    /// host's calls, it reaches a resident continuable child too.
    ///
    /// # Errors
    /// As [`AgentRef::followup`].
    pub(crate) async fn deliver_for_runtime(
        &self,
        message: Message,
        target: InboxTarget,
        wake: Wake,
    ) -> Result<MessageId> {
        self.deliver_via(None, message, target, wake, None, SentBy::Runtime)
            .await
    }

    /// [`AgentRef::deliver`] through `actor`, the agent's own address when the caller holds
    /// it (an owning handle does), else the reference's upgraded (which allocates a sender).
    async fn deliver_via(
        &self,
        actor: Option<&Addr<AgentActor>>,
        message: Message,
        target: InboxTarget,
        wake: Wake,
        idle: Option<oneshot::Sender<()>>,
        by: SentBy,
    ) -> Result<MessageId> {
        // Backpressure: a sender waits while the session's write-behind queue is full.
        self.log.inner().reserve().await.map_err(|error| {
            SubagentError::new(
                crate::error::ErrorCode::AgentFaulted,
                format!(
                    "agent {} is faulted and takes no new work: {error}",
                    self.id
                ),
            )
        })?;
        let upgraded;
        let actor = match actor {
            Some(actor) => actor,
            None => {
                upgraded = self.live_addr()?;
                &upgraded
            }
        };
        actor
            .send(Deliver {
                message,
                target,
                wake,
                idle,
                by,
                trace: tracing::Span::current().into(),
            })
            .await
            .map_err(|_| SubagentError::agent_gone(self.id))?
    }

    /// [`AgentRef::followup`] through the agent's own address (held by an owning handle), and
    /// a wait for the agent to be idle again registered by the same message: the receiver is
    /// told (or closed, when the actor stops) once the agent is idle, as
    /// [`AgentRef::when_idle`] would be after the follow-up.
    ///
    /// # Errors
    /// As [`AgentRef::followup`].
    pub(crate) async fn followup_until_idle(
        &self,
        actor: &Addr<AgentActor>,
        content: Vec<ContentBlock>,
        source: MessageSource,
    ) -> Result<oneshot::Receiver<()>> {
        let (idle, idled) = oneshot::channel();
        self.deliver_via(
            Some(actor),
            Message::user(content, source),
            InboxTarget::NextTurn,
            Wake::Wake,
            Some(idle),
            SentBy::Runtime,
        )
        .await?;
        Ok(idled)
    }

    /// Queues `content` as a later turn of its own (FIFO; never joins the running turn) and
    /// wakes the agent.
    ///
    /// # Errors
    /// `AGENT_DISPOSED` when the agent is gone.
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves may still deliver the message.
    pub async fn followup(
        &self,
        content: Vec<ContentBlock>,
        source: MessageSource,
    ) -> Result<MessageId> {
        self.followup_message(Message::user(content, source)).await
    }

    /// [`AgentRef::followup`] with a prebuilt message (its id is kept).
    ///
    /// # Errors
    /// `AGENT_DISPOSED`; `INVALID_EVENT` when a pending message has the same id.
    pub async fn followup_message(&self, message: Message) -> Result<MessageId> {
        self.deliver(message, InboxTarget::NextTurn, Wake::Wake)
            .await
    }

    /// Queues `content` for the next step boundary (it can extend the running turn) and wakes
    /// the agent.
    ///
    /// # Errors
    /// `AGENT_DISPOSED`.
    pub async fn steer(
        &self,
        content: Vec<ContentBlock>,
        source: MessageSource,
    ) -> Result<MessageId> {
        self.deliver(
            Message::user(content, source),
            InboxTarget::NextStep,
            Wake::Wake,
        )
        .await
    }

    /// Queues `content` quietly for the next step; it waits while the agent is idle.
    ///
    /// # Errors
    /// `AGENT_DISPOSED`.
    pub async fn inject(
        &self,
        content: Vec<ContentBlock>,
        source: MessageSource,
    ) -> Result<MessageId> {
        self.inject_message(Message::user(content, source)).await
    }

    /// [`AgentRef::inject`] with a prebuilt message.
    ///
    /// # Errors
    /// `AGENT_DISPOSED`; `INVALID_EVENT` for a duplicate pending id.
    pub async fn inject_message(&self, message: Message) -> Result<MessageId> {
        self.deliver(message, InboxTarget::NextStep, Wake::Quiet)
            .await
    }

    /// Cancels the running turn and applies `inbox` to pending work.
    ///
    /// # Errors
    /// `AGENT_DISPOSED`; `INVALID_ARGS` for cause `disposed` (reserved for disposal); a store
    /// error if the discard could not be journaled.
    pub async fn cancel(&self, cause: CancelCause, inbox: InboxPolicy) -> Result<()> {
        if cause == CancelCause::Disposed {
            // Only disposal cancels with `disposed`: it also unregisters the agent.
            return Err(SubagentError::new(
                crate::error::ErrorCode::InvalidArgs,
                "cancel with cause `disposed` is reserved for disposal: dispose the agent's handle",
            ));
        }
        self.live_addr()?
            .send(Cancel {
                cause,
                inbox,
                releasing: false,
                hand_over: false,
                by: SentBy::Host,
            })
            .await
            .map_err(|_| SubagentError::agent_gone(self.id))?
    }

    /// Posts `message` in mailbox order now; the returned future resolves at acceptance. With
    /// `may_repeat`, a message this agent already accepted is answered with that acceptance.
    pub(crate) fn post(
        &self,
        message: Message,
        target: PostTarget,
        raise: Option<BudgetRaise>,
        may_repeat: bool,
        trace: SentFrom,
    ) -> impl std::future::Future<Output = Result<MessageId>> + Send + 'static {
        let (reply, accepted) = oneshot::channel();
        let id = self.id;
        match self.addr() {
            Some(addr) => addr.do_send(Post {
                message,
                target,
                raise,
                may_repeat,
                trace,
                reply,
            }),
            None => drop(reply),
        }
        async move {
            accepted
                .await
                .unwrap_or_else(|_| Err(SubagentError::agent_gone(id)))
        }
    }

    /// Cancels in mailbox order now, without waiting (a gone agent has nothing to cancel).
    pub(crate) fn cancel_now(&self, cause: CancelCause, inbox: InboxPolicy) {
        self.send_cancel(Cancel {
            cause,
            inbox,
            releasing: false,
            hand_over: false,
            by: SentBy::Runtime,
        });
    }

    /// Cancels in mailbox order now for the release that follows: the owner cancelled (cause
    /// `parent`) and pending work is discarded.
    pub(crate) fn cancel_for_release(&self) {
        self.send_cancel(Cancel {
            cause: CancelCause::Parent,
            inbox: InboxPolicy::Discard,
            releasing: true,
            hand_over: false,
            by: SentBy::Runtime,
        });
    }

    /// Cancels in mailbox order now for a release that hands the session over (its node
    /// leaves the cluster): the running turn ends (cause `parent`), and pending work stays
    /// accepted in the log, discarded neither now nor at retirement, for the next resume.
    pub(crate) fn cancel_for_hand_over(&self) {
        self.send_cancel(Cancel {
            cause: CancelCause::Parent,
            inbox: InboxPolicy::Keep,
            releasing: true,
            hand_over: true,
            by: SentBy::Runtime,
        });
    }

    fn send_cancel(&self, cancel: Cancel) {
        if let Some(addr) = self.addr() {
            addr.do_send(cancel);
        }
    }

    /// Installs the manager's activity observer and the child's budget meter, in mailbox
    /// order.
    pub(crate) fn observe(&self, observer: ActivityObserver, budget: BudgetMeter) {
        if let Some(addr) = self.addr() {
            addr.do_send(Observe { observer, budget });
        }
    }

    /// Resolves once the agent is idle (immediately for a stopped agent).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn when_idle(&self) {
        // A stopped agent is idle for good.
        if let Some(addr) = self.addr() {
            let _ = addr.send(WhenIdle).await;
        }
    }

    /// The agent's state.
    ///
    /// # Errors
    /// `AGENT_DISPOSED`.
    pub async fn status(&self) -> Result<AgentSnapshot> {
        self.live_addr()?
            .send(Status)
            .await
            .map_err(|_| SubagentError::agent_gone(self.id))
    }
}
