//! Routing a follow-up by residency: enqueue or wake a resident child, or cold-resume an
//! absent one from the store.

use super::materialize::{
    activation_setup, commit_setup, install_and_submit, map_cancelled, Installing,
};
use super::*;
use crate::seam::child_run::recorded_policy;
use std::time::Instant;

/// How a follow-up was routed.
pub(crate) enum Routed {
    /// Accepted with this id.
    Accepted(MessageId),
    /// The child was settling or being resumed; route again.
    Retry,
    /// The child was placed on another node: ask it there (through the caller's cluster link).
    Remote(NodeId),
}

/// Delivers a follow-up: enqueue (running), wake (waiting) or cold-resume (absent).
#[derive(Message)]
#[rtype(result = "Result<Routed>")]
pub(crate) struct Followup {
    pub(crate) parent: AgentRef,
    pub(crate) child: SessionId,
    pub(crate) delivery: Delivery,
    pub(crate) token: CancellationToken,
}

impl Handler<Followup> for ContinuationManager {
    type Result = ResponseFuture<Result<Routed>>;

    fn handle(&mut self, msg: Followup, ctx: &mut Context<Self>) -> Self::Result {
        let lineage = self.lineage_of(&msg.parent);
        if let Err(error) = self.assert_admitting(&lineage) {
            return Box::pin(async move { Err(error) });
        }
        if msg.token.is_cancelled() {
            return Box::pin(async { Err(cancelled()) });
        }
        if let Some(remote) = self.remote_children.get_mut(&msg.child) {
            // Authority is the parent session, as for a resident child; a parent reopened
            // since the placement is the same parent, live again.
            if remote.parent.id() != msg.parent.id() || !msg.parent.is_alive() {
                return Box::pin(async move {
                    Err(unauthorized(format!(
                        "agent {} is not the exact live parent of continuable child {}",
                        msg.parent.id(),
                        msg.child
                    )))
                });
            }
            if !remote.parent.is_alive() {
                remote.parent = msg.parent.clone();
            }
            if self.cluster.is_some() {
                let node = remote.node;
                return Box::pin(async move { Ok(Routed::Remote(node)) });
            }
        }
        if let Some(resident) = self.residents.get(&msg.child) {
            if let Some(disposal) = resident.disposal.clone() {
                // Lost the race with settlement: wait for the teardown, then cold-resume.
                return Box::pin(async move {
                    let _ = disposal.await;
                    Ok(Routed::Retry)
                });
            }
            let parent = ParentLink::Local(msg.parent);
            // In a cluster, answered once stored, as a node answers a follow-up it accepted for
            // a parent on another node (see `served.rs`): what an answer means cannot depend on
            // where the child is resident, and an answer must outlive the node that gave it (a
            // driving node killed after answering lost follow-ups to children it had resumed).
            // Stored, not flushed: the database keeps a commit whose client died, and a
            // synchronous commit per acceptance doubled its latency again.
            let stored = self.cluster.is_some().then(|| resident.agent.log().clone());
            let accepted = self.submit(msg.child, &parent, msg.delivery, &msg.token, ctx);
            return Box::pin(async move {
                let id = accepted?.await?;
                if let Some(log) = stored {
                    log.drain().await?;
                }
                Ok(Routed::Accepted(id))
            });
        }
        if let Some(resuming) = self.resuming.get(&msg.child).cloned() {
            return Box::pin(async move {
                resuming.await;
                Ok(Routed::Retry)
            });
        }
        // A stale parent is refused before anything is read or leased (`Install` checks again
        // after the awaits).
        if !msg.parent.is_alive() {
            let parent = msg.parent.id();
            return Box::pin(async move {
                Err(unauthorized(format!(
                    "agent {parent} is not live and cannot resume its continuable child"
                )))
            });
        }
        let guard = self.register_materialization(lineage.clone(), Some(msg.child), ctx);
        let resume = ColdResume {
            manager: ctx.address(),
            agents: self.agents.clone(),
            registry: Arc::clone(&self.setup),
            lineage,
        };
        let metrics = self.agents.env().metrics.clone();
        let stored = self.cluster.is_some().then(|| self.agents.clone());
        Box::pin(async move {
            let _guard = guard;
            let began = metrics.as_ref().map(|_| Instant::now());
            let resumed = resume
                .run(msg.parent, msg.child, msg.delivery, msg.token)
                .await;
            if let (Some(metrics), Some(began)) = (metrics, began) {
                metrics.cold_resume(&resumed, began);
            }
            let id = resumed?;
            // Stored before the answer in a cluster, as above (a child that settled meanwhile
            // was stored by its disposal).
            if let Some(agents) = stored {
                if let Some(child) = agents.get(msg.child).await {
                    child.log().drain().await?;
                }
            }
            Ok(Routed::Accepted(id))
        })
    }
}

/// A cold resume of an absent child, run outside the manager's handler.
struct ColdResume {
    manager: Addr<ContinuationManager>,
    agents: Agents,
    registry: Arc<SetupRegistry>,
    lineage: Vec<SessionId>,
}

