//! The messages an [`AgentActor`] handles, and the port a running turn reaches its agent by.

use actix::prelude::*;
use futures::future::BoxFuture;
use tokio::sync::oneshot;

use crate::content::Message;
use crate::error::{Result, SubagentError};
use crate::host::driver::InboxPort;
use crate::host::{BudgetMeter, BudgetRaise};
use crate::ids::MessageId;
use crate::session::{CancelCause, InboxTarget};
use crate::trace::SentFrom;

use super::{
    Activity, ActivityObserver, AgentActor, AgentSnapshot, Awaited, Earlier, InboxPolicy, SentBy,
    Wake,
};

/// Puts a message into the inbox. Sent by [`AgentRef::followup`], [`AgentRef::steer`] and
/// [`AgentRef::inject`]. Replies with the message id once it is journaled and pending; fails
/// with `INVALID_EVENT` for a duplicate pending id. A stopped agent fails the send
/// (`AGENT_DISPOSED`).
///
/// [`AgentRef::followup`]: super::AgentRef::followup
/// [`AgentRef::steer`]: super::AgentRef::steer
/// [`AgentRef::inject`]: super::AgentRef::inject
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
            // Read back only when the paged-out events may hold it: a first ask almost never.
            let paged = self.log.paged_prefix().filter(|_| {
                self.log
                    .with_events(|events| events.paged_out_may_insert(msg.message.id))
            });
            if let (Some(paged), Some(store)) = (paged, self.env.store.clone()) {
                let id = msg.message.id;
                let before = u64::try_from(paged.len).unwrap_or(u64::MAX);
                let read = async move {
                    let seed_end = store.header(paged.session).await?.first_stored_seq();
                    let mut inserted = false;
                    crate::store::read_chunked(
                        &*store,
                        paged.session,
                        (0, seed_end),
                        before,
                        |chunk| {
                            inserted = crate::host::inbox::inserts(&chunk, id);
                            Ok(!inserted)
                        },
                    )
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

/// Answers how to wait until the agent is idle (the whole agent is quiescent, not one
/// message): nothing when it is idle now, else a receiver told when it is (a dropped sender
/// means the actor stopped, idle for good). Answered synchronously, so asking costs no task.
#[derive(Message)]
#[rtype(result = "Option<oneshot::Receiver<()>>")]
pub(crate) struct WhenIdle;

impl Handler<WhenIdle> for AgentActor {
    type Result = MessageResult<WhenIdle>;

    fn handle(&mut self, _: WhenIdle, _: &mut Context<Self>) -> Self::Result {
        if self.state.turn().is_none() {
            return MessageResult(None);
        }
        let (sender, receiver) = oneshot::channel();
        self.waiters.push((Awaited::Idle, sender));
        MessageResult(Some(receiver))
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

/// Internal, sent by disposal: discard what is left, unwind the scope, stop. Answers a
/// receiver told once the actor has stopped (a dropped sender means the same); a turn still
/// running is cancelled (`disposed`) and closed first. Use [`retire`], which waits for it.
#[derive(Message)]
#[rtype(result = "oneshot::Receiver<()>")]
pub(crate) struct Retire;

impl Handler<Retire> for AgentActor {
    type Result = MessageResult<Retire>;

    fn handle(&mut self, _: Retire, ctx: &mut Context<Self>) -> Self::Result {
        let (sender, receiver) = oneshot::channel();
        self.waiters.push((Awaited::Retired, sender));
        self.retire(ctx);
        MessageResult(receiver)
    }
}

/// Retires the agent behind `actor` and resolves once it has stopped (at once for an actor
/// that has stopped already).
///
/// # Cancel safety
/// Cancel safe: the retirement, once sent, goes on without the caller.
pub(crate) async fn retire(actor: &Addr<AgentActor>) {
    if let Ok(retired) = actor.send(Retire).await {
        // A dropped sender means the actor stopped: retired either way.
        let _ = retired.await;
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
