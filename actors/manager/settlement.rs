//! Settling an epoch once its teardown is over: the manager hears the epoch's terminal facts
//! ([`Finished`]), the parent hears the settled notice, and everyone awaiting the disposal
//! hears the outcome.
//!
//! The epoch's [`Activation`](crate::actors::activation::Activation) carries this out itself,
//! at the end of its teardown, through the [`Settlement`] the manager hands it with the
//! teardown: no task of the manager's stands between the two. A settlement that is dropped
//! unsettled (its Activation stopped before the teardown reached it, or while it ran) still
//! settles the epoch, as failed, so no disposal is left waiting and no record left behind.

use super::*;

/// What an epoch's teardown owes: one settlement, carried out by [`Settlement::settle`] or,
/// when the teardown never gets that far, on drop.
pub(crate) struct Settlement {
    manager: Addr<ContinuationManager>,
    child: SessionId,
    /// The disposal's outcome; taken once it is answered.
    done: Option<tokio::sync::oneshot::Sender<Result<()>>>,
}

impl Settlement {
    /// The settlement of `child`'s epoch, and the disposal that resolves with its outcome.
    pub(super) fn new(manager: Addr<ContinuationManager>, child: SessionId) -> (Self, Disposal) {
        let (done, settled) = tokio::sync::oneshot::channel();
        let disposal = async move {
            settled.await.unwrap_or_else(|_| {
                Err(SubagentError::bug(
                    "an epoch's settlement was dropped without an answer",
                ))
            })
        }
        .boxed()
        .shared();
        let settlement = Self {
            manager,
            child,
            done: Some(done),
        };
        (settlement, disposal)
    }

    /// Settles the epoch that ended with `terminal`: the manager removes the Activation and
    /// tells the parent, and once the parent heard so (or its notice was stored), the disposal
    /// is answered with the teardown's outcome.
    pub(crate) async fn settle(mut self, terminal: Terminal) {
        let child = self.child;
        let finished = self.manager.send(Finished { child, terminal }).await;
        // Dropped before this point, the settlement is still owed, and its drop settles it.
        let Some(done) = self.done.take() else {
            return;
        };
        let outcome = match finished {
            Ok((outcome, notice)) => {
                if let Some(notice) = notice {
                    notice.await;
                }
                outcome
            }
            Err(error) => Err(SubagentError::from(error)),
        };
        answer(child, done, outcome);
    }
}

impl Drop for Settlement {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            // Queued whatever the thread: a stopped manager has nothing left to settle.
            self.manager.do_send(Abandoned {
                child: self.child,
                done,
            });
        }
    }
}

/// Answers a disposal's outcome, logging a failed teardown (nobody may be awaiting it).
fn answer(child: SessionId, done: tokio::sync::oneshot::Sender<Result<()>>, outcome: Result<()>) {
    if let Err(error) = &outcome {
        tracing::warn!(%child, %error, "activation teardown failed");
    }
    let _ = done.send(outcome);
}

/// Internal: an epoch's teardown is over. Removes the Activation, sends the settled notice,
/// releases ownership, emits `subagent/end`; answers the teardown failure, and the notice's
/// delivery for the disposal to await.
#[derive(Message)]
#[rtype(result = "(Result<()>, Option<BoxFuture<'static, ()>>)")]
struct Finished {
    child: SessionId,
    terminal: Terminal,
}

impl Handler<Finished> for ContinuationManager {
    type Result = MessageResult<Finished>;

    fn handle(&mut self, msg: Finished, ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.finish(msg.child, msg.terminal, ctx))
    }
}

/// Internal: a settlement was dropped before its teardown ended; the epoch settles as failed.
#[derive(Message)]
#[rtype(result = "()")]
struct Abandoned {
    child: SessionId,
    done: tokio::sync::oneshot::Sender<Result<()>>,
}

impl Handler<Abandoned> for ContinuationManager {
    type Result = ();

    fn handle(&mut self, msg: Abandoned, ctx: &mut Context<Self>) {
        let terminal = Terminal::failed(SubagentError::bug(
            "an Activation stopped before its teardown ended",
        ));
        let (outcome, notice) = self.finish(msg.child, terminal, ctx);
        let child = msg.child;
        let done = msg.done;
        tokio::spawn(async move {
            if let Some(notice) = notice {
                notice.await;
            }
            answer(child, done, outcome);
        });
    }
}

