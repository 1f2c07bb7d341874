//! Provides [`AgentRef`], the exact-identity reference to one live agent.

use std::sync::Arc;

use actix::prelude::*;
use actix::WeakAddr;
use tokio::sync::oneshot;

use crate::actors::agents::Agents;
use crate::content::{ContentBlock, Message, MessageSource};
use crate::error::{Result, SubagentError};
use crate::host::{AgentOptions, BudgetMeter, BudgetRaise};
use crate::ids::{MessageId, SessionId};
use crate::session::{CancelCause, InboxTarget, SessionHeader, SessionLog, SessionLogView};
use crate::trace::SentFrom;

use super::messages::{Cancel, Deliver, Observe, Post, PostTarget, Status, WhenIdle};
use super::{ActivityObserver, AgentActor, AgentSnapshot, InboxPolicy, SentBy, Wake};

/// What an agent was published with, shared by its actor and every reference to it (one
/// pointer in each, so neither grows with it).
pub(crate) struct Published {
    /// Its options.
    pub(crate) options: AgentOptions,
    /// The sessions above it, nearest first (see [`AgentRef::ancestors`]).
    pub(crate) ancestors: Box<[SessionId]>,
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
    published: Arc<Published>,
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
        published: Arc<Published>,
        agents: Agents,
    ) -> Self {
        Self {
            id,
            incarnation,
            addr: addr.downgrade(),
            log: SessionLogView::new(log),
            published,
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

    /// The sessions above this agent, nearest first, as observed when it was published: those
    /// its continuable admission saw, else its owner and the owner's own, else its header's
    /// parent. Ids only, so an intermediate that left the registry since (a one-shot child
    /// disposed, a parent settled) still counts: a scoped drain's cutoff holds below it
    /// (CONT-38).
    pub(crate) fn ancestors(&self) -> &[SessionId] {
        &self.published.ancestors
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
        &self.published.options
    }

    /// Whether the agent's actor still runs. False from the moment the agent stops, on every
    /// thread: an actor on a worker thread keeps its mailbox until that thread drops it, which
    /// may come after the agent's disposal has returned to a caller on another thread.
    pub fn is_alive(&self) -> bool {
        !self.log.inner().agent_stopped() && self.addr().is_some_and(|addr| addr.connected())
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
            if let Ok(Some(idle)) = addr.send(WhenIdle).await {
                // A dropped sender means the actor stopped: it is idle for good.
                let _ = idle.await;
            }
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

#[cfg(test)]
mod tests {
    use crate::{CreateAgent, Runtime};

    // An agent's mailbox outlives its stop by as long as its thread takes to drop the actor;
    // on a worker thread, that can be after its disposal returned to a caller on another
    // thread, and a stale reference then passed for the live agent (the history checker, on
    // two workers: a follow-up from a disposed incarnation of a root accepted, six replays of
    // one schedule in 600 before, none in 600 after). Liveness reads the stop itself.
    #[actix_rt::test]
    async fn an_agent_that_stopped_is_gone_for_its_references_while_its_mailbox_is_open() {
        let rt = Runtime::builder().build().expect("a runtime");
        let handle = rt
            .agents()
            .create(CreateAgent::new())
            .await
            .expect("an agent");
        let agent = handle.agent().clone();
        assert!(agent.is_alive());
        // What a stopping agent does first, while its mailbox is still open.
        agent.log().inner().mark_agent_stopped();
        assert!(
            agent.addr().is_some_and(|addr| addr.connected()),
            "its mailbox is still open"
        );
        assert!(!agent.is_alive(), "a stopped agent is not alive");
        handle.dispose().await.expect("disposed");
        rt.shutdown().await.expect("shut down");
    }
}
