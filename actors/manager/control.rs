//! Interrupts and reports: a parent's authority over a child's turn, and a child's report to
//! its parent.
//!
//! An interrupt is authorized whatever the target's residency: against the resident
//! Activation's recorded lineage, or, for a target that is not resident here, against the
//! lineage its headers record (a live agent's, else the stored one). An authorized interrupt
//! of a child whose cold resume is in flight waits for that resume and reaches the turn it
//! opens; of a settled child, it has nothing to stop.

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
    /// The target is not resident here: authorize it against its recorded lineage
    /// ([`authorize_absent`]), then bring it back as [`InterruptAbsent`].
    Absent,
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
    /// settled, being resumed) authorized against its recorded lineage by the caller.
    fn route_remote_interrupt(
        &self,
        target: SessionId,
        authority: &InterruptAuthority,
    ) -> Result<InterruptRouted> {
        let (Some(remote), Some(_)) = (self.remote_children.get(&target), &self.cluster) else {
            return Ok(InterruptRouted::Absent);
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

/// The cause an interrupt of `target`, which is not resident here, carries under `authority`:
/// checked as for a resident child, against the parent and ancestors its headers record (a
/// live agent's header, else the stored one). `None` for an id no header names: an unknown
/// target is an accepted no-op.
///
/// # Errors
/// `UNAUTHORIZED` as for a resident child; a store error reading a header.
pub(crate) async fn authorize_absent(
    agents: &Agents,
    target: SessionId,
    authority: &InterruptAuthority,
) -> Result<Option<CancelCause>> {
    let Some(header) = header_of(agents, target).await? else {
        return Ok(None);
    };
    let Some(parent) = header.parent_session else {
        // A root session is nobody's child: no authority reaches it through this seam.
        return Err(unauthorized(format!(
            "{target} is not a delegated child and cannot be interrupted as one"
        )));
    };
    // The ancestors above the parent matter only to an ancestor's authority.
    let mut ancestors = vec![parent];
    if let InterruptAuthority::Ancestor(caller) = authority {
        let mut next = Some(parent);
        while let Some(id) = next.filter(|id| *id != caller.id()) {
            let above = header_of(agents, id)
                .await?
                .and_then(|header| header.parent_session);
            match above {
                // A corrupt lineage that loops (or one deeper than any delegation) ends here.
                Some(above) if !ancestors.contains(&above) && ancestors.len() < MAX_LINEAGE => {
                    ancestors.push(above);
                    next = Some(above);
                }
                _ => next = None,
            }
        }
    }
    interrupt_cause(target, authority, parent, &ancestors).map(Some)
}

/// The deepest stored lineage an ancestor's authority is looked for in.
const MAX_LINEAGE: usize = 4096;

/// The header of session `id`: its live agent's, else the stored one; `None` when neither
/// exists.
pub(super) async fn header_of(
    agents: &Agents,
    id: SessionId,
) -> Result<Option<crate::session::SessionHeader>> {
    if let Some(live) = agents.get(id).await {
        return Ok(Some(live.header()));
    }
    let Some(store) = agents.env().store.clone() else {
        return Ok(None);
    };
    match store.header(id).await {
        Ok(header) => Ok(Some(header)),
        Err(error) if error.code() == ErrorCode::SessionNotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Issues an interrupt of a target that was not resident when it was asked for, once the
/// caller authorized it against the target's recorded lineage: a resident target (it was
/// resumed meanwhile) is cancelled now; one whose cold resume is in flight is cancelled as
/// soon as that resume submits its message (the interrupt reaches the turn it opens); a
/// settled one has nothing to stop.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct InterruptAbsent {
    pub(crate) target: SessionId,
    pub(crate) cause: CancelCause,
}

impl Handler<InterruptAbsent> for ContinuationManager {
    type Result = ();

    fn handle(&mut self, msg: InterruptAbsent, _: &mut Context<Self>) {
        if let Some(resident) = self.residents.get(&msg.target) {
            if resident.disposal.is_none() {
                resident.agent.cancel_now(msg.cause, InboxPolicy::Keep);
            }
        } else if self.resuming.contains_key(&msg.target) {
            self.interrupts.insert(msg.target, msg.cause);
        }
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
    /// The span the report was sent from (the child's `report` call): a parent turn it wakes
    /// continues that trace.
    pub(crate) trace: tracing::Span,
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
                let traceparent = crate::trace::traceparent_of(&msg.trace);
                let told = self.report_remote(remote, child, message, (kind, traceparent));
                // The parent's node takes a report only from a child the store names as that
                // parent's, and a fresh child's creation is written behind its prompt's
                // acceptance, while its first turn runs: the report leaves once the creation is
                // stored (only the creation: the rest of the turn's events are not waited for).
                let log = msg.child.log().inner().clone();
                return Ok(async move {
                    log.stored().await?;
                    told.await
                }
                .boxed());
            }
        };
        let origin = super::parent::ReportOrigin::Local(msg.trace);
        self.post_report(child, &captured, message, msg.delivery, origin, ctx)
    }
}
