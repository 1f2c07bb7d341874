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
use tokio::sync::oneshot;
use tracing::Instrument as _;

use crate::actors::agents::Agents;
use crate::content::Message;
use crate::error::{Result, SubagentError};
use crate::host::driver::{run_turn, TurnCancel, TurnContext};
use crate::host::state::{Admission, AgentState, Next};
use crate::host::{
    AgentEnv, AgentEvent, AgentEventKind, AgentScope, AgentStatus, BudgetMeter, BudgetRaise,
    Disposer, Inbox,
};
use crate::ids::{FastHashMap, MessageId, SessionId};
use crate::session::{CancelCause, EventKind, InboxTarget, SessionLog, TurnEndReason};
use crate::trace::SentFrom;

mod agent_ref;
mod messages;

pub use agent_ref::AgentRef;
pub(crate) use agent_ref::Published;
pub(crate) use messages::{retire, Cancel, Faulted, PostTarget};

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
    published: Arc<Published>,
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

    /// However it stops (retired, or its arbiter stopping under it), it is gone for every
    /// reference from here on.
    fn stopped(&mut self, _: &mut Self::Context) {
        self.log.mark_agent_stopped();
    }
}

impl AgentActor {
    pub(crate) fn new(
        log: SessionLog,
        inbox: Inbox,
        env: Arc<AgentEnv>,
        scope: Arc<AgentScope>,
        published: Arc<Published>,
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
            published,
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
                Arc::clone(&self.published),
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
        if let Some(keep) = self.published.options.resident_events {
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
        // Gone for every reference before anyone hears it stopped.
        self.log.mark_agent_stopped();
        self.answer_waiters(Awaited::Retired);
        ctx.stop();
    }
}
