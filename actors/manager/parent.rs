//! Delivering to a child's parent: its settled notice and its reports.
//!
//! The parent is the **session**, not the incarnation a child was materialized under: a parent
//! disposed and resumed while its child runs is the same parent (its follow-ups are accepted,
//! as the authority check compares sessions), so it also hears the child. A notice or report
//! goes to the exact agent the manager knows (the parent's resident Activation, or the agent
//! the child was materialized under), and when that agent is gone, to whatever agent of the
//! session is live now. A settled notice whose parent session has no live agent at all is put
//! into the session's stored inbox, a pending next-turn message its next resume replays: it
//! is delivered once, when the parent comes back. A report needs a live parent
//! (`PARENT_UNAVAILABLE` otherwise): its sender is there to hear the refusal.

use super::*;
use tracing::Span;

/// How many times a notice is sent again when its recipient changed under it (it was being
/// released, or came back while the notice was being stored); each retry follows a change of
/// the parent's residency, so a bound this size is only a guard against a livelock.
const NOTICE_ATTEMPTS: usize = 16;

/// Where a report to post came from.
pub(super) enum ReportOrigin {
    /// A resident child of this node, reporting from within this span (its `report` call).
    Local(Span),
    /// A child on a peer node, whose report may be asked again under its id, continuing the
    /// trace the peer sent with it.
    Peer(Span),
}

impl ContinuationManager {
    /// Delivers the settled notice for a finished epoch to the child's durable parent: the
    /// delivery to a local parent session is answered as a future, which the epoch's disposal
    /// awaits (a drain or shutdown is over only once every notice it caused was delivered or
    /// stored); a parent on another node is told through the cluster, awaited the same way.
    pub(super) fn notify_settlement(
        &mut self,
        resident: &Resident,
        terminal: &Terminal,
        ctx: &mut Context<Self>,
    ) -> Option<BoxFuture<'static, ()>> {
        let child = resident.agent.id();
        let (content, source) = settled_notice(
            child,
            &terminal.stop_reason,
            terminal.exhausted,
            terminal.output.clone(),
        );
        let message = Message::user(content, source);
        match &resident.parent {
            ParentLink::Local(parent) => {
                // From the call that opened the epoch, by its context: that call has returned.
                let sent_from = SentFrom::ended(resident.epoch_trace.as_deref());
                Some(self.post_settled_notice(child, parent, message, false, sent_from, ctx))
            }
            ParentLink::Remote(remote) => {
                // A node that leaves hands its children of remote parents over (see
                // `open_disposal`).
                let kind = if self.leaving {
                    crate::cluster::NoticeKind::HandedOver
                } else {
                    crate::cluster::NoticeKind::Settled
                };
                let traceparent = resident
                    .epoch_trace
                    .as_deref()
                    .and_then(crate::trace::traceparent_of_context);
                Some(self.notify_remote(remote, child, message, (kind, traceparent)))
            }
        }
    }

    /// Posts `child`'s settled notice to its local parent session: the parent's resident
    /// Activation, the exact agent it was materialized under while that lives, else the
    /// session's live agent or its stored inbox (see the module docs). The first post is sent
    /// now, in mailbox order; the returned future carries the delivery to its end.
    ///
    /// With `may_repeat` (a notice asked again under its id by the child's node), a notice the
    /// parent already accepted is answered with that acceptance.
    pub(super) fn post_settled_notice(
        &mut self,
        child: SessionId,
        captured: &AgentRef,
        message: Message,
        may_repeat: bool,
        trace: SentFrom,
        ctx: &mut Context<Self>,
    ) -> BoxFuture<'static, ()> {
        let parent_lineage = self.lineage_of(captured);
        let closing = self.is_closing(&parent_lineage);
        // A parent whose lineage is tearing down, or whose own disposal has begun, records the
        // notice without a wake: waking it would start a turn its teardown must then cancel.
        let recipient = match self.residents.get_mut(&captured.id()) {
            Some(parent) if !closing && parent.disposal.is_none() => {
                // Counted before the send, so the parent cannot look settled meanwhile.
                parent.accept(message.id);
                Some((parent.agent.clone(), true, false))
            }
            Some(parent) => Some((parent.agent.clone(), false, true)),
            None if captured.is_alive() => Some((captured.clone(), false, closing)),
            None => None,
        };
        let counted = recipient.as_ref().is_some_and(|(_, counted, _)| *counted);
        let first = recipient.map(|(parent, _, quiet)| {
            let target = if quiet {
                PostTarget::Inbox(InboxTarget::NextStep, Wake::Quiet)
            } else {
                PostTarget::TurnOrStep
            };
            // Read before the post: wherever the session takes the notice, it lands here or
            // later in its log.
            let stored = parent.log().inner().stored_len();
            // Posted now, in mailbox order behind whatever the manager sent it before.
            let accepted = parent.post(message.clone(), target, None, may_repeat, trace);
            (parent, stored, accepted)
        });
        let parent = captured.id();
        let agents = self.agents.clone();
        let manager = ctx.address();
        async move {
            let mut gone = None;
            let mut may_be_from = may_repeat.then_some(0);
            if let Some((recipient, stored, accepted)) = first {
                match accepted.await {
                    Ok(_) => return,
                    Err(error) => {
                        tracing::debug!(%child, %parent, %error, "the settled notice's first recipient refused it");
                        if counted {
                            manager.do_send(Refused {
                                child: parent,
                                message: message.id,
                            });
                        }
                        gone = Some(recipient);
                        may_be_from = refused_from(may_be_from, stored);
                    }
                }
            }
            if let Err(error) =
                deliver_to_parent_session(&agents, parent, message, gone, (may_repeat, may_be_from))
                    .await
            {
                tracing::warn!(%child, %parent, %error, "the settled notice could not be delivered to its parent session");
            }
        }
        .boxed()
    }

    /// Posts `child`'s report to its local parent: the parent's resident Activation when it
    /// has one (a waking report counts as accepted work there), else the exact agent it was
    /// materialized under while that lives, else the parent session's live agent. A report a
    /// peer node asks again under its id, which the parent already accepted, is answered with
    /// that acceptance.
    pub(super) fn post_report(
        &mut self,
        child: SessionId,
        captured: &AgentRef,
        message: Message,
        delivery: ReportDelivery,
        origin: ReportOrigin,
        ctx: &mut Context<Self>,
    ) -> Result<BoxFuture<'static, Result<MessageId>>> {
        let (may_repeat, trace) = match origin {
            ReportOrigin::Local(trace) => (false, trace),
            ReportOrigin::Peer(trace) => (true, trace),
        };
        let id = message.id;
        let target = match delivery {
            ReportDelivery::Quiet => PostTarget::Inbox(InboxTarget::NextStep, Wake::Quiet),
            ReportDelivery::Wakeup => PostTarget::Inbox(InboxTarget::NextTurn, Wake::Wake),
        };
        let (parent, counted) = match (self.residents.get_mut(&captured.id()), delivery) {
            (Some(parent), ReportDelivery::Wakeup) if parent.disposal.is_none() => {
                parent.accept(id);
                (parent.agent.clone(), true)
            }
            (Some(parent), _) => (parent.agent.clone(), false),
            (None, _) if captured.is_alive() => (captured.clone(), false),
            (None, _) => {
                // The exact agent is gone: the session's live agent (the parent disposed and
                // resumed) hears the report.
                let agents = self.agents.clone();
                let parent = captured.id();
                return Ok(async move {
                    let live = agents.get(parent).await.ok_or_else(|| {
                        SubagentError::new(
                            ErrorCode::ParentUnavailable,
                            format!("the parent of continuable child {child} is not live"),
                        )
                    })?;
                    live.post(message, target, None, may_repeat, trace.into())
                        .await
                        .map_err(|error| parent_refused(child, &error))
                }
                .boxed());
            }
        };
        let accepted = parent.post(message, target, None, may_repeat, trace.into());
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
                parent_refused(child, &error)
            })
        }
        .boxed())
    }
}