impl ContinuationManager {
    /// Settles `child`'s finished epoch: removes its Activation, sends the settled notice,
    /// releases ownership, emits `subagent/end`; answers the teardown failure, and the notice's
    /// delivery for the disposal to await.
    fn finish(
        &mut self,
        child: SessionId,
        terminal: Terminal,
        ctx: &mut Context<Self>,
    ) -> (Result<()>, Option<BoxFuture<'static, ()>>) {
        let Some(resident) = self.residents.remove(&child) else {
            return (Ok(()), None);
        };
        if let Some(metrics) = self.metrics() {
            metrics.residency(Residency::Settled);
        }
        if self.residents.is_empty() {
            self.activity = None;
        }
        let notice = if resident.announced {
            self.notify_settlement(&resident, &terminal, ctx)
                .map(|delivery| self.track_notice(delivery))
        } else {
            None
        };
        if let Some(owner) = resident.owner() {
            if let Some(parent) = self.residents.get_mut(&owner) {
                parent.disown(&child);
                self.evaluate(owner, ctx);
            }
        } else if let ParentLink::Local(parent) = &resident.parent {
            if let Some(record) = self.owners.get_mut(&parent.id()) {
                record.residents = record.residents.saturating_sub(1);
            }
            self.forget_owner_if_idle(parent.id());
        }
        let last_assistant_message = terminal.output.filter(|output| !output.is_empty());
        self.events.emit(&SubagentEvent::End(SubagentRunEndInfo {
            info: resident.run(child),
            stop_reason: terminal.stop_reason,
            last_assistant_message,
        }));
        (terminal.failure.map_or(Ok(()), Err), notice)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_runtime::scripted_runtime;
    use super::Settlement;
    use crate::testing::{resident_count, Gate, ScriptStep, ScriptedModel};
    use crate::{
        ContentBlock, ContinuableStartSpec, CreateAgent, ErrorCode, EventScope, StopReason,
        SubagentEvent,
    };
    use std::sync::{Arc, Mutex};

    // The settlement a teardown never carried out (its Activation stopped first) still settles
    // the epoch, as failed: the child is no longer resident, its `subagent/end` says `error`,
    // and the disposal is answered with the failure instead of waiting for good.
    #[actix_rt::test]
    async fn a_settlement_dropped_unsettled_settles_its_epoch_as_failed() {
        let gate = Gate::new();
        let model = ScriptedModel::with_script([ScriptStep::text("held").gated(&gate)]);
        let rt = scripted_runtime(model).await;
        let parent = rt
            .agents()
            .create(CreateAgent::new())
            .await
            .expect("a parent");
        let ends = Arc::new(Mutex::new(Vec::new()));
        let _subscription =
            rt.subagents()
                .events()
                .subscribe(EventScope::Key(parent.agent().id()), {
                    let ends = Arc::clone(&ends);
                    move |event: &SubagentEvent| {
                        if let SubagentEvent::End(end) = event {
                            ends.lock().expect("lock").push(end.stop_reason.clone());
                        }
                    }
                });
        let started = rt
            .subagents()
            .start_continuable(ContinuableStartSpec::new(
                "spawn",
                "task",
                parent.agent(),
                vec![ContentBlock::text("work")],
            ))
            .await
            .expect("a start");
        gate.reached().await;
        assert_eq!(resident_count(rt.subagents()).await, 1);

        let (settlement, disposal) =
            Settlement::new(rt.subagents().manager().clone(), started.child_id);
        drop(settlement);
        let failure = disposal.await.expect_err("the epoch settled as failed");
        assert_eq!(failure.code(), ErrorCode::ReportableBug, "{failure}");
        assert_eq!(resident_count(rt.subagents()).await, 0);
        assert_eq!(*ends.lock().expect("lock"), [StopReason::Error]);

        gate.release();
        parent.dispose().await.expect("the parent is disposed");
        rt.shutdown().await.expect("shut down");
    }
}