impl ColdResume {
    async fn run(
        self,
        parent: AgentRef,
        child: SessionId,
        delivery: Delivery,
        token: CancellationToken,
    ) -> Result<MessageId> {
        let env = Arc::clone(self.agents.env());
        let store = env.store.clone().ok_or_else(|| {
            SubagentError::new(
                ErrorCode::PersistenceUnavailable,
                "a cold resume requires session persistence",
            )
        })?;
        let stored = tokio::select! {
            () = token.cancelled() => return Err(cancelled()),
            stored = store.inspect(child) => stored,
        }
        .map_err(|error| {
            SubagentError::new(
                ErrorCode::NotResumable,
                format!("continuable child {child} is unavailable: {error}"),
            )
        })?;
        if token.is_cancelled() {
            return Err(cancelled());
        }
        // Authority is checked against the persisted header before anything is folded.
        if stored.header.parent_session != Some(parent.id()) {
            return Err(unauthorized(format!(
                "continuable child {child} belongs to another parent session"
            )));
        }
        let own = usize::try_from(stored.header.seed_len())
            .unwrap_or(usize::MAX)
            .min(stored.events.len());
        let own = &stored.events[own..];
        // A repeated follow-up the child accepted and settled long ago is answered with that
        // acceptance, and nothing is resumed for it (one still pending is resumed and claimed).
        let id = delivery.message.id;
        if delivery.may_repeat
            && crate::host::inbox::inserts(own, id)
            && !crate::host::Inbox::replay(own).is_pending(&id)
        {
            return Ok(id);
        }
        let descriptor = SubagentDescriptor::fold(own)?
            .filter(|descriptor| descriptor.mode == DelegationMode::Continuable)
            .ok_or_else(|| {
                SubagentError::new(
                    ErrorCode::NotResumable,
                    format!(
                        "{child} has no supported continuation state and cannot be resumed; \
                         do not retry send_message with this id"
                    ),
                )
            })?;
        // A spent budget refuses before anything is loaded or leased.
        let recorded = budget::current(own, descriptor.budget)?.unwrap_or_default();
        let spent = BudgetSpent::fold(own);
        budget::admit(child, &delivery.raise.unwrap_or(recorded), &spent)?;
        // Only the recorded route: no token cap, no depth (the header's depth is the floor).
        let options = AgentOptions {
            provider: descriptor.agent_provider.clone(),
            model: descriptor.agent_model.clone().unwrap_or_default(),
            ..AgentOptions::default()
        };
        // The whole log, fork prefix included: the last recorded mode is the one in force.
        let composition = ChildComposition::resumed(
            &env,
            &recorded_policy(&stored.events),
            descriptor.persona.as_deref(),
            descriptor.tool_filter.clone(),
        )?;
        let slot = Arc::default();
        // The inspection is the log the resume loads: it is read again only past its end.
        let resume = ResumeAgent::new(child)
            .inspected(stored)
            .below(&self.lineage)
            .options(options)
            .setup(activation_setup(
                composition,
                None,
                self.registry,
                Arc::clone(&slot),
            ))
            .cancel(token.clone());
        let handle = self.agents.resume(resume).await.map_err(map_cancelled)?;
        commit_setup(&handle, &slot).await?;
        let boundary = usize::try_from(handle.agent().log().len()).unwrap_or(usize::MAX);
        let installing = Installing {
            handle,
            parent: ParentLink::Local(parent),
            lineage: self.lineage,
            provider: descriptor.provider,
            boundary,
            budget: BudgetMeter::new(recorded, spent),
        };
        install_and_submit(self.manager, installing, delivery, token).await
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_runtime::scripted_runtime;
    use crate::testing::{resident_count, Gate, ScriptStep, ScriptedModel};
    use crate::{
        AgentRef, ContentBlock, ContinuableStartSpec, CreateAgent, ErrorCode, ResumeAgent, Runtime,
        SessionId,
    };

    async fn start(rt: &Runtime, parent: &AgentRef, label: &str) -> SessionId {
        rt.subagents()
            .start_continuable(ContinuableStartSpec::new(
                "spawn",
                label,
                parent,
                vec![ContentBlock::text("work")],
            ))
            .await
            .expect("a start")
            .child_id
    }

    // A child between its cold resume's publication and its install is live but not resident,
    // and its parent may have settled meanwhile: what is admitted below it during a drain of an
    // ancestor must still be refused. The manager publishes a cold-resumed child with the lineage
    // its resume was admitted under (as below); before, the child's lineage stopped at its
    // header's parent once that parent was no longer resident, and a start below it was admitted
    // under a drained ancestor. (No runtime call holds a resume in that window, so the test
    // publishes the child as the manager's resume does.)
    #[actix_rt::test]
    async fn a_child_in_its_resume_window_is_below_a_drained_ancestor() {
        let (outer, inner) = (Gate::new(), Gate::new());
        let model = ScriptedModel::repeating(ScriptStep::text("ok"));
        model.push(ScriptStep::text("held").gated(&outer));
        model.push(ScriptStep::text("held").gated(&inner));
        let rt = scripted_runtime(model).await;
        let root = rt
            .agents()
            .create(CreateAgent::new())
            .await
            .expect("a root");
        let drained = start(&rt, root.agent(), "drained").await;
        outer.reached().await;
        let drained = rt.agents().get(drained).await.expect("resident");
        let middle = start(&rt, &drained, "middle").await;
        inner.reached().await;
        let middle_ref = rt.agents().get(middle).await.expect("resident");
        let below = start(&rt, &middle_ref, "below").await;
        inner.release();
        while resident_count(rt.subagents()).await > 1 {
            tokio::task::yield_now().await;
        }
        // `below` as its cold resume publishes it, before its install: `middle` has settled.
        let resumed = rt
            .agents()
            .resume(ResumeAgent::new(below).below(&[middle, drained.id(), root.agent().id()]))
            .await
            .expect("the resume publishes");
        rt.subagents()
            .drain_continuable_descendants(std::slice::from_ref(&drained))
            .await
            .expect("the drain");
        let refused = rt
            .subagents()
            .start_continuable(ContinuableStartSpec::new(
                "spawn",
                "late",
                resumed.agent(),
                vec![ContentBlock::text("go")],
            ))
            .await
            .expect_err("admission is closed below the drained ancestor");
        assert_eq!(refused.code(), ErrorCode::Draining, "{refused}");
        resumed.dispose().await.expect("disposed");
        outer.release();
    }
}
