//! Interrupts and reports: a parent's authority over a resident child's turn, and a child's
//! report to its parent.

use super::*;

/// Interrupts a resident child's turn, keeping its inbox (see `Subagents::interrupt`).
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub(crate) struct Interrupt {
    pub(crate) target: SessionId,
    pub(crate) authority: InterruptAuthority,
}

impl Handler<Interrupt> for ContinuationManager {
    type Result = Result<()>;

    fn handle(&mut self, msg: Interrupt, _: &mut Context<Self>) -> Result<()> {
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
            // Unknown, one-shot or already settled: nothing to stop.
            return Ok(());
        };
        let cause = match &msg.authority {
            InterruptAuthority::User { parent_session_id } => {
                if resident.parent.id() != *parent_session_id {
                    return Err(unauthorized(format!(
                        "continuable child {target} belongs to another parent session"
                    )));
                }
                CancelCause::User
            }
            InterruptAuthority::Ancestor(caller) => {
                if !resident.ancestry[1..].contains(&caller.id()) {
                    return Err(unauthorized(format!(
                        "continuable child {target} is not a live descendant of agent {}",
                        caller.id()
                    )));
                }
                CancelCause::Parent
            }
        };
        if resident.disposal.is_none() {
            resident.agent.cancel_now(cause, InboxPolicy::Keep);
        }
        Ok(())
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
        let parent_session = resident.parent.id();
        let captured = resident.parent.clone();
        let message = Message::user(
            report_content(child, msg.content),
            MessageSource::SubagentReportRelay {
                sender_session_id: child,
            },
        );
        let id = message.id;
        let (parent, counted) = match (self.residents.get_mut(&parent_session), msg.delivery) {
            (Some(parent), ReportDelivery::Wakeup) if parent.disposal.is_none() => {
                parent.accepted.insert(id);
                (parent.agent.clone(), true)
            }
            (Some(parent), _) => (parent.agent.clone(), false),
            (None, _) if captured.is_alive() => (captured, false),
            (None, _) => {
                return Err(SubagentError::new(
                    ErrorCode::ParentUnavailable,
                    format!("the parent of continuable child {child} is not live"),
                ))
            }
        };
        let target = match msg.delivery {
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
