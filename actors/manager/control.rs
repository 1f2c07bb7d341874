//! Interrupts and reports: a parent's authority over a resident child's turn, and a child's
//! report to its parent.

use super::*;

/// Interrupts a resident child's turn, keeping its inbox (see `Subagents::interrupt`).
#[derive(Message)]
#[rtype(result = "Result<InterruptRouted>")]
pub(crate) struct Interrupt {
    pub(crate) target: SessionId,
    pub(crate) authority: InterruptAuthority,
}

/// Where an authorized interrupt went.
pub(crate) enum InterruptRouted {
    /// Issued here (or nothing was resident to stop).
    Done,
    /// The target was placed on another node by `parent`: ask it there (through the caller's
    /// cluster link).
    Remote {
        node: NodeId,
        parent: SessionId,
        cause: CancelCause,
    },
}

impl Handler<Interrupt> for ContinuationManager {
    type Result = Result<InterruptRouted>;

    fn handle(&mut self, msg: Interrupt, _: &mut Context<Self>) -> Result<InterruptRouted> {
        let target = msg.target;
        if let InterruptAuthority::Ancestor(caller) = &msg.authority {
            if !caller.is_alive() {
                return Err(unauthorized(format!(
                    "interrupting requires the exact live ancestor agent; {} is not live",
                    caller.id()
                )));
            }
            if caller.id() == target {
                return Err(unauthorized(format!(
                    "agent {target} cannot interrupt itself"
                )));
            }
        }
        let Some(resident) = self.residents.get(&target) else {
            return self.route_remote_interrupt(target, &msg.authority);
        };
        let cause = interrupt_cause(
            target,
            &msg.authority,
            resident.parent.id(),
            &resident.ancestry[1..],
        )?;
        if resident.disposal.is_none() {
            resident.agent.cancel_now(cause, InboxPolicy::Keep);
        }
        Ok(InterruptRouted::Done)
    }
}

/// The cause an interrupt of `target` carries under `authority`, once authorized: the user
/// naming its `parent` session, or a live agent among its `ancestors` (parent first).
fn interrupt_cause(
    target: SessionId,
    authority: &InterruptAuthority,
    parent: SessionId,
    ancestors: &[SessionId],
) -> Result<CancelCause> {
    match authority {
        InterruptAuthority::User { parent_session_id } => {
            if parent != *parent_session_id {
                return Err(unauthorized(format!(
                    "continuable child {target} belongs to another parent session"
                )));
            }
            Ok(CancelCause::User)
        }
        InterruptAuthority::Ancestor(caller) => {
            if !ancestors.contains(&caller.id()) {
                return Err(unauthorized(format!(
                    "continuable child {target} is not a live descendant of agent {}",
                    caller.id()
                )));
            }
            Ok(CancelCause::Parent)
        }
    }
}

impl ContinuationManager {
    /// An interrupt of a child that is not resident here: routed to the node its parent here
    /// placed it on, once authorized as for a resident child; otherwise (unknown, one-shot,
    /// already settled) nothing to stop.
    fn route_remote_interrupt(
        &self,
        target: SessionId,
        authority: &InterruptAuthority,
    ) -> Result<InterruptRouted> {
        let (Some(remote), Some(_)) = (self.remote_children.get(&target), &self.cluster) else {
            return Ok(InterruptRouted::Done);
        };
        let parent = remote.parent.id();
        let cause = interrupt_cause(target, authority, parent, &self.lineage_of(&remote.parent))?;
        Ok(InterruptRouted::Remote {
            node: remote.node,
            parent,
            cause,
        })
    }
}

/// Delivers a resident child's report to its durable parent.
#[derive(Message)]
#[rtype(result = "Result<BoxFuture<'static, Result<MessageId>>>")]
pub(crate) struct ReportFrom {
    pub(crate) child: AgentRef,
    pub(crate) content: Vec<ContentBlock>,
    pub(crate) delivery: ReportDelivery,
    pub(crate) token: CancellationToken,
}

impl Handler<ReportFrom> for ContinuationManager {
    type Result = Result<BoxFuture<'static, Result<MessageId>>>;

    fn handle(&mut self, msg: ReportFrom, ctx: &mut Context<Self>) -> Self::Result {
        if msg.token.is_cancelled() {
            return Err(cancelled());
        }
        let lineage = self.lineage_of(&msg.child);
        self.assert_admitting(&lineage)?;
        let child = msg.child.id();
        let resident = self
            .residents
            .get(&child)
            .filter(|resident| resident.agent == msg.child && msg.child.is_alive())
            .ok_or_else(|| {
                unauthorized(format!(
                    "agent {child} is not a resident continuable child and cannot report"
                ))
            })?;
        if resident.disposal.is_some() {
            return Err(SubagentError::new(
                ErrorCode::ActivationClosing,
                format!("continuable child {child} is already settling"),
            ));
        }
        let message = Message::user(
            report_content(child, msg.content),
            MessageSource::SubagentReportRelay {
                sender_session_id: child,
            },
        );
        let captured = match &resident.parent {
            ParentLink::Local(agent) => agent.clone(),
            ParentLink::Remote(remote) => {
                let kind = crate::cluster::NoticeKind::Report(msg.delivery);
                return Ok(self.report_remote(remote, child, message, kind));
            }
        };
        self.post_report(child, &captured, message, msg.delivery, ctx)
    }
}

impl ContinuationManager {
    /// Posts `child`'s report to its local parent: the parent's resident Activation when it
    /// has one (a waking report counts as accepted work there), else the exact agent it was
    /// materialized under while that lives.
    pub(super) fn post_report(
        &mut self,
        child: SessionId,
        captured: &AgentRef,
        message: Message,
        delivery: ReportDelivery,
        ctx: &mut Context<Self>,
    ) -> Result<BoxFuture<'static, Result<MessageId>>> {
        let id = message.id;
        let (parent, counted) = match (self.residents.get_mut(&captured.id()), delivery) {
            (Some(parent), ReportDelivery::Wakeup) if parent.disposal.is_none() => {
                parent.accepted.insert(id);
                (parent.agent.clone(), true)
            }
            (Some(parent), _) => (parent.agent.clone(), false),
            (None, _) if captured.is_alive() => (captured.clone(), false),
            (None, _) => {
                return Err(SubagentError::new(
                    ErrorCode::ParentUnavailable,
                    format!("the parent of continuable child {child} is not live"),
                ))
            }
        };
        let target = match delivery {
            ReportDelivery::Quiet => PostTarget::Inbox(InboxTarget::NextStep, Wake::Quiet),
            ReportDelivery::Wakeup => PostTarget::Inbox(InboxTarget::NextTurn, Wake::Wake),
        };
        let accepted = parent.post(message, target, None);
        let manager = ctx.address();
        let parent_id = parent.id();
        Ok(async move {
            accepted.await.map_err(|error| {
                if counted {
                    manager.do_send(Refused {
                        child: parent_id,
                        message: id,
                    });
                }
                SubagentError::new(
                    ErrorCode::ParentUnavailable,
                    format!("the parent of continuable child {child} rejected the followup/inject: {error}"),
                )
            })
        }
        .boxed())
    }
}
