//! The model-based property test of continuable children: random sequences of start,
//! follow-up, interrupt, report, turn completion (a gate released) and drain over a random
//! forest, then shutdown. Held model turns (gates) decide the interleavings.
//!
//! Checked throughout, on the lifecycle stream: at most one Activation per child at any time
//! (a child's `subagent/start` and `subagent/end` alternate), and no parent settles while it
//! owns a live child (every child's `subagent/end` precedes its parent's). Checked after each
//! drain: nothing below the drained parent is live. Checked after shutdown: every
//! `subagent/start` has exactly one `subagent/end`, every accepted message was claimed or
//! discarded exactly once, and no agent or Activation remains.
//!
//! `cargo test` runs a few hundred cases; an optimized build (`cargo test --release` or
//! `--profile bench`) runs 10,000.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use proptest::sample::Index;
use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::{
    AgentEvent, AgentEventKind, AgentRef, ContinuableStartSpec, ErrorCode, EventScope,
    FollowupOptions, InterruptAuthority, MessageId, MessageSource, ReportDelivery, ReportOptions,
    Runtime, SessionId, SubagentEvent,
};

use crate::support::{root, seam_runtime, text, within, SeamRecorder};

/// Cases per run: a few hundred in a debug build, 10,000 in an optimized one.
const CASES: u32 = if cfg!(debug_assertions) { 256 } else { 10_000 };

#[derive(Debug, Clone)]
enum Op {
    /// Starts a child under a node (the root or a known child); `held` makes the next model
    /// turn wait at a gate.
    Start { parent: Index, held: bool },
    /// Sends a follow-up to a known child through its parent.
    Followup { child: Index, held: bool },
    /// Interrupts a known child with its parent's user authority.
    Interrupt { child: Index },
    /// A known child reports to its parent.
    Report { child: Index, quiet: bool },
    /// A held turn completes.
    Release { gate: Index },
    /// Drains the descendants of a known child (shutdown drains the root's).
    Drain { parent: Index },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<Index>(), any::<bool>()).prop_map(|(parent, held)| Op::Start { parent, held }),
        3 => (any::<Index>(), any::<bool>()).prop_map(|(child, held)| Op::Followup { child, held }),
        1 => any::<Index>().prop_map(|child| Op::Interrupt { child }),
        1 => (any::<Index>(), any::<bool>()).prop_map(|(child, quiet)| Op::Report { child, quiet }),
        3 => any::<Index>().prop_map(|gate| Op::Release { gate }),
        1 => any::<Index>().prop_map(|parent| Op::Drain { parent }),
    ]
}

/// What the test knows of the forest: node 0 is the root; every other node is a child
/// whose start was accepted, with its parent's node index.
struct Forest {
    rt: Runtime,
    model: ScriptedModel,
    root: subagents::AgentHandle,
    nodes: Vec<(SessionId, Option<usize>)>,
    gates: Vec<Gate>,
    accepted: Vec<MessageId>,
}

impl Forest {
    /// The live agent of node `index`, if it is live.
    async fn live(&self, index: usize) -> Option<AgentRef> {
        match index {
            0 => Some(self.root.agent().clone()),
            _ => self.rt.agents().get(self.nodes[index].0).await,
        }
    }

    fn hold_next_turn(&mut self, held: bool) {
        if held {
            let gate = Gate::new();
            self.model
                .push(ScriptStep::text("held answer").gated(&gate));
            self.gates.push(gate);
        }
    }

    /// Whether node `index` descends from node `ancestor`.
    fn descends(&self, mut index: usize, ancestor: usize) -> bool {
        while let Some(parent) = self.nodes[index].1 {
            if parent == ancestor {
                return true;
            }
            index = parent;
        }
        false
    }

    async fn apply(&mut self, op: &Op) {
        match op {
            Op::Start { parent, held } => {
                let parent = parent.index(self.nodes.len());
                let Some(agent) = self.live(parent).await else {
                    return;
                };
                self.hold_next_turn(*held);
                let started = self
                    .rt
                    .subagents()
                    .start_continuable(ContinuableStartSpec::new(
                        "spawn",
                        "model child",
                        &agent,
                        text("work"),
                    ))
                    .await;
                match started {
                    Ok(started) => {
                        self.nodes.push((started.child_id, Some(parent)));
                        self.accepted.push(started.message_id);
                    }
                    Err(error) => expect_refusal(
                        "start",
                        &error,
                        &[
                            ErrorCode::Draining,
                            ErrorCode::ActivationClosing,
                            ErrorCode::Unauthorized,
                            ErrorCode::AgentDisposed,
                        ],
                    ),
                }
            }
            Op::Followup { child, held } => {
                let Some(child) = self.child(*child) else {
                    return;
                };
                let (id, parent) = self.nodes[child];
                let Some(agent) = self.live(parent.unwrap_or(0)).await else {
                    return;
                };
                self.hold_next_turn(*held);
                let sent = self
                    .rt
                    .subagents()
                    .followup(
                        &agent,
                        id,
                        text("more"),
                        FollowupOptions::new(MessageSource::User),
                    )
                    .await;
                match sent {
                    Ok(message) => self.accepted.push(message),
                    Err(error) => expect_refusal(
                        "follow-up",
                        &error,
                        &[
                            ErrorCode::Draining,
                            ErrorCode::Unauthorized,
                            ErrorCode::ActivationClosing,
                            ErrorCode::AgentDisposed,
                        ],
                    ),
                }
            }
            Op::Interrupt { child } => {
                let Some(child) = self.child(*child) else {
                    return;
                };
                let (id, parent) = self.nodes[child];
                let parent_session_id = self.nodes[parent.unwrap_or(0)].0;
                self.rt
                    .subagents()
                    .interrupt(id, InterruptAuthority::User { parent_session_id })
                    .await
                    .expect("the durable parent's address always authorizes an interrupt");
            }
            Op::Report { child, quiet } => {
                let Some(child) = self.child(*child) else {
                    return;
                };
                let Some(agent) = self.live(child).await else {
                    return;
                };
                let delivery = match quiet {
                    true => ReportDelivery::Quiet,
                    false => ReportDelivery::Wakeup,
                };
                let reported = self
                    .rt
                    .subagents()
                    .report_from(&agent, text("progress"), ReportOptions::new(delivery))
                    .await;
                if let Err(error) = reported {
                    expect_refusal(
                        "report",
                        &error,
                        &[
                            ErrorCode::Draining,
                            ErrorCode::Unauthorized,
                            ErrorCode::ActivationClosing,
                            ErrorCode::ParentUnavailable,
                        ],
                    );
                }
            }
            Op::Release { gate } => {
                if !self.gates.is_empty() {
                    self.gates[gate.index(self.gates.len())].release();
                }
            }
            Op::Drain { parent } => {
                let Some(parent) = self.child(*parent) else {
                    return;
                };
                let Some(agent) = self.live(parent).await else {
                    return;
                };
                within(
                    "a drain",
                    self.rt.subagents().drain_continuable_descendants(&[agent]),
                )
                .await
                .expect("a drain of healthy children succeeds");
                for index in 1..self.nodes.len() {
                    if self.descends(index, parent) {
                        assert!(
                            self.rt.agents().get(self.nodes[index].0).await.is_none(),
                            "a drained descendant is still live"
                        );
                    }
                }
            }
        }
    }