/// Where the session's log may hold a message once an agent refused it (it may have taken it
/// as it went): at or after what that agent's log had stored when the message was posted to
/// it, `stored`, or wherever it could be before.
fn refused_from(may_be_from: Option<u64>, stored: u64) -> Option<u64> {
    Some(may_be_from.map_or(stored, |from| from.min(stored)))
}

fn parent_refused(child: SessionId, error: &SubagentError) -> SubagentError {
    SubagentError::new(
        ErrorCode::ParentUnavailable,
        format!("the parent of continuable child {child} rejected the followup/inject: {error}"),
    )
}

/// Delivers `message` to the parent session `parent` once: to its live agent (an idle one
/// gets one turn of it, a busy one reads it at its next step), or, while none is live, into
/// its stored inbox. `gone` is an agent that just refused it: its release is waited out
/// before the session is looked up again. With `may_repeat` the message is asked again under
/// its id (every live agent looks for it); `may_be_from` is where the session's log may hold it
/// already (`None`: nowhere; see [`Agents::enqueue_stored`]).
///
/// # Errors
/// The live agent's refusal when it is not going away (a faulted parent); the stored inbox's
/// error (a parent never stored, a store failure).
async fn deliver_to_parent_session(
    agents: &Agents,
    parent: SessionId,
    message: Message,
    mut gone: Option<AgentRef>,
    (may_repeat, mut may_be_from): (bool, Option<u64>),
) -> Result<MessageId> {
    // A recipient that refused the notice may have been handed it as it went: once one did,
    // the session's log is searched for it, from where it ended then, before it is stored.
    for _ in 0..NOTICE_ATTEMPTS {
        match agents.handle(parent).await {
            Some(handle) if gone.as_ref() == Some(handle.agent()) => {
                if !handle.is_disposing() {
                    return Err(SubagentError::new(
                        ErrorCode::ParentUnavailable,
                        format!("parent agent {parent} refused the notice and is not going away"),
                    ));
                }
                // Joins the release already under way (disposal is memoized).
                let _ = handle.dispose().await;
                gone = None;
            }
            Some(handle) => {
                let live = handle.agent().clone();
                let stored = live.log().inner().stored_len();
                match live
                    .post(
                        message.clone(),
                        PostTarget::TurnOrStep,
                        None,
                        may_repeat,
                        SentFrom::default(),
                    )
                    .await
                {
                    Ok(id) => return Ok(id),
                    Err(_) => {
                        gone = Some(live);
                        may_be_from = refused_from(may_be_from, stored);
                    }
                }
            }
            None => match agents
                .enqueue_stored(parent, message.clone(), may_be_from)
                .await
            {
                Ok(id) => return Ok(id),
                // An agent of the session came live meanwhile: deliver to it.
                Err(error) if error.code() == ErrorCode::DuplicateAgent => {
                    tokio::task::yield_now().await;
                }
                Err(error) => return Err(error),
            },
        }
    }
    Err(SubagentError::new(
        ErrorCode::ParentUnavailable,
        format!("parent session {parent} kept changing while a notice was delivered to it"),
    ))
}