    /// A known child's node index, if there is any child.
    fn child(&self, pick: Index) -> Option<usize> {
        (self.nodes.len() > 1).then(|| 1 + pick.index(self.nodes.len() - 1))
    }
}

fn expect_refusal(what: &str, error: &subagents::SubagentError, allowed: &[ErrorCode]) {
    assert!(
        allowed.contains(&error.code()),
        "unexpected {what} refusal: {} ({})",
        error.message(),
        error.code()
    );
}

/// The lifecycle invariants that hold at every point of the stream: a child's starts and
/// ends alternate, and every child's end precedes its parent's.
fn check_lifecycle(events: &[SubagentEvent], parents: &HashMap<SessionId, SessionId>) {
    let mut open: HashSet<SessionId> = HashSet::new();
    for event in events {
        match event {
            SubagentEvent::Start(start) => assert!(
                open.insert(start.id),
                "child {} has two Activations",
                start.id
            ),
            SubagentEvent::End(end) => {
                let child = end.info.id;
                assert!(open.remove(&child), "child {child} ended twice");
                let owned = parents
                    .iter()
                    .filter(|(_, parent)| **parent == child)
                    .map(|(grandchild, _)| grandchild)
                    .find(|grandchild| open.contains(grandchild));
                assert!(
                    owned.is_none(),
                    "child {child} settled while it owned a live child"
                );
            }
            _ => {}
        }
    }
}

async fn run_case(ops: Vec<Op>) {
    let model = ScriptedModel::repeating(ScriptStep::text("done"));
    let rt = seam_runtime(&model).await;
    let lifecycle = SeamRecorder::new(&rt, EventScope::All);
    let inbox: Arc<Mutex<HashMap<MessageId, usize>>> = Arc::default();
    let sink = Arc::clone(&inbox);
    let _inbox = rt
        .events()
        .subscribe(EventScope::All, move |event: &AgentEvent| {
            let message = match &event.kind {
                AgentEventKind::InboxClaimed { message, .. }
                | AgentEventKind::InboxDiscarded { message } => *message,
                _ => return,
            };
            *sink.lock().unwrap().entry(message).or_default() += 1;
        });
    let root = root(&rt).await;
    let mut forest = Forest {
        nodes: vec![(root.agent().id(), None)],
        rt: rt.clone(),
        model,
        root,
        gates: Vec::new(),
        accepted: Vec::new(),
    };
    let parents = |forest: &Forest| -> HashMap<SessionId, SessionId> {
        forest
            .nodes
            .iter()
            .filter_map(|(id, parent)| parent.map(|parent| (*id, forest.nodes[parent].0)))
            .collect()
    };
    for op in &ops {
        within("an operation", forest.apply(op)).await;
        check_lifecycle(&lifecycle.events(), &parents(&forest));
    }
    for gate in &forest.gates {
        gate.release();
    }
    within("shutdown", rt.shutdown())
        .await
        .expect("shutdown of healthy children succeeds");
    let events = lifecycle.events();
    check_lifecycle(&events, &parents(&forest));
    let starts = events
        .iter()
        .filter(|event| matches!(event, SubagentEvent::Start(_)))
        .count();
    let ends = events
        .iter()
        .filter(|event| matches!(event, SubagentEvent::End(_)))
        .count();
    assert_eq!(starts, ends, "every subagent/start has its subagent/end");
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    for (id, _) in &forest.nodes {
        assert!(
            rt.agents().get(*id).await.is_none(),
            "{id} outlived shutdown"
        );
    }
    let settled = inbox.lock().unwrap().clone();
    for message in &forest.accepted {
        assert_eq!(
            settled.get(message),
            Some(&1),
            "accepted message {message} was not claimed or discarded exactly once"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    // Issue #8: the model-based property test.
    #[test]
    fn continuable_forests_keep_their_invariants(ops in prop::collection::vec(op(), 4..32)) {
        actix::System::new().block_on(run_case(ops));
    }
}
